//! Writes a seed corpus for `ipc_message`: representative requests, responses and
//! payloads of `tensorwire-cuda-ipc`, each as a bare CBOR body and (requests and
//! responses) with a frame header in front.
//!
//! cargo run --release --example gen_ipc_seeds -- corpus/ipc_message

use std::path::PathBuf;

use tensorwire_cuda_ipc::frame::{FrameKind, Header};
use tensorwire_cuda_ipc::schema::*;
use tensorwire_cuda_ipc::RemoteKind;

fn tensor(storage: u32, offset: u64, dtype: &str, shape: &[u64], strides: &[u64]) -> TensorDesc {
    TensorDesc {
        storage,
        offset,
        dtype: dtype.into(),
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        framework: Framework::Torch,
        requires_grad: false,
    }
}

/// Two tensors over one memfd storage, plus every plain node kind.
fn memfd_payload() -> Payload {
    Payload {
        value: Node::Map(vec![
            ("w".into(), Node::Tensor(0)),
            (
                "rest".into(),
                Node::Tuple(vec![
                    Node::Tensor(1),
                    Node::Int(-3),
                    Node::Float(0.5),
                    Node::Bool(true),
                    Node::Null,
                    Node::Str("x".into()),
                    Node::Bytes(vec![1, 2, 3]),
                    Node::List(vec![]),
                ]),
            ),
        ]),
        tensors: vec![
            tensor(0, 0, "f32", &[2, 3], &[3, 1]),
            TensorDesc {
                framework: Framework::Numpy,
                requires_grad: true,
                ..tensor(0, 64, "bf16", &[4, 2], &[1, 4])
            },
        ],
        storages: vec![StorageDesc {
            len: 128,
            location: Location::Memfd {
                fd: 0,
                offset: 4096,
            },
        }],
    }
}

fn cuda_payload() -> Payload {
    Payload {
        value: Node::List(vec![Node::Tensor(0)]),
        tensors: vec![tensor(0, 256, "f16", &[16], &[1])],
        storages: vec![StorageDesc {
            len: 1024,
            location: Location::Cuda {
                device_uuid: (0..16).collect(),
                handle: (0..64).map(|i| i * 3).collect(),
                alloc_size: 1 << 20,
                offset: 2048,
                event: vec![7; 64],
            },
        }],
    }
}

/// An empty CUDA tensor: a storage with a device and no allocation.
fn cuda_empty_payload() -> Payload {
    Payload {
        value: Node::List(vec![Node::Tensor(0)]),
        tensors: vec![tensor(0, 0, "f32", &[0, 3], &[3, 1])],
        storages: vec![StorageDesc {
            len: 0,
            location: Location::CudaEmpty {
                device_uuid: (0..16).collect(),
            },
        }],
    }
}

/// A module-like structure: tagged values nested deep, no tensors (so it has a cache key).
fn deep_payload() -> Payload {
    let mut node = Node::Int(1);
    for i in 0..30 {
        node = if i % 3 == 0 {
            Node::Tagged("torch.nn.Sequential".into(), Box::new(node))
        } else if i % 3 == 1 {
            Node::List(vec![node, Node::Float(f64::NAN)])
        } else {
            Node::Map(vec![("b".into(), node), ("a".into(), Node::Null)])
        };
    }
    Payload::plain(node)
}

fn server_info() -> ServerInfo {
    ServerInfo {
        server_id: "3f2a9c".into(),
        version: "0.1.0".into(),
        protocol: 1,
        pid: 4242,
        socket_path: "/run/user/1000/tensorwire.sock".into(),
        started_at: 1.8e9,
        devices: vec!["GPU-0123456789abcdef".into()],
        counters: vec![("calls".into(), 12), ("cache_hits".into(), 3)],
    }
}

fn task(state: TaskState) -> TaskInfo {
    TaskInfo {
        task_id: "t1".into(),
        endpoint: "train".into(),
        state,
        created_at: 1.0,
        started_at: Some(2.0),
        finished_at: None,
        error: Some("boom".into()),
    }
}

fn requests() -> Vec<(&'static str, Request)> {
    vec![
        (
            "hello",
            Request::Hello {
                protocol: 1,
                client: "python".into(),
            },
        ),
        ("ping", Request::Ping),
        ("server_info", Request::ServerInfo),
        ("list_endpoints", Request::ListEndpoints),
        (
            "call_memfd",
            Request::Call {
                endpoint: "load".into(),
                args: memfd_payload().into(),
            },
        ),
        (
            "call_cuda",
            Request::Call {
                endpoint: "gpu".into(),
                args: cuda_payload().into(),
            },
        ),
        (
            "submit",
            Request::Submit {
                endpoint: "train".into(),
                args: Payload::plain(Node::Map(vec![("epochs".into(), Node::Int(3))])).into(),
            },
        ),
        (
            "wait_task",
            Request::WaitTask {
                task_id: "t1".into(),
                timeout_ms: Some(500),
            },
        ),
        (
            "task_status",
            Request::TaskStatus {
                task_id: "t1".into(),
            },
        ),
        (
            "task_result",
            Request::TaskResult {
                task_id: "t1".into(),
            },
        ),
        (
            "cancel_task",
            Request::CancelTask {
                task_id: "t1".into(),
            },
        ),
        (
            "list_tasks",
            Request::ListTasks {
                state: Some(TaskState::Running),
            },
        ),
        (
            "release",
            Request::Release {
                object_ids: vec!["o1".into(), "o2".into()],
            },
        ),
        (
            "object_info",
            Request::ObjectInfo {
                object_id: "o1".into(),
            },
        ),
        (
            "invalidate_call",
            Request::InvalidateCall {
                endpoint: "load".into(),
                args: deep_payload().into(),
            },
        ),
        (
            "invalidate_endpoint",
            Request::InvalidateEndpoint {
                endpoint: "load".into(),
            },
        ),
    ]
}

fn responses() -> Vec<(&'static str, Response)> {
    vec![
        (
            "hello",
            Response::Hello {
                server_id: "3f2a9c".into(),
                version: "0.1.0".into(),
            },
        ),
        ("pong", Response::Pong),
        ("server_info", Response::ServerInfo(server_info())),
        (
            "endpoints",
            Response::Endpoints(vec![EndpointInfo {
                name: "load".into(),
                options: EndpointOptions {
                    execution: Execution::Task,
                    managed: true,
                    concurrency: Concurrency::Serialized,
                    cache: true,
                    singleflight: false,
                    cache_format_key: Some("{path}".into()),
                },
            }]),
        ),
        (
            "value_memfd",
            Response::Value(SharedValue {
                payload: memfd_payload().into(),
                object: Some(ObjectRef {
                    object_id: "o1".into(),
                    server_id: "3f2a9c".into(),
                    managed: true,
                }),
                cached: true,
            }),
        ),
        (
            "value_cuda",
            Response::Value(SharedValue {
                payload: cuda_payload().into(),
                object: None,
                cached: false,
            }),
        ),
        ("task_id", Response::TaskId("t1".into())),
        ("task", Response::Task(task(TaskState::Failed))),
        (
            "tasks",
            Response::Tasks(vec![task(TaskState::Pending), task(TaskState::Completed)]),
        ),
        ("released", Response::Released(vec![true, false])),
        (
            "object",
            Response::Object(Some(ObjectInfo {
                object_id: "o1".into(),
                server_id: "3f2a9c".into(),
                endpoint: "load".into(),
                cache_key: Some("a1".into()),
                leases: 2,
                created_at: 1.0,
                last_accessed_at: 2.5,
                bytes: 4096,
            })),
        ),
        ("no_object", Response::Object(None)),
        ("invalidated", Response::Invalidated(4)),
        ("cancelled", Response::Cancelled(true)),
        (
            "error",
            Response::Error {
                kind: RemoteKind::UnknownEndpoint,
                message: "no endpoint named \"lod\"".into(),
            },
        ),
    ]
}

fn framed(kind: FrameKind, fd_count: u8, request_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Header {
        kind,
        fd_count,
        request_id,
        body_len: body.len() as u32,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(body);
    out
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: gen_ipc_seeds <dir>"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut n = 0;
    let mut write = |name: String, bytes: Vec<u8>| {
        std::fs::write(dir.join(name), bytes).unwrap();
        n += 1;
    };
    for (i, (name, request)) in requests().into_iter().enumerate() {
        let body = encode(&request).unwrap();
        let fds = u8::from(name == "call_memfd");
        write(
            format!("req_{name}.frame"),
            framed(FrameKind::Request, fds, i as u32 + 1, &body),
        );
        write(format!("req_{name}.cbor"), body);
    }
    for (i, (name, response)) in responses().into_iter().enumerate() {
        let body = encode(&response).unwrap();
        let fds = u8::from(name == "value_memfd");
        write(
            format!("resp_{name}.frame"),
            framed(FrameKind::Response, fds, i as u32 + 1, &body),
        );
        write(format!("resp_{name}.cbor"), body);
    }
    for (name, payload) in [
        ("memfd", memfd_payload()),
        ("cuda", cuda_payload()),
        ("cuda_empty", cuda_empty_payload()),
        ("deep", deep_payload()),
        ("empty", Payload::default()),
    ] {
        write(format!("payload_{name}.cbor"), encode(&payload).unwrap());
    }
    eprintln!("wrote {n} seeds to {}", dir.display());
}
