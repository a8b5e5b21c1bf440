//! Small helpers the crate's modules share.

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// Seconds since the Unix epoch (0.0 if the clock is before it).
pub(crate) fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// This process's effective user id.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Locks `mutex`; a panic in another holder does not poison the data for us (every
/// critical section leaves its state consistent before anything can panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The highest soft descriptor limit [`raise_descriptor_limit`] asks for, even when the
/// hard limit is higher (or unlimited): enough for any sane number of shared values,
/// without handing code that loops over every possible descriptor a billion of them.
const DESCRIPTOR_LIMIT_CAP: u64 = 1 << 20;

/// Raises this process's soft `RLIMIT_NOFILE` toward its hard limit (at most
/// [`DESCRIPTOR_LIMIT_CAP`]), the first time it is called in the process; later calls
/// do nothing. It never lowers the limit, and a failure leaves it as it was.
///
/// Sharing holds descriptors: every CPU value a client keeps open and every cached or
/// retained result of a server is one memfd, and each connection is two on the server.
/// The defaults (1024 cache entries, 1024 retained tasks, 256 connections) need more
/// than the common soft limit of 1024, while the hard limit is usually far higher.
/// Servers call this when they start, clients when they connect.
pub(crate) fn raise_descriptor_limit() {
    static RAISED: OnceLock<()> = OnceLock::new();
    RAISED.get_or_init(|| {
        // Best effort: the process keeps the limit it had.
        let _ = raise_soft_nofile(DESCRIPTOR_LIMIT_CAP);
    });
}

/// Sets the soft `RLIMIT_NOFILE` to `min(hard, cap)` when that is above it now; returns
/// the soft limit after.
fn raise_soft_nofile(cap: u64) -> std::io::Result<u64> {
    let limit = nofile()?;
    // RLIM_INFINITY is the largest value, so `min` caps an unlimited hard limit too.
    let target = limit.rlim_max.min(cap as libc::rlim_t);
    if limit.rlim_cur >= target {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: target,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the unchanged
    // hard limit needs no privilege, and a refusal changes nothing.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(target)
}

/// The limit a process out of descriptors reached, for messages: "its open-file limit
/// (RLIMIT_NOFILE, soft limit N) or the system's (EMFILE/ENFILE)".
pub(crate) fn descriptor_limit_reached() -> String {
    let limit = descriptor_limit()
        .map(|n| format!("soft limit {n}"))
        .unwrap_or_else(|| "no soft limit".into());
    format!("its open-file limit (RLIMIT_NOFILE, {limit}) or the system's (EMFILE/ENFILE)")
}

/// This process's soft `RLIMIT_NOFILE`, for messages (`None` when unlimited or unknown).
pub(crate) fn descriptor_limit() -> Option<u64> {
    let soft = nofile().ok()?.rlim_cur;
    (soft != libc::RLIM_INFINITY).then_some(soft)
}

/// This process's `RLIMIT_NOFILE` (soft and hard).
fn nofile() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a writable rlimit, as getrlimit needs.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_never_lowers_the_limit() {
        // A cap of 0 asks for less than any limit: nothing may change.
        let before = descriptor_limit();
        raise_soft_nofile(0).unwrap();
        assert_eq!(descriptor_limit(), before);
    }
}
