//! numpy arrays over tensorwire memory: zero-copy views whose `base` keeps the memory
//! alive, and fresh arrays filled natively.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use numpy::npyffi::{
    npy_intp, NpyTypes, PyArrayObject, PyArray_Descr, NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS,
    NPY_ARRAY_WRITEABLE, PY_ARRAY_API,
};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use tensorwire::core::strided::row_major_strides;
use tensorwire::core::{AlignedBuf, Owner};
use tensorwire::{Bytes, DType, Error, Shape};

use crate::dtypes;
use crate::errors::{to_pyerr, ResultExt};

/// The owner of a zero-copy array's memory: the numpy `base` of every array tensorwire
/// hands out without copying. It holds a clone of the [`Bytes`] handle, so the file map
/// (or decoded buffer) lives as long as any array, slice or view of it.
#[pyclass(frozen, module = "tensorwire._native", name = "BytesOwner")]
pub struct BytesOwner {
    bytes: Bytes,
}

#[pymethods]
impl BytesOwner {
    /// Number of bytes held.
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes.len()
    }

    /// True when arrays over these bytes may be written (a private copy-on-write map).
    #[getter]
    fn writable(&self) -> bool {
        self.bytes.writable_ptr().is_some()
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.BytesOwner {} bytes at {:p}{}>",
            self.bytes.len(),
            self.bytes.as_ptr(),
            if self.writable() { ", writable" } else { "" }
        )
    }
}

/// Shape as numpy dimensions, checked.
pub fn npy_dims(dims: &[u64]) -> PyResult<Vec<npy_intp>> {
    dims.iter()
        .map(|&d| {
            npy_intp::try_from(d).map_err(|_| Error::Overflow {
                what: "dimension as npy_intp",
            })
        })
        .collect::<Result<_, _>>()
        .or_raise()
}

/// Row-major byte strides of `dims` as torch gives a new tensor (a dimension of
/// size 0 counts as 1 for those before it): numpy's own choice for an empty array
/// is 0, and `torch.from_numpy` would keep that.
fn c_strides(dims: &[u64], dtype: DType) -> PyResult<Vec<npy_intp>> {
    let elem = (dtype.bits() / 8).max(1);
    row_major_strides(dims)
        .into_iter()
        .map(|s| {
            s.checked_mul(elem)
                .and_then(|b| npy_intp::try_from(b).ok())
                .ok_or(Error::Overflow {
                    what: "stride as npy_intp",
                })
        })
        .collect::<Result<_, _>>()
        .or_raise()
}

fn ndim(dims: &[npy_intp]) -> PyResult<c_int> {
    c_int::try_from(dims.len())
        .map_err(|_| Error::Overflow {
            what: "number of dimensions",
        })
        .or_raise()
}

/// A zero-copy array of `dtype` and `dims` over `bytes` (which must hold exactly
/// `dims × dtype` bytes). Writable when the bytes are a private copy-on-write map.
pub fn zero_copy<'py>(
    py: Python<'py>,
    bytes: &Bytes,
    dtype: DType,
    dims: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    zero_copy_in(py, bytes, dtype, dims, None)
}

/// [`zero_copy`] with `owner` as the array's base when `bytes` lie in the memory it
/// holds (the same `Arc` owner), else a new owner of `bytes`.
fn zero_copy_in<'py>(
    py: Python<'py>,
    bytes: &Bytes,
    dtype: DType,
    dims: &[u64],
    owner: Option<&Bound<'py, BytesOwner>>,
) -> PyResult<Bound<'py, PyAny>> {
    let expected = tensorwire::Shape::from_dims(dims)
        .and_then(|s| s.byte_len(dtype))
        .or_raise()?;
    if expected != bytes.len() as u64 {
        return Err(Error::SizeMismatch {
            tensor: String::new(),
            expected,
            found: bytes.len() as u64,
        })
        .or_raise();
    }
    let (data, mut flags) = match bytes.writable_ptr() {
        Some(p) => (p, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE),
        None => (bytes.as_ptr().cast_mut(), NPY_ARRAY_C_CONTIGUOUS),
    };
    if bytes.is_aligned(dtype.alignment()) {
        flags |= NPY_ARRAY_ALIGNED;
    }
    let base = match owner {
        Some(o) if Arc::ptr_eq(o.get().bytes.owner(), bytes.owner()) => o.clone(),
        _ => Bound::new(
            py,
            BytesOwner {
                bytes: bytes.clone(),
            },
        )?,
    };
    // SAFETY: `data` points at `bytes.len()` bytes, which is exactly `dims × dtype`
    // (checked above). They stay valid while `base` lives, since it holds the same
    // `Arc` owner of the map or buffer as `bytes` (a clone of `bytes`, or a `Bytes`
    // over that owner's whole region) and nothing reallocates them.
    // The array is writable only when the owner reports a private copy-on-write map,
    // whose pages belong to this process alone: writes never reach the file or
    // another mapping.
    unsafe { array_over(py, data, flags, dtype, dims, None, base.into_any()) }
}

/// A C-contiguous numpy array lent to Rust as the owner of [`Bytes`]: what borrows
/// the bytes (decoded packet tensors, a safetensors writer) keeps the array, and so
/// the caller's buffer (`bytes`, `bytearray`, `mmap`, ...), alive.
struct ArrayOwner {
    /// Keeps the array, and through its `base` the caller's buffer, alive.
    _array: Py<PyAny>,
    /// Address of the array's first byte (a `usize` so the owner is `Send + Sync`).
    addr: usize,
    len: usize,
}

impl Owner for ArrayOwner {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `addr` is the data pointer of a C-contiguous array of `len` bytes
        // (checked in `lend`), and `_array` holds a reference to it for as long as this
        // owner lives, so numpy cannot free or reallocate the buffer (`resize` refuses
        // arrays that are referenced; `bytearray`/`mmap` refuse to resize or close
        // while numpy holds their buffer export). The bytes are only read here.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// A copy made for one decode ([`snapshot`]), whose arrays are its only users: it
/// lends them a writable base, as a private copy-on-write map does.
struct Snapshot {
    buf: AlignedBuf,
    /// Address of `buf`'s first byte, taken from its mutable slice when it was filled
    /// (a `usize` so the owner is `Send + Sync`).
    base: usize,
}

impl Owner for Snapshot {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    fn writable_base(&self) -> Option<*mut u8> {
        Some(self.base as *mut u8)
    }
}

/// A private, 64-aligned copy of `bytes` to decode once into writable arrays that view
/// it (so a `copy=True` decode copies once, not twice). Made the fast way: fresh memory
/// asked for huge pages, filled on this thread and the copy helpers without the GIL.
/// Its arrays must be the copy's only users: no other [`Bytes`] of it may be kept.
pub fn snapshot(py: Python<'_>, bytes: &[u8]) -> PyResult<Bytes> {
    let mut buf = AlignedBuf::zeroed(bytes.len()).or_raise()?;
    tensorwire::mmap::advise_huge_pages(buf.as_mut_slice());
    copy_parallel(py, vec![(buf.as_mut_slice(), bytes)]);
    let base = buf.as_mut_slice().as_mut_ptr() as usize;
    Ok(Bytes::from_owner(Snapshot { buf, base }))
}

/// The bytes of a C-contiguous array, shared without copying (read-only: the owner
/// offers no writable base).
pub fn lend(array: &Bound<'_, PyUntypedArray>) -> PyResult<Bytes> {
    if !array.is_c_contiguous() {
        return Err(PyTypeError::new_err("the array must be C-contiguous"));
    }
    // SAFETY: the array is C-contiguous (checked) and alive (we hold `array`); the
    // slice is used only to read its address and length.
    let bytes = unsafe { contiguous_bytes(array) };
    Ok(Bytes::from_owner(ArrayOwner {
        _array: array.clone().into_any().unbind(),
        addr: bytes.as_ptr() as usize,
        len: bytes.len(),
    }))
}

static FROMBUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `obj` as a `uint8` array over the same memory: `obj` itself when it is a numpy
/// array, else `numpy.frombuffer(obj, uint8)` (any object with the buffer protocol).
pub fn as_byte_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Ok(array.clone());
    }
    let frombuffer = FROMBUFFER.import(obj.py(), "numpy", "frombuffer")?;
    let kwargs = PyDict::new(obj.py());
    kwargs.set_item("dtype", "uint8")?;
    Ok(frombuffer
        .call((obj,), Some(&kwargs))?
        .cast_into::<PyUntypedArray>()?)
}

/// [`lend`] for a buffer given as a 1-D contiguous `uint8` array.
pub fn lend_bytes(buffer: &Bound<'_, PyUntypedArray>) -> PyResult<Bytes> {
    if !buffer.is_c_contiguous() || buffer.dtype().itemsize() != 1 {
        return Err(PyTypeError::new_err(
            "buffer must be a contiguous uint8 array",
        ));
    }
    lend(buffer)
}

/// One [`BytesOwner`] for the zero-copy arrays a reader hands out over its map, made
/// with the first of them: their common numpy `base`, so each array costs no owner
/// object of its own. It holds the map's `Arc` (the whole file), as every array's
/// `Bytes` did anyway.
#[derive(Default)]
pub struct SharedOwner(std::sync::OnceLock<Py<BytesOwner>>);

impl SharedOwner {
    /// [`zero_copy`], with this owner as the base when `bytes` are in its memory.
    pub fn zero_copy<'py>(
        &self,
        py: Python<'py>,
        bytes: &Bytes,
        dtype: DType,
        dims: &[u64],
    ) -> PyResult<Bound<'py, PyAny>> {
        let owner = match self.0.get() {
            Some(owner) => owner,
            None => {
                let whole = Bytes::from_arc(Arc::clone(bytes.owner()));
                let _ = self.0.set(Py::new(py, BytesOwner { bytes: whole })?);
                self.0.get().expect("set above")
            }
        };
        zero_copy_in(py, bytes, dtype, dims, Some(owner.bind(py)))
    }
}

/// A zero-copy array of `dtype`, `dims` and element `strides` over `bytes`, which must
/// hold exactly the bytes from the first element to one past the last one the strides
/// reach (a torch tensor's extent over its storage). Writable when the bytes are a
/// private copy-on-write map.
pub fn strided_zero_copy<'py>(
    py: Python<'py>,
    bytes: &Bytes,
    dtype: DType,
    dims: &[u64],
    strides: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let elem = dtype.bits() / 8;
    let overflow = || Error::Overflow {
        what: "strided extent",
    };
    let mut extent = if dims.contains(&0) { 0 } else { elem };
    if extent > 0 {
        for (&d, &s) in dims.iter().zip(strides) {
            let step = (d - 1)
                .checked_mul(s)
                .and_then(|n| n.checked_mul(elem))
                .ok_or_else(overflow)
                .or_raise()?;
            extent = extent.checked_add(step).ok_or_else(overflow).or_raise()?;
        }
    }
    if strides.len() != dims.len() || extent != bytes.len() as u64 {
        return Err(Error::SizeMismatch {
            tensor: String::new(),
            expected: extent,
            found: bytes.len() as u64,
        })
        .or_raise();
    }
    let byte_strides: Vec<npy_intp> = strides
        .iter()
        .map(|&s| {
            s.checked_mul(elem)
                .and_then(|b| npy_intp::try_from(b).ok())
                .ok_or_else(overflow)
        })
        .collect::<Result<_, _>>()
        .or_raise()?;
    let (data, flags) = match bytes.writable_ptr() {
        Some(p) => (p, NPY_ARRAY_WRITEABLE),
        None => (bytes.as_ptr().cast_mut(), 0),
    };
    let base = Bound::new(
        py,
        BytesOwner {
            bytes: bytes.clone(),
        },
    )?;
    // SAFETY: every element the strides reach lies in `bytes` (the extent was checked
    // above to be exactly its length), which stays valid while `base` lives since it
    // owns a clone of `bytes` (and so the `Arc` of the map). numpy works out the
    // contiguity and alignment flags itself when strides are given. Writable only
    // over a private copy-on-write map, whose pages belong to this process alone.
    unsafe {
        array_over(
            py,
            data,
            flags,
            dtype,
            dims,
            Some(&byte_strides),
            base.into_any(),
        )
    }
}

/// An array of `dtype` and `dims` over `data`, whose numpy `base` is `base`:
/// C-contiguous, or laid out by `strides` (in bytes) when given.
///
/// # Safety
///
/// `data` must point at the bytes of every element the layout reaches (`dims × dtype`
/// bytes for C order), valid (and not moved) for as long as `base` is alive, and may
/// be written through the array only when `flags` has `NPY_ARRAY_WRITEABLE` and
/// nothing else reads or writes them meanwhile.
// SAFETY: an `unsafe fn` because validity depends on the caller's promises listed in
// `# Safety`; each call site states why they hold.
unsafe fn array_over<'py>(
    py: Python<'py>,
    data: *mut u8,
    flags: c_int,
    dtype: DType,
    dims: &[u64],
    strides: Option<&[npy_intp]>,
    base: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let descr = dtypes::descr(py, dtype)?;
    let mut npy = npy_dims(dims)?;
    let nd = ndim(&npy)?;
    // numpy's own C-order strides (NULL) are ours unless a dimension is 0, where
    // numpy gives 0: only then are they spelt out (no allocation per array otherwise).
    let mut strides = match strides {
        Some(s) => Some(s.to_vec()),
        None if dims.contains(&0) => Some(c_strides(dims, dtype)?),
        None => None,
    };
    let strides_ptr = strides
        .as_mut()
        .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
    // SAFETY: `data` points at every byte the layout reaches, valid while `base` lives
    // (the caller's promise); NULL strides mean C order, otherwise `strides` has one
    // entry per dimension (numpy copies it). `PyArray_NewFromDescr` steals the
    // descriptor reference handed over with `into_ptr`.
    let array = unsafe {
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_ptr().cast::<PyArray_Descr>(),
            nd,
            npy.as_mut_ptr(),
            strides_ptr,
            data.cast::<c_void>(),
            flags,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, raw)?
    };
    // SAFETY: `array` is a fresh ndarray with no base yet; `PyArray_SetBaseObject`
    // steals the reference passed with `into_ptr` (also on failure). From here the
    // array keeps `base`, and so the memory, alive.
    let status = unsafe {
        PY_ARRAY_API.PyArray_SetBaseObject(
            py,
            array.as_ptr().cast::<PyArrayObject>(),
            base.into_ptr(),
        )
    };
    if status < 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(array)
}

/// One buffer that many copies are carved from: one allocation instead of one per
/// tensor, filled in parallel with the GIL released. Each piece is a 64-aligned,
/// C-contiguous array whose `base` is the arena's [`ArenaBuffer`]; large buffers are
/// reused from [`arena_pool`] once every array of an earlier arena is gone, so a loop
/// that decodes message after message does not pay for fresh pages each time.
///
/// Use: [`Arena::new`] with the sources in the order they will be asked for, then
/// [`Arena::take`] for each of them in that order.
pub struct Arena<'py> {
    owner: Bound<'py, ArenaBuffer>,
    /// `(source address, offset in the arena, length)` of each piece, in order.
    pieces: Vec<(usize, usize, usize)>,
    next: usize,
    base: *mut u8,
    writable: bool,
}

impl<'py> Arena<'py> {
    /// Bytes a piece of `len` bytes takes in an arena.
    pub fn footprint(len: usize) -> usize {
        len.div_ceil(64) * 64
    }

    /// An arena holding copies of `sources` (filled now); its pieces are writable
    /// when `writable`.
    pub fn new(py: Python<'py>, sources: &[&[u8]], writable: bool) -> PyResult<Self> {
        let total = sources
            .iter()
            .try_fold(0usize, |n, s| n.checked_add(Self::footprint(s.len())))
            .ok_or_else(|| {
                to_pyerr(Error::Overflow {
                    what: "copy arena size",
                })
            })?;
        // 64-aligned, so every piece (at a multiple of 64) is aligned for any dtype.
        // Fresh memory is asked for huge pages, so a large copy is not one page fault
        // per 4 KiB (what numpy does for its own arrays).
        let mut buf = arena_pool::take(total).or_raise()?;
        tensorwire::mmap::advise_huge_pages(buf.as_mut_slice());
        let mut pieces = Vec::with_capacity(sources.len());
        let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(sources.len());
        let mut rest = buf.as_mut_slice();
        let mut at = 0;
        for src in sources {
            let take = Self::footprint(src.len());
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(take);
            rest = tail;
            pieces.push((src.as_ptr() as usize, at, src.len()));
            at += take;
            jobs.push((&mut piece[..src.len()], src));
        }
        copy_parallel(py, jobs);
        // Moving the buffer into its Python owner keeps its heap memory where it is.
        let base = buf.as_mut_slice().as_mut_ptr();
        let owner = Bound::new(py, ArenaBuffer { buf: Some(buf) })?;
        Ok(Arena {
            owner,
            pieces,
            next: 0,
            base,
            writable,
        })
    }

    /// The copy of `src` (the next source given to [`Arena::new`]) as an array of
    /// `dtype` and `dims`, or None when `src` is not that source.
    pub fn take(
        &mut self,
        src: &[u8],
        dtype: DType,
        dims: &[u64],
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(&(addr, offset, len)) = self.pieces.get(self.next) else {
            return Ok(None);
        };
        if addr != src.as_ptr() as usize || len != src.len() {
            return Ok(None);
        }
        let expected = Shape::from_dims(dims)
            .and_then(|s| s.byte_len(dtype))
            .or_raise()?;
        if expected != len as u64 {
            return Err(Error::SizeMismatch {
                tensor: String::new(),
                expected,
                found: len as u64,
            })
            .or_raise();
        }
        self.next += 1;
        let mut flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
        if self.writable {
            flags |= NPY_ARRAY_WRITEABLE;
        }
        let data = self.base.wrapping_add(offset);
        // SAFETY: `data` is `len` = `dims × dtype` bytes inside the arena's buffer
        // (offset and length recorded by `new`, which filled them), and that buffer
        // lives, unmoved, while its `ArenaBuffer`, the new array's base, does (the
        // buffer goes back to the pool only when the owner is dropped, that is after
        // the last array over it). Pieces do not overlap and each is handed out once
        // (`next` only grows), so a writable piece is written only through its array.
        unsafe {
            array_over(
                self.owner.py(),
                data,
                flags,
                dtype,
                dims,
                None,
                self.owner.clone().into_any(),
            )
        }
        .map(Some)
    }
}

/// The memory of an [`Arena`]: the numpy `base` of the arrays carved from it. When
/// the last of them is gone the buffer goes back to [`arena_pool`].
#[pyclass(frozen, module = "tensorwire._native", name = "ArenaBuffer")]
pub struct ArenaBuffer {
    /// Always `Some` until dropped (then it goes back to the pool).
    buf: Option<AlignedBuf>,
}

#[pymethods]
impl ArenaBuffer {
    /// Number of bytes held.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.as_ref().map_or(0, AlignedBuf::len)
    }

    fn __len__(&self) -> usize {
        self.nbytes()
    }
}

impl Drop for ArenaBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            arena_pool::give_back(buf);
        }
    }
}

/// Large arena buffers kept after use, so the next arena of a similar size reuses
/// pages already mapped and touched instead of faulting in (and having the kernel
/// zero) fresh ones. Bounded: at most [`arena_pool::MAX_RETAINED`] bytes are kept,
/// only buffers of at least [`arena_pool::MIN_POOLED`] bytes, and a buffer is reused
/// only for a request of at least half its size.
pub mod arena_pool {
    use std::sync::Mutex;

    use tensorwire::core::AlignedBuf;
    use tensorwire::Result;

    /// Smallest buffer worth keeping (smaller ones are cheap for malloc).
    pub const MIN_POOLED: usize = 1 << 20;
    /// Most bytes kept in the pool at once.
    pub const MAX_RETAINED: usize = 64 << 20;

    static FREE: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());

    fn free() -> std::sync::MutexGuard<'static, Vec<AlignedBuf>> {
        // A panic while holding the lock cannot leave the list inconsistent (each
        // operation is one push or remove), so a poisoned lock is still usable.
        FREE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A 64-aligned buffer of at least `len` bytes (at most twice that): a kept one
    /// when one fits (its old contents still there: callers overwrite what they hand
    /// out), else a new zeroed one (`AlignedBuf::zeroed`: no pass over the memory).
    pub fn take(len: usize) -> Result<AlignedBuf> {
        if len >= MIN_POOLED {
            let mut list = free();
            let fit = list
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= len && b.len() / 2 <= len)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                return Ok(list.swap_remove(i));
            }
        }
        AlignedBuf::zeroed(len)
    }

    /// Keeps `buf` for reuse when it is large enough and fits under the cap
    /// (dropping the oldest kept buffers to make room), else frees it.
    pub fn give_back(buf: AlignedBuf) {
        if buf.len() < MIN_POOLED || buf.len() > MAX_RETAINED {
            return;
        }
        let mut list = free();
        let mut kept: usize = list.iter().map(AlignedBuf::len).sum();
        while kept + buf.len() > MAX_RETAINED && !list.is_empty() {
            kept -= list.remove(0).len();
        }
        list.push(buf);
    }
}

/// A new, uninitialised C-contiguous array of `dtype` and `dims`, and its data as a
/// mutable byte slice to fill.
///
/// The slice borrows the array's buffer: it must be filled before the array is handed
/// to Python code (the caller keeps the returned `Bound` alive meanwhile).
pub fn fresh<'py>(
    py: Python<'py>,
    dtype: DType,
    dims: &[u64],
) -> PyResult<(Bound<'py, PyAny>, FreshBuf)> {
    let nbytes = tensorwire::Shape::new(dims.to_vec())
        .and_then(|s| s.byte_len(dtype))
        .and_then(|n| {
            usize::try_from(n).map_err(|_| Error::Overflow {
                what: "tensor size as usize",
            })
        })
        .or_raise()?;
    if nbytes == 0 {
        // numpy allocates empty arrays with zero strides; torch gives a new empty
        // tensor row-major ones, and `torch.from_numpy` keeps what numpy has. An
        // array over an empty aligned buffer takes ours.
        let empty = AlignedBuf::zeroed(0).or_raise()?.into_bytes();
        let data = empty.as_ptr().cast_mut();
        let base = Bound::new(py, BytesOwner { bytes: empty })?;
        let flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED;
        // SAFETY: the array has no element, so nothing is ever read or written
        // through `data`, which is non-null, 64-aligned and kept alive by `base`.
        let array = unsafe { array_over(py, data, flags, dtype, dims, None, base.into_any())? };
        return Ok((array, FreshBuf { ptr: data, len: 0 }));
    }
    let descr = dtypes::descr(py, dtype)?;
    let mut npy = npy_dims(dims)?;
    let nd = ndim(&npy)?;
    // SAFETY: `PyArray_Empty` allocates a C-ordered array of `dims` and steals the
    // descriptor reference handed over with `into_ptr`.
    let array = unsafe {
        let raw = PY_ARRAY_API.PyArray_Empty(
            py,
            nd,
            npy.as_mut_ptr(),
            descr.into_ptr().cast::<PyArray_Descr>(),
            0,
        );
        Bound::from_owned_ptr_or_err(py, raw)?
    };
    // SAFETY: `array` is an ndarray (PyArray_Empty succeeded), so the object is a
    // `PyArrayObject` and its `data` field is readable.
    let data = unsafe { (*array.as_ptr().cast::<PyArrayObject>()).data };
    Ok((
        array,
        FreshBuf {
            ptr: data.cast::<u8>(),
            len: nbytes,
        },
    ))
}

/// The buffer of an array made by [`fresh`], to fill (possibly without the GIL).
pub struct FreshBuf {
    ptr: *mut u8,
    len: usize,
}

impl FreshBuf {
    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The part `start..start + len` of the buffer (clamped to it).
    pub fn subslice(self, start: usize, len: usize) -> FreshBuf {
        let start = start.min(self.len);
        FreshBuf {
            ptr: self.ptr.wrapping_add(start),
            len: len.min(self.len - start),
        }
    }

    /// The buffer as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is the data of an array numpy just allocated with exactly
        // `len` bytes (C-contiguous, `dims × dtype`); the array is owned by the caller
        // of `fresh` and not yet visible to any other code, so this is the only
        // reference to the buffer, and it lives while the array does.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Copies each `(destination, source)` pair (of equal lengths), on this thread and
/// tensorwire's copy helpers when large (`tensorwire::core::copy`), with the GIL
/// released when there is enough to copy.
pub fn copy_parallel(py: Python<'_>, jobs: Vec<(&mut [u8], &[u8])>) {
    let total = jobs.iter().map(|(_, src)| src.len()).sum();
    maybe_detach(py, total, move || tensorwire::core::copy::copy_pairs(jobs));
}

/// `_copy_pairs(pairs)`: copies each `(dst, src)` pair of numpy arrays (C-contiguous,
/// `dst` writable, the same number of bytes; dtypes and shapes may differ, but no
/// dtype may hold Python objects), on this thread and tensorwire's copy helpers,
/// without the GIL when large. No destination may share a byte with another
/// destination or with any source.
#[pyfunction]
#[pyo3(name = "_copy_pairs")]
pub fn copy_pairs_py(
    py: Python<'_>,
    pairs: Vec<(Bound<'_, PyUntypedArray>, Bound<'_, PyUntypedArray>)>,
) -> PyResult<()> {
    let mut spans = Vec::with_capacity(pairs.len() * 2);
    for (i, (dst, src)) in pairs.iter().enumerate() {
        // SAFETY: `dst` is an ndarray, so reading its `flags` field is valid.
        let flags = unsafe { (*dst.as_array_ptr()).flags };
        if flags & NPY_ARRAY_WRITEABLE == 0 || !dst.is_c_contiguous() || !src.is_c_contiguous() {
            return Err(Error::invalid(format!(
                "pair {i}: dst must be writable and both arrays C-contiguous"
            )))
            .or_raise();
        }
        if dst.dtype().has_object() || src.dtype().has_object() {
            // Bytes copied into (or out of) object arrays would be taken for (or
            // give away) Python object pointers.
            return Err(Error::invalid(format!(
                "pair {i}: arrays of Python objects have no bytes to copy"
            )))
            .or_raise();
        }
        let (dst_len, src_len) = (nbytes(dst), nbytes(src));
        if dst_len != src_len {
            return Err(Error::invalid(format!(
                "pair {i}: dst holds {dst_len} bytes, src {src_len}"
            )))
            .or_raise();
        }
        if dst_len > 0 {
            spans.push((data_address(dst), dst_len, true));
            spans.push((data_address(src), src_len, false));
        }
    }
    if let Some(i) = first_overlap(&mut spans) {
        return Err(Error::invalid(format!(
            "a destination overlaps another array (at address {i:#x})"
        )))
        .or_raise();
    }
    let jobs = pairs
        .iter()
        .map(|(dst, src)| {
            // SAFETY: both arrays are C-contiguous (checked) and held by `pairs` for
            // this whole call; `dst` is writable and shares no byte with any other
            // array of the call (checked), so this is the only slice over its bytes
            // here. Another Python thread writing to them meanwhile races on values,
            // as with any in-place numpy operation, never on memory.
            unsafe { (contiguous_bytes_mut(dst), contiguous_bytes(src)) }
        })
        .collect();
    copy_parallel(py, jobs);
    Ok(())
}

/// The bytes of an array's elements (its buffer's length when it is contiguous).
fn nbytes(array: &Bound<'_, PyUntypedArray>) -> usize {
    array.len() * array.dtype().itemsize()
}

fn data_address(array: &Bound<'_, PyUntypedArray>) -> usize {
    // SAFETY: `array` is an ndarray, so reading its `data` field is valid.
    unsafe { (*array.as_array_ptr()).data as usize }
}

/// The start of the first span that overlaps another where at least one of the two
/// is a destination (`(start, length, is_destination)`, lengths non-zero), if any.
/// Sorted by start, a span overlaps an earlier one exactly when it starts before the
/// furthest end reached so far.
fn first_overlap(spans: &mut [(usize, usize, bool)]) -> Option<usize> {
    spans.sort_unstable_by_key(|&(start, _, _)| start);
    let (mut any_end, mut dst_end) = (0usize, 0usize);
    for &(start, len, is_dst) in spans.iter() {
        if start < dst_end || (is_dst && start < any_end) {
            return Some(start);
        }
        let end = start.saturating_add(len);
        any_end = any_end.max(end);
        if is_dst {
            dst_end = dst_end.max(end);
        }
    }
    None
}

/// Bytes above which copies and decodes release the GIL.
pub const RELEASE_GIL_BYTES: usize = 1 << 16;

/// The bytes of a C-contiguous ndarray, read-only.
///
/// # Safety
///
/// `array` must be C-contiguous; the caller must keep it alive while the slice is
/// used, and accept that another Python thread writing to the array meanwhile
/// changes the bytes read.
// SAFETY: an `unsafe fn` because validity depends on the caller's promises listed in
// `# Safety`; each call site states why they hold.
pub unsafe fn contiguous_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> &'a [u8] {
    let len = nbytes(array);
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller guarantees `array` is C-contiguous and outlives the slice;
    // a C-contiguous array's `len × itemsize` bytes start at `data`.
    unsafe {
        let data = (*array.as_array_ptr()).data;
        std::slice::from_raw_parts(data.cast::<u8>(), len)
    }
}

/// The writable bytes of a C-contiguous, writable ndarray.
///
/// # Safety
///
/// Same as [`contiguous_bytes`], and no other reference to the array's buffer may be
/// used while the slice is.
// The slice is numpy's buffer, not memory inside the `Bound` handle, so handing
// out `&mut` from `&` aliases nothing Rust owns; exclusivity is the caller's promise.
#[allow(clippy::mut_from_ref)]
// SAFETY: an `unsafe fn` because validity depends on the caller's promises listed in
// `# Safety`; each call site states why they hold.
pub unsafe fn contiguous_bytes_mut<'a>(array: &'a Bound<'_, PyUntypedArray>) -> &'a mut [u8] {
    let len = nbytes(array);
    if len == 0 {
        return &mut [];
    }
    // SAFETY: forwarded to the caller (C-contiguous, writable, alive, unaliased).
    unsafe {
        let data = (*array.as_array_ptr()).data;
        std::slice::from_raw_parts_mut(data.cast::<u8>(), len)
    }
}

/// True when the array's descriptor is exactly `descr` (same type and byte order).
pub fn same_dtype(array: &Bound<'_, PyUntypedArray>, descr: &Bound<'_, PyArrayDescr>) -> bool {
    array.dtype().is_equiv_to(descr)
}

/// Runs `f` without the GIL when `nbytes` is large enough to be worth it.
pub fn maybe_detach<T: Send>(py: Python<'_>, nbytes: usize, f: impl FnOnce() -> T + Send) -> T {
    if nbytes >= RELEASE_GIL_BYTES {
        py.detach(f)
    } else {
        f()
    }
}

static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// An array ready to write: C-contiguous, little-endian, with its tensorwire dtype.
pub struct Prepared<'py> {
    /// The array (a converted copy when the input was not C-contiguous little-endian).
    pub array: Bound<'py, PyUntypedArray>,
    /// Its tensorwire dtype.
    pub dtype: DType,
}

impl Prepared<'_> {
    /// The array's shape.
    pub fn shape(&self) -> PyResult<Shape> {
        Shape::try_from(self.array.shape()).or_raise()
    }

    /// The array's bytes, C order.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `prepare` made the array C-contiguous, and `self.array` keeps it
        // alive for the borrow. Another Python thread writing to the array while the
        // GIL is released would change the values written, never the memory's
        // validity: we hold a reference, so numpy refuses to reallocate it
        // (`resize` checks references), unless the caller turns that check off
        // (`resize(refcheck=False)`, which numpy documents as unsafe for any
        // array others hold, as it is for every C extension holding one).
        unsafe { contiguous_bytes(&self.array) }
    }
}

/// Converts `obj` to a C-contiguous, little-endian numpy array (copying only when it
/// is not one already, e.g. a transposed view or big-endian data, which is byte-swapped).
pub fn prepare<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Prepared<'py>> {
    let py = obj.py();
    let asarray = ASARRAY.import(py, "numpy", "asarray")?;
    let array = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => asarray.call1((obj,))?.cast_into::<PyUntypedArray>()?,
    };
    let descr = array.dtype();
    let (dtype, big_endian) = dtypes::from_numpy(&descr)?;
    if !big_endian && array.is_c_contiguous() {
        return Ok(Prepared { array, dtype });
    }
    let target = if big_endian {
        descr.call_method1("newbyteorder", ("<",))?
    } else {
        descr.into_any()
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", target)?;
    kwargs.set_item("order", "C")?;
    let array = asarray
        .call((array,), Some(&kwargs))?
        .cast_into::<PyUntypedArray>()?;
    Ok(Prepared { array, dtype })
}
