//! The task pool: a bounded queue served by a fixed number of worker threads, with
//! finished tasks kept for a retention time (or up to a count) so their results can
//! be fetched later.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{IpcError, RemoteKind, Result};
use crate::schema::{TaskInfo, TaskState};
use crate::util::{lock, now_secs};

/// What a task computes: a value of type `T` or an error kind and message.
pub type TaskOutcome<T> = std::result::Result<T, (RemoteKind, String)>;

type Job<T> = Box<dyn FnOnce() -> TaskOutcome<T> + Send>;

/// Bounds of a [`TaskPool`].
#[derive(Debug, Clone, Copy)]
pub struct TaskLimits {
    /// Worker threads.
    pub workers: usize,
    /// Tasks queued or running at once; more are refused with `Busy`.
    pub max_pending: usize,
    /// Finished tasks kept at most (the oldest are dropped first).
    pub max_finished: usize,
    /// How long a finished task is kept.
    pub retention: Duration,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            workers: 4,
            max_pending: 1024,
            max_finished: 1024,
            retention: Duration::from_secs(600),
        }
    }
}

struct Entry<T> {
    info: TaskInfo,
    job: Option<Job<T>>,
    /// Tasks with the same gate run one at a time; a gated task whose gate is busy
    /// waits in the queue without taking a worker.
    gate: Option<String>,
    outcome: Option<TaskOutcome<T>>,
    finished: Option<Instant>,
}

struct Table<T> {
    tasks: HashMap<String, Entry<T>>,
    busy_gates: std::collections::HashSet<String>,
    queue: VecDeque<String>,
    finished_order: VecDeque<String>,
    pending: usize,
    next_id: u64,
    stopping: bool,
}

struct Shared<T> {
    table: Mutex<Table<T>>,
    work: Condvar,
    done: Condvar,
    limits: TaskLimits,
    prefix: String,
}

/// A bounded pool of worker threads running tasks of result type `T`.
pub struct TaskPool<T: Clone + Send + 'static> {
    shared: Arc<Shared<T>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Table<T>> {
        lock(&self.table)
    }
}

impl<T> Table<T> {
    fn prune(&mut self, limits: &TaskLimits) {
        while let Some(id) = self.finished_order.front() {
            let expired = self
                .tasks
                .get(id)
                .and_then(|e| e.finished)
                .is_none_or(|t| t.elapsed() > limits.retention);
            if expired || self.finished_order.len() > limits.max_finished {
                let id = self.finished_order.pop_front().unwrap_or_default();
                self.tasks.remove(&id);
            } else {
                break;
            }
        }
    }

    fn finish(&mut self, id: &str, state: TaskState, outcome: Option<TaskOutcome<T>>) {
        if let Some(entry) = self.tasks.get_mut(id) {
            entry.info.state = state;
            entry.info.finished_at = Some(now_secs());
            if let Some(Err((_, message))) = &outcome {
                entry.info.error = Some(message.clone());
            }
            entry.outcome = outcome;
            entry.finished = Some(Instant::now());
            self.finished_order.push_back(id.to_owned());
        }
    }
}

impl<T: Clone + Send + 'static> TaskPool<T> {
    /// Starts `limits.workers` threads. Task ids start with `prefix`.
    pub fn new(limits: TaskLimits, prefix: &str) -> Result<TaskPool<T>> {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table {
                tasks: HashMap::new(),
                busy_gates: Default::default(),
                queue: VecDeque::new(),
                finished_order: VecDeque::new(),
                pending: 0,
                next_id: 1,
                stopping: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            limits,
            prefix: prefix.to_owned(),
        });
        let mut workers = Vec::new();
        for i in 0..limits.workers.max(1) {
            let shared = shared.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("tw-ipc-task-{i}"))
                    .spawn(move || worker(shared))?,
            );
        }
        Ok(TaskPool {
            shared,
            workers: Mutex::new(workers),
        })
    }

    /// Queues `job` for `endpoint`; returns the task id, or `Busy` when the queue is full.
    pub fn submit(
        &self,
        endpoint: &str,
        job: impl FnOnce() -> TaskOutcome<T> + Send + 'static,
    ) -> Result<String> {
        self.submit_gated(endpoint, None, job)
    }

    /// Like [`submit`](Self::submit), but tasks sharing `gate` run one at a time (a
    /// serialized endpoint); while one runs, the others wait in the queue and the
    /// workers take other tasks.
    pub fn submit_gated(
        &self,
        endpoint: &str,
        gate: Option<String>,
        job: impl FnOnce() -> TaskOutcome<T> + Send + 'static,
    ) -> Result<String> {
        let mut table = self.shared.lock();
        table.prune(&self.shared.limits);
        if table.stopping {
            return Err(IpcError::remote(
                RemoteKind::ShuttingDown,
                "server is stopping",
            ));
        }
        if table.pending >= self.shared.limits.max_pending {
            return Err(IpcError::remote(
                RemoteKind::Busy,
                format!(
                    "{} tasks queued or running, the limit",
                    self.shared.limits.max_pending
                ),
            ));
        }
        let id = format!("{}-{}", self.shared.prefix, table.next_id);
        table.next_id += 1;
        table.pending += 1;
        table.tasks.insert(
            id.clone(),
            Entry {
                info: TaskInfo {
                    task_id: id.clone(),
                    endpoint: endpoint.to_owned(),
                    state: TaskState::Pending,
                    created_at: now_secs(),
                    started_at: None,
                    finished_at: None,
                    error: None,
                },
                job: Some(Box::new(job)),
                gate,
                outcome: None,
                finished: None,
            },
        );
        table.queue.push_back(id.clone());
        drop(table);
        self.shared.work.notify_one();
        Ok(id)
    }

    /// The task's state.
    pub fn info(&self, id: &str) -> Result<TaskInfo> {
        let table = self.shared.lock();
        table
            .tasks
            .get(id)
            .map(|e| e.info.clone())
            .ok_or_else(|| unknown(id))
    }

    /// Waits until the task finishes or `timeout` passes; returns its state then.
    pub fn wait(&self, id: &str, timeout: Duration) -> Result<TaskInfo> {
        let deadline = Instant::now() + timeout;
        let mut table = self.shared.lock();
        loop {
            let info = table
                .tasks
                .get(id)
                .map(|e| e.info.clone())
                .ok_or_else(|| unknown(id))?;
            let left = deadline.saturating_duration_since(Instant::now());
            if info.state.is_finished() || left.is_zero() {
                return Ok(info);
            }
            table = self
                .shared
                .done
                .wait_timeout(table, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The finished task's outcome (an error while it has not finished).
    pub fn outcome(&self, id: &str) -> Result<TaskOutcome<T>> {
        let table = self.shared.lock();
        let entry = table.tasks.get(id).ok_or_else(|| unknown(id))?;
        match (&entry.outcome, entry.info.state) {
            (Some(outcome), _) => Ok(outcome.clone()),
            (None, TaskState::Cancelled) => Ok(Err((
                RemoteKind::Cancelled,
                format!("task {id} was cancelled"),
            ))),
            (None, state) => Err(IpcError::remote(
                RemoteKind::BadRequest,
                format!("task {id} has not finished (it is {state:?})"),
            )),
        }
    }

    /// Cancels a task that has not started; false when it is running or finished.
    pub fn cancel(&self, id: &str) -> Result<bool> {
        let mut table = self.shared.lock();
        let state = table.tasks.get(id).ok_or_else(|| unknown(id))?.info.state;
        if state != TaskState::Pending {
            return Ok(false);
        }
        table.queue.retain(|q| q != id);
        table.pending -= 1;
        if let Some(entry) = table.tasks.get_mut(id) {
            entry.job = None;
        }
        table.finish(id, TaskState::Cancelled, None);
        drop(table);
        self.shared.done.notify_all();
        Ok(true)
    }

    /// Every retained task (optionally only those in `state`), oldest first.
    pub fn list(&self, state: Option<TaskState>) -> Vec<TaskInfo> {
        let mut table = self.shared.lock();
        table.prune(&self.shared.limits);
        let mut infos: Vec<TaskInfo> = table
            .tasks
            .values()
            .filter(|e| state.is_none_or(|s| e.info.state == s))
            .map(|e| e.info.clone())
            .collect();
        infos.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
        infos
    }

    /// Stops taking tasks, cancels queued ones and joins the workers (running tasks
    /// finish first).
    pub fn shutdown(&self) {
        let mut table = self.shared.lock();
        table.stopping = true;
        let queued: Vec<String> = table.queue.drain(..).collect();
        for id in queued {
            table.pending -= 1;
            table.finish(&id, TaskState::Cancelled, None);
        }
        drop(table);
        self.shared.work.notify_all();
        self.shared.done.notify_all();
        let workers = std::mem::take(&mut *lock(&self.workers));
        for w in workers {
            let _ = w.join();
        }
    }
}

impl<T: Clone + Send + 'static> Drop for TaskPool<T> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn unknown(id: &str) -> IpcError {
    IpcError::remote(
        RemoteKind::UnknownTask,
        format!("no task {id} (never submitted, or dropped after its retention time)"),
    )
}

fn worker<T>(shared: Arc<Shared<T>>) {
    loop {
        let (id, job, gate) = {
            let mut table = shared.lock();
            loop {
                // The first queued task whose gate (if any) is free.
                let next = table.queue.iter().position(|id| {
                    table
                        .tasks
                        .get(id)
                        .and_then(|e| e.gate.as_ref())
                        .is_none_or(|g| !table.busy_gates.contains(g))
                });
                if let Some(id) = next.and_then(|i| table.queue.remove(i)) {
                    let taken = table.tasks.get_mut(&id).and_then(|e| {
                        e.info.state = TaskState::Running;
                        e.info.started_at = Some(now_secs());
                        e.job.take().map(|job| (job, e.gate.clone()))
                    });
                    if let Some((job, gate)) = taken {
                        if let Some(g) = &gate {
                            table.busy_gates.insert(g.clone());
                        }
                        break (id, job, gate);
                    }
                    continue;
                }
                if table.stopping {
                    return;
                }
                table = shared
                    .work
                    .wait(table)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
            .unwrap_or_else(|_| Err((RemoteKind::Internal, "task panicked".into())));
        let state = if outcome.is_ok() {
            TaskState::Completed
        } else {
            TaskState::Failed
        };
        let mut table = shared.lock();
        table.pending -= 1;
        table.finish(&id, state, Some(outcome));
        table.prune(&shared.limits);
        if let Some(g) = gate {
            table.busy_gates.remove(&g);
            // A task waiting for this gate may run now.
            shared.work.notify_all();
        }
        drop(table);
        shared.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn lifecycle_wait_cancel_and_limits() {
        let pool = TaskPool::<u32>::new(
            TaskLimits {
                workers: 1,
                max_pending: 3,
                max_finished: 2,
                retention: Duration::from_secs(60),
            },
            "t",
        )
        .unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let blocker = pool
            .submit("slow", move || {
                go_rx.recv().ok();
                Ok(1)
            })
            .unwrap();
        let queued = pool.submit("fast", || Ok(2)).unwrap();
        let failing = pool
            .submit("bad", || Err((RemoteKind::EndpointFailed, "boom".into())))
            .unwrap();
        // Full: three pending.
        let err = pool.submit("more", || Ok(3)).unwrap_err();
        assert!(matches!(
            err,
            IpcError::Remote {
                kind: RemoteKind::Busy,
                ..
            }
        ));
        // The first is running (or about to), so only the second can be cancelled.
        let info = pool.wait(&blocker, Duration::from_millis(50)).unwrap();
        assert!(!info.state.is_finished());
        assert!(pool.cancel(&queued).unwrap());
        assert!(!pool.cancel(&queued).unwrap());
        assert_eq!(pool.info(&queued).unwrap().state, TaskState::Cancelled);
        assert!(matches!(
            pool.outcome(&blocker),
            Err(IpcError::Remote {
                kind: RemoteKind::BadRequest,
                ..
            })
        ));
        go_tx.send(()).unwrap();
        let info = pool.wait(&blocker, Duration::from_secs(5)).unwrap();
        assert_eq!(info.state, TaskState::Completed);
        assert_eq!(pool.outcome(&blocker).unwrap(), Ok(1));
        let info = pool.wait(&failing, Duration::from_secs(5)).unwrap();
        assert_eq!(info.state, TaskState::Failed);
        assert_eq!(info.error.as_deref(), Some("boom"));
        assert_eq!(pool.list(Some(TaskState::Failed)).len(), 1);
        // Retention by count: three finished, two kept (the cancelled one went first).
        assert_eq!(pool.list(None).len(), 2);
        assert!(matches!(
            pool.info(&queued),
            Err(IpcError::Remote {
                kind: RemoteKind::UnknownTask,
                ..
            })
        ));
    }

    #[test]
    fn gated_tasks_wait_in_the_queue_not_in_a_worker() {
        let pool = TaskPool::<u32>::new(
            TaskLimits {
                workers: 2,
                ..TaskLimits::default()
            },
            "t",
        )
        .unwrap();
        // The first gated task holds the gate until the test lets it go (not for a
        // fixed time a stalled thread could outlast).
        let (release, released) = std::sync::mpsc::channel::<()>();
        let mut gated = vec![pool
            .submit_gated("load", Some("load".into()), move || {
                let _ = released.recv();
                Ok(1)
            })
            .unwrap()];
        for _ in 0..2 {
            gated.push(
                pool.submit_gated("load", Some("load".into()), || Ok(1))
                    .unwrap(),
            );
        }
        let quick = pool.submit("quick", || Ok(2)).unwrap();
        assert_eq!(
            pool.wait(&quick, Duration::from_secs(10)).unwrap().state,
            TaskState::Completed
        );
        for id in &gated[1..] {
            assert_eq!(pool.info(id).unwrap().state, TaskState::Pending);
        }
        release.send(()).unwrap();
        for id in &gated {
            assert_eq!(
                pool.wait(id, Duration::from_secs(5)).unwrap().state,
                TaskState::Completed
            );
        }
        // One at a time: their run intervals do not overlap.
        let mut spans: Vec<(f64, f64)> = gated
            .iter()
            .map(|id| {
                let i = pool.info(id).unwrap();
                (i.started_at.unwrap(), i.finished_at.unwrap())
            })
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        // The quick task did not wait behind the gated ones: the free worker took it
        // while the first held the gate.
        let quick_done = pool.info(&quick).unwrap().finished_at.unwrap();
        assert!(quick_done <= spans[1].0, "{quick_done} vs {spans:?}");
    }

    #[test]
    fn retention_time_drops_finished_tasks_and_panics_are_failures() {
        let pool = TaskPool::<u32>::new(
            TaskLimits {
                workers: 2,
                retention: Duration::from_millis(30),
                ..TaskLimits::default()
            },
            "t",
        )
        .unwrap();
        let id = pool.submit("p", || panic!("endpoint bug")).unwrap();
        let info = pool.wait(&id, Duration::from_secs(5)).unwrap();
        assert_eq!(info.state, TaskState::Failed);
        std::thread::sleep(Duration::from_millis(60));
        assert!(pool.list(None).is_empty());
        assert!(pool.info(&id).is_err());
    }
}
