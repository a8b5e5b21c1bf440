//! The typed error shared by every tensorwire crate.

use std::io;
use std::path::PathBuf;

/// Shorthand for `Result<T, tensorwire_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing tensors.
///
/// Variants carry the numbers involved (offsets, expected and found values, the
/// tensor's name) rather than prose, so callers can act on them and messages stay
/// precise. Parsers add the byte `offset` where they failed; the storage layer adds the
/// path with [`Error::with_path`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),

    /// An error that happened while handling a particular file.
    #[error("{}: {source}", path.display())]
    WithPath {
        /// The file being read or written.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },

    /// The input ended before a structure it declares.
    #[error("truncated input: need {needed} bytes at offset {offset}, only {available} available")]
    Truncated {
        /// Where the structure starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// How many bytes there are from `offset` to the end.
        available: u64,
    },

    /// Magic bytes did not match any expected value.
    #[error("bad magic at offset {offset}: expected {expected}, found {found:02x?}")]
    BadMagic {
        /// Where the magic was read.
        offset: u64,
        /// What was expected, in words.
        expected: &'static str,
        /// The bytes found.
        found: Vec<u8>,
    },

    /// The file's format could not be recognised.
    #[error("unrecognised format (first bytes {head:02x?})")]
    UnknownFormat {
        /// The first bytes of the input.
        head: Vec<u8>,
    },

    /// A declared size or count exceeds a configured [`crate::Limits`] value.
    #[error("{what} is {found}, above the limit of {limit}")]
    LimitExceeded {
        /// Which limit.
        what: &'static str,
        /// The configured limit.
        limit: u64,
        /// The declared value.
        found: u64,
    },

    /// Arithmetic on declared sizes overflowed.
    #[error("arithmetic overflow computing {what}")]
    Overflow {
        /// Which quantity overflowed.
        what: &'static str,
    },

    /// A structural problem in the metadata (manifest, header) of a file.
    #[error("malformed metadata at offset {offset}: {reason}")]
    Malformed {
        /// Offset of the metadata block (or the byte that failed).
        offset: u64,
        /// What is wrong.
        reason: String,
    },

    /// A tensor's bytes lie outside the data region.
    #[error("tensor `{tensor}`: range {offset}..{offset}+{length} is outside the data region (0..{limit})")]
    OutOfBounds {
        /// The tensor (and component) name.
        tensor: String,
        /// Start of the declared range.
        offset: u64,
        /// Declared length.
        length: u64,
        /// End of the region the range must lie in.
        limit: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error("tensor `{tensor}` at offset {offset} overlaps tensor `{other}`")]
    Overlap {
        /// The tensor found to overlap.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
        /// Start of `tensor`'s range.
        offset: u64,
    },

    /// A tensor's bytes do not start at the alignment the format requires.
    #[error("tensor `{tensor}` at offset {offset} is not aligned to {alignment} bytes")]
    Misaligned {
        /// The tensor name.
        tensor: String,
        /// Its offset.
        offset: u64,
        /// The alignment required.
        alignment: u64,
    },

    /// A stored digest does not match the bytes.
    #[error(
        "tensor `{tensor}`: {algorithm} digest mismatch (stored {expected}, computed {found})"
    )]
    DigestMismatch {
        /// The tensor (and component) name.
        tensor: String,
        /// Digest algorithm.
        algorithm: &'static str,
        /// The digest recorded in the file.
        expected: String,
        /// The digest of the bytes read.
        found: String,
    },

    /// The number of bytes does not match what the dtype and shape require.
    #[error("tensor `{tensor}`: expected {expected} bytes, found {found}")]
    SizeMismatch {
        /// The tensor name.
        tensor: String,
        /// Bytes the dtype and shape require.
        expected: u64,
        /// Bytes present.
        found: u64,
    },

    /// An unknown or unsupported dtype name.
    #[error("unknown dtype `{name}`")]
    UnknownDType {
        /// The name found.
        name: String,
    },

    /// No tensor of that name.
    #[error("no tensor named `{name}`")]
    NotFound {
        /// The name asked for.
        name: String,
    },

    /// A tensor name is already taken: listed twice in a file, or added twice to a
    /// writer.
    #[error("duplicate tensor name `{name}`")]
    Duplicate {
        /// The repeated name.
        name: String,
    },

    /// Decoding (decompressing) a tensor's bytes failed.
    #[error("tensor `{tensor}`: cannot decode {encoding} data: {reason}")]
    Decode {
        /// The tensor (and component) name.
        tensor: String,
        /// The encoding.
        encoding: String,
        /// The decoder's message.
        reason: String,
    },

    /// The operation is valid but not supported for this tensor or format.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: String,
    },

    /// A pickle names a global outside the allowlist (loading it could run code).
    #[error("refused pickle global `{global}` at offset {offset}: loading it could run code; only torch's tensor-rebuild functions, storage and dtype classes, OrderedDict and plain containers are allowed")]
    RefusedGlobal {
        /// `module.name` of the global.
        global: String,
        /// Offset of the opcode that named it.
        offset: u64,
    },

    /// Waiting for a lock (or another shared resource) ran out of time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long, in milliseconds.
        waited_ms: u64,
    },

    /// A process-shared lock can never be taken again: a process died holding it and
    /// the one that took it next released it without repairing what it guards
    /// (`ENOTRECOVERABLE`). Only removing the shared object and making it anew helps.
    #[error("{what} is unusable: a process died holding it and the state it guards was never repaired; remove it and create it again")]
    LockUnrecoverable {
        /// The lock, in words.
        what: &'static str,
    },

    /// A fixed-size store (a shared-memory cache) cannot hold a value.
    #[error("no space: {what} needs {needed} bytes, {available} available")]
    NoSpace {
        /// What was being stored.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the store could offer (its whole capacity when the value can never fit).
        available: u64,
    },

    /// The caller stopped a long operation (a progress callback asked to, or the
    /// user interrupted it); nothing it would have written is left behind.
    #[error("cancelled: {what}")]
    Cancelled {
        /// What was stopped.
        what: &'static str,
    },

    /// A caller passed an invalid argument.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Wraps `self` with the path of the file it concerns (once; an error that already
    /// carries a path is returned unchanged).
    pub fn with_path(self, path: impl Into<PathBuf>) -> Error {
        match self {
            e @ Error::WithPath { .. } => e,
            other => Error::WithPath {
                path: path.into(),
                source: Box::new(other),
            },
        }
    }

    /// The innermost error, looking through [`Error::WithPath`].
    pub fn root(&self) -> &Error {
        match self {
            Error::WithPath { source, .. } => source.root(),
            other => other,
        }
    }

    /// True when the error says the input itself is damaged or invalid (bad magic,
    /// truncation, malformed metadata, bad ranges, digest or size mismatches, corrupt
    /// compressed data), as opposed to I/O, usage or unsupported-feature errors.
    pub fn is_corrupt_data(&self) -> bool {
        matches!(
            self.root(),
            Error::Truncated { .. }
                | Error::BadMagic { .. }
                | Error::LimitExceeded { .. }
                | Error::Overflow { .. }
                | Error::Malformed { .. }
                | Error::OutOfBounds { .. }
                | Error::Overlap { .. }
                | Error::Misaligned { .. }
                | Error::DigestMismatch { .. }
                | Error::SizeMismatch { .. }
                | Error::UnknownDType { .. }
                | Error::Duplicate { .. }
                | Error::Decode { .. }
                | Error::RefusedGlobal { .. }
        )
    }

    /// Shorthand for a [`Error::Malformed`].
    pub fn malformed(offset: u64, reason: impl Into<String>) -> Error {
        Error::Malformed {
            offset,
            reason: reason.into(),
        }
    }

    /// Shorthand for an [`Error::Unsupported`].
    pub fn unsupported(what: impl Into<String>) -> Error {
        Error::Unsupported { what: what.into() }
    }

    /// [`Error::NotFound`] for a tensor position past the end of a reader's list.
    pub fn no_tensor_at(position: usize) -> Error {
        Error::NotFound {
            name: format!("tensor #{position}"),
        }
    }

    /// Shorthand for an [`Error::InvalidArgument`].
    pub fn invalid(reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            reason: reason.into(),
        }
    }

    /// Checks `value <= limit`, naming the limit in the error.
    pub fn check_limit(what: &'static str, found: u64, limit: u64) -> Result<()> {
        if found > limit {
            Err(Error::LimitExceeded { what, limit, found })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_is_added_once_and_root_sees_through_it() {
        let e = Error::NotFound { name: "w".into() }
            .with_path("/a.zt")
            .with_path("/b.zt");
        assert!(e.to_string().starts_with("/a.zt: no tensor named `w`"));
        assert!(matches!(e.root(), Error::NotFound { .. }));
    }
}
