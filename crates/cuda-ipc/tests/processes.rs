//! The control plane and the CPU data plane between real processes: tensors shared
//! through memfds both ways, leases given back when a client is SIGKILLed, a dead
//! server reported as such, refused peers, malformed and oversized frames,
//! singleflight across clients, and the task lifecycle over the socket.
//!
//! Children are this test binary run again with `TW_IPC_CHILD` naming their role (the
//! `child` test dispatches on it and is ignored in normal runs).

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_cuda_ipc::cpu::copy_serial;
use tensorwire_cuda_ipc::frame::{FrameKind, Header, HEADER_LEN};
use tensorwire_cuda_ipc::schema::*;
use tensorwire_cuda_ipc::service::Endpoint;
use tensorwire_cuda_ipc::*;

mod support;
use support::expect_line;

const ROLE: &str = "TW_IPC_CHILD";
const SOCKET: &str = "TW_IPC_SOCKET";

/// Where an endpoint waits until the test lets it go (instead of sleeping for a time
/// a stalled thread could outlast).
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

fn socket_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ipc.sock")
}

fn f32_tensor(storage: u32, n: u64) -> TensorDesc {
    TensorDesc {
        storage,
        offset: 0,
        dtype: "f32".into(),
        shape: vec![n],
        strides: vec![1],
        framework: Framework::Numpy,
        requires_grad: false,
    }
}

/// `n` float32 values `start, start+1, …` as bytes.
fn ramp(start: f32, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (start + i as f32).to_le_bytes())
        .collect()
}

fn one_tensor(bytes: &[u8]) -> Outgoing {
    let mut b = OutgoingBuilder::new();
    let s = b.cpu_storage(bytes).unwrap();
    let t = b.tensor(f32_tensor(s, (bytes.len() / 4) as u64)).unwrap();
    b.finish(Node::Tensor(t), copy_serial).unwrap()
}

fn int_arg(n: i64) -> Outgoing {
    Outgoing::plain(Node::Tuple(vec![Node::Int(n)]))
}

fn first_int(args: &Incoming) -> i64 {
    match &args.payload.value {
        Node::Tuple(items) => match items.first() {
            Some(Node::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// The endpoints every test server has.
fn register_endpoints(server: &Server) {
    let service = server.service();
    // `make(n)`: a managed, cached float32 ramp of n values.
    service.register(Endpoint::new(
        "make",
        EndpointOptions {
            managed: true,
            ..EndpointOptions::default()
        },
        Arc::new(|args| Ok(one_tensor(&ramp(0.0, first_int(&args) as usize)))),
        None,
    ));
    // `echo(x)`: sends back what it got (same memfd ranges).
    service.register(support::echo_endpoint());
    // `slow(n)`: takes 300 ms; singleflight + cache.
    service.register(Endpoint::new(
        "slow",
        EndpointOptions::default(),
        Arc::new(|args| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(Outgoing::plain(Node::Int(first_int(&args) * 2)))
        }),
        None,
    ));
    // `build(n)`: a task endpoint taking n milliseconds.
    service.register(Endpoint::new(
        "build",
        EndpointOptions {
            execution: Execution::Task,
            cache: false,
            singleflight: false,
            ..EndpointOptions::default()
        },
        Arc::new(|args| {
            let ms = first_int(&args);
            std::thread::sleep(Duration::from_millis(ms as u64));
            if ms == 13 {
                return Err(IpcError::remote(
                    RemoteKind::EndpointFailed,
                    "RuntimeError: unlucky",
                ));
            }
            Ok(Outgoing::plain(Node::Int(ms)))
        }),
        None,
    ));
}

fn start_server(path: &Path) -> Server {
    let server = Server::new(ServerConfig::new(path)).unwrap();
    register_endpoints(&server);
    server.start().unwrap();
    server
}

fn spawn_child(role: &str, path: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    support::spawn_child(ROLE, role, SOCKET, path)
}

fn kill(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

fn storage_f32(incoming: Incoming) -> (Vec<f32>, Vec<ReceivedStorage>) {
    let (_payload, storages) = incoming.storages().unwrap();
    let Some(bytes) = storages[0].bytes() else {
        panic!("expected a CPU storage")
    };
    let values = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (values, storages)
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child() {
    let Some((role, path)) = support::child_role(ROLE, SOCKET) else {
        return;
    };
    match role.as_str() {
        "server" => {
            let server = start_server(&path);
            println!("ready");
            std::io::stdout().flush().unwrap();
            server.wait();
        }
        "client-holding" => {
            let client = Client::connect(&path, ClientOptions::default()).unwrap();
            let (shared, incoming) = client.call("make", &int_arg(1000)).unwrap();
            assert!(shared.object.is_some());
            let (values, _storages) = storage_f32(incoming);
            assert_eq!(values[999], 999.0);
            println!("leased");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn cpu_tensors_cross_processes_without_copies() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let (mut server, mut out) = spawn_child("server", &path);
    expect_line(&mut out, "ready");
    let client = Client::connect(&path, ClientOptions::default()).unwrap();

    // Server → client: a managed result, then the same object from the cache.
    let (first, incoming) = client.call("make", &int_arg(256 * 1024)).unwrap();
    let (values, first_storages) = storage_f32(incoming);
    assert_eq!(values.len(), 256 * 1024);
    assert!(values.iter().enumerate().all(|(i, &v)| v == i as f32));
    let (second, incoming) = client.call("make", &int_arg(256 * 1024)).unwrap();
    assert!(second.cached);
    let (_, second_storages) = storage_f32(incoming);
    let seg = |s: &ReceivedStorage| match s {
        ReceivedStorage::Cpu { segment, .. } => segment.clone(),
        _ => unreachable!(),
    };
    assert!(
        Arc::ptr_eq(&seg(&first_storages[0]), &seg(&second_storages[0])),
        "the cached result's memfd is mapped once in this process"
    );
    let object = first.object.unwrap();
    assert_eq!(second.object.unwrap().object_id, object.object_id);
    assert_eq!(
        client
            .object_info(&object.object_id)
            .unwrap()
            .unwrap()
            .leases,
        2
    );
    assert_eq!(
        client
            .release(&[object.object_id.clone(), object.object_id.clone()])
            .unwrap(),
        vec![true, true]
    );
    client
        .ensure_live(&object.object_id, &object.server_id)
        .unwrap(); // still cached

    // Client → server → client: the echo comes back as our own memory.
    let data = ramp(5.0, 1 << 18);
    let args = one_tensor(&data);
    let (_, incoming) = client.call("echo", &args).unwrap();
    let (values, storages) = storage_f32(incoming);
    assert_eq!(values[0], 5.0);
    assert!(
        Arc::ptr_eq(&seg(&storages[0]), &args.segments[0]),
        "echo maps back to our own segment"
    );

    let info = client.server_info().unwrap();
    assert_eq!(info.server_id, client.server_id());
    assert!(info
        .counters
        .iter()
        .any(|(k, v)| k == "cache_hits" && *v >= 1));
    kill(&mut server);
}

#[test]
fn leases_are_given_back_when_a_client_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let server = start_server(&path);
    let (mut child, mut out) = spawn_child("client-holding", &path);
    expect_line(&mut out, "leased");
    assert_eq!(server.service().live(), (1, 1));
    kill(&mut child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.service().live().1 != 0 {
        assert!(
            Instant::now() < deadline,
            "the dead client's lease was not given back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The object stays cached for the next caller.
    assert_eq!(server.service().live(), (1, 0));
    let counters = server.info().counters;
    assert!(counters
        .iter()
        .any(|(k, v)| k == "leases_dropped_on_disconnect" && *v == 1));
}

#[test]
fn a_dead_server_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let (mut server, mut out) = spawn_child("server", &path);
    expect_line(&mut out, "ready");
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    client.ping().unwrap();
    let id = client.server_id().to_owned();
    kill(&mut server);
    match client.ping() {
        Err(IpcError::ServerGone { server_id, .. }) => {
            assert_eq!(server_id.as_deref(), Some(id.as_str()))
        }
        other => panic!("expected ServerGone, got {other:?}"),
    }
    assert!(matches!(
        Client::connect(&path, ClientOptions::default()),
        Err(IpcError::ServerGone {
            server_id: None,
            ..
        })
    ));
    // A new server on the same path: the old id's objects are stale.
    let (mut server, mut out) = spawn_child("server", &path);
    expect_line(&mut out, "ready");
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    assert_ne!(client.server_id(), id);
    assert!(matches!(
        client.ensure_live("x-obj-1", &id),
        Err(IpcError::StaleHandle { .. })
    ));
    kill(&mut server);
}

#[test]
fn peers_of_other_users_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let mut config = ServerConfig::new(&path);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    config.peers = PeerPolicy {
        allowed_uids: vec![me.wrapping_add(1)],
    };
    let server = Server::new(config).unwrap();
    server.start().unwrap();
    match Client::connect(&path, ClientOptions::default()) {
        Err(IpcError::Remote {
            kind: RemoteKind::Refused,
            message,
        }) => {
            assert!(message.contains(&format!("uid {me}")), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    assert!(server
        .info()
        .counters
        .iter()
        .any(|(k, v)| k == "peers_refused" && *v == 1));
    // The socket file is private.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

fn raw_answer(stream: &mut UnixStream) -> (Header, Response) {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).unwrap();
    let header = Header::decode(&header, &Default::default()).unwrap();
    let mut body = vec![0u8; header.body_len as usize];
    stream.read_exact(&mut body).unwrap();
    (header, decode(&body).unwrap())
}

#[test]
fn malformed_and_oversized_frames_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let server = start_server(&path);

    // Not our protocol at all: an error answer, then the connection closes.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let (_, answer) = raw_answer(&mut s);
    assert!(
        matches!(answer, Response::Error { kind: RemoteKind::BadRequest, ref message } if message.contains("magic"))
    );
    // Closed: end of stream, or a reset because the server left our bytes unread.
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
    }

    // A header announcing 1 GiB: refused before any of it is read.
    let mut s = UnixStream::connect(&path).unwrap();
    let big = Header {
        kind: FrameKind::Request,
        fd_count: 0,
        request_id: 9,
        body_len: 1 << 30,
    };
    s.write_all(&big.encode()).unwrap();
    let (_, answer) = raw_answer(&mut s);
    assert!(
        matches!(answer, Response::Error { ref message, .. } if message.contains("above the limit"))
    );

    // A good header with a body that is not CBOR: an error for that request, and the
    // connection still works.
    let mut s = UnixStream::connect(&path).unwrap();
    let body = [0xff, 0x00, 0x13];
    let header = Header {
        kind: FrameKind::Request,
        fd_count: 0,
        request_id: 5,
        body_len: body.len() as u32,
    };
    s.write_all(&header.encode()).unwrap();
    s.write_all(&body).unwrap();
    let (h, answer) = raw_answer(&mut s);
    assert_eq!(h.request_id, 5);
    assert!(matches!(
        answer,
        Response::Error {
            kind: RemoteKind::BadRequest,
            ..
        }
    ));
    let ping = encode(&Request::Ping).unwrap();
    let header = Header {
        kind: FrameKind::Request,
        fd_count: 0,
        request_id: 6,
        body_len: ping.len() as u32,
    };
    s.write_all(&header.encode()).unwrap();
    s.write_all(&ping).unwrap();
    assert_eq!(raw_answer(&mut s).1, Response::Pong);

    // A payload that lies about its tensor: refused, typed.
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    let mut lying = int_arg(1);
    Arc::make_mut(&mut lying.payload)
        .tensors
        .push(f32_tensor(3, 10));
    let err = client.call("echo", &lying).unwrap_err();
    assert!(
        matches!(
            err,
            IpcError::Remote {
                kind: RemoteKind::BadRequest,
                ..
            }
        ),
        "{err}"
    );
    drop(server);
}

#[test]
fn singleflight_builds_once_for_concurrent_clients() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let server = start_server(&path);
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let client = Client::connect(&path, ClientOptions::default()).unwrap();
                let (shared, _) = client.call("slow", &int_arg(21)).unwrap();
                assert_eq!(shared.payload.value, Node::Int(42));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let counters: std::collections::HashMap<_, _> = server.info().counters.into_iter().collect();
    assert_eq!(counters["builds"], 1, "{counters:?}");
    assert_eq!(counters["calls"], 6);
}

#[test]
fn task_lifecycle_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let mut config = ServerConfig::new(&path);
    config.service.tasks.workers = 1;
    let server = Server::new(config).unwrap();
    register_endpoints(&server);
    // `held(n)`: a task endpoint that answers n once the test opens its gate, so the
    // one worker stays busy for exactly as long as the test needs.
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    server.service().register(Endpoint::new(
        "held",
        EndpointOptions {
            execution: Execution::Task,
            cache: false,
            singleflight: false,
            ..EndpointOptions::default()
        },
        Arc::new(move |args| {
            held.wait();
            Ok(Outgoing::plain(Node::Int(first_int(&args))))
        }),
        None,
    ));
    server.start().unwrap();
    let client = Client::connect(&path, ClientOptions::default()).unwrap();

    let long = client.submit("held", &int_arg(300)).unwrap();
    let queued = client.submit("build", &int_arg(1)).unwrap();
    let failing = client.submit("build", &int_arg(13)).unwrap();
    assert!(
        client.cancel_task(&queued).unwrap(),
        "a queued task can be cancelled"
    );
    assert_eq!(
        client.task_status(&queued).unwrap().state,
        TaskState::Cancelled
    );
    // A short wait on a task not finished returns its state without waiting for it.
    let info = client
        .wait_task(&long, Some(Duration::from_millis(20)))
        .unwrap();
    assert!(!info.state.is_finished());
    gate.open();
    let info = client
        .wait_task(&long, Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(info.state, TaskState::Completed);
    assert!(info.started_at.is_some() && info.finished_at.is_some());
    let (value, _) = client.task_result(&long).unwrap();
    assert_eq!(value.payload.value, Node::Int(300));
    let info = client
        .wait_task(&failing, Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(info.state, TaskState::Failed);
    match client.task_result(&failing) {
        Err(IpcError::Remote {
            kind: RemoteKind::EndpointFailed,
            message,
        }) => assert!(message.contains("unlucky")),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(matches!(
        client.task_result(&queued),
        Err(IpcError::Remote {
            kind: RemoteKind::Cancelled,
            ..
        })
    ));
    assert_eq!(client.list_tasks(None).unwrap().len(), 3);
    assert_eq!(client.list_tasks(Some(TaskState::Failed)).unwrap().len(), 1);
    assert!(matches!(
        client.task_status("nope"),
        Err(IpcError::Remote {
            kind: RemoteKind::UnknownTask,
            ..
        })
    ));
    let endpoints = client.list_endpoints().unwrap();
    assert_eq!(
        endpoints
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        ["build", "echo", "held", "make", "slow"]
    );
}

#[test]
fn invalidation_and_a_stale_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let _server = start_server(&path);
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    let (shared, _) = client.call("make", &int_arg(10)).unwrap();
    let object = shared.object.unwrap();
    assert_eq!(
        client
            .invalidate_call("make", &int_arg(10).payload)
            .unwrap(),
        1
    );
    assert_eq!(
        client
            .invalidate_call("make", &int_arg(10).payload)
            .unwrap(),
        0
    );
    client
        .ensure_live(&object.object_id, &object.server_id)
        .unwrap(); // our lease holds it
    client
        .release(std::slice::from_ref(&object.object_id))
        .unwrap();
    assert!(matches!(
        client.ensure_live(&object.object_id, &object.server_id),
        Err(IpcError::StaleHandle { .. })
    ));
    client.call("make", &int_arg(10)).unwrap();
    client.call("make", &int_arg(11)).unwrap();
    assert_eq!(client.invalidate_endpoint("make").unwrap(), 2);
    assert!(matches!(
        client.invalidate_endpoint("nope"),
        Err(IpcError::Remote {
            kind: RemoteKind::UnknownEndpoint,
            ..
        })
    ));
}

#[test]
fn an_answer_cut_off_mid_frame_makes_the_connection_unusable() {
    use tensorwire_cuda_ipc::socket::{recv_frame, send_frame, Received};
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // A fake server: greets properly, then at once writes half the answer to the next
    // request (the client numbers its requests one after another), and keeps the
    // connection open until the test is done. The half frame waits in the socket before
    // the request is sent, so no stalled thread can make the client's wait end early.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let limits = Default::default();
        let Received::Frame(hello) = recv_frame(&stream, &limits, Duration::from_secs(30)).unwrap()
        else {
            panic!()
        };
        let body = encode(&Response::Hello {
            server_id: "fake".into(),
            version: "0".into(),
        })
        .unwrap();
        send_frame(
            &stream,
            FrameKind::Response,
            hello.header.request_id,
            &body,
            &[],
        )
        .unwrap();
        let header = Header {
            kind: FrameKind::Response,
            fd_count: 0,
            request_id: hello.header.request_id + 1,
            body_len: 100,
        };
        (&stream).write_all(&header.encode()).unwrap();
        (&stream).write_all(&[0u8; 10]).unwrap();
        let _ = finished.recv();
    });
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    let short = Some(Duration::from_millis(200));
    assert!(matches!(
        client.request(&Request::Ping, None, short),
        Err(IpcError::Timeout { .. })
    ));
    let err = client.ping().unwrap_err();
    assert!(err.to_string().contains("unusable"), "{err}");
    done.send(()).unwrap();
    fake.join().unwrap();
}

#[test]
fn a_late_answer_gives_its_lease_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    let server = start_server(&path);
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    server.service().register(Endpoint::new(
        "slow_managed",
        EndpointOptions {
            managed: true,
            cache: false,
            singleflight: false,
            ..EndpointOptions::default()
        },
        Arc::new(move |_| {
            held.wait();
            Ok(one_tensor(&ramp(0.0, 4)))
        }),
        None,
    ));
    // Only the slow call has a short timeout; the endpoint answers once it has passed.
    let client = Client::connect(&path, ClientOptions::default()).unwrap();
    client.set_timeout(Duration::from_millis(100));
    assert!(matches!(
        client.call("slow_managed", &Outgoing::plain(Node::Null)),
        Err(IpcError::Timeout { .. })
    ));
    client.set_timeout(ClientOptions::default().timeout);
    assert_eq!(client.timeout(), Duration::from_secs(60));
    gate.open();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.service().live() != (1, 1) {
        assert!(
            Instant::now() < deadline,
            "the late answer never held a lease"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50)); // its frame is on its way
    assert_eq!(
        server.service().live(),
        (1, 1),
        "the late answer holds a lease"
    );
    client.ping().unwrap(); // reads (and skips) the late answer
    client.ping().unwrap(); // gives its lease back first
    assert_eq!(server.service().live(), (0, 0));
}
