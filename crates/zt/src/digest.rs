//! Component digests: crc32c and sha256 (`.zt` 1.x, over the stored bytes); xxh3 and
//! sha256 (`.zt` 2, over the decoded bytes).

use std::fmt;

use sha2::{Digest as _, Sha256};
use tensorwire_core::{Error, Result};

/// Which digest a writer records for each component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// No digest.
    #[default]
    None,
    /// CRC-32C (Castagnoli), recorded as `crc32c:0x%08X`.
    Crc32c,
    /// SHA-256, recorded as `sha256:<64 lowercase hex>`.
    Sha256,
    /// XXH3-64 (seed 0), recorded as `xxh3:<16 lowercase hex>` (`.zt` 2 only; what
    /// ztensor 2.x writes on every part).
    Xxh3,
}

impl Checksum {
    /// Parses `"none"`, `"crc32c"`, `"sha256"` or `"xxh3"`.
    pub fn from_name(name: &str) -> Result<Checksum> {
        match name {
            "none" => Ok(Checksum::None),
            "crc32c" => Ok(Checksum::Crc32c),
            "sha256" => Ok(Checksum::Sha256),
            "xxh3" => Ok(Checksum::Xxh3),
            other => Err(Error::invalid(format!(
                "unknown checksum `{other}` (expected none, crc32c, sha256 or xxh3)"
            ))),
        }
    }

    /// The name [`Checksum::from_name`] parses.
    pub fn name(self) -> &'static str {
        match self {
            Checksum::None => "none",
            Checksum::Crc32c => "crc32c",
            Checksum::Sha256 => "sha256",
            Checksum::Xxh3 => "xxh3",
        }
    }

    /// Digest of `data`, or `None` for [`Checksum::None`].
    pub fn compute(self, data: &[u8]) -> Option<Digest> {
        let mut state = DigestState::new(self);
        state.update(data);
        state.finish()
    }
}

/// A digest recorded in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Digest {
    /// CRC-32C value.
    Crc32c(u32),
    /// SHA-256 value.
    Sha256([u8; 32]),
    /// XXH3-64 value (seed 0).
    Xxh3(u64),
}

impl Digest {
    /// Parses the `.zt` 1.x manifest string form (`crc32c:0x1A2B3C4D`,
    /// `sha256:<hex>`).
    pub fn parse(s: &str) -> Option<Digest> {
        if let Some(hex) = s
            .strip_prefix("crc32c:0x")
            .or_else(|| s.strip_prefix("crc32c:0X"))
        {
            if hex.is_empty() || hex.len() > 8 {
                return None;
            }
            return u32::from_str_radix(hex, 16).ok().map(Digest::Crc32c);
        }
        let hex = s.strip_prefix("sha256:")?;
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2)?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Digest::Sha256(out))
    }

    /// Parses the `.zt` 2 manifest string form, `"<algorithm>:<lowercase hex>"`:
    /// `xxh3:` with 16 hex digits or `sha256:` with 64. `Err(true)` when the string is
    /// well-formed but names another algorithm (a file newer than this reader),
    /// `Err(false)` when it is not a digest string at all.
    pub fn parse_v2(s: &str) -> std::result::Result<Digest, bool> {
        let Some((algo, hex)) = s.split_once(':') else {
            return Err(false);
        };
        let lower_hex = |h: &str| {
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let well_formed = !algo.is_empty()
            && !hex.is_empty()
            && algo
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && lower_hex(hex);
        if !well_formed {
            return Err(false);
        }
        match algo {
            "xxh3" if hex.len() == 16 => u64::from_str_radix(hex, 16)
                .map(Digest::Xxh3)
                .map_err(|_| false),
            "sha256" if hex.len() == 64 => match Digest::parse(s) {
                Some(d) => Ok(d),
                None => Err(false),
            },
            "xxh3" | "sha256" => Err(false),
            _ => Err(true),
        }
    }

    /// The algorithm's name.
    pub fn algorithm(&self) -> &'static str {
        self.checksum().name()
    }

    /// The checksum kind that produces this digest.
    pub fn checksum(&self) -> Checksum {
        match self {
            Digest::Crc32c(_) => Checksum::Crc32c,
            Digest::Sha256(_) => Checksum::Sha256,
            Digest::Xxh3(_) => Checksum::Xxh3,
        }
    }

    /// Checks `data` against this digest; `tensor` names the component in the error.
    pub fn verify(&self, data: &[u8], tensor: &str) -> Result<()> {
        let mut state = DigestState::new(self.checksum());
        state.update(data);
        self.check(state, tensor)
    }

    /// Checks a digest computed incrementally against this one.
    pub(crate) fn check(&self, state: DigestState, tensor: &str) -> Result<()> {
        let Some(found) = state.finish() else {
            return Err(Error::invalid("no digest was computed"));
        };
        if &found == self {
            Ok(())
        } else {
            Err(Error::DigestMismatch {
                tensor: tensor.to_owned(),
                algorithm: self.algorithm(),
                expected: self.to_string(),
                found: found.to_string(),
            })
        }
    }
}

impl fmt::Display for Digest {
    /// The manifest string form, exactly as ztensor writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Digest::Crc32c(v) => write!(f, "crc32c:0x{v:08X}"),
            Digest::Xxh3(v) => write!(f, "xxh3:{v:016x}"),
            Digest::Sha256(bytes) => {
                f.write_str("sha256:")?;
                for b in bytes {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// Incremental digest computation, for writers that stream.
pub(crate) enum DigestState {
    None,
    Crc32c(u32),
    Sha256(Box<Sha256>),
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
}

impl DigestState {
    pub(crate) fn new(kind: Checksum) -> DigestState {
        match kind {
            Checksum::None => DigestState::None,
            Checksum::Crc32c => DigestState::Crc32c(0),
            Checksum::Sha256 => DigestState::Sha256(Box::default()),
            Checksum::Xxh3 => DigestState::Xxh3(Box::default()),
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            DigestState::None => {}
            DigestState::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, data),
            DigestState::Sha256(h) => h.update(data),
            DigestState::Xxh3(h) => h.update(data),
        }
    }

    pub(crate) fn finish(self) -> Option<Digest> {
        match self {
            DigestState::None => None,
            DigestState::Crc32c(crc) => Some(Digest::Crc32c(crc)),
            DigestState::Sha256(h) => Some(Digest::Sha256(h.finalize().into())),
            DigestState::Xxh3(h) => Some(Digest::Xxh3(h.digest())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_round_trip() {
        // crc32c("123456789") is the standard check value 0xE3069283.
        let d = Checksum::Crc32c.compute(b"123456789").unwrap();
        assert_eq!(d.to_string(), "crc32c:0xE3069283");
        assert_eq!(Digest::parse(&d.to_string()), Some(d));
        let s = Checksum::Sha256.compute(b"").unwrap();
        assert_eq!(
            s.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(&s.to_string()), Some(s));
    }

    #[test]
    fn malformed_digests_do_not_parse() {
        for bad in [
            "crc32c:0x",
            "crc32c:0x123456789",
            "sha256:zz",
            "md5:00",
            "crc32c:12",
        ] {
            assert_eq!(Digest::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn xxh3_and_v2_strings() {
        // XXH3-64 of "" with seed 0, as ztensor 2.1.2 records empty parts.
        let d = Checksum::Xxh3.compute(b"").unwrap();
        assert_eq!(d.to_string(), "xxh3:2d06800538d394c2");
        assert_eq!(Digest::parse_v2("xxh3:2d06800538d394c2"), Ok(d.clone()));
        let s = Checksum::Sha256.compute(b"abc").unwrap();
        assert_eq!(Digest::parse_v2(&s.to_string()), Ok(s));
        assert_eq!(Digest::parse_v2("blake3:00ff"), Err(true));
        for bad in [
            "xxh3:2D06800538D394C2",
            "xxh3:2d06",
            "xxh3:",
            ":00",
            "crc32c:0x1A2B3C4D",
            "sha256:00",
            "xxh3",
        ] {
            assert_eq!(Digest::parse_v2(bad), Err(false), "{bad}");
        }
        assert!(d.verify(b"x", "w").is_err());
    }

    #[test]
    fn mismatch_is_a_typed_error() {
        let d = Checksum::Crc32c.compute(b"abc").unwrap();
        assert!(matches!(
            d.verify(b"abd", "w"),
            Err(Error::DigestMismatch { .. })
        ));
    }
}
