//! Attribute values ↔ Python objects.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;
use tensorwire::{Error, Value};

use crate::errors::ResultExt;

/// Deepest nesting accepted when converting Python attributes.
const MAX_DEPTH: usize = 64;

/// A metadata value as a Python object.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        // Through i64 when it fits: an i128 takes the slow byte-array path.
        Value::Int(i) => match i64::try_from(*i) {
            Ok(small) => small.into_bound_py_any(py)?,
            Err(_) => i.into_bound_py_any(py)?,
        },
        // Any width: `int.from_bytes(b, "little", signed=True)`.
        Value::BigInt(i) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item("signed", true)?;
            py.get_type::<PyInt>().call_method(
                "from_bytes",
                (PyBytes::new(py, i.to_le_bytes()), "little"),
                Some(&kwargs),
            )?
        }
        Value::Float(x) => PyFloat::new(py, *x).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::List(items) => {
            // Built at its length (appending one by one regrows the list).
            let items = items
                .iter()
                .map(|v| to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Map(entries) => {
            let dict = PyDict::new(py);
            for (k, v) in entries {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// An attribute map converted to Python objects once, handed out as new containers
/// each time: the caller may change what it gets without changing what the next
/// caller gets.
pub struct FrozenAttributes {
    entries: Vec<(Py<PyString>, Py<PyAny>, Copying)>,
}

/// How an attribute value is copied.
enum Copying {
    /// Immutable (str, int, float, bytes, None, bool): shared.
    Leaf,
    /// A list of leaves: one slice copy.
    FlatList,
    /// Holds lists or dicts: copied all the way down.
    Nested,
}

impl FrozenAttributes {
    /// Converts `map` (see [`to_py`]).
    pub fn new(py: Python<'_>, map: &BTreeMap<String, Value>) -> PyResult<FrozenAttributes> {
        let entries = map
            .iter()
            .map(|(key, value)| {
                let copying = match value {
                    Value::List(items)
                        if items
                            .iter()
                            .all(|v| !matches!(v, Value::List(_) | Value::Map(_))) =>
                    {
                        Copying::FlatList
                    }
                    Value::List(_) | Value::Map(_) => Copying::Nested,
                    _ => Copying::Leaf,
                };
                Ok((
                    PyString::new(py, key).unbind(),
                    to_py(py, value)?.unbind(),
                    copying,
                ))
            })
            .collect::<PyResult<_>>()?;
        Ok(FrozenAttributes { entries })
    }

    /// A new dict of the attributes, with new lists and dicts.
    pub fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value, copying) in &self.entries {
            let value = value.bind(py);
            let copy = match copying {
                Copying::Leaf => value.clone(),
                Copying::FlatList => {
                    let list = value.cast::<PyList>()?;
                    list.get_slice(0, list.len()).into_any()
                }
                Copying::Nested => fresh_containers(value)?,
            };
            dict.set_item(key.bind(py), copy)?;
        }
        Ok(dict)
    }
}

/// `value` with its dicts and lists made anew, all the way down, and the rest
/// (immutable) shared.
fn fresh_containers<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    if let Ok(list) = value.cast::<PyList>() {
        let items = list
            .iter()
            .map(|item| fresh_containers(&item))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyList::new(py, items)?.into_any());
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let copy = PyDict::new(py);
        for (k, v) in dict.iter() {
            copy.set_item(k, fresh_containers(&v)?)?;
        }
        return Ok(copy.into_any());
    }
    Ok(value.clone())
}

/// An attribute map as a Python dict (`None` stays `None`).
pub fn map_to_py<'py>(
    py: Python<'py>,
    map: Option<&BTreeMap<String, Value>>,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(map) = map else {
        return Ok(py.None().into_bound(py));
    };
    let dict = PyDict::new(py);
    for (k, v) in map {
        dict.set_item(k, to_py(py, v)?)?;
    }
    Ok(dict.into_any())
}

fn from_py_at(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(Error::LimitExceeded {
            what: "attribute nesting depth",
            limit: MAX_DEPTH as u64,
            found: depth as u64,
        })
        .or_raise();
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        // Beyond i128 is beyond CBOR too; the writers name the range for the rest.
        return match obj.extract::<i128>() {
            Ok(i) => Ok(Value::Int(i)),
            // Named by its size: printing a huge int is slow, and Python refuses
            // past 4300 digits.
            Err(_) => Err(Error::invalid(format!(
                "an integer of {} bits is outside CBOR's 64-bit integers; store it as a float or a string",
                obj.call_method0("bit_length")?
            )))
            .or_raise(),
        };
    }
    if let Ok(x) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(x.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_cow()?.into_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let items = obj
            .try_iter()?
            .map(|item| from_py_at(&item?, depth + 1))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(Value::List(items));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key: String = k.extract().map_err(|_| {
                crate::errors::to_pyerr(Error::invalid("attribute keys must be strings"))
            })?;
            entries.push((key, from_py_at(&v, depth + 1)?));
        }
        return Ok(Value::Map(entries));
    }
    // numpy scalars and other numbers that convert losslessly; numpy.bool_ first (it
    // would otherwise pass as the float 1.0).
    if let Ok(b) = obj.extract::<bool>() {
        return Ok(Value::Bool(b));
    }
    if let Ok(i) = obj.extract::<i128>() {
        return Ok(Value::Int(i));
    }
    if let Ok(x) = obj.extract::<f64>() {
        return Ok(Value::Float(x));
    }
    Err(Error::invalid(format!(
        "attribute values must be None, bool, int, float, str, bytes, list or dict, not {}",
        obj.get_type().name()?
    )))
    .or_raise()
}

/// A Python dict of attributes (or `None`) as an attribute map.
pub fn map_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<BTreeMap<String, Value>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| crate::errors::to_pyerr(Error::invalid("attributes must be a dict")))?;
    let mut map = BTreeMap::new();
    for (k, v) in dict.iter() {
        let key: String = k.extract().map_err(|_| {
            crate::errors::to_pyerr(Error::invalid("attribute keys must be strings"))
        })?;
        map.insert(key, from_py_at(&v, 1)?);
    }
    Ok(Some(map))
}

/// `secs` seconds as a `Duration`, for an argument that must be positive seconds
/// (a timeout): `None` for zero, a negative number, NaN or more than a `Duration`
/// holds (about 584 billion years); the caller says which argument it was.
pub fn positive_seconds(secs: f64) -> Option<std::time::Duration> {
    (secs > 0.0)
        .then(|| std::time::Duration::try_from_secs_f64(secs).ok())
        .flatten()
}
