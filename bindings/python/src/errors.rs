//! The Python exception hierarchy and the one conversion from [`tensorwire::Error`].
//!
//! ```text
//! TensorwireError(RuntimeError)    ztensor raises RuntimeError for these faults
//! ├── TensorNotFoundError(TensorwireError, KeyError)
//! ├── InvalidArgumentError(TensorwireError, ValueError)
//! │   └── ClosedError(InvalidArgumentError, RuntimeError)   a closed reader, cache or
//! │                                    segment (tenso raises RuntimeError for these)
//! ├── UnsupportedError(TensorwireError, ValueError)
//! └── FormatError(TensorwireError, ValueError)   the data is not a valid file or packet
//!     ├── BadMagicError                not a recognised format
//!     ├── TruncatedError               the file ends early
//!     ├── MalformedError               inconsistent metadata (bounds, sizes, overlap…)
//!     ├── LimitExceededError           a declared size is above a parser limit
//!     ├── ChecksumError                a stored digest does not match
//!     ├── DecodeError                  a compressed blob does not decode
//!     └── UnsafePickleError            a checkpoint's pickle names a refused global
//!                                      (also a pickle.UnpicklingError, as torch raises)
//! ```
//!
//! Operating-system errors become the matching `OSError` subclass
//! (`FileNotFoundError`, …) with the file name set; a lock wait that runs out is a
//! `TimeoutError`, a lock left unusable by a process that died holding it an
//! `OSError` with `errno.ENOTRECOVERABLE`, and a value a shared-memory cache cannot
//! hold a `MemoryError`.

use pyo3::exceptions::{
    PyInterruptedError, PyKeyError, PyMemoryError, PyOSError, PyRuntimeError, PyTimeoutError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::{create_exception, intern};
use tensorwire::Error;

create_exception!(
    tensorwire,
    TensorwireError,
    PyRuntimeError,
    "Base class of the errors tensorwire raises (I/O errors are OSError); a RuntimeError, as ztensor raises for the same faults."
);
/// The exception classes made at run time with `type()`: those with two bases
/// (`create_exception!` takes one) and the `FormatError` family below one of them.
struct Classes {
    not_found: Py<PyType>,
    invalid_argument: Py<PyType>,
    unsupported: Py<PyType>,
    format: Py<PyType>,
    bad_magic: Py<PyType>,
    truncated: Py<PyType>,
    malformed: Py<PyType>,
    limit_exceeded: Py<PyType>,
    checksum: Py<PyType>,
    decode: Py<PyType>,
    unsafe_pickle: Py<PyType>,
    duplicate_name: Py<PyType>,
    closed: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// `class name(*bases)` in module `tensorwire`, with a docstring.
fn make_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    make_class_in(py, "tensorwire", name, bases, doc)
}

/// `class name(*bases)` in Python module `module`, with a docstring (exception
/// classes with more than one base, which `create_exception!` cannot make).
pub(crate) fn make_class_in<'py>(
    py: Python<'py>,
    module: &str,
    name: &str,
    bases: &[Bound<'py, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let bases = PyTuple::new(py, bases)?;
    let dict = PyDict::new(py);
    dict.set_item(intern!(py, "__module__"), module)?;
    dict.set_item(intern!(py, "__doc__"), doc)?;
    let ty = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let base = py.get_type::<TensorwireError>();
        let format = make_class(
            py,
            "FormatError",
            &[base.clone(), py.get_type::<PyValueError>()],
            "The file or packet is not valid (also a ValueError).",
        )?;
        let sub = |name: &str, doc: &str| make_class(py, name, &[format.bind(py).clone()], doc);
        let invalid_argument = make_class(
            py,
            "InvalidArgumentError",
            &[base.clone(), py.get_type::<PyValueError>()],
            "An argument has a wrong value: a dtype or shape that does not match, a duplicate name, a closed reader or writer (also a ValueError).",
        )?;
        let malformed = sub(
            "MalformedError",
            "The metadata is inconsistent (out-of-bounds or overlapping ranges, sizes that do not match shapes, misalignment).",
        )?;
        let closed = make_class(
            py,
            "ClosedError",
            &[
                invalid_argument.bind(py).clone(),
                py.get_type::<pyo3::exceptions::PyRuntimeError>(),
            ],
            "A reader, cache or shared-memory segment used after close() (an InvalidArgumentError, and a RuntimeError as tenso raises for a closed cache).",
        )?;
        Ok(Classes {
            closed,
            unsupported: make_class(
                py,
                "UnsupportedError",
                &[base.clone(), py.get_type::<PyValueError>()],
                "The operation is valid but not supported for this tensor or file (for example reading a sparse tensor as one array, a dtype the format has no code for, or bfloat16 without ml_dtypes); also a ValueError, as ztensor and tenso raise for the same input.",
            )?,
            not_found: make_class(
                py,
                "TensorNotFoundError",
                &[base.clone(), py.get_type::<PyKeyError>()],
                "No tensor of that name (also a KeyError).",
            )?,
            duplicate_name: make_class(
                py,
                "DuplicateNameError",
                &[malformed.bind(py).clone(), invalid_argument.bind(py).clone()],
                "A tensor name given twice: in a file (so a MalformedError) or to a writer (so an InvalidArgumentError).",
            )?,
            invalid_argument,
            malformed,
            bad_magic: sub(
                "BadMagicError",
                "The data does not start (or end) with the magic bytes of a supported format.",
            )?,
            truncated: sub(
                "TruncatedError",
                "The data ends before a structure it declares.",
            )?,
            limit_exceeded: sub(
                "LimitExceededError",
                "A size or count the data declares is above a parser limit.",
            )?,
            checksum: sub(
                "ChecksumError",
                "A stored digest (crc32c, sha256, XXH3) does not match the bytes.",
            )?,
            decode: sub("DecodeError", "A compressed tensor could not be decoded.")?,
            unsafe_pickle: make_class(
                py,
                "UnsafePickleError",
                &[
                    format.bind(py).clone(),
                    py.import("pickle")?
                        .getattr("UnpicklingError")?
                        .cast_into::<PyType>()?,
                ],
                "A checkpoint's pickle names a global outside the allowlist (loading it could run code); nothing from it was run. Also a pickle.UnpicklingError, as torch.load(weights_only=True) raises.",
            )?,
            format,
        })
    })
}

/// The error for `what` used after it was closed (`"the reader"`, `"cache 'x'"`):
/// a `ClosedError`.
pub fn closed_error(what: &str) -> PyErr {
    raise(|c| &c.closed, format!("{what} is closed"))
}

/// An exception of one of the run-time classes.
fn raise(pick: fn(&Classes) -> &Py<PyType>, msg: String) -> PyErr {
    Python::attach(|py| match classes(py) {
        Ok(c) => PyErr::from_type(pick(c).bind(py).clone(), msg),
        Err(e) => e,
    })
}

/// Converts a tensorwire error into the matching Python exception. This is the only
/// place errors are translated; call sites use [`ResultExt::or_raise`].
pub fn to_pyerr(err: Error) -> PyErr {
    let msg = err.to_string();
    let path = match &err {
        Error::WithPath { path, .. } => Some(path.clone()),
        _ => None,
    };
    match err.root() {
        Error::Io(io) => {
            if io.kind() == std::io::ErrorKind::OutOfMemory {
                return PyMemoryError::new_err(msg);
            }
            match (io.raw_os_error(), path) {
                // OSError(errno, strerror, filename) picks the subclass from errno.
                (Some(code), Some(path)) => {
                    PyOSError::new_err((code, io.to_string(), path.to_string_lossy().into_owned()))
                }
                (Some(code), None) => PyOSError::new_err((code, io.to_string())),
                (None, _) => PyOSError::new_err(msg),
            }
        }
        Error::NotFound { .. } => raise(|c| &c.not_found, msg),
        Error::Timeout { .. } => PyTimeoutError::new_err(msg),
        // (Where Python code stopped the work, its own exception is raised instead.)
        Error::Cancelled { .. } => PyInterruptedError::new_err(msg),
        Error::LockUnrecoverable { .. } => PyOSError::new_err((libc::ENOTRECOVERABLE, msg)),
        Error::NoSpace { .. } => PyMemoryError::new_err(msg),
        Error::InvalidArgument { .. } => raise(|c| &c.invalid_argument, msg),
        Error::Duplicate { .. } => raise(|c| &c.duplicate_name, msg),
        Error::BadMagic { .. } | Error::UnknownFormat { .. } => raise(|c| &c.bad_magic, msg),
        Error::Truncated { .. } => raise(|c| &c.truncated, msg),
        Error::LimitExceeded { .. } => raise(|c| &c.limit_exceeded, msg),
        Error::DigestMismatch { .. } => raise(|c| &c.checksum, msg),
        Error::Decode { .. } => raise(|c| &c.decode, msg),
        Error::RefusedGlobal { .. } => raise(|c| &c.unsafe_pickle, msg),
        Error::Unsupported { .. } => raise(|c| &c.unsupported, msg),
        // Malformed, OutOfBounds, Overlap, Misaligned, SizeMismatch, Overflow,
        // UnknownDType and any variant added later: the data is inconsistent.
        _ => raise(|c| &c.malformed, msg),
    }
}

/// `result.or_raise()`: a tensorwire result as a Python result.
pub trait ResultExt<T> {
    /// Converts the error with [`to_pyerr`].
    fn or_raise(self) -> PyResult<T>;
}

impl<T> ResultExt<T> for Result<T, Error> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

/// Registers the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TensorwireError", py.get_type::<TensorwireError>())?;
    let c = classes(py)?;
    for (name, ty) in [
        ("FormatError", &c.format),
        ("BadMagicError", &c.bad_magic),
        ("TruncatedError", &c.truncated),
        ("MalformedError", &c.malformed),
        ("LimitExceededError", &c.limit_exceeded),
        ("ChecksumError", &c.checksum),
        ("DecodeError", &c.decode),
        ("UnsafePickleError", &c.unsafe_pickle),
        ("TensorNotFoundError", &c.not_found),
        ("InvalidArgumentError", &c.invalid_argument),
        ("UnsupportedError", &c.unsupported),
        ("DuplicateNameError", &c.duplicate_name),
        ("ClosedError", &c.closed),
    ] {
        m.add(name, ty.bind(py))?;
    }
    Ok(())
}
