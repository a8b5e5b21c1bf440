//! The native half of `tensorwire.shm`: tensor packets in named POSIX shared memory,
//! laid out as tenso's `TensoShm` lays them — one packet at offset 0, whatever follows
//! it in the segment ignored — so either side reads what the other wrote.
//!
//! A [`ShmSegment`] holds an `Arc` of the mapped [`Segment`]; decoded arrays and
//! buffers hold their own, so they stay valid after the segment is closed and its name
//! unlinked. Encoding goes straight into the map for dense tensors (header, the
//! array's own bytes, footer); other kinds are encoded once in memory and copied in.
//!
//! Not in scope: coordinating writers and readers of one segment (as with tenso, a
//! `put` while another process reads the same segment changes what it reads).

use std::borrow::Cow;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, TryLockError};

use numpy::ndarray::ArrayView1;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tensorwire::packet::{EncodeOptions, MAGIC};
use tensorwire::shm::{Access, CreateOptions, Segment};
use tensorwire::{Bytes, DType, Error};

use crate::arrays;
use crate::errors::ResultExt;
use crate::packet::{decode_value, encode_spec, framed_length, Arrays, Encoded, Held};

/// The numpy `base` of a read-write [`ShmSegment::buffer`] array: holds the mapping
/// alive for as long as the array (or a memoryview of it) lives.
#[pyclass(frozen, module = "tensorwire._native", name = "ShmMapping")]
pub struct ShmMapping {
    pub(crate) segment: Arc<Segment>,
}

#[pymethods]
impl ShmMapping {
    /// Number of bytes mapped.
    #[getter]
    fn nbytes(&self) -> usize {
        self.segment.len()
    }

    fn __len__(&self) -> usize {
        self.segment.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.ShmMapping {:?} {} bytes at {:p}>",
            self.segment.name().unwrap_or("memfd"),
            self.segment.len(),
            self.segment.as_ptr()
        )
    }
}

/// A uint8 numpy array over `len` bytes at `offset` of `segment`, whose `base` holds
/// the mapping: writable over a read-write map (writes reach every process that maps
/// it, which is what shared memory is for), read-only over a read-only one.
pub(crate) fn segment_array(
    py: Python<'_>,
    segment: Arc<Segment>,
    offset: usize,
    len: usize,
) -> PyResult<Bound<'_, PyAny>> {
    segment.check_range(offset, len).or_raise()?;
    let Some(base) = segment.as_mut_ptr() else {
        // Read-only map: a read-only view, never a writable window over it.
        let bytes = Bytes::from_arc(segment)
            .slice_at(offset as u64, len as u64)
            .or_raise()?;
        return arrays::zero_copy(py, &bytes, DType::U8, &[len as u64]);
    };
    // SAFETY: `offset..offset+len` is inside the map (checked above).
    let ptr = unsafe { base.add(offset) }.cast_const();
    let owner = Bound::new(py, ShmMapping { segment })?;
    // SAFETY: `ptr..ptr + len` lies inside the segment's map, readable and writable
    // (it is mapped read-write: `as_mut_ptr` returned it), valid while `owner`'s `Arc`
    // holds the `Segment`. The view only describes the region for numpy.
    let view = unsafe { ArrayView1::from_shape_ptr(len, ptr) };
    // SAFETY: `owner` becomes the array's base, so the map it holds outlives the
    // array, and a `Segment`'s map is never moved or resized while it lives.
    let array = unsafe { PyArray1::<u8>::borrow_from_array(&view, owner.into_any()) };
    Ok(array.into_any())
}

/// A named shared-memory segment holding a tensor packet at offset 0 (the layout of
/// tenso's `TensoShm`). `tensorwire.shm.SharedTensor` is the Python API on top.
#[pyclass(frozen, module = "tensorwire._native", name = "ShmSegment")]
pub struct ShmSegment {
    name: String,
    size: usize,
    writable: bool,
    /// The mapping; `None` once closed.
    segment: Mutex<Option<Arc<Segment>>>,
    /// The access lock of the segment's memory, shared by every handle of it in this
    /// process ([`object_access`]).
    access: Arc<ObjectAccess>,
}

/// Held for writing while a `put` writes and for reading while a `get` decodes, by
/// every handle of one shared-memory object in this process (two `SharedTensor`s of
/// one name share it), so no thread of this process reads the bytes through a slice
/// while they change.
#[derive(Default)]
struct ObjectAccess {
    lock: RwLock<()>,
    /// `put`s waiting for `lock`: `get`s stand aside meanwhile, so a reader polling
    /// in a loop cannot keep a writer out.
    writers_waiting: AtomicUsize,
}

/// The [`ObjectAccess`] of the object `id` (`(st_dev, st_ino)`), made with the first
/// handle of it in this process and dropped with the last.
///
/// Entries are this process's own: a child forked while a thread of the parent held
/// an object's lock inherits the lock held, by a thread it does not have, so its
/// handles made after the fork take a fresh one (a handle inherited through the fork
/// keeps its own, as any lock inherited so).
fn object_access(id: (u64, u64)) -> Arc<ObjectAccess> {
    /// Each object's access while a handle of it is open, with the process that made
    /// it: `(pid, (st_dev, st_ino), access)`.
    type Registry = Vec<(u32, (u64, u64), std::sync::Weak<ObjectAccess>)>;
    // Locked only with the GIL held (handles are made by Python calls), so a fork,
    // which Python makes holding the GIL, never finds it held by another thread.
    static ALL: Mutex<Registry> = Mutex::new(Vec::new());
    let pid = std::process::id();
    let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|(of, _, access)| *of == pid && access.strong_count() > 0);
    if let Some(access) = all
        .iter()
        .find(|(_, at, _)| *at == id)
        .and_then(|(_, _, a)| a.upgrade())
    {
        return access;
    }
    let access = Arc::new(ObjectAccess::default());
    all.push((pid, id, Arc::downgrade(&access)));
    access
}

/// Writes `encoded` at offset 0 of `segment` (the GIL released for large copies);
/// returns its length. `NoSpace` (a `MemoryError`) when it does not fit.
///
/// Writes go through `Segment::write_at` (raw copies), not a `&mut [u8]` over the
/// map: arrays from an earlier `get` may view the same bytes.
///
/// # Safety
/// No thread of this process may read `segment` through a slice meanwhile: the caller
/// holds the object's access lock for writing ([`ObjectAccess`]), or owns the only
/// handle.
// SAFETY: an `unsafe fn` because only the caller knows that no slice of the map is in
// use (see `# Safety`).
unsafe fn write_to(
    encoded: &Encoded<'_>,
    py: Python<'_>,
    segment: &Segment,
) -> Result<usize, Error> {
    let len = encoded.len();
    if segment.as_mut_ptr().is_none() {
        return Err(read_only(segment));
    }
    if len > segment.len() {
        return Err(Error::NoSpace {
            what: format!(
                "the packet for shared-memory segment {:?}",
                segment.name().unwrap_or("memfd")
            ),
            needed: len as u64,
            available: segment.len() as u64,
        });
    }
    // The array may itself live in this segment's memory (`put(get())`, through this
    // handle or another of the same name): copy what overlaps out first, before
    // anything is written, so no write clobbers it.
    let pieces: Vec<Cow<'_, [u8]>> = encoded
        .pieces()
        .into_iter()
        .map(|piece| -> Cow<'_, [u8]> {
            if segment.shares_memory_with(piece) {
                Cow::Owned(piece.to_vec())
            } else {
                Cow::Borrowed(piece)
            }
        })
        .collect();
    // The magic goes last, and the old one goes first: a reader that looks while the
    // packet is being written finds no packet (`BadMagicError`, worth retrying) rather
    // than a valid header over a half-written body.
    let magic_len = MAGIC.len().min(len);
    let mut magic = Vec::with_capacity(magic_len);
    for piece in &pieces {
        let want = magic_len - magic.len();
        magic.extend_from_slice(&piece[..want.min(piece.len())]);
    }
    // SAFETY: no slice of the map is in use (this function's contract); the zeros are
    // a constant, not in the segment.
    unsafe { copy_in(py, segment, 0, &[0u8; 4][..magic_len]) }?;
    fence(Ordering::Release);
    let mut at = 0;
    for piece in &pieces {
        let skip = magic_len.saturating_sub(at).min(piece.len());
        // SAFETY: no slice of the map is in use (this function's contract); `piece`
        // does not lie in the segment (overlapping pieces were copied out above).
        unsafe { copy_in(py, segment, at + skip, &piece[skip..]) }?;
        at += piece.len();
    }
    fence(Ordering::Release);
    // SAFETY: no slice of the map is in use (this function's contract); `magic` is a
    // local copy of the packet's first bytes, not in the segment.
    unsafe { copy_in(py, segment, 0, &magic) }?;
    Ok(len)
}

/// Takes a lock with `attempt`, letting the GIL go between tries: the thread holding
/// the lock may need the GIL to finish (a `put` re-takes it after a large copy).
/// Signals (Ctrl-C) interrupt the wait.
fn lock_releasing_gil<G>(py: Python<'_>, mut attempt: impl FnMut() -> Option<G>) -> PyResult<G> {
    loop {
        if let Some(guard) = attempt() {
            return Ok(guard);
        }
        py.check_signals()?;
        py.detach(|| std::thread::sleep(std::time::Duration::from_micros(50)));
    }
}

/// The guard of a `try_read`/`try_write` that got the lock (a poisoned lock too: it
/// guards no data), or `None` when it is held.
fn taken<G>(attempt: Result<G, TryLockError<G>>) -> Option<G> {
    match attempt {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// `framed_length` of the packet at the start of `bytes`, reading the magic first: the
/// writer stores it last (see `write_to`), so once it is seen the acquire fence orders
/// every later read, the length and the body included, after the writer's stores.
fn framed_length_after_magic(bytes: &[u8]) -> PyResult<u64> {
    if bytes.get(..MAGIC.len()) == Some(&MAGIC[..]) {
        fence(Ordering::Acquire);
    }
    framed_length(bytes)
}

/// Bytes per parallel task when copying into a segment.
const COPY_CHUNK: usize = 1 << 20;

/// Copies `data` into `segment` at `at`: without the GIL when large, and in parallel
/// chunks when larger still (a fresh segment's page faults then run on every core).
///
/// # Safety
/// As for [`write_to`], and `data` does not lie in the segment.
// SAFETY: an `unsafe fn` for the contract of `write_to`, which it serves.
unsafe fn copy_in(py: Python<'_>, segment: &Segment, at: usize, data: &[u8]) -> Result<(), Error> {
    segment.check_range(at, data.len())?;
    if data.len() < 4 * COPY_CHUNK {
        // SAFETY: no slice of the map is in use in this process (caller contract).
        return arrays::maybe_detach(py, data.len(), || unsafe { segment.write_at(at, data) });
    }
    py.detach(|| {
        // tensorwire's own helpers, not rayon's global pool: they stand aside in a
        // process forked after they started (multiprocessing, DataLoader workers),
        // where work handed to a pool without threads would never run.
        let failed = std::sync::Mutex::new(None);
        let chunks: Vec<(usize, &[u8])> = data.chunks(COPY_CHUNK).enumerate().collect();
        tensorwire::core::helpers::for_each(chunks, usize::MAX, |(i, chunk)| {
            // SAFETY: as above; the chunks are disjoint ranges of `data`, which does
            // not lie in the segment.
            if let Err(e) = unsafe { segment.write_at(at + i * COPY_CHUNK, chunk) } {
                failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(e);
            }
        });
        match failed
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}

fn read_only(segment: &Segment) -> Error {
    Error::invalid(format!(
        "shared-memory segment {:?} is mapped read-only",
        segment.name().unwrap_or("memfd")
    ))
}

/// True when `err` says a name is already taken.
fn already_exists(err: &Error) -> bool {
    matches!(err.root(), Error::Io(io) if io.kind() == std::io::ErrorKind::AlreadyExists)
}

/// True when `err` says a name does not exist.
fn not_found(err: &Error) -> bool {
    matches!(err.root(), Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound)
}

/// Creates `name` with `size` bytes; when the name is taken (a segment leaked by an
/// earlier run, as tenso assumes), unlinks it and creates it again.
fn create_reclaiming(name: &str, size: usize) -> Result<Segment, Error> {
    let options = CreateOptions::default();
    match Segment::create(name, size, &options) {
        Err(e) if already_exists(&e) => {
            match Segment::unlink(name) {
                Err(e) if !not_found(&e) => return Err(e),
                _ => {}
            }
            Segment::create(name, size, &options)
        }
        other => other,
    }
}

impl ShmSegment {
    /// Read access to the segment's memory (see [`ObjectAccess`]), standing aside for
    /// waiting `put`s.
    fn read_access(&self, py: Python<'_>) -> PyResult<std::sync::RwLockReadGuard<'_, ()>> {
        lock_releasing_gil(py, || {
            if self.access.writers_waiting.load(Ordering::SeqCst) > 0 {
                return None;
            }
            taken(self.access.lock.try_read())
        })
    }

    fn wrap(segment: Segment) -> Self {
        ShmSegment {
            name: segment.name().unwrap_or_default().to_owned(),
            size: segment.len(),
            writable: segment.access() == Access::ReadWrite,
            access: object_access(segment.object_id()),
            segment: Mutex::new(Some(Arc::new(segment))),
        }
    }

    /// The mapping, or `ClosedError` once closed.
    fn segment(&self) -> PyResult<Arc<Segment>> {
        self.segment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                crate::errors::closed_error(&format!("shared-memory segment {:?}", self.name))
            })
    }
}

#[pymethods]
impl ShmSegment {
    /// Opens the segment `name` (mapped read-write unless `readonly`), or creates it
    /// with `size` bytes, zero-filled, when `create` (failing with `FileExistsError`
    /// when the name is taken).
    #[new]
    #[pyo3(signature = (name, create=false, size=0, readonly=false))]
    fn new(name: &str, create: bool, size: usize, readonly: bool) -> PyResult<Self> {
        let segment = if create {
            if readonly {
                return Err(Error::invalid(
                    "a segment being created is mapped read-write",
                ))
                .or_raise();
            }
            Segment::create(name, size, &CreateOptions::default())
        } else {
            let access = if readonly {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            };
            Segment::open(name, access)
        }
        .or_raise()?;
        Ok(Self::wrap(segment))
    }

    /// Encodes `spec` (see `tensorwire.packet._spec`) into a new segment `name` of
    /// exactly the packet's size. A segment already under that name is unlinked first
    /// (tenso's behaviour: it is taken to be a leak of an earlier run).
    #[staticmethod]
    fn create_from(
        py: Python<'_>,
        name: &str,
        spec: &Bound<'_, PyAny>,
        integrity: bool,
        compress: bool,
        alignment: usize,
        aligned_bundle: bool,
    ) -> PyResult<Self> {
        tensorwire::shm::check_name(name).or_raise()?;
        let options = EncodeOptions {
            alignment,
            integrity,
            compress,
            aligned_bundle,
        };
        let (held, parsed) = Held::from_spec(spec)?;
        let encoded = encode_spec(py, &held, &parsed, options)?;
        let segment = create_reclaiming(name, encoded.len()).or_raise()?;
        // SAFETY: the segment was just made and this is its only handle.
        if let Err(e) = unsafe { write_to(&encoded, py, &segment) } {
            drop(segment);
            let _ = Segment::unlink(name);
            return Err(e).or_raise();
        }
        Ok(Self::wrap(segment))
    }

    /// Encodes `spec` at offset 0 of the segment; returns the packet's length.
    /// `MemoryError` when it does not fit (nothing is written then).
    fn put(
        &self,
        py: Python<'_>,
        spec: &Bound<'_, PyAny>,
        integrity: bool,
        compress: bool,
        alignment: usize,
        aligned_bundle: bool,
    ) -> PyResult<usize> {
        let segment = self.segment()?;
        if segment.as_mut_ptr().is_none() {
            return Err(read_only(&segment)).or_raise();
        }
        let options = EncodeOptions {
            alignment,
            integrity,
            compress,
            aligned_bundle,
        };
        let (held, parsed) = Held::from_spec(spec)?;
        let encoded = encode_spec(py, &held, &parsed, options)?;
        self.access.writers_waiting.fetch_add(1, Ordering::SeqCst);
        let writing = lock_releasing_gil(py, || taken(self.access.lock.try_write()));
        self.access.writers_waiting.fetch_sub(1, Ordering::SeqCst);
        let _writing = writing?;
        // SAFETY: the object's write lock, which every handle of this segment in this
        // process shares, keeps their `get`s from reading meanwhile. (Another process
        // writing while this one reads is the shared-memory contract of the module
        // docs: it races on values, and `get(copy=True)` decodes a snapshot.)
        unsafe { write_to(&encoded, py, &segment) }.or_raise()
    }

    /// Decodes the packet at offset 0 (bytes after it are ignored). Arrays are
    /// read-only views of the segment, which they keep mapped, unless `copy`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        copy: bool,
        factories: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let whole = Bytes::from_arc(self.segment()?);
        let _reading = self.read_access(py)?;
        let len = framed_length_after_magic(whole.as_slice())?;
        let len = usize::try_from(len)
            .map_err(|_| Error::Overflow {
                what: "packet length as usize",
            })
            .or_raise()?;
        let packet = whole.slice(..len).or_raise()?;
        if !copy {
            return decode_value(py, &packet, Arrays::Views, factories);
        }
        // A copy is decoded from a snapshot of the packet, taken in one pass and
        // checked afterwards: its magic (which a `put` clears first and writes last)
        // still there with the same length, and its integrity hash, when it has one,
        // over the snapshot itself. So a `put` from another process during the copy
        // gives `BadMagicError` or `ChecksumError` (retry), not arrays mixing the old
        // packet with the new one (a `put` completed whole within the copy, of the
        // same length and without integrity, can still go unseen). The arrays are
        // writable views of the snapshot, which nothing else holds.
        let snapshot = arrays::snapshot(py, packet.as_slice())?;
        let again = framed_length_after_magic(whole.as_slice())?;
        if again != len as u64 {
            return Err(Error::BadMagic {
                offset: 0,
                expected: "the packet a get began to read (a put replaced it meanwhile: retry)",
                found: whole.as_slice()[..MAGIC.len().min(whole.len())].to_vec(),
            })
            .or_raise();
        }
        decode_value(py, &snapshot, Arrays::SnapshotViews, factories)
    }

    /// The length of the packet at offset 0.
    fn packet_length(&self, py: Python<'_>) -> PyResult<u64> {
        let segment = self.segment()?;
        let _reading = self.read_access(py)?;
        framed_length_after_magic(segment.as_slice())
    }

    /// The whole segment as a 1-D uint8 numpy array that keeps the mapping alive;
    /// writable when the segment is mapped read-write.
    fn buffer<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let segment = self.segment()?;
        let len = segment.len();
        segment_array(py, segment, 0, len)
    }

    /// Drops this handle's mapping. Arrays and buffers taken from it keep theirs.
    fn close(&self) {
        self.segment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// Removes the name `name` (`FileNotFoundError` when there is none). Maps stay
    /// valid; the memory is freed when the last one is gone.
    #[staticmethod]
    fn unlink(name: &str) -> PyResult<()> {
        Segment::unlink(name).or_raise()
    }

    /// The segment's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The segment's size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// True when mapped read-write.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.segment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}
