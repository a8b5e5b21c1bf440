//! `tensorwire._native.Reader`: the native half of `tensorwire.Reader`.
//!
//! Every per-tensor operation is one native call: lookup, zero-copy view or native
//! copy/decode into a fresh numpy array, with the GIL released for large copies.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use numpy::npyffi::NPY_ARRAY_WRITEABLE;
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use tensorwire::formats::safetensors::StDType;
use tensorwire::pytorch::TorchOnlyDType;
use tensorwire::zt::{ByteType, Component, Encoding, ZtReader};
use tensorwire::{DType, Error, Layout, TensorInfo, TensorSource};

use crate::arrays::{self, maybe_detach};
use crate::dtypes;
use crate::errors::{to_pyerr, ResultExt};
use crate::values;

/// The tensor names as the Python strs `keys()` hands out (made by its first call),
/// and where the next lookup is expected. Code reads tensors in the order `keys()`
/// gave them, so a lookup first checks whether it was given the very str object at
/// that position: then it costs a pointer comparison instead of a UTF-8 conversion
/// (which under the stable ABI of Python 3.9 allocates twice) and a hash lookup.
struct NameCache {
    names: Vec<Py<PyString>>,
    next: AtomicUsize,
}

/// Reads tensors from a file, recognised by its magic bytes and mapped privately
/// (copy-on-write).
///
/// Frozen: a read borrows nothing of the reader across the GIL being released. Each
/// call takes its own reference to the open source ([`Open`]), so `close()` (on any
/// thread) never waits for reads in flight: they finish with the source they took,
/// and calls made after it raise the closed error.
#[pyclass(module = "tensorwire._native", name = "Reader", subclass, frozen)]
pub struct Reader {
    /// The open source; `None` once closed.
    open: Mutex<Option<Arc<Open>>>,
    /// The path opened, or `None` for a reader over a caller's buffer.
    path: Option<PathBuf>,
}

/// What an open reader holds, kept alive by each call that uses it.
struct Open {
    source: Box<dyn TensorSource>,
    /// The base of the zero-copy arrays over the file map.
    owner: arrays::SharedOwner,
    names: PyOnceLock<NameCache>,
    /// The file-level attributes, converted once (a GGUF vocabulary is hundreds of
    /// thousands of values).
    attributes: PyOnceLock<values::FrozenAttributes>,
}

impl Reader {
    /// The open source, for one call; the closed error once `close()` ran.
    fn open(&self) -> PyResult<Arc<Open>> {
        self.slot()
            .clone()
            .ok_or_else(|| crate::errors::closed_error("the reader"))
    }

    /// The lock over the open source; held only to clone or take the `Arc`.
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Open>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Open {
    fn src(&self) -> &dyn TensorSource {
        &*self.source
    }

    fn names(&self, py: Python<'_>) -> PyResult<&NameCache> {
        let src = self.src();
        self.names.get_or_try_init(py, || {
            let names = src
                .tensors()
                .iter()
                .map(|t| PyString::new(py, &t.name).unbind())
                .collect();
            Ok::<_, PyErr>(NameCache {
                names,
                next: AtomicUsize::new(0),
            })
        })
    }

    /// The position of the tensor `name` (a str) in the source.
    fn position_of(&self, name: &Bound<'_, PyString>) -> PyResult<usize> {
        let cache = self.names.get(name.py());
        if let Some(cache) = cache {
            // The expected position, or the last hit again (a name looked up twice).
            let next = cache.next.load(Ordering::Relaxed);
            for at in [next, next.wrapping_sub(1)] {
                if cache
                    .names
                    .get(at)
                    .is_some_and(|n| n.as_ptr() == name.as_ptr())
                {
                    cache.next.store(at + 1, Ordering::Relaxed);
                    return Ok(at);
                }
            }
        }
        let at = self.src().position(&name.to_cow()?).or_raise()?;
        if let Some(cache) = cache {
            cache.next.store(at + 1, Ordering::Relaxed);
        }
        Ok(at)
    }

    /// [`Open::position_of`] for an argument that must be a str.
    fn position_of_any(&self, name: &Bound<'_, PyAny>) -> PyResult<usize> {
        let name = name
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err("name must be a str"))?;
        self.position_of(name)
    }
}

fn zt(src: &dyn TensorSource) -> Option<&ZtReader> {
    src.as_any().downcast_ref::<ZtReader>()
}

/// `src` as a PyTorch checkpoint, for the calls only those answer.
fn pytorch(src: &dyn TensorSource) -> PyResult<&tensorwire::pytorch::PtReader> {
    src.as_any()
        .downcast_ref::<tensorwire::pytorch::PtReader>()
        .ok_or_else(|| {
            to_pyerr(Error::unsupported(format!(
                "this needs one PyTorch checkpoint, not a {} source",
                src.format()
            )))
        })
}

/// A meta tensor as `Reader._pytorch_meta` gives it: (name, torch dtype name, sizes,
/// strides, requires_grad, parameter, position, same_as).
type MetaRow = (
    String,
    &'static str,
    Vec<u64>,
    Vec<u64>,
    bool,
    bool,
    usize,
    Option<usize>,
);

/// A sparse tensor as `Reader._pytorch_sparse` gives it: (name, layout, size,
/// is_coalesced, part names, parameter).
type SparseRow = (
    String,
    &'static str,
    Vec<u64>,
    Option<bool>,
    Vec<String>,
    Option<bool>,
);

/// The info of the dense tensor at `at`.
fn dense_info(src: &dyn TensorSource, at: usize) -> PyResult<&TensorInfo> {
    let info = src.info_at(at).or_raise()?;
    let name = &*info.name;
    // Blocks a format names but tensorwire does not decode (GGUF quantized types,
    // safetensors' packed floats) read as their raw bytes, as gguf.GGUFReader gives
    // them; `.zt` objects of other layouts are read by component.
    let raw_blocks = matches!(info.layout, Layout::Other(_)) && zt(src).is_none();
    if info.layout != Layout::Dense && !raw_blocks {
        return Err(Error::unsupported(format!(
            "tensor `{name}` has layout {}; use read() to get its components",
            info.layout
        )))
        .or_raise();
    }
    Ok(info)
}

/// The safetensors types tensorwire reads as raw bytes but torch has dtypes for.
const TORCH_RAW_TYPES: [&str; 2] = ["safetensors:F8_E8M0", "safetensors:F4"];

/// The type read_torch builds a tensor of when it is not the tensor's dtype and
/// shape: for a safetensors type of [`TORCH_RAW_TYPES`] its layout name and logical
/// shape (the Python side picks the torch dtype, or keeps the raw bytes on an older
/// torch), for a PyTorch checkpoint's [`TorchOnlyDType`] its layout name and
/// torch's shape, and for a `.zt` [`ByteType`] `zt:<type>` and the object's shape.
fn torch_type<'a>(src: &'a dyn TensorSource, info: &'a TensorInfo) -> Option<TorchType<'a>> {
    if let Some(zt) = tensorwire::zt_holding(src, &info.name) {
        if let Ok(Some(byte_type)) = zt.byte_type(&info.name) {
            let name = match byte_type {
                ByteType::F8E8M0 => "zt:f8_e8m0",
                ByteType::F4E2M1 => "zt:f4_e2m1",
            };
            let object = zt.object(&info.name).ok()?;
            return Some(TorchType {
                name,
                dims: object.shape.dims().into(),
                torch_only: None,
            });
        }
    }
    // The layout, or the one a `.zt` tensor converted from such a file records.
    let name = info.source_layout_name()?;
    if let Some(torch_only) = TorchOnlyDType::of(info) {
        let dims = torch_only.outer(info.shape.dims()).into();
        return Some(TorchType {
            name,
            dims,
            torch_only: Some(torch_only),
        });
    }
    if !TORCH_RAW_TYPES.contains(&name) {
        return None;
    }
    let (_, dims) = raw_safetensors_listing(info)?;
    Some(TorchType {
        name,
        dims: dims.into(),
        torch_only: None,
    })
}

/// The safetensors raw type (`F4`, `F6_*`, `F8_E8M0`) whose bytes a tensor holds, as
/// its file lists it or as a `.zt` tensor converted from such a file records it, with
/// its logical shape: only a recorded shape that counts the bytes (a safetensors
/// file's always does; a `.zt` file's attribute is its writer's word).
fn raw_safetensors_listing(info: &TensorInfo) -> Option<(StDType, Vec<u64>)> {
    let raw = StDType::from_name(info.source_layout_name()?.strip_prefix("safetensors:")?)?;
    if raw.dtype().is_some() {
        return None; // a type tensorwire has: its listing is the tensor's own
    }
    Some((raw, raw.fitting_recorded_shape(info)?))
}

/// What [`torch_type`] finds: the type's name for the Python side, the torch (or
/// logical) shape, and for a PyTorch checkpoint's torch-only dtype, that dtype.
struct TorchType<'a> {
    name: &'a str,
    dims: Cow<'a, [u64]>,
    torch_only: Option<TorchOnlyDType>,
}

/// The shape of the torch tensor a raw type's bytes make (of logical shape `dims`):
/// one byte per value for F8_E8M0, and for F4 (two values per byte, the first in the
/// low nibble) pairs along an even last dimension; `None` for F4 whose last
/// dimension does not pair up (read as its bytes), and for other types. Python's
/// `_torch.torch_type` asks here too (`_native.raw_torch_dims`): one rule for every
/// read path.
#[pyfunction]
pub fn raw_torch_dims(name: &str, dims: Vec<u64>) -> Option<Vec<u64>> {
    torch_dims_of_raw(name, &dims)
}

/// [`raw_torch_dims`] over borrowed dims (the read path's).
fn torch_dims_of_raw(name: &str, dims: &[u64]) -> Option<Vec<u64>> {
    match name {
        "safetensors:F8_E8M0" | "zt:f8_e8m0" => Some(dims.to_vec()),
        "safetensors:F4" | "zt:f4_e2m1" => {
            tensorwire::formats::safetensors::float4_values_as_pairs(dims)
        }
        _ => None,
    }
}

/// The logical shape (single values) of torch `float4_e2m1fn_x2` pairs of shape
/// `pairs`, as safetensors' F4 counts it; `None` for 0-d pairs.
#[pyfunction]
pub fn float4_pairs_as_values(pairs: Vec<u64>) -> PyResult<Option<Vec<u64>>> {
    tensorwire::formats::safetensors::float4_pairs_as_values(&pairs).or_raise()
}

/// The numpy dtype built in that holds `dtype`'s elements bit for bit: `dtype`
/// itself where numpy has it, else an unsigned one of its size (bfloat16 as `u16`,
/// float8 as `u8`); `None` for a type of no whole bytes.
fn same_size_numpy_dtype(dtype: DType) -> Option<DType> {
    if dtypes::numpy_builtin(dtype) {
        return Some(dtype);
    }
    match dtype.bits() {
        8 => Some(DType::U8),
        16 => Some(DType::U16),
        32 => Some(DType::U32),
        64 => Some(DType::U64),
        _ => None,
    }
}

/// Whether `bytes` may back a view of `info`'s tensor under `lend`, whose elements
/// torch has as they are listed (a complex32's `f16` pairs: 4 bytes).
fn lendable_as(bytes: &tensorwire::Bytes, info: &TensorInfo, lend: Lend) -> bool {
    let lanes = TorchOnlyDType::of(info).map_or(1, TorchOnlyDType::lanes);
    lendable_at(bytes, torch_alignment(info.dtype) * lanes as usize, lend)
}

fn lendable_at(bytes: &tensorwire::Bytes, alignment: usize, lend: Lend) -> bool {
    match lend {
        Lend::Any => true,
        Lend::Torch => bytes.is_aligned(alignment) && bytes.writable_ptr().is_some(),
    }
}

/// The alignment torch's kernels assume for `dtype`: its whole element, where numpy
/// asks less of complex numbers (`c10::complex<double>` is aligned to 16 bytes, and
/// its kernels load it with instructions that fault on 8).
fn torch_alignment(dtype: DType) -> usize {
    dtype.alignment().max((dtype.bits() / 8) as usize)
}

/// A fresh array of `dtype` and `dims` holding a copy of `bytes` (exactly its size;
/// `name` for the error), copied as [`copy_exact`] copies.
fn copied_array<'py>(
    py: Python<'py>,
    name: &str,
    bytes: &[u8],
    dtype: DType,
    dims: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let (array, mut buf) = arrays::fresh(py, dtype, dims)?;
    let dst = buf.as_mut_slice();
    copy_exact(py, name, dst, bytes).map(|()| array)
}

/// Copies (or decodes) the bytes of the dense tensor at `at`, called `name` (checked by
/// [`dense_info`]), into `dst` (exactly its size).
fn fill_dense(
    py: Python<'_>,
    src: &dyn TensorSource,
    at: usize,
    name: &str,
    dst: &mut [u8],
) -> PyResult<()> {
    if let Some(zt) = zt(src) {
        if overlaps(dst, zt.bytes()) {
            // `dst` views this reader's own map: copy through a temporary buffer.
            let tmp = zt.component(name, "data").or_raise()?.to_vec();
            return copy_exact(py, name, dst, &tmp);
        }
        return maybe_detach(py, dst.len(), || zt.read_into(name, dst)).or_raise();
    }
    check_before_copying(py, src, at)?;
    let view = src.view_at(at).or_raise()?;
    if overlaps(dst, &view.bytes) {
        // `dst` views the very bytes it is to receive (a zero-copy array of this
        // reader): copy through a temporary buffer rather than memcpy onto itself.
        let tmp = view.bytes.to_vec();
        return copy_exact(py, name, dst, &tmp);
    }
    copy_exact(py, name, dst, &view.bytes)
}

/// Checks the CRC-32 of the record (an NPZ member, a `.pt` storage record) that the
/// tensor at `at` lies in, before a copy of its bytes, so damage is an error rather
/// than a faithful copy of it: once per reader, without the GIL.
fn check_before_copying(py: Python<'_>, src: &dyn TensorSource, at: usize) -> PyResult<()> {
    py.detach(|| src.check_record_at(at)).or_raise()
}

/// Copies `src` into `dst` (which must be as long), on tensorwire's copy helpers and
/// without the GIL when large.
fn copy_exact(py: Python<'_>, name: &str, dst: &mut [u8], src: &[u8]) -> PyResult<()> {
    if dst.len() != src.len() {
        return Err(Error::SizeMismatch {
            tensor: name.to_owned(),
            expected: src.len() as u64,
            found: dst.len() as u64,
        })
        .or_raise();
    }
    arrays::copy_parallel(py, vec![(dst, src)]);
    Ok(())
}

fn overlaps(dst: &[u8], src: &[u8]) -> bool {
    let (d0, d1) = (dst.as_ptr() as usize, dst.as_ptr() as usize + dst.len());
    let (s0, s1) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
    !dst.is_empty() && d0 < s1 && s0 < d1
}

/// Which borrowed bytes [`dense_array`] may lend to an array without copying.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lend {
    /// Any: numpy handles unaligned arrays (their `ALIGNED` flag is off), as
    /// `np.frombuffer` at an odd offset gives them.
    Any,
    /// For torch: only element-aligned bytes (its kernels assume aligned data) that
    /// may be written (torch has no read-only tensors: a view of a caller's `bytes`
    /// or of a read-only map would let a write corrupt it, or crash).
    Torch,
}

impl Lend {
    /// For torch, unless the bytes are `only_copied` elsewhere (to a GPU), when any
    /// view will do.
    fn for_torch(only_copied: bool) -> Lend {
        if only_copied {
            Lend::Any
        } else {
            Lend::Torch
        }
    }
}

/// The dense tensor at `at` as a numpy array: zero-copy for raw tensors unless `copy`
/// (strided tensors keep their strides; unaligned or read-only ones are copied under
/// [`Lend::Torch`]), a fresh (writable) array otherwise. With `raw`, the array is
/// the tensor's bytes as `uint8`.
fn dense_array<'py>(
    py: Python<'py>,
    src: &dyn TensorSource,
    at: usize,
    copy: bool,
    raw: bool,
    lend: Lend,
    owner: &arrays::SharedOwner,
) -> PyResult<Bound<'py, PyAny>> {
    let info = dense_info(src, at)?;
    let name = &*info.name;
    let (dtype, dims): (DType, std::borrow::Cow<'_, [u64]>) = if raw {
        (DType::U8, vec![info.nbytes].into())
    } else {
        (info.dtype, info.shape.dims().into())
    };
    // A Fortran-order NumPy array stays column-major even when it must be copied
    // (byte-swapped, or a deflated NPZ member), as np.load gives it.
    // (Only from NumPy files: a `.zt` converted from one keeps the attribute over C
    // order.)
    let fortran = !raw
        && matches!(src.format(), "npy" | "npz")
        && info.attributes.get("npy.fortran_order") == Some(&tensorwire::Value::Bool(true));
    if !copy && (info.encoding.is_none() || fortran) {
        let (bytes, zero_copy) = if raw {
            let view = src.view_at(at).or_raise()?;
            (view.bytes, view.zero_copy)
        } else {
            // A strided tensor (a transposed torch tensor, a Fortran-order NumPy
            // array) stays a strided view of the file, as torch.load and np.load give
            // it.
            let strided = src.strided_at(at).or_raise()?;
            if let (true, Some(strides)) = (
                strided.zero_copy && lendable_as(&strided.bytes, info, lend),
                &strided.strides,
            ) {
                // Also a row-major tensor whose size-1 dimensions carry other
                // strides: the view keeps them, as torch does.
                return arrays::strided_zero_copy(
                    py,
                    &strided.bytes,
                    strided.dtype,
                    strided.shape.dims(),
                    strides,
                );
            } else if strided.is_contiguous() {
                (strided.bytes, strided.zero_copy)
            } else if fortran {
                if strided.zero_copy {
                    check_before_copying(py, src, at)?;
                }
                // The C-order array of the reversed shape, transposed: F-contiguous.
                let reversed: Vec<u64> = strided.shape.dims().iter().rev().copied().collect();
                let array = copied_array(py, name, &strided.bytes, strided.dtype, &reversed)?;
                return array.call_method0("transpose");
            } else {
                if strided.zero_copy {
                    check_before_copying(py, src, at)?;
                }
                let max = tensorwire::Limits::default().max_decoded_bytes;
                (strided.to_contiguous(max).or_raise()?.into_bytes(), false)
            }
        };
        // Unaligned bytes (a legacy torch file's storages and NPZ members sit at
        // arbitrary offsets) are lent to numpy but copied for torch.
        if zero_copy && lendable_as(&bytes, info, lend) {
            return owner.zero_copy(py, &bytes, dtype, &dims);
        }
        // The bytes are already read (and gathered or swapped): copy them rather than
        // reading the tensor again (the map's bytes after their record's CRC check).
        if zero_copy {
            check_before_copying(py, src, at)?;
        }
        return copied_array(py, name, &bytes, dtype, &dims);
    }
    let (array, mut buf) = arrays::fresh(py, dtype, &dims)?;
    fill_dense(py, src, at, name, buf.as_mut_slice())?;
    Ok(array)
}

/// A component as a numpy array: a dense `data` component takes the object's shape
/// when it holds one stored unit per element, others (and packed data such as
/// `f4_e2m1`, two per byte) are 1-D; the element type is the component's logical type
/// when numpy has it.
fn component_array<'py>(
    py: Python<'py>,
    zt: &ZtReader,
    name: &str,
    dense_shape: Option<&tensorwire::Shape>,
    comp: &Component,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let logical = match comp.logical_dtype() {
        DType::QInt4 | DType::QUInt4 => comp.dtype,
        d => d,
    };
    let unit = logical.size().unwrap_or(1) as u64;
    let dtype = if comp.decoded_length() % unit == 0 {
        logical
    } else {
        comp.dtype
    };
    let count = comp.decoded_length() / dtype.size().unwrap_or(1).max(1) as u64;
    // The tensor's shape when the bytes hold that many elements; packed ones
    // (`f4_e2m1`: two per byte) come as their flat stored units.
    let dims: Vec<u64> = match dense_shape {
        Some(shape) if comp.role == "data" && shape.numel().ok() == Some(count) => {
            shape.dims().to_vec()
        }
        _ => vec![count],
    };
    if !copy && comp.encoding == Encoding::Raw {
        let bytes = zt.component(name, &comp.role).or_raise()?;
        return arrays::zero_copy(py, &bytes, dtype, &dims);
    }
    let (array, mut buf) = arrays::fresh(py, dtype, &dims)?;
    let dst = buf.as_mut_slice();
    maybe_detach(py, dst.len(), || zt.component_into(name, &comp.role, dst)).or_raise()?;
    Ok(array)
}

/// `items` (position, anything) sorted by where their tensors' data lie (file, then
/// offset: see `TensorSource::read_order`).
fn sorted_by_offset<T>(src: &dyn TensorSource, items: &mut [(usize, T)]) {
    items.sort_by_key(|(at, _)| src.read_order(*at));
}

fn component_meta<'py>(py: Python<'py>, c: &Component) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dtype", dtypes::numpy_name(c.dtype))?;
    d.set_item("type", c.logical_type.as_deref())?;
    d.set_item("offset", c.offset)?;
    d.set_item("length", c.length)?;
    d.set_item("encoding", c.encoding.name())?;
    d.set_item("uncompressed_length", c.uncompressed_length)?;
    d.set_item("digest", c.digest.as_ref().map(|g| g.algorithm()))?;
    Ok(d)
}

/// Checks that `dst` is a writable, C-contiguous numpy array; with `expect`, also its
/// dtype and shape.
fn check_dst<'a, 'py>(
    py: Python<'py>,
    name: &str,
    dst: &'a Bound<'py, PyAny>,
    expect: Option<&TensorInfo>,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    let array = dst
        .cast::<PyUntypedArray>()
        .map_err(|_| PyTypeError::new_err("dst must be a numpy array or a torch tensor"))?;
    // SAFETY: `array` is an ndarray, so reading its `flags` field is valid.
    let flags = unsafe { (*array.as_array_ptr()).flags };
    if flags & NPY_ARRAY_WRITEABLE == 0 || !array.is_c_contiguous() {
        return Err(Error::invalid(format!(
            "dst for `{name}` must be a writable, C-contiguous array"
        )))
        .or_raise();
    }
    if let Some(info) = expect {
        let descr = dtypes::descr(py, info.dtype)?;
        let shape_ok = array.shape().len() == info.shape.ndim()
            && array
                .shape()
                .iter()
                .zip(info.shape.dims())
                .all(|(&a, &b)| a as u64 == b);
        if !arrays::same_dtype(array, &descr) || !shape_ok {
            return Err(Error::invalid(format!(
                "dst for `{name}` is {} {:?}, the tensor is {} {}",
                array.dtype().str()?,
                array.shape(),
                dtypes::numpy_name(info.dtype),
                info.shape
            )))
            .or_raise();
        }
    }
    Ok(array)
}

/// What a `read_into` destination is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// A numpy array of the tensor's dtype and shape.
    Typed,
    /// Bytes of the right length (a torch tensor's memory, as `uint8`).
    Raw,
    /// Like `Raw`, and allocated by the caller for this very read
    /// (`read_torch(copy=True)`), so nothing has touched it yet.
    FreshRaw,
}

fn read_into_one(
    py: Python<'_>,
    src: &dyn TensorSource,
    at: usize,
    dst: &Bound<'_, PyAny>,
    dest: Dest,
) -> PyResult<()> {
    let info = dense_info(src, at)?;
    let name = &*info.name;
    let array = check_dst(py, name, dst, (dest == Dest::Typed).then_some(info))?;
    // SAFETY: `array` is C-contiguous and writable (checked), and `dst` keeps it alive
    // for this call. Other Python threads could touch it while the GIL is released;
    // like any in-place numpy operation, that races on values but never on memory.
    let out = unsafe { arrays::contiguous_bytes_mut(array) };
    if out.len() as u64 != info.nbytes {
        return Err(Error::SizeMismatch {
            tensor: name.to_owned(),
            expected: info.nbytes,
            found: out.len() as u64,
        })
        .or_raise();
    }
    if dest == Dest::FreshRaw {
        // A fresh torch tensor: torch's allocator (unlike numpy's) does not ask for
        // huge pages, so filling it would cost a page fault per 4 KiB (185 tensors,
        // 500 MiB: 80–270 ms against 50 ms). Memory a caller passed in is left as it
        // is: the advice would outlive this read.
        tensorwire::mmap::advise_huge_pages(out);
    }
    fill_dense(py, src, at, name, out)
}

/// A [`Node`](tensorwire::pytorch::Node) as the Python object `torch.load` makes,
/// with `tensor(name)` for each tensor and `dtype(name)` for each torch dtype;
/// `shared` holds the containers built so far that the tree holds in several places.
fn node_to_py<'py>(
    py: Python<'py>,
    node: &tensorwire::pytorch::Node,
    make: &NodeMakers<'_, 'py>,
    shared: &mut std::collections::HashMap<u64, Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    use tensorwire::pytorch::{DictKind, Node};
    let mut all = |items: &[Node]| -> PyResult<Vec<Bound<'py, PyAny>>> {
        items
            .iter()
            .map(|n| node_to_py(py, n, make, shared))
            .collect()
    };
    Ok(match node {
        // A sparse tensor is built from its parts by the caller, under its name.
        Node::Tensor(name) | Node::Sparse { name, .. } | Node::Meta(name) => {
            make.tensor.call1((&**name,))?
        }
        Node::Global(name) => make.torch_object.call1((*name,))?,
        Node::Value(value) => values::to_py(py, value)?,
        Node::Complex { real, imag } => {
            pyo3::types::PyComplex::from_doubles(py, *real, *imag).into_any()
        }
        Node::List(items) => PyList::new(py, all(items)?)?.into_any(),
        Node::Tuple(items) => PyTuple::new(py, all(items)?)?.into_any(),
        Node::Size(dims) => {
            let dims = PyTuple::new(py, dims)?;
            match make.torch {
                Some(torch) => torch.getattr("Size")?.call1((dims,))?,
                None => dims.into_any(),
            }
        }
        Node::Device(text) => match make.torch {
            // A type this process's torch does not know (another build's backend)
            // is torch's refusal, as a typed error.
            Some(torch) => torch.getattr("device")?.call1((&**text,)).or_else(|e| {
                Err(Error::unsupported(format!("torch.device({text:?}): {e}"))).or_raise()
            })?,
            None => pyo3::types::PyString::new(py, text).into_any(),
        },
        Node::Set(items) => pyo3::types::PySet::new(py, all(items)?)?.into_any(),
        Node::FrozenSet(items) => pyo3::types::PyFrozenSet::new(py, all(items)?)?.into_any(),
        Node::ByteArray(bytes) => pyo3::types::PyByteArray::new(py, bytes).into_any(),
        Node::Dict {
            items,
            kind,
            attributes,
        } => {
            let dict = match kind {
                DictKind::Dict => PyDict::new(py).into_any(),
                DictKind::OrderedDict => make.ordered_dict.call0()?,
                DictKind::Counter => make.counter.call0()?,
            };
            for (key, value) in items {
                dict.set_item(
                    node_to_py(py, key, make, shared)?,
                    node_to_py(py, value, make, shared)?,
                )?;
            }
            for (name, value) in attributes {
                dict.setattr(&**name, node_to_py(py, value, make, shared)?)?;
            }
            dict
        }
        // One Python object for every place of a container pickled once.
        Node::Shared { id, node } => match shared.get(id) {
            Some(built) => built.clone(),
            None => {
                let built = node_to_py(py, node, make, shared)?;
                shared.insert(*id, built.clone());
                built
            }
        },
        other => {
            return Err(Error::unsupported(format!(
                "a checkpoint object this binding cannot build: {other:?}"
            )))
            .or_raise()
        }
    })
}

/// The callables [`node_to_py`] builds leaves and ordered dicts with.
struct NodeMakers<'a, 'py> {
    /// `tensor(name)`: the tensor (or array) of that flat name.
    tensor: &'a Bound<'py, PyAny>,
    /// `torch_object(name)`: an allowlisted global (a torch dtype, quantization
    /// scheme, class or function, or a Python class such as `collections.OrderedDict`)
    /// from its dotted name.
    torch_object: &'a Bound<'py, PyAny>,
    /// `collections.OrderedDict`.
    ordered_dict: &'a Bound<'py, PyAny>,
    /// `collections.Counter`.
    counter: &'a Bound<'py, PyAny>,
    /// The `torch` module, which makes `torch.Size` and `torch.device` objects
    /// (`None`: a tuple and a str).
    torch: Option<&'a Bound<'py, PyAny>>,
}

#[pymethods]
impl Reader {
    /// Opens `path` (any supported format, recognised by its magic bytes), or reads
    /// the file held in `buffer` (any object with the buffer protocol: `bytes`,
    /// `bytearray`, `mmap`, a contiguous `uint8` array), viewed without copying: its
    /// arrays are read-only and keep it alive. `limits` raises (or lowers) the parser
    /// limits by name (`{"max_depth": 100}`; the others keep their defaults).
    #[new]
    #[pyo3(signature = (path = None, *, buffer = None, limits = None))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        buffer: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let limits = crate::limits::from_py(limits)?;
        let source = match (&path, buffer) {
            (Some(path), None) => {
                let options = tensorwire::OpenOptions {
                    limits,
                    ..Default::default()
                };
                py.detach(|| tensorwire::open_with(path, &options))
            }
            (None, Some(buffer)) => {
                let bytes = arrays::lend_bytes(&arrays::as_byte_array(buffer)?)?;
                py.detach(|| tensorwire::open_bytes(bytes, &limits))
            }
            (Some(_), Some(_)) => {
                return Err(PyTypeError::new_err(
                    "Reader takes a path or a buffer, not both",
                ))
            }
            (None, None) => return Err(PyTypeError::new_err("Reader needs a path or a buffer")),
        }
        .or_raise()?;
        let open = Open {
            source,
            owner: arrays::SharedOwner::default(),
            names: PyOnceLock::new(),
            attributes: PyOnceLock::new(),
        };
        Ok(Reader {
            open: Mutex::new(Some(Arc::new(open))),
            path,
        })
    }

    /// The tensor names, in file order (sorted by name for `.zt`).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        // A new list of the cached strs: the caller may change it, the cache stays.
        let open = self.open()?;
        PyList::new(py, open.names(py)?.names.iter().map(|n| n.bind(py)))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.open()?.src().tensors().len())
    }

    fn __contains__(&self, name: &Bound<'_, PyAny>) -> PyResult<bool> {
        let open = self.open()?;
        let Ok(name) = name.cast::<PyString>() else {
            return Ok(false);
        };
        Ok(open.position_of(name).is_ok())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys(py)?.try_iter().map(Bound::into_any)
    }

    /// `reader[name]`: the tensor as a numpy array (zero-copy when stored raw).
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open()?;
        let src = open.src();
        let at = open.position_of_any(name)?;
        dense_array(py, src, at, false, false, Lend::Any, &open.owner)
    }

    /// The file format: `"zt"`, `"zt-0.1"`, `"zt-2"`, `"safetensors"`, `"gguf"`, `"npy"`,
    /// `"npz"`, `"pytorch-zip"`, `"pytorch-legacy"`, `"tenso-packet"` or `"sharded"`.
    #[getter]
    fn format(&self) -> PyResult<&'static str> {
        Ok(self.open()?.src().format())
    }

    /// The path the reader was opened with (`None` for a buffer).
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.slot().is_none()
    }

    /// A PyTorch checkpoint's object as `torch.load` builds it: dicts (of their
    /// class: `dict`, `OrderedDict`, `Counter`), lists, tuples, sets and scalars, with
    /// each tensor replaced by `tensor(name)` and each allowlisted global pickled as a
    /// value (a torch dtype, quantization scheme, class or function; a Python class)
    /// by `torch_object(name)` (`"torch.float16"`, `"collections.OrderedDict"`). With the `torch` module, sizes and devices are
    /// `torch.Size` and `torch.device` objects; without, a tuple and a str.
    #[pyo3(signature = (tensor, torch_object, torch = None))]
    fn _pytorch_structure<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        torch_object: &Bound<'py, PyAny>,
        torch: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open()?;
        let reader = pytorch(open.src())?;
        let tree = py.detach(|| reader.structure()).or_raise()?;
        let collections = py.import("collections")?;
        let ordered_dict = collections.getattr("OrderedDict")?;
        let counter = collections.getattr("Counter")?;
        let make = NodeMakers {
            tensor,
            torch_object,
            ordered_dict: &ordered_dict,
            counter: &counter,
            torch,
        };
        node_to_py(py, &tree, &make, &mut Default::default())
    }

    /// Checks the CRC-32 the container stores for the record tensor `name` lies in
    /// (an NPZ member, a ZIP checkpoint's storage record; once per reader, without
    /// the GIL), for the Python copies that read through a zero-copy view.
    fn _check_record(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<()> {
        let open = self.open()?;
        let at = open.position_of_any(name)?;
        check_before_copying(py, open.src(), at)
    }

    /// Names of the tensors of a PyTorch checkpoint that share their storage or cover
    /// only part of it (see `PtReader::partial_storages`).
    fn _pytorch_partial_storages(&self) -> PyResult<Vec<String>> {
        let open = self.open()?;
        let reader = pytorch(open.src())?;
        let tensors = reader.tensors();
        Ok(reader
            .partial_storages()
            .into_iter()
            .map(|at| tensors[at].name.to_string())
            .collect())
    }

    /// Names of a PyTorch checkpoint's tensors that `_read_for_torch` cannot lend to
    /// torch as views of the map (a deflated record, bytes not aligned for their
    /// dtype, a read-only map), in file order: `pytorch.load` sets those on a copy of
    /// their whole storage, so they keep torch's strides and storage size rather than
    /// becoming row-major copies of their elements.
    fn _pytorch_unlendable(&self) -> PyResult<Vec<String>> {
        let open = self.open()?;
        let src = open.src();
        let reader = pytorch(src)?;
        let lendable = |at: usize| match (reader.in_place_extent(at), src.info_at(at)) {
            (Some(bytes), Ok(info)) => lendable_as(&bytes, info, Lend::Torch),
            _ => false,
        };
        Ok((0..reader.records().len())
            .filter(|&at| !lendable(at))
            .map(|at| reader.tensors()[at].name.to_string())
            .collect())
    }

    /// `(name, first name)` for each tensor of a PyTorch checkpoint that is the same
    /// pickled object as an earlier one, which `torch.load` returns as one object.
    fn _pytorch_same_objects(&self) -> PyResult<Vec<(String, String)>> {
        let open = self.open()?;
        let reader = pytorch(open.src())?;
        let tensors = reader.tensors();
        Ok(reader
            .same_objects()
            .iter()
            .map(|&(at, first)| {
                (
                    tensors[at].name.to_string(),
                    tensors[first].name.to_string(),
                )
            })
            .collect())
    }

    /// `(name, requires_grad, parameter)` for each tensor of a PyTorch checkpoint
    /// pickled as requiring grad or as an `nn.Parameter`, which `torch.load` gives
    /// back so.
    fn _pytorch_autograd(&self) -> PyResult<Vec<(String, bool, bool)>> {
        let open = self.open()?;
        let reader = pytorch(open.src())?;
        Ok(reader
            .tensors()
            .iter()
            .zip(reader.records())
            .filter(|(_, r)| r.requires_grad || r.parameter)
            .map(|(info, r)| (info.name.to_string(), r.requires_grad, r.parameter))
            .collect())
    }

    /// How each tensor of a PyTorch checkpoint lies in its storage, in `keys()`
    /// order: `(storage key, storage bytes, saved location, view, storage offset,
    /// strides)`, where `view` is `None`, or for a legacy storage view the byte range
    /// `(start, end)` of the whole stored storage it covers; the offset (in elements)
    /// counts from the view's start, as `tensor.set_(storage, offset, size, stride)`
    /// takes it.
    #[allow(clippy::type_complexity)]
    fn _pytorch_storages(
        &self,
    ) -> PyResult<Vec<(String, u64, String, Option<(u64, u64)>, u64, Vec<u64>)>> {
        pytorch(self.open()?.src())?
            .records()
            .iter()
            .map(|r| {
                let view = match r.storage.view {
                    Some(_) => Some(r.storage.window().or_raise()?),
                    None => None,
                };
                // In elements of the tensor's torch dtype (a complex32's, not f16).
                let (offset, _, strides) = r.torch_view();
                Ok((
                    r.storage.key.to_string(),
                    r.storage.nbytes().or_raise()?,
                    r.storage.location.to_string(),
                    view,
                    offset,
                    strides.to_vec(),
                ))
            })
            .collect()
    }

    /// The quantized tensors of a PyTorch checkpoint, in the order of `keys()`:
    /// `(name, scale, zero point, axis)`, where for a per-channel scheme the scale and
    /// zero point are the names of the tensors holding them and `axis` is an int
    /// (`None` for `torch.per_tensor_affine`). torch tells the per-channel schemes
    /// apart by the zero points' dtype.
    #[allow(clippy::type_complexity)]
    fn _pytorch_quantized<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Vec<(String, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<u64>)>> {
        use tensorwire::pytorch::Quantization;
        let open = self.open()?;
        let src = open.src();
        let reader = pytorch(src)?;
        let mut out = Vec::new();
        for (record, info) in reader.records().iter().zip(src.tensors()) {
            let Some(q) = &record.quantization else {
                continue;
            };
            let name = &*info.name;
            let (scale, zero_point, axis) = match &**q {
                Quantization::PerTensor { scale, zero_point } => (
                    scale.into_pyobject(py)?.into_any(),
                    zero_point.into_pyobject(py)?.into_any(),
                    None,
                ),
                Quantization::PerChannel { axis, .. } => (
                    Quantization::part_name(name, Quantization::SCALES)
                        .into_pyobject(py)?
                        .into_any(),
                    Quantization::part_name(name, Quantization::ZERO_POINTS)
                        .into_pyobject(py)?
                        .into_any(),
                    Some(*axis),
                ),
            };
            out.push((name.to_owned(), scale, zero_point, axis));
        }
        Ok(out)
    }

    /// The tensors of a PyTorch checkpoint on torch's meta device (no data; not in
    /// `keys()`), in checkpoint order: `(name, torch dtype name, sizes, strides,
    /// requires_grad, parameter, position, same_as)`, where `position` counts the
    /// `keys()` before it and `same_as` is the index of the earlier entry that is the
    /// same object (or `None`).
    fn _pytorch_meta(&self) -> PyResult<Vec<MetaRow>> {
        Ok(pytorch(self.open()?.src())?
            .meta_tensors()
            .iter()
            .map(|m| {
                let t = &m.tensor;
                (
                    m.name.to_string(),
                    t.dtype_name,
                    t.shape.dims().to_vec(),
                    t.strides.to_vec(),
                    t.requires_grad,
                    t.parameter,
                    m.position,
                    m.same_as,
                )
            })
            .collect())
    }

    /// The sparse tensors of a PyTorch checkpoint, in the order the pickle lists them:
    /// `(name, layout, size, is_coalesced, part names, parameter)`, where `layout` is
    /// torch's name (`"torch.sparse_coo"`), `is_coalesced` is `None` unless saved, the
    /// parts (tensors of `keys()`) come in the order `_rebuild_sparse_tensor` takes
    /// them, and `parameter` is `None`, or for an `nn.Parameter` its `requires_grad`.
    fn _pytorch_sparse(&self) -> PyResult<Vec<SparseRow>> {
        Ok(pytorch(self.open()?.src())?
            .sparse_tensors()
            .iter()
            .map(|(name, s)| {
                (
                    name.to_string(),
                    s.layout.name(),
                    s.size.to_vec(),
                    s.is_coalesced,
                    s.part_names(name),
                    s.parameter,
                )
            })
            .collect())
    }

    /// The whole stored storage that tensor `name` lies in (a legacy view's root
    /// storage), as a `uint8` array for torch: a view of the reader's private map
    /// where it is mapped, writable, aligned for every torch type and little-endian
    /// and `copy` is false, else a fresh array (byte-swapped for a big-endian
    /// checkpoint). With `to_copy`, the bytes are only to be copied elsewhere (to a
    /// GPU): a view of the map at any alignment, read-only where the map is not
    /// writable.
    #[pyo3(signature = (name, copy, to_copy = false))]
    fn _pytorch_storage<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        copy: bool,
        to_copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open()?;
        let src = open.src();
        let at = open.position_of_any(name)?;
        let reader = pytorch(src)?;
        let record = &reader.records()[at];
        let (bytes, borrowed) = reader.storage_bytes(record).or_raise()?;
        let dims = [bytes.len() as u64];
        let lend = Lend::for_torch(to_copy);
        // Tensors of other types may share the storage: aligned for the strictest.
        if borrowed && !copy && lendable_at(&bytes, torch_alignment(DType::Complex128), lend) {
            return open.owner.zero_copy(py, &bytes, DType::U8, &dims);
        }
        if borrowed {
            check_before_copying(py, src, at)?;
        }
        copied_array(py, &record.storage.key, &bytes, DType::U8, &dims)
    }

    /// Whether a safetensors file's header has `__metadata__`, even an empty one
    /// (`None` for other formats).
    fn _safetensors_has_metadata(&self) -> PyResult<Option<bool>> {
        Ok(self
            .open()?
            .src()
            .as_any()
            .downcast_ref::<tensorwire::formats::safetensors::SafetensorsReader>()
            .map(|r| r.has_metadata()))
    }

    /// File-level attributes: new dicts and lists on each access (the caller may
    /// change them), over values converted once.
    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let open = self.open()?;
        let src = open.src();
        let cached = open
            .attributes
            .get_or_try_init(py, || values::FrozenAttributes::new(py, src.attributes()))?;
        cached.to_dict(py)
    }

    /// Dense tensor(s) as numpy arrays: a name gives an array, a list gives a dict
    /// (read in file-offset order).
    ///
    /// Args:
    ///     name: str or list of str.
    ///     copy: if False (default), raw tensors are zero-copy views of the file map
    ///         (writable: writes stay private to this process); if True, every array
    ///         owns fresh memory. Compressed tensors are always decoded into fresh
    ///         arrays.
    #[pyo3(signature = (name, *, copy = false))]
    fn read_numpy<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open()?;
        let src = open.src();
        if let Ok(one) = name.cast::<PyString>() {
            let at = open.position_of(one)?;
            return dense_array(py, src, at, copy, false, Lend::Any, &open.owner);
        }
        if !(name.is_instance_of::<PyList>() || name.is_instance_of::<PyTuple>()) {
            return Err(PyTypeError::new_err("name must be a str or a list of str"));
        }
        let mut items = Vec::new();
        for n in name.try_iter()? {
            let n = n?;
            items.push((open.position_of_any(&n)?, n));
        }
        sorted_by_offset(src, &mut items);
        let out = PyDict::new(py);
        for (at, n) in items {
            out.set_item(
                n,
                dense_array(py, src, at, copy, false, Lend::Any, &open.owner)?,
            )?;
        }
        Ok(out.into_any())
    }

    /// `(uint8 array of the tensor's bytes, dtype name, shape)`; used by read_torch.
    #[pyo3(signature = (name, *, copy = false))]
    fn _read_raw<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        copy: bool,
    ) -> PyResult<(Bound<'py, PyAny>, &'static str, Vec<u64>)> {
        let open = self.open()?;
        let src = open.src();
        let at = open.position_of_any(name)?;
        let info = dense_info(src, at)?;
        let array = dense_array(py, src, at, copy, true, Lend::Torch, &open.owner)?;
        Ok((array, info.dtype.name(), info.shape.dims().to_vec()))
    }

    /// `(safetensors dtype name, logical shape)` of a tensor held as the bytes of a
    /// safetensors raw type (`F4`, `F6_*`, `F8_E8M0`): as its file lists it, or as a
    /// `.zt` tensor converted from such a file records it, where the recorded shape
    /// counts the bytes. `None` for any other tensor.
    fn _raw_safetensors_type(
        &self,
        name: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(&'static str, Vec<u64>)>> {
        let open = self.open()?;
        let src = open.src();
        let info = src.info_at(open.position_of_any(name)?).or_raise()?;
        Ok(raw_safetensors_listing(info).map(|(raw, dims)| (raw.name(), dims)))
    }

    /// `(dtype name, shape)` of a dense tensor.
    fn _dtype_and_shape(&self, name: &Bound<'_, PyAny>) -> PyResult<(String, Vec<u64>)> {
        let open = self.open()?;
        let src = open.src();
        let info = dense_info(src, open.position_of_any(name)?)?;
        Ok(match torch_type(src, info) {
            Some(t) => (t.name.to_owned(), t.dims.into_owned()),
            None => (info.dtype.name().to_owned(), info.shape.dims().to_vec()),
        })
    }

    /// What read_torch needs, in one call: the typed array when numpy has the dtype
    /// built in (for `torch.from_numpy`). For a dtype numpy lacks, a zero-copy view
    /// the CPU tensor may share is `(holder array, dtype name)`: the tensor's shape
    /// and strides over a numpy dtype of the same size (`uint16` for bfloat16,
    /// `uint8` for float8; a PyTorch checkpoint's torch-only dtype as listed, named
    /// by its layout), for `torch.from_numpy(...).view(dtype)`. Otherwise
    /// `(uint8 array, dtype name, shape, strides)` (the name of a safetensors raw
    /// type torch has, such as `safetensors:F4`, with its logical shape). `strides`
    /// is `None` for row-major bytes, or the element strides of a strided view (a
    /// transposed bfloat16 or float8 torch tensor), whose array holds the bytes from
    /// its first element to its last. With `to_copy`, the bytes are only to be copied
    /// elsewhere (to a GPU), always in that last form: views at any alignment,
    /// read-only where the reader's memory is.
    #[pyo3(signature = (name, *, copy = false, to_copy = false))]
    fn _read_for_torch<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        copy: bool,
        to_copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open()?;
        let src = open.src();
        let at = open.position_of_any(name)?;
        let info = dense_info(src, at)?;
        let raw_type = torch_type(src, info);
        let lend = Lend::for_torch(to_copy);
        if raw_type.is_none() && dtypes::numpy_builtin(info.dtype) {
            return dense_array(py, src, at, copy, false, lend, &open.owner);
        }
        let torch_only = raw_type.as_ref().and_then(|t| t.torch_only);
        if let (Some(raw), None, false) = (&raw_type, torch_only, copy || to_copy) {
            // A raw type torch has a dtype for (F8_E8M0, F4, their `.zt` types), read
            // as a uint8 array of torch's shape for `view(dtype)`, zero-copy.
            if let (Some(torch_dims), None) =
                (torch_dims_of_raw(raw.name, &raw.dims), &info.encoding)
            {
                let view = src.view_at(at).or_raise()?;
                if view.zero_copy && lendable_as(&view.bytes, info, lend) {
                    let array = open
                        .owner
                        .zero_copy(py, &view.bytes, DType::U8, &torch_dims)?;
                    return Ok((array, raw.name).into_pyobject(py)?.into_any());
                }
            }
        }
        if (raw_type.is_none() || torch_only.is_some()) && !copy && info.encoding.is_none() {
            // Zero-copy with the tensor's own strides, as for the types numpy has.
            let strided = src.strided_at(at).or_raise()?;
            if strided.zero_copy && lendable_as(&strided.bytes, info, lend) {
                let dims = info.shape.dims();
                if let (false, Some(holder)) = (to_copy, same_size_numpy_dtype(info.dtype)) {
                    let array = match &strided.strides {
                        Some(strides) => {
                            arrays::strided_zero_copy(py, &strided.bytes, holder, dims, strides)?
                        }
                        None => open.owner.zero_copy(py, &strided.bytes, holder, dims)?,
                    };
                    let name = raw_type.map_or(info.dtype.name(), |t| t.name);
                    return Ok((array, name).into_pyobject(py)?.into_any());
                }
                let len = [strided.bytes.len() as u64];
                let array = open.owner.zero_copy(py, &strided.bytes, DType::U8, &len)?;
                // torch's sizes and strides: for a torch-only dtype, whole elements
                // (without the lanes' dimension).
                let (name, dims, strides) = match (torch_only, raw_type) {
                    (Some(torch_only), Some(TorchType { name, dims, .. })) => {
                        let lanes = torch_only.lanes();
                        let strides = strided.strides.map(|s| {
                            let outer = torch_only.outer(&s);
                            outer.iter().map(|&s| s / lanes).collect::<Vec<u64>>()
                        });
                        (name, dims.into_owned(), strides)
                    }
                    _ => (
                        info.dtype.name(),
                        dims.to_vec(),
                        strided.strides.map(|s| s.to_vec()),
                    ),
                };
                let raw = (array, name, dims, strides);
                return Ok(raw.into_pyobject(py)?.into_any());
            }
        }
        let array = dense_array(py, src, at, copy, true, lend, &open.owner)?;
        let (name, dims) = raw_type.map_or((info.dtype.name(), info.shape.dims().into()), |t| {
            (t.name, t.dims)
        });
        Ok((array, name, dims, None::<Vec<u64>>)
            .into_pyobject(py)?
            .into_any())
    }

    /// Copies (or decodes) tensors straight into existing arrays.
    ///
    /// Args:
    ///     name: a tensor name (then `dst` is required) or a dict {name: dst}
    ///         (filled in file-offset order).
    ///     dst: a writable, C-contiguous numpy array of the tensor's dtype and shape.
    #[pyo3(signature = (name, dst = None))]
    fn read_into(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        dst: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.read_into_impl(py, name, dst, Dest::Typed)
    }

    /// read_into with `uint8` destinations that only need the right byte length;
    /// `fresh` says the caller allocated them for this read.
    #[pyo3(signature = (name, dst = None, fresh = false))]
    fn _read_into_raw(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        dst: Option<&Bound<'_, PyAny>>,
        fresh: bool,
    ) -> PyResult<()> {
        let dest = if fresh { Dest::FreshRaw } else { Dest::Raw };
        self.read_into_impl(py, name, dst, dest)
    }

    /// Names sorted by the file offset of their data.
    fn _sorted_by_offset<'py>(
        &self,
        names: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let open = self.open()?;
        let src = open.src();
        let mut items = Vec::new();
        for n in names.try_iter()? {
            let n = n?;
            items.push((open.position_of_any(&n)?, n));
        }
        sorted_by_offset(src, &mut items);
        Ok(items.into_iter().map(|(_, n)| n).collect())
    }

    /// Metadata of one tensor as a dict (name, shape, format, dtype, type,
    /// components, attributes).
    fn _metadata<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let open = self.open()?;
        let src = open.src();
        let info = src.info(name).or_raise()?;
        let d = PyDict::new(py);
        d.set_item("name", &*info.name)?;
        d.set_item("format", info.layout.name())?;
        let comps = PyDict::new(py);
        let object = tensorwire::zt_holding(src, name).and_then(|z| z.object(name).ok());
        // A `.zt` 2 GGUF block object is listed, and read, as rows of blocks with the
        // GGUF reader's attributes, not as written: its shape and attributes are the
        // listing's, as what reads return.
        let as_written = object.is_some_and(|o| o.layout == info.layout);
        // Otherwise the logical shape (a `.zt` `f4_e2m1` tensor is listed as its bytes).
        let shape = match object {
            Some(o) if as_written => &o.shape,
            _ => &info.shape,
        };
        d.set_item("shape", shape.dims())?;
        if let Some(obj) = object {
            for c in &obj.components {
                comps.set_item(&c.role, component_meta(py, c)?)?;
            }
            let primary = obj.primary();
            d.set_item(
                "dtype",
                primary.map_or("unknown", |c| dtypes::numpy_name(c.dtype)),
            )?;
            d.set_item("type", primary.and_then(|c| c.logical_type.as_deref()))?;
            let attributes = if as_written {
                values::map_to_py(py, obj.attributes.as_ref())?
            } else {
                values::map_to_py(py, Some(&info.attributes))?
            };
            d.set_item("attributes", attributes)?;
        } else {
            let (storage, _) = info.dtype.storage();
            let logical = (storage != info.dtype).then(|| info.dtype.name());
            let c = PyDict::new(py);
            c.set_item("dtype", dtypes::numpy_name(storage))?;
            c.set_item("type", logical)?;
            c.set_item("offset", info.offset)?;
            c.set_item("length", info.stored_bytes)?;
            c.set_item("encoding", info.encoding.as_deref().unwrap_or("raw"))?;
            comps.set_item("data", c)?;
            d.set_item("dtype", dtypes::numpy_name(storage))?;
            d.set_item("type", logical)?;
            d.set_item("attributes", values::map_to_py(py, Some(&info.attributes))?)?;
        }
        d.set_item("components", comps)?;
        Ok(d)
    }

    /// All components of a tensor as {role: array}.
    #[pyo3(signature = (name, *, copy = false))]
    fn _read_components<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        copy: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let open = self.open()?;
        let src = open.src();
        let out = PyDict::new(py);
        match zt(src) {
            Some(z) => {
                let obj = z.object(name).or_raise()?;
                let dense = (obj.layout == Layout::Dense).then_some(&obj.shape);
                for c in &obj.components {
                    out.set_item(&c.role, component_array(py, z, name, dense, c, copy)?)?;
                }
            }
            None => {
                let at = src.position(name).or_raise()?;
                out.set_item(
                    "data",
                    dense_array(py, src, at, copy, false, Lend::Any, &open.owner)?,
                )?;
            }
        }
        Ok(out)
    }

    /// Checks every stored digest; returns how many were checked.
    fn verify(&self, py: Python<'_>) -> PyResult<usize> {
        let open = self.open()?;
        let src = open.src();
        py.detach(|| src.verify()).or_raise()
    }

    /// Releases the reader. Arrays already handed out stay valid (each keeps the
    /// map), and so do reads in flight on other threads (each holds the source until
    /// it returns); a call made after this raises `InvalidArgumentError`.
    fn close(&self) {
        // Taken out of the lock first: the last reference may drop Python objects.
        let open = self.slot().take();
        drop(open);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let place = match &self.path {
            Some(path) => format!("{path:?}"),
            None => "<buffer>".to_owned(),
        };
        let open = self.slot().clone();
        match open {
            Some(open) => format!(
                "<tensorwire.Reader [{}, {} tensor(s)] {place}>",
                open.src().format(),
                open.src().tensors().len(),
            ),
            None => format!("<tensorwire.Reader (closed) {place}>"),
        }
    }
}

impl Reader {
    fn read_into_impl(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        dst: Option<&Bound<'_, PyAny>>,
        dest: Dest,
    ) -> PyResult<()> {
        let open = self.open()?;
        let src = open.src();
        if let Ok(targets) = name.cast::<PyDict>() {
            let mut items = Vec::with_capacity(targets.len());
            for (k, v) in targets.iter() {
                items.push((open.position_of_any(&k)?, v));
            }
            sorted_by_offset(src, &mut items);
            for (at, v) in &items {
                read_into_one(py, src, *at, v, dest)?;
            }
            return Ok(());
        }
        let name = name
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err("name must be a str or a dict {name: dst}"))?;
        let dst = dst.ok_or_else(|| PyTypeError::new_err("dst is required when name is a str"))?;
        read_into_one(py, src, open.position_of(name)?, dst, dest)
    }
}
