//! Writing `.zt` 1.2 and version 2 files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tensorwire_core::progress::{write_in_chunks, Progress};
use tensorwire_core::{align_up, DType, Error, Layout, Limits, Result, Shape, Value};

use crate::digest::{Checksum, DigestState};
use crate::manifest::{self, Component, Encoding, Manifest, Object};
use crate::reader::{check_bool, check_f4_tail, check_object, ZtReader, ZtVersion};
use crate::{manifest_v2, seekable};
use crate::{
    ALIGNMENT, MAGIC, MAGIC_V2, V2_ALIGNMENT, V2_CANONICAL_ALIGNMENT, V2_MAX_MANIFEST,
    WRITE_VERSION,
};

/// How a component is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored raw (zero-copy readable).
    #[default]
    Raw,
    /// zstd at the given level (1–22; ztensor's `compress=True` is level 3): one zstd
    /// frame in a 1.x file, `zt.zstd-seekable/1` (1 MiB frames with checksums and a
    /// seek table, as ztensor 2.x writes at level 3) in a version 2 file.
    Zstd(i32),
}

/// Per-tensor write options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOptions {
    /// Compression of each component.
    pub compression: Compression,
    /// Digest recorded for each component: over the stored bytes in a 1.x file
    /// (`None`, `Crc32c` or `Sha256`), over the decoded bytes in a version 2 file
    /// (`None`, `Xxh3` or `Sha256`; ztensor 2.x writes `Xxh3`).
    pub checksum: Checksum,
}

/// One component to write: its role, storage dtype, optional logical type and bytes
/// (little-endian).
#[derive(Debug, Clone, Copy)]
pub struct ComponentData<'a> {
    /// Role name (`values`, `indices`, `scales`, …).
    pub role: &'a str,
    /// Storage dtype (one of the 13 primitives).
    pub dtype: DType,
    /// Logical type recorded as `type`.
    pub logical_type: Option<&'a str>,
    /// The bytes.
    pub data: &'a [u8],
}

impl Component {
    /// This component's role, dtype and logical type with `data` as its bytes, ready
    /// to write again (converting or copying an object).
    pub fn with_data<'a>(&'a self, data: &'a [u8]) -> ComponentData<'a> {
        ComponentData {
            role: &self.role,
            dtype: self.dtype,
            logical_type: self.logical_type.as_deref(),
            data,
        }
    }
}

/// Where the writer's bytes go and how to finish them.
enum Target {
    /// A new file written under a temporary name and renamed into place on finish,
    /// so an interrupted write never leaves a half-written file at `path`.
    Create { tmp: PathBuf, destination: PathBuf },
    /// An existing file opened for append: the old manifest and footer are kept so an
    /// abandoned append can restore them.
    Append {
        path: PathBuf,
        old_tail: Vec<u8>,
        old_tail_at: u64,
    },
    /// Any caller-supplied writer.
    Stream,
}

/// Writes a `.zt` file: blobs first, manifest and footer on [`ZtWriter::finish`].
///
/// [`ZtWriter::new`] and [`ZtWriter::create`] write version 1.2 (what ztensor 1.2.3
/// writes, byte for byte). [`ZtWriter::with_version`] and
/// [`ZtWriter::create_with_version`] with [`ZtVersion::V2`] write version 2, laid out
/// as ztensor 2.x lays it out: blobs at multiples of 65536 (see
/// [`ZtWriter::set_alignment`]) in the order they are added, parts of an object in
/// name order, raw parts with byte-identical contents sharing one blob, the manifest
/// at the next aligned offset after the last blob, then the footer. Adding tensors in
/// ascending name order, raw, with [`Checksum::Xxh3`] gives ztensor's canonical form:
/// the same bytes `ztensor.Writer(path)` writes for the same tensors.
///
/// ```
/// use tensorwire_core::{DType, Shape};
/// use tensorwire_zt::{WriteOptions, ZtWriter};
/// let mut w = ZtWriter::new(Vec::new()).unwrap();
/// let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// w.add_dense("w", DType::F32, &Shape::new(vec![2]).unwrap(), &data, WriteOptions::default()).unwrap();
/// let file: Vec<u8> = w.finish_into().unwrap();
/// assert_eq!(&file[..8], b"ZTEN1000");
/// ```
///
/// Version 2:
///
/// ```
/// use tensorwire_core::{DType, Shape};
/// use tensorwire_zt::{Checksum, WriteOptions, ZtVersion, ZtWriter, MAGIC_V2};
/// let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
/// let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// let canonical = WriteOptions { checksum: Checksum::Xxh3, ..WriteOptions::default() };
/// w.add_dense("w", DType::F32, &Shape::new(vec![2]).unwrap(), &data, canonical).unwrap();
/// let file: Vec<u8> = w.finish_into().unwrap();
/// assert_eq!(&file[..8], MAGIC_V2);
/// assert_eq!(&file[file.len() - 8..], MAGIC_V2);
/// ```
pub struct ZtWriter<W: Write> {
    out: Option<W>,
    target: Target,
    manifest: Manifest,
    offset: u64,
    finished: bool,
    /// A write stopped part-way: nothing more may be written (see [`ZtWriter::out`]).
    broken: bool,
    version: ZtVersion,
    /// Blob alignment (64 in 1.x; 65536 by default in version 2).
    align: u64,
    /// Version 2 blob sharing: (xxh3-128, length) of each raw blob written → where it
    /// is, and (for streams, which cannot be read back) its SHA-256, which confirms a
    /// match before a blob is shared.
    shared: HashMap<BlobKey, SharedBlob>,
    /// The names in `manifest.objects`, which holds the objects in the order they were
    /// added (sorted by name only when the manifest is written): a lookup per add, not
    /// a scan, and no insertion into the middle of a long list.
    names: HashSet<std::sync::Arc<str>>,
}

/// A raw blob's xxh3-128 and length.
type BlobKey = (u128, u64);
/// Where a raw blob was written, and its SHA-256 when it cannot be read back.
type SharedBlob = (u64, Option<[u8; 32]>);

impl ZtWriter<BufWriter<File>> {
    /// Creates a new 1.2 file at `path` (replacing any file there when finished).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        ZtWriter::create_with_version(path, ZtVersion::V1)
    }

    /// Creates a new file of `version` ([`ZtVersion::V1`] or [`ZtVersion::V2`]) at
    /// `path`, replacing any file there when finished. It is written under a
    /// temporary name and renamed into place by [`ZtWriter::finish`].
    pub fn create_with_version(path: impl AsRef<Path>, version: ZtVersion) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let destination = tensorwire_core::write_destination(&path)?;
        // Named by the destination: the temporary name means nothing to the caller
        // (a missing folder is the destination's).
        let (file, tmp) =
            tensorwire_core::create_temporary(&destination).map_err(|e| e.with_path(&path))?;
        let mut w = ZtWriter::start(BufWriter::with_capacity(1 << 20, file), version)?;
        w.target = Target::Create { tmp, destination };
        Ok(w)
    }

    /// Opens an existing 1.x file to add tensors. Existing tensors keep their bytes;
    /// new blobs are written where the old manifest was, and a new manifest follows on
    /// [`ZtWriter::finish`]. Dropping the writer without finishing restores the old
    /// manifest.
    pub fn append(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let reader = ZtReader::open_with(
            &path,
            tensorwire_mmap::MapMode::ReadOnly,
            &Limits::default(),
        )?;
        match reader.version() {
            ZtVersion::V1 => {}
            ZtVersion::V0_1 => {
                return Err(Error::unsupported("appending to a 0.1 file").with_path(&path))
            }
            ZtVersion::V2 => {
                return Err(Error::unsupported("appending to a .zt 2 file").with_path(&path))
            }
        }
        let len = reader.bytes().len() as u64;
        let manifest_len = u64::from_le_bytes(
            reader.bytes()[len as usize - 16..len as usize - 8]
                .try_into()
                .map_err(|_| Error::malformed(len, "footer"))?,
        );
        let tail_at = len - 16 - manifest_len;
        let old_tail = reader.bytes()[tail_at as usize..].to_vec();
        if reader.attribute_keys_made_text() {
            // Rewriting the manifest would write those keys as text: the file's other
            // readers would see changed attributes.
            return Err(Error::unsupported(
                "appending to a file whose attributes have map keys that are not strings \
                 (ztensor writes a dict's int keys as they are): rewriting its manifest \
                 would turn them into strings",
            )
            .with_path(&path));
        }
        let manifest = Manifest {
            version: WRITE_VERSION.to_owned(),
            attributes: tensorwire_core::TensorSource::attributes(&reader).clone(),
            objects: reader.objects().to_vec(),
            keys_made_text: false,
        };
        let names = manifest.objects.iter().map(|o| o.name.clone()).collect();
        drop(reader);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::from(e).with_path(&path))?;
        file.set_len(tail_at)?;
        file.seek(SeekFrom::Start(tail_at))?;
        Ok(ZtWriter {
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            target: Target::Append {
                path,
                old_tail,
                old_tail_at: tail_at,
            },
            manifest,
            offset: tail_at,
            finished: false,
            broken: false,
            version: ZtVersion::V1,
            align: ALIGNMENT,
            shared: HashMap::new(),
            names,
        })
    }
}

impl<W: Write> ZtWriter<W> {
    /// Starts a 1.2 file on any writer (the header is written now).
    pub fn new(out: W) -> Result<Self> {
        ZtWriter::start(out, ZtVersion::V1)
    }

    /// Starts a file of `version` ([`ZtVersion::V1`] or [`ZtVersion::V2`]) on any
    /// writer (the header is written now). Version 0.1 is read-only.
    pub fn with_version(out: W, version: ZtVersion) -> Result<Self> {
        ZtWriter::start(out, version)
    }

    fn start(mut out: W, version: ZtVersion) -> Result<Self> {
        let (magic, manifest_version, align) = match version {
            ZtVersion::V1 => (MAGIC, WRITE_VERSION, ALIGNMENT),
            ZtVersion::V2 => (MAGIC_V2, manifest_v2::VERSION, V2_CANONICAL_ALIGNMENT),
            ZtVersion::V0_1 => {
                return Err(Error::unsupported(
                    "writing .zt 0.1 files (write version 1.2 or 2)",
                ))
            }
        };
        out.write_all(magic)?;
        Ok(ZtWriter {
            out: Some(out),
            target: Target::Stream,
            manifest: Manifest {
                version: manifest_version.to_owned(),
                ..Manifest::default()
            },
            offset: magic.len() as u64,
            finished: false,
            broken: false,
            version,
            align,
            shared: HashMap::new(),
            names: HashSet::new(),
        })
    }

    /// The container version being written.
    pub fn version(&self) -> ZtVersion {
        self.version
    }

    /// Sets the blob alignment of a version 2 file: a power of two, at least 4096
    /// ([`V2_ALIGNMENT`]); the default is 65536, ztensor's canonical placement (what
    /// `ztensor.Writer(path, canonical=False, align=...)` chooses). Only before the
    /// first tensor; 1.x files are always 64-byte aligned.
    pub fn set_alignment(&mut self, alignment: u64) -> Result<()> {
        if self.version != ZtVersion::V2 {
            return Err(Error::invalid(
                "the blob alignment is fixed (64 bytes) in .zt 1.x files",
            ));
        }
        if !alignment.is_power_of_two() || alignment < V2_ALIGNMENT {
            return Err(Error::invalid(format!(
                "alignment must be a power of two of at least {V2_ALIGNMENT}, not {alignment}"
            )));
        }
        if !self.manifest.objects.is_empty() {
            return Err(Error::invalid(
                "the alignment must be set before the first tensor",
            ));
        }
        self.align = alignment;
        Ok(())
    }

    /// The blob alignment in use.
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Sets the file-level attributes; fails (keeping the ones set before) on a value
    /// the file cannot record: an integer outside CBOR's, or in version 2 a key
    /// outside its name rules.
    pub fn set_attributes(&mut self, attributes: BTreeMap<String, Value>) -> Result<()> {
        for (key, value) in &attributes {
            if self.version == ZtVersion::V2 {
                check_writable_name(key, "attribute key")?;
                check_writable_nesting(key, value, FILE_ATTRIBUTE_NESTING)?;
            }
            manifest::check_cbor_ints(key, value)?;
        }
        self.manifest.attributes = attributes;
        Ok(())
    }

    /// True when a tensor of that name has been written (or existed, when appending).
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// Adds a dense tensor of `dtype` and `shape` from its little-endian bytes. Logical
    /// types are stored as ztensor does (`complex64` as `f32` pairs with
    /// `type: complex64`, float8 as `u8` with its `type`; in version 2, `bool` as `u8`
    /// with `type: bool`).
    pub fn add_dense(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &Shape,
        data: &[u8],
        options: WriteOptions,
    ) -> Result<()> {
        self.add_dense_with_attributes(name, dtype, shape, data, None, options)
    }

    /// [`ZtWriter::add_dense`] with per-tensor attributes.
    pub fn add_dense_with_attributes(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &Shape,
        data: &[u8],
        attributes: Option<BTreeMap<String, Value>>,
        options: WriteOptions,
    ) -> Result<()> {
        self.add_dense_with_progress(name, dtype, shape, data, attributes, options, &mut |_| {
            Ok(())
        })
    }

    /// [`ZtWriter::add_dense_with_attributes`], calling `progress` with the number of
    /// bytes of `data` consumed as the write goes (every
    /// [`tensorwire_core::progress::PROGRESS_CHUNK`] bytes), so that a progress bar
    /// moves within a large tensor. An error `progress` returns (such as
    /// [`Error::Cancelled`]) stops the write; as after any write that stopped
    /// part-way, the writer then refuses more, and dropping it rolls the file back.
    #[allow(clippy::too_many_arguments)]
    pub fn add_dense_with_progress(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &Shape,
        data: &[u8],
        attributes: Option<BTreeMap<String, Value>>,
        options: WriteOptions,
        progress: Progress<'_>,
    ) -> Result<()> {
        let expected = shape.byte_len(dtype)?;
        if expected != data.len() as u64 {
            return Err(Error::SizeMismatch {
                tensor: name.to_owned(),
                expected,
                found: data.len() as u64,
            });
        }
        let (mut storage, _) = dtype.storage();
        if self.version == ZtVersion::V2 && dtype == DType::Bool {
            // Version 2 has no bool storage type: bool is a logical type over u8.
            storage = DType::U8;
        }
        if !storage.is_primitive()
            || matches!(
                dtype,
                DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
            )
        {
            return Err(Error::unsupported(format!("dtype {dtype} in a .zt file")));
        }
        let logical = (storage != dtype).then(|| dtype.name());
        self.add_object_with_progress(
            name,
            shape,
            Layout::Dense,
            attributes,
            &[ComponentData {
                role: "data",
                dtype: storage,
                logical_type: logical,
                data,
            }],
            options,
            progress,
        )
    }

    /// Copies object `name` of `reader` (every component, as stored or decoded,
    /// with its shape, layout and attributes) into this file, written with `options`.
    pub fn copy_object(
        &mut self,
        reader: &ZtReader,
        name: &str,
        options: WriteOptions,
    ) -> Result<()> {
        self.copy_object_with_progress(reader, name, options, &mut |_| Ok(()))
    }

    /// [`ZtWriter::copy_object`], reporting the component bytes written to `progress`
    /// as [`ZtWriter::add_dense_with_progress`] does.
    pub fn copy_object_with_progress(
        &mut self,
        reader: &ZtReader,
        name: &str,
        options: WriteOptions,
        progress: Progress<'_>,
    ) -> Result<()> {
        let obj = reader.object(name)?;
        let datas = obj
            .components
            .iter()
            .map(|c| reader.component(name, &c.role))
            .collect::<Result<Vec<_>>>()?;
        let comps: Vec<ComponentData<'_>> = obj
            .components
            .iter()
            .zip(&datas)
            .map(|(c, d)| c.with_data(d))
            .collect();
        self.add_object_with_progress(
            name,
            &obj.shape,
            obj.layout.clone(),
            obj.attributes.clone(),
            &comps,
            options,
            progress,
        )
    }

    /// Adds an object of any layout from its components.
    pub fn add_object(
        &mut self,
        name: &str,
        shape: &Shape,
        layout: Layout,
        attributes: Option<BTreeMap<String, Value>>,
        components: &[ComponentData<'_>],
        options: WriteOptions,
    ) -> Result<()> {
        let no_progress = &mut |_| Ok(());
        self.add_object_with_progress(
            name,
            shape,
            layout,
            attributes,
            components,
            options,
            no_progress,
        )
    }

    /// [`ZtWriter::add_object`], calling `progress` with the number of component
    /// bytes consumed as the write goes.
    #[allow(clippy::too_many_arguments)]
    pub fn add_object_with_progress(
        &mut self,
        name: &str,
        shape: &Shape,
        layout: Layout,
        attributes: Option<BTreeMap<String, Value>>,
        components: &[ComponentData<'_>],
        options: WriteOptions,
        progress: Progress<'_>,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(Error::invalid("tensor names must not be empty"));
        }
        if self.contains(name) {
            return Err(Error::Duplicate {
                name: name.to_owned(),
            });
        }
        if components.is_empty() {
            return Err(Error::invalid(format!("object `{name}` has no components")));
        }
        for (key, value) in attributes.iter().flatten() {
            manifest::check_cbor_ints(key, value)?;
        }
        if self.version == ZtVersion::V2 {
            let object = NewObject {
                name,
                shape,
                layout,
                attributes,
                components,
            };
            return self.add_object_v2(object, options, progress);
        }
        if options.checksum == Checksum::Xxh3 {
            return Err(Error::unsupported(
                "xxh3 digests in a .zt 1.2 file (it records crc32c or sha256)",
            ));
        }
        for c in components {
            if !c.dtype.is_primitive() {
                return Err(Error::invalid(format!(
                    "component `{}` of `{name}`: {} is not a storage dtype",
                    c.role, c.dtype
                )));
            }
            let unit = c.dtype.size().unwrap_or(1);
            if c.data.len() % unit != 0 {
                return Err(Error::SizeMismatch {
                    tensor: format!("{name}/{}", c.role),
                    expected: (c.data.len() / unit * unit) as u64,
                    found: c.data.len() as u64,
                });
            }
        }
        // Check the object as a reader will, before any byte is written, so one bad
        // call cannot leave a file that does not open.
        let layout = Layout::from_name(layout.name());
        let mut planned = Object {
            name: std::sync::Arc::from(name),
            shape: shape.clone(),
            layout,
            attributes,
            components: components
                .iter()
                .map(|c| Component {
                    role: c.role.to_owned().into(),
                    dtype: c.dtype,
                    logical_type: c.logical_type.map(str::to_owned),
                    offset: 0,
                    length: c.data.len() as u64,
                    uncompressed_length: None,
                    encoding: Encoding::Raw,
                    digest: None,
                })
                .collect(),
        };
        planned.components.sort_by(|a, b| a.role.cmp(&b.role));
        check_object(&planned, self.offset).map_err(refused_argument)?;
        self.out()?; // a broken writer refuses, even a write that would add no byte
        let mut written = Vec::with_capacity(components.len());
        for c in components {
            let component = self.write_component(c, options, progress);
            written.push(component.map_err(|e| self.broken(e))?);
        }
        written.sort_by(|a, b| a.role.cmp(&b.role));
        let object = Object {
            components: written,
            ..planned
        };
        self.push_object(object);
        Ok(())
    }

    fn out(&mut self) -> Result<&mut W> {
        if self.broken {
            return Err(Error::invalid(
                "an earlier write to this file stopped part-way (an error, or cancelled): \
                 the writer cannot go on, and dropping it rolls the file back",
            ));
        }
        self.out
            .as_mut()
            .ok_or_else(|| Error::invalid("the writer is already finished"))
    }

    /// Marks the writer as unusable after a write that stopped part-way (its bytes
    /// are in the file, the offsets are not), and returns the error.
    fn broken(&mut self, e: Error) -> Error {
        self.broken = true;
        e
    }

    fn write_component(
        &mut self,
        c: &ComponentData<'_>,
        options: WriteOptions,
        progress: Progress<'_>,
    ) -> Result<Component> {
        let Some(start) = align_up(self.offset, ALIGNMENT) else {
            return Err(Error::Overflow {
                what: "file offset",
            });
        };
        let pad = (start - self.offset) as usize;
        self.out()?.write_all(&[0u8; ALIGNMENT as usize][..pad])?;
        self.offset = start;
        let mut sink = CountingSink {
            inner: self.out()?,
            digest: DigestState::new(options.checksum),
            written: 0,
        };
        let encoding = match options.compression {
            Compression::Raw => {
                write_in_chunks(c.data, progress, |chunk| Ok(sink.write_all(chunk)?))?;
                Encoding::Raw
            }
            Compression::Zstd(level) => {
                let mut enc = zstd::stream::write::Encoder::new(&mut sink, level)?;
                write_in_chunks(c.data, progress, |chunk| Ok(enc.write_all(chunk)?))?;
                enc.finish()?;
                Encoding::Zstd
            }
        };
        let CountingSink {
            digest, written, ..
        } = sink;
        self.offset += written;
        Ok(Component {
            role: c.role.to_owned().into(),
            dtype: c.dtype,
            logical_type: c.logical_type.map(str::to_owned),
            offset: start,
            length: written,
            uncompressed_length: (encoding == Encoding::Zstd).then_some(c.data.len() as u64),
            encoding,
            digest: digest.finish(),
        })
    }

    /// [`ZtWriter::add_object`] for version 2: the object is checked as the reader
    /// will check it, then its parts are written in name order.
    fn add_object_v2(
        &mut self,
        object: NewObject<'_, '_>,
        options: WriteOptions,
        progress: Progress<'_>,
    ) -> Result<()> {
        let NewObject {
            name,
            shape,
            layout,
            attributes,
            components,
        } = object;
        check_writable_name(name, "object name")?;
        if shape.ndim() > manifest_v2::MAX_RANK {
            return Err(Error::invalid(format!(
                "object `{name}`: rank {} is above {}",
                shape.ndim(),
                manifest_v2::MAX_RANK
            )));
        }
        if options.checksum == Checksum::Crc32c {
            return Err(Error::unsupported(
                "crc32c digests in a .zt 2 file (it records xxh3 or sha256)",
            ));
        }
        if let Some(attributes) = &attributes {
            for (key, value) in attributes {
                check_writable_name(key, "attribute key")?;
                check_writable_nesting(key, value, OBJECT_ATTRIBUTE_NESTING)?;
            }
        }
        let layout = manifest_v2::layout_of(&manifest_v2::layout_id(&layout)?);
        let mut parts: Vec<(Component, &[u8])> = Vec::with_capacity(components.len());
        for c in components {
            check_writable_name(c.role, "part name")?;
            // `bool` is a logical type over `u8` in version 2.
            let (dtype, logical_type) = match (c.dtype, c.logical_type) {
                (DType::Bool, None | Some("bool")) => (DType::U8, Some("bool")),
                (dtype, logical) => (dtype, logical),
            };
            if !dtype.is_primitive() || dtype == DType::Bool {
                return Err(Error::invalid(format!(
                    "component `{}` of `{name}`: {} is not a .zt 2 storage dtype",
                    c.role, c.dtype
                )));
            }
            let encoding = match options.compression {
                Compression::Raw => Encoding::Raw,
                Compression::Zstd(_) => Encoding::ZstdSeekable,
            };
            parts.push((
                Component {
                    role: c.role.to_owned().into(),
                    dtype,
                    logical_type: logical_type.map(str::to_owned),
                    offset: 0,
                    length: c.data.len() as u64,
                    uncompressed_length: (encoding != Encoding::Raw).then_some(c.data.len() as u64),
                    encoding,
                    digest: None,
                },
                c.data,
            ));
        }
        parts.sort_by(|a, b| a.0.role.as_bytes().cmp(b.0.role.as_bytes()));
        if layout == Layout::SparseCsr {
            unsigned_csr_indices(&mut parts);
        }
        let planned = Object {
            name: std::sync::Arc::from(name),
            shape: shape.clone(),
            layout,
            attributes,
            components: parts.iter().map(|(c, _)| c.clone()).collect(),
        };
        manifest_v2::check_object(&planned, self.offset).map_err(refused_argument)?;
        for (c, data) in &parts {
            check_content_v2(&planned, c, data).map_err(refused_argument)?;
        }
        self.out()?; // a broken writer refuses, even a shared or empty blob
        let mut written = Vec::with_capacity(parts.len());
        for (mut c, data) in parts {
            let mut digest = DigestState::new(options.checksum);
            digest.update(data);
            c.digest = digest.finish();
            let placed = match options.compression {
                Compression::Raw => self
                    .write_or_share(data, progress)
                    .map(|offset| (offset, data.len() as u64)),
                Compression::Zstd(level) => self.pad_to_alignment().and_then(|start| {
                    let n = seekable::encode_to(data, level, self.out()?, progress)?;
                    self.offset += n;
                    Ok((start, n))
                }),
            };
            (c.offset, c.length) = placed.map_err(|e| self.broken(e))?;
            written.push(c);
        }
        let object = Object {
            components: written,
            ..planned
        };
        self.push_object(object);
        Ok(())
    }

    /// Pads with zeros to the next multiple of the alignment; returns that offset.
    fn pad_to_alignment(&mut self) -> Result<u64> {
        let Some(start) = align_up(self.offset, self.align) else {
            return Err(Error::Overflow {
                what: "file offset",
            });
        };
        const ZEROS: [u8; 4096] = [0u8; 4096];
        let mut gap = start - self.offset;
        while gap > 0 {
            let n = gap.min(ZEROS.len() as u64) as usize;
            self.out()?.write_all(&ZEROS[..n])?;
            gap -= n as u64;
        }
        self.offset = start;
        Ok(start)
    }

    /// Writes a raw version 2 blob, or returns the offset of an earlier blob with the
    /// very same bytes (as ztensor 2.x shares them). A match on xxh3-128 and length is
    /// confirmed on the bytes themselves: read back from the file being written, or,
    /// for a stream that cannot be read back, by SHA-256.
    fn write_or_share(&mut self, data: &[u8], progress: Progress<'_>) -> Result<u64> {
        let key = (xxhash_rust::xxh3::xxh3_128(data), data.len() as u64);
        let stream = matches!(self.target, Target::Stream);
        let sha = |data: &[u8]| -> [u8; 32] {
            use sha2::Digest as _;
            sha2::Sha256::digest(data).into()
        };
        if let Some(&(offset, sum)) = self.shared.get(&key) {
            let same = match (&self.target, sum) {
                _ if data.is_empty() => true,
                (Target::Create { tmp, .. }, _) => {
                    let tmp = tmp.clone();
                    self.out()?.flush()?;
                    let mut file = File::open(&tmp)?;
                    file.seek(SeekFrom::Start(offset))?;
                    let mut back = vec![0u8; data.len()];
                    file.read_exact(&mut back)?;
                    back == data
                }
                (_, Some(sum)) => sum == sha(data),
                (_, None) => false,
            };
            if same {
                progress(data.len() as u64)?;
                return Ok(offset);
            }
        }
        let start = self.pad_to_alignment()?;
        let out = self.out()?;
        write_in_chunks(data, progress, |chunk| Ok(out.write_all(chunk)?))?;
        self.offset += data.len() as u64;
        let sum = stream.then(|| sha(data));
        self.shared.entry(key).or_insert((start, sum));
        Ok(start)
    }

    /// Records a written object (its name is new: the add checked).
    fn push_object(&mut self, object: Object) {
        self.names.insert(object.name.clone());
        self.manifest.objects.push(object);
    }

    fn write_tail(&mut self) -> Result<u64> {
        // Both versions list objects by name (ztensor's order); names are unique.
        self.manifest
            .objects
            .sort_unstable_by(|a, b| a.name.cmp(&b.name));
        if self.version == ZtVersion::V2 {
            return self.write_tail_v2();
        }
        let cbor = manifest::encode(&self.manifest)?;
        let total = self.offset + cbor.len() as u64 + 16;
        let out = self.out()?;
        out.write_all(&cbor)?;
        out.write_all(&(cbor.len() as u64).to_le_bytes())?;
        out.write_all(MAGIC)?;
        out.flush()?;
        Ok(total)
    }

    /// Version 2 tail: the manifest at the next aligned offset, then the 40-byte
    /// footer (manifest offset, length, XXH3-64 of the manifest, version 2, zero,
    /// magic).
    fn write_tail_v2(&mut self) -> Result<u64> {
        let cbor = manifest_v2::encode(&self.manifest)?;
        if cbor.len() as u64 > V2_MAX_MANIFEST {
            return Err(Error::invalid("the manifest would exceed 1 GiB"));
        }
        let at = self.pad_to_alignment()?;
        let mut footer = [0u8; 40];
        footer[0..8].copy_from_slice(&at.to_le_bytes());
        footer[8..16].copy_from_slice(&(cbor.len() as u64).to_le_bytes());
        footer[16..24].copy_from_slice(&xxhash_rust::xxh3::xxh3_64(&cbor).to_le_bytes());
        footer[24..28].copy_from_slice(&2u32.to_le_bytes());
        footer[32..40].copy_from_slice(MAGIC_V2);
        let out = self.out()?;
        out.write_all(&cbor)?;
        out.write_all(&footer)?;
        out.flush()?;
        self.offset = at + cbor.len() as u64 + footer.len() as u64;
        Ok(self.offset)
    }

    /// Writes the manifest and footer and returns the underlying writer.
    pub fn finish_into(mut self) -> Result<W> {
        self.write_tail()?;
        self.finished = true;
        self.out
            .take()
            .ok_or_else(|| Error::invalid("the writer is already finished"))
    }

    /// Undoes an unfinished write: removes a new file's temporary, restores an
    /// appended file's old manifest and footer.
    fn roll_back(&mut self) {
        drop(self.out.take());
        match &self.target {
            Target::Create { tmp, .. } => tensorwire_core::remove_temporary(tmp),
            Target::Append {
                path,
                old_tail,
                old_tail_at,
            } => {
                if let Ok(mut f) = OpenOptions::new().write(true).open(path) {
                    let _ = f.set_len(*old_tail_at);
                    let _ = f.seek(SeekFrom::Start(*old_tail_at));
                    let _ = f.write_all(old_tail);
                }
            }
            Target::Stream => {}
        }
    }
}

impl ZtWriter<BufWriter<File>> {
    /// Writes the manifest and footer, syncs the file and (for a new file) renames it
    /// into place. Returns the file size.
    pub fn finish(mut self) -> Result<u64> {
        let total = self.write_tail()?;
        let out = self
            .out
            .take()
            .ok_or_else(|| Error::invalid("the writer is already finished"))?;
        let file = out.into_inner().map_err(|e| Error::Io(e.into_error()))?;
        file.sync_all()?;
        drop(file);
        if let Target::Create { tmp, destination } = &self.target {
            tensorwire_core::replace_with_temporary(tmp, destination)?;
        }
        self.finished = true;
        Ok(total)
    }

    /// Abandons the write: a new file is removed, an append is rolled back.
    pub fn discard(mut self) {
        self.roll_back();
        self.finished = true;
    }
}

impl<W: Write> Drop for ZtWriter<W> {
    fn drop(&mut self) {
        if !self.finished {
            self.roll_back();
        }
    }
}

/// Passes bytes through, counting them and feeding the digest.
struct CountingSink<'a, W: Write> {
    inner: &'a mut W,
    digest: DigestState,
    written: u64,
}

impl<W: Write> Write for CountingSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What [`ZtWriter::add_object`] is given to write, handed on to the version 2 path.
struct NewObject<'a, 'd> {
    name: &'a str,
    shape: &'a Shape,
    layout: Layout,
    attributes: Option<BTreeMap<String, Value>>,
    components: &'a [ComponentData<'d>],
}

/// What a reader's object check says of a planned object, as the writer's caller
/// should hear it: an invalid argument, not a malformed file.
fn refused_argument(e: Error) -> Error {
    match e {
        Error::Malformed { reason, .. } => Error::invalid(reason),
        Error::SizeMismatch {
            tensor,
            expected,
            found,
        } => Error::invalid(format!(
            "`{tensor}` needs {expected} bytes, the data has {found}"
        )),
        Error::Decode { tensor, reason, .. } => Error::invalid(format!("`{tensor}`: {reason}")),
        other => other,
    }
}

/// The content rules a version 2 reader checks (`verify`), checked before a byte is
/// written: `bool` bytes are 0 or 1, and an odd count of dense `f4_e2m1` elements
/// leaves the last high nibble zero.
fn check_content_v2(object: &Object, part: &Component, data: &[u8]) -> Result<()> {
    let what = format!("{}/{}", object.name, part.role);
    if part.logical_type.as_deref() == Some("bool") {
        check_bool(data, 0, &what)?;
    }
    check_f4_tail(object, part, data.last().copied(), &what)
}

/// Checks that `.zt` 2 can hold the name (spec §3.5: non-empty, no NUL, at most
/// 1024 bytes). A longer one is `Unsupported`, as for other input the format cannot
/// hold (not `LimitExceeded`, which says a file is bad), named by its start.
fn check_writable_name(name: &str, what: &str) -> Result<()> {
    if name.len() > manifest_v2::MAX_NAME {
        let start: String = name.chars().take(48).collect();
        return Err(Error::unsupported(format!(
            "{what} `{start}…` is {} bytes long; .zt 2 names are at most {} bytes",
            name.len(),
            manifest_v2::MAX_NAME
        )));
    }
    manifest_v2::check_name(name, what, &Limits::default())
}

/// Levels of nested lists and maps a file attribute's value may hold in `.zt` 2: the
/// manifest nests at most [`manifest_v2::MAX_DEPTH`] levels, and such a value sits at
/// level 2 (manifest, `attributes`).
const FILE_ATTRIBUTE_NESTING: usize = manifest_v2::MAX_DEPTH - 2;
/// `zt.sparse_csr/1` keeps `indices` and `indptr` unsigned (`u32` or `u64`), where
/// scipy and ztensor 1.x give `int32` or `int64`: such parts whose values are all
/// non-negative have the bytes of their unsigned type, and are listed as it. (Any
/// other part, or one with a negative value, is left for the layout check to refuse.)
fn unsigned_csr_indices(parts: &mut [(Component, &[u8])]) {
    for (c, data) in parts.iter_mut() {
        if !matches!(&*c.role, "indices" | "indptr") || c.logical_type.is_some() {
            continue;
        }
        let unsigned = match c.dtype {
            DType::I32 => DType::U32,
            DType::I64 => DType::U64,
            _ => continue,
        };
        let width = c.dtype.size().unwrap_or(1);
        // Little-endian: the sign is the top bit of each element's last byte.
        if data.len() % width == 0 && data.chunks_exact(width).all(|e| e[width - 1] < 0x80) {
            c.dtype = unsigned;
        }
    }
}

/// The same for an object's attribute, at level 4 (manifest, `objects`, the object,
/// its `attributes`).
const OBJECT_ATTRIBUTE_NESTING: usize = manifest_v2::MAX_DEPTH - 4;

/// Checks that an attribute value nests at most `max` levels of lists and maps, as a
/// `.zt` 2 manifest can hold (deeper, no reader opens the file): `Unsupported`
/// otherwise, as for other input the format cannot hold.
fn check_writable_nesting(key: &str, value: &Value, max: usize) -> Result<()> {
    /// True when a value sits under more than `left` lists and maps in `value`
    /// (looking at most that deep).
    fn deeper(value: &Value, left: usize) -> bool {
        let below = |v: &Value| left == 0 || deeper(v, left - 1);
        match value {
            Value::List(items) => items.iter().any(below),
            Value::Map(entries) => entries.iter().any(|(_, v)| below(v)),
            _ => false,
        }
    }
    if deeper(value, max) {
        return Err(Error::unsupported(format!(
            "attribute `{key}` nests lists or maps more than {max} levels deep, which a \
             .zt 2 manifest cannot hold (version 1 can)"
        )));
    }
    Ok(())
}
