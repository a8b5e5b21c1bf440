//! The messages of protocol version 1, encoded as CBOR with serde.
//!
//! A request is a [`Request`]; the answer is a [`Response`] with the same request id.
//! Values that hold tensors travel as a [`Payload`]: a tree of plain values whose
//! tensor leaves index a table of [`TensorDesc`], each pointing into a storage of the
//! [`StorageDesc`] table. A storage is either a range of a memfd sent with the frame
//! (`SCM_RIGHTS`) or a CUDA allocation named by its IPC handle.
//!
//! Nothing here is ever executed or looked up by name: module structure travels as
//! plain values under a [`Node::Tagged`] tag, and the receiving side decides what a tag
//! may rebuild.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tensorwire_core::{strided, DType, MAX_NDIM};

use crate::cuda::CudaExport;
use crate::error::{IpcError, RemoteKind, Result};

/// Deepest nesting the decoder accepts (CBOR levels, so about half as many value levels).
pub const MAX_DECODE_DEPTH: usize = 128;

/// Most elements one received tensor may have (2^40). Stride-0 dimensions let a tiny
/// storage claim any shape; this keeps what a receiver iterates over bounded.
pub const MAX_ELEMENTS: u64 = 1 << 40;

/// A request from a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Opens a session: the client's protocol version and a label for logs.
    Hello {
        /// Protocol version the client speaks.
        protocol: u16,
        /// Free-form client label.
        client: String,
    },
    /// Liveness check.
    Ping,
    /// Server id, version, devices and counters.
    ServerInfo,
    /// The registered endpoints and their options.
    ListEndpoints,
    /// Runs an endpoint and waits for its result.
    Call {
        /// Endpoint name.
        endpoint: String,
        /// Its arguments (positional and keyword, as the endpoint's adapter lays them out).
        args: Arc<Payload>,
    },
    /// Queues an endpoint as a task; answers with the task id.
    Submit {
        /// Endpoint name.
        endpoint: String,
        /// Its arguments.
        args: Arc<Payload>,
    },
    /// A task's state.
    TaskStatus {
        /// The task.
        task_id: String,
    },
    /// Waits until a task has finished (or `timeout_ms` passed), then gives its state.
    WaitTask {
        /// The task.
        task_id: String,
        /// How long to wait at most; `None` waits for the server's cap.
        timeout_ms: Option<u64>,
    },
    /// A finished task's result.
    TaskResult {
        /// The task.
        task_id: String,
    },
    /// Cancels a task that has not started.
    CancelTask {
        /// The task.
        task_id: String,
    },
    /// Every retained task, optionally only those in one state.
    ListTasks {
        /// Filter.
        state: Option<TaskState>,
    },
    /// Gives back leases on objects this connection holds.
    Release {
        /// The objects, one lease each.
        object_ids: Vec<String>,
    },
    /// An object's bookkeeping, or `None` when it no longer exists.
    ObjectInfo {
        /// The object.
        object_id: String,
    },
    /// Drops the cached result of one call.
    InvalidateCall {
        /// Endpoint name.
        endpoint: String,
        /// The call's arguments.
        args: Arc<Payload>,
    },
    /// Drops every cached result of an endpoint.
    InvalidateEndpoint {
        /// Endpoint name.
        endpoint: String,
    },
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello {
        /// The server's id: random, new every time a server starts.
        server_id: String,
        /// The server's crate version.
        version: String,
    },
    /// Answer to [`Request::Ping`].
    Pong,
    /// Answer to [`Request::ServerInfo`].
    ServerInfo(ServerInfo),
    /// Answer to [`Request::ListEndpoints`].
    Endpoints(Vec<EndpointInfo>),
    /// A shared value (a call's or task's result).
    Value(SharedValue),
    /// Answer to [`Request::Submit`].
    TaskId(String),
    /// A task's state.
    Task(TaskInfo),
    /// Answer to [`Request::ListTasks`].
    Tasks(Vec<TaskInfo>),
    /// Answer to [`Request::Release`]: one flag per id (false when no lease was held).
    Released(Vec<bool>),
    /// Answer to [`Request::ObjectInfo`].
    Object(Option<ObjectInfo>),
    /// How many cache entries an invalidation dropped.
    Invalidated(u64),
    /// Answer to [`Request::CancelTask`]: whether the task was cancelled.
    Cancelled(bool),
    /// The request failed.
    Error {
        /// What kind of failure.
        kind: RemoteKind,
        /// Details.
        message: String,
    },
}

/// A value with tensors, as sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Payload {
    /// The value tree.
    pub value: Node,
    /// Tensors the tree's [`Node::Tensor`] leaves index.
    pub tensors: Vec<TensorDesc>,
    /// Storages the tensors index.
    pub storages: Vec<StorageDesc>,
}

/// One node of a value tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub enum Node {
    /// No value.
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A byte string.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A list.
    List(Vec<Node>),
    /// A tuple (kept apart from lists so Python gets back what it sent).
    Tuple(Vec<Node>),
    /// A map with string keys, in order.
    Map(Vec<(String, Node)>),
    /// Tensor number `n` of the payload's table.
    Tensor(u32),
    /// A value with a meaning given by its tag (for example a module's structure).
    Tagged(String, Box<Node>),
}

/// Which library a tensor came from, so the receiver hands back the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Framework {
    /// A numpy array.
    Numpy,
    /// A torch tensor.
    Torch,
}

/// One tensor: a strided view into a storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDesc {
    /// Index into [`Payload::storages`].
    pub storage: u32,
    /// Byte offset of element 0 in the storage.
    pub offset: u64,
    /// Element type (tensorwire's canonical name, e.g. `f32`, `bf16`).
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Strides in elements (never negative).
    pub strides: Vec<u64>,
    /// What the sender had.
    pub framework: Framework,
    /// torch's `requires_grad` (false for numpy).
    pub requires_grad: bool,
}

/// Where a storage's bytes are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorageDesc {
    /// Length in bytes.
    pub len: u64,
    /// The memory holding them.
    pub location: Location,
}

/// The memory behind a storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Location {
    /// Bytes `offset..offset+len` of descriptor number `fd` of the frame (a memfd).
    Memfd {
        /// Index into the frame's descriptors.
        fd: u32,
        /// Byte offset in the memfd.
        offset: u64,
    },
    /// Bytes `offset..offset+len` of a CUDA allocation shared by IPC handle.
    Cuda {
        /// UUID of the device holding it (16 bytes).
        #[serde(with = "serde_bytes")]
        device_uuid: Vec<u8>,
        /// `cuIpcGetMemHandle` of the allocation's base (64 bytes).
        #[serde(with = "serde_bytes")]
        handle: Vec<u8>,
        /// Size of the whole allocation.
        alloc_size: u64,
        /// Offset of the storage in the allocation.
        offset: u64,
        /// An IPC event the consumer's stream must wait on first (64 bytes), if any.
        #[serde(with = "serde_bytes")]
        event: Vec<u8>,
    },
    /// A CUDA storage of no bytes (it has no allocation to share): only its device.
    CudaEmpty {
        /// UUID of the device (16 bytes).
        #[serde(with = "serde_bytes")]
        device_uuid: Vec<u8>,
    },
}

/// A result as sent to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedValue {
    /// The value.
    pub payload: Arc<Payload>,
    /// The object that keeps it alive on the server, when there is one; the client
    /// holds one lease on it and gives it back with [`Request::Release`].
    pub object: Option<ObjectRef>,
    /// True when the value came from the server's cache.
    pub cached: bool,
}

/// A server-side object a client holds a lease on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// The object's id.
    pub object_id: String,
    /// The server that issued it.
    pub server_id: String,
    /// True when the endpoint is `managed` (the client sees an explicit handle).
    pub managed: bool,
}

/// An object's bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// The object's id.
    pub object_id: String,
    /// The server holding it.
    pub server_id: String,
    /// The endpoint that made it.
    pub endpoint: String,
    /// Its cache key, when it is cached.
    pub cache_key: Option<String>,
    /// Leases held on it, over all connections.
    pub leases: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: f64,
    /// Last time a call returned it, seconds since the Unix epoch.
    pub last_accessed_at: f64,
    /// Bytes of tensor storage it shares.
    pub bytes: u64,
}

/// A registered endpoint, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointInfo {
    /// Its name.
    pub name: String,
    /// How it runs.
    pub options: EndpointOptions,
}

/// How an endpoint runs and shares its results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointOptions {
    /// `direct` (runs on the connection's thread) or `task` (on the task pool).
    pub execution: Execution,
    /// Results come back as handles with explicit release.
    pub managed: bool,
    /// One call at a time, or as many as arrive.
    pub concurrency: Concurrency,
    /// Results are cached by call key.
    pub cache: bool,
    /// Concurrent identical calls build once.
    pub singleflight: bool,
    /// The cache-key template (informational; the endpoint's adapter formats it).
    pub cache_format_key: Option<String>,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            execution: Execution::Direct,
            managed: false,
            concurrency: Concurrency::Parallel,
            cache: true,
            singleflight: true,
            cache_format_key: None,
        }
    }
}

/// Where an endpoint runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Execution {
    /// On the thread serving the request.
    Direct,
    /// On the server's bounded task pool.
    Task,
}

/// Whether calls of one endpoint may overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Concurrency {
    /// One at a time.
    Serialized,
    /// Any number at once.
    Parallel,
}

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Queued.
    Pending,
    /// Running.
    Running,
    /// Finished with a result.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled before it ran.
    Cancelled,
}

impl TaskState {
    /// True once the task will not change again.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }
}

/// A task's state and times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task's id.
    pub task_id: String,
    /// The endpoint it runs.
    pub endpoint: String,
    /// Its state.
    pub state: TaskState,
    /// Submission time, seconds since the Unix epoch.
    pub created_at: f64,
    /// When it started running.
    pub started_at: Option<f64>,
    /// When it finished.
    pub finished_at: Option<f64>,
    /// The error, when it failed.
    pub error: Option<String>,
}

/// What a server reports about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// Random id, new every time a server starts.
    pub server_id: String,
    /// Crate version.
    pub version: String,
    /// Protocol version.
    pub protocol: u16,
    /// Server process id.
    pub pid: u32,
    /// The socket path.
    pub socket_path: String,
    /// Start time, seconds since the Unix epoch.
    pub started_at: f64,
    /// UUIDs of the CUDA devices the server sees (hex), empty without CUDA.
    pub devices: Vec<String>,
    /// Counters, by name.
    pub counters: Vec<(String, u64)>,
}

/// Encodes a message as CBOR.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(message, &mut out)
        .map_err(|e| IpcError::protocol(format!("cannot encode message: {e}")))?;
    Ok(out)
}

/// Decodes a CBOR message, refusing nesting deeper than [`MAX_DECODE_DEPTH`] and any
/// bytes after the message.
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    let mut reader = body;
    let message = ciborium::de::from_reader_with_recursion_limit(&mut reader, MAX_DECODE_DEPTH)
        .map_err(|e| IpcError::protocol(format!("malformed message: {e}")))?;
    if !reader.is_empty() {
        return Err(IpcError::protocol(format!(
            "{} bytes after the message",
            reader.len()
        )));
    }
    Ok(message)
}

impl Payload {
    /// A payload with no tensors.
    pub fn plain(value: Node) -> Payload {
        Payload {
            value,
            ..Payload::default()
        }
    }

    /// Checks the payload is self-consistent for a frame that carried `fd_count`
    /// descriptors: tensor indices in the tree, storage indices, dtypes, shapes, every
    /// tensor's extent inside its storage, descriptor indices and CUDA field sizes.
    /// Sizes of the memfds themselves are checked when they are mapped.
    pub fn validate(&self, fd_count: usize) -> Result<()> {
        check_tree(&self.value, self.tensors.len())?;
        for (i, storage) in self.storages.iter().enumerate() {
            match &storage.location {
                Location::Memfd { fd, offset } => {
                    if *fd as usize >= fd_count {
                        return Err(IpcError::protocol(format!(
                            "storage {i} names descriptor {fd}, but the frame carried {fd_count}"
                        )));
                    }
                    offset.checked_add(storage.len).ok_or_else(|| {
                        IpcError::protocol(format!("storage {i}: offset + length overflows"))
                    })?;
                }
                Location::Cuda {
                    device_uuid,
                    handle,
                    alloc_size,
                    offset,
                    event,
                } => {
                    if device_uuid.len() != 16 || handle.len() != 64 {
                        return Err(IpcError::protocol(format!(
                            "storage {i}: CUDA device UUID must be 16 bytes and handle 64"
                        )));
                    }
                    if !(event.is_empty() || event.len() == 64) {
                        return Err(IpcError::protocol(format!(
                            "storage {i}: CUDA event handle must be 64 bytes"
                        )));
                    }
                    let end = offset.checked_add(storage.len);
                    if end.is_none_or(|end| end > *alloc_size) {
                        return Err(IpcError::protocol(format!(
                            "storage {i}: bytes {offset}+{} lie outside the {alloc_size}-byte allocation",
                            storage.len
                        )));
                    }
                }
                Location::CudaEmpty { device_uuid } => {
                    if device_uuid.len() != 16 || storage.len != 0 {
                        return Err(IpcError::protocol(format!(
                            "storage {i}: an empty CUDA storage has a 16-byte device UUID \
                             and no bytes"
                        )));
                    }
                }
            }
        }
        for (i, tensor) in self.tensors.iter().enumerate() {
            tensor
                .check(&self.storages)
                .map_err(|e| IpcError::protocol(format!("tensor {i}: {e}")))?;
        }
        Ok(())
    }
}

impl Location {
    /// Bytes `offset..` of an exported CUDA allocation, with the producer's event.
    pub fn cuda(export: &CudaExport, offset: u64, event: Option<[u8; 64]>) -> Location {
        Location::Cuda {
            device_uuid: export.device_uuid.to_vec(),
            handle: export.handle.to_vec(),
            alloc_size: export.alloc_size,
            offset,
            event: event.map(|e| e.to_vec()).unwrap_or_default(),
        }
    }

    /// The UUID of a CUDA location's device (`None` for a memfd or a UUID of the wrong
    /// size).
    pub fn cuda_device_uuid(&self) -> Option<[u8; 16]> {
        match self {
            Location::Cuda { device_uuid, .. } | Location::CudaEmpty { device_uuid } => {
                device_uuid.as_slice().try_into().ok()
            }
            Location::Memfd { .. } => None,
        }
    }

    /// For a CUDA location: the export to open (its `base` is unknown here: 0), the
    /// offset in the allocation and the event to wait on. `None` for a memfd location,
    /// an empty CUDA storage, or fields of the wrong size ([`Payload::validate`] refuses those).
    pub fn cuda_export(&self) -> Option<(CudaExport, u64, Option<[u8; 64]>)> {
        let Location::Cuda {
            device_uuid,
            handle,
            alloc_size,
            offset,
            event,
        } = self
        else {
            return None;
        };
        let export = CudaExport {
            device_uuid: device_uuid.as_slice().try_into().ok()?,
            handle: handle.as_slice().try_into().ok()?,
            base: 0,
            alloc_size: *alloc_size,
        };
        Some((export, *offset, event.as_slice().try_into().ok()))
    }
}

impl TensorDesc {
    /// The tensor's dtype.
    pub fn dtype(&self) -> Result<DType> {
        self.dtype
            .parse::<DType>()
            .map_err(|_| IpcError::protocol(format!("unknown dtype {:?}", self.dtype)))
    }

    fn check(&self, storages: &[StorageDesc]) -> Result<(), String> {
        let dtype = self.dtype().map_err(|e| e.to_string())?;
        if dtype.size().is_none() {
            return Err(format!("dtype {dtype} has elements smaller than a byte"));
        }
        if self.shape.len() > MAX_NDIM {
            return Err(format!("{} dimensions, above {MAX_NDIM}", self.shape.len()));
        }
        self.shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| format!("more than {MAX_ELEMENTS} elements"))?;
        if self.strides.len() != self.shape.len() {
            return Err(format!(
                "{} strides for {} dimensions",
                self.strides.len(),
                self.shape.len()
            ));
        }
        let storage = storages
            .get(self.storage as usize)
            .ok_or_else(|| format!("storage {} does not exist", self.storage))?;
        let extent =
            strided::extent_bytes(dtype, &self.shape, &self.strides).map_err(|e| e.to_string())?;
        let end = self
            .offset
            .checked_add(extent)
            .ok_or_else(|| "offset + extent overflows".to_string())?;
        // An empty tensor reaches no byte, but its offset must still lie in the storage.
        if end > storage.len {
            return Err(format!(
                "bytes {}..{end} lie outside its {}-byte storage",
                self.offset, storage.len
            ));
        }
        Ok(())
    }
}

fn check_tree(node: &Node, tensor_count: usize) -> Result<()> {
    // Iterative, so a deep tree that passed the decoder's depth cap cannot overflow
    // the stack here either.
    let mut stack = vec![node];
    while let Some(node) = stack.pop() {
        match node {
            Node::Tensor(i) if *i as usize >= tensor_count => {
                return Err(IpcError::protocol(format!(
                    "value names tensor {i}, but the payload lists {tensor_count}"
                )))
            }
            Node::List(items) | Node::Tuple(items) => stack.extend(items),
            Node::Map(entries) => stack.extend(entries.iter().map(|(_, v)| v)),
            Node::Tagged(_, inner) => stack.push(inner),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> Payload {
        Payload {
            value: Node::Map(vec![
                ("w".into(), Node::Tensor(0)),
                (
                    "n".into(),
                    Node::Tuple(vec![Node::Int(-3), Node::Float(0.5)]),
                ),
                ("b".into(), Node::Bytes(vec![1, 2, 3])),
            ]),
            tensors: vec![TensorDesc {
                storage: 0,
                offset: 64,
                dtype: "f32".into(),
                shape: vec![2, 3],
                strides: vec![3, 1],
                framework: Framework::Torch,
                requires_grad: false,
            }],
            storages: vec![StorageDesc {
                len: 64 + 24,
                location: Location::Memfd { fd: 0, offset: 0 },
            }],
        }
    }

    #[test]
    fn requests_round_trip() {
        let request = Request::Call {
            endpoint: "load".into(),
            args: Arc::new(payload()),
        };
        let bytes = encode(&request).unwrap();
        assert_eq!(decode::<Request>(&bytes).unwrap(), request);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<Request>(&longer).is_err());
        assert!(decode::<Request>(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn validation_catches_lies() {
        let good = payload();
        good.validate(1).unwrap();
        assert!(
            good.validate(0).is_err(),
            "descriptor index beyond the frame"
        );

        let mut p = good.clone();
        p.value = Node::List(vec![Node::Tensor(1)]);
        assert!(p.validate(1).is_err());

        let mut p = good.clone();
        p.tensors[0].shape = vec![2, 4];
        let err = p.validate(1).unwrap_err().to_string();
        assert!(err.contains("outside"), "{err}");

        let mut p = good.clone();
        p.tensors[0].strides = vec![u64::MAX, 1];
        assert!(p.validate(1).is_err());

        let mut p = good.clone();
        p.tensors[0].shape = vec![1 << 31, 1 << 31];
        p.tensors[0].strides = vec![0, 0];
        let err = p.validate(1).unwrap_err().to_string();
        assert!(err.contains("elements"), "{err}");

        let mut p = good.clone();
        p.tensors[0].dtype = "f128".into();
        assert!(p.validate(1).is_err());

        // An empty tensor reaches no byte, but its offset must lie in its storage.
        let mut p = good.clone();
        p.tensors[0].shape = vec![0, 3];
        p.tensors[0].offset = 88;
        p.validate(1).unwrap();
        p.tensors[0].offset = 89;
        assert!(p.validate(1).is_err(), "an empty tensor past its storage");

        let mut p = good.clone();
        p.storages[0].location = Location::Cuda {
            device_uuid: vec![0; 16],
            handle: vec![0; 64],
            alloc_size: 80,
            offset: 0,
            event: vec![],
        };
        assert!(p.validate(0).is_err(), "storage beyond its allocation");
    }

    #[test]
    fn cuda_locations_round_trip_their_export() {
        let export = CudaExport {
            device_uuid: [7; 16],
            handle: [9; 64],
            base: 0,
            alloc_size: 4096,
        };
        let with_event = Location::cuda(&export, 128, Some([1; 64]));
        assert_eq!(
            with_event.cuda_export(),
            Some((export.clone(), 128, Some([1; 64])))
        );
        let without = Location::cuda(&export, 0, None);
        assert_eq!(without.cuda_export(), Some((export, 0, None)));
        assert_eq!(without.cuda_device_uuid(), Some([7; 16]));
        assert_eq!(Location::Memfd { fd: 0, offset: 0 }.cuda_export(), None);
        assert_eq!(
            Location::Memfd { fd: 0, offset: 0 }.cuda_device_uuid(),
            None
        );
    }

    #[test]
    fn empty_cuda_storages_carry_only_a_device() {
        let empty = Location::CudaEmpty {
            device_uuid: vec![5; 16],
        };
        assert_eq!(empty.cuda_export(), None, "nothing to open");
        assert_eq!(empty.cuda_device_uuid(), Some([5; 16]));

        let mut p = payload();
        p.tensors[0].shape = vec![0, 3];
        p.storages[0] = StorageDesc {
            len: 0,
            location: empty.clone(),
        };
        p.tensors[0].offset = 0;
        p.validate(0).unwrap();
        let request = Request::Call {
            endpoint: "e".into(),
            args: Arc::new(p.clone()),
        };
        assert_eq!(
            decode::<Request>(&encode(&request).unwrap()).unwrap(),
            request
        );

        let mut with_bytes = p.clone();
        with_bytes.storages[0].len = 8;
        assert!(
            with_bytes.validate(0).is_err(),
            "an empty storage with bytes"
        );
        let mut short_uuid = p;
        short_uuid.storages[0].location = Location::CudaEmpty {
            device_uuid: vec![5; 15],
        };
        assert!(short_uuid.validate(0).is_err(), "a 15-byte UUID");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        // 100 000 nested one-element CBOR arrays inside a Node::List variant map.
        let mut bytes = Vec::new();
        for _ in 0..100_000 {
            bytes.extend_from_slice(&[0xa1, 0x64, b'L', b'i', b's', b't', 0x81]);
        }
        bytes.push(0xf6);
        assert!(decode::<Node>(&bytes).is_err());
    }
}
