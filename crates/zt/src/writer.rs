//! Writing `.zt` 1.2 files.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tensorwire_core::{align_up, DType, Error, Layout, Limits, Result, Shape, Value};

use crate::digest::{Checksum, DigestState};
use crate::manifest::{self, Component, Encoding, Manifest, Object};
use crate::reader::{check_object, ZtReader, ZtVersion};
use crate::{ALIGNMENT, MAGIC, WRITE_VERSION};

/// How a component is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored raw (zero-copy readable).
    #[default]
    Raw,
    /// zstd at the given level (1–22; ztensor's `compress=True` is level 3).
    Zstd(i32),
}

/// Per-tensor write options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOptions {
    /// Compression of each component.
    pub compression: Compression,
    /// Digest recorded for each component (over the stored bytes).
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
    Create { tmp: PathBuf, path: PathBuf },
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

/// Writes a `.zt` 1.2 file: blobs first, manifest and footer on [`ZtWriter::finish`].
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
pub struct ZtWriter<W: Write> {
    out: Option<W>,
    target: Target,
    manifest: Manifest,
    offset: u64,
    finished: bool,
}

impl ZtWriter<BufWriter<File>> {
    /// Creates a new file at `path` (replacing any file there when finished).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let file_name = path
            .file_name()
            .ok_or_else(|| Error::invalid(format!("not a file path: {}", path.display())))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let file = File::create(&tmp).map_err(|e| Error::from(e).with_path(&tmp))?;
        let mut w = ZtWriter::start(BufWriter::with_capacity(1 << 20, file))?;
        w.target = Target::Create { tmp, path };
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
        if reader.version() != ZtVersion::V1 {
            return Err(Error::unsupported("appending to a 0.1 file").with_path(&path));
        }
        let len = reader.bytes().len() as u64;
        let manifest_len = u64::from_le_bytes(
            reader.bytes()[len as usize - 16..len as usize - 8]
                .try_into()
                .map_err(|_| Error::malformed(len, "footer"))?,
        );
        let tail_at = len - 16 - manifest_len;
        let old_tail = reader.bytes()[tail_at as usize..].to_vec();
        let mut manifest = Manifest {
            version: WRITE_VERSION.to_owned(),
            attributes: tensorwire_core::TensorSource::attributes(&reader).clone(),
            objects: reader.objects().to_vec(),
        };
        manifest.objects.sort_by(|a, b| a.name.cmp(&b.name));
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
        })
    }
}

impl<W: Write> ZtWriter<W> {
    /// Starts a file on any writer (the header is written now).
    pub fn new(out: W) -> Result<Self> {
        ZtWriter::start(out)
    }

    fn start(mut out: W) -> Result<Self> {
        out.write_all(MAGIC)?;
        Ok(ZtWriter {
            out: Some(out),
            target: Target::Stream,
            manifest: Manifest {
                version: WRITE_VERSION.to_owned(),
                ..Manifest::default()
            },
            offset: MAGIC.len() as u64,
            finished: false,
        })
    }

    /// Sets the file-level attributes.
    pub fn set_attributes(&mut self, attributes: BTreeMap<String, Value>) {
        self.manifest.attributes = attributes;
    }

    /// True when a tensor of that name has been written (or existed, when appending).
    pub fn contains(&self, name: &str) -> bool {
        self.manifest.objects.iter().any(|o| &*o.name == name)
    }

    /// Adds a dense tensor of `dtype` and `shape` from its little-endian bytes. Logical
    /// types are stored as ztensor does (`complex64` as `f32` pairs with
    /// `type: complex64`, float8 as `u8` with its `type`).
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
        let expected = shape.byte_len(dtype)?;
        if expected != data.len() as u64 {
            return Err(Error::SizeMismatch {
                tensor: name.to_owned(),
                expected,
                found: data.len() as u64,
            });
        }
        let (storage, _) = dtype.storage();
        if !storage.is_primitive()
            || matches!(
                dtype,
                DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
            )
        {
            return Err(Error::unsupported(format!("dtype {dtype} in a .zt file")));
        }
        let logical = (storage != dtype).then(|| dtype.name());
        self.add_object(
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
        check_object(&planned, self.offset).map_err(|e| match e {
            Error::Malformed { reason, .. } => Error::invalid(reason),
            other => other,
        })?;
        let mut written = Vec::with_capacity(components.len());
        for c in components {
            written.push(self.write_component(c, options)?);
        }
        written.sort_by(|a, b| a.role.cmp(&b.role));
        let object = Object {
            components: written,
            ..planned
        };
        let at = self
            .manifest
            .objects
            .binary_search_by(|o| (*o.name).cmp(name))
            .unwrap_or_else(|i| i);
        self.manifest.objects.insert(at, object);
        Ok(())
    }

    fn out(&mut self) -> Result<&mut W> {
        self.out
            .as_mut()
            .ok_or_else(|| Error::invalid("the writer is already finished"))
    }

    fn write_component(
        &mut self,
        c: &ComponentData<'_>,
        options: WriteOptions,
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
                sink.write_all(c.data)?;
                Encoding::Raw
            }
            Compression::Zstd(level) => {
                let mut enc = zstd::stream::write::Encoder::new(&mut sink, level)?;
                enc.write_all(c.data)?;
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

    fn write_tail(&mut self) -> Result<u64> {
        let cbor = manifest::encode(&self.manifest)?;
        let total = self.offset + cbor.len() as u64 + 16;
        let out = self.out()?;
        out.write_all(&cbor)?;
        out.write_all(&(cbor.len() as u64).to_le_bytes())?;
        out.write_all(MAGIC)?;
        out.flush()?;
        Ok(total)
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
            Target::Create { tmp, .. } => {
                let _ = fs::remove_file(tmp);
            }
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
        if let Target::Create { tmp, path } = &self.target {
            fs::rename(tmp, path).map_err(|e| Error::from(e).with_path(path))?;
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
