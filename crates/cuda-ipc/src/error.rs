//! The typed errors of the sharing layer.

use std::io;

/// Shorthand for `Result<T, IpcError>`.
pub type Result<T, E = IpcError> = std::result::Result<T, E>;

/// Everything that can go wrong sharing tensors between processes.
///
/// Errors the server reports travel back as [`IpcError::Remote`] with a stable
/// [`RemoteKind`], so a client can tell "no such endpoint" from "the endpoint raised".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IpcError {
    /// An operating-system error on the socket or a descriptor.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),

    /// A frame or message that does not follow the protocol.
    #[error("protocol error: {reason}")]
    Protocol {
        /// What is wrong with it.
        reason: String,
    },

    /// A frame larger than the configured cap.
    #[error("frame of {found} bytes is above the limit of {limit}")]
    FrameTooLarge {
        /// The configured cap.
        limit: u64,
        /// The announced size.
        found: u64,
    },

    /// The peer speaks another protocol version.
    #[error("protocol version {found} is not supported (this side speaks {supported})")]
    Version {
        /// The version received.
        found: u16,
        /// The version spoken here.
        supported: u16,
    },

    /// The server refused a peer by its credentials.
    #[error("peer refused: pid {pid}, uid {uid} is not allowed ({reason})")]
    PeerRefused {
        /// The peer's process id.
        pid: i32,
        /// The peer's user id.
        uid: u32,
        /// Why.
        reason: String,
    },

    /// No server answers at the socket, or it went away mid-request.
    #[error("server at {path} is gone{}: {reason}", server_id.as_ref().map(|id| format!(" (server id {id})")).unwrap_or_default())]
    ServerGone {
        /// The socket path.
        path: String,
        /// The id of the server we were talking to, when known.
        server_id: Option<String>,
        /// What was seen.
        reason: String,
    },

    /// Waiting ran out of time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long, in milliseconds.
        waited_ms: u64,
    },

    /// The server answered with an error.
    #[error("{kind:?} from server: {message}")]
    Remote {
        /// What kind of failure.
        kind: RemoteKind,
        /// The server's message (for endpoint failures: the exception type and text).
        message: String,
    },

    /// A handle whose object no longer exists on its server, or whose server was
    /// replaced by another one.
    #[error("stale handle for object {object_id} of server {server_id}: {reason}")]
    StaleHandle {
        /// The object's id.
        object_id: String,
        /// The server that issued it.
        server_id: String,
        /// Why it is stale.
        reason: String,
    },

    /// CUDA is not usable in this process (no driver library, no device).
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// What is missing.
        reason: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed with error {code} ({name})")]
    Cuda {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The error's name, when the driver knows it.
        name: String,
    },

    /// A tensor description or shared-memory segment that does not add up.
    #[error(transparent)]
    Tensor(#[from] tensorwire_core::Error),
}

/// What kind of error the server reported, stable on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum RemoteKind {
    /// The request was malformed or used a feature the server does not have.
    BadRequest,
    /// No endpoint of that name.
    UnknownEndpoint,
    /// No object of that id (released, invalidated, or never issued).
    UnknownObject,
    /// No task of that id (never submitted, or dropped after its retention time).
    UnknownTask,
    /// The endpoint function failed; the message names its exception.
    EndpointFailed,
    /// The task was cancelled before it ran.
    Cancelled,
    /// The server is at a configured limit (tasks, objects, connections).
    Busy,
    /// The result could not be shared (a tensor kind this server cannot export).
    Unshareable,
    /// The server is shutting down.
    ShuttingDown,
    /// The peer's credentials are not allowed.
    Refused,
    /// Anything else.
    Internal,
}

impl IpcError {
    /// Shorthand for a [`IpcError::Protocol`].
    pub fn protocol(reason: impl Into<String>) -> IpcError {
        IpcError::Protocol {
            reason: reason.into(),
        }
    }

    /// Shorthand for a [`IpcError::Remote`].
    pub fn remote(kind: RemoteKind, message: impl Into<String>) -> IpcError {
        IpcError::Remote {
            kind,
            message: message.into(),
        }
    }

    /// The [`RemoteKind`] this error is reported as when a server sends it to a client.
    pub fn remote_kind(&self) -> RemoteKind {
        match self {
            IpcError::Remote { kind, .. } => *kind,
            IpcError::Protocol { .. }
            | IpcError::FrameTooLarge { .. }
            | IpcError::Version { .. } => RemoteKind::BadRequest,
            IpcError::StaleHandle { .. } => RemoteKind::UnknownObject,
            IpcError::CudaUnavailable { .. } | IpcError::Cuda { .. } | IpcError::Tensor(_) => {
                RemoteKind::Unshareable
            }
            _ => RemoteKind::Internal,
        }
    }
}
