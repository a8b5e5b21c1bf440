//! Shared memory for tensorwire: named POSIX segments, anonymous memfd segments that
//! travel between processes as file descriptors, a process-shared robust mutex, and
//! process identities that survive PID reuse.
//!
//! A [`Segment`] is a `MAP_SHARED` mapping of a shared-memory object. Shared through
//! an `Arc`, it is the [`Owner`](tensorwire_core::Owner) of zero-copy
//! [`Bytes`](tensorwire_core::Bytes) views, so a tensor decoded from a segment keeps
//! the mapping alive for as long as the tensor lives (the name may be unlinked
//! meanwhile; the memory stays until the last map is gone).
//!
//! A [`RobustMutex`] lives inside a segment and is shared by every process that maps
//! it. When its holder dies, the next locker is told so ([`LockGuard::owner_died`]) and
//! can repair the state the mutex protects before calling
//! [`LockGuard::mark_consistent`]. [`ProcessId`] names a live process by pid and start
//! time, so a recycled pid is never mistaken for the process that held a lease.
//!
//! Linux only for memfd and robust mutexes; named segments follow POSIX.
//!
//! Not in scope: what goes in a segment (`tensorwire-packet`, `tensorwire-cache`).
#![deny(missing_docs)]

mod mutex;
mod name;
mod process;
mod segment;

pub use crate::mutex::{LockGuard, RobustMutex, MUTEX_SIZE};
pub use crate::name::{check_name, MAX_NAME_BYTES};
pub use crate::process::ProcessId;
pub use crate::segment::{hold_across_fork, Access, CreateOptions, Segment};
