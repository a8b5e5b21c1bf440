//! A packet file as a [`TensorSource`].

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tensorwire_core::{
    Bytes, Error, Layout, Result, TensorIndex, TensorInfo, TensorSource, TensorView, Value,
};

use crate::codec::PacketLimits;
use crate::read::{decode_noting, decoded_buffer_key, DecodeNotes};
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
    /// Where the decoder found each LZ4 frame (see [`DecodeNotes::frames`]).
    frames: &'a HashMap<usize, (u64, u64)>,
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

impl Builder<'_> {
    /// Adds a tensor (a compressed one's stored bytes are the LZ4 frame the decoder
    /// read it from).
    fn add(
        &mut self,
        name: String,
        view: &TensorView,
        layout: Layout,
        attributes: BTreeMap<String, Value>,
    ) -> Result<()> {
        let name: Arc<str> = Arc::from(name);
        let nbytes = view.bytes.len() as u64;
        let frame = (!view.zero_copy)
            .then(|| self.frames.get(&decoded_buffer_key(&view.bytes)).copied())
            .flatten();
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

    fn part(&mut self, base: &str, part: &str, view: &TensorView, of: &str) -> Result<()> {
        let attributes = BTreeMap::from([("part_of".to_owned(), Value::Str(of.to_owned()))]);
        self.add(format!("{base}.{part}"), view, Layout::Dense, attributes)
    }

    fn describe(&mut self, name: &str, what: String) {
        self.attributes.insert(name.to_owned(), Value::Str(what));
    }

    fn walk(&mut self, packet: &Packet, name: Option<&str>) -> Result<()> {
        let base = name.unwrap_or(PACKET_TENSOR_NAME);
        match packet {
            Packet::Dense(v) => self.add(base.to_owned(), v, Layout::Dense, BTreeMap::new())?,
            Packet::Bundle(b) => {
                if let Some(name) = name {
                    self.describe(name, bundle_summary(b));
                }
                for (key, member) in &b.entries {
                    let child = match name {
                        Some(prefix) => format!("{prefix}.{key}"),
                        None => key.clone(),
                    };
                    self.walk(member, Some(&child))?;
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
                self.part(base, d, &s.data, &of)?;
                self.part(base, i, &s.indices, &of)?;
                self.part(base, p, &s.pointers, &of)?;
            }
            Packet::Strings(s) => {
                self.describe(base, format!("{} strings", s.count()));
                self.part(base, "offsets", &s.offsets, "strings")?;
                self.part(base, "payload", &s.payload, "strings")?;
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
                self.part(base, "offsets", &r.offsets, "ragged")?;
                self.part(base, "flat", &r.flat, "ragged")?;
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
                self.add(base.to_owned(), &view, layout, attributes)?;
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
        let (packet, DecodeNotes { digests, frames }) = decode_noting(&bytes, limits)?;
        let mut b = Builder {
            input: &bytes,
            frames: &frames,
            index: TensorIndex::default(),
            views: Vec::new(),
            attributes: Default::default(),
        };
        if let Packet::Bundle(bundle) = &packet {
            let summary = bundle_summary(bundle);
            b.attributes
                .insert("packet".to_owned(), Value::Str(summary));
        }
        b.walk(&packet, None)?;
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
