//! `tensorwire._native.Writer`: the native half of `tensorwire.Writer`.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyInt, PyTuple, PyType};
use tensorwire::zt::{
    Checksum, ComponentData, Compression, WriteOptions, ZtVersion, ZtWriter, DEFAULT_ZSTD_LEVEL,
};
use tensorwire::{DType, Error, Layout, Shape};

use crate::arrays::{prepare, Prepared, RELEASE_GIL_BYTES};
use crate::errors::{to_pyerr, ResultExt};
use crate::values;

/// Highest zstd level; larger `compress` values are clamped to it.
const MAX_ZSTD_LEVEL: i64 = 22;

/// ztensor's rules: None/False/0 (or negative) → raw, True → zstd level 3, int > 0 →
/// that zstd level.
fn compression(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Compression> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Compression::Raw);
    };
    // bool or numpy.bool_ (pyo3 takes both), before ints: True is an int too.
    if let Ok(on) = obj.extract::<bool>() {
        return Ok(if on {
            Compression::Zstd(DEFAULT_ZSTD_LEVEL)
        } else {
            Compression::Raw
        });
    }
    // Any integer (numpy's too, through `__index__`); one too large for i64 is the
    // highest level.
    let level = if obj.is_instance_of::<PyInt>() {
        Some(obj.extract::<i64>().unwrap_or(MAX_ZSTD_LEVEL))
    } else {
        obj.extract::<i64>().ok()
    };
    match level {
        Some(level) if level <= 0 => Ok(Compression::Raw),
        // Clamped to 1..=22, so the cast cannot truncate.
        Some(level) => Ok(Compression::Zstd(level.min(MAX_ZSTD_LEVEL) as i32)),
        None => Err(PyTypeError::new_err("compress must be bool or int")),
    }
}

fn options(compress: Option<&Bound<'_, PyAny>>, checksum: &str) -> PyResult<WriteOptions> {
    Ok(WriteOptions {
        compression: compression(compress)?,
        checksum: Checksum::from_name(checksum).or_raise()?,
    })
}

/// Writes a `.zt` file. Tensors are written as they are added; `finish()` writes the
/// manifest (a new file appears at `path` only then). Used as a context manager it
/// finishes on success and discards everything on an exception.
///
/// Frozen: calls from several threads take turns on the file writer (a lock, waited
/// for without the GIL), so `finish()` or `discard()` waits for an add in flight on
/// another thread instead of failing, and an add after them raises.
#[pyclass(module = "tensorwire._native", name = "Writer", subclass, frozen)]
pub struct Writer {
    /// The file writer; `None` once finished or discarded. Held only by Rust code
    /// (never across a call into Python, so a thread never waits for itself).
    inner: Mutex<Option<ZtWriter<BufWriter<File>>>>,
    path: PathBuf,
    /// Set when `inner` is taken, for `finished` without waiting for an add.
    finished: AtomicBool,
    /// The `.zt` version written: 1 or 2.
    version: u32,
}

/// The file writer, locked; `None` once finished or discarded.
type Slot<'a> = MutexGuard<'a, Option<ZtWriter<BufWriter<File>>>>;

impl Writer {
    /// The lock over the file writer; when another thread holds it (an add in
    /// flight), waited for without the GIL.
    fn slot(&self, py: Python<'_>) -> Slot<'_> {
        // `lock_py_attached` tries the lock first and detaches only to wait.
        self.inner
            .lock_py_attached(py)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The file writer, or the error for a finished one.
    fn writer<'a>(slot: &'a mut Slot<'_>) -> PyResult<&'a mut ZtWriter<BufWriter<File>>> {
        slot.as_mut()
            .ok_or_else(|| to_pyerr(Error::invalid("the writer is already finished")))
    }

    /// Takes the file writer out (`None` when already finished or discarded).
    fn take(&self, py: Python<'_>) -> Option<ZtWriter<BufWriter<File>>> {
        let mut slot = self.slot(py);
        self.finished.store(true, Ordering::Release);
        slot.take()
    }

    /// Adds a dense tensor, releasing the GIL when it is large.
    #[allow(clippy::too_many_arguments)]
    fn add_dense(
        &self,
        py: Python<'_>,
        name: &str,
        dtype: DType,
        shape: &Shape,
        data: &[u8],
        attributes: Option<std::collections::BTreeMap<String, tensorwire::Value>>,
        options: WriteOptions,
    ) -> PyResult<()> {
        let expected = shape.byte_len(dtype).or_raise()?;
        if expected != data.len() as u64 {
            return Err(Error::invalid(format!(
                "`{name}`: shape {shape} of {dtype} needs {expected} bytes, the data has {}",
                data.len()
            )))
            .or_raise();
        }
        let mut slot = self.slot(py);
        let w = Writer::writer(&mut slot)?;
        let run = || w.add_dense_with_attributes(name, dtype, shape, data, attributes, options);
        if data.len() >= RELEASE_GIL_BYTES {
            py.detach(run)
        } else {
            run()
        }
        .or_raise()
    }
}

/// The role that carries an object's element type.
fn primary_role<'a>(format: &str, roles: &[&'a str]) -> Option<&'a str> {
    let wanted = match format {
        "dense" => "data",
        "sparse_csr" | "sparse_coo" => "values",
        _ => "packed_weight",
    };
    roles
        .iter()
        .copied()
        .find(|r| *r == wanted)
        .or_else(|| roles.first().copied())
}

#[pymethods]
impl Writer {
    /// Creates `path` (mode "w", replacing any file there on finish) or opens an
    /// existing `.zt` file to add tensors (mode "a"). `version=2` writes the `.zt`
    /// version 2 format that ztensor 2.x reads (digests "xxh3" or "sha256"; appending
    /// to a version 2 file is not supported).
    #[new]
    #[pyo3(signature = (path, mode = "w", *, version = 1))]
    fn new(py: Python<'_>, path: PathBuf, mode: &str, version: u32) -> PyResult<Self> {
        let version = match version {
            1 => ZtVersion::V1,
            2 => ZtVersion::V2,
            other => {
                return Err(to_pyerr(Error::invalid(format!(
                    "version must be 1 or 2, not {other}"
                ))))
            }
        };
        let inner = match (mode, version) {
            ("w", version) => py.detach(|| ZtWriter::create_with_version(&path, version)),
            ("a", ZtVersion::V1) => py.detach(|| ZtWriter::append(&path)),
            ("a", _) => Err(Error::unsupported(
                "appending to a .zt version 2 file (write a new one)",
            )),
            _ => Err(Error::invalid(format!(
                "mode must be \"w\" or \"a\", not {mode:?}"
            ))),
        }
        .or_raise()?;
        Ok(Writer {
            version: match inner.version() {
                ZtVersion::V2 => 2,
                _ => 1,
            },
            inner: Mutex::new(Some(inner)),
            path,
            finished: AtomicBool::new(false),
        })
    }

    /// Opens an existing `.zt` file to add tensors (same as `Writer(path, mode="a")`).
    #[classmethod]
    fn append<'py>(cls: &Bound<'py, PyType>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
        cls.call1((path, "a"))
    }

    /// Adds a dense tensor from a numpy array (any layout and byte order; copied to
    /// C order and little-endian only when needed).
    ///
    /// Args:
    ///     name: tensor name.
    ///     data: numpy array (numeric, bool, complex, or ml_dtypes bfloat16/float8).
    ///     compress: None/False/0 raw; True zstd level 3; int > 0 that zstd level.
    ///     checksum: "none", "crc32c" or "sha256" (version 2: "none", "xxh3" or "sha256").
    ///     attributes: optional dict of per-tensor metadata.
    #[pyo3(signature = (name, data, *, compress = None, checksum = "none", attributes = None))]
    fn write_numpy(
        &self,
        py: Python<'_>,
        name: &str,
        data: &Bound<'_, PyAny>,
        compress: Option<&Bound<'_, PyAny>>,
        checksum: &str,
        attributes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let opts = options(compress, checksum)?;
        let attributes = values::map_from_py(attributes)?;
        let prepared = prepare(data)?;
        let shape = prepared.shape()?;
        self.add_dense(
            py,
            name,
            prepared.dtype,
            &shape,
            prepared.bytes(),
            attributes,
            opts,
        )
    }

    /// Alias of `write_numpy` (ztensor's `add`).
    #[pyo3(signature = (name, data, compress = None, checksum = "none"))]
    fn add(
        &self,
        py: Python<'_>,
        name: &str,
        data: &Bound<'_, PyAny>,
        compress: Option<&Bound<'_, PyAny>>,
        checksum: &str,
    ) -> PyResult<()> {
        self.write_numpy(py, name, data, compress, checksum, None)
    }

    /// Adds a dense tensor from raw little-endian bytes (a `uint8` array) of `dtype`
    /// and `shape`; used by write_torch.
    #[pyo3(signature = (name, data, dtype, shape, *, compress = None, checksum = "none", attributes = None))]
    #[allow(clippy::too_many_arguments)]
    fn _write_raw(
        &self,
        py: Python<'_>,
        name: &str,
        data: &Bound<'_, PyAny>,
        dtype: &str,
        shape: Vec<u64>,
        compress: Option<&Bound<'_, PyAny>>,
        checksum: &str,
        attributes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let opts = options(compress, checksum)?;
        let attributes = values::map_from_py(attributes)?;
        let dtype: DType = dtype.parse().or_raise()?;
        let shape = Shape::new(shape).or_raise()?;
        let prepared = prepare(data)?;
        self.add_dense(py, name, dtype, &shape, prepared.bytes(), attributes, opts)
    }

    /// Adds an object of any layout from its components (used by `write`).
    #[pyo3(signature = (name, components, shape, format = "dense", r#type = None, attributes = None, *, compress = None, checksum = "none"))]
    #[allow(clippy::too_many_arguments)]
    fn _write_components(
        &self,
        py: Python<'_>,
        name: &str,
        components: &Bound<'_, PyDict>,
        shape: Vec<u64>,
        format: &str,
        r#type: Option<&str>,
        attributes: Option<&Bound<'_, PyAny>>,
        compress: Option<&Bound<'_, PyAny>>,
        checksum: &str,
    ) -> PyResult<()> {
        let opts = options(compress, checksum)?;
        let attributes = values::map_from_py(attributes)?;
        let shape = Shape::new(shape).or_raise()?;
        let mut parts: Vec<(String, Prepared<'_>)> = Vec::with_capacity(components.len());
        for (k, v) in components.iter() {
            parts.push((k.extract()?, prepare(&v)?));
        }
        let roles: Vec<&str> = parts.iter().map(|(r, _)| r.as_str()).collect();
        let primary = primary_role(format, &roles).map(str::to_owned);

        if format == "dense" {
            let [(role, data)] = parts.as_slice() else {
                return Err(Error::invalid(format!(
                    "dense tensor `{name}` needs exactly one component, `data`"
                )))
                .or_raise();
            };
            if role != "data" {
                return Err(Error::invalid(format!(
                    "dense tensor `{name}` needs a `data` component, not `{role}`"
                )))
                .or_raise();
            }
            // A type tensorwire has a dtype for is written as that dtype. Any other
            // (`f8_e8m0`, `f4_e2m1`, one of the user's own) is kept as the logical
            // type of raw stored elements (below), checked there as a reader will.
            let dtype = match r#type.map(|t| (t, t.parse::<DType>())) {
                None => Some(data.dtype),
                Some((_, Ok(logical))) => {
                    let storage = logical.storage().0;
                    // bool bytes may come as uint8 (version 2 stores bool over u8).
                    let bool_bytes = logical == DType::Bool && data.dtype == DType::U8;
                    if storage != data.dtype.storage().0 && !bool_bytes {
                        return Err(Error::invalid(format!(
                            "type `{logical}` is stored as {storage}, but `{name}`'s data is {}",
                            data.dtype
                        )))
                        .or_raise();
                    }
                    Some(logical)
                }
                Some((t, Err(_))) if data.dtype != data.dtype.storage().0 => {
                    return Err(Error::invalid(format!(
                        "type `{t}` needs `{name}`'s data as its stored elements, not {} (an array of a storage dtype such as uint8)",
                        data.dtype
                    )))
                    .or_raise();
                }
                Some((_, Err(_))) => None,
            };
            if let Some(dtype) = dtype {
                return self.add_dense(py, name, dtype, &shape, data.bytes(), attributes, opts);
            }
        }

        let logical: Vec<Option<String>> = parts
            .iter()
            .map(|(role, p)| {
                let (storage, _) = p.dtype.storage();
                if storage != p.dtype {
                    Some(p.dtype.name().to_owned())
                } else if Some(role) == primary.as_ref() {
                    r#type.map(str::to_owned)
                } else {
                    None
                }
            })
            .collect();
        let comps: Vec<ComponentData<'_>> = parts
            .iter()
            .zip(&logical)
            .map(|((role, p), t)| ComponentData {
                role,
                dtype: p.dtype.storage().0,
                logical_type: t.as_deref(),
                data: p.bytes(),
            })
            .collect();
        let total: usize = comps.iter().map(|c| c.data.len()).sum();
        let layout = Layout::from_name(format);
        let mut slot = self.slot(py);
        let w = Writer::writer(&mut slot)?;
        let run = || w.add_object(name, &shape, layout, attributes, &comps, opts);
        if total >= RELEASE_GIL_BYTES {
            py.detach(run)
        } else {
            run()
        }
        .or_raise()
    }

    /// Writes the manifest and footer; returns the file size in bytes. An add in
    /// flight on another thread is waited for.
    fn finish(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = self
            .take(py)
            .ok_or_else(|| to_pyerr(Error::invalid("the writer is already finished")))?;
        py.detach(|| inner.finish()).or_raise()
    }

    /// Abandons the write: a new file is removed, an append is rolled back.
    fn discard(&self, py: Python<'_>) {
        if let Some(inner) = self.take(py) {
            inner.discard();
        }
    }

    /// True once finished or discarded.
    #[getter]
    fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// The `.zt` version being written: 1 (ztensor 1.2) or 2 (ztensor 2.x).
    #[getter]
    fn version(&self) -> u32 {
        self.version
    }

    /// The path being written.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (exc_type, *_rest))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        _rest: &Bound<'_, PyTuple>,
    ) -> PyResult<bool> {
        if let Some(inner) = self.take(py) {
            if exc_type.is_none() {
                py.detach(|| inner.finish()).or_raise()?;
            } else {
                inner.discard();
            }
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.finished() { "finished" } else { "open" };
        format!("<tensorwire.Writer ({state}) {:?}>", self.path)
    }
}

/// `tensorwire.convert(src, dst, *, format=None, compress=None, checksum="none",
/// zt_version=1, progress=None)`: copies every tensor of any readable file into a new
/// `.zt` or safetensors file (`format` "zt" or "safetensors"; by default from `dst`'s
/// extension), returning the number of tensors. `compress` and `checksum` follow
/// `Writer.write` and apply to `.zt` output only; `zt_version=2` writes the format
/// ztensor 2.x reads (its digests are "xxh3" or "sha256"). `progress(tensors_done,
/// tensors, bytes_done)` is called as the conversion goes (after each tensor, and
/// every 8 MiB within a large one). Ctrl-C (any signal handler's exception), or an
/// exception `progress` raises, stops the conversion within 8 MiB and is raised; no
/// output is left behind (once the last tensor is written, the file is finished
/// first). `limits` are the parser limits the source is opened with, as for `Reader`.
#[pyfunction]
#[pyo3(signature = (src, dst, *, format=None, compress=None, checksum="none", zt_version=1, progress=None, limits=None))]
#[allow(clippy::too_many_arguments)]
pub fn convert(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    format: Option<&str>,
    compress: Option<&Bound<'_, PyAny>>,
    checksum: &str,
    zt_version: u32,
    progress: Option<Py<PyAny>>,
    limits: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let write = options(compress, checksum)?;
    let format = match format {
        None => tensorwire::OutputFormat::from_path(&dst).or_raise()?,
        Some("zt") => tensorwire::OutputFormat::Zt,
        Some("safetensors") => tensorwire::OutputFormat::Safetensors,
        Some(other) => {
            return Err(to_pyerr(Error::invalid(format!(
                "format must be \"zt\" or \"safetensors\", not {other:?}"
            ))))
        }
    };
    let format = match (format, zt_version) {
        (tensorwire::OutputFormat::Zt, 2) => tensorwire::OutputFormat::Zt2,
        (other, 1) => other,
        _ => {
            return Err(to_pyerr(Error::invalid(
                "zt_version must be 1 or 2, and applies to .zt output only",
            )))
        }
    };
    if format == tensorwire::OutputFormat::Safetensors
        && (write.compression != Compression::Raw || write.checksum != Checksum::None)
    {
        return Err(to_pyerr(Error::invalid(
            "safetensors files have no compression and no digests",
        )));
    }
    let options = tensorwire::ConvertOptions {
        format: Some(format),
        compression: write.compression,
        checksum: write.checksum,
        limits: crate::limits::from_py(limits)?,
    };
    // The first Python exception (a signal handler's, or the callback's) stops the
    // conversion and is raised in place of the `Cancelled` it causes.
    let mut raised: Option<PyErr> = None;
    let result = py.detach(|| {
        tensorwire::convert(&src, &dst, &options, &mut |done, total, bytes| {
            Python::attach(|py| {
                let called = py.check_signals().and_then(|()| match &progress {
                    Some(f) => f.call1(py, (done, total, bytes)).map(drop),
                    None => Ok(()),
                });
                called.map_err(|e| {
                    raised = Some(e);
                    Error::Cancelled { what: "convert" }
                })
            })
        })
    });
    match (result, raised) {
        (Err(_), Some(e)) => Err(e),
        (result, _) => result.or_raise(),
    }
}
