//! The socket server: binds a Unix socket (mode 0600), checks each peer's
//! credentials, serves every connection on its own thread, and hands requests to the
//! [`Service`]. A connection's leases are given back when it closes, however it closes.
//!
//! Descriptors: a server raises its soft `RLIMIT_NOFILE` toward the hard limit when it
//! starts (every cached or retained CPU result and every connection holds some). If it
//! still runs out, it keeps one descriptor in reserve (`/dev/null`) so it can accept a
//! connection it has no room for, answer it `Busy` and close it, instead of leaving the
//! client waiting; a request whose descriptors it had no room for is answered `Busy`
//! and the connection stays open.

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{IpcError, RemoteKind, Result};
use crate::frame::{FrameKind, FrameLimits};
use crate::schema::{self, Request, Response, ServerInfo};
use crate::service::{ConnectionId, Service, ServiceLimits};
use crate::socket::{self, PeerCredentials, Received};
use crate::util::{effective_uid, hex, lock, now_secs};

/// How often an idle connection thread looks up to see whether the server is stopping.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// Which peers may connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    /// User ids allowed; the server's own effective uid when built by
    /// [`PeerPolicy::same_user`].
    pub allowed_uids: Vec<u32>,
}

impl PeerPolicy {
    /// Only processes of the server's own effective user.
    pub fn same_user() -> PeerPolicy {
        PeerPolicy {
            allowed_uids: vec![effective_uid()],
        }
    }

    /// Checks a peer's credentials.
    pub fn check(&self, peer: &PeerCredentials) -> Result<()> {
        if self.allowed_uids.contains(&peer.uid) {
            Ok(())
        } else {
            Err(IpcError::PeerRefused {
                pid: peer.pid,
                uid: peer.uid,
                reason: format!("allowed uids are {:?}", self.allowed_uids),
            })
        }
    }
}

/// How a [`Server`] listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the socket lives.
    pub socket_path: PathBuf,
    /// Which peers may connect.
    pub peers: PeerPolicy,
    /// Frame caps for requests.
    pub frame_limits: FrameLimits,
    /// A started frame must arrive whole within this time.
    pub frame_timeout: Duration,
    /// Connections served at once; more are refused with `Busy`.
    pub max_connections: usize,
    /// Limits of the service behind the socket.
    pub service: ServiceLimits,
}

impl ServerConfig {
    /// Defaults for a socket at `socket_path`: same-user peers, 16 MiB requests,
    /// 10 s frame timeout, 256 connections.
    pub fn new(socket_path: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            socket_path: socket_path.into(),
            peers: PeerPolicy::same_user(),
            frame_limits: FrameLimits::default(),
            frame_timeout: Duration::from_secs(10),
            max_connections: 256,
            service: ServiceLimits::default(),
        }
    }
}

/// The default socket for a server called `name`: under `$XDG_RUNTIME_DIR/tensorwire/`
/// when that is set, else `/tmp/tensorwire-<uid>/` (created 0700 when bound).
pub fn default_socket_path(name: &str) -> PathBuf {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("tensorwire"),
        _ => PathBuf::from(format!("/tmp/tensorwire-{}", effective_uid())),
    };
    dir.join(format!("{name}.sock"))
}

struct Shared {
    service: Arc<Service>,
    config: ServerConfig,
    stopping: AtomicBool,
    connections: Mutex<HashMap<ConnectionId, UnixStream>>,
    next_connection: AtomicU64,
    started_at: f64,
    socket_inode: AtomicU64,
}

/// A server: a [`Service`] behind a Unix socket.
pub struct Server {
    shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Server {
    /// A server with a fresh random id and no endpoints; [`Server::start`] binds it.
    pub fn new(config: ServerConfig) -> Result<Server> {
        let service = Service::new(random_id()?, config.service)?;
        Ok(Server {
            shared: Arc::new(Shared {
                service,
                config,
                stopping: AtomicBool::new(false),
                connections: Mutex::new(HashMap::new()),
                next_connection: AtomicU64::new(1),
                started_at: now_secs(),
                socket_inode: AtomicU64::new(0),
            }),
            accept: Mutex::new(None),
        })
    }

    /// The service (register endpoints on it).
    pub fn service(&self) -> &Arc<Service> {
        &self.shared.service
    }

    /// The server's id.
    pub fn server_id(&self) -> &str {
        self.shared.service.server_id()
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.shared.config.socket_path
    }

    /// Binds the socket and starts accepting on a background thread. Refuses a path
    /// where another server is listening; removes a stale socket file left by a dead one.
    pub fn start(&self) -> Result<()> {
        let mut accept = lock(&self.accept);
        if accept.is_some() || self.shared.stopping.load(Ordering::SeqCst) {
            return Err(IpcError::protocol(
                "server already started (a stopped server cannot start again; make a new one)",
            ));
        }
        crate::util::raise_descriptor_limit();
        let listener = bind(&self.shared.config.socket_path)?;
        let inode = std::fs::metadata(&self.shared.config.socket_path)?.ino();
        self.shared.socket_inode.store(inode, Ordering::SeqCst);
        let shared = self.shared.clone();
        let spare = open_spare();
        *accept = Some(
            std::thread::Builder::new()
                .name("tw-ipc-accept".into())
                .spawn(move || accept_loop(shared, listener, spare))?,
        );
        Ok(())
    }

    /// Blocks until the server stops.
    pub fn wait(&self) {
        let handle = lock(&self.accept).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// True between `start` and `stop`.
    pub fn is_running(&self) -> bool {
        !self.shared.stopping.load(Ordering::SeqCst) && lock(&self.accept).is_some()
    }

    /// Stops accepting, closes every connection (their leases are given back), stops
    /// the task pool and removes the socket file.
    pub fn stop(&self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        for (_, stream) in lock(&self.shared.connections).drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.wait();
        self.shared.service.shutdown();
        // Remove the socket only if it is still ours (not a new server's).
        let path = &self.shared.config.socket_path;
        if std::fs::metadata(path)
            .is_ok_and(|m| m.ino() == self.shared.socket_inode.load(Ordering::SeqCst))
        {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The server's id, version, devices and counters.
    pub fn info(&self) -> ServerInfo {
        self.shared.info()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn info(&self) -> ServerInfo {
        self.service.info(
            &self.config.socket_path.to_string_lossy(),
            self.started_at,
            device_uuids(),
        )
    }
}

fn device_uuids() -> Vec<String> {
    let Ok(driver) = crate::cuda::CudaDriver::get() else {
        return Vec::new();
    };
    let count = driver.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| driver.device_uuid(i).ok())
        .map(|u| hex(&u))
        .collect()
}

/// 128 random bits from the kernel, in hex.
fn random_id() -> Result<String> {
    let mut bytes = [0u8; 16];
    // SAFETY: `bytes` is a writable buffer of the length passed.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(io::Error::last_os_error().into());
    }
    Ok(hex(&bytes))
}

fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(IpcError::Io(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            )));
        }
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(IpcError::Io(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a server is already listening at {}", path.display()),
                )))
            }
            // Nobody listens: a dead server's socket file.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            // Anything else (a busy server's full backlog, a permission error) is not
            // proof that the server is gone: its socket file is not ours to remove.
            Err(e) => {
                return Err(IpcError::Io(io::Error::new(
                    e.kind(),
                    format!(
                        "{} exists and could not be checked for a listening server: {e}",
                        path.display()
                    ),
                )))
            }
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Waits until the listener has a connection to accept, or `IDLE_POLL` passes.
fn wait_readable(listener: &UnixListener) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, IDLE_POLL.as_millis() as libc::c_int) };
    n > 0
}

/// The descriptor kept in reserve for [`turn_away`] (`/dev/null`, close-on-exec; after
/// a refusal, the refused connection's own descriptor, shut down, holds its place).
fn open_spare() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(OwnedFd::from)
}

/// True for `accept` failing because this process (`EMFILE`) or the system (`ENFILE`)
/// has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Rate-limits the out-of-descriptor warning on stderr.
struct Warner {
    last: Option<Instant>,
    suppressed: u64,
}

impl Warner {
    fn warn(&mut self, message: &str) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            self.suppressed += 1;
            return;
        }
        let more = match self.suppressed {
            0 => String::new(),
            n => format!(" ({n} more since the last warning)"),
        };
        eprintln!("tensorwire ipc server: {message}{more}");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

/// The server has no descriptor left to accept a waiting connection. Without help the
/// connection would wait in the backlog (its client timing out) while the listener
/// stays readable. So: give up the spare descriptor, accept the connection with it,
/// answer `Busy` saying why, and keep that connection's descriptor, shut down, as the
/// new spare (the libev/nginx trick, without a moment where the number is free).
/// Without a spare (another thread took its slot), retry opening it and back off.
fn turn_away(
    shared: &Shared,
    listener: &UnixListener,
    spare: &mut Option<OwnedFd>,
    warner: &mut Warner,
) {
    let message = format!(
        "the server has no descriptor left to accept a connection: it reached {}; \
         its cached results, retained tasks and connections hold them. Try again later, \
         or raise the server's limit",
        crate::util::descriptor_limit_reached()
    );
    shared
        .service
        .counters
        .errors
        .fetch_add(1, Ordering::Relaxed);
    match spare.take() {
        Some(fd) => {
            drop(fd);
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    let error = Response::Error {
                        kind: RemoteKind::Busy,
                        message: message.clone(),
                    };
                    let _ = send_response(&stream, 0, &error, &[]);
                    // The refused stream, shut down, becomes the spare: its number is
                    // never free, so a connection thread receiving descriptors cannot
                    // take it between a close and a reopen (the client may already be
                    // sending its next request) and leave the server without a spare.
                    let _ = stream.shutdown(Shutdown::Both);
                    *spare = Some(OwnedFd::from(stream));
                }
                // Another thread took the freed number first: the accept loop reopens
                // the spare once a descriptor is free again.
                Err(_) => *spare = open_spare(),
            }
            warner.warn(&format!("refused a connection: {message}"));
        }
        None => {
            warner.warn(&format!(
                "cannot accept connections (no spare descriptor to refuse them with): {message}"
            ));
            *spare = open_spare();
            if spare.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener, mut spare: Option<OwnedFd>) {
    // Non-blocking accepts after a poll with a timeout: `stop` only has to set the
    // flag, whatever happened to the socket file meanwhile.
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut warner = Warner {
        last: None,
        suppressed: 0,
    };
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        // A spare lost to another thread comes back as soon as a descriptor is free
        // (at the latest one idle poll later), not only at the next connection.
        if spare.is_none() {
            spare = open_spare();
        }
        if !wait_readable(&listener) {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if out_of_descriptors(&e) => {
                turn_away(&shared, &listener, &mut spare, &mut warner);
                continue;
            }
            Err(_) => {
                // A peer that vanished before we took it (ECONNABORTED and the like):
                // back off briefly.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let counters = &shared.service.counters;
        let refuse = |stream: &UnixStream, kind: RemoteKind, message: String| {
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = send_response(stream, 0, &Response::Error { kind, message }, &[]);
        };
        match socket::peer_credentials(&stream).and_then(|c| shared.config.peers.check(&c)) {
            Ok(()) => {}
            Err(e) => {
                counters.peers_refused.fetch_add(1, Ordering::Relaxed);
                refuse(&stream, RemoteKind::Refused, e.to_string());
                continue;
            }
        }
        if counters.connections_open.load(Ordering::Relaxed) >= shared.config.max_connections as u64
        {
            refuse(
                &stream,
                RemoteKind::Busy,
                format!(
                    "{} connections open, the limit",
                    shared.config.max_connections
                ),
            );
            continue;
        }
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            lock(&shared.connections).insert(id, clone);
        }
        counters.connections.fetch_add(1, Ordering::Relaxed);
        counters.connections_open.fetch_add(1, Ordering::Relaxed);
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tw-ipc-conn-{id}"))
            .spawn(move || {
                serve_connection(&conn_shared, id, &stream);
                conn_shared.service.disconnect(id);
                lock(&conn_shared.connections).remove(&id);
                conn_shared
                    .service
                    .counters
                    .connections_open
                    .fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            counters.connections_open.fetch_sub(1, Ordering::Relaxed);
            lock(&shared.connections).remove(&id);
        }
    }
}

fn serve_connection(shared: &Shared, conn: ConnectionId, stream: &UnixStream) {
    let config = &shared.config;
    if stream.set_read_timeout(Some(IDLE_POLL)).is_err()
        || stream
            .set_write_timeout(Some(config.frame_timeout))
            .is_err()
    {
        return;
    }
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let frame = match socket::recv_frame(stream, &config.frame_limits, config.frame_timeout) {
            Ok(Received::Idle) => continue,
            Ok(Received::Closed) => return,
            Ok(Received::Frame(f)) => f,
            Ok(Received::DescriptorsLost(lost)) => {
                // Read whole, only its descriptors are gone (the server is out of
                // them): the stream is in step, so answer this request and go on.
                shared
                    .service
                    .counters
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                let error = if lost.header.kind == FrameKind::Request {
                    Response::Error {
                        kind: RemoteKind::Busy,
                        message: lost.describe("the server"),
                    }
                } else {
                    Response::Error {
                        kind: RemoteKind::BadRequest,
                        message: "expected a request frame".into(),
                    }
                };
                let sent = send_response(stream, lost.header.request_id, &error, &[]);
                if sent.is_err() || lost.header.kind != FrameKind::Request {
                    return;
                }
                continue;
            }
            Err(e) => {
                // The stream is out of step (bad header, oversized or stalled frame):
                // say why, then close.
                let message = e.to_string();
                shared
                    .service
                    .counters
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                let _ = send_response(
                    stream,
                    0,
                    &Response::Error {
                        kind: RemoteKind::BadRequest,
                        message,
                    },
                    &[],
                );
                return;
            }
        };
        let id = frame.header.request_id;
        if frame.header.kind != FrameKind::Request {
            let _ = send_response(
                stream,
                id,
                &Response::Error {
                    kind: RemoteKind::BadRequest,
                    message: "expected a request frame".into(),
                },
                &[],
            );
            return;
        }
        let (response, value) = match schema::decode::<Request>(&frame.body) {
            Ok(Request::ServerInfo) => (Response::ServerInfo(shared.info()), None),
            Ok(request) => shared.service.handle(conn, request, frame.fds),
            Err(e) => {
                shared
                    .service
                    .counters
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                (
                    Response::Error {
                        kind: RemoteKind::BadRequest,
                        message: e.to_string(),
                    },
                    None,
                )
            }
        };
        let fds = value.as_ref().map(|v| v.fds()).unwrap_or_default();
        let sent = send_response(stream, id, &response, &fds);
        if sent.is_err() {
            return;
        }
    }
}

fn send_response(
    stream: &UnixStream,
    request_id: u32,
    response: &Response,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<()> {
    let body = match schema::encode(response) {
        Ok(b) => b,
        Err(e) => schema::encode(&Response::Error {
            kind: RemoteKind::Internal,
            message: e.to_string(),
        })?,
    };
    socket::send_frame(stream, FrameKind::Response, request_id, &body, fds)
}
