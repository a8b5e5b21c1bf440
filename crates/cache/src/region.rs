//! Typed access to the cache segment's memory: the one place that turns offsets into
//! pointers.
//!
//! Every field of the header, registry, index, free table and entry slots is read and
//! written as an atomic (relaxed) at an offset the [`Layout`](crate::layout::Layout)
//! computed and a bounds check confirms, so concurrent processes never race on plain
//! memory: the robust mutex orders the mutations, and the atomics make the reads that
//! happen without it (attach, stats) well defined.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use tensorwire_shm::Segment;

pub(crate) struct Region {
    /// Keeps the map alive.
    _segment: Arc<Segment>,
    base: *mut u8,
    len: usize,
}

// SAFETY: `base` points into `segment`'s shared map, kept alive by the `Arc`; all
// access is through atomics or through byte ranges the cache protocol reserves for one
// writer (see `data_mut`).
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// A region over a read-write segment; `None` for a read-only one.
    pub(crate) fn new(segment: Arc<Segment>) -> Option<Region> {
        let base = segment.as_mut_ptr()?;
        let len = segment.len();
        Some(Region {
            _segment: segment,
            base,
            len,
        })
    }

    /// Panics (a bug in this crate, never reachable from segment contents: every
    /// offset is derived from a checked layout and checked slot indices) when the
    /// field does not fit or is misaligned.
    fn check(&self, off: usize, size: usize) {
        assert!(
            off % size == 0 && off.checked_add(size).is_some_and(|end| end <= self.len),
            "cache field at {off} (+{size}) outside the segment or misaligned"
        );
    }

    fn a8(&self, off: usize) -> &AtomicU8 {
        self.check(off, 1);
        // SAFETY: in bounds (checked); AtomicU8 has no alignment requirement; the map
        // lives as long as `self`.
        unsafe { AtomicU8::from_ptr(self.base.add(off)) }
    }

    fn a32(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: in bounds and 4-aligned (checked; the map is page-aligned).
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }

    fn a64(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: in bounds and 8-aligned (checked; the map is page-aligned).
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }

    pub(crate) fn get8(&self, off: usize) -> u8 {
        self.a8(off).load(Relaxed)
    }
    pub(crate) fn set8(&self, off: usize, v: u8) {
        self.a8(off).store(v, Relaxed)
    }
    pub(crate) fn get32(&self, off: usize) -> u32 {
        self.a32(off).load(Relaxed)
    }
    pub(crate) fn set32(&self, off: usize, v: u32) {
        self.a32(off).store(v, Relaxed)
    }
    pub(crate) fn get64(&self, off: usize) -> u64 {
        self.a64(off).load(Relaxed)
    }
    pub(crate) fn set64(&self, off: usize, v: u64) {
        self.a64(off).store(v, Relaxed)
    }
    pub(crate) fn add64(&self, off: usize, v: u64) {
        self.a64(off).fetch_add(v, Relaxed);
    }
    pub(crate) fn or64(&self, off: usize, v: u64) -> u64 {
        self.a64(off).fetch_or(v, Relaxed)
    }
    pub(crate) fn and64(&self, off: usize, v: u64) -> u64 {
        self.a64(off).fetch_and(v, Relaxed)
    }

    /// Copies bytes out, one atomic byte at a time (keys: ≤ 128 bytes).
    pub(crate) fn read_bytes(&self, off: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.get8(off + i);
        }
    }

    /// Copies bytes in, one atomic byte at a time (keys: ≤ 128 bytes).
    pub(crate) fn write_bytes(&self, off: usize, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            self.set8(off + i, b);
        }
    }

    /// Zeroes `len` bytes (slot fields), atomically per byte.
    pub(crate) fn zero(&self, off: usize, len: usize) {
        for i in 0..len {
            self.set8(off + i, 0);
        }
    }

    /// True when `off..off+len` lies in the segment.
    pub(crate) fn contains(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// A value block for reading. `None` when the range is not in the segment. Like
    /// any view of shared memory, its bytes stay put only while the caller holds a pin
    /// (or the lock) on the entry owning the block.
    pub(crate) fn data(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.contains(off, len) {
            return None;
        }
        // SAFETY: in bounds (checked) of a map that lives as long as `self`; reading
        // memory other processes may write is the shared-segment contract
        // (`Segment::as_slice`), and the cache protocol keeps writers off pinned or
        // locked blocks.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(off), len) })
    }

    /// A value block for writing. `None` when the range is not in the segment.
    ///
    /// # Safety
    /// The block must be reserved for this caller alone: allocated to a slot in the
    /// `WRITING` state that this process owns (not in the index, not pinned, not in the
    /// free table), and no other slice over it may exist while this one lives.
    // SAFETY: an `unsafe fn` because it hands out `&mut` to shared memory: exclusivity
    // holds only under the caller contract above (a WRITING slot this process owns,
    // whose block no index entry, pin or free extent refers to).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn data_mut(&self, off: usize, len: usize) -> Option<&mut [u8]> {
        if !self.contains(off, len) {
            return None;
        }
        // SAFETY: in bounds (checked) and exclusively reserved (caller contract).
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) })
    }

    /// Address of byte `off` (for zero-copy views handed to an owner).
    pub(crate) fn addr(&self, off: usize) -> usize {
        self.base as usize + off
    }
}
