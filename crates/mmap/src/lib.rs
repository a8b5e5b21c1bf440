//! Memory maps of tensor files: read-only (`MAP_SHARED`, `PROT_READ`) and private
//! copy-on-write (`MAP_PRIVATE`), exposed as [`tensorwire_core::Bytes`] owners, plus
//! `madvise` hints.
//!
//! Not in scope: parsing, shared-memory segments (`tensorwire-shm`), positional reads
//! (`tensorwire-range`).
//!
//! # Safety of file maps
//!
//! A map reflects the file: if another process truncates or rewrites the file while it
//! is mapped, reads may see changed bytes or fault (`SIGBUS`). Like every mmap-based
//! loader (numpy, safetensors), tensorwire accepts that risk for files it is asked to
//! open; the private mode protects the *file* from our writes, not our view from other
//! writers of the file.
#![deny(missing_docs)]

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Advice, Mmap, MmapMut, MmapOptions};
use tensorwire_core::{Bytes, Error, Owner, Result};

/// How a file is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapMode {
    /// Shared read-only map: views are read-only.
    ReadOnly,
    /// Private copy-on-write map: views may be written; writes stay in this process
    /// (pages are copied on first write) and never reach the file or another mapping.
    CopyOnWrite,
}

/// Access-pattern hints that never change what a later read observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// Pages will be read in order (aggressive read-ahead).
    Sequential,
    /// Pages will be read in random order (no read-ahead).
    Random,
    /// Pages will be needed soon (start reading them in now).
    WillNeed,
}

enum Inner {
    ReadOnly(Mmap),
    /// The map plus its base address, taken once while we still owned it mutably.
    CopyOnWrite {
        map: MmapMut,
        base: *mut u8,
    },
    /// Zero-length files cannot be mapped.
    Empty,
}

/// A mapped file. Shared through an `Arc`, it is the [`Owner`] of every zero-copy
/// tensor view taken from it.
pub struct MappedFile {
    inner: Inner,
    mode: MapMode,
}

// SAFETY: `base` points into `map`, which this struct owns and never remaps or
// unmaps before it is dropped; the pointer is only handed out (via `writable_base`)
// to consumers that write private, copy-on-write pages (numpy and torch arrays).
// Sharing it between threads is as safe as sharing `MmapMut`.
//
// Such a consumer may write while `&[u8]` views of the same bytes (`as_slice`, a
// `Bytes`) are alive elsewhere, which Rust's aliasing rules do not allow for shared
// references: the same contract a writable numpy array over a map makes. No memory
// safety rests on those bytes' values: every length, offset and header was read and
// checked at open (or positionally, from the file), and later reads of tensor bytes
// only copy them (a copy racing a write may see either value, as with any numpy
// array written by another thread). docs/architecture.md lists this limit.
unsafe impl Send for MappedFile {}
// SAFETY: see `Send`; `&MappedFile` only exposes `&[u8]` and the raw base address.
unsafe impl Sync for MappedFile {}

/// Catches SIGBUS, which reading a map of a file that another program truncated
/// raises, for a program (the CLI) that writes files through
/// `tensorwire_core::create_temporary`: the handler removes the temporaries not yet
/// renamed into place (only async-signal-safe calls), says why on stderr, and lets the
/// signal end the process as it would have. Not for libraries: it takes over the
/// process's SIGBUS disposition, and each temporary's name is then kept for good
/// (`tensorwire_core::keep_temporaries_for_signal_handlers`).
#[cfg(unix)]
pub fn remove_temporaries_on_bus_error() {
    extern "C" fn on_bus_error(_: libc::c_int) {
        for slot in tensorwire_core::temporary_names_for_signal_handlers() {
            let name = slot.load(std::sync::atomic::Ordering::SeqCst);
            if !name.is_null() {
                // SAFETY: a non-null slot holds a NUL-terminated name that is never
                // freed; unlink(2) is async-signal-safe.
                unsafe { libc::unlink(name) };
            }
        }
        let message = b"tensorwire: bus error: a mapped file changed size while it was \
read (truncated by another program?); the partial output was removed\n";
        // SAFETY: write(2) and raise(3) are async-signal-safe and the buffer is static.
        // SA_RESETHAND made the action the default again, so the raised SIGBUS (held
        // until the handler returns) ends the process, as the retried fault would.
        unsafe {
            libc::write(2, message.as_ptr().cast(), message.len());
            libc::raise(libc::SIGBUS);
        }
    }
    tensorwire_core::keep_temporaries_for_signal_handlers();
    // SAFETY: a zeroed sigaction is a valid start; the handler is an `extern "C" fn`
    // taking the signal number, and makes only async-signal-safe calls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_bus_error as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

impl MappedFile {
    /// Maps the file at `path` in `mode`. Errors carry the path. A FIFO with no
    /// writer is refused at once, not waited on (`core::open_for_reading`).
    pub fn open(path: impl AsRef<Path>, mode: MapMode) -> Result<MappedFile> {
        let path = path.as_ref();
        let file =
            tensorwire_core::open_for_reading(path).map_err(|e| Error::from(e).with_path(path))?;
        MappedFile::from_file(&file, mode).map_err(|e| e.with_path(path))
    }

    /// Maps an open file in `mode`.
    pub fn from_file(file: &File, mode: MapMode) -> Result<MappedFile> {
        let meta = file.metadata()?;
        tensorwire_core::check_regular_file(&meta, "mapped")?;
        let len = meta.len();
        if len == 0 {
            return Ok(MappedFile {
                inner: Inner::Empty,
                mode,
            });
        }
        usize::try_from(len).map_err(|_| Error::Overflow {
            what: "file length as usize",
        })?;
        let inner = match mode {
            MapMode::ReadOnly => {
                // SAFETY: the file-map risk (another writer changing the file) is
                // accepted by the crate's documented contract; see the crate docs.
                let map = unsafe { MmapOptions::new().map(file) }?;
                Inner::ReadOnly(map)
            }
            MapMode::CopyOnWrite => {
                // SAFETY: as above; `map_copy` is MAP_PRIVATE, so our writes never
                // reach the file.
                let mut map = unsafe { MmapOptions::new().map_copy(file) }?;
                let base = map.as_mut_ptr();
                Inner::CopyOnWrite { map, base }
            }
        };
        Ok(MappedFile { inner, mode })
    }

    /// Maps `path` and returns a [`Bytes`] over the whole file.
    pub fn open_bytes(path: impl AsRef<Path>, mode: MapMode) -> Result<Bytes> {
        Ok(MappedFile::open(path, mode)?.into_bytes())
    }

    /// Shares the map as [`Bytes`] over the whole file.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_arc(Arc::new(self))
    }

    /// The mode the file was mapped in.
    pub fn mode(&self) -> MapMode {
        self.mode
    }

    /// Length of the map in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mapped bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.inner {
            Inner::ReadOnly(m) => m,
            Inner::CopyOnWrite { map, .. } => map,
            Inner::Empty => &[],
        }
    }

    /// Tells the kernel how the map will be read.
    pub fn hint(&self, hint: Hint) -> io::Result<()> {
        let advice = match hint {
            Hint::Sequential => Advice::Sequential,
            Hint::Random => Advice::Random,
            Hint::WillNeed => Advice::WillNeed,
        };
        match &self.inner {
            Inner::ReadOnly(m) => m.advise(advice),
            Inner::CopyOnWrite { map, .. } => map.advise(advice),
            Inner::Empty => Ok(()),
        }
    }

    /// Like [`MappedFile::hint`] for a byte range of the map.
    pub fn hint_range(&self, hint: Hint, offset: usize, len: usize) -> io::Result<()> {
        let advice = match hint {
            Hint::Sequential => Advice::Sequential,
            Hint::Random => Advice::Random,
            Hint::WillNeed => Advice::WillNeed,
        };
        // madvise needs a page-aligned start: round down.
        let page = page_size();
        let start = offset - offset % page;
        let len = len.saturating_add(offset - start);
        if start >= self.len() {
            return Ok(());
        }
        let len = len.min(self.len() - start);
        match &self.inner {
            Inner::ReadOnly(m) => m.advise_range(advice, start, len),
            Inner::CopyOnWrite { map, .. } => map.advise_range(advice, start, len),
            Inner::Empty => Ok(()),
        }
    }
}

/// An empty vector with room for `capacity` bytes, whose allocation the kernel is asked
/// (`madvise(MADV_HUGEPAGE)`, Linux) to back with transparent huge pages when it is
/// large. Filling a fresh multi-megabyte buffer is then bounded by memory bandwidth
/// rather than by one page fault per 4 KiB — what numpy does for its own arrays. The
/// advice is best effort: where it is not available the vector is an ordinary one.
pub fn huge_page_vec(capacity: usize) -> Vec<u8> {
    let v: Vec<u8> = Vec::with_capacity(capacity);
    // The vector's allocation is `capacity` bytes from its pointer.
    advise_huge_pages_in(v.as_ptr() as usize, capacity);
    v
}

/// A copy of `bytes` in fresh memory, made the fast way: the memory is asked for huge
/// pages ([`advise_huge_pages`]) and filled by the calling thread and the copy
/// helpers together ([`tensorwire_core::copy`]), so the page faults of the fresh
/// memory are taken on every thread at once. For 500 MiB on a 2-core machine about
/// 3× faster than `bytes.to_vec()` (`tensorwire bench`).
pub fn fresh_copy(bytes: &[u8]) -> Vec<u8> {
    // Zeroed rather than uninitialised, so the copy writes into a valid slice. A large
    // zeroed allocation comes untouched from the kernel (no zeroing pass), and the
    // copy is then the first to write it; reused heap memory is zeroed first.
    let mut copy = vec![0u8; bytes.len()];
    advise_huge_pages(&mut copy);
    tensorwire_core::copy::copy(&mut copy, bytes);
    copy
}

/// Asks the kernel to back the 2 MiB-aligned interior of `buf` with transparent huge
/// pages, for a destination about to be filled whose memory another allocator made
/// (a torch tensor from `torch.empty`): a multi-megabyte fill is then bounded by
/// memory bandwidth rather than by a page fault per 4 KiB. Pages already touched keep
/// their contents. Best effort: a no-op for small buffers and where the advice is not
/// available.
pub fn advise_huge_pages(buf: &mut [u8]) {
    advise_huge_pages_in(buf.as_mut_ptr() as usize, buf.len());
}

/// `madvise(MADV_HUGEPAGE)` on the whole huge pages inside `[begin, begin + len)`, a
/// range the caller owns.
fn advise_huge_pages_in(begin: usize, len: usize) {
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE {
        let start = begin.next_multiple_of(HUGE_PAGE);
        let end = (begin + len) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: [start, end) lies inside the caller's allocation of `len` bytes
            // at `begin`, page-aligned at both ends; MADV_HUGEPAGE only changes how
            // the kernel backs those pages, never their contents or validity. A
            // failure (e.g. THP disabled) leaves the memory as it was, so it is ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (begin, len);
}

/// The transparent huge page size on x86-64 and aarch64 (4 KiB base pages).
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

impl Owner for MappedFile {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }

    fn writable_base(&self) -> Option<*mut u8> {
        match &self.inner {
            Inner::CopyOnWrite { base, .. } => Some(*base),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_advice_keeps_contents() {
        // Large enough to hold whole huge pages at any alignment; filled before and
        // after the advice.
        let mut buf: Vec<u8> = (0..(9usize << 20)).map(|i| (i % 251) as u8).collect();
        advise_huge_pages(&mut buf);
        assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        buf.iter_mut().for_each(|b| *b = b.wrapping_add(1));
        assert!(buf
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((i % 251) as u8).wrapping_add(1)));
        // Small and empty buffers are left alone.
        advise_huge_pages(&mut [1u8, 2, 3]);
        advise_huge_pages(&mut []);
    }
    use std::io::Write;

    #[test]
    fn fresh_copy_is_exact_at_every_size() {
        for len in [0usize, 1, 4095, (2 << 20) + 3, (5 << 20) + 17] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            assert_eq!(fresh_copy(&src), src, "len {len}");
        }
    }

    fn temp_file(content: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(content).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn huge_page_vec_has_the_capacity_and_works() {
        for cap in [0, 100, 5 << 20] {
            let mut v = huge_page_vec(cap);
            assert!(v.capacity() >= cap && v.is_empty());
            v.resize(cap, 7);
            assert!(v.iter().all(|&b| b == 7));
        }
    }

    #[test]
    fn read_only_map_sees_the_file() {
        let f = temp_file(b"hello tensors");
        let bytes = MappedFile::open_bytes(f.path(), MapMode::ReadOnly).unwrap();
        assert_eq!(&*bytes, b"hello tensors");
        assert!(bytes.writable_ptr().is_none());
        let map = MappedFile::open(f.path(), MapMode::ReadOnly).unwrap();
        map.hint(Hint::Sequential).unwrap();
        map.hint_range(Hint::WillNeed, 3, 5).unwrap();
    }

    #[test]
    fn private_writes_never_reach_the_file_or_other_maps() {
        let f = temp_file(&[1u8; 8192]);
        let a = MappedFile::open_bytes(f.path(), MapMode::CopyOnWrite).unwrap();
        let b = MappedFile::open_bytes(f.path(), MapMode::CopyOnWrite).unwrap();
        let ptr = a.slice(100..).unwrap().writable_ptr().unwrap();
        // SAFETY: `ptr` is inside `a`'s private map (100 < 8192) and nothing else
        // reads that byte concurrently.
        unsafe { ptr.write(42) };
        assert_eq!(a[100], 42);
        assert_eq!(b[100], 1);
        assert_eq!(std::fs::read(f.path()).unwrap()[100], 1);
    }

    #[test]
    fn empty_file_maps_to_empty_bytes() {
        let f = temp_file(b"");
        let bytes = MappedFile::open_bytes(f.path(), MapMode::CopyOnWrite).unwrap();
        assert!(bytes.is_empty());
    }

    #[test]
    fn a_pipe_with_no_writer_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opened on a thread: a blocking open would never return.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(MappedFile::open(&path, MapMode::ReadOnly).err());
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a pipe returned")
            .expect("a pipe is refused");
        let text = err.to_string();
        assert!(text.contains("not a regular file"), "{text}");
        assert!(text.contains(&fifo.display().to_string()), "{text}");
    }

    #[test]
    fn missing_file_error_names_the_path() {
        let err = MappedFile::open("/nonexistent/x.zt", MapMode::ReadOnly)
            .err()
            .unwrap();
        assert!(err.to_string().contains("/nonexistent/x.zt"));
    }
}
