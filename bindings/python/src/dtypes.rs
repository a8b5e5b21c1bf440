//! [`DType`] ↔ numpy dtype.
//!
//! Descriptors are built once per process and cached. bfloat16 and the float8 types
//! come from the `ml_dtypes` package when it can be imported; without it, reading or
//! writing them fails with an error that says to install it.

use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTypeMethods;
use tensorwire::{DType, Error};

use crate::errors::ResultExt;

const N: usize = DType::ALL.len();

static DESCRS: [PyOnceLock<Py<PyArrayDescr>>; N] = [const { PyOnceLock::new() }; N];

/// How numpy spells the type: a type string, or an `ml_dtypes` attribute.
enum Spec {
    Numpy(&'static str),
    MlDtypes(&'static str),
}

fn spec(dtype: DType) -> Result<Spec, Error> {
    Ok(match dtype {
        DType::F64 => Spec::Numpy("<f8"),
        DType::F32 => Spec::Numpy("<f4"),
        DType::F16 => Spec::Numpy("<f2"),
        DType::I64 => Spec::Numpy("<i8"),
        DType::I32 => Spec::Numpy("<i4"),
        DType::I16 => Spec::Numpy("<i2"),
        DType::I8 | DType::QInt8 => Spec::Numpy("i1"),
        DType::U64 => Spec::Numpy("<u8"),
        DType::U32 => Spec::Numpy("<u4"),
        DType::U16 => Spec::Numpy("<u2"),
        DType::U8 | DType::QUInt8 => Spec::Numpy("u1"),
        DType::Bool => Spec::Numpy("?"),
        DType::Complex64 => Spec::Numpy("<c8"),
        DType::Complex128 => Spec::Numpy("<c16"),
        DType::BF16 => Spec::MlDtypes("bfloat16"),
        DType::F8E4M3Fn => Spec::MlDtypes("float8_e4m3fn"),
        DType::F8E5M2 => Spec::MlDtypes("float8_e5m2"),
        DType::F8E4M3Fnuz => Spec::MlDtypes("float8_e4m3fnuz"),
        DType::F8E5M2Fnuz => Spec::MlDtypes("float8_e5m2fnuz"),
        other => {
            return Err(Error::unsupported(format!(
                "{other} tensors have no numpy dtype (packed sub-byte elements)"
            )))
        }
    })
}

/// True when numpy has `dtype` built in (no `ml_dtypes` needed), so
/// `torch.from_numpy` accepts the typed array as it is.
pub fn numpy_builtin(dtype: DType) -> bool {
    matches!(spec(dtype), Ok(Spec::Numpy(_)))
}

fn build<'py>(py: Python<'py>, dtype: DType) -> PyResult<Bound<'py, PyArrayDescr>> {
    match spec(dtype).or_raise()? {
        Spec::Numpy(s) => PyArrayDescr::new(py, s),
        Spec::MlDtypes(attr) => {
            let module = py.import("ml_dtypes").map_err(|_| {
                crate::errors::to_pyerr(Error::unsupported(format!(
                    "{dtype} tensors need the ml_dtypes package for their numpy dtype: \
                     pip install ml_dtypes"
                )))
            })?;
            PyArrayDescr::new(py, module.getattr(attr)?)
        }
    }
}

/// The numpy descriptor of `dtype` (cached; failures, such as a missing `ml_dtypes`,
/// are not cached).
pub fn descr(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    let index = DType::ALL
        .iter()
        .position(|&d| d == dtype)
        .ok_or_else(|| crate::errors::to_pyerr(Error::unsupported(dtype.to_string())))?;
    DESCRS[index]
        .get_or_try_init(py, || build(py, dtype).map(Bound::unbind))
        .map(|d| d.bind(py).clone())
}

/// The numpy-style name ztensor reports in metadata (`float32`, `bfloat16`, `bool`).
pub fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "float64",
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I16 => "int16",
        DType::I8 => "int8",
        DType::U64 => "uint64",
        DType::U32 => "uint32",
        DType::U16 => "uint16",
        DType::U8 => "uint8",
        DType::Bool => "bool",
        DType::F8E4M3Fn => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E4M3Fnuz => "float8_e4m3fnuz",
        DType::F8E5M2Fnuz => "float8_e5m2fnuz",
        DType::Complex64 => "complex64",
        DType::Complex128 => "complex128",
        other => other.name(),
    }
}

/// A numpy dtype as a tensorwire dtype, and whether its bytes are big-endian (and so
/// must be swapped before writing).
pub fn from_numpy(descr: &Bound<'_, PyArrayDescr>) -> PyResult<(DType, bool)> {
    let size = descr.itemsize();
    let kind = descr.kind();
    // ml_dtypes types: kind 'V' (float8_e5m2 reports 'f'), recognised by name.
    let ml = if matches!(kind, b'V' | b'f') && size <= 2 && descr.names().is_none() {
        match descr.typeobj().name()?.to_cow()?.as_ref() {
            "bfloat16" if size == 2 => Some(DType::BF16),
            "float8_e4m3fn" if size == 1 => Some(DType::F8E4M3Fn),
            "float8_e5m2" if size == 1 => Some(DType::F8E5M2),
            "float8_e4m3fnuz" if size == 1 => Some(DType::F8E4M3Fnuz),
            "float8_e5m2fnuz" if size == 1 => Some(DType::F8E5M2Fnuz),
            _ => None,
        }
    } else {
        None
    };
    let dtype = ml.or(match (kind, size) {
        (b'f', 8) => Some(DType::F64),
        (b'f', 4) => Some(DType::F32),
        (b'f', 2) => Some(DType::F16),
        (b'i', 8) => Some(DType::I64),
        (b'i', 4) => Some(DType::I32),
        (b'i', 2) => Some(DType::I16),
        (b'i', 1) => Some(DType::I8),
        (b'u', 8) => Some(DType::U64),
        (b'u', 4) => Some(DType::U32),
        (b'u', 2) => Some(DType::U16),
        (b'u', 1) => Some(DType::U8),
        (b'b', 1) => Some(DType::Bool),
        (b'c', 8) => Some(DType::Complex64),
        (b'c', 16) => Some(DType::Complex128),
        _ => None,
    });
    let Some(dtype) = dtype else {
        return Err(crate::errors::to_pyerr(Error::unsupported(format!(
            "numpy dtype {} is not supported by tensorwire",
            descr.str()?
        ))));
    };
    let big_endian = match descr.byteorder() {
        b'>' => true,
        b'=' => cfg!(target_endian = "big"),
        _ => false,
    };
    Ok((dtype, big_endian && size > 1))
}
