//! The native half of `tensorwire.cache`: a handle on a shared-memory
//! [`TensorCache`] that stores tensor packets and returns them as numpy views.
//!
//! `put` encodes the packet straight into the cache block (a dense array is copied
//! once, from the caller's array into shared memory); `get` decodes the pinned block
//! in place, so the arrays it returns borrow shared memory, read-only, and their
//! numpy `base` chain holds the pin.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use tensorwire::cache::{CacheOptions, PutStage, TensorCache};
use tensorwire::packet::EncodeOptions;
use tensorwire::Error;

use crate::errors::ResultExt;
use crate::packet::{decode_value, encode_spec, Arrays, Held};

/// A handle on one cache (`tensorwire.cache.TensorCache` wraps it).
#[pyclass(frozen, module = "tensorwire._native", name = "CacheHandle")]
pub struct CacheHandle {
    name: String,
    /// `None` once closed.
    cache: Mutex<Option<TensorCache>>,
}

fn options(
    timeout: f64,
    pause_at: Option<&str>,
    max_entries: Option<usize>,
) -> PyResult<CacheOptions> {
    let Some(lock_timeout) = crate::values::positive_seconds(timeout) else {
        return Err(Error::invalid(format!(
            "lock_timeout must be positive seconds (at most {}), not {timeout}",
            Duration::MAX.as_secs()
        )))
        .or_raise();
    };
    let pause_at = match pause_at {
        None => None,
        Some("reserved") => Some(PutStage::Reserved),
        Some("filling") => Some(PutStage::Filling),
        Some("publishing") => Some(PutStage::Publishing),
        Some("in-place") => Some(PutStage::InPlace),
        Some(other) => {
            return Err(Error::invalid(format!("unknown pause stage {other:?}"))).or_raise()
        }
    };
    Ok(CacheOptions {
        max_entries,
        lock_timeout,
        pause_at,
        wait_check: Some(signal_arrived),
        ..CacheOptions::default()
    })
}

std::thread_local! {
    /// Set while this thread runs a cache call without the GIL ([`CacheHandle::detached`]):
    /// only then may a signal end its lock wait (not in a view's release, which
    /// runs in numpy's deallocation and cannot raise).
    static INTERRUPTIBLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The exception a signal handler raised during that wait, for the call to raise.
    static RAISED: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
}

/// Sets [`INTERRUPTIBLE`] for its life, then restores what it was (a panic too).
struct Interruptible {
    outer: bool,
}

impl Interruptible {
    fn enter() -> Interruptible {
        Interruptible {
            outer: INTERRUPTIBLE.with(|i| i.replace(true)),
        }
    }
}

impl Drop for Interruptible {
    fn drop(&mut self) {
        INTERRUPTIBLE.with(|i| i.set(self.outer));
    }
}

/// The cache's [`CacheOptions::wait_check`]: runs Python's signal handlers (Ctrl-C)
/// between slices of a lock wait, as `SharedTensor`'s lock wait does; true, ending
/// the wait, when one raised.
fn signal_arrived() -> bool {
    if !INTERRUPTIBLE.with(std::cell::Cell::get) {
        return false;
    }
    match Python::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(raised) => {
            RAISED.with(|slot| *slot.borrow_mut() = Some(raised));
            true
        }
    }
}

impl CacheHandle {
    fn wrap(cache: TensorCache) -> Self {
        CacheHandle {
            name: cache.name().to_owned(),
            cache: Mutex::new(Some(cache)),
        }
    }

    /// `op` on the cache, without the GIL: the pool lock may be held by another
    /// process (a large put writes under it), and this process's other threads must
    /// run meanwhile. Ctrl-C ends a lock wait (see [`signal_arrived`]).
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&TensorCache) -> tensorwire::Result<T> + Send,
    ) -> PyResult<T> {
        let cache = self.cache()?;
        let result = py.detach(|| {
            let _interruptible = Interruptible::enter();
            op(&cache)
        });
        // A wait a signal handler ended raises what the handler raised.
        match (result, RAISED.with(|slot| slot.borrow_mut().take())) {
            (Err(_), Some(raised)) => Err(raised),
            (result, _) => result.or_raise(),
        }
    }

    /// The cache, or an error once closed. A clone: operations run without holding
    /// the handle's mutex.
    fn cache(&self) -> PyResult<TensorCache> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| crate::errors::closed_error(&format!("cache {:?}", self.name)))
    }
}

#[pymethods]
impl CacheHandle {
    /// Creates a cache of `size` bytes.
    #[staticmethod]
    #[pyo3(signature = (name, size, max_entries, timeout, pause_at=None))]
    fn create(
        py: Python<'_>,
        name: Option<&str>,
        size: usize,
        max_entries: Option<usize>,
        timeout: f64,
        pause_at: Option<&str>,
    ) -> PyResult<Self> {
        let options = options(timeout, pause_at, max_entries)?;
        let cache = py
            .detach(|| TensorCache::create(name, size, options))
            .or_raise()?;
        Ok(CacheHandle::wrap(cache))
    }

    /// Attaches to the cache named `name`.
    #[staticmethod]
    #[pyo3(signature = (name, timeout, pause_at=None))]
    fn attach(py: Python<'_>, name: &str, timeout: f64, pause_at: Option<&str>) -> PyResult<Self> {
        let options = options(timeout, pause_at, None)?;
        let cache = py
            .detach(|| TensorCache::attach(name, options))
            .or_raise()?;
        Ok(CacheHandle::wrap(cache))
    }

    /// The segment name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Encodes `spec` (a `tensorwire.packet` spec tuple) into the cache under `key`.
    /// Returns the packet's length.
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        spec: &Bound<'_, PyAny>,
        ttl: Option<f64>,
    ) -> PyResult<usize> {
        let cache = self.cache()?;
        // Positive seconds; more than a `Duration` holds (about 584 billion years)
        // is as good as never.
        let ttl = ttl
            .map(|t| match t > 0.0 {
                true => Ok(Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX)),
                false => Err(PyValueError::new_err(format!(
                    "ttl must be positive seconds, not {t}"
                ))),
            })
            .transpose()?;
        let (held, parsed) = Held::from_spec(spec)?;
        let encoded = encode_spec(py, &held, &parsed, EncodeOptions::default())?;
        let len = encoded.len();
        // Without the GIL, as `detached` runs the other calls (the cache taken before
        // encoding, so a closed handle fails first).
        py.detach(|| cache.put_with(key, len, ttl, |block| encoded.write_into(block)))
            .or_raise()
    }

    /// The decoded value under `key` (zero-copy unless `copy`), or None.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        copy: bool,
        factories: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.detached(py, |cache| cache.get(key))? {
            Some(bytes) => decode_value(py, &bytes, Arrays::copied_if(copy), factories).map(Some),
            None => Ok(None),
        }
    }

    /// Removes `key`.
    fn delete(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        self.detached(py, |cache| cache.delete(key))
    }

    /// True when `key` is live.
    fn contains(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        self.detached(py, |cache| cache.contains(key))
    }

    /// `info(key)` as tenso reports it, or None.
    fn info<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(info) = self.detached(py, |cache| cache.info(key))? else {
            return Ok(None);
        };
        let packet = py.import("tensorwire.packet")?;
        let head = PyBytes::new(py, &info.head);
        let header = packet.call_method1("get_packet_info", (head,)).ok();
        let field = |name: &str| -> PyResult<Option<Bound<'py, PyAny>>> {
            match &header {
                Some(h) => Ok(h.get_item(name).ok()),
                None => Ok(None),
            }
        };
        let out = PyDict::new(py);
        out.set_item(
            "shape",
            field("shape")?.unwrap_or_else(|| PyTuple::empty(py).into_any()),
        )?;
        out.set_item("dtype", field("dtype")?)?;
        out.set_item("ndim", field("ndim")?.map_or(Ok(0usize), |n| n.extract())?)?;
        out.set_item("size_bytes", info.size)?;
        out.set_item("alloc_bytes", info.alloc_size)?;
        out.set_item("ttl", info.ttl.map(|t| t.as_secs_f64()))?;
        out.set_item("age", info.age.as_secs_f64())?;
        Ok(Some(out))
    }

    /// Number of live keys.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.detached(py, TensorCache::len)
    }

    /// The live keys, most recently used first.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.detached(py, TensorCache::keys)
    }

    /// Removes every entry.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, TensorCache::clear)
    }

    /// Counters and occupancy.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.detached(py, TensorCache::stats)?;
        let out = PyDict::new(py);
        for (k, v) in [
            ("entries", s.entries),
            ("max_entries", s.max_entries),
            ("pool_size", s.pool_size),
            ("used_bytes", s.used_bytes),
            ("free_bytes", s.free_bytes),
            ("data_region_size", s.data_region_size),
            ("hits", s.hits),
            ("misses", s.misses),
        ] {
            out.set_item(k, v)?;
        }
        out.set_item("hit_rate", s.hit_rate())?;
        for (k, v) in [
            ("pinned_bytes", s.pinned_bytes),
            ("evictions", s.evictions),
            ("expirations", s.expirations),
            ("recoveries", s.recoveries),
            ("processes", s.processes),
        ] {
            out.set_item(k, v)?;
        }
        Ok(out)
    }

    /// Verifies the internal structures.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, TensorCache::check_consistency)
    }

    /// Detaches this handle (views already taken keep the mapping).
    fn close(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Removes the segment's name.
    fn unlink(&self) -> PyResult<()> {
        tensorwire::shm::Segment::unlink(&self.name).or_raise()
    }

    /// Removes the segment's name if it is still there.
    fn unlink_quietly(&self) {
        let _ = tensorwire::shm::Segment::unlink(&self.name);
    }

    fn __repr__(&self) -> String {
        format!("CacheHandle({:?})", self.name)
    }
}

/// The fork hooks (`tensorwire.cache` registers them with `os.register_at_fork`):
/// before the fork, for every cache this process holds a handle or a view of (also
/// of closed handles whose views live), a registry slot for the child pins every
/// entry this process views, and the process-local locks of the cache and
/// shared-memory code are held across the fork; the child takes the slots over at
/// once. They never raise.
#[pyfunction]
pub fn prepare_fork() {
    tensorwire::cache::prepare_fork();
}

/// See [`prepare_fork`]: in the parent after the fork.
#[pyfunction]
pub fn parent_after_fork() {
    tensorwire::cache::parent_after_fork();
}

/// See [`prepare_fork`]: in the child after the fork.
#[pyfunction]
pub fn child_after_fork() {
    tensorwire::cache::child_after_fork();
}
