//! Shared-memory segments: named POSIX objects and anonymous memfds, mapped shared.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use tensorwire_core::{Bytes, Error, Owner, Result};

use crate::name::posix_path;

/// How a segment is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `PROT_READ`: views only.
    ReadOnly,
    /// `PROT_READ | PROT_WRITE`: writes are seen by every process mapping the segment.
    ReadWrite,
}

/// How [`Segment::create`] makes a named segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    /// Permission bits of the new object (default `0o600`: this user only).
    pub mode: u32,
    /// Fail with `AlreadyExists` when the name is taken (default). When false, an
    /// existing segment of exactly the requested size is opened instead.
    pub exclusive: bool,
    /// Allocate every page now (`posix_fallocate`; default), so a full `/dev/shm` is
    /// [`Error::NoSpace`] here rather than a `SIGBUS` at the first write past the
    /// limit. Costs about a quarter second per GiB and commits the memory at once;
    /// when false, only the space free now is checked and pages come as they are
    /// written (a pool that fills slowly, like a cache).
    pub allocate: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            mode: 0o600,
            exclusive: true,
            allocate: true,
        }
    }
}

/// One mapping of a shared-memory object in this process.
struct Mapping {
    /// The object: `(st_dev, st_ino)` of its descriptor.
    object: (u64, u64),
    base: usize,
    len: usize,
}

/// Every [`Segment`] mapped in this process, so that a write can tell whether its
/// source lies in another mapping of the same object (a second handle of one name
/// maps it at another address).
static MAPPINGS: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());

fn mappings() -> std::sync::MutexGuard<'static, Vec<Mapping>> {
    MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// [`MAPPINGS`] held across a `fork` by the forking thread.
    static FORK_GUARD: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Vec<Mapping>>>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: holds [`MAPPINGS`] across the fork, so that no
/// other thread holds it at that moment (it would stay locked for ever in the child).
/// It runs inside `fork` itself, after every Python-level hook.
extern "C" fn hold_mappings_for_fork() {
    let guard = mappings();
    FORK_GUARD.with(|held| *held.borrow_mut() = Some(guard));
}

/// `pthread_atfork` parent and child handler: lets [`MAPPINGS`] go.
extern "C" fn release_mappings_after_fork() {
    FORK_GUARD.with(|held| drop(held.borrow_mut().take()));
}

/// Installs the `pthread_atfork` handlers once, at the first mapping.
fn install_fork_handlers() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    hold_across_fork(
        &INSTALLED,
        hold_mappings_for_fork,
        release_mappings_after_fork,
        release_mappings_after_fork,
    );
}

/// Registers, once per `once`, `hold` as a `pthread_atfork` prepare handler and
/// `in_parent`/`in_child` as its parent and child handlers: for process-local locks
/// a forked child needs, which `hold` takes (keeping the guards in a thread-local)
/// and the others let go. None may unwind (they are called from C); they should only
/// lock, update what the locks guard and unlock, recovering poisoned locks.
pub fn hold_across_fork(
    once: &'static std::sync::Once,
    hold: extern "C" fn(),
    in_parent: extern "C" fn(),
    in_child: extern "C" fn(),
) {
    once.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions that live for the whole
        // program and, by this function's contract, never unwind; registering them
        // has no other precondition.
        unsafe {
            libc::pthread_atfork(Some(hold), Some(in_parent), Some(in_child));
        }
    });
}

/// `(st_dev, st_ino)` of `fd`: which object it is.
fn object_of(fd: &OwnedFd) -> Result<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fd` is an open descriptor and `st` room for one `stat`.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: `fstat` succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok((st.st_dev, st.st_ino))
}

/// A mapped shared-memory object.
///
/// The mapping is `MAP_SHARED`: every process that maps the same object sees the same
/// bytes, and writes made through [`Segment::write_at`] or [`Segment::as_mut_ptr`] are
/// visible to all of them. Readers of memory another process writes must agree with
/// it on a protocol (a lock, a published flag); the segment itself only guarantees
/// that the memory stays mapped while this value (or a [`Bytes`] over it) lives.
pub struct Segment {
    base: *mut u8,
    len: usize,
    fd: OwnedFd,
    name: Option<String>,
    access: Access,
    /// `(st_dev, st_ino)` of the object.
    object: (u64, u64),
}

// SAFETY: the mapping is owned by this value and unmapped only in `Drop`; the raw
// pointer is never reassigned. Access to the shared bytes is as thread-safe as access
// to any shared mapping: reads through `&[u8]` and writes through the explicit
// pointer APIs, whose callers coordinate as documented.
unsafe impl Send for Segment {}
// SAFETY: see `Send`.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates the named segment `name` (no leading `/`) of `size` bytes, mapped
    /// read-write; a segment this call makes is zero-filled.
    ///
    /// Its pages are allocated now (`posix_fallocate`), so a full `/dev/shm` (64 MiB
    /// in a default Docker container) is [`Error::NoSpace`] here rather than a
    /// `SIGBUS` at the first write past the limit. When anything after the object was
    /// made fails, the name is removed again. With `exclusive: false`, a name another
    /// process made is opened instead (once its creator has sized it), and must have
    /// exactly `size` bytes; an object this call did not make is never resized or
    /// removed.
    pub fn create(name: &str, size: usize, options: &CreateOptions) -> Result<Segment> {
        check_size(size)?;
        let path = posix_path(name)?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        match shm_open(&path, flags, options.mode) {
            Ok(fd) => {
                let made = set_size(&fd, size)
                    .and_then(|()| {
                        if options.allocate {
                            allocate(&fd, size)
                        } else {
                            check_free_space(size)
                        }
                    })
                    .map_err(|e| allocation_error(e, name, size))
                    .and_then(|()| {
                        Segment::map(fd, size, Access::ReadWrite, Some(name.to_owned()))
                            .map_err(|e| e.with_path(format!("/dev/shm/{name}")))
                    });
                if made.is_err() {
                    // Do not leave a half-made object behind under the name.
                    let _ = Segment::unlink(name);
                }
                made
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !options.exclusive => {
                let segment = Segment::open_sized(name, Access::ReadWrite, SIZING_WAIT)?;
                if segment.len() != size {
                    return Err(Error::invalid(format!(
                        "shared-memory segment {name:?} exists with {} bytes, not {size}",
                        segment.len()
                    )));
                }
                Ok(segment)
            }
            Err(e) => Err(named(e, name)),
        }
    }

    /// Opens the existing named segment `name` and maps all of it.
    pub fn open(name: &str, access: Access) -> Result<Segment> {
        Segment::open_sized(name, access, std::time::Duration::ZERO)
    }

    /// [`Segment::open`], waiting up to `wait` for a creator that has made the object
    /// but not yet sized it (between its `shm_open` and its `ftruncate`).
    pub fn open_sized(name: &str, access: Access, wait: std::time::Duration) -> Result<Segment> {
        let path = posix_path(name)?;
        let flags = match access {
            Access::ReadOnly => libc::O_RDONLY,
            Access::ReadWrite => libc::O_RDWR,
        } | libc::O_CLOEXEC;
        let fd = shm_open(&path, flags, 0).map_err(|e| named(e, name))?;
        let started = std::time::Instant::now();
        let size = loop {
            let size = file_size(&fd)?;
            if size != 0 || started.elapsed() >= wait {
                break size;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        if size == 0 {
            return Err(Error::invalid(format!(
                "shared-memory segment {name:?} is empty (its creator has not sized it)"
            )));
        }
        let size = usize::try_from(size).map_err(|_| Error::Overflow {
            what: "segment size as usize",
        })?;
        Segment::map(fd, size, access, Some(name.to_owned()))
    }

    /// Removes the name `name`. Processes that have it mapped keep their maps; the
    /// memory is freed when the last one is gone.
    pub fn unlink(name: &str) -> Result<()> {
        let path = posix_path(name)?;
        // SAFETY: `path` is a valid NUL-terminated string.
        if unsafe { libc::shm_unlink(path.as_ptr()) } != 0 {
            return Err(named(io::Error::last_os_error(), name));
        }
        Ok(())
    }

    /// An anonymous segment of `size` bytes (`memfd_create`), zero-filled, mapped
    /// read-write. Its size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`), so a process
    /// that receives its descriptor can map it without fearing that the sender
    /// truncates it under the map. `label` shows in `/proc/<pid>/fd` only.
    #[cfg(target_os = "linux")]
    pub fn memfd(label: &str, size: usize) -> Result<Segment> {
        check_size(size)?;
        let label = CString::new(label.replace('\0', "_"))
            .map_err(|_| Error::invalid("memfd label contains a NUL byte"))?;
        // SAFETY: `label` is NUL-terminated; the flags are valid for memfd_create.
        let raw = unsafe {
            libc::memfd_create(label.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_size(&fd, size)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on a descriptor we own, with valid seal bits.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        Segment::map(fd, size, Access::ReadWrite, None)
    }

    /// Maps a segment received as a descriptor (for example over a Unix socket).
    /// Refuses a memfd whose size is not sealed, unless `require_sealed` is false:
    /// its sender could shrink it and make our reads fault.
    #[cfg(target_os = "linux")]
    pub fn from_fd(fd: OwnedFd, access: Access, require_sealed: bool) -> Result<Segment> {
        let size = file_size(&fd)?;
        if size == 0 {
            return Err(Error::invalid("shared-memory descriptor has size 0"));
        }
        if require_sealed && !size_sealed(&fd) {
            return Err(Error::invalid(
                "shared-memory descriptor is not sealed against shrinking",
            ));
        }
        let size = usize::try_from(size).map_err(|_| Error::Overflow {
            what: "segment size as usize",
        })?;
        Segment::map(fd, size, access, None)
    }

    fn map(fd: OwnedFd, len: usize, access: Access, name: Option<String>) -> Result<Segment> {
        install_fork_handlers();
        let object = object_of(&fd)?;
        let prot = match access {
            Access::ReadOnly => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: a fresh shared mapping of `len` bytes of an object at least that
        // large (checked or sized by the caller); the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        mappings().push(Mapping {
            object,
            base: base as usize,
            len,
        });
        Ok(Segment {
            base: base.cast(),
            len,
            fd,
            name,
            access,
            object,
        })
    }

    /// True when `bytes` lies, even in part, in memory of this segment's object: in
    /// this mapping or in another mapping of the same object in this process (a
    /// second handle of the same name). A write into the segment must copy such a
    /// source out first; another process's mappings cannot be a source here.
    pub fn shares_memory_with(&self, bytes: &[u8]) -> bool {
        if bytes.is_empty() {
            return false;
        }
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        mappings()
            .iter()
            .any(|m| m.object == self.object && start < m.base + m.len && m.base < end)
    }

    /// Which object this is, `(st_dev, st_ino)`: the same for every mapping of one
    /// segment in this process (two handles of one name), different for others.
    pub fn object_id(&self) -> (u64, u64) {
        self.object
    }

    /// The name the segment was created or opened by (`None` for a memfd).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty segments are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How the segment is mapped.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The descriptor, for passing the segment to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// True when the segment's size is sealed against shrinking (memfd).
    pub fn is_size_sealed(&self) -> bool {
        size_sealed(&self.fd)
    }

    /// The first byte of the map. Every byte up to `len()` is mapped while `self` lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.base
    }

    /// The first byte of the map, for writing; `None` for a read-only map. Writes are
    /// visible to every process mapping the segment, so callers coordinate them.
    pub fn as_mut_ptr(&self) -> Option<*mut u8> {
        (self.access == Access::ReadWrite).then_some(self.base)
    }

    /// The mapped bytes. Another process may change them at any time unless the
    /// protocol in use forbids it; another process can also shrink a named segment
    /// (`ftruncate`), after which touching the lost pages raises `SIGBUS` (sealed
    /// memfds cannot be shrunk).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `base..base+len` is mapped readable for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    /// Copies `data` into the segment at `offset` (`data` may itself lie in the
    /// segment: the copy handles overlap).
    ///
    /// # Safety
    /// No reference into `offset..offset + data.len()` of this map, from
    /// [`Segment::as_slice`] or a [`Bytes`] over the segment, may be in use in this
    /// process while the write runs (the compiler assumes the bytes behind a `&[u8]`
    /// do not change, and may reuse what it read before). Views other processes
    /// hold, and raw pointers (numpy arrays), are the protocol's business.
    // SAFETY: an `unsafe fn` because whether a `&[u8]` into the range is live is
    // something only the caller knows (see `# Safety`).
    pub unsafe fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let base = self
            .as_mut_ptr()
            .ok_or_else(|| Error::invalid("segment is mapped read-only"))?;
        self.check_range(offset, data.len())?;
        // SAFETY: the range is inside the writable map (checked); `ptr::copy` allows
        // `data` to overlap it; no reference into the range is in use (caller contract).
        unsafe { std::ptr::copy(data.as_ptr(), base.add(offset), data.len()) };
        Ok(())
    }

    /// Asks the kernel to allocate every page of a read-write map now, in one call
    /// (`MADV_POPULATE_WRITE`, Linux 5.14+), instead of one fault per page while it is
    /// first written; also hints transparent huge pages where shared memory allows
    /// them. Worth it right before filling a fresh segment. Returns false when the
    /// kernel declined (older kernels, read-only maps); nothing else changes then.
    pub fn prefault(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            if self.access != Access::ReadWrite || self.len == 0 {
                return false;
            }
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            // SAFETY: `base..base+len` is exactly this segment's map; both advice
            // values only change how its pages are allocated, never their contents
            // (the segment's pages are zero or already written either way).
            unsafe {
                libc::madvise(self.base.cast(), self.len, libc::MADV_HUGEPAGE);
                libc::madvise(self.base.cast(), self.len, MADV_POPULATE_WRITE) == 0
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// Checks that `offset..offset+len` lies inside the segment.
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                tensor: self.name.clone().unwrap_or_else(|| "memfd".into()),
                offset: offset as u64,
                length: len as u64,
                limit: self.len as u64,
            }),
        }
    }

    /// Shares the segment as [`Bytes`] over all of it.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_arc(Arc::new(self))
    }
}

impl Owner for Segment {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let base = self.base as usize;
        mappings().retain(|m| m.base != base);
        // SAFETY: `base`/`len` are exactly the mapping made in `map`, unmapped once
        // here; no `Bytes` over it remains (they hold an `Arc` to this value).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

fn check_size(size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid(
            "a shared-memory segment needs at least 1 byte",
        ));
    }
    if size > isize::MAX as usize {
        return Err(Error::invalid(format!("segment size {size} is too large")));
    }
    Ok(())
}

fn shm_open(path: &CString, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; shm_open returns a new descriptor or -1.
    let raw = unsafe { libc::shm_open(path.as_ptr(), flags, mode as libc::mode_t) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: shm_open returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn file_size(fd: &OwnedFd) -> Result<u64> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(st.st_size.max(0) as u64)
}

/// How long a non-exclusive create waits for another creator to size its new object.
const SIZING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Allocates the pages of a new object that is already sized (sized first, so that a
/// process opening it meanwhile sees its size at once); where the file system cannot
/// allocate ahead, nothing more is done. A signal interrupting a long allocation
/// restarts it a bounded number of times.
#[cfg(target_os = "linux")]
fn allocate(fd: &OwnedFd, size: usize) -> io::Result<()> {
    const TRIES: usize = 16;
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
    for _ in 0..TRIES {
        // SAFETY: `fd` is an open, writable descriptor; the call only allocates pages
        // of the object it names.
        match unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len) } {
            0 => return Ok(()),
            libc::EINTR => continue,
            libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL => return check_free_space(size),
            code => return Err(io::Error::from_raw_os_error(code)),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EINTR))
}

#[cfg(not(target_os = "linux"))]
fn allocate(_fd: &OwnedFd, size: usize) -> io::Result<()> {
    check_free_space(size)
}

/// `ENOSPC` when `/dev/shm` has less than `size` bytes free now (where it can be asked).
fn check_free_space(size: usize) -> io::Result<()> {
    match shm_space_left() {
        Some(free) if free < size as u64 => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        _ => Ok(()),
    }
}

/// `NoSpace` for a full shared-memory file system, else the I/O error, naming `name`.
fn allocation_error(err: io::Error, name: &str, size: usize) -> Error {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        return Error::NoSpace {
            what: format!("shared-memory segment {name:?} (/dev/shm is full)"),
            needed: size as u64,
            available: shm_space_left().unwrap_or(0),
        };
    }
    named(err, name)
}

/// `/dev/shm`'s (free, total) bytes, when it can be asked.
fn shm_space() -> Option<(u64, u64)> {
    let path = CString::new("/dev/shm").ok()?;
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The fields are narrower than u64 on some platforms: widen them all.
    #[allow(clippy::unnecessary_cast)]
    let (unit, free, total) = (st.f_frsize as u64, st.f_bavail as u64, st.f_blocks as u64);
    Some((free.saturating_mul(unit), total.saturating_mul(unit)))
}

/// Bytes free on `/dev/shm`, when it can be asked.
fn shm_space_left() -> Option<u64> {
    shm_space().map(|(free, _)| free)
}

fn set_size(fd: &OwnedFd, size: usize) -> io::Result<()> {
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
    // SAFETY: `fd` is an open, writable descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn size_sealed(fd: &OwnedFd) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: F_GET_SEALS only reads the descriptor's seal set.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        false
    }
}

/// An I/O error that names the segment.
fn named(err: io::Error, name: &str) -> Error {
    Error::from(err).with_path(format!("/dev/shm/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `write_at` for tests, which never hold a reference into the range they write.
    fn write(seg: &Segment, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: callers in this module use `as_slice` only between writes.
        unsafe { seg.write_at(offset, data) }
    }

    fn unique(tag: &str) -> String {
        format!(
            "tw_test_{tag}_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }

    #[test]
    fn create_write_open_read_unlink() {
        let name = unique("seg");
        let seg = Segment::create(&name, 10_000, &CreateOptions::default()).unwrap();
        assert_eq!(seg.len(), 10_000);
        assert!(seg.as_slice().iter().all(|&b| b == 0));
        write(&seg, 9_990, b"0123456789").unwrap();
        assert!(write(&seg, 9_991, b"0123456789").is_err());

        let other = Segment::open(&name, Access::ReadOnly).unwrap();
        assert_eq!(&other.as_slice()[9_990..], b"0123456789");
        assert!(write(&other, 0, b"x").is_err());
        assert!(other.as_mut_ptr().is_none());

        // A second exclusive create fails; a non-exclusive one needs the same size.
        let again = Segment::create(&name, 10_000, &CreateOptions::default()).unwrap_err();
        assert!(again.to_string().contains(&name), "{again}");
        let shared = CreateOptions {
            exclusive: false,
            ..CreateOptions::default()
        };
        assert!(Segment::create(&name, 10_000, &shared).is_ok());
        assert!(Segment::create(&name, 20_000, &shared).is_err());

        Segment::unlink(&name).unwrap();
        // The maps outlive the name.
        assert_eq!(&other.as_slice()[9_990..9_992], b"01");
        let gone = Segment::open(&name, Access::ReadOnly).unwrap_err();
        assert!(matches!(gone.root(), Error::Io(e) if e.kind() == io::ErrorKind::NotFound));
    }

    #[test]
    fn memory_of_the_same_object_is_known_through_every_mapping() {
        let name = unique("alias");
        let seg = Segment::create(&name, 8192, &CreateOptions::default()).unwrap();
        let second = Segment::open(&name, Access::ReadWrite).unwrap();
        let other = unique("other");
        let elsewhere = Segment::create(&other, 8192, &CreateOptions::default()).unwrap();
        Segment::unlink(&name).unwrap();
        Segment::unlink(&other).unwrap();
        // Another mapping of the same object, at another address, is its memory too.
        assert_ne!(seg.as_ptr(), second.as_ptr());
        assert!(seg.shares_memory_with(&second.as_slice()[100..200]));
        assert!(second.shares_memory_with(&seg.as_slice()[8191..]));
        assert!(seg.shares_memory_with(&seg.as_slice()[..1]));
        // Another object's memory, ordinary memory and nothing at all are not.
        assert!(!seg.shares_memory_with(elsewhere.as_slice()));
        assert!(!seg.shares_memory_with(&[1u8, 2, 3]));
        assert!(!seg.shares_memory_with(&second.as_slice()[..0]));
        // A memfd is its own object.
        let memfd = Segment::memfd("alias", 4096).unwrap();
        assert!(!seg.shares_memory_with(memfd.as_slice()));
        assert!(memfd.shares_memory_with(memfd.as_slice()));
        // Gone once unmapped: the object is known through its first mapping only (by
        // object, not address: a test beside this one may map the freed range again).
        let count = || mappings().iter().filter(|m| m.object == seg.object).count();
        assert_eq!(count(), 2);
        drop(second);
        assert_eq!(count(), 1);
    }

    #[test]
    fn new_segments_are_private_to_the_user() {
        use std::os::unix::fs::PermissionsExt;
        let name = unique("mode");
        let _seg = Segment::create(&name, 64, &CreateOptions::default()).unwrap();
        let mode =
            std::fs::metadata(format!("/dev/shm/{name}")).map(|m| m.permissions().mode() & 0o777);
        Segment::unlink(&name).unwrap();
        if let Ok(mode) = mode {
            assert_eq!(mode, 0o600);
        }
    }

    #[test]
    fn bad_sizes_and_names_are_refused() {
        assert!(Segment::create("x", 0, &CreateOptions::default()).is_err());
        assert!(Segment::create("a/b", 8, &CreateOptions::default()).is_err());
        assert!(Segment::open("", Access::ReadOnly).is_err());
    }

    #[test]
    fn bytes_keep_the_map_alive() {
        let seg = Segment::memfd("bytes", 4096).unwrap();
        write(&seg, 0, b"abc").unwrap();
        let bytes = seg.into_bytes();
        let tail = bytes.slice(1..3).unwrap();
        drop(bytes);
        assert_eq!(&*tail, b"bc");
    }

    #[test]
    fn memfd_travels_as_a_sealed_descriptor() {
        let seg = Segment::memfd("tw-test", 8192).unwrap();
        assert!(seg.is_size_sealed());
        write(&seg, 100, b"shared").unwrap();
        let dup = seg.fd().try_clone_to_owned().unwrap();
        let other = Segment::from_fd(dup, Access::ReadOnly, true).unwrap();
        assert_eq!(&other.as_slice()[100..106], b"shared");
        write(&seg, 100, b"SHARED").unwrap();
        assert_eq!(&other.as_slice()[100..106], b"SHARED");

        // An ordinary file descriptor is not sealed.
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let err = Segment::from_fd(file.into(), Access::ReadOnly, true).unwrap_err();
        assert!(err.to_string().contains("sealed"), "{err}");
    }

    /// Total bytes of `/dev/shm`, when it has a limit.
    fn shm_capacity() -> Option<u64> {
        shm_space()
            .map(|(_, total)| total)
            .filter(|&total| total > 0)
    }

    #[test]
    fn a_segment_larger_than_dev_shm_is_no_space_and_leaves_no_name() {
        // Larger than the whole file system: refused before any page is allocated.
        let Some(capacity) = shm_capacity() else {
            eprintln!("skipped: /dev/shm has no size limit");
            return;
        };
        let Ok(size) = usize::try_from(capacity + (1 << 30)) else {
            return;
        };
        let name = unique("full");
        let err = Segment::create(&name, size, &CreateOptions::default()).unwrap_err();
        assert!(matches!(err, Error::NoSpace { .. }), "{err}");
        assert!(err.to_string().contains(&name), "{err}");
        let gone = Segment::open(&name, Access::ReadOnly).unwrap_err();
        assert!(
            matches!(gone.root(), Error::Io(e) if e.kind() == io::ErrorKind::NotFound),
            "{gone}"
        );
        // The name is free for a create that fits.
        Segment::create(&name, 4096, &CreateOptions::default()).unwrap();
        Segment::unlink(&name).unwrap();
    }

    #[test]
    fn racing_shared_creates_agree_on_one_size() {
        let shared = CreateOptions {
            exclusive: false,
            ..CreateOptions::default()
        };
        for round in 0..100 {
            let name = unique(&format!("race{round}"));
            let barrier = std::sync::Barrier::new(2);
            let results: Vec<Result<usize>> = std::thread::scope(|scope| {
                let handles: Vec<_> = [1usize << 20, 8192]
                    .into_iter()
                    .map(|size| {
                        let (name, barrier, shared) = (&name, &barrier, &shared);
                        scope.spawn(move || {
                            barrier.wait();
                            Segment::create(name, size, shared).map(|s| s.len())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let made: Vec<usize> = results
                .iter()
                .filter_map(|r| r.as_ref().ok().copied())
                .collect();
            assert_eq!(made.len(), 1, "round {round}: {results:?}");
            let refused = results.iter().find_map(|r| r.as_ref().err()).unwrap();
            assert!(refused.to_string().contains("exists with"), "{refused}");
            let real = Segment::open(&name, Access::ReadOnly).unwrap();
            assert_eq!(real.len(), made[0]);
            Segment::unlink(&name).unwrap();
        }
    }

    #[test]
    fn prefault_keeps_contents_and_is_refused_for_read_only_maps() {
        let seg = Segment::memfd("tw-test", 1 << 20).unwrap();
        write(&seg, 5, b"kept").unwrap();
        // The kernel may decline (before Linux 5.14); the map is unchanged either way.
        let _ = seg.prefault();
        assert_eq!(&seg.as_slice()[5..9], b"kept");
        assert!(seg.as_slice()[9..].iter().all(|&b| b == 0));
        let dup = seg.fd().try_clone_to_owned().unwrap();
        let reader = Segment::from_fd(dup, Access::ReadOnly, true).unwrap();
        assert!(!reader.prefault());
    }
}
