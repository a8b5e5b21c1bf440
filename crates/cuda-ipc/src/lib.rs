//! Same-host tensor sharing for tensorwire: a server process shares tensors (CUDA or
//! CPU) with client processes over a Unix socket, without copying them.
//!
//! - **Control plane** ([`frame`], [`schema`], [`socket`]): length-prefixed frames
//!   (`"TWIP"`, version, kind, descriptor count, request id, body length) carrying
//!   CBOR messages — never pickle — with caps on body size, descriptor count and
//!   nesting, a deadline on every started frame, and the peer's uid checked
//!   (`SO_PEERCRED`) before anything is read.
//! - **Server model** ([`service`], [`tasks`], [`server`]): endpoints with
//!   direct or task execution, serialized or parallel concurrency, a result cache
//!   keyed per call, singleflight, managed objects with per-connection leases (a
//!   client that disconnects or dies gives its leases back), and a bounded task pool.
//! - **Data plane**: CPU storages travel as memfd descriptors (`SCM_RIGHTS`) and are
//!   mapped by the receiver ([`cpu`]); CUDA storages travel as IPC handles of their
//!   allocation's base plus an offset, opened once per process ([`cuda`], the driver
//!   loaded at run time, so nothing here needs CUDA to build or test).
//! - [`client::Client`] talks to a server; [`value`] holds what is sent and received.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tensorwire_cuda_ipc::{schema::*, server::*, service::Endpoint, value::*, client::*};
//!
//! let server = Server::new(ServerConfig::new("/tmp/demo.sock"))?;
//! server.service().register(Endpoint::new(
//!     "ones",
//!     EndpointOptions::default(),
//!     Arc::new(|_args: Incoming| {
//!         let data = vec![1u8; 1024];
//!         let mut b = OutgoingBuilder::new();
//!         let s = b.cpu_storage(&data)?;
//!         let t = b.tensor(TensorDesc {
//!             storage: s, offset: 0, dtype: "u8".into(), shape: vec![1024], strides: vec![1],
//!             framework: Framework::Numpy, requires_grad: false,
//!         })?;
//!         b.finish(Node::Tensor(t), tensorwire_cuda_ipc::cpu::copy_serial)
//!     }),
//!     None,
//! ));
//! server.start()?;
//! let client = Client::connect("/tmp/demo.sock", ClientOptions::default())?;
//! let (_shared, incoming) = client.call("ones", &Outgoing::plain(Node::Null))?;
//! let (_payload, storages) = incoming.storages()?; // zero-copy maps of the server's memfd
//! # Ok::<(), tensorwire_cuda_ipc::IpcError>(())
//! ```
//!
//! Not in scope: turning Python objects into payloads (the `tensorwire.ipc` package
//! does that) and anything across hosts.
#![deny(missing_docs)]

pub mod client;
pub mod cpu;
pub mod cuda;
mod error;
pub mod frame;
pub mod schema;
pub mod server;
pub mod service;
pub mod socket;
pub mod tasks;
mod util;
pub mod value;

pub use crate::client::{Client, ClientOptions};
pub use crate::error::{IpcError, RemoteKind, Result};
pub use crate::server::{default_socket_path, PeerPolicy, Server, ServerConfig};
pub use crate::value::{Incoming, Outgoing, OutgoingBuilder, ReceivedStorage};
