//! Running out of descriptors (`RLIMIT_NOFILE`), on both sides of a connection.
//!
//! The limit is per process, so every test that lowers it does so in a child: this test
//! binary run again with `TW_FD_CHILD` naming the role (the `child` test dispatches on
//! it and is ignored in normal runs). The parent's own limit is never touched.

use std::io::{BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_cuda_ipc::cpu::copy_serial;
use tensorwire_cuda_ipc::schema::*;
use tensorwire_cuda_ipc::service::Endpoint;
use tensorwire_cuda_ipc::socket::is_out_of_descriptors;
use tensorwire_cuda_ipc::*;

mod support;
use support::expect_line;

const ROLE: &str = "TW_FD_CHILD";
const SOCKET: &str = "TW_FD_SOCKET";

fn nofile() -> (u64, u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a writable rlimit, as getrlimit needs.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    (limit.rlim_cur, limit.rlim_max)
}

/// Sets this (child) process's soft descriptor limit, keeping the hard one.
fn set_soft_nofile(soft: u64) {
    let (_, hard) = nofile();
    let limit = libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit; lowering the soft limit needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

/// Leaves this process about `free` descriptors: new descriptors take the lowest free
/// numbers, so the soft limit goes just above the `free`-th unused number (descriptors
/// open above it stay open). The directory read to find them counts as open, so one
/// more may be free.
fn leave_free(free: usize) {
    let open: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .collect();
    let last_free = (0u64..)
        .filter(|n| !open.contains(n))
        .nth(free - 1)
        .unwrap();
    set_soft_nofile(last_free + 1);
}

/// What the soft limit must be after the crate raised it from `before`.
fn raised(before: u64, hard: u64) -> u64 {
    hard.min(1 << 20).max(before)
}

fn ramp_tensor(n: usize) -> Outgoing {
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut b = OutgoingBuilder::new();
    let s = b.cpu_storage(&bytes).unwrap();
    let t = b
        .tensor(TensorDesc {
            storage: s,
            offset: 0,
            dtype: "f32".into(),
            shape: vec![n as u64],
            strides: vec![1],
            framework: Framework::Numpy,
            requires_grad: false,
        })
        .unwrap();
    b.finish(Node::Tensor(t), copy_serial).unwrap()
}

/// A server with `ramp` (a new managed memfd result per call, not cached) and `echo`.
fn start_server(path: &Path) -> Server {
    let server = Server::new(ServerConfig::new(path)).unwrap();
    let service = server.service();
    service.register(Endpoint::new(
        "ramp",
        EndpointOptions {
            managed: true,
            cache: false,
            singleflight: false,
            ..EndpointOptions::default()
        },
        Arc::new(|_| Ok(ramp_tensor(16))),
        None,
    ));
    service.register(support::echo_endpoint());
    server.start().unwrap();
    server
}

/// A child process, killed when dropped (so a failing test leaves none behind).
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(role: &str, path: &Path) -> (Kid, BufReader<ChildStdout>) {
    let (child, out) = support::spawn_child(ROLE, role, SOCKET, path);
    (Kid(child), out)
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

fn counter(info: &ServerInfo, name: &str) -> u64 {
    info.counters
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap()
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child() {
    let Some((role, path)) = support::child_role(ROLE, SOCKET) else {
        return;
    };
    match role.as_str() {
        // 1: starting a server raises a low soft limit to the hard one.
        "server-raises" => {
            set_soft_nofile(64);
            let (before, hard) = nofile();
            let server = start_server(&path);
            assert_eq!(nofile(), (raised(before, hard), hard));
            // Once per process: a limit lowered afterwards stays as it is.
            set_soft_nofile(64);
            let again = Server::new(ServerConfig::new(path.with_extension("2"))).unwrap();
            again.start().unwrap();
            assert_eq!(nofile().0, 64.min(hard));
            drop((server, again));
            say("raised");
        }
        // 1: connecting a client raises a low soft limit to the hard one.
        "client-raises" => {
            set_soft_nofile(64);
            let (before, hard) = nofile();
            let client = Client::connect(&path, ClientOptions::default()).unwrap();
            client.ping().unwrap();
            assert_eq!(nofile(), (raised(before, hard), hard));
            say("raised");
        }
        // 2: a client keeps results until it has no descriptor left for the next one.
        "client-runs-out" => {
            let client = Client::connect(&path, ClientOptions::default()).unwrap();
            leave_free(8);
            let mut kept = Vec::new();
            let err = loop {
                match client.call("ramp", &Outgoing::plain(Node::Null)) {
                    Ok(result) => kept.push(result),
                    Err(e) => break e,
                }
                assert!(kept.len() < 100, "never ran out of descriptors");
            };
            assert!(!kept.is_empty());
            assert!(is_out_of_descriptors(&err), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains("this process has no descriptor left to receive")
                    && text.contains("RLIMIT_NOFILE")
                    && text.contains("still usable"),
                "{text}"
            );
            // Not poisoned: the next request works (and first gives back the lease the
            // lost answer brought, so the server holds only the kept ones).
            client.ping().unwrap();
            let info = client.server_info().unwrap();
            assert_eq!(counter(&info, "leases_live"), kept.len() as u64);
            // Freeing results frees descriptors: calls succeed again.
            let ids: Vec<String> = kept
                .drain(..)
                .map(|(shared, _)| shared.object.unwrap().object_id)
                .collect();
            assert!(client.release(&ids).unwrap().iter().all(|b| *b));
            let (shared, incoming) = client.call("ramp", &Outgoing::plain(Node::Null)).unwrap();
            assert_eq!(incoming.fds.len(), 1);
            client.release(&[shared.object.unwrap().object_id]).unwrap();
            let info = client.server_info().unwrap();
            assert_eq!(counter(&info, "leases_live"), 0);
            say("recovered");
        }
        // 2 and 3: a server left with a few free descriptors.
        "server-runs-out" => {
            let server = start_server(&path);
            leave_free(5);
            say("ready");
            server.wait();
        }
        other => panic!("unknown role {other}"),
    }
}

fn run_child_to_line(role: &str, path: &Path, want: &str) {
    let (mut child, mut out) = spawn_child(role, path);
    expect_line(&mut out, want);
    assert!(child.0.wait().unwrap().success());
}

#[test]
fn a_starting_server_raises_the_descriptor_limit_once() {
    let dir = tempfile::tempdir().unwrap();
    run_child_to_line("server-raises", &dir.path().join("s.sock"), "raised");
}

#[test]
fn a_connecting_client_raises_the_descriptor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let _server = start_server(&path);
    run_child_to_line("client-raises", &path, "raised");
}

#[test]
fn a_client_out_of_descriptors_gets_a_clear_error_and_keeps_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let server = start_server(&path);
    run_child_to_line("client-runs-out", &path, "recovered");
    // The child's connection is gone, and with it every lease.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.service().live() != (0, 0) {
        assert!(Instant::now() < deadline, "leases left behind");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_server_out_of_descriptors_refuses_clearly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let (child, mut out) = spawn_child("server-runs-out", &path);
    expect_line(&mut out, "ready");
    // A timeout far above the bound below: a refusal told at once is told apart from
    // one waited out, however loaded the machine.
    let options = ClientOptions {
        timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    // Connect until the server has no descriptor left for another connection: that
    // client is told so at once, instead of waiting for its timeout.
    let mut clients = Vec::new();
    let (err, waited) = loop {
        let t0 = Instant::now();
        match Client::connect(&path, options.clone()) {
            Ok(c) => clients.push(c),
            Err(e) => break (e, t0.elapsed()),
        }
        assert!(clients.len() < 64, "the server never ran out");
    };
    assert!(
        matches!(
            &err,
            IpcError::Remote {
                kind: RemoteKind::Busy,
                message
            } if message.contains("no descriptor left to accept") && message.contains("RLIMIT_NOFILE")
        ),
        "{err:?}"
    );
    assert!(waited < Duration::from_secs(15), "refused after {waited:?}");
    assert!(!clients.is_empty());
    // The server is at its limit as soon as the refused client has its answer (the
    // refused connection's descriptor becomes the server's spare, never free in
    // between): a request with a descriptor is answered Busy, and the connection stays
    // usable.
    let first = &clients[0];
    let err = first
        .call("echo", &ramp_tensor(8))
        .expect_err("served with no descriptor left");
    assert!(
        matches!(
            &err,
            IpcError::Remote {
                kind: RemoteKind::Busy,
                message
            } if message.contains("the server has no descriptor left to receive")
        ),
        "{err:?}"
    );
    first.ping().unwrap();
    // Closing connections frees descriptors: new clients and descriptors get in again.
    let first = clients.remove(0);
    clients.clear();
    let deadline = Instant::now() + Duration::from_secs(10);
    let late = loop {
        match Client::connect(&path, options.clone()) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "never recovered: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    late.ping().unwrap();
    // The other connections' threads close their descriptors one by one, and the new
    // client may have taken the first ones freed: descriptors get in once all are.
    let incoming = loop {
        match first.call("echo", &ramp_tensor(8)) {
            Ok((_, incoming)) => break incoming,
            Err(e) => assert!(Instant::now() < deadline, "descriptors never got in: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(incoming.fds.len(), 1);
    drop(child);
}
