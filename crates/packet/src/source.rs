//! A packet file as a [`TensorSource`].

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{
    Bytes, Error, Layout, Result, TensorIndex, TensorInfo, TensorSource, TensorView, Value,
};

use crate::codec::PacketLimits;
use crate::read::decode_counting_digests;
use crate::value::{Packet, RaggedFraming};

/// The name a single-packet source gives its tensor (and the prefix of the parts of a
/// top-level sparse, string, ragged or quantized packet).
pub const PACKET_TENSOR_NAME: &str = "tensor";

/// One packet (a `.tnso` file, a shm segment) seen as a source of tensors. The packet
/// is decoded and validated (integrity included) on open.
///
/// Names: a dense packet is one tensor named [`PACKET_TENSOR_NAME`]; bundle members are
/// named by their keys, nested ones with dots (`a`, `bb.c`); a sparse matrix `m` gives
/// `m.data` plus `m.row`/`m.col` (COO) or `m.indices`/`m.indptr` (CSR, CSC); strings
/// give `s.offsets` (u64) and `s.payload` (u8); a ragged array `r.offsets` and
/// `r.flat`; a quantized tensor one tensor of its quantized dtype (layout `quantized`,
/// the packed body) with its scheme, axis, group size, scales and zero points as
/// attributes. A GPU IPC reference has no tensor, only attributes. Every container is
/// also described in the source attributes, under its name.
#[derive(Debug)]
pub struct PacketSource {
    packet: Packet,
    index: TensorIndex,
    views: Vec<TensorView>,
    attributes: BTreeMap<String, Value>,
    /// Integrity footers checked when the packet was opened.
    digests: usize,
}

struct Builder<'a> {
    input: &'a Bytes,
    index: TensorIndex,
    views: Vec<TensorView>,
    attributes: BTreeMap<String, Value>,
}

fn floats(v: &[f32]) -> Value {
    Value::List(v.iter().map(|&x| Value::Float(x.into())).collect())
}

fn bundle_summary(b: &crate::value::Bundle) -> String {
    let n = b.entries.len();
    format!("bundle of {n} entr{}", if n == 1 { "y" } else { "ies" })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where a packet lies in the input: from its first byte to the end of the slot it
/// has (the whole input, a bundle member's value, a sparse part), which a compressed
/// body runs to.
type Span = (usize, usize);

/// The little-endian `u32` at `at`, as a length.
fn u32_at(input: &[u8], at: usize) -> Option<usize> {
    let b = input.get(at..at.checked_add(4)?)?;
    usize::try_from(u32::from_le_bytes(b.try_into().ok()?)).ok()
}

/// The flags, dimension count and end of the fixed header of the packet at `start`
/// (v4: a 10-byte header with `u16` flags, v3: 8 bytes with `u8` flags).
fn head(input: &[u8], start: usize) -> Option<(u16, usize, usize)> {
    match *input.get(start + 4)? {
        4 => Some((
            u16::from_le_bytes([*input.get(start + 5)?, *input.get(start + 6)?]),
            usize::from(*input.get(start + 8)?),
            start + 10,
        )),
        3 => Some((
            u16::from(*input.get(start + 5)?),
            usize::from(*input.get(start + 7)?),
            start + 8,
        )),
        _ => None,
    }
}

/// The LZ4 frame of the compressed dense packet in `span`: its offset in the input and
/// its length (after the header, the shape and the alignment padding; before the
/// integrity footer, if any). `None` when the packet is not compressed. The packet was
/// decoded already, so this only finds again what the decoder checked.
fn lz4_frame(input: &[u8], (start, end): Span) -> Option<(u64, u64)> {
    use crate::flags::{ALIGNED, COMPRESSED, CUSTOM_ALIGNMENT, INTEGRITY};
    let (flags, ndim, pos) = head(input, start)?;
    if flags & COMPRESSED == 0 {
        return None;
    }
    let mut pos = pos.checked_add(ndim.checked_mul(4)?)?;
    let alignment = if flags & CUSTOM_ALIGNMENT != 0 {
        let exp = *input.get(pos)?;
        pos += 1;
        1u64.checked_shl(exp.into())?
    } else if flags & ALIGNED != 0 {
        crate::DEFAULT_ALIGNMENT as u64
    } else {
        1
    };
    let body =
        (start as u64).checked_add(tensorwire_core::align_up((pos - start) as u64, alignment)?)?;
    let footer = if flags & INTEGRITY != 0 { 8 } else { 0 };
    let frame_end = (end as u64).checked_sub(footer)?;
    Some((body, frame_end.checked_sub(body)?))
}

/// The spans of the `count` members of the bundle at `start`: each a key (`u32`
/// length, bytes) then a value (`u32` length, the member packet).
fn bundle_spans(input: &[u8], start: usize, count: usize) -> Option<Vec<Span>> {
    let (_, _, mut at) = head(input, start)?;
    let mut spans = Vec::with_capacity(count);
    for _ in 0..count {
        let vlen_at = at.checked_add(4)?.checked_add(u32_at(input, at)?)?;
        let value_at = vlen_at.checked_add(4)?;
        let value_end = value_at.checked_add(u32_at(input, vlen_at)?)?;
        spans.push((value_at, value_end));
        at = value_end;
    }
    Some(spans)
}

/// The spans of the three parts of the sparse packet at `start`, after its shape:
/// each a `u32` length then the part's packet.
fn sparse_spans(input: &[u8], start: usize) -> Option<[Span; 3]> {
    let (_, ndim, pos) = head(input, start)?;
    let mut at = pos.checked_add(ndim.checked_mul(4)?)?;
    let mut spans = [(0, 0); 3];
    for span in &mut spans {
        let part_at = at.checked_add(4)?;
        let part_end = part_at.checked_add(u32_at(input, at)?)?;
        *span = (part_at, part_end);
        at = part_end;
    }
    Some(spans)
}

impl Builder<'_> {
    /// Adds a tensor; `span` is where its own dense packet lies, when it has one (a
    /// compressed tensor's stored bytes are the LZ4 frame found there).
    fn add(
        &mut self,
        name: String,
        view: &TensorView,
        layout: Layout,
        attributes: BTreeMap<String, Value>,
        span: Option<Span>,
    ) -> Result<()> {
        let name: Arc<str> = Arc::from(name);
        let nbytes = view.bytes.len() as u64;
        let frame = span
            .filter(|_| !view.zero_copy)
            .and_then(|span| lz4_frame(self.input, span));
        let (offset, stored_bytes, encoding) = match frame {
            Some((offset, length)) => (offset, length, Some("lz4".to_owned())),
            // A zero-copy view lies inside the input: its offset is the distance
            // between the two (plain address arithmetic, no pointer is dereferenced).
            None if view.zero_copy => (
                (view.bytes.as_ptr() as usize).wrapping_sub(self.input.as_ptr() as usize) as u64,
                nbytes,
                None,
            ),
            // Values computed from the packet rather than stored (a flag-framed ragged
            // array's offsets, which count bytes on the wire and elements here).
            None => (0, nbytes, None),
        };
        self.index.push(TensorInfo {
            name,
            dtype: view.dtype,
            shape: view.shape.clone(),
            layout,
            nbytes,
            stored_bytes,
            offset,
            encoding,
            attributes: attributes.into(),
        })?;
        self.views.push(view.clone());
        Ok(())
    }

    fn part(
        &mut self,
        base: &str,
        part: &str,
        view: &TensorView,
        of: &str,
        span: Option<Span>,
    ) -> Result<()> {
        let attributes = BTreeMap::from([("part_of".to_owned(), Value::Str(of.to_owned()))]);
        self.add(
            format!("{base}.{part}"),
            view,
            Layout::Dense,
            attributes,
            span,
        )
    }

    fn describe(&mut self, name: &str, what: String) {
        self.attributes.insert(name.to_owned(), Value::Str(what));
    }

    /// Adds the tensors of `packet`, which lies in `span` of the input (`None` when
    /// that could not be found again: its tensors then show their decoded size).
    fn walk(&mut self, packet: &Packet, name: Option<&str>, span: Option<Span>) -> Result<()> {
        let base = name.unwrap_or(PACKET_TENSOR_NAME);
        let input: &[u8] = self.input;
        match packet {
            Packet::Dense(v) => {
                self.add(base.to_owned(), v, Layout::Dense, BTreeMap::new(), span)?;
            }
            Packet::Bundle(b) => {
                if let Some(name) = name {
                    self.describe(name, bundle_summary(b));
                }
                let spans = span.and_then(|(start, _)| bundle_spans(input, start, b.entries.len()));
                for (i, (key, member)) in b.entries.iter().enumerate() {
                    let child = match name {
                        Some(prefix) => format!("{prefix}.{key}"),
                        None => key.clone(),
                    };
                    let member_span = spans.as_ref().and_then(|s| s.get(i).copied());
                    self.walk(member, Some(&child), member_span)?;
                }
            }
            Packet::Sparse(s) => {
                let of = format!("sparse_{}", s.format.name());
                self.describe(
                    base,
                    format!(
                        "sparse {} matrix {}, {} stored values",
                        s.format.name(),
                        s.shape,
                        s.data.shape.dims()[0]
                    ),
                );
                let [d, i, p] = s.format.part_names();
                let spans = span.and_then(|(start, _)| sparse_spans(input, start));
                let at = |k: usize| spans.map(|s| s[k]);
                self.part(base, d, &s.data, &of, at(0))?;
                self.part(base, i, &s.indices, &of, at(1))?;
                self.part(base, p, &s.pointers, &of, at(2))?;
            }
            Packet::Strings(s) => {
                self.describe(base, format!("{} strings", s.count()));
                self.part(base, "offsets", &s.offsets, "strings", None)?;
                self.part(base, "payload", &s.payload, "strings", None)?;
            }
            Packet::Ragged(r) => {
                let framing = match r.framing {
                    RaggedFraming::Bundle => "bundle framing",
                    RaggedFraming::Flag => "flag 0x200",
                };
                self.describe(
                    base,
                    format!(
                        "ragged array of {} rows of {} ({framing})",
                        r.count(),
                        r.flat.dtype
                    ),
                );
                // Bundle framing: members `__ragged_offsets__`, `__ragged_flat__`,
                // `__ragged_count__`, each a dense packet that may be compressed.
                let spans = match r.framing {
                    RaggedFraming::Bundle => {
                        span.and_then(|(start, _)| bundle_spans(input, start, 3))
                    }
                    RaggedFraming::Flag => None,
                };
                let at = |k: usize| spans.as_ref().map(|s| s[k]);
                self.part(base, "offsets", &r.offsets, "ragged", at(0))?;
                self.part(base, "flat", &r.flat, "ragged", at(1))?;
            }
            Packet::Quantized(q) => {
                self.describe(
                    base,
                    format!(
                        "quantized {} {}, axis {}, group size {}, {} scales",
                        q.dtype,
                        q.scheme.name(),
                        q.axis,
                        q.group_size,
                        q.scales.len()
                    ),
                );
                let attributes = BTreeMap::from([
                    ("scheme".to_owned(), Value::Str(q.scheme.name().to_owned())),
                    ("axis".to_owned(), Value::Int(q.axis.into())),
                    ("group_size".to_owned(), Value::Int(q.group_size.into())),
                    ("scales".to_owned(), floats(&q.scales)),
                    ("zero_points".to_owned(), floats(&q.zero_points)),
                ]);
                let view = q.view()?;
                let layout = Layout::Other("quantized".to_owned());
                self.add(base.to_owned(), &view, layout, attributes, None)?;
            }
            Packet::IpcRef(r) => {
                let name = name.unwrap_or("ipc_ref");
                self.attributes.insert(
                    name.to_owned(),
                    Value::Map(vec![
                        ("kind".to_owned(), Value::Str("gpu_ipc_ref".to_owned())),
                        ("handle".to_owned(), Value::Str(hex(&r.handle))),
                        ("byte_offset".to_owned(), Value::Int(r.byte_offset.into())),
                        ("nbytes".to_owned(), Value::Int(r.nbytes.into())),
                        ("device_uuid".to_owned(), Value::Str(hex(&r.device_uuid))),
                    ]),
                );
            }
        }
        Ok(())
    }
}

impl PacketSource {
    /// Decodes `bytes` (exactly one packet of any kind).
    pub fn from_bytes(bytes: Bytes, limits: &PacketLimits) -> Result<PacketSource> {
        let (packet, digests) = decode_counting_digests(&bytes, limits)?;
        let mut b = Builder {
            input: &bytes,
            index: TensorIndex::default(),
            views: Vec::new(),
            attributes: Default::default(),
        };
        if let Packet::Bundle(bundle) = &packet {
            let summary = bundle_summary(bundle);
            b.attributes
                .insert("packet".to_owned(), Value::Str(summary));
        }
        b.walk(&packet, None, Some((0, bytes.len())))?;
        let Builder {
            index,
            views,
            attributes,
            ..
        } = b;
        Ok(PacketSource {
            packet,
            index,
            views,
            attributes,
            digests,
        })
    }

    /// The decoded packet.
    pub fn packet(&self) -> &Packet {
        &self.packet
    }
}

impl TensorSource for PacketSource {
    fn format(&self) -> &'static str {
        "tenso-packet"
    }

    fn tensors(&self) -> &[TensorInfo] {
        self.index.infos()
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        &self.attributes
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.index.position(name)
    }

    fn view_at(&self, position: usize) -> Result<TensorView> {
        self.views
            .get(position)
            .cloned()
            .ok_or_else(|| Error::no_tensor_at(position))
    }

    /// The integrity footers (XXH3-64), all checked when the packet was opened: a
    /// source exists only if they matched.
    fn verify(&self) -> Result<usize> {
        Ok(self.digests)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
