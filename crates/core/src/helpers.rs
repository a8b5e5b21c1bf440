//! A few helper threads that share work with the calling thread.
//!
//! The pool is this crate's own (one thread fewer than the machine has cores, so the
//! caller and its helpers fill the cores without oversubscribing them), not rayon's
//! global pool, which the embedding program may be using for its own work. Work is
//! always offered so that the calling thread can do it too: a helper that is slow to
//! wake never makes the caller wait longer than doing the work alone would.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

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

/// Where a piece of work offered to a helper stands.
enum Offer<S, R> {
    /// Not started: whoever takes it runs it.
    Offered(S),
    /// A helper is running it.
    Running,
    /// A helper ran it (or it panicked there).
    Done(std::thread::Result<R>),
    /// The calling thread took it back.
    TakenBack,
}

/// Runs `main` on the calling thread and offers `side` to a helper thread; returns
/// both results. For overlapping two independent pieces of work, such as parsing
/// metadata already read while positional reads fetch more.
///
/// If no helper has started `side` by the time `main` returns, the calling thread
/// takes it back and runs it itself, and does not wait for a helper at all: waking
/// a sleeping thread can take longer than the work (tens of microseconds, more on
/// a virtual machine), so an idle pool never makes the call slower than running
/// both halves in turn (as it does on a one-core machine). `side` owns what it uses
/// (`'static`) for that reason. A panic in either is resumed on the calling thread.
pub fn join<M, S, RM, RS>(main: M, side: S) -> (RM, RS)
where
    M: FnOnce() -> RM,
    S: FnOnce() -> RS + Send + 'static,
    RS: Send + 'static,
{
    let Some(pool) = pool() else {
        let main_result = main();
        return (main_result, side());
    };
    let offer = Arc::new((Mutex::new(Offer::Offered(side)), Condvar::new()));
    let for_helper = Arc::clone(&offer);
    pool.spawn(move || {
        let (state, done) = &*for_helper;
        let taken = {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::replace(&mut *state, Offer::Running) {
                Offer::Offered(side) => side,
                other => {
                    *state = other;
                    return;
                }
            }
        };
        let result = std::panic::catch_unwind(AssertUnwindSafe(taken));
        *state.lock().unwrap_or_else(PoisonError::into_inner) = Offer::Done(result);
        done.notify_one();
    });
    let main_result = main();
    let (state, done) = &*offer;
    let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        match std::mem::replace(&mut *guard, Offer::TakenBack) {
            Offer::Offered(side) => {
                drop(guard);
                return (main_result, side());
            }
            Offer::Done(Ok(side_result)) => return (main_result, side_result),
            Offer::Done(Err(panic)) => std::panic::resume_unwind(panic),
            Offer::Running => {
                *guard = Offer::Running;
                guard = done.wait(guard).unwrap_or_else(PoisonError::into_inner);
            }
            Offer::TakenBack => unreachable!("only this thread takes the work back"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn both_sides_run_exactly_once() {
        for _ in 0..200 {
            let calls = Arc::new(AtomicUsize::new(0));
            let side_calls = Arc::clone(&calls);
            let (a, b) = join(
                || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "main"
                },
                move || {
                    side_calls.fetch_add(10, Ordering::SeqCst);
                    vec![1, 2, 3]
                },
            );
            assert_eq!((a, b), ("main", vec![1, 2, 3]));
            assert_eq!(calls.load(Ordering::SeqCst), 11);
        }
    }

    #[test]
    fn side_runs_on_shared_data() {
        let data: Arc<Vec<u64>> = Arc::new((0..10_000).collect());
        let theirs = Arc::clone(&data);
        let (front, back) = join(
            || data[..5_000].iter().sum::<u64>(),
            move || theirs[5_000..].iter().sum::<u64>(),
        );
        assert_eq!(front + back, data.iter().sum::<u64>());
    }

    #[test]
    fn a_long_main_lets_a_helper_run_side_and_waits_for_it() {
        // The main half lasts long enough for an idle helper to wake; the side half
        // then runs on it, and the caller waits for its result.
        let caller = std::thread::current().id();
        let mut on_helper = 0;
        for _ in 0..20 {
            let (_, ran_on) = join(
                || std::thread::sleep(std::time::Duration::from_millis(20)),
                || {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    std::thread::current().id()
                },
            );
            on_helper += usize::from(ran_on != caller);
        }
        if pool().is_some() {
            assert!(on_helper > 0, "no helper ever ran the side half");
        }
    }

    #[test]
    fn a_panic_in_side_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| join(|| 1, || -> i32 { panic!("side failed") }));
        assert!(caught.is_err());
        // Also when it panics on the helper.
        let caught = std::panic::catch_unwind(|| {
            join(
                || std::thread::sleep(std::time::Duration::from_millis(20)),
                || -> i32 { panic!("side failed") },
            )
        });
        assert!(caught.is_err());
        // The pool still works afterwards.
        assert_eq!(join(|| 2, || 3), (2, 3));
    }
}
