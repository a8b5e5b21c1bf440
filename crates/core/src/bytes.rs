//! `Bytes`: a cheap, cloneable byte range that keeps the owner of its memory alive.

use std::fmt;
use std::ops::{Bound, Deref, RangeBounds};
use std::sync::Arc;

use crate::error::{Error, Result};

/// Memory that [`Bytes`] can borrow from: a map, a shared-memory segment, a buffer.
///
/// The owner is kept in an `Arc`; every `Bytes` that views it holds a clone, so the
/// memory stays valid until the last view is gone.
pub trait Owner: Send + Sync + 'static {
    /// The whole region the owner holds. Must return the same address and length on
    /// every call.
    fn bytes(&self) -> &[u8];

    /// Base address for consumers that may write (for example a numpy array handed to
    /// Python) when the memory is private to this process, such as a copy-on-write
    /// map; `None` when views must stay read-only. Writing through it never changes
    /// any file or another process's memory.
    fn writable_base(&self) -> Option<*mut u8> {
        None
    }
}

impl Owner for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Owner for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Owner for &'static [u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A byte range inside an [`Owner`]: `(owner, start, len)`.
///
/// Cloning and slicing are O(1) and never copy. Methods that copy say so
/// (`to_vec`).
///
/// ```
/// use tensorwire_core::Bytes;
/// let all = Bytes::from_vec(vec![1, 2, 3, 4]);
/// let tail = all.slice(2..).unwrap();
/// drop(all); // `tail` keeps the buffer alive
/// assert_eq!(&*tail, &[3, 4]);
/// ```
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn Owner>,
    start: usize,
    len: usize,
}

impl Bytes {
    /// Views the whole of `owner`.
    pub fn from_owner<O: Owner>(owner: O) -> Bytes {
        Bytes::from_arc(Arc::new(owner))
    }

    /// Views the whole of an owner that is already shared.
    pub fn from_arc(owner: Arc<dyn Owner>) -> Bytes {
        let len = owner.bytes().len();
        Bytes {
            owner,
            start: 0,
            len,
        }
    }

    /// Takes ownership of a vector without copying it.
    pub fn from_vec(v: Vec<u8>) -> Bytes {
        Bytes::from_owner(v)
    }

    /// Views static memory.
    pub fn from_static(s: &'static [u8]) -> Bytes {
        Bytes::from_owner(s)
    }

    /// An empty view.
    pub fn empty() -> Bytes {
        Bytes::from_static(&[])
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let all = self.owner.bytes();
        // Construction checked start + len <= all.len(), and owners never change size.
        all.get(self.start..self.start + self.len).unwrap_or(&[])
    }

    /// A sub-range of this view, sharing the owner. Fails with
    /// [`Error::OutOfBounds`] when the range does not fit.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<Bytes> {
        let begin = match range.start_bound() {
            Bound::Included(&b) => b,
            Bound::Excluded(&b) => b.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if begin > end || end > self.len {
            return Err(Error::OutOfBounds {
                tensor: String::new(),
                offset: begin as u64,
                length: end.saturating_sub(begin) as u64,
                limit: self.len as u64,
            });
        }
        Ok(Bytes {
            owner: Arc::clone(&self.owner),
            start: self.start + begin,
            len: end - begin,
        })
    }

    /// A sub-range given as a `u64` offset and length (as formats declare them),
    /// checked for overflow and bounds.
    pub fn slice_at(&self, offset: u64, length: u64) -> Result<Bytes> {
        let out_of_bounds = || Error::OutOfBounds {
            tensor: String::new(),
            offset,
            length,
            limit: self.len as u64,
        };
        let begin = usize::try_from(offset).map_err(|_| out_of_bounds())?;
        let len = usize::try_from(length).map_err(|_| out_of_bounds())?;
        let end = begin.checked_add(len).ok_or_else(out_of_bounds)?;
        self.slice(begin..end)
    }

    /// The owner these bytes borrow from.
    pub fn owner(&self) -> &Arc<dyn Owner> {
        &self.owner
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }

    /// Address of the first byte for a consumer allowed to write, when the owner is
    /// private to this process (see [`Owner::writable_base`]).
    pub fn writable_ptr(&self) -> Option<*mut u8> {
        self.owner
            .writable_base()
            .map(|base| base.wrapping_add(self.start))
    }

    /// True when the first byte's address is a multiple of `align`.
    pub fn is_aligned(&self, align: usize) -> bool {
        align <= 1 || (self.as_ptr() as usize) % align == 0
    }

    /// Copies the bytes into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.as_slice().to_vec()
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes")
            .field("len", &self.len)
            .field("ptr", &self.as_ptr())
            .finish()
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes::from_vec(v)
    }
}

/// The alignment of [`AlignedBuf`]'s first byte.
const ALIGN: usize = 64;

/// A zero-initialised heap buffer whose first byte is 64-byte aligned, so typed views
/// of any dtype (and SIMD loads) are aligned. Used for decoded (decompressed) tensors
/// and for copies.
///
/// The storage is a zeroed `Vec<u8>` 63 bytes longer than asked for, viewed from its
/// first 64-aligned byte: `vec![0; n]` comes from `calloc`, so a large buffer is backed
/// by the kernel's zero pages and costs no pass over memory before it is written.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes. Fails with [`Error::Io`] (out of memory) rather
    /// than aborting when the allocation cannot be made.
    pub fn zeroed(len: usize) -> Result<AlignedBuf> {
        let oom = || {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes"),
            ))
        };
        let padded = len.checked_add(ALIGN - 1).ok_or_else(oom)?;
        // Probe the allocation first so a huge request is an error, not an abort.
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(padded).map_err(|_| oom())?;
        drop(probe);
        let storage = vec![0u8; padded];
        let start = (ALIGN - storage.as_ptr() as usize % ALIGN) % ALIGN;
        Ok(AlignedBuf {
            storage,
            start,
            len,
        })
    }

    /// A 64-aligned copy of `data`.
    pub fn copy_from(data: &[u8]) -> Result<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(data.len())?;
        buf.as_mut_slice().copy_from_slice(data);
        Ok(buf)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shares the buffer as [`Bytes`] without copying.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl Owner for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counted(Vec<u8>, Arc<AtomicUsize>);
    impl Owner for Counted {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_exact() {
        for len in [0, 1, 63, 64, 65, 1000, 3 << 20] {
            let mut buf = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_slice().as_ptr() as usize % 64, 0, "len {len}");
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.as_mut_slice().fill(7);
            let bytes = buf.into_bytes();
            assert!(bytes.is_aligned(64));
            assert_eq!(bytes.len(), len);
        }
        assert!(AlignedBuf::zeroed(usize::MAX).is_err());
        assert!(AlignedBuf::zeroed(usize::MAX - 100).is_err());
    }

    #[test]
    fn owner_dropped_exactly_once_after_clones_and_slices() {
        let drops = Arc::new(AtomicUsize::new(0));
        let all = Bytes::from_owner(Counted(vec![0, 1, 2, 3, 4, 5], Arc::clone(&drops)));
        let a = all.slice(1..5).unwrap();
        let b = a.slice(1..).unwrap();
        let c = b.clone();
        drop(all);
        drop(a);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert_eq!(&*c, &[2, 3, 4]);
        drop(b);
        drop(c);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn out_of_range_slices_are_errors() {
        let b = Bytes::from_vec(vec![0; 8]);
        assert!(b.slice(4..9).is_err());
        assert!(b.slice_at(u64::MAX, 2).is_err());
        assert!(b.slice_at(8, 0).unwrap().is_empty());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = b.slice(5..3);
        assert!(reversed.is_err());
    }

    #[test]
    fn aligned_buf_is_aligned() {
        for len in [0usize, 1, 63, 64, 65, 1000] {
            let buf = AlignedBuf::copy_from(&vec![7u8; len]).unwrap();
            assert_eq!(buf.len(), len);
            let bytes = buf.into_bytes();
            assert!(bytes.is_aligned(64));
            assert!(bytes.iter().all(|&x| x == 7));
        }
    }
}
