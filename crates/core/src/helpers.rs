//! A few helper threads that share work with the calling thread.
//!
//! The pool is this crate's own (one thread fewer than the machine has cores, so the
//! caller and its helpers fill the cores without oversubscribing them), not rayon's
//! global pool, which the embedding program may be using for its own work. Work is
//! always offered so that the calling thread can do it too: a helper that is slow to
//! wake never makes the caller wait longer than doing the work alone would.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Most helper threads by default (memory bandwidth, not cores, bounds the copies
/// they share).
const MAX_HELPERS: usize = 7;

/// The environment variable that sets how many threads share a large copy, the
/// calling one included (`1`: no helpers); read once, when the pool is made. Unset,
/// or not a positive integer: one per core, at most `MAX_HELPERS + 1`.
pub const THREADS_ENV: &str = "TENSORWIRE_COPY_THREADS";

/// Most helper threads [`THREADS_ENV`] may ask for.
const MAX_CONFIGURED_HELPERS: usize = 63;

/// Helper threads for a machine of `cores` cores, with [`THREADS_ENV`] set to
/// `setting`.
fn helper_count(cores: usize, setting: Option<&str>) -> usize {
    match setting.and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(threads) if threads > 0 => (threads - 1).min(MAX_CONFIGURED_HELPERS),
        _ => cores.saturating_sub(1).min(MAX_HELPERS),
    }
}

/// The helper pool, made on first use; `None` on a one-core machine, when its
/// threads cannot be started, or in a child forked after it was made (threads do not
/// survive `fork`: work handed to the pool there would never run, as with rayon's own
/// global pool). Work then runs on the calling thread.
pub(crate) fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<(rayon::ThreadPool, u32)>> = OnceLock::new();
    let (pool, made_in) = POOL
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = helper_count(cores, std::env::var(THREADS_ENV).ok().as_deref());
            if threads == 0 {
                return None;
            }
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("tensorwire-helper-{i}"))
                .build()
                .ok()
                .map(|pool| (pool, std::process::id()))
        })
        .as_ref()?;
    (*made_in == std::process::id()).then_some(pool)
}

/// Runs `task` on every item, on the calling thread and up to `helpers` helper
/// threads at once: all of them take items from one queue, so the call never waits
/// for a helper to wake up, only, at the end, for the items helpers are still on.
/// Items run in no particular order; with no helper pool, on the calling thread in
/// order.
pub fn for_each<T: Send>(items: Vec<T>, helpers: usize, task: impl Fn(T) + Sync) {
    let pool = match pool() {
        Some(pool) if helpers > 0 && items.len() > 1 => pool,
        _ => {
            items.into_iter().for_each(task);
            return;
        }
    };
    let wanted = helpers.min(pool.current_num_threads());
    let queue = Mutex::new(items.into_iter());
    let work = || loop {
        // Taking an item cannot panic while the lock is held, so a poisoned lock (a
        // panic elsewhere) still holds a consistent queue.
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
        let Some(item) = next else { break };
        task(item);
    };
    pool.in_place_scope(|scope| {
        for _ in 0..wanted {
            scope.spawn(|_| work());
        }
        work();
    });
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

/// What the caller and the helper share about one offered piece of work.
struct Shared<S, R> {
    state: Mutex<Offer<S, R>>,
    /// Set once `state` is `Done`. It repeats what `state` says so that a spinning
    /// caller can watch it without taking the lock: spinning on the lock would fight
    /// the helper for it just as the helper stores its result.
    finished: AtomicBool,
    done: Condvar,
}

impl<S, R> Shared<S, R> {
    fn lock(&self) -> MutexGuard<'_, Offer<S, R>> {
        // No user code runs while the lock is held, so a poisoned lock still holds
        // a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Withdraws a piece of work no helper has started yet when dropped during a panic.
struct WithdrawOnUnwind<'a, S, R>(&'a Shared<S, R>);

impl<S, R> Drop for WithdrawOnUnwind<'_, S, R> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.0.lock();
            if matches!(*state, Offer::Offered(_)) {
                *state = Offer::TakenBack;
            }
        }
    }
}

/// How long a caller whose work was taken by a helper spins for its result before
/// sleeping until it is ready.
const SPIN_FOR: Duration = Duration::from_micros(200);

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
    let offer = Arc::new(Shared {
        state: Mutex::new(Offer::Offered(side)),
        finished: AtomicBool::new(false),
        done: Condvar::new(),
    });
    let for_helper = Arc::clone(&offer);
    pool.spawn(move || {
        let shared = &*for_helper;
        let taken = {
            let mut state = shared.lock();
            match std::mem::replace(&mut *state, Offer::Running) {
                Offer::Offered(side) => side,
                other => {
                    *state = other;
                    return;
                }
            }
        };
        let result = std::panic::catch_unwind(AssertUnwindSafe(taken));
        *shared.lock() = Offer::Done(result);
        shared.finished.store(true, Ordering::Release);
        shared.done.notify_one();
    });
    let main_result = {
        // If `main` panics, withdraw the offer: nobody would wait for `side`'s result.
        let _withdraw = WithdrawOnUnwind(&offer);
        main()
    };
    let shared = &*offer;
    let mut guard = shared.lock();
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
                // The helper started before `main` returned, so what it has left is
                // usually short: spin for it a while rather than sleep, since being
                // woken can take longer than the wait itself.
                drop(guard);
                let spin_until = Instant::now() + SPIN_FOR;
                while !shared.finished.load(Ordering::Acquire) && Instant::now() < spin_until {
                    std::hint::spin_loop();
                }
                guard = shared.lock();
                while matches!(*guard, Offer::Running) {
                    guard = shared
                        .done
                        .wait(guard)
                        .unwrap_or_else(PoisonError::into_inner);
                }
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
    fn helper_count_follows_the_cores_or_the_setting() {
        assert_eq!(helper_count(1, None), 0);
        assert_eq!(helper_count(2, None), 1);
        assert_eq!(helper_count(16, None), MAX_HELPERS);
        assert_eq!(helper_count(16, Some("16")), 15);
        assert_eq!(helper_count(2, Some(" 4 ")), 3); // more than cores: as asked
        assert_eq!(helper_count(16, Some("1")), 0);
        assert_eq!(helper_count(4, Some("100000")), MAX_CONFIGURED_HELPERS);
        for ignored in ["0", "-3", "four", ""] {
            assert_eq!(helper_count(4, Some(ignored)), 3, "{ignored:?}");
        }
    }

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
        // Until it happens once (a helper may stay asleep past one main half on a
        // loaded machine, but not past a hundred).
        let mut on_helper = 0;
        for _ in 0..100 {
            if on_helper > 0 {
                break;
            }
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
    fn a_panic_in_main_withdraws_side_if_no_helper_took_it() {
        // The guard `join` holds around `main`, checked directly: whether a helper
        // takes the offer first is up to the scheduler, so `join` itself cannot show
        // it deterministically.
        let shared = Shared {
            state: Mutex::new(Offer::<_, ()>::Offered(|| ())),
            finished: AtomicBool::new(false),
            done: Condvar::new(),
        };
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _withdraw = WithdrawOnUnwind(&shared);
            panic!("main failed");
        }));
        assert!(caught.is_err());
        assert!(matches!(*shared.lock(), Offer::TakenBack));
        // Without a panic the offer stays.
        let shared = Shared {
            state: Mutex::new(Offer::<_, ()>::Offered(|| ())),
            finished: AtomicBool::new(false),
            done: Condvar::new(),
        };
        drop(WithdrawOnUnwind(&shared));
        assert!(matches!(*shared.lock(), Offer::Offered(_)));
        // And `join` hands the panic to its caller.
        let caught = std::panic::catch_unwind(|| join(|| -> () { panic!("main failed") }, || ()));
        assert!(caught.is_err());
    }

    #[test]
    fn for_each_runs_every_item_once() {
        for helpers in [0, 1, 7] {
            let seen: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            for_each((0..1000).collect(), helpers, |i: usize| {
                seen[i].fetch_add(1, Ordering::SeqCst);
            });
            assert!(
                seen.iter().all(|n| n.load(Ordering::SeqCst) == 1),
                "helpers {helpers}"
            );
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
