//! The client: one connection to a server, requests answered in order, descriptors
//! received with results.
//!
//! A client is safe to share between threads; requests on one client are serialized
//! (open several clients for parallel requests). A request that times out before any
//! of its answer arrived leaves the connection usable: the late answer is recognised by
//! its request id and skipped. A failure inside an answer's frame (cut off, oversized)
//! leaves the stream out of step; every later request on the client then fails with
//! that reason (connect again; the server gives back what the old connection held).
//! An answer whose descriptors this process had no room for (it reached its
//! `RLIMIT_NOFILE`) is read whole: the request fails with an error that says so
//! ([`crate::socket::is_out_of_descriptors`]), any lease the answer brought is given
//! back before the next request, and the connection stays usable.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{IpcError, Result};
use crate::frame::{FrameKind, FrameLimits, PROTOCOL_VERSION};
use crate::schema::{
    self, EndpointInfo, ObjectInfo, Payload, Request, Response, ServerInfo, SharedValue, TaskInfo,
    TaskState,
};
use crate::socket::{self, Received};
use crate::util::lock;
use crate::value::{Incoming, Outgoing};

/// How a [`Client`] talks to its server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long one request may wait for its answer.
    pub timeout: Duration,
    /// Caps on the server's answers.
    pub frame_limits: FrameLimits,
    /// A label for the server's logs.
    pub label: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(60),
            frame_limits: FrameLimits {
                max_body: 256 << 20,
                ..FrameLimits::default()
            },
            label: format!("pid {}", std::process::id()),
        }
    }
}

struct Connection {
    stream: UnixStream,
    next_id: u32,
    /// Why the stream is out of step (a frame cut off mid-way), if it is.
    broken: Option<String>,
    /// Objects of late answers (to requests that timed out) whose leases this
    /// connection holds but nobody uses: given back before the next request.
    orphans: Vec<String>,
}

/// A connection to a server.
pub struct Client {
    path: PathBuf,
    server_id: String,
    options: ClientOptions,
    /// How long one request may wait for its answer: `options.timeout` until
    /// [`Client::set_timeout`] changes it.
    timeout: Mutex<Duration>,
    connection: Mutex<Connection>,
}

impl Client {
    /// Connects and greets the server (learning its id). No server at `path` is
    /// [`IpcError::ServerGone`]; a refused peer is [`IpcError::Remote`] with kind
    /// `Refused`.
    pub fn connect(path: impl AsRef<Path>, options: ClientOptions) -> Result<Client> {
        // Every CPU value kept open holds a descriptor: make room for many, once.
        crate::util::raise_descriptor_limit();
        let path = path.as_ref().to_path_buf();
        let stream = UnixStream::connect(&path).map_err(|e| IpcError::ServerGone {
            path: path.display().to_string(),
            server_id: None,
            reason: e.to_string(),
        })?;
        let mut client = Client {
            path,
            server_id: String::new(),
            timeout: Mutex::new(options.timeout),
            options,
            connection: Mutex::new(Connection {
                stream,
                next_id: 1,
                broken: None,
                orphans: Vec::new(),
            }),
        };
        let hello = Request::Hello {
            protocol: PROTOCOL_VERSION,
            client: client.options.label.clone(),
        };
        match client.request(&hello, None, None)?.0 {
            Response::Hello { server_id, .. } => client.server_id = server_id,
            other => return Err(unexpected(&other)),
        }
        Ok(client)
    }

    /// How long one request waits for its answer (sending included).
    pub fn timeout(&self) -> Duration {
        *lock(&self.timeout)
    }

    /// Sets how long each later request waits for its answer; a request already
    /// waiting keeps the timeout it started with.
    pub fn set_timeout(&self, timeout: Duration) {
        *lock(&self.timeout) = timeout;
    }

    /// The id of the server this client talks to.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// True once the connection cannot carry another request (a frame was cut off
    /// mid-way): connect again.
    pub fn is_broken(&self) -> bool {
        // Never waits: a connection busy with a request is not broken yet.
        match self.connection.try_lock() {
            Ok(conn) => conn.broken.is_some(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().broken.is_some(),
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request (with `value`'s descriptors) and waits for its answer (at most
    /// `timeout`, default the client's). Error answers become [`IpcError::Remote`].
    pub fn request(
        &self,
        request: &Request,
        value: Option<&Outgoing>,
        timeout: Option<Duration>,
    ) -> Result<(Response, Vec<OwnedFd>)> {
        let body = schema::encode(request)?;
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let mut conn = lock(&self.connection);
        if !conn.orphans.is_empty() && conn.broken.is_none() {
            let object_ids = std::mem::take(&mut conn.orphans);
            let release = schema::encode(&Request::Release { object_ids })?;
            // Best effort: a failure here shows again on the request itself.
            let _ = self.exchange(&mut conn, &release, &[], self.timeout());
        }
        self.exchange(&mut conn, &body, &fds_of(value), timeout)
    }

    /// Sends one request frame on the locked connection and waits for its answer.
    fn exchange(
        &self,
        conn: &mut Connection,
        body: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<(Response, Vec<OwnedFd>)> {
        if let Some(reason) = &conn.broken {
            return Err(IpcError::protocol(format!(
                "this connection is unusable after an earlier failure ({reason}); connect again"
            )));
        }
        let id = conn.next_id;
        conn.next_id = conn.next_id.wrapping_add(1).max(1);
        // A server that stops reading (busy on an earlier request of this connection,
        // or stopped) fills the socket buffer: sending waits at most `timeout` too.
        conn.stream
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(IpcError::Io)?;
        if let Err(e) = socket::send_frame(&conn.stream, FrameKind::Request, id, body, fds) {
            let e = self.gone(e);
            match &e {
                IpcError::ServerGone { .. } => {
                    // The server may have said why before closing (a refused peer, a
                    // full server): that answer is still in our receive queue.
                    return Err(self.said_before_closing(&conn.stream).unwrap_or(e));
                }
                // Part of the frame went out: close the stream (the server then gives
                // back this connection's leases); the caller connects again.
                e if socket::sent_part_of_a_frame(e) => {
                    conn.broken = Some(e.to_string());
                    let _ = conn.stream.shutdown(std::net::Shutdown::Both);
                    return Err(IpcError::Timeout {
                        what: "the server to take the whole request (the connection is \
                               closed: connect again)"
                            .into(),
                        waited_ms: timeout.as_millis() as u64,
                    });
                }
                // Nothing was sent: the connection stays usable.
                IpcError::Io(io) if socket::is_timeout(io) => {
                    return Err(IpcError::Timeout {
                        what: "the server to take the request".into(),
                        waited_ms: timeout.as_millis() as u64,
                    })
                }
                _ => conn.broken = Some(e.to_string()),
            }
            return Err(e);
        }
        conn.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(IpcError::Io)?;
        loop {
            match socket::recv_frame(&conn.stream, &self.options.frame_limits, timeout) {
                Ok(Received::Frame(frame)) => {
                    let response: Response = schema::decode(&frame.body)?;
                    // 0 is the server's id for errors about the stream itself.
                    if frame.header.request_id != id && frame.header.request_id != 0 {
                        // A late answer to a request that timed out: give back the
                        // lease it brought, if any.
                        if let Response::Value(SharedValue {
                            object: Some(object),
                            ..
                        }) = response
                        {
                            conn.orphans.push(object.object_id);
                        }
                        continue;
                    }
                    if frame.header.kind != FrameKind::Response {
                        return Err(IpcError::protocol("expected a response frame"));
                    }
                    if let Response::Error { kind, message } = response {
                        return Err(IpcError::Remote { kind, message });
                    }
                    return Ok((response, frame.fds));
                }
                Ok(Received::DescriptorsLost(lost)) => {
                    // Read whole, only its descriptors are gone: the stream is in step.
                    // A lease it brought is of no use: give it back before the next
                    // request, as for a late answer.
                    if let Ok(Response::Value(SharedValue {
                        object: Some(object),
                        ..
                    })) = schema::decode::<Response>(&lost.body)
                    {
                        conn.orphans.push(object.object_id);
                    }
                    if lost.header.request_id != id && lost.header.request_id != 0 {
                        continue;
                    }
                    return Err(lost.error());
                }
                Ok(Received::Idle) => {
                    return Err(IpcError::Timeout {
                        what: "the server's answer".into(),
                        waited_ms: timeout.as_millis() as u64,
                    })
                }
                Ok(Received::Closed) => return Err(self.lost("connection closed by the server")),
                Err(e) => {
                    let e = self.gone(e);
                    if !matches!(e, IpcError::ServerGone { .. }) {
                        conn.broken = Some(e.to_string());
                    }
                    return Err(e);
                }
            }
        }
    }

    /// An error answer the server left in the receive queue before it closed.
    fn said_before_closing(&self, stream: &UnixStream) -> Option<IpcError> {
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .ok()?;
        match socket::recv_frame(
            stream,
            &self.options.frame_limits,
            Duration::from_millis(100),
        ) {
            Ok(Received::Frame(frame)) => match schema::decode::<Response>(&frame.body) {
                Ok(Response::Error { kind, message }) => Some(IpcError::Remote { kind, message }),
                _ => None,
            },
            _ => None,
        }
    }

    /// Maps a lost connection (the socket layer's I/O errors for a closed peer) to
    /// [`IpcError::ServerGone`]; other errors pass through.
    fn gone(&self, e: IpcError) -> IpcError {
        match &e {
            IpcError::Io(io)
                if matches!(
                    io.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::NotConnected
                        | io::ErrorKind::UnexpectedEof
                ) =>
            {
                self.lost(e.to_string())
            }
            _ => e,
        }
    }

    /// [`IpcError::ServerGone`] for this client's server.
    fn lost(&self, reason: impl Into<String>) -> IpcError {
        IpcError::ServerGone {
            path: self.path.display().to_string(),
            server_id: (!self.server_id.is_empty()).then(|| self.server_id.clone()),
            reason: reason.into(),
        }
    }

    fn simple(&self, request: Request) -> Result<Response> {
        Ok(self.request(&request, None, None)?.0)
    }

    /// True when the server answers.
    pub fn ping(&self) -> Result<()> {
        match self.simple(Request::Ping)? {
            Response::Pong => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// The server's id, version, devices and counters.
    pub fn server_info(&self) -> Result<ServerInfo> {
        match self.simple(Request::ServerInfo)? {
            Response::ServerInfo(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// The registered endpoints.
    pub fn list_endpoints(&self) -> Result<Vec<EndpointInfo>> {
        match self.simple(Request::ListEndpoints)? {
            Response::Endpoints(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// Calls an endpoint with `args`; returns the result's description and the
    /// received value (map it with [`Incoming::storages`]).
    pub fn call(&self, endpoint: &str, args: &Outgoing) -> Result<(SharedValue, Incoming)> {
        let request = Request::Call {
            endpoint: endpoint.into(),
            args: args.payload.clone(),
        };
        self.value(self.request(&request, Some(args), None)?)
    }

    fn value(&self, (response, fds): (Response, Vec<OwnedFd>)) -> Result<(SharedValue, Incoming)> {
        match response {
            Response::Value(shared) => {
                let incoming = Incoming::new(shared.payload.clone(), fds)?;
                Ok((shared, incoming))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Queues an endpoint as a task; returns its id.
    pub fn submit(&self, endpoint: &str, args: &Outgoing) -> Result<String> {
        let request = Request::Submit {
            endpoint: endpoint.into(),
            args: args.payload.clone(),
        };
        match self.request(&request, Some(args), None)?.0 {
            Response::TaskId(id) => Ok(id),
            other => Err(unexpected(&other)),
        }
    }

    /// A task's state.
    pub fn task_status(&self, task_id: &str) -> Result<TaskInfo> {
        match self.simple(Request::TaskStatus {
            task_id: task_id.into(),
        })? {
            Response::Task(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits for a task to finish, at most `timeout` (`None`: the server's cap).
    pub fn wait_task(&self, task_id: &str, timeout: Option<Duration>) -> Result<TaskInfo> {
        let request = Request::WaitTask {
            task_id: task_id.into(),
            timeout_ms: timeout.map(|t| t.as_millis() as u64),
        };
        // Our own wait covers the server's, plus room for the answer.
        let ours = timeout
            .map(|t| t + self.timeout())
            .unwrap_or(Duration::from_secs(365 * 24 * 3600));
        match self.request(&request, None, Some(ours))?.0 {
            Response::Task(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// A finished task's result.
    pub fn task_result(&self, task_id: &str) -> Result<(SharedValue, Incoming)> {
        let request = Request::TaskResult {
            task_id: task_id.into(),
        };
        self.value(self.request(&request, None, None)?)
    }

    /// Cancels a task that has not started.
    pub fn cancel_task(&self, task_id: &str) -> Result<bool> {
        match self.simple(Request::CancelTask {
            task_id: task_id.into(),
        })? {
            Response::Cancelled(b) => Ok(b),
            other => Err(unexpected(&other)),
        }
    }

    /// The server's retained tasks.
    pub fn list_tasks(&self, state: Option<TaskState>) -> Result<Vec<TaskInfo>> {
        match self.simple(Request::ListTasks { state })? {
            Response::Tasks(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// Gives back one lease per object id.
    pub fn release(&self, object_ids: &[String]) -> Result<Vec<bool>> {
        match self.simple(Request::Release {
            object_ids: object_ids.to_vec(),
        })? {
            Response::Released(flags) => Ok(flags),
            other => Err(unexpected(&other)),
        }
    }

    /// An object's bookkeeping, `None` when it is gone.
    pub fn object_info(&self, object_id: &str) -> Result<Option<ObjectInfo>> {
        match self.simple(Request::ObjectInfo {
            object_id: object_id.into(),
        })? {
            Response::Object(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Checks that an object issued by `server_id` still lives on this client's server.
    pub fn ensure_live(&self, object_id: &str, server_id: &str) -> Result<ObjectInfo> {
        if server_id != self.server_id {
            return Err(IpcError::StaleHandle {
                object_id: object_id.into(),
                server_id: server_id.into(),
                reason: format!(
                    "the server at {} is now {} (the one that issued it is gone)",
                    self.path.display(),
                    self.server_id
                ),
            });
        }
        self.object_info(object_id)?
            .ok_or_else(|| IpcError::StaleHandle {
                object_id: object_id.into(),
                server_id: server_id.into(),
                reason: "the server no longer holds it (released or invalidated)".into(),
            })
    }

    /// Drops the cached result of one call.
    pub fn invalidate_call(&self, endpoint: &str, args: &Payload) -> Result<u64> {
        match self.simple(Request::InvalidateCall {
            endpoint: endpoint.into(),
            args: Arc::new(args.clone()),
        })? {
            Response::Invalidated(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    /// Drops every cached result of an endpoint.
    pub fn invalidate_endpoint(&self, endpoint: &str) -> Result<u64> {
        match self.simple(Request::InvalidateEndpoint {
            endpoint: endpoint.into(),
        })? {
            Response::Invalidated(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(response: &Response) -> IpcError {
    IpcError::protocol(format!("unexpected answer {response:?}"))
}

fn fds_of(value: Option<&Outgoing>) -> Vec<std::os::fd::BorrowedFd<'_>> {
    value.map(|v| v.fds()).unwrap_or_default()
}
