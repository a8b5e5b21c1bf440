//! The native half of `tensorwire.packet`: tenso-compatible packets to and from numpy.
//!
//! Python normalises what it is given into tagged tuples (`("dense", array)`,
//! `("bundle", [(key, spec), ...])`, ...) and hands decoded values that numpy has no
//! type for (sparse, strings, ragged, quantized, IPC references) to factories it
//! passes in, so this module's only Python class is `PendingPacket` (a packet
//! `read_stream` had begun when its source had no data ready).

use numpy::PyUntypedArray;
use pyo3::exceptions::{PyBlockingIOError, PyOSError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tensorwire::packet::MatrixShape;
use tensorwire::packet::{
    self, EncodeOptions, Framing, IpcRef, Packet, PacketFramer, PacketLimits, PacketParts,
    PacketReader, PacketRef, QuantScheme, RaggedFraming, SparseFormat,
};
use tensorwire::{Bytes, DType, Error, Shape, TensorView};

use crate::arrays::{self, RELEASE_GIL_BYTES};
use crate::errors::{to_pyerr, ResultExt};

/// The bundle keys tenso writes a ragged array under.
const RAGGED_OFFSETS: &str = "__ragged_offsets__";
const RAGGED_FLAT: &str = "__ragged_flat__";
const RAGGED_COUNT: &str = "__ragged_count__";

/// What the arrays a [`Decoder`] makes are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrays {
    /// Read-only views of the packet's bytes (read-only copies where a body is not
    /// aligned for its dtype).
    Views,
    /// Writable copies.
    Copies,
    /// Writable views of a private snapshot taken for this decode alone
    /// ([`arrays::snapshot`]): copies already, so copied again only where a body is
    /// not aligned for its dtype.
    SnapshotViews,
}

impl Arrays {
    /// `Copies` when `copy`, else `Views`.
    pub(crate) fn copied_if(copy: bool) -> Arrays {
        if copy {
            Arrays::Copies
        } else {
            Arrays::Views
        }
    }

    /// Whether the arrays may be written.
    fn writable(self) -> bool {
        self != Arrays::Views
    }
}

/// Whether a tensor's bytes must be copied rather than viewed.
fn needs_copy(bytes: &[u8], dtype: DType, arrays: Arrays) -> bool {
    arrays == Arrays::Copies || (bytes.as_ptr() as usize) % dtype.alignment() != 0
}

/// The bytes of `packet`'s tensors that [`Decoder`] will copy, in the order it asks
/// for them.
fn copy_sources<'a>(packet: &'a Packet, arrays: Arrays, out: &mut Vec<&'a [u8]>) {
    let mut view = |v: &'a TensorView| {
        if needs_copy(v.bytes.as_slice(), v.dtype, arrays) {
            out.push(v.bytes.as_slice());
        }
    };
    match packet {
        Packet::Dense(v) => view(v),
        Packet::Sparse(s) => {
            view(&s.data);
            view(&s.indices);
            view(&s.pointers);
        }
        Packet::Strings(s) => {
            view(&s.offsets);
            view(&s.payload);
        }
        Packet::Ragged(r) => {
            view(&r.offsets);
            view(&r.flat);
        }
        Packet::Quantized(q) if arrays == Arrays::Copies => out.push(q.data.as_slice()),
        Packet::Bundle(b) => {
            for (_, member) in &b.entries {
                copy_sources(member, arrays, out);
            }
        }
        _ => {}
    }
}

/// Builds Python values from decoded packets.
pub(crate) struct Decoder<'py> {
    py: Python<'py>,
    arrays: Arrays,
    /// Where copies go (tensors not aligned in memory, or all with `copy`).
    arena: Option<arrays::Arena<'py>>,
    make_sparse: Bound<'py, PyAny>,
    make_strings: Bound<'py, PyAny>,
    make_ragged: Bound<'py, PyAny>,
    make_quantized: Bound<'py, PyAny>,
    make_ipc_ref: Bound<'py, PyAny>,
}

impl<'py> Decoder<'py> {
    /// A decoder for `packet`, with one arena sized for every copy it will make.
    pub(crate) fn new(
        factories: &Bound<'py, PyTuple>,
        arrays: Arrays,
        packet: &Packet,
    ) -> PyResult<Self> {
        let (make_sparse, make_strings, make_ragged, make_quantized, make_ipc_ref) =
            factories.extract()?;
        let py = factories.py();
        let mut sources = Vec::new();
        copy_sources(packet, arrays, &mut sources);
        let arena = if sources.is_empty() {
            None
        } else {
            Some(arrays::Arena::new(py, &sources, arrays.writable())?)
        };
        Ok(Decoder {
            py,
            arrays,
            arena,
            make_sparse,
            make_strings,
            make_ragged,
            make_quantized,
            make_ipc_ref,
        })
    }

    /// A numpy array for a decoded tensor: a view of the packet when the body is
    /// element-aligned in memory and `Copies` was not asked for, else a copy in the
    /// arena; writeable unless `Views` was asked for (or the view's bytes allow it:
    /// a snapshot's, or a private copy-on-write map's).
    fn array(&mut self, view: &TensorView) -> PyResult<Bound<'py, PyAny>> {
        let dims = view.shape.dims();
        if !needs_copy(view.bytes.as_slice(), view.dtype, self.arrays) {
            return arrays::zero_copy(self.py, &view.bytes, view.dtype, dims);
        }
        if let Some(arena) = self.arena.as_mut() {
            if let Some(array) = arena.take(view.bytes.as_slice(), view.dtype, dims)? {
                return Ok(array);
            }
        }
        // Not reached while `copy_sources` and this pass agree; a safe fallback.
        let (array, mut buf) = arrays::fresh(self.py, view.dtype, dims)?;
        let src = view.bytes.as_slice();
        let dst = buf.as_mut_slice();
        arrays::maybe_detach(self.py, src.len(), || dst.copy_from_slice(src));
        if !self.arrays.writable() {
            array.getattr("flags")?.setattr("writeable", false)?;
        }
        Ok(array)
    }

    /// The Python value of a decoded packet (arrays, dicts, or the factories' objects).
    pub(crate) fn value(&mut self, packet: &Packet) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        match packet {
            Packet::Dense(view) => self.array(view),
            Packet::Bundle(bundle) => {
                let dict = PyDict::new(py);
                for (key, member) in &bundle.entries {
                    dict.set_item(key, self.value(member)?)?;
                }
                Ok(dict.into_any())
            }
            Packet::Sparse(sparse) => {
                let format = match sparse.format {
                    SparseFormat::Coo => "coo",
                    SparseFormat::Csr => "csr",
                    SparseFormat::Csc => "csc",
                };
                let shape = PyTuple::new(py, sparse.shape.dims())?;
                let parts = (
                    self.array(&sparse.data)?,
                    self.array(&sparse.indices)?,
                    self.array(&sparse.pointers)?,
                );
                self.make_sparse
                    .call1((format, shape, parts.0, parts.1, parts.2))
            }
            Packet::Strings(strings) => {
                let offsets = self.array(&strings.offsets)?;
                let payload = self.array(&strings.payload)?;
                self.make_strings.call1((offsets, payload))
            }
            // tenso hands back the bundle it wrote as a dict; RaggedArray.loads wraps it.
            Packet::Ragged(ragged) if ragged.framing == RaggedFraming::Bundle => {
                let dict = PyDict::new(py);
                dict.set_item(RAGGED_OFFSETS, self.array(&ragged.offsets)?)?;
                dict.set_item(RAGGED_FLAT, self.array(&ragged.flat)?)?;
                let count = vec![ragged.count() as u64];
                dict.set_item(RAGGED_COUNT, numpy::PyArray1::from_vec(py, count))?;
                Ok(dict.into_any())
            }
            Packet::Ragged(ragged) => {
                let offsets = self.array(&ragged.offsets)?;
                let flat = self.array(&ragged.flat)?;
                self.make_ragged.call1((offsets, flat))
            }
            Packet::Quantized(q) => {
                let data = TensorView {
                    dtype: DType::U8,
                    shape: Shape::from_dims(&[q.data.len() as u64]).or_raise()?,
                    bytes: q.data.clone(),
                    zero_copy: true,
                };
                // The axis byte is signed on the wire (tenso writes `axis & 0xFF`): 255
                // is axis -1, given back as -1, as the tensor was quantized.
                let (scheme, axis, group_size) = match q.scheme {
                    QuantScheme::PerTensor => (0u8, 0i8, q.group_size),
                    QuantScheme::PerChannel => (1, q.axis as i8, q.group_size),
                    QuantScheme::PerGroup => (2, q.axis as i8, q.group_size),
                };
                let code = packet::dtype_code(q.dtype).ok_or_else(|| {
                    to_pyerr(Error::unsupported(format!("{} quantized", q.dtype)))
                })?;
                let data = self.array(&data)?;
                self.make_quantized.call1((
                    data,
                    q.scales.clone(),
                    q.zero_points.clone(),
                    PyTuple::new(py, q.shape.dims())?,
                    code,
                    scheme,
                    group_size,
                    axis,
                ))
            }
            Packet::IpcRef(r) => self.make_ipc_ref.call1((
                PyBytes::new(py, &r.handle),
                r.byte_offset,
                r.nbytes,
                PyBytes::new(py, &r.device_uuid),
            )),
            #[allow(unreachable_patterns)]
            _ => Err(to_pyerr(Error::unsupported("this packet kind"))),
        }
    }
}

/// `loads`: decode the one packet in `buffer` (a 1-D uint8 array over the caller's
/// bytes).
#[pyfunction]
pub fn packet_loads<'py>(
    buffer: &Bound<'py, PyUntypedArray>,
    copy: bool,
    factories: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = arrays::lend_bytes(buffer)?;
    let arrays = Arrays::copied_if(copy);
    match decode_value(buffer.py(), &bytes, arrays, factories) {
        Ok(value) => Ok(value),
        // As tenso: the packet at the front, whatever follows it (a tenso
        // shared-memory segment holds its packet with slack after it). Only when the
        // whole buffer does not decode is its first packet framed (an LZ4 body has no
        // length field: it runs to the end of what it is given), so exact buffers pay
        // nothing for it.
        Err(whole) => match framed_length(&bytes) {
            Ok(len) if len < bytes.len() as u64 => {
                let front = bytes.slice(0..len as usize).or_raise()?;
                decode_value(buffer.py(), &front, arrays, factories)
            }
            _ => Err(whole),
        },
    }
}

/// Decodes the one packet that is exactly `bytes` (without the GIL when large) and
/// builds its Python value; arrays borrow `bytes` where they can (see [`Decoder`]).
pub(crate) fn decode_value<'py>(
    py: Python<'py>,
    bytes: &Bytes,
    arrays: Arrays,
    factories: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let decoded = if bytes.len() >= RELEASE_GIL_BYTES {
        py.detach(|| packet::decode_packet(bytes))
    } else {
        packet::decode_packet(bytes)
    }
    .or_raise()?;
    Decoder::new(factories, arrays, &decoded)?.value(&decoded)
}

/// An array from a spec, ready to encode: C-contiguous and little-endian.
fn spec_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<arrays::Prepared<'py>> {
    arrays::prepare(obj)
}

/// The Python-side arrays a spec refers to, kept alive (and their bytes borrowed)
/// while the packet is encoded.
pub(crate) struct Held<'py> {
    arrays: Vec<arrays::Prepared<'py>>,
}

/// What a spec tuple describes, with arrays as indexes into [`Held`].
pub(crate) enum Spec {
    Dense(usize),
    Bundle(Vec<(String, Spec)>),
    Sparse {
        format: SparseFormat,
        shape: MatrixShape,
        parts: [usize; 3],
    },
    Strings {
        offsets: usize,
        payload: usize,
    },
    Quantized {
        dtype: DType,
        shape: Shape,
        scheme: QuantScheme,
        axis: u8,
        group_size: u32,
        scales: usize,
        zero_points: usize,
        data: usize,
    },
    IpcRef(IpcRef),
}

/// A quantized tensor's axis as its wire byte: tenso writes `axis & 0xFF`, so -1 is
/// 255 (the packet writer checks it against the shape).
fn quantized_axis_byte(obj: &Bound<'_, PyAny>) -> PyResult<u8> {
    let axis: i64 = obj.extract()?;
    if !(-128..=255).contains(&axis) {
        return Err(PyValueError::new_err(format!(
            "quantization axis {axis} does not fit the packet's axis byte"
        )));
    }
    Ok((axis & 0xFF) as u8)
}

fn shape_of(obj: &Bound<'_, PyAny>) -> PyResult<Shape> {
    let dims: Vec<u64> = obj.extract()?;
    Shape::new(dims).or_raise()
}

impl<'py> Held<'py> {
    /// Parses a spec (the tagged tuples `tensorwire.packet._spec` builds), holding the
    /// arrays it refers to.
    pub(crate) fn from_spec(spec: &Bound<'py, PyAny>) -> PyResult<(Self, Spec)> {
        let mut held = Held { arrays: Vec::new() };
        let parsed = held.parse(spec, 0)?;
        Ok((held, parsed))
    }

    /// For a plain dense spec encoded without compression: the packet's header and
    /// footer, and the array's own bytes to write between them (nothing copied).
    /// `None` for every other spec, or with `options.compress`.
    pub(crate) fn dense_parts(
        &self,
        spec: &Spec,
        options: EncodeOptions,
    ) -> PyResult<Option<(PacketParts, &[u8])>> {
        let (Spec::Dense(i), false) = (spec, options.compress) else {
            return Ok(None);
        };
        let prepared = &self.arrays[*i];
        let body = prepared.bytes();
        let parts =
            packet::encode_parts(prepared.dtype, &prepared.shape()?, body, options).or_raise()?;
        Ok(Some((parts, body)))
    }

    fn hold(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<usize> {
        self.arrays.push(spec_array(obj)?);
        Ok(self.arrays.len() - 1)
    }

    fn parse(&mut self, spec: &Bound<'py, PyAny>, depth: usize) -> PyResult<Spec> {
        if depth > PacketLimits::default().max_nesting {
            return Err(to_pyerr(Error::LimitExceeded {
                what: "bundle nesting",
                found: depth as u64,
                limit: PacketLimits::default().max_nesting as u64,
            }));
        }
        let spec = spec.cast::<PyTuple>()?;
        let tag: String = spec.get_item(0)?.extract()?;
        Ok(match tag.as_str() {
            "dense" => Spec::Dense(self.hold(&spec.get_item(1)?)?),
            "bundle" => {
                let entries = spec.get_item(1)?;
                let entries = entries.cast::<PyList>()?;
                let mut out = Vec::with_capacity(entries.len());
                for entry in entries.iter() {
                    let (key, value): (String, Bound<'py, PyAny>) = entry.extract()?;
                    out.push((key, self.parse(&value, depth + 1)?));
                }
                Spec::Bundle(out)
            }
            "sparse" => {
                let format = match spec.get_item(1)?.extract::<String>()?.as_str() {
                    "coo" => SparseFormat::Coo,
                    "csr" => SparseFormat::Csr,
                    "csc" => SparseFormat::Csc,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "unknown sparse format {other:?}"
                        )))
                    }
                };
                Spec::Sparse {
                    format,
                    shape: MatrixShape::from_dims(&spec.get_item(2)?.extract::<Vec<u64>>()?)
                        .map_err(Error::invalid)
                        .or_raise()?,
                    parts: [
                        self.hold(&spec.get_item(3)?)?,
                        self.hold(&spec.get_item(4)?)?,
                        self.hold(&spec.get_item(5)?)?,
                    ],
                }
            }
            "strings" => Spec::Strings {
                offsets: self.hold(&spec.get_item(1)?)?,
                payload: self.hold(&spec.get_item(2)?)?,
            },
            "quantized" => {
                let code: u8 = spec.get_item(1)?.extract()?;
                let dtype = packet::dtype_from_code(code)
                    .filter(|d| {
                        matches!(
                            d,
                            DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
                        )
                    })
                    .ok_or_else(|| {
                        PyValueError::new_err(format!("not a quantized dtype code: {code}"))
                    })?;
                let scheme = match spec.get_item(3)?.extract::<u8>()? {
                    0 => QuantScheme::PerTensor,
                    1 => QuantScheme::PerChannel,
                    2 => QuantScheme::PerGroup,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "unknown quantization scheme {other}"
                        )))
                    }
                };
                Spec::Quantized {
                    dtype,
                    shape: shape_of(&spec.get_item(2)?)?,
                    scheme,
                    axis: quantized_axis_byte(&spec.get_item(4)?)?,
                    group_size: spec.get_item(5)?.extract()?,
                    scales: self.hold(&spec.get_item(6)?)?,
                    zero_points: self.hold(&spec.get_item(7)?)?,
                    data: self.hold(&spec.get_item(8)?)?,
                }
            }
            "ipcref" => {
                let handle: Vec<u8> = spec.get_item(1)?.extract()?;
                let uuid: Vec<u8> = spec.get_item(4)?.extract()?;
                Spec::IpcRef(IpcRef {
                    handle: handle
                        .try_into()
                        .map_err(|_| PyValueError::new_err("an IPC handle is 64 bytes"))?,
                    byte_offset: spec.get_item(2)?.extract()?,
                    nbytes: spec.get_item(3)?.extract()?,
                    device_uuid: uuid
                        .try_into()
                        .map_err(|_| PyValueError::new_err("a device UUID is 16 bytes"))?,
                })
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown packet spec {other:?}"
                )))
            }
        })
    }

    fn bytes(&self, index: usize) -> &[u8] {
        self.arrays[index].bytes()
    }

    /// At least the encoded length of `spec` (LZ4's worst case and every padding
    /// included), so the output buffer is allocated once.
    pub(crate) fn size_bound(&self, spec: &Spec, alignment: usize) -> usize {
        // Header, the largest shape, exponent byte, padding (twice: the packet's own
        // and an aligned bundle's), footer, length prefix.
        let overhead = 10 + 4 * 32 + 1 + 2 * alignment.max(64) + 8 + 4;
        let body = |i: &usize| {
            let n = self.bytes(*i).len();
            n + n / 128 + 64 + overhead
        };
        match spec {
            Spec::Dense(i) => body(i),
            Spec::Bundle(entries) => entries.iter().fold(overhead, |n, (k, v)| {
                n.saturating_add(k.len() + 8 + self.size_bound(v, alignment))
            }),
            Spec::Sparse { parts, .. } => overhead + parts.iter().map(body).sum::<usize>(),
            Spec::Strings { offsets, payload } => body(offsets) + body(payload),
            Spec::Quantized {
                scales,
                zero_points,
                data,
                ..
            } => body(scales) + body(zero_points) + body(data),
            Spec::IpcRef(_) => overhead + 96,
        }
    }

    fn dense(&self, index: usize) -> PyResult<PacketRef<'_>> {
        let prepared = &self.arrays[index];
        Ok(PacketRef::Dense {
            dtype: prepared.dtype,
            shape: prepared.shape()?,
            body: prepared.bytes(),
        })
    }

    /// The spec as the encoder's borrowed packet.
    pub(crate) fn packet_ref<'s>(&'s self, spec: &'s Spec) -> PyResult<PacketRef<'s>> {
        Ok(match spec {
            Spec::Dense(i) => self.dense(*i)?,
            Spec::Bundle(entries) => PacketRef::Bundle(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.as_str(), self.packet_ref(v)?)))
                    .collect::<PyResult<Vec<_>>>()?,
            ),
            Spec::Sparse {
                format,
                shape,
                parts,
            } => PacketRef::Sparse {
                format: *format,
                shape: *shape,
                data: Box::new(self.dense(parts[0])?),
                indices: Box::new(self.dense(parts[1])?),
                pointers: Box::new(self.dense(parts[2])?),
            },
            Spec::Strings { offsets, payload } => PacketRef::Strings {
                offsets: self.bytes(*offsets),
                payload: self.bytes(*payload),
            },
            Spec::Quantized {
                dtype,
                shape,
                scheme,
                axis,
                group_size,
                scales,
                zero_points,
                data,
            } => PacketRef::Quantized {
                dtype: *dtype,
                shape: shape.clone(),
                scheme: *scheme,
                axis: *axis,
                group_size: *group_size,
                scales: self.bytes(*scales),
                zero_points: self.bytes(*zero_points),
                data: self.bytes(*data),
            },
            Spec::IpcRef(r) => PacketRef::IpcRef(r.clone()),
        })
    }
}

/// What a spec encodes to, ready to be written into memory of its exact length (a
/// shared-memory segment, a cache block).
pub(crate) enum Encoded<'h> {
    /// A dense, uncompressed tensor: header and footer around the array's own bytes,
    /// which are copied once, straight into the destination.
    Dense { parts: PacketParts, body: &'h [u8] },
    /// Any other packet, encoded in full.
    Whole(Vec<u8>),
}

impl Encoded<'_> {
    /// The packet's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.pieces().iter().map(|p| p.len()).sum()
    }

    /// The packet as three pieces written back to back: header, body, footer (for
    /// a whole packet, the packet and two empty pieces).
    pub(crate) fn pieces(&self) -> [&[u8]; 3] {
        match self {
            Encoded::Dense { parts, body } => [
                &parts.header,
                body,
                parts.footer.as_ref().map_or(&[][..], |f| &f[..]),
            ],
            Encoded::Whole(bytes) => [bytes, &[], &[]],
        }
    }

    /// Writes the packet at the start of `out` (at least [`Encoded::len`] bytes, and
    /// not overlapping the tensor's own bytes); returns its length. Large copies run
    /// in parallel chunks; call it without the GIL.
    pub(crate) fn write_into(&self, out: &mut [u8]) -> Result<usize, Error> {
        let len = self.len();
        let Some(mut rest) = out.get_mut(..len) else {
            return Err(Error::NoSpace {
                what: "a tensor packet".into(),
                needed: len as u64,
                available: out.len() as u64,
            });
        };
        let mut pairs = Vec::with_capacity(3);
        for piece in self.pieces() {
            let (dst, tail) = rest.split_at_mut(piece.len());
            pairs.push((dst, piece));
            rest = tail;
        }
        tensorwire::core::copy::copy_pairs(pairs);
        Ok(len)
    }
}

/// Encodes a parsed spec: dense tensors as parts around their own bytes, the rest in
/// full (without the GIL).
pub(crate) fn encode_spec<'h>(
    py: Python<'_>,
    held: &'h Held<'_>,
    spec: &'h Spec,
    options: EncodeOptions,
) -> PyResult<Encoded<'h>> {
    if let Some((parts, body)) = held.dense_parts(spec, options)? {
        return Ok(Encoded::Dense { parts, body });
    }
    let packet_ref = held.packet_ref(spec)?;
    let capacity = held.size_bound(spec, options.alignment);
    let bytes = py
        .detach(|| {
            let mut out = Vec::with_capacity(capacity);
            packet::encode_packet_into(&packet_ref, &options, &mut out).map(|()| out)
        })
        .or_raise()?;
    Ok(Encoded::Whole(bytes))
}

/// A new numpy uint8 array of `len` bytes whose first byte is 64-aligned (a slice of a
/// slightly larger one: numpy's allocator, unlike a plain `malloc`, asks the kernel
/// for huge pages, which makes first-touching a large buffer several times cheaper),
/// and its bytes to fill.
fn aligned_output(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyAny>, arrays::FreshBuf)> {
    let padded = len.checked_add(63).ok_or_else(|| {
        to_pyerr(Error::Overflow {
            what: "packet length",
        })
    })?;
    let (whole, buf) = arrays::fresh(py, DType::U8, &[padded as u64])?;
    let start = (64 - buf.as_ptr() as usize % 64) % 64;
    let slice = pyo3::types::PySlice::new(py, start as isize, (start + len) as isize, 1);
    let array = whole.get_item(slice)?;
    let buf = buf.subslice(start, len);
    Ok((array, buf))
}

/// Copies `parts` back to back into a new 64-aligned, read-only numpy uint8 array.
fn assemble<'py>(py: Python<'py>, parts: &[&[u8]]) -> PyResult<Bound<'py, PyAny>> {
    let total = parts
        .iter()
        .try_fold(0usize, |n, p| n.checked_add(p.len()))
        .ok_or_else(|| {
            to_pyerr(Error::Overflow {
                what: "packet length",
            })
        })?;
    let (array, mut buf) = aligned_output(py, total)?;
    let out = buf.as_mut_slice();
    arrays::maybe_detach(py, total, || {
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    });
    array.getattr("flags")?.setattr("writeable", false)?;
    Ok(array)
}

/// `dumps`: the packet for a spec, as a read-only uint8 array over a 64-aligned buffer.
#[pyfunction]
pub fn packet_dumps<'py>(
    spec: &Bound<'py, PyAny>,
    integrity: bool,
    compress: bool,
    alignment: usize,
    aligned_bundle: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = spec.py();
    let options = EncodeOptions {
        alignment,
        integrity,
        compress,
        aligned_bundle,
    };
    let (held, parsed) = Held::from_spec(spec)?;
    // A plain dense tensor is copied once, straight into the output buffer.
    if let Some((parts, body)) = held.dense_parts(&parsed, options)? {
        let footer = parts.footer.unwrap_or_default();
        let footer: &[u8] = if parts.footer.is_some() { &footer } else { &[] };
        return assemble(py, &[&parts.header, body, footer]);
    }
    let packet_ref = held.packet_ref(&parsed)?;
    // Encode straight into a buffer with room for the whole packet (so it never
    // regrows), starting at its first 64-aligned byte, and hand that buffer to numpy.
    let capacity = held.size_bound(&parsed, alignment).saturating_add(64);
    let encoded = py
        .detach(|| {
            let mut out = tensorwire::mmap::huge_page_vec(capacity);
            let start = (64 - out.as_ptr() as usize % 64) % 64;
            out.resize(start, 0);
            packet::encode_packet_into(&packet_ref, &options, &mut out)?;
            Bytes::from_vec(out).slice(start..)
        })
        .or_raise()?;
    arrays::zero_copy(py, &encoded, DType::U8, &[encoded.len() as u64])
}

/// `iter_dumps` of a dense array: `(header, body array, footer)`, the body being the
/// (contiguous, little-endian) array itself.
#[pyfunction]
pub fn packet_dense_parts<'py>(
    array: &Bound<'py, PyAny>,
    integrity: bool,
    alignment: usize,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyAny>, Bound<'py, PyBytes>)> {
    let py = array.py();
    let prepared = spec_array(array)?;
    let options = EncodeOptions {
        alignment,
        integrity,
        ..EncodeOptions::default()
    };
    let parts = packet::encode_parts(
        prepared.dtype,
        &prepared.shape()?,
        prepared.bytes(),
        options,
    )
    .or_raise()?;
    let footer = parts.footer.map(|f| f.to_vec()).unwrap_or_default();
    Ok((
        PyBytes::new(py, &parts.header),
        prepared.array.into_any(),
        PyBytes::new(py, &footer),
    ))
}

/// A Python file or socket as a [`std::io::Read`]: `readinto`, `recv_into`, `read` or
/// `recv`, whichever the object has (in that order). Each call reads into a small
/// Python-visible buffer and copies out, so Python never sees Rust memory. The object
/// is set for each `read_stream` call (a [`PendingPacket`] outlives the call).
struct PySource {
    source: Option<Py<PyAny>>,
    method: ReadMethod,
    /// The Python exception behind the last failed read, re-raised as it was.
    error: Option<PyErr>,
}

#[derive(Clone, Copy)]
enum ReadMethod {
    ReadInto,
    RecvInto,
    Read,
    Recv,
}

impl ReadMethod {
    /// The first read method `source` has.
    fn of(source: &Bound<'_, PyAny>) -> PyResult<ReadMethod> {
        [
            ("readinto", ReadMethod::ReadInto),
            ("recv_into", ReadMethod::RecvInto),
            ("read", ReadMethod::Read),
            ("recv", ReadMethod::Recv),
        ]
        .into_iter()
        .find(|(name, _)| source.hasattr(*name).unwrap_or(false))
        .map(|(_, m)| m)
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{} has no readinto, recv_into, read or recv method",
                source
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })
    }

    fn name(self) -> &'static str {
        match self {
            ReadMethod::ReadInto => "readinto",
            ReadMethod::RecvInto => "recv_into",
            ReadMethod::Read => "read",
            ReadMethod::Recv => "recv",
        }
    }
}

/// The error for a read that returned `None`: a non-blocking source with no data ready.
/// Not the end of the stream: as Python's buffered readers do, `BlockingIOError`.
fn no_data_ready(method: ReadMethod) -> PyErr {
    PyBlockingIOError::new_err((
        libc::EAGAIN,
        format!(
            "{}() returned None (a non-blocking source with no data ready): \
             read_stream needs a blocking source",
            method.name()
        ),
    ))
}

impl PySource {
    fn read_py(&mut self, py: Python<'_>, out: &mut [u8]) -> PyResult<usize> {
        let Some(source) = self.source.as_ref() else {
            return Err(to_pyerr(Error::invalid("read_stream has no source")));
        };
        let source = source.bind(py);
        let want = out.len();
        let name = self.method.name();
        match self.method {
            ReadMethod::ReadInto | ReadMethod::RecvInto => {
                let scratch = pyo3::types::PyByteArray::new(py, &vec![0u8; want]);
                let got = source.call_method1(name, (&scratch,))?;
                if got.is_none() {
                    return Err(no_data_ready(self.method));
                }
                // The callee may have kept, resized or cleared the buffer: it holds
                // what it now holds, and a count past that is a broken source.
                let n: i64 = got.extract()?;
                let held = scratch.len();
                let n = usize::try_from(n).ok().filter(|&n| n <= held.min(want));
                let Some(n) = n else {
                    return Err(PyOSError::new_err(format!(
                        "{name}() returned {got}, not between 0 and {} (the buffer's size)",
                        held.min(want)
                    )));
                };
                // SAFETY: the bytearray may be referenced elsewhere (the callee may have
                // kept it), but it holds at least `n` bytes (checked just above), and
                // no Python code runs from that check to the end of the copy while this
                // thread holds the GIL (the module is built for the GIL-holding ABI),
                // so nothing can resize or free its buffer meanwhile.
                out[..n].copy_from_slice(unsafe { &scratch.as_bytes()[..n] });
                Ok(n)
            }
            ReadMethod::Read | ReadMethod::Recv => {
                let got = source.call_method1(name, (want,))?;
                if got.is_none() {
                    return Err(no_data_ready(self.method));
                }
                // bytes, or any other buffer (bytearray, memoryview) as bytes.
                let got = if got.is_instance_of::<PyBytes>() {
                    got
                } else {
                    py.get_type::<PyBytes>().call1((got,))?
                };
                let chunk: &[u8] = got.extract()?;
                if chunk.len() > want {
                    return Err(PyValueError::new_err(format!(
                        "{name}({want}) returned {} bytes",
                        chunk.len()
                    )));
                }
                out[..chunk.len()].copy_from_slice(chunk);
                Ok(chunk.len())
            }
        }
    }
}

impl std::io::Read for PySource {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Ask for at most 8 MiB per call: the Python-side scratch buffer is that big.
        let cap = buf.len().min(8 << 20);
        Python::attach(|py| {
            self.read_py(py, &mut buf[..cap]).map_err(|e| {
                // "No data yet" and a timeout leave the packet's bytes so far in the
                // reader, to go on with; any other error ends the stream.
                let kind = if e.is_instance_of::<PyBlockingIOError>(py) {
                    std::io::ErrorKind::WouldBlock
                } else if e.is_instance_of::<PyTimeoutError>(py) {
                    std::io::ErrorKind::TimedOut
                } else {
                    std::io::ErrorKind::Other
                };
                let message = e.to_string();
                self.error = Some(e);
                std::io::Error::new(kind, message)
            })
        })
    }
}

/// A packet `read_stream` had begun when its source had no data ready (or timed out):
/// the reader, holding the packet's bytes so far. `tensorwire.packet` keeps it for the
/// source, and the next `read_stream` of that source goes on with it.
#[pyclass(module = "tensorwire._native", frozen)]
pub struct PendingPacket {
    reader: std::sync::Mutex<Option<PacketReader<PySource>>>,
}

/// `read_stream`: read one packet from a Python file or socket and decode it; None at
/// a clean end of stream. `pending` is what an earlier call on the same source left
/// (see [`PendingPacket`]); a call that stops the same way raises the source's
/// `BlockingIOError` or `TimeoutError` with a new one as its `pending` attribute.
#[pyfunction]
#[pyo3(signature = (source, copy, factories, pending = None))]
pub fn packet_read_stream<'py>(
    source: &Bound<'py, PyAny>,
    copy: bool,
    factories: &Bound<'py, PyTuple>,
    pending: Option<&Bound<'py, PendingPacket>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = source.py();
    let resumed = pending.and_then(|p| {
        p.get()
            .reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    });
    let method = ReadMethod::of(source)?;
    // The reader never reads past the packet, so a fresh one per packet loses nothing.
    let mut reader = resumed.unwrap_or_else(|| {
        PacketReader::new(PySource {
            source: None,
            method,
            error: None,
        })
    });
    reader.get_mut().method = method;
    reader.get_mut().source = Some(source.clone().unbind());
    let read = reader.read_packet_bytes();
    reader.get_mut().source = None;
    if let Some(err) = reader.get_mut().error.take() {
        if reader.buffered() > 0 && !reader.is_failed() {
            let left = PendingPacket {
                reader: std::sync::Mutex::new(Some(reader)),
            };
            err.value(py).setattr("pending", Py::new(py, left)?)?;
        }
        return Err(err);
    }
    let Some(bytes) = read.or_raise()? else {
        return Ok(None);
    };
    let decoded =
        arrays::maybe_detach(py, bytes.len(), || packet::decode_packet(&bytes)).or_raise()?;
    Decoder::new(factories, Arrays::copied_if(copy), &decoded)?
        .value(&decoded)
        .map(Some)
}

/// How many more bytes the packet at the front of `buffer` needs: 0 when `buffer`
/// holds all of it (and no more), else at least one. Errors name what is wrong.
#[pyfunction]
pub fn packet_frame_need(buffer: &Bound<'_, PyUntypedArray>) -> PyResult<u64> {
    let bytes = arrays::lend_bytes(buffer)?;
    let have = bytes.len() as u64;
    match PacketFramer::new(PacketLimits::default())
        .advance(&bytes)
        .or_raise()?
    {
        Framing::Incomplete { need } => Ok(need.saturating_sub(have).max(1)),
        Framing::Complete { len } if len == have => Ok(0),
        Framing::Complete { len } => Err(to_pyerr(Error::malformed(
            len,
            format!("{} bytes after the packet", have - len),
        ))),
    }
}

/// The length of the packet at the front of `buffer` (which may hold more after it).
#[pyfunction]
pub fn packet_length(buffer: &Bound<'_, PyUntypedArray>) -> PyResult<u64> {
    let bytes = arrays::lend_bytes(buffer)?;
    framed_length(&bytes)
}

/// The length of the packet at the front of `bytes`, which may hold more after it;
/// a `TruncatedError` when `bytes` ends inside it.
pub(crate) fn framed_length(bytes: &[u8]) -> PyResult<u64> {
    match PacketFramer::new(PacketLimits::default())
        .advance(bytes)
        .or_raise()?
    {
        Framing::Complete { len } => Ok(len),
        Framing::Incomplete { need } => Err(to_pyerr(Error::Truncated {
            offset: 0,
            needed: need,
            available: bytes.len() as u64,
        })),
    }
}
