//! Reading `.zt` files.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tensorwire_core::{
    AlignedBuf, Bytes, DType, Error, Layout, Limits, NameMap, Result, Shape, TensorInfo,
    TensorSource, TensorView, Value, SOURCE_LAYOUT_KEY,
};
use tensorwire_mmap::{MapMode, MappedFile};

use crate::digest::{Digest, DigestState};
use crate::manifest::{decode_v01, decode_v1, Component, Ctx, Encoding, Manifest, Object};
use crate::{manifest_v2, seekable};
use crate::{ALIGNMENT, MAGIC, MAGIC_V01, MAGIC_V2, V2_ALIGNMENT, V2_FOOTER_LEN};

/// Which `.zt` container version a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZtVersion {
    /// `ZTEN0001`: a CBOR array of tensor records and a trailing size.
    V0_1,
    /// `ZTEN1000`: the 1.x manifest with objects and components.
    V1,
    /// `89 5A 54 32 0D 0A 1A 0A` (ztensor 2.x): 4096-aligned blobs, a deterministic
    /// CBOR manifest of objects and parts, and a 40-byte footer with its XXH3 hash.
    V2,
}

/// A registered `.zt` logical type that tensorwire has no dtype for and reads as its
/// bytes ([`ZtReader::byte_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteType {
    /// `f8_e8m0`: one unsigned power-of-two exponent per byte (the MX block scale).
    F8E8M0,
    /// `f4_e2m1` in version 2: two 4-bit floats per byte, the first in the low nibble.
    F4E2M1,
}

/// A validated `.zt` file over any [`Bytes`] (a map, a shm segment, a buffer).
///
/// Opening checks everything that later reads depend on, so a `ZtReader` that opened
/// will only fail on reads for data-level reasons (a digest mismatch, a corrupt zstd
/// frame).
pub struct ZtReader {
    bytes: Bytes,
    version: ZtVersion,
    manifest: Manifest,
    infos: Vec<TensorInfo>,
    /// One cell per digest slot: set once the slot's digest has been checked, so
    /// zero-copy views of verified raw data cost nothing afterwards.
    verified: Vec<OnceLock<()>>,
    /// One cell per content slot: set once its decoded bytes passed the content rules
    /// of its logical type (version 2 `bool` bytes are 0 or 1).
    content_ok: Vec<OnceLock<()>>,
    first_component: Vec<usize>,
    /// The digest slot of each component (flattened in object order). Components
    /// that name the same stored bytes with the same encoding and digest (a version 2
    /// writer stores identical data once, whatever the dtypes) share one: their views
    /// share the bytes, so a private write through one must not fail the other's check.
    check_slot: Vec<usize>,
    /// The content-rule slot of each component: as `check_slot`, and one logical type.
    content_slot: Vec<usize>,
    /// Components that share their stored bytes with others under another digest,
    /// another type or none: the group of each component (flattened in object order;
    /// `None` for bytes of its own) and each group's members (object and component
    /// index). Handing out any member's bytes first runs every member's checks, so a
    /// private write through one view cannot fail another member's check later.
    shared_bytes: Option<SharedBytes>,
    /// The object found by the last name lookup (a one-entry cache).
    last_position: AtomicUsize,
    limits: Limits,
}

impl ZtReader {
    /// True when attribute map keys that were not text were read as their text (see
    /// [`Manifest::keys_made_text`]).
    pub(crate) fn attribute_keys_made_text(&self) -> bool {
        self.manifest.keys_made_text
    }
}

impl std::fmt::Debug for ZtReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZtReader")
            .field("version", &self.version)
            .field("len", &self.bytes.len())
            .field("objects", &self.manifest.objects.len())
            .finish()
    }
}

impl ZtReader {
    /// Maps `path` privately (copy-on-write) and opens it with default limits.
    pub fn open(path: impl AsRef<Path>) -> Result<ZtReader> {
        ZtReader::open_with(path, MapMode::CopyOnWrite, &Limits::default())
    }

    /// Maps `path` in `mode` and opens it with `limits`. Errors carry the path.
    pub fn open_with(path: impl AsRef<Path>, mode: MapMode, limits: &Limits) -> Result<ZtReader> {
        let path = path.as_ref();
        let bytes = MappedFile::open_bytes(path, mode)?;
        ZtReader::from_bytes_with(bytes, limits).map_err(|e| e.with_path(path))
    }

    /// Opens a `.zt` image held in `bytes` with default limits.
    pub fn from_bytes(bytes: Bytes) -> Result<ZtReader> {
        ZtReader::from_bytes_with(bytes, &Limits::default())
    }

    /// Opens a `.zt` image held in `bytes` (version 2, 1.x or 0.1, told apart by the
    /// leading magic). The whole manifest is checked here.
    pub fn from_bytes_with(bytes: Bytes, limits: &Limits) -> Result<ZtReader> {
        let (version, manifest) = if bytes.get(..8) == Some(MAGIC_V2.as_slice()) {
            (ZtVersion::V2, parse_v2(&bytes, limits)?)
        } else {
            let (version, manifest, data_end) = parse_container(&bytes, limits)?;
            validate_layout(&manifest, data_end, version, limits)?;
            (version, manifest)
        };
        let infos: Vec<TensorInfo> = manifest
            .objects
            .iter()
            .map(|o| info_of(o, version))
            .collect::<Result<_>>()?;
        let mut first_component = Vec::with_capacity(manifest.objects.len());
        let mut n = 0;
        for o in &manifest.objects {
            first_component.push(n);
            n += o.components.len();
        }
        let (check_slot, digests) = check_slots(&manifest, false);
        let shared_bytes = shared_byte_groups(&manifest);
        // A slot per component already: the typed keys cannot share any either.
        let (content_slot, contents) = if digests == check_slot.len() {
            (check_slot.clone(), digests)
        } else {
            check_slots(&manifest, true)
        };
        Ok(ZtReader {
            bytes,
            version,
            verified: (0..digests).map(|_| OnceLock::new()).collect(),
            content_ok: (0..contents).map(|_| OnceLock::new()).collect(),
            manifest,
            infos,
            first_component,
            check_slot,
            content_slot,
            shared_bytes,
            last_position: AtomicUsize::new(0),
            limits: *limits,
        })
    }

    /// The container version.
    pub fn version(&self) -> ZtVersion {
        self.version
    }

    /// The manifest's `version` string (`"1.2.0"`, `"0.1.0"` for 0.1 files, `"2"` for
    /// version 2 files).
    pub fn manifest_version(&self) -> &str {
        &self.manifest.version
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Every object, in name order.
    pub fn objects(&self) -> &[Object] {
        &self.manifest.objects
    }

    /// One object by name.
    pub fn object(&self, name: &str) -> Result<&Object> {
        self.position(name).map(|i| &self.manifest.objects[i])
    }

    /// The object index, component index and component for `name`/`role`.
    fn locate(&self, name: &str, role: &str) -> Result<(usize, usize, &Component)> {
        let oi = self.position(name)?;
        let (ci, comp) = self.manifest.objects[oi]
            .components
            .iter()
            .enumerate()
            .find(|(_, c)| c.role == role)
            .ok_or_else(|| Error::NotFound {
                name: format!("{name}/{role}"),
            })?;
        Ok((oi, ci, comp))
    }

    /// The digest cell of a located component.
    fn cell(&self, oi: usize, ci: usize) -> &OnceLock<()> {
        &self.verified[self.slot(oi, ci)]
    }

    /// The content-rules cell of a located component.
    fn content_cell(&self, oi: usize, ci: usize) -> &OnceLock<()> {
        &self.content_ok[self.content_slot[self.first_component[oi] + ci]]
    }

    /// The digest slot of a located component (see `check_slot`).
    fn slot(&self, oi: usize, ci: usize) -> usize {
        self.check_slot[self.first_component[oi] + ci]
    }

    /// `name/role` of a located component, for errors.
    fn label(&self, oi: usize, comp: &Component) -> String {
        format!("{}/{}", self.manifest.objects[oi].name, comp.role)
    }

    /// True when the component's digest covers its stored bytes: always in 1.x, for
    /// raw parts in version 2 (whose digests cover the decoded bytes).
    fn digest_covers_stored(&self, comp: &Component) -> bool {
        self.version != ZtVersion::V2 || comp.encoding == Encoding::Raw
    }

    /// The stored bytes of a located component, digest checked (once per reader)
    /// when the digest covers them.
    fn stored_at(&self, oi: usize, ci: usize, comp: &Component) -> Result<Bytes> {
        let stored = self.bytes.slice_at(comp.offset, comp.length)?;
        let group = self.shared_bytes.as_ref().and_then(|(group_of, groups)| {
            group_of[self.first_component[oi] + ci].map(|g| &groups[g])
        });
        match group {
            // Bytes others share: every member's checks before any view of them.
            Some(members) => {
                for &(o, c) in members {
                    let member = &self.manifest.objects[o].components[c];
                    self.check_stored(o, c, member, &stored)?;
                    if member.encoding == Encoding::Raw {
                        self.check_content(o, c, member, &stored)?;
                    }
                }
            }
            None => self.check_stored(oi, ci, comp, &stored)?,
        }
        Ok(stored)
    }

    /// Checks a located component's digest over its stored bytes (once per reader),
    /// when the digest covers them.
    fn check_stored(&self, oi: usize, ci: usize, comp: &Component, stored: &[u8]) -> Result<()> {
        if let Some(digest) = &comp.digest {
            let cell = self.cell(oi, ci);
            if cell.get().is_none() && self.digest_covers_stored(comp) {
                digest.verify(stored, &self.label(oi, comp))?;
                let _ = cell.set(());
            }
        }
        Ok(())
    }

    /// Checks a version 2 digest over freshly decoded bytes (once per reader).
    fn check_decoded(&self, oi: usize, ci: usize, comp: &Component, decoded: &[u8]) -> Result<()> {
        if let Some(digest) = &comp.digest {
            let cell = self.cell(oi, ci);
            if cell.get().is_none() {
                digest.verify(decoded, &self.label(oi, comp))?;
                let _ = cell.set(());
            }
        }
        Ok(())
    }

    /// The decoded bytes of a located component: zero-copy when raw.
    fn decoded_at(&self, oi: usize, ci: usize, comp: &Component) -> Result<Bytes> {
        let stored = self.stored_at(oi, ci, comp)?;
        if comp.encoding == Encoding::Raw {
            return Ok(stored);
        }
        let n = usize::try_from(comp.decoded_length()).map_err(|_| Error::Overflow {
            what: "decoded length as usize",
        })?;
        let mut buf = AlignedBuf::zeroed(n)?;
        self.decode_to(oi, ci, comp, &stored, buf.as_mut_slice())?;
        Ok(buf.into_bytes())
    }

    /// Decodes (or, when raw, copies) a component's stored bytes into `dst` (exactly
    /// its decoded length); for `zt.zstd-seekable/1`, checks the digest over the result.
    fn decode_to(
        &self,
        oi: usize,
        ci: usize,
        comp: &Component,
        stored: &[u8],
        dst: &mut [u8],
    ) -> Result<()> {
        let what = self.label(oi, comp);
        match comp.encoding {
            Encoding::Raw => {
                tensorwire_core::copy::copy(dst, stored);
                Ok(())
            }
            Encoding::Zstd => decode_zstd(stored, dst, &what),
            Encoding::ZstdSeekable => {
                seekable::decode_into(stored, dst, &what)?;
                self.check_decoded(oi, ci, comp, dst)
            }
        }
    }

    /// The stored (possibly compressed) bytes of a component, zero-copy, after checking
    /// its digest (once per reader) when the digest covers them: always in 1.x, only
    /// for raw parts in version 2, whose digests cover the decoded bytes (checked by
    /// [`ZtReader::component`] and `verify`).
    pub fn stored(&self, name: &str, role: &str) -> Result<Bytes> {
        let (oi, ci, comp) = self.locate(name, role)?;
        self.stored_at(oi, ci, comp)
    }

    /// A component's decoded bytes: a zero-copy view of the file for raw components, a
    /// fresh 64-byte-aligned buffer for encoded ones. Digests are checked first (1.x)
    /// or over the decoded bytes (version 2).
    pub fn component(&self, name: &str, role: &str) -> Result<Bytes> {
        let (oi, ci, comp) = self.locate(name, role)?;
        self.decoded_at(oi, ci, comp)
    }

    /// Decodes (or copies) a component into `dst`, which must be exactly its decoded
    /// length. Large raw copies run in parallel.
    pub fn component_into(&self, name: &str, role: &str, dst: &mut [u8]) -> Result<()> {
        let (oi, ci, comp) = self.locate(name, role)?;
        if dst.len() as u64 != comp.decoded_length() {
            return Err(Error::SizeMismatch {
                tensor: format!("{name}/{role}"),
                expected: comp.decoded_length(),
                found: dst.len() as u64,
            });
        }
        let stored = self.stored_at(oi, ci, comp)?;
        self.decode_to(oi, ci, comp, &stored, dst)
    }

    /// The logical type of a dense tensor's `data` when tensorwire has no dtype for it
    /// over that storage (`f8_e8m0`, `f4_e2m1`, a user's own type): such a tensor's
    /// view (version 1) gives the storage elements, and only a copy of the whole
    /// object ([`crate::ZtWriter::copy_object`]) keeps the type. `None` for every
    /// other tensor.
    pub fn opaque_type(&self, name: &str) -> Result<Option<&str>> {
        let obj = self.object(name)?;
        let Some(data) = obj
            .component("data")
            .filter(|_| obj.layout == Layout::Dense)
        else {
            return Ok(None);
        };
        let opaque = match self.version {
            ZtVersion::V2 => !manifest_v2::can_interpret(data),
            _ => data
                .logical_type
                .as_deref()
                .is_some_and(|t| t.parse::<DType>().ok() != Some(data.logical_dtype_v1())),
        };
        Ok(opaque.then(|| data.logical_type.as_deref().unwrap_or_default()))
    }

    /// A registered type tensorwire has no dtype for but reads as its bytes (`u8`):
    /// `f8_e8m0` (one byte per element, in either version) and a version 2
    /// `f4_e2m1` (two elements per byte), when the dense tensor's `data` is stored
    /// as `u8`. torch has dtypes for both (`float8_e8m0fnu`, `float4_e2m1fn_x2`).
    /// Such a tensor is listed, and viewed, as `u8` bytes: an `f8_e8m0` one with its
    /// shape, an `f4_e2m1` one flat (its [`Object::shape`] stays the logical one).
    pub fn byte_type(&self, name: &str) -> Result<Option<ByteType>> {
        Ok(byte_type_of(self.object(name)?, self.version))
    }

    /// Fails for a version 2 logical type tensorwire cannot read (an unregistered
    /// one; its bytes stay readable through [`ZtReader::component`]).
    fn readable(&self, obj: &Object) -> Result<()> {
        if byte_type_of(obj, self.version).is_some() {
            return Ok(());
        }
        if self.version == ZtVersion::V2 {
            if let Some(data) = obj
                .component("data")
                .filter(|d| !manifest_v2::can_interpret(d))
            {
                return Err(Error::unsupported(format!(
                    "tensor `{}` has logical type `{}`, which has no tensorwire dtype; read its `data` component instead",
                    obj.name,
                    data.logical_type.as_deref().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// The content rules of a version 2 logical type over decoded bytes: `bool`
    /// bytes are 0 or 1, and an odd `f4_e2m1` count leaves the last high nibble
    /// zero (checked once per reader).
    fn check_content(&self, oi: usize, ci: usize, comp: &Component, decoded: &[u8]) -> Result<()> {
        let rule = comp.logical_type.as_deref();
        if self.version != ZtVersion::V2 || !matches!(rule, Some("bool" | "f4_e2m1")) {
            return Ok(());
        }
        let cell = self.content_cell(oi, ci);
        if cell.get().is_none() {
            let what = self.label(oi, comp);
            let obj = &self.manifest.objects[oi];
            if rule == Some("bool") {
                check_bool(decoded, 0, &what)?;
            } else if obj.shape.numel()? % 2 == 1 {
                // Only an odd count leaves a spare nibble: the last byte is read (a
                // page of the map touched) only then.
                check_odd_f4_tail(obj, comp, decoded, &what)?;
            }
            let _ = cell.set(());
        }
        Ok(())
    }

    /// Copies a dense tensor's decoded bytes into `dst` (exactly
    /// [`TensorInfo::nbytes`] long).
    pub fn read_into(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let oi = self.position(name)?;
        self.require_dense(oi)?;
        self.readable(&self.manifest.objects[oi])?;
        self.component_into(name, "data", dst)?;
        let (oi, ci, comp) = self.locate(name, "data")?;
        self.check_content(oi, ci, comp, dst)
    }

    /// Fails unless the object at `oi` is listed dense: a dense object, or a version 2
    /// GGUF object listed as its rows of blocks (see `gguf_rows`).
    fn require_dense(&self, oi: usize) -> Result<()> {
        let info = self.infos.get(oi).ok_or_else(|| Error::no_tensor_at(oi))?;
        if info.layout != Layout::Dense {
            return Err(Error::unsupported(format!(
                "tensor `{}` has layout {}; read its components instead",
                info.name, info.layout
            )));
        }
        Ok(())
    }

    /// The limits this reader was opened with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

fn decode_zstd(stored: &[u8], dst: &mut [u8], what: &str) -> Result<()> {
    let fail = |reason: String| Error::Decode {
        tensor: what.to_owned(),
        encoding: "zstd".to_owned(),
        reason,
    };
    let mut decoder = zstd::bulk::Decompressor::new().map_err(|e| fail(e.to_string()))?;
    // The destination is exactly the declared size, so a frame that inflates beyond
    // it fails here instead of allocating.
    let n = decoder
        .decompress_to_buffer(stored, dst)
        .map_err(|e| fail(e.to_string()))?;
    if n != dst.len() {
        return Err(Error::SizeMismatch {
            tensor: what.to_owned(),
            expected: dst.len() as u64,
            found: n as u64,
        });
    }
    Ok(())
}

/// Decodes a zstd frame into a counting sink, failing unless it yields exactly
/// `declared` bytes. Reads at most `declared + 1` bytes of output.
///
/// libzstd's streaming decoder refuses some frames its one-shot decoder (the one
/// reads use) accepts: blocks larger than the frame's window or the format's
/// 128 KiB cap, which no encoder writes. So that `verify` fails exactly where reads
/// fail, a frame the stream refuses is decoded again as reads decode it, into a
/// buffer of `declared` bytes (allocated fallibly, as reads allocate it).
fn check_zstd_length(stored: &[u8], declared: u64, what: &str) -> Result<()> {
    use std::io::Read;
    let fail = |reason: String| Error::Decode {
        tensor: what.to_owned(),
        encoding: "zstd".to_owned(),
        reason,
    };
    let decoder =
        zstd::stream::read::Decoder::with_buffer(stored).map_err(|e| fail(e.to_string()))?;
    let streamed = std::io::copy(
        &mut decoder.take(declared.saturating_add(1)),
        &mut std::io::sink(),
    );
    match streamed {
        Ok(n) if n != declared => Err(Error::SizeMismatch {
            tensor: what.to_owned(),
            expected: declared,
            found: n,
        }),
        Ok(_) => Ok(()),
        Err(_) => {
            let len = usize::try_from(declared).map_err(|_| fail("too large".to_owned()))?;
            decode_zstd(stored, AlignedBuf::zeroed(len)?.as_mut_slice(), what)
        }
    }
}

/// Fails unless every byte is 0 or 1 (`index` is the element number of `bytes[0]`).
pub(crate) fn check_bool(bytes: &[u8], index: u64, what: &str) -> Result<()> {
    match bytes.iter().position(|&b| b > 1) {
        None => Ok(()),
        Some(i) => Err(Error::Decode {
            tensor: what.to_owned(),
            encoding: "bool".to_owned(),
            reason: format!(
                "element {} is {:#04x}; bool bytes must be 0x00 or 0x01",
                index + i as u64,
                bytes[i]
            ),
        }),
    }
}

/// Fails when `part` of `obj` is dense `f4_e2m1` data of an odd element count whose
/// last byte (`last`) uses the spare high nibble, which must be zero.
pub(crate) fn check_f4_tail(
    obj: &Object,
    part: &Component,
    last: Option<u8>,
    what: &str,
) -> Result<()> {
    if part.logical_type.as_deref() == Some("f4_e2m1")
        && obj.layout == Layout::Dense
        && obj.shape.numel()? % 2 == 1
        && last.is_some_and(|b| b & 0xf0 != 0)
    {
        return Err(Error::Decode {
            tensor: what.to_owned(),
            encoding: "f4_e2m1".to_owned(),
            reason: "the unused high nibble after an odd element count is not zero".to_owned(),
        });
    }
    Ok(())
}

/// [`check_f4_tail`] over the decoded bytes of a tensor of an odd count. Not inlined:
/// a slice's bytes may be loaded ahead of the branch that needs them, and here that
/// load is a page fault of the map for every tensor a reader hands out.
#[inline(never)]
fn check_odd_f4_tail(obj: &Object, part: &Component, decoded: &[u8], what: &str) -> Result<()> {
    check_f4_tail(obj, part, decoded.last().copied(), what)
}

fn read_u64_le(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// Opens a version 2 container: footer, manifest bounds, size and XXH3 hash, the
/// manifest itself, and the whole-file validation of its blobs.
fn parse_v2(bytes: &[u8], limits: &Limits) -> Result<Manifest> {
    let len = bytes.len() as u64;
    let min = MAGIC_V2.len() as u64 + V2_FOOTER_LEN;
    if len < min {
        return Err(Error::Truncated {
            offset: 0,
            needed: min,
            available: len,
        });
    }
    let footer_at = (len - V2_FOOTER_LEN) as usize;
    let footer = &bytes[footer_at..];
    if footer[32..] != MAGIC_V2[..] {
        return Err(Error::BadMagic {
            offset: len - 8,
            expected: ".zt 2 footer magic 89 5A 54 32 0D 0A 1A 0A",
            found: footer[32..].to_vec(),
        });
    }
    let field = |at: usize| read_u64_le(footer, at).unwrap_or_default();
    let version = u32::from_le_bytes([footer[24], footer[25], footer[26], footer[27]]);
    if version != 2 {
        return Err(Error::unsupported(format!(
            ".zt footer version {version} (this reader knows 2)"
        )));
    }
    let (offset, length, hash) = (field(0), field(8), field(16));
    let data_end = len - V2_FOOTER_LEN;
    if length == 0 {
        if offset != 0 || hash != 0 {
            return Err(Error::malformed(
                footer_at as u64,
                "a footer without a manifest must have a zero manifest offset and hash",
            ));
        }
        return Err(Error::unsupported(
            "a .zt 2 data shard (no manifest): open the model's root file",
        ));
    }
    Error::check_limit(
        "manifest size",
        length,
        limits.max_metadata_bytes.min(crate::V2_MAX_MANIFEST),
    )?;
    if offset % V2_ALIGNMENT != 0 {
        return Err(Error::Misaligned {
            tensor: "<manifest>".to_owned(),
            offset,
            alignment: V2_ALIGNMENT,
        });
    }
    let end = offset.checked_add(length).filter(|&e| e <= data_end);
    if offset < V2_ALIGNMENT || end.is_none() {
        return Err(Error::OutOfBounds {
            tensor: "<manifest>".to_owned(),
            offset,
            length,
            limit: data_end,
        });
    }
    let manifest_bytes = &bytes[offset as usize..(offset + length) as usize];
    let found = xxhash_rust::xxh3::xxh3_64(manifest_bytes);
    if found != hash {
        return Err(Error::DigestMismatch {
            tensor: "<manifest>".to_owned(),
            algorithm: "xxh3",
            expected: format!("{hash:016x}"),
            found: format!("{found:016x}"),
        });
    }
    let ctx = Ctx { offset, limits };
    let manifest = manifest_v2::decode(manifest_bytes, &ctx)?;
    manifest_v2::validate(&manifest, data_end, (offset, length), limits)?;
    Ok(manifest)
}

/// Checks magic and footer, and decodes the manifest. Returns the end of the data
/// region (where the manifest starts).
fn parse_container(bytes: &[u8], limits: &Limits) -> Result<(ZtVersion, Manifest, u64)> {
    let len = bytes.len() as u64;
    let head = bytes.get(..8).ok_or(Error::Truncated {
        offset: 0,
        needed: 8,
        available: len,
    })?;
    let version = if head == MAGIC {
        ZtVersion::V1
    } else if head == MAGIC_V01 {
        ZtVersion::V0_1
    } else {
        return Err(Error::BadMagic {
            offset: 0,
            expected: "ZTEN1000, ZTEN0001 or the .zt 2 magic 89 5A 54 32 0D 0A 1A 0A",
            found: head.to_vec(),
        });
    };
    // v1: [magic][blobs][manifest][u64 size][magic]; v0.1: [magic][blobs][manifest][u64 size]
    let trailer: u64 = match version {
        ZtVersion::V1 => 16,
        _ => 8,
    };
    if len < 8 + trailer {
        return Err(Error::Truncated {
            offset: 8,
            needed: trailer,
            available: len - 8,
        });
    }
    let size_at = (len - trailer) as usize;
    if version == ZtVersion::V1 {
        let footer = &bytes[size_at + 8..];
        if footer != MAGIC {
            return Err(Error::BadMagic {
                offset: len - 8,
                expected: "ZTEN1000 footer",
                found: footer.to_vec(),
            });
        }
    }
    let manifest_len = read_u64_le(bytes, size_at).ok_or(Error::Truncated {
        offset: size_at as u64,
        needed: 8,
        available: 0,
    })?;
    Error::check_limit("manifest size", manifest_len, limits.max_metadata_bytes)?;
    let room = len - trailer - 8;
    if manifest_len > room {
        return Err(Error::Truncated {
            offset: size_at as u64,
            needed: manifest_len,
            available: room,
        });
    }
    let manifest_start = len - trailer - manifest_len;
    let manifest_bytes = &bytes[manifest_start as usize..size_at];
    let ctx = Ctx {
        offset: manifest_start,
        limits,
    };
    let manifest = match version {
        ZtVersion::V1 => decode_v1(manifest_bytes, &ctx)?,
        _ => decode_v01(manifest_bytes, &ctx)?,
    };
    Ok((version, manifest, manifest_start))
}

/// Checks every component: in bounds of the data region, aligned (1.x), no overlap,
/// sizes consistent with shapes and dtypes, decoded sizes within limits.
fn validate_layout(
    manifest: &Manifest,
    data_end: u64,
    version: ZtVersion,
    limits: &Limits,
) -> Result<()> {
    let label = |o: usize, c: usize| {
        let obj = &manifest.objects[o];
        format!("{}/{}", obj.name, obj.components[c].role)
    };
    let mut spans: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (oi, obj) in manifest.objects.iter().enumerate() {
        if obj.components.is_empty() {
            return Err(Error::malformed(
                data_end,
                format!("object `{}` has no components", obj.name),
            ));
        }
        for (ci, c) in obj.components.iter().enumerate() {
            let Some(end) = c.offset.checked_add(c.length) else {
                return Err(Error::Overflow {
                    what: "component end offset",
                });
            };
            if c.offset < 8 || end > data_end {
                return Err(Error::OutOfBounds {
                    tensor: label(oi, ci),
                    offset: c.offset,
                    length: c.length,
                    limit: data_end,
                });
            }
            if version == ZtVersion::V1 && c.offset % ALIGNMENT != 0 {
                return Err(Error::Misaligned {
                    tensor: label(oi, ci),
                    offset: c.offset,
                    alignment: ALIGNMENT,
                });
            }
            Error::check_limit(
                "decoded component size",
                c.decoded_length(),
                limits.max_decoded_bytes,
            )?;
            c.check_expansion(|| label(oi, ci))?;
            let unit = c.dtype.size().unwrap_or(1) as u64;
            if c.decoded_length() % unit != 0 {
                return Err(Error::SizeMismatch {
                    tensor: label(oi, ci),
                    expected: c.decoded_length().div_ceil(unit) * unit,
                    found: c.decoded_length(),
                });
            }
            spans.push((c.offset, end, oi, ci));
        }
        check_object(obj, data_end)?;
    }
    spans.sort_unstable_by_key(|&(start, end, _, _)| (start, end));
    for pair in spans.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.0 < a.1 {
            return Err(Error::Overlap {
                tensor: label(b.2, b.3),
                other: label(a.2, a.3),
                offset: b.0,
            });
        }
    }
    Ok(())
}

/// Per-object rules shared by the reader (on open) and the writer (before writing):
/// distinct roles, and for dense objects a `data` component of exactly shape × dtype
/// bytes (the `type` counted only where its storage is the stored dtype: any other
/// `type` is a label, as ztensor 1.2.3 writes and reads it). `at` is the offset
/// reported in a `Malformed` error.
pub(crate) fn check_object(obj: &Object, at: u64) -> Result<()> {
    if let Some(w) = obj.components.windows(2).find(|w| w[0].role == w[1].role) {
        return Err(Error::malformed(
            at,
            format!("object `{}` repeats component `{}`", obj.name, w[0].role),
        ));
    }
    if obj.layout == Layout::Dense {
        let data = obj.component("data").ok_or_else(|| {
            Error::malformed(
                at,
                format!("dense object `{}` has no `data` component", obj.name),
            )
        })?;
        let expected = obj.shape.byte_len(data.logical_dtype_v1())?;
        if data.decoded_length() != expected {
            return Err(Error::SizeMismatch {
                tensor: obj.name.to_string(),
                expected,
                found: data.decoded_length(),
            });
        }
    }
    Ok(())
}

/// The attributes naming the block size of a `gguf.<type>/1` object (ztensor 2's
/// registered layouts for GGUF's quantized types): bytes per block.
pub const GGUF_BLOCK_BYTES: &str = "block_bytes";
/// See [`GGUF_BLOCK_BYTES`]: elements per block.
pub const GGUF_ELEMS_PER_BLOCK: &str = "elems_per_block";

const GGUF_LAYOUT_PREFIX: &str = "gguf.";
const GGUF_LAYOUT_SUFFIX: &str = "/1";

/// The version 2 layout id ztensor 2 registers for the GGUF type `type_name`
/// (`Q4_K` → `gguf.q4_k/1`), which the reader lists as rows of blocks.
pub fn gguf_layout_id(type_name: &str) -> String {
    format!(
        "{GGUF_LAYOUT_PREFIX}{}{GGUF_LAYOUT_SUFFIX}",
        type_name.to_ascii_lowercase()
    )
}

/// The rows of blocks of a version 2 `gguf.<type>/1` object (ztensor 2's layout for
/// a GGUF quantized type: the logical shape, [`GGUF_BLOCK_BYTES`] and
/// [`GGUF_ELEMS_PER_BLOCK`] attributes, and the blocks as one `u8` `data` component):
/// the type's GGUF name and the shape of the `u8` rows, as the GGUF reader gives
/// such a tensor. `None` for any other object, or one whose sizes disagree.
fn gguf_rows(obj: &Object) -> Option<(String, Shape)> {
    let Layout::Other(id) = &obj.layout else {
        return None;
    };
    let name = id
        .strip_prefix(GGUF_LAYOUT_PREFIX)?
        .strip_suffix(GGUF_LAYOUT_SUFFIX)
        .filter(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })?;
    let int = |key: &str| match obj.attributes.as_ref()?.get(key)? {
        Value::Int(n) => u64::try_from(*n).ok().filter(|&n| n > 0),
        _ => None,
    };
    let (block_bytes, per_block) = (int(GGUF_BLOCK_BYTES)?, int(GGUF_ELEMS_PER_BLOCK)?);
    let [data] = obj.components.as_slice() else {
        return None;
    };
    let (&last, lead) = obj.shape.dims().split_last()?;
    if data.role != "data"
        || data.dtype != DType::U8
        || data.logical_type.is_some()
        || last % per_block != 0
    {
        return None;
    }
    let mut rows = lead.to_vec();
    rows.push((last / per_block).checked_mul(block_bytes)?);
    let rows = Shape::new(rows).ok()?;
    (rows.numel().ok()? == data.decoded_length()).then(|| (name.to_ascii_uppercase(), rows))
}

/// See [`ZtReader::byte_type`].
fn byte_type_of(obj: &Object, version: ZtVersion) -> Option<ByteType> {
    let data = obj
        .component("data")
        .filter(|d| obj.layout == Layout::Dense && d.dtype == DType::U8)?;
    match data.logical_type.as_deref()? {
        "f8_e8m0" => Some(ByteType::F8E8M0),
        "f4_e2m1" if version == ZtVersion::V2 => Some(ByteType::F4E2M1),
        _ => None,
    }
}

fn info_of(obj: &Object, version: ZtVersion) -> Result<TensorInfo> {
    let encoding = obj
        .components
        .iter()
        .find(|c| c.encoding != Encoding::Raw)
        .map(|c| c.encoding.name().to_owned());
    let dtype = match version {
        ZtVersion::V2 => obj.primary().map_or(DType::U8, manifest_v2::element_dtype),
        _ => obj.dtype(),
    };
    let mut attributes = obj.attributes.clone().unwrap_or_default();
    let (shape, layout) = match gguf_rows(obj).filter(|_| version == ZtVersion::V2) {
        // Listed as the GGUF reader and a 1.x conversion list it: dense `u8` rows of
        // blocks (its one `u8` part's dtype), the type and logical shape as attributes.
        Some((type_name, rows)) => {
            attributes.remove(GGUF_BLOCK_BYTES);
            attributes.remove(GGUF_ELEMS_PER_BLOCK);
            let logical = obj.shape.dims().iter().map(|&d| Value::Int(d.into()));
            attributes.insert("gguf.shape".to_owned(), Value::List(logical.collect()));
            attributes.insert(
                SOURCE_LAYOUT_KEY.to_owned(),
                Value::Str(format!("gguf:{type_name}")),
            );
            attributes.insert("gguf.type".to_owned(), Value::Str(type_name));
            (rows, Layout::Dense)
        }
        None => match byte_type_of(obj, version) {
            // Two elements per byte: listed (and viewed) as its bytes.
            Some(ByteType::F4E2M1) => (
                Shape::new(vec![obj
                    .components
                    .iter()
                    .map(Component::decoded_length)
                    .sum()])?,
                obj.layout.clone(),
            ),
            _ => (obj.shape.clone(), obj.layout.clone()),
        },
    };
    Ok(TensorInfo {
        name: obj.name.clone(),
        dtype,
        shape,
        layout,
        nbytes: obj.components.iter().map(Component::decoded_length).sum(),
        stored_bytes: obj.components.iter().map(|c| c.length).sum(),
        offset: obj.components.iter().map(|c| c.offset).min().unwrap_or(0),
        encoding,
        attributes: attributes.into(),
    })
}

impl TensorSource for ZtReader {
    fn format(&self) -> &'static str {
        match self.version {
            ZtVersion::V1 => "zt",
            ZtVersion::V0_1 => "zt-0.1",
            ZtVersion::V2 => "zt-2",
        }
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        &self.manifest.attributes
    }

    /// Index of an object (objects are sorted by name).
    fn position(&self, name: &str) -> Result<usize> {
        // Callers often look the same name up twice in a row (info, then view), and
        // walk the names in order: try the last hit and the one after it first.
        let last = self.last_position.load(Ordering::Relaxed);
        for guess in [last, last + 1] {
            if self
                .manifest
                .objects
                .get(guess)
                .is_some_and(|o| &*o.name == name)
            {
                self.last_position.store(guess, Ordering::Relaxed);
                return Ok(guess);
            }
        }
        let found = self
            .manifest
            .objects
            .binary_search_by(|o| (*o.name).cmp(name))
            .map_err(|_| Error::NotFound {
                name: name.to_owned(),
            })?;
        self.last_position.store(found, Ordering::Relaxed);
        Ok(found)
    }

    fn view_at(&self, position: usize) -> Result<TensorView> {
        let oi = position;
        let obj = self
            .manifest
            .objects
            .get(oi)
            .ok_or_else(|| Error::no_tensor_at(oi))?;
        let name = &*obj.name;
        self.require_dense(oi)?;
        self.readable(obj)?;
        // Validated on open: a dense object has a `data` component of exactly
        // shape × dtype bytes.
        let (ci, data) = obj
            .components
            .iter()
            .enumerate()
            .find(|(_, c)| c.role == "data")
            .ok_or_else(|| Error::NotFound {
                name: format!("{name}/data"),
            })?;
        let bytes = self.decoded_at(oi, ci, data)?;
        self.check_content(oi, ci, data, &bytes)?;
        Ok(TensorView {
            dtype: self.infos[oi].dtype,
            shape: self.infos[oi].shape.clone(),
            bytes,
            zero_copy: data.encoding == Encoding::Raw,
        })
    }

    /// Checks every digest and that every encoded component decodes to exactly its
    /// declared length (streamed, without holding the decoded bytes); in version 2
    /// also the content rules of the logical types (`bool` bytes are 0 or 1, an odd
    /// `f4_e2m1` count leaves the last high nibble zero). Returns the number of
    /// digests checked.
    fn verify(&self) -> Result<usize> {
        if self.version == ZtVersion::V2 {
            return self.verify_v2();
        }
        let mut checked = 0;
        for obj in &self.manifest.objects {
            for c in &obj.components {
                let stored = self.stored(&obj.name, &c.role)?;
                checked += usize::from(c.digest.is_some());
                if c.encoding == Encoding::Zstd {
                    let what = format!("{}/{}", obj.name, c.role);
                    check_zstd_length(&stored, c.decoded_length(), &what)?;
                }
            }
        }
        Ok(checked)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl ZtReader {
    /// `verify` for version 2: digests over the decoded bytes, seekable streams
    /// decoded frame by frame through one scratch buffer. As in 1.x, each check runs
    /// once per reader: a raw component whose digest and content rules were checked
    /// when it was first read is not read again, since a zero-copy view of it may have
    /// been written since (privately: the file is unchanged).
    fn verify_v2(&self) -> Result<usize> {
        let mut checked = 0;
        for (oi, obj) in self.manifest.objects.iter().enumerate() {
            for (ci, c) in obj.components.iter().enumerate() {
                if c.encoding == Encoding::Raw && self.checked_before(oi, ci, c) {
                    checked += usize::from(c.digest.is_some());
                    continue;
                }
                let what = self.label(oi, c);
                let stored = self.bytes.slice_at(c.offset, c.length)?;
                let mut state = c.digest.as_ref().map(|d| DigestState::new(d.checksum()));
                let is_bool = c.logical_type.as_deref() == Some("bool");
                let mut seen = 0u64;
                let mut last = None;
                let mut feed = |chunk: &[u8]| -> Result<()> {
                    if let Some(s) = state.as_mut() {
                        s.update(chunk);
                    }
                    if is_bool {
                        check_bool(chunk, seen, &what)?;
                    }
                    seen += chunk.len() as u64;
                    if let Some(&b) = chunk.last() {
                        last = Some(b);
                    }
                    Ok(())
                };
                match c.encoding {
                    Encoding::Raw => feed(&stored)?,
                    _ => seekable::for_each_frame(&stored, c.decoded_length(), &what, &mut feed)?,
                }
                if let (Some(digest), Some(state)) = (&c.digest, state) {
                    digest.check(state, &what)?;
                    let _ = self.cell(oi, ci).set(());
                    checked += 1;
                }
                check_f4_tail(obj, c, last, &what)?;
                let _ = self.content_cell(oi, ci).set(());
            }
        }
        Ok(checked)
    }

    /// True when every check `verify_v2` makes of a component has passed already: its
    /// digest (if any) and the content rules of its logical type (if any).
    fn checked_before(&self, oi: usize, ci: usize, comp: &Component) -> bool {
        let digest_done = comp.digest.is_none() || self.cell(oi, ci).get().is_some();
        let has_rules = matches!(comp.logical_type.as_deref(), Some("bool" | "f4_e2m1"));
        let rules_done = !has_rules || self.content_cell(oi, ci).get().is_some();
        digest_done && rules_done
    }
}

/// The group of each component (flattened in object order; `None` for bytes of its
/// own) and each group's members (object and component index).
type SharedBytes = (Vec<Option<usize>>, Vec<Vec<(usize, usize)>>);

/// See `ZtReader::shared_bytes`: `None` when no two components name the same stored
/// bytes (offset, length and encoding), as in most files.
#[allow(clippy::type_complexity)]
fn shared_byte_groups(
    manifest: &Manifest,
) -> Option<(Vec<Option<usize>>, Vec<Vec<(usize, usize)>>)> {
    let components = || {
        manifest.objects.iter().enumerate().flat_map(|(o, obj)| {
            obj.components
                .iter()
                .enumerate()
                .map(move |(c, comp)| (o, c, comp))
        })
    };
    let mut offsets: Vec<u64> = components().map(|(_, _, c)| c.offset).collect();
    offsets.sort_unstable();
    if offsets.windows(2).all(|w| w[0] != w[1]) {
        return None;
    }
    let mut members: NameMap<(u64, u64, Encoding), Vec<(usize, usize)>> = NameMap::default();
    for (o, c, comp) in components() {
        members
            .entry((comp.offset, comp.length, comp.encoding))
            .or_default()
            .push((o, c));
    }
    let mut group_of = vec![None; offsets.len()];
    let mut groups = Vec::new();
    let first: Vec<usize> = manifest
        .objects
        .iter()
        .scan(0, |n, obj| {
            let at = *n;
            *n += obj.components.len();
            Some(at)
        })
        .collect();
    for list in members.into_values().filter(|list| list.len() > 1) {
        for &(o, c) in &list {
            group_of[first[o] + c] = Some(groups.len());
        }
        groups.push(list);
    }
    Some((group_of, groups))
}

/// The check slot of every component of `manifest` (flattened in object order) and
/// the number of slots: components naming the same stored bytes (offset and length)
/// with the same encoding and digest share the first one's slot, and with `typed`,
/// only those of one logical type too. Digests are checked by untyped slots (a
/// version 2 writer stores identical bytes once, even for two dtypes), content rules
/// by typed ones.
fn check_slots(manifest: &Manifest, typed: bool) -> (Vec<usize>, usize) {
    let components = || manifest.objects.iter().flat_map(|o| o.components.iter());
    let count = components().count();
    // Most files store every part apart: one slot each, found without hashing.
    let mut offsets: Vec<u64> = components().map(|c| c.offset).collect();
    offsets.sort_unstable();
    if offsets.windows(2).all(|w| w[0] != w[1]) {
        return ((0..count).collect(), count);
    }
    // Keyed by everything a check depends on, so that many components over the same
    // bytes cost one lookup each.
    type Key<'a> = (u64, u64, Encoding, Option<&'a Digest>, Option<&'a str>);
    let mut slot_by_key: NameMap<Key<'_>, usize> = NameMap::default();
    let slot_of = components()
        .map(|c| {
            let key = (
                c.offset,
                c.length,
                c.encoding,
                c.digest.as_ref(),
                c.logical_type.as_deref().filter(|_| typed),
            );
            let next = slot_by_key.len();
            *slot_by_key.entry(key).or_insert(next)
        })
        .collect();
    (slot_of, slot_by_key.len())
}
