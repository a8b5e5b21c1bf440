//! The native half of `tensorwire.ipc`: the socket server and client of
//! `tensorwire-cuda-ipc`, and the conversion between Python values and payloads.
//!
//! Python walks its values (tensors, modules, containers) and hands over a *tree* of
//! plain values whose tensor leaves are [`TensorRef`]s and whose modules are
//! [`Tagged`] values, plus tables of tensors and storages ([`ipc_encode`]). Received
//! values come back the same way ([`IpcReceived::decode`]): CPU storages as writable
//! uint8 numpy arrays over the sender's memfd (zero-copy; the array's `base` holds the
//! map), CUDA storages as [`CudaStorage`] to open on a stream.
//!
//! Not in scope: which Python objects may be shared and how modules are rebuilt
//! (`tensorwire/ipc.py` decides).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use numpy::PyArrayDescr;
use pyo3::exceptions::{
    PyConnectionError, PyPermissionError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;
use tensorwire::ipc::cuda::{self, Opened, ProducerEvent};
use tensorwire::ipc::schema::{
    Concurrency, EndpointInfo, EndpointOptions, Execution, Framework, Location, Node, ObjectInfo,
    Payload, ServerInfo, StorageDesc, TaskInfo, TaskState, TensorDesc,
};
use tensorwire::ipc::service::Endpoint;
use tensorwire::ipc::{
    Client, ClientOptions, Incoming, IpcError, Outgoing, OutgoingBuilder, ReceivedStorage,
    RemoteKind, Server, ServerConfig,
};
use tensorwire::{DType, Error};

use crate::arrays;
use crate::errors::TensorwireError;
use crate::shm::segment_array;

// ------------------------------------------------------------------ errors

struct Classes {
    base: Py<PyType>,
    server_gone: Py<PyType>,
    remote: Py<PyType>,
    stale: Py<PyType>,
    refused: Py<PyType>,
    protocol: Py<PyType>,
    timeout: Py<PyType>,
    cuda_unavailable: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn make_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    crate::errors::make_class_in(py, "tensorwire.ipc", name, bases, doc)
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let base = make_class(
            py,
            "IpcError",
            &[py.get_type::<TensorwireError>()],
            "Base class of the errors of tensorwire.ipc.",
        )?;
        let b = || base.bind(py).clone();
        Ok(Classes {
            server_gone: make_class(
                py,
                "ServerGoneError",
                &[b(), py.get_type::<PyConnectionError>()],
                "No server answers at the socket, or it went away mid-request (also a ConnectionError). `server_id` names the server when known.",
            )?,
            remote: make_class(
                py,
                "RemoteError",
                &[b()],
                "The server answered with an error. `kind` says which: 'UnknownEndpoint', 'EndpointFailed', 'UnknownObject', 'UnknownTask', 'Cancelled', 'Busy', 'BadRequest', 'Unshareable', 'ShuttingDown', 'Internal'.",
            )?,
            stale: make_class(
                py,
                "StaleHandleError",
                &[b()],
                "A handle whose object its server no longer holds, or whose server was replaced. `object_id` and `server_id` name it.",
            )?,
            refused: make_class(
                py,
                "PeerRefusedError",
                &[b(), py.get_type::<PyPermissionError>()],
                "The server refused this process by its credentials (also a PermissionError).",
            )?,
            protocol: make_class(
                py,
                "ProtocolError",
                &[b(), py.get_type::<PyValueError>()],
                "A malformed frame or message (also a ValueError).",
            )?,
            timeout: make_class(
                py,
                "IpcTimeoutError",
                &[b(), py.get_type::<PyTimeoutError>()],
                "A request ran out of time (also a TimeoutError).",
            )?,
            cuda_unavailable: make_class(
                py,
                "CudaUnavailableError",
                &[b(), py.get_type::<PyRuntimeError>()],
                "CUDA cannot be used in this process (no driver or no device; also a RuntimeError).",
            )?,
            base,
        })
    })
}

fn kind_name(kind: RemoteKind) -> String {
    format!("{kind:?}")
}

/// Converts an IPC error into the matching Python exception (with `kind`,
/// `server_id`, `object_id` attributes where they apply).
fn to_pyerr(py: Python<'_>, err: IpcError) -> PyErr {
    let c = match classes(py) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let msg = err.to_string();
    let (class, attrs): (&Py<PyType>, Vec<(&str, Option<String>)>) = match err {
        IpcError::ServerGone { server_id, .. } => (&c.server_gone, vec![("server_id", server_id)]),
        IpcError::Remote {
            kind: RemoteKind::Refused,
            ..
        }
        | IpcError::PeerRefused { .. } => (&c.refused, vec![]),
        IpcError::Remote { kind, .. } => (&c.remote, vec![("kind", Some(kind_name(kind)))]),
        IpcError::StaleHandle {
            object_id,
            server_id,
            ..
        } => (
            &c.stale,
            vec![
                ("object_id", Some(object_id)),
                ("server_id", Some(server_id)),
            ],
        ),
        IpcError::Protocol { .. } | IpcError::FrameTooLarge { .. } | IpcError::Version { .. } => {
            (&c.protocol, vec![])
        }
        IpcError::Timeout { .. } => (&c.timeout, vec![]),
        IpcError::CudaUnavailable { .. } => (&c.cuda_unavailable, vec![]),
        IpcError::Tensor(e) => return crate::errors::to_pyerr(e),
        IpcError::Io(e) => return PyErr::from(e),
        _ => (&c.base, vec![]),
    };
    let err = PyErr::from_type(class.bind(py).clone(), msg);
    for (name, value) in attrs {
        let _ = err.value(py).setattr(name, value);
    }
    err
}

trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, IpcError> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}

/// A Python exception raised by an endpoint, as the error its client sees:
/// `"ExceptionType: message"`.
fn endpoint_failure(py: Python<'_>, err: &PyErr) -> IpcError {
    let name = err
        .get_type(py)
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    IpcError::remote(
        RemoteKind::EndpointFailed,
        format!("{name}: {}", err.value(py)),
    )
}

// ------------------------------------------------------------------ value trees

/// A tensor leaf of a value tree: tensor number `index` of the payload.
#[pyclass(frozen, module = "tensorwire._native", name = "TensorRef")]
pub struct TensorRef {
    #[pyo3(get)]
    index: u32,
}

#[pymethods]
impl TensorRef {
    #[new]
    fn new(index: u32) -> Self {
        TensorRef { index }
    }

    fn __repr__(&self) -> String {
        format!("TensorRef({})", self.index)
    }
}

/// A value with a meaning given by its tag (a module's structure).
#[pyclass(frozen, module = "tensorwire._native", name = "Tagged")]
pub struct Tagged {
    #[pyo3(get)]
    tag: String,
    #[pyo3(get)]
    value: Py<PyAny>,
}

#[pymethods]
impl Tagged {
    #[new]
    fn new(tag: String, value: Py<PyAny>) -> Self {
        Tagged { tag, value }
    }

    fn __repr__(&self) -> String {
        format!("Tagged({:?}, …)", self.tag)
    }
}

/// Deepest Python value tree accepted (the decoder's own cap is about this deep).
const MAX_TREE_DEPTH: usize = 48;

fn to_node(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Node> {
    if depth > MAX_TREE_DEPTH {
        return Err(PyValueError::new_err(format!(
            "value nested deeper than {MAX_TREE_DEPTH} levels"
        )));
    }
    if obj.is_none() {
        return Ok(Node::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Node::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i64>().map(Node::Int).map_err(|_| {
            PyValueError::new_err("integers shared over tensorwire.ipc must fit in 64 bits")
        });
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Node::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Node::Str(s.to_cow()?.into_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Node::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(t) = obj.cast::<TensorRef>() {
        return Ok(Node::Tensor(t.get().index));
    }
    if let Ok(t) = obj.cast::<Tagged>() {
        let t = t.get();
        let inner = to_node(t.value.bind(obj.py()), depth + 1)?;
        return Ok(Node::Tagged(t.tag.clone(), Box::new(inner)));
    }
    let is_list = obj.is_instance_of::<PyList>();
    if is_list || obj.is_instance_of::<PyTuple>() {
        let items = obj
            .try_iter()?
            .map(|v| to_node(&v?, depth + 1))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(if is_list {
            Node::List(items)
        } else {
            Node::Tuple(items)
        });
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            let key = k.cast::<PyString>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "dict keys shared over tensorwire.ipc must be str, not {}",
                    type_name(&k)
                ))
            })?;
            entries.push((key.to_cow()?.into_owned(), to_node(&v, depth + 1)?));
        }
        return Ok(Node::Map(entries));
    }
    Err(PyTypeError::new_err(format!(
        "cannot share a {} over tensorwire.ipc: values are None, bool, int, float, str, bytes, lists, tuples, dicts with str keys, tensors, numpy arrays and torch.nn modules (nothing is pickled)",
        type_name(obj)
    )))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// Python values of `nodes`.
fn from_nodes<'py>(py: Python<'py>, nodes: &[Node]) -> PyResult<Vec<Bound<'py, PyAny>>> {
    nodes.iter().map(|n| from_node(py, n)).collect()
}

fn from_node<'py>(py: Python<'py>, node: &Node) -> PyResult<Bound<'py, PyAny>> {
    Ok(match node {
        Node::Null => py.None().into_bound(py),
        Node::Bool(b) => b.into_bound_py_any(py)?,
        Node::Int(i) => i.into_bound_py_any(py)?,
        Node::Float(f) => f.into_bound_py_any(py)?,
        Node::Str(s) => s.into_bound_py_any(py)?,
        Node::Bytes(b) => PyBytes::new(py, b).into_any(),
        Node::List(items) => PyList::new(py, from_nodes(py, items)?)?.into_any(),
        Node::Tuple(items) => PyTuple::new(py, from_nodes(py, items)?)?.into_any(),
        Node::Map(entries) => {
            let dict = PyDict::new(py);
            for (k, v) in entries {
                dict.set_item(k, from_node(py, v)?)?;
            }
            dict.into_any()
        }
        Node::Tensor(i) => Bound::new(py, TensorRef { index: *i })?.into_any(),
        Node::Tagged(tag, inner) => Bound::new(
            py,
            Tagged {
                tag: tag.clone(),
                value: from_node(py, inner)?.unbind(),
            },
        )?
        .into_any(),
    })
}

// ------------------------------------------------------------------ outgoing values

/// A value ready to send (made by [`ipc_encode`]).
#[pyclass(frozen, module = "tensorwire._native", name = "IpcValue")]
pub struct IpcValue {
    outgoing: Outgoing,
    copied: usize,
}

#[pymethods]
impl IpcValue {
    /// Bytes of tensor storage the value shares.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.outgoing.bytes()
    }

    /// Bytes copied into a new memfd when it was made (0 when every storage already
    /// lived in shared memory).
    #[getter]
    fn copied(&self) -> usize {
        self.copied
    }
}

/// `(storage, byte offset, dtype, shape, strides, framework, requires_grad)`; dtype,
/// shape and strides are `None` for a numpy array given whole as its storage.
type TensorSpec = (
    u32,
    u64,
    Option<String>,
    Option<Vec<u64>>,
    Option<Vec<u64>>,
    String,
    bool,
);

fn framework(name: &str) -> PyResult<Framework> {
    match name {
        "numpy" => Ok(Framework::Numpy),
        "torch" => Ok(Framework::Torch),
        other => Err(PyValueError::new_err(format!(
            "framework must be 'numpy' or 'torch', not {other:?}"
        ))),
    }
}

/// Keeps a Python object (a CUDA tensor) alive for as long as a value shares its memory.
struct PyKeepAlive(#[allow(dead_code)] Py<PyAny>);

/// One storage spec, parsed.
enum StorageSpec<'py> {
    /// Host bytes: a uint8 view of a torch storage (`"cpu"`), or a numpy array given
    /// whole (`"numpy"`: made C-contiguous little-endian here, its tensor's dtype, shape
    /// and strides taken from it).
    Host(arrays::Prepared<'py>),
    /// `("cuda", data_ptr, nbytes, device, stream or None, owner)`.
    Cuda {
        ptr: u64,
        nbytes: u64,
        device: i32,
        stream: Option<u64>,
        owner: Py<PyAny>,
    },
}

fn storage_spec<'py>(spec: &Bound<'py, PyTuple>) -> PyResult<StorageSpec<'py>> {
    let kind: String = spec.get_item(0)?.extract()?;
    match kind.as_str() {
        "cpu" | "numpy" => Ok(StorageSpec::Host(arrays::prepare(&spec.get_item(1)?)?)),
        "cuda" => {
            let (_, ptr, nbytes, device, stream, owner): (
                String,
                u64,
                u64,
                i32,
                Option<u64>,
                Py<PyAny>,
            ) = spec.extract()?;
            Ok(StorageSpec::Cuda {
                ptr,
                nbytes,
                device,
                stream,
                owner,
            })
        }
        other => Err(PyValueError::new_err(format!(
            "storage kind must be 'cpu', 'numpy' or 'cuda', not {other:?}"
        ))),
    }
}

/// The tensors of `specs`, with what numpy storages imply filled in.
fn tensor_descs(specs: Vec<TensorSpec>, storages: &[StorageSpec<'_>]) -> PyResult<Vec<TensorDesc>> {
    specs
        .into_iter()
        .map(
            |(storage, offset, dtype, shape, strides, fw, requires_grad)| {
                let (dtype, shape, strides) = match (dtype, shape, strides) {
                    (Some(dtype), Some(shape), Some(strides)) => (dtype, shape, strides),
                    _ => {
                        let Some(StorageSpec::Host(array)) = storages.get(storage as usize) else {
                            return Err(PyValueError::new_err(
                            "a tensor without dtype, shape and strides must name a numpy storage",
                        ));
                        };
                        let shape = array.shape()?;
                        let strides = shape.c_strides();
                        (
                            array.dtype.name().to_owned(),
                            shape.dims().to_vec(),
                            strides,
                        )
                    }
                };
                Ok(TensorDesc {
                    storage,
                    offset,
                    dtype,
                    shape,
                    strides,
                    framework: framework(&fw)?,
                    requires_grad,
                })
            },
        )
        .collect()
}

/// The byte range of each storage its tensors reach (`0..0` for one no tensor uses).
fn reached(tensors: &[TensorDesc], storages: usize) -> Result<Vec<(u64, u64)>, Error> {
    let mut reach: Vec<Option<(u64, u64)>> = vec![None; storages];
    for t in tensors {
        let dtype = t.dtype.parse::<DType>()?;
        let extent = tensorwire::core::strided::extent_bytes(dtype, &t.shape, &t.strides)?;
        if extent == 0 {
            continue;
        }
        let end = t.offset.checked_add(extent).ok_or(Error::Overflow {
            what: "tensor extent",
        })?;
        let Some(slot) = reach.get_mut(t.storage as usize) else {
            continue; // the payload check names the bad index
        };
        let (lo, hi) = slot.get_or_insert((t.offset, end));
        *lo = (*lo).min(t.offset);
        *hi = (*hi).max(end);
    }
    // Sent from a 64-byte boundary: every tensor's offset stays a multiple of its
    // element size when views of several dtypes share the storage (a tensor's offset
    // is one in the original storage; element sizes divide 64).
    Ok(reach
        .into_iter()
        .map(|r| r.map_or((0, 0), |(lo, hi)| (lo - lo % SEND_ALIGN, hi)))
        .collect())
}

/// The alignment of the first byte of a host storage that is sent.
const SEND_ALIGN: u64 = 64;

/// Builds a value to send from a tree, tensor specs `(storage, byte offset, dtype,
/// shape, strides, framework, requires_grad)` and storage specs `("cpu", uint8 array)`,
/// `("numpy", array)` or `("cuda", data_ptr, nbytes, device, stream or None, owner)`.
///
/// Only the bytes of a host storage that its tensors reach are sent (a view of a large
/// storage sends the view). Host storages already inside a shared segment (received,
/// or sent before) are referenced as they are; the others are copied into one new
/// memfd, in parallel and without the GIL. CUDA storages are exported as IPC handles of
/// their allocation, with one IPC event per device and stream recorded on it.
#[pyfunction]
pub fn ipc_encode(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    tensors: Vec<TensorSpec>,
    storages: Vec<Bound<'_, PyTuple>>,
) -> PyResult<IpcValue> {
    let value = to_node(tree, 0)?;
    let specs = storages
        .iter()
        .map(storage_spec)
        .collect::<PyResult<Vec<_>>>()?;
    let mut tensors = tensor_descs(tensors, &specs)?;
    let reach = reached(&tensors, specs.len()).map_err(crate::errors::to_pyerr)?;
    for t in &mut tensors {
        if let (Some(StorageSpec::Host(_)), Some(&(lo, hi))) =
            (specs.get(t.storage as usize), reach.get(t.storage as usize))
        {
            // An empty tensor reaches no byte, so it may lie outside what is sent: it
            // keeps its place when that is inside, and is put at an end otherwise (at
            // a multiple of its element size, as every offset is).
            let element = t
                .dtype
                .parse::<DType>()
                .ok()
                .and_then(DType::size)
                .unwrap_or(1) as u64;
            let offset = t.offset.saturating_sub(lo).min(hi - lo);
            t.offset = offset - offset % element;
        }
    }
    let mut builder = OutgoingBuilder::new();
    let mut events: std::collections::HashMap<(i32, u64), [u8; 64]> = Default::default();
    for (spec, &(lo, hi)) in specs.iter().zip(&reach) {
        match spec {
            StorageSpec::Host(array) => {
                let bytes = array
                    .bytes()
                    .get(lo as usize..hi as usize)
                    .ok_or_else(|| PyValueError::new_err("a tensor reaches past its storage"))?;
                builder.cpu_storage(bytes).or_raise(py)?;
            }
            &StorageSpec::Cuda {
                nbytes: 0, device, ..
            } => {
                // No allocation to share (torch gives empty CUDA storages a null pointer).
                let device_uuid = py
                    .detach(|| cuda::CudaDriver::get()?.device_uuid(device))
                    .or_raise(py)?;
                builder
                    .storage(StorageDesc {
                        len: 0,
                        location: Location::CudaEmpty {
                            device_uuid: device_uuid.to_vec(),
                        },
                    })
                    .or_raise(py)?;
            }
            &StorageSpec::Cuda {
                ptr,
                nbytes,
                device,
                stream,
                ref owner,
            } => {
                let (export, offset) = py
                    .detach(|| cuda::export_pointer(ptr, nbytes))
                    .or_raise(py)?;
                // One event per (device, stream) per value: a model's storages on one
                // stream are all ready once it fires.
                let event = match stream {
                    Some(stream) => Some(match events.get(&(device, stream)) {
                        Some(handle) => *handle,
                        None => {
                            let event = py
                                .detach(|| ProducerEvent::record(device, stream))
                                .or_raise(py)?;
                            let handle = event.handle();
                            builder.keep_alive(Arc::new(event));
                            events.insert((device, stream), handle);
                            handle
                        }
                    }),
                    None => None,
                };
                builder.keep_alive(Arc::new(PyKeepAlive(owner.clone_ref(py))));
                builder
                    .storage(StorageDesc {
                        len: nbytes,
                        location: Location::cuda(&export, offset, event),
                    })
                    .or_raise(py)?;
            }
        }
    }
    for tensor in tensors {
        builder.tensor(tensor).or_raise(py)?;
    }
    let copied = builder.bytes_to_copy();
    let outgoing = builder
        .finish(value, |jobs| arrays::copy_parallel(py, jobs))
        .or_raise(py)?;
    Ok(IpcValue { outgoing, copied })
}

// ------------------------------------------------------------------ received values

/// A value received from a peer, not yet turned into arrays.
#[pyclass(module = "tensorwire._native", name = "IpcReceived")]
pub struct IpcReceived {
    incoming: Mutex<Option<Incoming>>,
    #[pyo3(get)]
    object_id: Option<String>,
    #[pyo3(get)]
    server_id: Option<String>,
    #[pyo3(get)]
    managed: bool,
    #[pyo3(get)]
    cached: bool,
}

impl IpcReceived {
    fn new(incoming: Incoming) -> Self {
        IpcReceived {
            incoming: Mutex::new(Some(incoming)),
            object_id: None,
            server_id: None,
            managed: false,
            cached: false,
        }
    }

    fn from_shared(shared: tensorwire::ipc::schema::SharedValue, incoming: Incoming) -> Self {
        let object = shared.object;
        IpcReceived {
            incoming: Mutex::new(Some(incoming)),
            managed: object.as_ref().is_some_and(|o| o.managed),
            object_id: object.as_ref().map(|o| o.object_id.clone()),
            server_id: object.map(|o| o.server_id),
            cached: shared.cached,
        }
    }
}

#[pymethods]
impl IpcReceived {
    /// `(tree, tensors, storages)`: the value tree (tensor leaves are `TensorRef`),
    /// tensor specs as given to `ipc_encode`, and storages — writable uint8 numpy
    /// arrays over shared memory for CPU ones, `CudaStorage` for CUDA ones. Can be
    /// called once.
    fn decode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let incoming = self
            .incoming
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyValueError::new_err("this value was already decoded"))?;
        let (payload, storages) = py.detach(|| incoming.storages()).or_raise(py)?;
        let tree = from_node(py, &payload.value)?;
        let tensors = PyList::empty(py);
        for t in &payload.tensors {
            let fw = match t.framework {
                Framework::Numpy => "numpy",
                Framework::Torch => "torch",
            };
            tensors.append((
                t.storage,
                t.offset,
                &t.dtype,
                &t.shape,
                &t.strides,
                fw,
                t.requires_grad,
            ))?;
        }
        let arrays = PyList::empty(py);
        for (desc, storage) in payload.storages.iter().zip(storages) {
            match storage {
                ReceivedStorage::Cpu {
                    segment,
                    offset,
                    len,
                } => arrays.append(segment_array(py, segment, offset as usize, len as usize)?)?,
                ReceivedStorage::Cuda(location) => arrays.append(Bound::new(
                    py,
                    CudaStorage {
                        location,
                        len: desc.len,
                    },
                )?)?,
            }
        }
        PyTuple::new(py, [tree, tensors.into_any(), arrays.into_any()])
    }
}

/// A CUDA storage received from a peer, not yet opened in this process.
#[pyclass(frozen, module = "tensorwire._native", name = "CudaStorage")]
pub struct CudaStorage {
    location: Location,
    len: u64,
}

#[pymethods]
impl CudaStorage {
    /// Bytes in the storage.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.len
    }

    /// The ordinal, in this process, of the device holding it.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<i32> {
        let uuid = self
            .location
            .cuda_device_uuid()
            .ok_or_else(|| PyValueError::new_err("not a CUDA storage"))?;
        py.detach(|| cuda::CudaDriver::get()?.device_by_uuid(&uuid))
            .or_raise(py)
    }

    /// Opens the allocation (once per process; later opens reuse the mapping) and
    /// returns the storage's device memory. `lease` (any object) is kept alive as long
    /// as the buffer, and so as long as any tensor made from it. Memory of this
    /// process sent back by a peer is not opened: the buffer's `local` is then true,
    /// and it keeps nothing alive (the caller builds on the storage that owns it).
    #[pyo3(signature = (lease=None))]
    fn open(&self, py: Python<'_>, lease: Option<Py<PyAny>>) -> PyResult<CudaBuffer> {
        // The payload check made every CUDA location's fields the right size.
        let (export, offset, event) = self
            .location
            .cuda_export()
            .ok_or_else(|| PyValueError::new_err("not a CUDA storage with an allocation"))?;
        let opened = py.detach(|| cuda::open_export(&export)).or_raise(py)?;
        Ok(CudaBuffer {
            opened,
            offset,
            len: self.len,
            event,
            lease,
        })
    }
}

/// Device memory of an opened CUDA storage. Exposes `__cuda_array_interface__` (a
/// uint8 vector), so `torch.as_tensor(buf, device="cuda")` views it; the mapping (and
/// the lease on the server's object) stays open while this object, and so any tensor
/// made from it, lives.
#[pyclass(frozen, module = "tensorwire._native", name = "CudaBuffer")]
pub struct CudaBuffer {
    /// The mapping (kept open while this lives), or this process's own memory.
    opened: Opened,
    offset: u64,
    len: u64,
    event: Option<[u8; 64]>,
    #[allow(dead_code)]
    lease: Option<Py<PyAny>>,
}

#[pymethods]
impl CudaBuffer {
    /// Makes `stream` (a `CUstream` handle of this buffer's device; 0 for the legacy
    /// default stream) wait for the producer's event, when it sent one.
    fn wait(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let Some(event) = self.event else {
            return Ok(());
        };
        let uuid = self.opened.device_uuid();
        py.detach(|| cuda::wait_event(&uuid, &event, stream))
            .or_raise(py)
    }

    /// Device address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.opened.device_ptr() + self.offset
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.len
    }

    /// The device's ordinal in this process.
    #[getter]
    fn device(&self) -> i32 {
        self.opened.device_ordinal()
    }

    /// The producer's event handle (bytes) the consumer waits on, or None: storages
    /// sent in one value on one stream carry the same event, so one wait covers them.
    #[getter]
    fn event<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.event.map(|event| PyBytes::new(py, &event))
    }

    /// True when the peer sent back memory of this process (no mapping was opened);
    /// the caller then builds on the storage that owns it here, which keeps it alive.
    #[getter]
    fn local(&self) -> bool {
        matches!(self.opened, Opened::Local(_))
    }

    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        // The producer's event was waited on when the storage was opened.
        d.set_item("stream", py.None())?;
        Ok(d)
    }
}

// ------------------------------------------------------------------ server

fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    crate::values::positive_seconds(value).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what} must be positive seconds (at most {}), not {value}",
            Duration::MAX.as_secs()
        ))
    })
}

/// A server: endpoints behind a Unix socket (`tensorwire.ipc.Server` wraps it).
#[pyclass(frozen, module = "tensorwire._native", name = "IpcServer")]
pub struct IpcServer {
    server: Server,
}

#[pymethods]
impl IpcServer {
    #[new]
    #[pyo3(signature = (socket_path, allowed_uids=None, max_connections=256, frame_timeout=10.0,
                        max_request_bytes=16 << 20, task_workers=4, max_tasks=1024,
                        task_retention=600.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        socket_path: std::path::PathBuf,
        allowed_uids: Option<Vec<u32>>,
        max_connections: usize,
        frame_timeout: f64,
        max_request_bytes: u32,
        task_workers: usize,
        max_tasks: usize,
        task_retention: f64,
        py: Python<'_>,
    ) -> PyResult<Self> {
        let mut config = ServerConfig::new(socket_path);
        if let Some(uids) = allowed_uids {
            config.peers.allowed_uids = uids;
        }
        config.max_connections = max_connections.max(1);
        config.frame_timeout = seconds(frame_timeout, "frame_timeout")?;
        config.frame_limits.max_body = max_request_bytes;
        config.service.tasks.workers = task_workers.max(1);
        config.service.tasks.max_pending = max_tasks.max(1);
        config.service.tasks.max_finished = max_tasks.max(1);
        config.service.tasks.retention = seconds(task_retention, "task_retention")?;
        Ok(IpcServer {
            server: Server::new(config).or_raise(py)?,
        })
    }

    /// Registers `handler(received: IpcReceived) -> IpcValue` as endpoint `name`.
    /// `cache_key(tree) -> str | None` computes a call's cache key from its argument
    /// tree (default: the canonical encoding of tensor-free arguments).
    #[pyo3(signature = (name, handler, execution="direct", managed=false, concurrency="parallel",
                        cache=true, singleflight=true, cache_format_key=None, cache_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn register(
        &self,
        name: String,
        handler: Py<PyAny>,
        execution: &str,
        managed: bool,
        concurrency: &str,
        cache: bool,
        singleflight: bool,
        cache_format_key: Option<String>,
        cache_key: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let options = EndpointOptions {
            execution: match execution {
                "direct" => Execution::Direct,
                "task" => Execution::Task,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "execution must be 'direct' or 'task', not {other:?}"
                    )))
                }
            },
            managed,
            concurrency: match concurrency {
                "parallel" => Concurrency::Parallel,
                "serialized" => Concurrency::Serialized,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "concurrency must be 'parallel' or 'serialized', not {other:?}"
                    )))
                }
            },
            cache,
            singleflight,
            cache_format_key,
        };
        let run = Arc::new(move |incoming: Incoming| -> Result<Outgoing, IpcError> {
            Python::attach(|py| {
                let received = Py::new(py, IpcReceived::new(incoming))
                    .map_err(|e| endpoint_failure(py, &e))?;
                let result = handler
                    .call1(py, (received,))
                    .map_err(|e| endpoint_failure(py, &e))?;
                let value = result.cast_bound::<IpcValue>(py).map_err(|_| {
                    IpcError::remote(
                        RemoteKind::Internal,
                        "an endpoint adapter returned something other than an IpcValue",
                    )
                })?;
                Ok(value.get().outgoing.clone())
            })
        });
        let key = cache_key.map(|f| {
            Arc::new(
                move |payload: &Payload| -> Result<Option<String>, IpcError> {
                    Python::attach(|py| {
                        let tree =
                            from_node(py, &payload.value).map_err(|e| endpoint_failure(py, &e))?;
                        let key = f.call1(py, (tree,)).map_err(|e| endpoint_failure(py, &e))?;
                        key.extract::<Option<String>>(py)
                            .map_err(|e| endpoint_failure(py, &e))
                    })
                },
            ) as tensorwire::ipc::service::CacheKeyFn
        });
        self.server
            .service()
            .register(Endpoint::new(name, options, run, key));
        Ok(())
    }

    /// Binds the socket and serves in background threads.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.server.start()).or_raise(py)
    }

    /// Stops serving: closes every connection, stops the task pool, removes the socket.
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.server.stop());
    }

    /// True between `start` and `stop`.
    #[getter]
    fn running(&self) -> bool {
        self.server.is_running()
    }

    /// The server's random id.
    #[getter]
    fn server_id(&self) -> String {
        self.server.server_id().to_owned()
    }

    /// The socket path.
    #[getter]
    fn socket_path(&self) -> String {
        self.server.socket_path().display().to_string()
    }

    /// The server's id, version, devices and counters.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        server_info_dict(py, &self.server.info())
    }

    /// Drops every cached result of an endpoint; returns how many.
    fn invalidate_endpoint(&self, name: &str) -> u64 {
        self.server.service().invalidate_endpoint(name)
    }

    /// Drops one cached result by its key.
    fn invalidate_key(&self, name: &str, key: &str) -> bool {
        self.server.service().invalidate_key(name, key)
    }

    /// `(objects, leases)` alive now.
    fn live(&self) -> (u64, u64) {
        self.server.service().live()
    }
}

impl Drop for IpcServer {
    fn drop(&mut self) {
        // Stopping joins the task workers, which may be waiting for the GIL to run an
        // endpoint: release it while they finish.
        if self.server.is_running() {
            Python::attach(|py| py.detach(|| self.server.stop()));
        }
    }
}

// ------------------------------------------------------------------ client

/// A connection to a server (`tensorwire.ipc.Client` wraps it).
#[pyclass(frozen, module = "tensorwire._native", name = "IpcClient")]
pub struct IpcClient {
    /// `None` once closed; calls in flight hold their own `Arc`.
    client: std::sync::RwLock<Option<Arc<Client>>>,
}

impl IpcClient {
    /// `f` of the client, or the default once it is closed.
    fn peek<T: Default>(&self, f: impl FnOnce(&Client) -> T) -> T {
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_deref()
            .map(f)
            .unwrap_or_default()
    }

    /// The client, or an error once it is closed.
    fn live(&self, py: Python<'_>) -> PyResult<Arc<Client>> {
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| to_pyerr(py, IpcError::protocol("the client is closed")))
    }
}

#[pymethods]
impl IpcClient {
    #[new]
    #[pyo3(signature = (socket_path, timeout=60.0))]
    fn new(py: Python<'_>, socket_path: std::path::PathBuf, timeout: f64) -> PyResult<Self> {
        let options = ClientOptions {
            timeout: seconds(timeout, "timeout")?,
            ..ClientOptions::default()
        };
        let client = py
            .detach(|| Client::connect(&socket_path, options))
            .or_raise(py)?;
        Ok(IpcClient {
            client: std::sync::RwLock::new(Some(Arc::new(client))),
        })
    }

    /// Closes the connection (once calls in flight finish); the server gives back
    /// every lease it held.
    fn close(&self) {
        self.client
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// Seconds each request waits for its answer; setting it applies to the requests
    /// that follow (a closed client keeps nothing).
    #[getter]
    fn timeout(&self) -> f64 {
        self.peek(|c| c.timeout().as_secs_f64())
    }

    #[setter]
    fn set_timeout(&self, timeout: f64) -> PyResult<()> {
        let timeout = seconds(timeout, "timeout")?;
        self.peek(|c| c.set_timeout(timeout));
        Ok(())
    }

    /// True until `close`.
    #[getter]
    fn connected(&self) -> bool {
        self.peek(|_| true)
    }

    /// The id of the server this client talks to ("" once closed).
    #[getter]
    fn server_id(&self) -> String {
        self.peek(|c| c.server_id().to_owned())
    }

    /// True once the connection cannot carry another request (a request cut off by
    /// its timeout mid-way): `Client` then connects again.
    #[getter]
    fn broken(&self) -> bool {
        self.peek(|c| c.is_broken())
    }

    /// The socket path ("" once closed).
    #[getter]
    fn socket_path(&self) -> String {
        self.peek(|c| c.path().display().to_string())
    }

    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.live(py)?;
        py.detach(|| client.ping()).or_raise(py)
    }

    fn server_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.live(py)?;
        let info = py.detach(|| client.server_info()).or_raise(py)?;
        server_info_dict(py, &info)
    }

    fn list_endpoints<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.live(py)?;
        let list = py.detach(|| client.list_endpoints()).or_raise(py)?;
        endpoints_dict(py, &list)
    }

    fn call(&self, py: Python<'_>, endpoint: &str, args: &IpcValue) -> PyResult<IpcReceived> {
        let client = self.live(py)?;
        let (shared, incoming) = py
            .detach(|| client.call(endpoint, &args.outgoing))
            .or_raise(py)?;
        Ok(IpcReceived::from_shared(shared, incoming))
    }

    fn submit(&self, py: Python<'_>, endpoint: &str, args: &IpcValue) -> PyResult<String> {
        let client = self.live(py)?;
        py.detach(|| client.submit(endpoint, &args.outgoing))
            .or_raise(py)
    }

    fn task_status<'py>(&self, py: Python<'py>, task_id: &str) -> PyResult<Bound<'py, PyDict>> {
        let client = self.live(py)?;
        let info = py.detach(|| client.task_status(task_id)).or_raise(py)?;
        task_dict(py, &info)
    }

    #[pyo3(signature = (task_id, timeout=None))]
    fn wait_task<'py>(
        &self,
        py: Python<'py>,
        task_id: &str,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let client = self.live(py)?;
        let timeout = match timeout {
            Some(t) if t <= 0.0 => Some(Duration::ZERO),
            Some(t) => Some(seconds(t, "timeout")?),
            None => None,
        };
        let info = py
            .detach(|| client.wait_task(task_id, timeout))
            .or_raise(py)?;
        task_dict(py, &info)
    }

    fn task_result(&self, py: Python<'_>, task_id: &str) -> PyResult<IpcReceived> {
        let client = self.live(py)?;
        let (shared, incoming) = py.detach(|| client.task_result(task_id)).or_raise(py)?;
        Ok(IpcReceived::from_shared(shared, incoming))
    }

    fn cancel_task(&self, py: Python<'_>, task_id: &str) -> PyResult<bool> {
        let client = self.live(py)?;
        py.detach(|| client.cancel_task(task_id)).or_raise(py)
    }

    #[pyo3(signature = (state=None))]
    fn list_tasks<'py>(
        &self,
        py: Python<'py>,
        state: Option<&str>,
    ) -> PyResult<Bound<'py, PyList>> {
        let client = self.live(py)?;
        let state = state.map(parse_state).transpose()?;
        let list = py.detach(|| client.list_tasks(state)).or_raise(py)?;
        PyList::new(
            py,
            list.iter()
                .map(|t| task_dict(py, t))
                .collect::<PyResult<Vec<_>>>()?,
        )
    }

    fn release(&self, py: Python<'_>, object_ids: Vec<String>) -> PyResult<Vec<bool>> {
        let client = self.live(py)?;
        py.detach(|| client.release(&object_ids)).or_raise(py)
    }

    fn object_info<'py>(
        &self,
        py: Python<'py>,
        object_id: &str,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let client = self.live(py)?;
        let info = py.detach(|| client.object_info(object_id)).or_raise(py)?;
        info.map(|i| object_dict(py, &i)).transpose()
    }

    fn ensure_live<'py>(
        &self,
        py: Python<'py>,
        object_id: &str,
        server_id: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let client = self.live(py)?;
        let info = py
            .detach(|| client.ensure_live(object_id, server_id))
            .or_raise(py)?;
        object_dict(py, &info)
    }

    fn invalidate_call(&self, py: Python<'_>, endpoint: &str, args: &IpcValue) -> PyResult<u64> {
        let client = self.live(py)?;
        py.detach(|| client.invalidate_call(endpoint, &args.outgoing.payload))
            .or_raise(py)
    }

    fn invalidate_endpoint(&self, py: Python<'_>, endpoint: &str) -> PyResult<u64> {
        let client = self.live(py)?;
        py.detach(|| client.invalidate_endpoint(endpoint))
            .or_raise(py)
    }
}

fn parse_state(s: &str) -> PyResult<TaskState> {
    Ok(match s {
        "pending" => TaskState::Pending,
        "running" => TaskState::Running,
        "completed" => TaskState::Completed,
        "failed" => TaskState::Failed,
        "cancelled" => TaskState::Cancelled,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown task state {other:?} (pending, running, completed, failed, cancelled)"
            )))
        }
    })
}

fn state_name(s: TaskState) -> &'static str {
    match s {
        TaskState::Pending => "pending",
        TaskState::Running => "running",
        TaskState::Completed => "completed",
        TaskState::Failed => "failed",
        TaskState::Cancelled => "cancelled",
    }
}

fn task_dict<'py>(py: Python<'py>, t: &TaskInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("task_id", &t.task_id)?;
    d.set_item("endpoint", &t.endpoint)?;
    d.set_item("status", state_name(t.state))?;
    d.set_item("created_at", t.created_at)?;
    d.set_item("started_at", t.started_at)?;
    d.set_item("completed_at", t.finished_at)?;
    d.set_item("error", &t.error)?;
    Ok(d)
}

fn object_dict<'py>(py: Python<'py>, o: &ObjectInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("object_id", &o.object_id)?;
    d.set_item("server_id", &o.server_id)?;
    d.set_item("endpoint", &o.endpoint)?;
    d.set_item("cache_key", &o.cache_key)?;
    d.set_item("refcount", o.leases)?;
    d.set_item("created_at", o.created_at)?;
    d.set_item("last_accessed_at", o.last_accessed_at)?;
    d.set_item("nbytes", o.bytes)?;
    Ok(d)
}

fn endpoints_dict<'py>(py: Python<'py>, list: &[EndpointInfo]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for e in list {
        let o = PyDict::new(py);
        let opts = &e.options;
        o.set_item(
            "execution",
            match opts.execution {
                Execution::Direct => "direct",
                Execution::Task => "task",
            },
        )?;
        o.set_item("managed", opts.managed)?;
        o.set_item(
            "concurrency",
            match opts.concurrency {
                Concurrency::Parallel => "parallel",
                Concurrency::Serialized => "serialized",
            },
        )?;
        o.set_item("cache", opts.cache)?;
        o.set_item("singleflight", opts.singleflight)?;
        o.set_item("cache_format_key", &opts.cache_format_key)?;
        d.set_item(&e.name, o)?;
    }
    Ok(d)
}

fn server_info_dict<'py>(py: Python<'py>, info: &ServerInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("server_id", &info.server_id)?;
    d.set_item("version", &info.version)?;
    d.set_item("protocol", info.protocol)?;
    d.set_item("pid", info.pid)?;
    d.set_item("socket_path", &info.socket_path)?;
    d.set_item("started_at", info.started_at)?;
    d.set_item("devices", &info.devices)?;
    let counters = PyDict::new(py);
    for (k, v) in &info.counters {
        counters.set_item(k, v)?;
    }
    d.set_item("counters", counters)?;
    Ok(d)
}

// ------------------------------------------------------------------ functions

/// True when a CUDA driver and at least one device are usable in this process.
#[pyfunction]
pub fn cuda_available(py: Python<'_>) -> bool {
    py.detach(cuda::is_available)
}

/// `(opened, live)`: CUDA IPC handles opened by this process so far, and mappings
/// alive now (a repeated share of a live allocation opens nothing).
#[pyfunction]
pub fn cuda_import_stats() -> (u64, u64) {
    let s = cuda::import_stats();
    (s.opened, s.live)
}

/// A writable uint8 array of `nbytes` over a new shared-memory segment: tensors placed
/// in it are shared with other processes without a copy, and the processes see each
/// other's writes (as with CUDA IPC).
#[pyfunction]
pub fn shared_buffer(py: Python<'_>, nbytes: usize) -> PyResult<Bound<'_, PyAny>> {
    let segment = tensorwire::ipc::cpu::shared_segment(nbytes).or_raise(py)?;
    segment_array(py, segment, 0, nbytes)
}

/// The numpy dtype of tensorwire dtype `name` (`"f32"`, `"bf16"`, …; the float8 and
/// bfloat16 types come from ml_dtypes).
#[pyfunction]
pub fn numpy_dtype<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArrayDescr>> {
    let dtype = name.parse::<DType>().map_err(crate::errors::to_pyerr)?;
    crate::dtypes::descr(py, dtype)
}

/// The default socket path for a server called `name`.
#[pyfunction]
pub fn default_socket_path(name: &str) -> String {
    tensorwire::ipc::default_socket_path(name)
        .display()
        .to_string()
}

/// Registers the classes, functions and exceptions on the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<TensorRef>()?;
    m.add_class::<Tagged>()?;
    m.add_class::<IpcValue>()?;
    m.add_class::<IpcReceived>()?;
    m.add_class::<CudaStorage>()?;
    m.add_class::<CudaBuffer>()?;
    m.add_class::<IpcServer>()?;
    m.add_class::<IpcClient>()?;
    m.add_function(wrap_pyfunction!(ipc_encode, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_import_stats, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket_path, m)?)?;
    m.add_function(wrap_pyfunction!(shared_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_dtype, m)?)?;
    let c = classes(py)?;
    for (name, ty) in [
        ("IpcError", &c.base),
        ("ServerGoneError", &c.server_gone),
        ("RemoteError", &c.remote),
        ("StaleHandleError", &c.stale),
        ("PeerRefusedError", &c.refused),
        ("ProtocolError", &c.protocol),
        ("IpcTimeoutError", &c.timeout),
        ("CudaUnavailableError", &c.cuda_unavailable),
    ] {
        m.add(name, ty.bind(py))?;
    }
    Ok(())
}
