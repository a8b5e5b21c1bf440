//! Size and count limits applied by every parser.

/// Upper bounds a parser enforces on untrusted input before it allocates or trusts a
/// declared size. The defaults accept every real checkpoint we know of while keeping a
/// hostile file from asking for unbounded memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest metadata block (manifest, header) accepted, in bytes.
    pub max_metadata_bytes: u64,
    /// Most tensors (objects) in one file.
    pub max_tensors: u64,
    /// Most dimensions of one tensor.
    pub max_ndim: usize,
    /// Longest tensor name, in bytes.
    pub max_name_bytes: usize,
    /// Largest decoded (decompressed) size of one tensor component, in bytes.
    pub max_decoded_bytes: u64,
    /// Deepest nesting of metadata values (attributes) and of a checkpoint's
    /// containers; parsers recurse once per level, so they never go past
    /// [`MAX_DEPTH_CEILING`] whatever this says (see [`Limits::depth`]).
    pub max_depth: usize,
}

/// The deepest nesting any parser accepts, whatever [`Limits::max_depth`] asks: each
/// level is a stack frame of a recursive walk (the deepest, a checkpoint's object
/// rebuilt as `torch.load` builds it, takes up to 4 KiB a level in a release build
/// and 10 KiB in a debug one). Twice the default.
pub const MAX_DEPTH_CEILING: usize = 128;

impl Limits {
    /// The default limits (1 GiB metadata as the `.zt` spec sets, 1 M tensors, 64
    /// dimensions, 64 KiB names, 64 GiB per decoded component, nesting 64).
    pub const DEFAULT: Limits = Limits {
        max_metadata_bytes: 1 << 30,
        max_tensors: 1 << 20,
        max_ndim: crate::shape::MAX_NDIM,
        max_name_bytes: 64 << 10,
        max_decoded_bytes: 64 << 30,
        max_depth: 64,
    };
}

impl Limits {
    /// The limits' names, as their fields are named, for settings by name (the
    /// CLI's `--limit NAME=N`, Python's `limits={name: int}`).
    pub const NAMES: [&'static str; 6] = [
        "max_metadata_bytes",
        "max_tensors",
        "max_ndim",
        "max_name_bytes",
        "max_decoded_bytes",
        "max_depth",
    ];

    /// The limit called `name` (one of [`Limits::NAMES`]), `None` for another name.
    pub fn get(&self, name: &str) -> Option<u64> {
        let size = |v: usize| v as u64;
        Some(match name {
            "max_metadata_bytes" => self.max_metadata_bytes,
            "max_tensors" => self.max_tensors,
            "max_ndim" => size(self.max_ndim),
            "max_name_bytes" => size(self.max_name_bytes),
            "max_decoded_bytes" => self.max_decoded_bytes,
            "max_depth" => size(self.max_depth),
            _ => return None,
        })
    }

    /// Sets the limit called `name` (one of [`Limits::NAMES`]); another name is an
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) listing them.
    pub fn set(&mut self, name: &str, value: u64) -> crate::Result<()> {
        let size = usize::try_from(value).unwrap_or(usize::MAX);
        match name {
            "max_metadata_bytes" => self.max_metadata_bytes = value,
            "max_tensors" => self.max_tensors = value,
            "max_ndim" => self.max_ndim = size,
            "max_name_bytes" => self.max_name_bytes = size,
            "max_decoded_bytes" => self.max_decoded_bytes = value,
            "max_depth" => self.max_depth = size,
            other => {
                return Err(crate::Error::invalid(format!(
                    "unknown limit {other:?} (the limits are {})",
                    Limits::NAMES.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// The nesting depth parsers enforce: [`Limits::max_depth`], at most
    /// [`MAX_DEPTH_CEILING`].
    pub fn depth(&self) -> usize {
        self.max_depth.min(MAX_DEPTH_CEILING)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_gets_and_sets_its_own_field() {
        for (i, name) in Limits::NAMES.iter().enumerate() {
            let mut limits = Limits::default();
            let value = 1000 + i as u64;
            limits.set(name, value).unwrap();
            assert_eq!(limits.get(name), Some(value));
            for other in Limits::NAMES.iter().filter(|n| *n != name) {
                assert_eq!(
                    limits.get(other),
                    Limits::default().get(other),
                    "{name} set {other}"
                );
            }
        }
        let err = Limits::default().set("max_dpth", 1).unwrap_err();
        assert!(
            err.to_string().contains("unknown limit \"max_dpth\""),
            "{err}"
        );
        assert_eq!(Limits::default().get("max_dpth"), None);
    }

    #[test]
    fn depth_stops_at_the_ceiling() {
        let mut limits = Limits::default();
        assert_eq!(limits.depth(), 64);
        limits.max_depth = usize::MAX;
        assert_eq!(limits.depth(), MAX_DEPTH_CEILING);
    }
}
