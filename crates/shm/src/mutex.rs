//! A process-shared, robust, error-checking pthread mutex that lives in a segment.

use std::io;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tensorwire_core::{Error, Result};

use crate::segment::Segment;

/// Bytes a [`RobustMutex`] takes in a segment (`sizeof(pthread_mutex_t)`); place it at
/// an offset that is a multiple of 8.
pub const MUTEX_SIZE: usize = std::mem::size_of::<libc::pthread_mutex_t>();

/// A `pthread_mutex_t` in shared memory, `PTHREAD_PROCESS_SHARED`,
/// `PTHREAD_MUTEX_ROBUST` and `PTHREAD_MUTEX_ERRORCHECK`:
///
/// - every process that maps the segment locks the same mutex;
/// - when a holder dies (process killed, thread exited) the next [`lock`](Self::lock)
///   succeeds with [`LockGuard::owner_died`] set; the caller repairs what the mutex
///   protects and calls [`LockGuard::mark_consistent`]. Unlocking without doing so
///   makes the mutex unusable for everyone (POSIX), reported as an error thereafter;
/// - locking it twice from one thread is an error, not a deadlock;
/// - `lock` takes a timeout, so a live holder that never lets go cannot hang us.
pub struct RobustMutex {
    segment: Arc<Segment>,
    ptr: *mut libc::pthread_mutex_t,
}

// SAFETY: the pointer targets shared memory kept mapped by `segment`; a process-shared
// pthread mutex is designed to be used concurrently from any thread of any process.
unsafe impl Send for RobustMutex {}
// SAFETY: see `Send`; all operations go through the pthread API, which synchronizes.
unsafe impl Sync for RobustMutex {}

impl RobustMutex {
    /// Initializes a new mutex at `offset` in `segment`.
    ///
    /// # Safety
    /// No thread in any process may be using a mutex at that place (initializing a
    /// mutex in use is undefined behaviour): call it once, from the segment's creator,
    /// before the segment is shared.
    // SAFETY: an `unsafe fn` because pthread_mutex_init on a mutex another thread may
    // hold is undefined behaviour, which no check here can rule out; the caller
    // promises the memory is not in use (see `# Safety`).
    pub unsafe fn initialize(segment: Arc<Segment>, offset: usize) -> Result<RobustMutex> {
        let ptr = mutex_ptr(&segment, offset)?;
        // SAFETY: an all-zero attribute object is overwritten by init below.
        let mut attr: libc::pthread_mutexattr_t = unsafe { std::mem::zeroed() };
        // SAFETY: `attr` is a valid attribute object for the init/set/destroy calls,
        // and `ptr` points to MUTEX_SIZE writable bytes no one uses (caller contract).
        unsafe {
            check(libc::pthread_mutexattr_init(&mut attr))?;
            let result = (|| {
                check(libc::pthread_mutexattr_setpshared(
                    &mut attr,
                    libc::PTHREAD_PROCESS_SHARED,
                ))?;
                check(libc::pthread_mutexattr_setrobust(
                    &mut attr,
                    libc::PTHREAD_MUTEX_ROBUST,
                ))?;
                check(libc::pthread_mutexattr_settype(
                    &mut attr,
                    libc::PTHREAD_MUTEX_ERRORCHECK,
                ))?;
                check(libc::pthread_mutex_init(ptr, &attr))
            })();
            libc::pthread_mutexattr_destroy(&mut attr);
            result?;
        }
        Ok(RobustMutex { segment, ptr })
    }

    /// Uses the mutex another process initialized at `offset` in `segment`.
    ///
    /// # Safety
    /// The bytes at `offset` must hold a mutex made by [`RobustMutex::initialize`].
    // SAFETY: an `unsafe fn` because locking bytes that are not an initialized
    // pthread mutex is undefined behaviour; the caller promises `initialize` ran on
    // them (a cache checks its header, written after the mutex, first).
    pub unsafe fn attach(segment: Arc<Segment>, offset: usize) -> Result<RobustMutex> {
        let ptr = mutex_ptr(&segment, offset)?;
        Ok(RobustMutex { segment, ptr })
    }

    /// Locks, waiting at most `timeout` (forever when `None`). Errors:
    /// [`Error::Timeout`] when the wait runs out, an `Io` error for `EDEADLK` (this
    /// thread holds it already), [`Error::LockUnrecoverable`] when a holder died and
    /// nobody repaired the state (`ENOTRECOVERABLE`). The timeout runs on the
    /// monotonic clock where the C library offers `pthread_mutex_clocklock` (glibc
    /// 2.30 and later), so setting the system clock neither cuts a wait short nor
    /// stretches it; elsewhere on the wall clock.
    pub fn lock(&self, timeout: Option<Duration>) -> Result<LockGuard<'_>> {
        let rc = match timeout {
            // SAFETY: `ptr` is an initialized mutex kept mapped by `segment`.
            None => unsafe { libc::pthread_mutex_lock(self.ptr) },
            Some(t) => match monotonic_clock_lock() {
                Some(clock_lock) => {
                    let deadline = deadline_on(libc::CLOCK_MONOTONIC, t);
                    // SAFETY: as above; `deadline` is a valid timespec on the clock
                    // passed with it.
                    unsafe { clock_lock(self.ptr, libc::CLOCK_MONOTONIC, &deadline) }
                }
                None => {
                    let deadline = deadline_on(libc::CLOCK_REALTIME, t);
                    // SAFETY: as above; `deadline` is a valid CLOCK_REALTIME timespec.
                    unsafe { libc::pthread_mutex_timedlock(self.ptr, &deadline) }
                }
            },
        };
        self.guard(rc, timeout)
            .and_then(|g| g.ok_or_else(unreachable_busy))
    }

    /// Locks if no one holds the mutex; `Ok(None)` when someone does.
    pub fn try_lock(&self) -> Result<Option<LockGuard<'_>>> {
        // SAFETY: `ptr` is an initialized mutex kept mapped by `segment`.
        let rc = unsafe { libc::pthread_mutex_trylock(self.ptr) };
        self.guard(rc, None)
    }

    fn guard(&self, rc: libc::c_int, timeout: Option<Duration>) -> Result<Option<LockGuard<'_>>> {
        let owner_died = match rc {
            0 => false,
            libc::EOWNERDEAD => true,
            libc::EBUSY => return Ok(None),
            libc::ETIMEDOUT => {
                return Err(Error::Timeout {
                    what: "the shared-memory lock",
                    waited_ms: timeout.map_or(0, |t| t.as_millis() as u64),
                })
            }
            libc::ENOTRECOVERABLE => {
                return Err(Error::LockUnrecoverable {
                    what: "the shared-memory lock",
                })
            }
            other => return Err(io::Error::from_raw_os_error(other).into()),
        };
        Ok(Some(LockGuard {
            mutex: self,
            _mapped: Arc::clone(&self.segment),
            owner_died,
            _not_send: PhantomData,
        }))
    }

    /// The segment the mutex lives in.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }
}

/// Proof that this thread holds a [`RobustMutex`]; unlocks on drop. Not `Send`: a
/// pthread mutex must be unlocked by the thread that locked it.
#[must_use = "the mutex unlocks when the guard is dropped"]
pub struct LockGuard<'a> {
    mutex: &'a RobustMutex,
    /// Keeps the map alive even if the guard is leaked (`mem::forget`): the held
    /// mutex sits on the thread's robust list, which the C library writes through
    /// later, so its memory must never be unmapped while it is held.
    _mapped: Arc<Segment>,
    owner_died: bool,
    _not_send: PhantomData<*const ()>,
}

impl LockGuard<'_> {
    /// True when the previous holder died holding the mutex: what it protects may be
    /// half-changed. Repair it, then call [`LockGuard::mark_consistent`].
    pub fn owner_died(&self) -> bool {
        self.owner_died
    }

    /// Declares the protected state repaired, so the mutex stays usable after this
    /// guard unlocks it.
    pub fn mark_consistent(&mut self) -> Result<()> {
        if self.owner_died {
            // SAFETY: this thread holds the mutex in the owner-died state, the one
            // state in which pthread_mutex_consistent is defined.
            check(unsafe { libc::pthread_mutex_consistent(self.mutex.ptr) })?;
            self.owner_died = false;
        }
        Ok(())
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: this thread holds the mutex (the guard exists only after a
        // successful lock and is not Send).
        unsafe { libc::pthread_mutex_unlock(self.mutex.ptr) };
    }
}

fn mutex_ptr(segment: &Segment, offset: usize) -> Result<*mut libc::pthread_mutex_t> {
    segment.check_range(offset, MUTEX_SIZE)?;
    if offset % 8 != 0 {
        return Err(Error::invalid(format!(
            "a mutex offset must be a multiple of 8, got {offset}"
        )));
    }
    let base = segment
        .as_mut_ptr()
        .ok_or_else(|| Error::invalid("a mutex needs a read-write segment"))?;
    // SAFETY: `offset + MUTEX_SIZE <= len` (checked), so the pointer stays in the map.
    Ok(unsafe { base.add(offset) }.cast())
}

fn check(rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc).into())
    }
}

fn unreachable_busy() -> Error {
    Error::Io(io::Error::from_raw_os_error(libc::EBUSY))
}

/// `pthread_mutex_clocklock`'s type.
type ClockLock = unsafe extern "C" fn(
    *mut libc::pthread_mutex_t,
    libc::clockid_t,
    *const libc::timespec,
) -> libc::c_int;

/// `pthread_mutex_clocklock`, looked up at run time: it is in glibc from 2.30 only,
/// and linking it directly would keep the Python wheel (built for older glibc) from
/// loading there. `None` where the C library lacks it.
fn monotonic_clock_lock() -> Option<ClockLock> {
    // On 32-bit targets the unversioned symbol takes a 32-bit `time_t` timespec,
    // which need not be the libc crate's: keep to the wall-clock call there.
    if cfg!(not(target_pointer_width = "64")) {
        return None;
    }
    static CLOCK_LOCK: OnceLock<Option<ClockLock>> = OnceLock::new();
    *CLOCK_LOCK.get_or_init(|| {
        // SAFETY: `RTLD_DEFAULT` and a NUL-terminated name: dlsym only looks the
        // symbol up in the loaded libraries.
        let symbol =
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"pthread_mutex_clocklock".as_ptr()) };
        if symbol.is_null() {
            return None;
        }
        // SAFETY: the C library's `pthread_mutex_clocklock` is declared
        // `int (pthread_mutex_t *, clockid_t, const struct timespec *)`, which is
        // `ClockLock` on the 64-bit targets this runs on (their `timespec` is the
        // libc crate's); a non-null dlsym result is the function's address.
        Some(unsafe { std::mem::transmute::<*mut libc::c_void, ClockLock>(symbol) })
    })
}

/// `clock`'s now plus `timeout`, as an absolute deadline for a timed lock.
fn deadline_on(clock: libc::clockid_t, timeout: Duration) -> libc::timespec {
    // SAFETY: an all-zero timespec is valid and is overwritten by clock_gettime.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and out-pointer.
    unsafe { libc::clock_gettime(clock, &mut now) };
    let total_ns = now.tv_nsec as u64 + u64::from(timeout.subsec_nanos());
    let secs = (now.tv_sec as u64)
        .saturating_add(timeout.as_secs())
        .saturating_add(total_ns / 1_000_000_000);
    libc::timespec {
        tv_sec: secs.min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: (total_ns % 1_000_000_000) as _,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn new_mutex() -> RobustMutex {
        let seg = Arc::new(Segment::memfd("mutex", 4096).unwrap());
        // SAFETY: a fresh segment nobody else uses.
        unsafe { RobustMutex::initialize(seg, 64).unwrap() }
    }

    #[test]
    fn lock_unlock_and_relock_is_an_error_not_a_deadlock() {
        let m = new_mutex();
        let g = m.lock(None).unwrap();
        assert!(!g.owner_died());
        assert!(m.lock(Some(Duration::from_millis(10))).is_err());
        drop(g);
        drop(m.lock(Some(Duration::from_millis(10))).unwrap());
    }

    #[test]
    fn waiting_on_a_live_holder_times_out() {
        let m = Arc::new(new_mutex());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let _g = m.lock(None).unwrap();
                tx.send(()).unwrap();
                done_rx.recv().unwrap();
            })
        };
        rx.recv().unwrap();
        assert!(m.try_lock().unwrap().is_none());
        let start = Instant::now();
        let err = m.lock(Some(Duration::from_millis(50))).err().unwrap();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(45));
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(m.try_lock().unwrap().is_some());
    }

    #[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
    #[test]
    fn glibc_from_2_30_waits_on_the_monotonic_clock() {
        // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
        let mut parts = version.to_str().unwrap().split('.');
        let major: u32 = parts.next().unwrap().parse().unwrap();
        let minor: u32 = parts.next().unwrap().parse().unwrap();
        assert_eq!(monotonic_clock_lock().is_some(), (major, minor) >= (2, 30));
    }

    /// A mutex whose holder, a thread, exited holding it.
    fn abandoned_mutex() -> Arc<RobustMutex> {
        let m = Arc::new(new_mutex());
        let held = Arc::clone(&m);
        std::thread::spawn(move || std::mem::forget(held.lock(None).unwrap()))
            .join()
            .unwrap();
        m
    }

    #[test]
    fn a_dead_holder_is_reported_and_recovered() {
        let m = abandoned_mutex();
        let mut g = m.lock(Some(Duration::from_secs(5))).unwrap();
        assert!(g.owner_died());
        g.mark_consistent().unwrap();
        drop(g);
        assert!(!m.lock(None).unwrap().owner_died());
    }

    #[test]
    fn unrepaired_state_makes_the_mutex_unrecoverable() {
        let m = abandoned_mutex();
        drop(m.lock(None).unwrap()); // owner died, not marked consistent
        let err = m.lock(None).err().unwrap();
        assert!(matches!(err, Error::LockUnrecoverable { .. }), "{err}");
        let err = m.lock(Some(Duration::from_millis(10))).err().unwrap();
        assert!(matches!(err, Error::LockUnrecoverable { .. }), "{err}");
        assert!(matches!(m.try_lock(), Err(Error::LockUnrecoverable { .. })));
    }

    #[test]
    fn a_process_killed_holding_the_lock_is_detected() {
        let m = new_mutex();
        // SAFETY: the child only locks the (process-shared) mutex and exits with
        // `_exit`, both async-signal-safe enough for a forked child.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: the mutex is mapped in the child too (inherited shared map).
            unsafe {
                libc::pthread_mutex_lock(m.ptr);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let mut g = m.lock(Some(Duration::from_secs(5))).unwrap();
        assert!(g.owner_died());
        g.mark_consistent().unwrap();
    }
}
