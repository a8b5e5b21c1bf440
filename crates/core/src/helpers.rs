//! A few helper threads that share work with the calling thread.
//!
//! The pool is this crate's own (one thread fewer than the machine has cores, so the
//! caller and its helpers fill the cores without oversubscribing them), not rayon's
//! global pool, which the embedding program may be using for its own work. Work is
//! always offered so that the calling thread can do it too: a helper that is slow to
//! wake never makes the caller wait longer than doing the work alone would.

use std::sync::{Mutex, OnceLock, PoisonError};

/// Most helper threads (memory bandwidth, not cores, bounds the copies they share).
const MAX_HELPERS: usize = 7;

/// The helper pool, made on first use; `None` on a one-core machine or when its
/// threads cannot be started (work then runs on the calling thread).
pub(crate) fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.saturating_sub(1).min(MAX_HELPERS);
        if threads == 0 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tensorwire-helper-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs `main` on the calling thread and `side` on a helper thread, and returns both
/// results: for overlapping two independent pieces of work, such as parsing metadata
/// already read while the positional reads of more metadata go on.
///
/// `side` is offered to a helper first; if none has started it by the time `main`
/// returns, the calling thread runs it itself. On a one-core machine both run on the
/// calling thread, `main` first. A panic in either is resumed on the calling thread.
pub fn join<M, S, RM, RS>(main: M, side: S) -> (RM, RS)
where
    M: FnOnce() -> RM,
    S: FnOnce() -> RS + Send,
    RS: Send,
{
    let Some(pool) = pool() else {
        let main_result = main();
        return (main_result, side());
    };
    let offered = Mutex::new(Some(side));
    let side_result = Mutex::new(None);
    // Whoever takes `side` out of `offered` first runs it; the other finds `None`.
    // Neither lock is held while user code runs, so a panic cannot poison them in
    // an inconsistent state.
    let run_side = || {
        let taken = offered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(side) = taken {
            let result = side();
            *side_result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        }
    };
    let main_result = pool.in_place_scope(|scope| {
        scope.spawn(|_| run_side());
        let main_result = main();
        run_side();
        main_result
    });
    let side_result = side_result
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .expect("`side` ran on a helper or on the calling thread");
    (main_result, side_result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn both_sides_run_exactly_once() {
        for _ in 0..200 {
            let calls = AtomicUsize::new(0);
            let (a, b) = join(
                || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "main"
                },
                || {
                    calls.fetch_add(10, Ordering::SeqCst);
                    vec![1, 2, 3]
                },
            );
            assert_eq!((a, b), ("main", vec![1, 2, 3]));
            assert_eq!(calls.load(Ordering::SeqCst), 11);
        }
    }

    #[test]
    fn side_borrows_from_the_caller() {
        let data: Vec<u64> = (0..10_000).collect();
        let (front, back) = join(
            || data[..5_000].iter().sum::<u64>(),
            || data[5_000..].iter().sum::<u64>(),
        );
        assert_eq!(front + back, data.iter().sum::<u64>());
    }

    #[test]
    fn a_panic_in_side_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| join(|| 1, || panic!("side failed")));
        assert!(caught.is_err());
        // The pool still works afterwards.
        assert_eq!(join(|| 2, || 3), (2, 3));
    }
}
