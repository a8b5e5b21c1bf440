//! A shared-memory tensor cache many processes use at once: LRU eviction, per-entry
//! TTL, in-place updates, zero-copy reads that stay valid while held, and recovery
//! from processes killed mid-operation that keeps every healthy entry.
//!
//! One named segment (from `tensorwire-shm`) holds a header with a robust mutex, a
//! process registry, a key index, a free-extent table, fixed 256-byte entry slots and
//! a data region of 64-byte-aligned blocks; [`layout`] has the byte map and
//! `docs/shm-cache.md` the crash-safety argument.
//!
//! ```
//! use tensorwire_cache::{CacheOptions, TensorCache};
//! let cache = TensorCache::create(None, 1 << 20, CacheOptions::default())?;
//! cache.put("w", b"tensor bytes", None)?;
//! let view = cache.get("w")?.unwrap(); // zero-copy, pinned
//! cache.delete("w")?;                  // the view stays valid and unchanged
//! assert_eq!(&*view, b"tensor bytes");
//! cache.unlink()?;
//! # Ok::<(), tensorwire_core::Error>(())
//! ```
//!
//! Not in scope: what the values are (the Python API stores tensor packets) and
//! shared memory itself (`tensorwire-shm`). Linux only (robust mutexes, `/proc`).
#![deny(missing_docs)]

mod cache;
pub mod layout;
mod recover;
mod region;
mod tables;

pub use crate::cache::{
    child_after_fork, parent_after_fork, prepare_fork, CacheOptions, CacheStats, EntryInfo,
    PutStage, TensorCache, INFO_HEAD_BYTES, WAIT_SLICE,
};
pub use crate::layout::{Layout, MAX_KEY_BYTES, MAX_PROCESSES};
