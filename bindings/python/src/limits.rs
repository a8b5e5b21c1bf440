//! Parser limits from Python: `limits={"max_depth": 100}` on the readers.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tensorwire::{Error, Limits};

use crate::errors::to_pyerr;

/// The default limits, `{name: int}`.
#[pyfunction]
pub fn default_limits(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let defaults = Limits::default();
    let dict = PyDict::new(py);
    for name in Limits::NAMES {
        dict.set_item(name, defaults.get(name))?;
    }
    Ok(dict)
}

/// [`Limits`] from a `{name: int}` mapping (`None`: the defaults); names left out keep
/// their defaults. An unknown name or a value that is not a non-negative int is an
/// `InvalidArgumentError`, so a misspelt limit never goes unnoticed.
pub fn from_py(limits: Option<&Bound<'_, PyAny>>) -> PyResult<Limits> {
    let mut out = Limits::default();
    let Some(limits) = limits.filter(|l| !l.is_none()) else {
        return Ok(out);
    };
    let dict = limits.cast::<PyDict>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "limits must be a dict of {{name: int}}, not {}",
            limits
                .get_type()
                .name()
                .map_or("?".into(), |n| n.to_string())
        ))
    })?;
    for (key, value) in dict.iter() {
        let name = key
            .cast::<PyString>()
            .map_err(|_| invalid(format!("limit names are str, not {key:?}")))?
            .to_cow()?;
        // A bool is an int to Python, but `True` as a limit is a slip, not a 1.
        let v = match value.is_instance_of::<pyo3::types::PyBool>() {
            false => value.extract::<u64>().ok(),
            true => None,
        };
        let Some(v) = v else {
            return Err(invalid(format!(
                "limit {name} must be an int from 0 to 2**64-1, not {value}"
            )));
        };
        out.set(&name, v).map_err(to_pyerr)?;
    }
    Ok(out)
}

fn invalid(reason: String) -> PyErr {
    to_pyerr(Error::invalid(reason))
}
