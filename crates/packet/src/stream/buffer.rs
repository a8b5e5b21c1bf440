//! The growable, 64-byte aligned buffer a stream reader collects one packet in.

use std::io;

use tensorwire_core::{Bytes, Error, Owner, Result};

/// Alignment of the first byte of a packet buffer.
const ALIGN: usize = 64;

/// One packet's bytes, growing as they arrive. The bytes live in `storage[start..]`,
/// where `start` (< 64) puts the first one on a 64-byte boundary; when the vector
/// reallocates, the bytes are moved to the new boundary.
#[derive(Debug, Default)]
pub(crate) struct PacketBuf {
    storage: Vec<u8>,
    start: usize,
}

/// A finished packet buffer shared as [`Bytes`].
struct Frozen {
    storage: Vec<u8>,
    start: usize,
}

impl Owner for Frozen {
    fn bytes(&self) -> &[u8] {
        self.storage.get(self.start..).unwrap_or(&[])
    }
}

impl PacketBuf {
    /// The packet bytes received so far.
    pub(crate) fn data(&self) -> &[u8] {
        self.storage.get(self.start..).unwrap_or(&[])
    }

    /// Number of packet bytes received so far.
    pub(crate) fn len(&self) -> usize {
        self.storage.len() - self.start
    }

    /// Bytes allocated (the capacity of the underlying vector).
    pub(crate) fn capacity(&self) -> usize {
        self.storage.capacity()
    }

    /// The vector readers append to; [`reserve`](Self::reserve) first, and append at
    /// most the reserved number of bytes so that it never reallocates.
    pub(crate) fn storage_mut(&mut self) -> &mut Vec<u8> {
        &mut self.storage
    }

    /// Makes room for `additional` more bytes (plus the realignment slack), growing
    /// geometrically but to no more than `cap_hint` bytes (plus the slack) unless
    /// `additional` itself needs more. Readers pass the smaller of the bytes the packet
    /// is known to need and the bytes received plus one read chunk.
    pub(crate) fn reserve(&mut self, additional: usize, cap_hint: usize) -> Result<()> {
        let oom = || {
            Error::Io(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate a {additional}-byte read buffer"),
            ))
        };
        let len = self.storage.len();
        let needed = len
            .checked_add(additional)
            .and_then(|n| n.checked_add(ALIGN - 1))
            .ok_or_else(oom)?;
        if self.storage.capacity() >= needed {
            return Ok(());
        }
        let hint = cap_hint.saturating_add(self.start + ALIGN - 1);
        let target = needed.max(self.storage.capacity().saturating_mul(2).min(hint));
        self.storage
            .try_reserve_exact(target - len)
            .map_err(|_| oom())?;
        self.realign();
        Ok(())
    }

    /// Moves the bytes so the first one is 64-byte aligned again after the vector
    /// reallocated (it has at least 63 bytes of spare capacity for this).
    pub(crate) fn realign(&mut self) {
        let misalignment = self.storage.as_ptr() as usize % ALIGN;
        let want = (ALIGN - misalignment) % ALIGN;
        if want == self.start {
            return;
        }
        let len = self.len();
        let from = self.start..self.start + len;
        if want > self.start {
            self.storage.resize(want + len, 0);
            self.storage.copy_within(from, want);
        } else {
            self.storage.copy_within(from, want);
            self.storage.truncate(want + len);
        }
        self.start = want;
    }

    /// Hands the bytes over as [`Bytes`] (no copy) and leaves the buffer empty.
    pub(crate) fn take(&mut self) -> Bytes {
        // Appending may have reallocated if a reader broke the reserve contract.
        self.realign();
        let storage = std::mem::take(&mut self.storage);
        let start = std::mem::take(&mut self.start);
        Bytes::from_owner(Frozen { storage, start })
    }

    /// Drops the bytes and frees the memory.
    pub(crate) fn clear(&mut self) {
        *self = PacketBuf::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_aligned_while_growing() {
        let mut buf = PacketBuf::default();
        let mut expected = Vec::new();
        for round in 0..200usize {
            let n = (round * 37) % 1000 + 1;
            buf.reserve(n, usize::MAX).unwrap();
            let before = buf.capacity();
            let bytes: Vec<u8> = (0..n).map(|i| (i + round) as u8).collect();
            buf.storage_mut().extend_from_slice(&bytes);
            expected.extend_from_slice(&bytes);
            assert_eq!(buf.capacity(), before, "appending within the reservation");
            assert_eq!(buf.data().as_ptr() as usize % ALIGN, 0);
            assert_eq!(buf.data(), &expected[..]);
        }
        let bytes = buf.take();
        assert!(bytes.is_aligned(ALIGN));
        assert_eq!(&bytes[..], &expected[..]);
        assert_eq!(buf.len(), 0);
    }

    #[test]
    fn growth_is_capped_by_the_hint() {
        let mut buf = PacketBuf::default();
        buf.reserve(1 << 20, 1 << 20).unwrap();
        let len = buf.storage_mut().len();
        buf.storage_mut().resize(len + (1 << 20), 7);
        buf.reserve(10, (1 << 20) + 10).unwrap();
        assert!(
            buf.capacity() <= (1 << 20) + 10 + 2 * ALIGN,
            "{}",
            buf.capacity()
        );
    }
}
