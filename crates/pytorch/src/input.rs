//! Where a checkpoint's bytes come from: a map (ranges are zero-copy slices) or a
//! positional reader (ranges are read when asked for, and only then).

use std::sync::Arc;

use tensorwire_core::{Bytes, Error, Result};
use tensorwire_range::RangeRead;

/// The bytes of a checkpoint file.
#[derive(Clone)]
pub enum Input {
    /// The whole file in memory (usually a map): every range is a zero-copy slice.
    Mapped(Bytes),
    /// A file read with positional reads: a range is read when a tensor needs it.
    Ranged(Arc<dyn RangeRead>),
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Mapped(b) => write!(f, "Mapped({} bytes)", b.len()),
            Input::Ranged(r) => write!(f, "Ranged({} bytes)", r.len()),
        }
    }
}

impl Input {
    /// Length of the file.
    pub fn len(&self) -> u64 {
        match self {
            Input::Mapped(b) => b.len() as u64,
            Input::Ranged(r) => r.len(),
        }
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when ranges are slices of memory the input already holds.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Input::Mapped(_))
    }

    /// The bytes `offset..offset + len`, failing with [`Error::Truncated`] past the end.
    pub fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        let available = self.len().saturating_sub(offset);
        if offset > self.len() || len > available {
            return Err(Error::Truncated {
                offset,
                needed: len,
                available,
            });
        }
        match self {
            Input::Mapped(b) => b.slice_at(offset, len),
            Input::Ranged(r) => r.read_range(offset, len),
        }
    }

    /// Up to `len` bytes from `offset` (fewer at the end of the file).
    pub fn read_up_to(&self, offset: u64, len: u64) -> Result<Bytes> {
        let len = len.min(self.len().saturating_sub(offset));
        self.read(offset, len)
    }
}
