//! The native half of `tensorwire.formats`: writing safetensors files from numpy
//! arrays (and torch tensors, which Python hands over as their bytes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tensorwire::formats::safetensors::{SafetensorsWriter, StDType};
use tensorwire::{DType, Shape};

use crate::arrays::{self, prepare};
use crate::errors::ResultExt;

/// One tensor to write: its name, the array, and for raw bytes (torch tensors, as a
/// `uint8` array) the dtype name and shape they hold: a tensorwire dtype, or
/// `safetensors:<TYPE>` for a type only safetensors names (`F8_E8M0`, `F4`).
type Entry<'py> = (String, Bound<'py, PyAny>, Option<String>, Option<Vec<u64>>);

/// Writes `tensors` as a safetensors file at `path` (under a temporary name, renamed
/// into place once complete) and returns its size, or, with no `path`, returns the
/// file as `bytes`. The bytes are those of the `safetensors` package's `save_file`.
/// Arrays are read where they are (C-contiguous little-endian ones are not copied),
/// without the GIL while the file is written.
#[pyfunction]
#[pyo3(signature = (tensors, path = None, metadata = None))]
pub fn safetensors_save<'py>(
    py: Python<'py>,
    tensors: Vec<Entry<'py>>,
    path: Option<PathBuf>,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut writer = SafetensorsWriter::new();
    if let Some(metadata) = metadata {
        writer.set_metadata(metadata);
    }
    for (name, data, dtype, shape) in tensors {
        let prepared = prepare(&data)?;
        let bytes = arrays::lend(&prepared.array)?;
        match (dtype, shape) {
            (Some(dtype), Some(shape)) => match dtype.strip_prefix("safetensors:") {
                Some(st) => {
                    let st = StDType::from_name(st).ok_or_else(|| {
                        PyValueError::new_err(format!("safetensors has no {st} type"))
                    })?;
                    writer.add_typed(&name, st, &shape, bytes).or_raise()?;
                }
                None => {
                    let dtype = dtype.parse::<DType>().or_raise()?;
                    let shape = Shape::new(shape).or_raise()?;
                    writer.add(&name, dtype, &shape, bytes).or_raise()?;
                }
            },
            _ => {
                let shape = prepared.shape()?;
                writer
                    .add(&name, prepared.dtype, &shape, bytes)
                    .or_raise()?;
            }
        }
    }
    match path {
        Some(path) => {
            let written = py.detach(|| writer.write_file(&path)).or_raise()?;
            Ok(written.into_pyobject(py)?.into_any())
        }
        None => {
            let mut file = Vec::new();
            py.detach(|| writer.write(&mut file)).or_raise()?;
            Ok(PyBytes::new(py, &file).into_any())
        }
    }
}
