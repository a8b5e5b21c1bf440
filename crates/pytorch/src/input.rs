//! Where a checkpoint's bytes come from: a map (tensor bytes are zero-copy slices), a
//! positional reader (ranges are read when asked for, and only then), or both — then
//! small metadata reads (ZIP headers, the pickle) use positional reads, which cost
//! less than first-touch page faults scattered over a large map.

use std::sync::Arc;

use tensorwire_core::{Bytes, Error, Result};
use tensorwire_range::RangeRead;

/// The bytes of a checkpoint file.
#[derive(Clone)]
pub struct Input {
    map: Option<Bytes>,
    file: Option<Arc<dyn RangeRead>>,
    len: u64,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match (&self.map, &self.file) {
            (Some(_), Some(_)) => "Mapped+Ranged",
            (Some(_), None) => "Mapped",
            _ => "Ranged",
        };
        write!(f, "{kind}({} bytes)", self.len)
    }
}

impl Input {
    /// The whole file in memory (usually a map): every range is a zero-copy slice.
    pub fn mapped(map: Bytes) -> Input {
        Input {
            len: map.len() as u64,
            map: Some(map),
            file: None,
        }
    }

    /// A file read with positional reads: a range is read when a tensor needs it.
    pub fn ranged(file: Arc<dyn RangeRead>) -> Input {
        Input {
            len: file.len(),
            map: None,
            file: Some(file),
        }
    }

    /// A map of `file` for tensor bytes, and `file` itself for metadata reads. The two
    /// must hold the same bytes.
    pub fn mapped_with_file(map: Bytes, file: Arc<dyn RangeRead>) -> Result<Input> {
        if map.len() as u64 != file.len() {
            return Err(Error::invalid(
                "the map and the file have different lengths",
            ));
        }
        Ok(Input {
            len: file.len(),
            map: Some(map),
            file: Some(file),
        })
    }

    /// Length of the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when [`Input::read`] returns slices of a map.
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let available = self.len.saturating_sub(offset);
        if offset > self.len || len > available {
            return Err(Error::Truncated {
                offset,
                needed: len,
                available,
            });
        }
        Ok(())
    }

    /// Tensor bytes `offset..offset + len`: a slice of the map when there is one,
    /// failing with [`Error::Truncated`] past the end.
    pub fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.check(offset, len)?;
        match (&self.map, &self.file) {
            (Some(map), _) => map.slice_at(offset, len),
            (None, Some(file)) => file.read_range(offset, len),
            (None, None) => unreachable!("an Input has a map or a file"),
        }
    }

    /// Metadata bytes `offset..offset + len`: read positionally when a file is
    /// available, else sliced from the map.
    pub fn read_meta(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.check(offset, len)?;
        match (&self.file, &self.map) {
            (Some(file), _) => file.read_range(offset, len),
            (None, Some(map)) => map.slice_at(offset, len),
            (None, None) => unreachable!("an Input has a map or a file"),
        }
    }

    /// Fills `buf` with the metadata bytes at `offset` (see [`Input::read_meta`]),
    /// without allocating: for many small reads through one reused buffer.
    pub fn read_meta_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        match (&self.file, &self.map) {
            (Some(file), _) => file.read_exact_at(offset, buf),
            (None, Some(map)) => {
                buf.copy_from_slice(&map.slice_at(offset, buf.len() as u64)?);
                Ok(())
            }
            (None, None) => unreachable!("an Input has a map or a file"),
        }
    }

    /// The CRC-32 of bytes `offset..offset + len`: over the map when there is one
    /// (one pass, which leaves its pages ready for a copy that follows), read
    /// positionally otherwise. The map is private: a caller's zero-copy array may
    /// have written to it, so a mismatch is worth confirming with
    /// [`Input::file_crc32`].
    pub fn crc32(&self, offset: u64, len: u64) -> Result<u32> {
        match &self.map {
            Some(map) => {
                self.check(offset, len)?;
                Ok(crc32fast::hash(&map.slice_at(offset, len)?))
            }
            None => self.file_crc32(offset, len),
        }
    }

    /// The CRC-32 of bytes `offset..offset + len` as the file holds them: read
    /// positionally, a chunk at a time, when a file is at hand, so a write to the
    /// private copy-on-write map is not counted; over the map otherwise (an image in
    /// memory, which callers get read-only).
    pub fn file_crc32(&self, offset: u64, len: u64) -> Result<u32> {
        self.check(offset, len)?;
        let mut hasher = crc32fast::Hasher::new();
        match (&self.file, &self.map) {
            (Some(file), _) => {
                const CHUNK: u64 = 1 << 20;
                let mut buf = vec![0u8; CHUNK.min(len) as usize];
                let mut done = 0;
                while done < len {
                    let n = CHUNK.min(len - done) as usize;
                    file.read_exact_at(offset + done, &mut buf[..n])?;
                    hasher.update(&buf[..n]);
                    done += n as u64;
                }
            }
            (None, Some(map)) => hasher.update(&map.slice_at(offset, len)?),
            (None, None) => unreachable!("an Input has a map or a file"),
        }
        Ok(hasher.finalize())
    }

    /// Up to `len` metadata bytes from `offset` (fewer at the end of the file).
    pub fn read_meta_up_to(&self, offset: u64, len: u64) -> Result<Bytes> {
        let len = len.min(self.len.saturating_sub(offset));
        self.read_meta(offset, len)
    }
}
