//! Values on either side of the socket: [`Outgoing`] (a payload and what keeps its
//! memory alive) and [`Incoming`] (a payload and the descriptors that came with it).

use std::any::Any;
use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use tensorwire_core::Bytes;
use tensorwire_shm::Segment;

use crate::cpu;
use crate::error::{IpcError, Result};
use crate::schema::{Location, Node, Payload, StorageDesc, TensorDesc};

/// Something that must stay alive while a peer may use memory it owns (a CUDA
/// tensor, an IPC event).
pub type KeepAlive = Arc<dyn Any + Send + Sync>;

/// A value ready to send: its payload, the memfd segments its [`Location::Memfd`]
/// storages index, and owners of CUDA memory it shares. Cheap to clone; a cached
/// result is one `Outgoing` sent again and again.
#[derive(Clone, Default)]
pub struct Outgoing {
    /// The value (shared: a cached result's answers and the messages that carry it
    /// hold the one payload).
    pub payload: Arc<Payload>,
    /// Segment number `i` travels as descriptor `i` of the frame.
    pub segments: Vec<Arc<Segment>>,
    /// Kept alive as long as this value (and every server-side object holding it).
    pub keepalive: Vec<KeepAlive>,
}

impl fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outgoing")
            .field("payload", &self.payload)
            .field("segments", &self.segments.len())
            .field("keepalive", &self.keepalive.len())
            .finish()
    }
}

impl Outgoing {
    /// A value with no tensors.
    pub fn plain(value: Node) -> Outgoing {
        Outgoing {
            payload: Arc::new(Payload::plain(value)),
            ..Outgoing::default()
        }
    }

    /// The descriptors to send with it.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.segments.iter().map(|s| s.fd()).collect()
    }

    /// Total bytes of the storages it shares.
    pub fn bytes(&self) -> u64 {
        self.payload.storages.iter().map(|s| s.len).sum()
    }

    /// True when the peer's view depends on this process keeping memory alive (CUDA
    /// storages); memfd storages live on in the peer's own map.
    pub fn needs_keepalive(&self) -> bool {
        !self.keepalive.is_empty()
            || self
                .payload
                .storages
                .iter()
                .any(|s| matches!(s.location, Location::Cuda { .. }))
    }
}

/// A value as received: the payload (validated against the descriptors that came
/// with it) and those descriptors.
#[derive(Debug)]
pub struct Incoming {
    /// The value.
    pub payload: Arc<Payload>,
    /// The frame's descriptors.
    pub fds: Vec<OwnedFd>,
}

/// One storage of a received value, ready to use.
#[derive(Debug, Clone)]
pub enum ReceivedStorage {
    /// A range of a mapped memfd (zero-copy), checked to lie inside it.
    Cpu {
        /// The segment (writable: it is shared with the sender).
        segment: Arc<Segment>,
        /// The storage's offset in it.
        offset: u64,
        /// The storage's length.
        len: u64,
    },
    /// A CUDA storage, to be opened with [`crate::cuda::open_export`] (or
    /// [`crate::cuda::import`] where it cannot be this process's own memory).
    Cuda(Location),
}

impl ReceivedStorage {
    /// A CPU storage's bytes as a view that keeps the map alive (`None` for CUDA).
    pub fn bytes(&self) -> Option<Bytes> {
        match self {
            ReceivedStorage::Cpu {
                segment,
                offset,
                len,
            } => cpu::storage_bytes(segment, *offset, *len).ok(),
            ReceivedStorage::Cuda(_) => None,
        }
    }
}

impl Incoming {
    /// Checks the payload against the descriptors.
    pub fn new(payload: Arc<Payload>, fds: Vec<OwnedFd>) -> Result<Incoming> {
        payload.validate(fds.len())?;
        Ok(Incoming { payload, fds })
    }

    /// Maps every descriptor and resolves every storage (CUDA ones are returned as
    /// their location). Each storage's range is checked against its segment.
    pub fn storages(self) -> Result<(Arc<Payload>, Vec<ReceivedStorage>)> {
        let segments = self
            .fds
            .into_iter()
            .map(cpu::map_received)
            .collect::<Result<Vec<_>>>()?;
        let storages = self
            .payload
            .storages
            .iter()
            .enumerate()
            .map(|(i, storage)| match &storage.location {
                Location::Memfd { fd, offset } => {
                    let segment = segments.get(*fd as usize).ok_or_else(|| {
                        IpcError::protocol(format!("storage {i}: no descriptor {fd}"))
                    })?;
                    let in_segment = usize::try_from(*offset)
                        .ok()
                        .zip(usize::try_from(storage.len).ok())
                        .is_some_and(|(at, len)| segment.check_range(at, len).is_ok());
                    if !in_segment {
                        return Err(IpcError::protocol(format!(
                            "storage {i} is outside its memfd: bytes {offset}+{} of {}",
                            storage.len,
                            segment.len()
                        )));
                    }
                    Ok(ReceivedStorage::Cpu {
                        segment: segment.clone(),
                        offset: *offset,
                        len: storage.len,
                    })
                }
                cuda @ (Location::Cuda { .. } | Location::CudaEmpty { .. }) => {
                    Ok(ReceivedStorage::Cuda(cuda.clone()))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((self.payload, storages))
    }
}

/// Builds an [`Outgoing`]: CPU storages (packed into a memfd unless they already
/// live in a shared segment), CUDA storages (exported by the caller), and tensors
/// over them.
#[derive(Default)]
pub struct OutgoingBuilder<'a> {
    packer: cpu::StoragePacker<'a>,
    /// For each storage: `Some(len)` for CPU ones (placed by the packer, in order),
    /// or the finished location for CUDA ones.
    storages: Vec<Pending>,
    tensors: Vec<TensorDesc>,
    keepalive: Vec<KeepAlive>,
}

enum Pending {
    Cpu { len: u64 },
    Ready(StorageDesc),
}

impl<'a> OutgoingBuilder<'a> {
    /// An empty builder.
    pub fn new() -> Self {
        OutgoingBuilder::default()
    }

    /// Adds a CPU storage; returns its index.
    pub fn cpu_storage(&mut self, bytes: &'a [u8]) -> Result<u32> {
        self.packer.add(bytes)?;
        self.storages.push(Pending::Cpu {
            len: bytes.len() as u64,
        });
        self.index()
    }

    /// Adds a storage whose location is already known (a CUDA export).
    pub fn storage(&mut self, storage: StorageDesc) -> Result<u32> {
        self.storages.push(Pending::Ready(storage));
        self.index()
    }

    fn index(&self) -> Result<u32> {
        u32::try_from(self.storages.len() - 1).map_err(|_| IpcError::protocol("too many storages"))
    }

    /// Adds a tensor; returns its index (for [`Node::Tensor`]).
    pub fn tensor(&mut self, tensor: TensorDesc) -> Result<u32> {
        self.tensors.push(tensor);
        u32::try_from(self.tensors.len() - 1).map_err(|_| IpcError::protocol("too many tensors"))
    }

    /// Keeps `owner` alive as long as the value.
    pub fn keep_alive(&mut self, owner: KeepAlive) {
        self.keepalive.push(owner);
    }

    /// Bytes that [`finish`](Self::finish) will copy into a new memfd.
    pub fn bytes_to_copy(&self) -> usize {
        self.packer.bytes_to_copy()
    }

    /// Copies what must be copied (through `copy`, see [`cpu::StoragePacker::finish`])
    /// and returns the value, checked.
    pub fn finish(
        self,
        value: Node,
        copy: impl FnOnce(Vec<(&mut [u8], &'a [u8])>),
    ) -> Result<Outgoing> {
        let (segments, placed) = self.packer.finish(copy)?;
        let mut placed = placed.into_iter();
        let storages = self
            .storages
            .into_iter()
            .map(|pending| match pending {
                Pending::Ready(s) => Ok(s),
                Pending::Cpu { len } => {
                    let p = placed
                        .next()
                        .ok_or_else(|| IpcError::protocol("a storage was not placed"))?;
                    Ok(StorageDesc {
                        len,
                        location: Location::Memfd {
                            fd: p.segment as u32,
                            offset: p.offset,
                        },
                    })
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let payload = Payload {
            value,
            tensors: self.tensors,
            storages,
        };
        payload.validate(segments.len())?;
        Ok(Outgoing {
            payload: Arc::new(payload),
            segments,
            keepalive: self.keepalive,
        })
    }
}

impl Outgoing {
    /// Sends a received value on as it is: its memfd storages go out as ranges of the
    /// same segments (zero-copy; the peer that sent them maps its own memory again).
    pub fn from_received(payload: Arc<Payload>, storages: &[ReceivedStorage]) -> Result<Outgoing> {
        let payload = Arc::unwrap_or_clone(payload);
        let mut builder = OutgoingBuilder::new();
        for (desc, storage) in payload.storages.iter().zip(storages) {
            match storage {
                ReceivedStorage::Cpu {
                    segment,
                    offset,
                    len,
                } => {
                    // In range: checked when the storage was received.
                    let (at, len) = (*offset as usize, *len as usize);
                    builder.cpu_storage(&segment.as_slice()[at..at + len])?;
                }
                ReceivedStorage::Cuda(_) => {
                    builder.storage(desc.clone())?;
                }
            }
        }
        builder.tensors = payload.tensors;
        // Nothing to copy: every CPU storage is inside a registered segment.
        builder.finish(payload.value, cpu::copy_serial)
    }
}
