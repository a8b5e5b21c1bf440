//! CPU tensors shared zero-copy through memfd segments.
//!
//! A producer's storages are packed into one sealed memfd ([`StoragePacker`]); the
//! descriptor travels with the frame and the consumer maps it ([`map_received`]).
//! Both sides register every live segment in a process-wide table by address, so a
//! storage that already lives in a shared segment (an argument received from a peer
//! and sent back, a cached result shared again) is sent as a range of that segment
//! instead of being copied ([`find_segment`]). The consumer's map of a memfd it
//! already has mapped is reused too (keyed by the file's inode).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use tensorwire_core::Bytes;
use tensorwire_shm::{Access, Segment};

use crate::error::{IpcError, Result};
use crate::util::lock;

/// Alignment of each storage packed into a memfd.
pub const STORAGE_ALIGN: usize = 64;

/// Existing segments one value may reference (the new memfd takes the last of the
/// frame's descriptor slots).
const MAX_REFERENCED_SEGMENTS: usize = crate::frame::MAX_FDS_PER_FRAME - 1;

/// Smallest new segment whose pages are allocated up front before it is filled.
const PREFAULT_MIN: usize = 64 << 10;

struct Registry {
    /// Live segments by base address (for `find_segment`).
    by_addr: Vec<(usize, usize, Weak<Segment>)>,
    /// Live received segments by (device, inode) (for `map_received`).
    by_inode: BTreeMap<(u64, u64), Weak<Segment>>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    by_addr: Vec::new(),
    by_inode: BTreeMap::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    lock(&REGISTRY)
}

impl Registry {
    fn prune(&mut self) {
        self.by_addr.retain(|(_, _, w)| w.strong_count() > 0);
        self.by_inode.retain(|_, w| w.strong_count() > 0);
    }

    /// Records a live segment under its address range and its file's `key`.
    fn add(&mut self, segment: &Arc<Segment>, key: (u64, u64)) {
        self.prune();
        let start = segment.as_ptr() as usize;
        self.by_addr
            .push((start, start + segment.len(), Arc::downgrade(segment)));
        self.by_inode.insert(key, Arc::downgrade(segment));
    }
}

/// The live shared segment holding `ptr..ptr+len`, if any, and the range's offset in it.
pub fn find_segment(ptr: *const u8, len: usize) -> Option<(Arc<Segment>, u64)> {
    let addr = ptr as usize;
    let end = addr.checked_add(len)?;
    let reg = registry();
    reg.by_addr.iter().find_map(|(start, stop, weak)| {
        if addr >= *start && end <= *stop {
            weak.upgrade().map(|s| (s, (addr - start) as u64))
        } else {
            None
        }
    })
}

/// Registers a segment this process shares, so [`find_segment`] finds it (and a
/// descriptor of it coming back from a peer maps to this same segment).
pub fn register(segment: &Arc<Segment>) -> Result<()> {
    let key = inode(segment.fd())?;
    registry().add(segment, key);
    Ok(())
}

/// A new zero-filled memfd of `size` bytes, registered so that tensors placed in it
/// are shared without a copy (and alias between the processes that share them).
pub fn shared_segment(size: usize) -> Result<Arc<Segment>> {
    let segment = Arc::new(Segment::memfd("tensorwire-ipc", size.max(1))?);
    if size >= PREFAULT_MIN {
        segment.prefault();
    }
    register(&segment)?;
    Ok(segment)
}

/// Maps a memfd received from a peer (read-write: CPU shares alias the producer's
/// memory, as CUDA IPC does). A descriptor for a file this process already has mapped
/// reuses that map. The memfd must be sealed against shrinking, so its sender cannot
/// truncate it under the map.
pub fn map_received(fd: OwnedFd) -> Result<Arc<Segment>> {
    let key = inode(fd.as_fd())?;
    let mut reg = registry();
    if let Some(seg) = reg.by_inode.get(&key).and_then(Weak::upgrade) {
        return Ok(seg);
    }
    let segment = Arc::new(Segment::from_fd(fd, Access::ReadWrite, true)?);
    reg.add(&segment, key);
    Ok(segment)
}

fn inode(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    // SAFETY: `stat` is plain data; all-zero is valid and fstat overwrites it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` a writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok((st.st_dev, st.st_ino))
}

/// Where one packed storage ended up.
#[derive(Debug, Clone)]
pub struct Placed {
    /// Index into `StoragePacker::segments`.
    pub segment: usize,
    /// Byte offset in that segment.
    pub offset: u64,
}

/// Collects a payload's CPU storages: ranges of segments already shared are referenced
/// as they are; the rest are copied into one new memfd by [`StoragePacker::finish`].
#[derive(Default)]
pub struct StoragePacker<'a> {
    segments: Vec<Arc<Segment>>,
    pending: Vec<(usize, &'a [u8])>,
    placed: Vec<Option<Placed>>,
    pending_len: usize,
}

impl<'a> StoragePacker<'a> {
    /// An empty packer.
    pub fn new() -> Self {
        StoragePacker::default()
    }

    /// Adds a storage; returns its index in placement order.
    pub fn add(&mut self, bytes: &'a [u8]) -> Result<usize> {
        let index = self.placed.len();
        if let Some((segment, offset)) = find_segment(bytes.as_ptr(), bytes.len()) {
            let known = self.segments.iter().position(|s| Arc::ptr_eq(s, &segment));
            // One frame carries at most MAX_FDS_PER_FRAME descriptors: past that many
            // distinct segments (one kept for the new memfd), storages are copied.
            if known.is_some() || self.segments.len() < MAX_REFERENCED_SEGMENTS {
                let seg_index = known.unwrap_or_else(|| {
                    self.segments.push(segment);
                    self.segments.len() - 1
                });
                self.placed.push(Some(Placed {
                    segment: seg_index,
                    offset,
                }));
                return Ok(index);
            }
        }
        let at = self
            .pending_len
            .checked_next_multiple_of(STORAGE_ALIGN)
            .and_then(|at| at.checked_add(bytes.len()))
            .ok_or_else(|| IpcError::protocol("packed storages overflow usize"))?;
        self.pending_len = at;
        self.pending.push((index, bytes));
        self.placed.push(None);
        Ok(index)
    }

    /// Bytes that [`finish`](Self::finish) will copy.
    pub fn bytes_to_copy(&self) -> usize {
        self.pending.iter().map(|(_, b)| b.len()).sum()
    }

    /// Copies the pending storages into a new memfd through `copy`, which gets
    /// `(destination, source)` pairs of equal length (copy them in any order, in
    /// parallel if worth it), and returns the segments and every storage's place.
    pub fn finish(
        mut self,
        copy: impl FnOnce(Vec<(&mut [u8], &'a [u8])>),
    ) -> Result<(Vec<Arc<Segment>>, Vec<Placed>)> {
        if !self.pending.is_empty() {
            let segment = shared_segment(self.pending_len)?;
            let base = segment
                .as_mut_ptr()
                .ok_or_else(|| IpcError::protocol("a new memfd is not writable"))?;
            // SAFETY: the segment was just created and mapped read-write for
            // `segment.len()` bytes; nothing else refers to its memory yet (the registry
            // holds a `Weak` to the segment, no pointer into it), and `segment` outlives
            // the slice, which is dropped when `copy` returns.
            let mut rest: &mut [u8] =
                unsafe { std::slice::from_raw_parts_mut(base, segment.len()) };
            let seg_index = self.segments.len();
            let mut at = 0usize;
            let mut jobs = Vec::with_capacity(self.pending.len());
            for (index, bytes) in std::mem::take(&mut self.pending) {
                let start = at.next_multiple_of(STORAGE_ALIGN);
                let (dst, tail) = std::mem::take(&mut rest)
                    .split_at_mut_checked(start - at)
                    .and_then(|(_, tail)| tail.split_at_mut_checked(bytes.len()))
                    .ok_or_else(|| IpcError::protocol("packed storages overrun their memfd"))?;
                rest = tail;
                jobs.push((dst, bytes));
                self.placed[index] = Some(Placed {
                    segment: seg_index,
                    offset: start as u64,
                });
                at = start + bytes.len();
            }
            copy(jobs);
            self.segments.push(segment);
        }
        let placed = self
            .placed
            .into_iter()
            .map(|p| p.ok_or_else(|| IpcError::protocol("a storage was not placed")))
            .collect::<Result<_>>()?;
        Ok((self.segments, placed))
    }
}

/// Copies each `(destination, source)` pair on the calling thread.
pub fn copy_serial(jobs: Vec<(&mut [u8], &[u8])>) {
    for (dst, src) in jobs {
        dst.copy_from_slice(src);
    }
}

/// A view of `len` bytes at `offset` of a received segment.
pub fn storage_bytes(segment: &Arc<Segment>, offset: u64, len: u64) -> Result<Bytes> {
    Ok(Bytes::from_arc(segment.clone()).slice_at(offset, len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(segment: &Segment) -> OwnedFd {
        segment.fd().try_clone_to_owned().unwrap()
    }

    #[test]
    fn packs_copies_and_reuses_shared_ranges() {
        let a = vec![1u8; 100];
        let b = vec![2u8; 7];
        let mut packer = StoragePacker::new();
        packer.add(&a).unwrap();
        packer.add(&b).unwrap();
        assert_eq!(packer.bytes_to_copy(), 107);
        let (segments, placed) = packer.finish(copy_serial).unwrap();
        assert_eq!(segments.len(), 1);
        assert_eq!(placed[0].offset, 0);
        assert_eq!(placed[1].offset, 128);
        let seg = &segments[0];
        assert_eq!(&seg.as_slice()[..100], &a[..]);
        assert_eq!(&seg.as_slice()[128..135], &b[..]);

        // A range inside that segment is found, not copied again.
        let inner = &seg.as_slice()[128..135];
        let mut again = StoragePacker::new();
        again.add(inner).unwrap();
        assert_eq!(again.bytes_to_copy(), 0);
        let (segs, placed) = again.finish(copy_serial).unwrap();
        assert!(Arc::ptr_eq(&segs[0], seg));
        assert_eq!(placed[0].offset, 128);
    }

    #[test]
    fn received_descriptor_maps_once() {
        let mut packer = StoragePacker::new();
        let data = [9u8; 4096];
        packer.add(&data).unwrap();
        let (segments, _) = packer.finish(copy_serial).unwrap();
        let one = map_received(dup(&segments[0])).unwrap();
        let two = map_received(dup(&segments[0])).unwrap();
        assert!(Arc::ptr_eq(&one, &two));
        assert_eq!(&one.as_slice()[..4096], &data[..]);
        let view = storage_bytes(&one, 10, 20).unwrap();
        assert_eq!(&view[..], &[9u8; 20][..]);
        assert!(storage_bytes(&one, 4090, 20).is_err());
    }

    #[test]
    fn storages_in_a_shared_segment_are_not_copied() {
        let segment = shared_segment(1000).unwrap();
        let inside = &segment.as_slice()[100..200];
        let mut packer = StoragePacker::new();
        packer.add(inside).unwrap();
        assert_eq!(packer.bytes_to_copy(), 0);
        let (segs, placed) = packer.finish(copy_serial).unwrap();
        assert!(Arc::ptr_eq(&segs[0], &segment));
        assert_eq!(placed[0].offset, 100);
    }

    #[test]
    fn storages_past_the_descriptor_limit_are_copied() {
        let segments: Vec<_> = (0..70).map(|_| shared_segment(64).unwrap()).collect();
        let mut packer = StoragePacker::new();
        for s in &segments {
            packer.add(&s.as_slice()[..64]).unwrap();
        }
        assert_eq!(packer.bytes_to_copy(), 7 * 64);
        let (segs, placed) = packer.finish(copy_serial).unwrap();
        assert_eq!(segs.len(), crate::frame::MAX_FDS_PER_FRAME);
        assert!(placed.iter().all(|p| p.segment < segs.len()));
    }

    #[test]
    fn unsealed_descriptors_are_refused() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let fd = file.as_fd().try_clone_to_owned().unwrap();
        assert!(map_received(fd).is_err());
    }
}
