//! The Python exception hierarchy and the one conversion from [`tensorwire::Error`].
//!
//! ```text
//! TensorwireError(Exception)
//! ├── TensorNotFoundError(TensorwireError, KeyError)
//! ├── InvalidArgumentError(TensorwireError, ValueError)
//! ├── UnsupportedError
//! └── FormatError                      the file is not a valid tensor file
//!     ├── BadMagicError                not a recognised format
//!     ├── TruncatedError               the file ends early
//!     ├── MalformedError               inconsistent metadata (bounds, sizes, overlap…)
//!     ├── LimitExceededError           a declared size is above a parser limit
//!     ├── ChecksumError                a stored digest does not match
//!     └── DecodeError                  a compressed blob does not decode
//! ```
//!
//! Operating-system errors become the matching `OSError` subclass
//! (`FileNotFoundError`, …) with the file name set.

use pyo3::exceptions::{PyException, PyKeyError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::{create_exception, intern};
use tensorwire::Error;

create_exception!(
    tensorwire,
    TensorwireError,
    PyException,
    "Base class of the errors tensorwire raises (I/O errors are OSError)."
);
create_exception!(
    tensorwire,
    UnsupportedError,
    TensorwireError,
    "The operation is valid but not supported for this tensor (for example reading a sparse tensor as one array, or bfloat16 without ml_dtypes)."
);
create_exception!(
    tensorwire,
    FormatError,
    TensorwireError,
    "The file is not a valid tensor file."
);
create_exception!(
    tensorwire,
    BadMagicError,
    FormatError,
    "The file does not start (or end) with the magic bytes of a supported format."
);
create_exception!(
    tensorwire,
    TruncatedError,
    FormatError,
    "The file ends before a structure it declares."
);
create_exception!(
    tensorwire,
    MalformedError,
    FormatError,
    "The file's metadata is inconsistent (out-of-bounds or overlapping ranges, sizes that do not match shapes, misalignment)."
);
create_exception!(
    tensorwire,
    LimitExceededError,
    FormatError,
    "A size or count declared by the file is above a parser limit."
);
create_exception!(
    tensorwire,
    ChecksumError,
    FormatError,
    "A stored crc32c or sha256 digest does not match the tensor's bytes."
);
create_exception!(
    tensorwire,
    DecodeError,
    FormatError,
    "A compressed tensor could not be decoded."
);

static NOT_FOUND: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// A subclass of both `TensorwireError` and a builtin exception, made with `type()`
/// because `create_exception!` takes a single base.
fn dual_base<'py>(
    py: Python<'py>,
    name: &str,
    builtin: Bound<'py, PyType>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let bases = PyTuple::new(py, [py.get_type::<TensorwireError>(), builtin])?;
    let dict = PyDict::new(py);
    dict.set_item(intern!(py, "__module__"), "tensorwire")?;
    dict.set_item(intern!(py, "__doc__"), doc)?;
    let ty = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

/// `TensorNotFoundError`: no tensor of that name (also a `KeyError`).
pub fn not_found_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    NOT_FOUND
        .get_or_try_init(py, || {
            dual_base(
                py,
                "TensorNotFoundError",
                py.get_type::<PyKeyError>(),
                "No tensor of that name (also a KeyError).",
            )
        })
        .map(|t| t.bind(py))
}

/// `InvalidArgumentError`: a bad argument value (also a `ValueError`).
pub fn invalid_argument_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INVALID_ARGUMENT
        .get_or_try_init(py, || {
            dual_base(
                py,
                "InvalidArgumentError",
                py.get_type::<PyValueError>(),
                "An argument has a wrong value: a dtype or shape that does not match, a duplicate name, a closed reader or writer (also a ValueError).",
            )
        })
        .map(|t| t.bind(py))
}

fn from_type(ty: PyResult<&Bound<'_, PyType>>, msg: String) -> PyErr {
    match ty {
        Ok(ty) => PyErr::from_type(ty.clone(), msg),
        Err(e) => e,
    }
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
        Error::NotFound { .. } => Python::attach(|py| from_type(not_found_type(py), msg)),
        Error::InvalidArgument { .. } | Error::Duplicate { .. } => {
            Python::attach(|py| from_type(invalid_argument_type(py), msg))
        }
        Error::BadMagic { .. } | Error::UnknownFormat { .. } => BadMagicError::new_err(msg),
        Error::Truncated { .. } => TruncatedError::new_err(msg),
        Error::LimitExceeded { .. } => LimitExceededError::new_err(msg),
        Error::DigestMismatch { .. } => ChecksumError::new_err(msg),
        Error::Decode { .. } => DecodeError::new_err(msg),
        Error::Unsupported { .. } => UnsupportedError::new_err(msg),
        // Malformed, OutOfBounds, Overlap, Misaligned, SizeMismatch, Overflow,
        // UnknownDType and any variant added later: the file is inconsistent.
        _ => MalformedError::new_err(msg),
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
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("BadMagicError", py.get_type::<BadMagicError>())?;
    m.add("TruncatedError", py.get_type::<TruncatedError>())?;
    m.add("MalformedError", py.get_type::<MalformedError>())?;
    m.add("LimitExceededError", py.get_type::<LimitExceededError>())?;
    m.add("ChecksumError", py.get_type::<ChecksumError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("TensorNotFoundError", not_found_type(py)?)?;
    m.add("InvalidArgumentError", invalid_argument_type(py)?)?;
    Ok(())
}
