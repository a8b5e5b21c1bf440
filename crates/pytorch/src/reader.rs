//! [`PtReader`]: a PyTorch checkpoint as a [`TensorSource`].

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use tensorwire_core::strided::{row_major_strides, swap_bytes};
use tensorwire_core::{
    AlignedBuf, Bytes, Error, Layout, Limits, NameMap, Result, StridedView, TensorIndex,
    TensorInfo, TensorSource, TensorView, Value,
};
use tensorwire_mmap::{MapMode, MappedFile};
use tensorwire_range::{RangeFile, RangeRead};

use crate::flatten::{flatten, structure, Node};
use crate::input::Input;
use crate::legacy::{self, LegacyStorage};
use crate::pickle::{self, Arena, Id, PersistentLoad, PickleLimits};
use crate::sparse::SparseTensor;
use crate::tensor::{MetaTensor, Quantization, StorageRef, TensorRecord, TorchOnlyDType};
use crate::zip::{self, Method, ZipArchive, ZipDirectory, ZipEntry};

/// Which container a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtFormat {
    /// The ZIP archive of torch ≥ 1.6.
    Zip,
    /// The legacy sequence of pickles followed by raw storages.
    Legacy,
}

/// How [`PtReader`] finds a storage's bytes.
#[derive(Debug, Clone)]
enum StorageData {
    /// A ZIP record: its index in the reader's archive.
    Zip(usize),
    /// A legacy storage; `counted` is set once its 8-byte element count has been
    /// checked against the pickle, so later reads skip that read.
    Legacy {
        storage: LegacyStorage,
        counted: OnceLock<()>,
    },
}

/// A PyTorch checkpoint (`.pt`, `.pth`, `.bin` from `torch.save`), read without Python
/// and without running any code from the file.
///
/// Opening runs the checkpoint's pickle on a machine that only builds values (see
/// [`crate::pickle`]) and checks every tensor's extent against its storage; tensors
/// are then read on demand: zero-copy slices of the map for contiguous tensors of a
/// mapped little-endian file, a gathered (and, for big-endian files, byte-swapped)
/// copy otherwise.
pub struct PtReader {
    input: Input,
    index: TensorIndex,
    records: Vec<TensorRecord>,
    /// `(position, first position)` for each tensor that is the very object pickled
    /// earlier under another name (memoized), in position order.
    same_objects: Vec<(usize, usize)>,
    storages: NameMap<Arc<str>, StorageData>,
    attributes: BTreeMap<String, Value>,
    /// The sparse tensors, by name (their parts are tensors of `index`).
    sparse: Vec<(Arc<str>, SparseTensor)>,
    /// The meta tensors (not in `index`: they hold no data), and their names.
    meta: Vec<MetaEntry>,
    meta_names: std::collections::HashSet<Arc<str>>,
    little_endian: bool,
    limits: Limits,
    /// The ZIP container (ZIP files only: `None` is a legacy checkpoint).
    zip: Option<ZipParts>,
}

/// A tensor of the checkpoint on torch's meta device ([`PtReader::meta_tensors`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MetaEntry {
    /// Its flat name (distinct from every tensor's and attribute's).
    pub name: Arc<str>,
    /// Its dtype, sizes, strides and flags.
    pub tensor: MetaTensor,
    /// How many of the listed tensors ([`TensorSource::tensors`]) come before it in
    /// the checkpoint's order.
    pub position: usize,
    /// The earlier entry that is the very same pickled object (a tied meta weight
    /// under a second name), which `torch.load` gives as one object.
    pub same_as: Option<usize>,
}

/// What a ZIP checkpoint's reader keeps of the archive.
#[derive(Debug)]
struct ZipParts {
    /// Where each storage's record lies, and each record's CRC for `verify`.
    archive: ZipArchive,
    /// The index of the `data.pkl` record, run again by [`PtReader::structure`]
    /// (rather than keeping every object for the reader's lifetime).
    pickle: usize,
}

impl ZipParts {
    /// Checks record `index` against its CRC-32 once, by `check` (which computes and
    /// compares it). A zero CRC is not checked: torch writes zeros when its CRCs are
    /// switched off (`torch.serialization.set_crc32_options(False)`), as
    /// [`ZipArchive::verify`] is told.
    fn check_crc(&self, index: usize, check: impl FnOnce(&ZipEntry) -> Result<()>) -> Result<()> {
        let entry = &self.archive.entries()[index];
        if entry.crc32 == 0 {
            return Ok(());
        }
        entry.check_once(check)
    }
}

impl std::fmt::Debug for PtReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtReader")
            .field("format", &self.pt_format())
            .field("input", &self.input)
            .field("tensors", &self.index.len())
            .finish()
    }
}

/// Records from which a checkpoint's local headers are offered to a helper thread
/// while its pickle runs: with fewer, both take a few microseconds.
const HELPER_MIN_RECORDS: usize = 32;

/// Collects the storages a ZIP checkpoint's pickle names, each with its record.
struct ZipStorages<'a> {
    directory: &'a ZipDirectory,
    prefix: &'a str,
    /// Each storage met so far: its size in bytes and the index of its record.
    seen: NameMap<Arc<str>, (u64, usize)>,
    /// Scratch for record names (`<prefix>data/<key>`), reused across storages.
    record: String,
}

impl PersistentLoad for ZipStorages<'_> {
    fn load(&mut self, arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef> {
        let storage = StorageRef::from_persistent_id(arena, pid, offset)?;
        let nbytes = storage.nbytes()?;
        if let Some(&(known, _)) = self.seen.get(&storage.key) {
            if known != nbytes {
                return Err(Error::malformed(
                    offset,
                    format!("storage `{}` is declared with two sizes", storage.key),
                ));
            }
        } else {
            let record = &mut self.record;
            record.clear();
            record.push_str(self.prefix);
            record.push_str("data/");
            record.push_str(&storage.key);
            let missing =
                || Error::malformed(offset, format!("no record `{record}` for a storage"));
            let index = self.directory.index_of(record).ok_or_else(missing)?;
            let size = self.directory.size(index).ok_or_else(missing)?;
            // Exactly, as torch requires: a record holding more than its storage
            // declares means the storage class or count is not the one written.
            if size != nbytes {
                return Err(Error::SizeMismatch {
                    tensor: record.clone(),
                    expected: nbytes,
                    found: size,
                });
            }
            self.seen.insert(storage.key.clone(), (nbytes, index));
        }
        Ok(storage)
    }
}

/// Storages of an object pickle run again: they were checked when the file opened.
struct AnyStorage;

impl PersistentLoad for AnyStorage {
    fn load(&mut self, arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef> {
        StorageRef::from_persistent_id(arena, pid, offset)
    }
}

/// Fails unless every tensor leaf of `node` is a tensor of `index`.
fn check_leaves(
    node: &Node,
    index: &TensorIndex,
    meta_names: &std::collections::HashSet<Arc<str>>,
) -> Result<()> {
    let changed = |name: &str| {
        Error::malformed(
            0,
            format!("the checkpoint changed since it was opened: `{name}`"),
        )
    };
    for name in node.tensor_names() {
        index.position(name).map_err(|_| changed(name))?;
    }
    for name in node.meta_names() {
        if !meta_names.contains(name) {
            return Err(changed(name));
        }
    }
    Ok(())
}

/// The folder (with its trailing `/`) that holds `data.pkl`: torch names it after the
/// file's stem or `archive`, so it is found rather than assumed.
fn archive_prefix<'a>(names: impl Iterator<Item = &'a str>) -> Result<String> {
    let mut candidates = names
        .filter_map(|name| name.strip_suffix("data.pkl"))
        .filter(|p| p.ends_with('/') && p.matches('/').count() == 1);
    let first = candidates.next().ok_or_else(|| {
        Error::malformed(
            0,
            "zip archive has no `<folder>/data.pkl`: not a torch checkpoint",
        )
    })?;
    if candidates.next().is_some() {
        return Err(Error::malformed(
            0,
            "zip archive has more than one `<folder>/data.pkl`",
        ));
    }
    Ok(first.to_owned())
}

impl PtReader {
    /// Maps `path` privately (copy-on-write) and opens it with default limits.
    pub fn open(path: impl AsRef<Path>) -> Result<PtReader> {
        PtReader::open_with(path, MapMode::CopyOnWrite, &Limits::default())
    }

    /// Maps `path` in `mode` for tensor bytes; metadata (the ZIP directory and
    /// headers, the pickle) is read with positional reads, cheaper than first touches
    /// of pages scattered over the map.
    pub fn open_with(path: impl AsRef<Path>, mode: MapMode, limits: &Limits) -> Result<PtReader> {
        let path = path.as_ref();
        let file = Arc::new(RangeFile::open(path)?);
        let map = MappedFile::open_bytes(path, mode)?;
        Input::mapped_with_file(map, file)
            .and_then(|input| PtReader::from_input(input, limits))
            .map_err(|e| e.with_path(path))
    }

    /// Opens `path` for positional reads: nothing is mapped, and each tensor read
    /// reads only its own byte range.
    pub fn open_ranged(path: impl AsRef<Path>, limits: &Limits) -> Result<PtReader> {
        let path = path.as_ref();
        let file = Arc::new(RangeFile::open(path)?);
        PtReader::from_range(file, limits).map_err(|e| e.with_path(path))
    }

    /// Opens a checkpoint image already in memory (a map, a shm segment, a buffer).
    pub fn from_bytes(bytes: Bytes, limits: &Limits) -> Result<PtReader> {
        PtReader::from_input(Input::mapped(bytes), limits)
    }

    /// Opens a checkpoint read through `file`'s positional reads.
    pub fn from_range(file: Arc<dyn RangeRead>, limits: &Limits) -> Result<PtReader> {
        PtReader::from_input(Input::ranged(file), limits)
    }

    /// Opens a checkpoint read through `input` (see [`Input`]: a map, a file, or a map
    /// plus the file for metadata reads).
    pub fn from_input(input: Input, limits: &Limits) -> Result<PtReader> {
        let head = input.read_meta_up_to(0, 32)?;
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            PtReader::open_zip(input, limits)
        } else if legacy::sniff(&head) {
            PtReader::open_legacy(input, limits)
        } else {
            Err(Error::BadMagic {
                offset: 0,
                expected: "a torch checkpoint (ZIP `PK\\x03\\x04` or a legacy pickle)",
                found: head[..head.len().min(8)].to_vec(),
            })
        }
    }

    fn pickle_limits(limits: &Limits) -> PickleLimits {
        let default = PickleLimits::default();
        PickleLimits {
            max_objects: default
                .max_objects
                .max(limits.max_tensors.saturating_mul(16) as usize),
            ..default
        }
    }

    fn open_zip(input: Input, limits: &Limits) -> Result<PtReader> {
        let directory = ZipDirectory::read(
            &input,
            limits.max_tensors.saturating_add(1024),
            limits.max_name_bytes,
        )?;
        let prefix = archive_prefix(directory.names())?;
        let pkl_index = directory
            .index_of(&format!("{prefix}data.pkl"))
            .expect("found by archive_prefix");
        let order_index = directory.index_of(&format!("{prefix}byteorder"));
        // The pickle and the byte order are needed now; every other record's local
        // header is read below, offered to a helper thread while the pickle runs.
        let first: Vec<usize> = std::iter::once(pkl_index).chain(order_index).collect();
        let first = directory.locate(&input, &first, 0)?;
        let pkl_entry = directory.located(&first[0])?;
        Error::check_limit("data.pkl size", pkl_entry.size, limits.max_metadata_bytes)?;
        let pkl = zip::read_entry(&input, &pkl_entry, limits.max_metadata_bytes, true)?;
        let little_endian = match first.get(1) {
            None => true,
            Some(location) => {
                let entry = directory.located(location)?;
                let order = zip::read_entry(&input, &entry, 16, true)?;
                match order.as_slice() {
                    b"little" => true,
                    b"big" => false,
                    other => {
                        return Err(Error::malformed(
                            entry.data_offset,
                            format!("byteorder record is {:?}", String::from_utf8_lossy(other)),
                        ))
                    }
                }
            }
        };
        let rest: Vec<usize> = (0..directory.len())
            .filter(|i| *i != pkl_index && Some(*i) != order_index)
            .collect();
        let directory = Arc::new(directory);
        let mut storages = ZipStorages {
            directory: &directory,
            prefix: &prefix,
            seen: NameMap::with_capacity_and_hasher(rest.len(), Default::default()),
            record: String::new(),
        };
        let run_pickle = |storages: &mut ZipStorages<'_>| {
            pickle::unpickle(
                &pkl,
                pkl_entry.data_offset,
                &Self::pickle_limits(limits),
                storages,
            )
        };
        let (unpickled, located) = if rest.len() < HELPER_MIN_RECORDS {
            let unpickled = run_pickle(&mut storages);
            (unpickled, directory.locate(&input, &rest, 0))
        } else {
            let (directory, input) = (Arc::clone(&directory), input.clone());
            tensorwire_core::helpers::join(
                || run_pickle(&mut storages),
                move || directory.locate(&input, &rest, 0),
            )
        };
        // A broken container is the more basic fault: report it first.
        let located = located?;
        let unpickled = unpickled?;
        let seen = storages.seen;
        let directory = Arc::try_unwrap(directory).unwrap_or_else(|shared| (*shared).clone());
        let archive = directory.into_archive(first.into_iter().chain(located))?;
        let data = seen
            .into_iter()
            .map(|(key, (_, index))| (key, StorageData::Zip(index)))
            .collect();
        PtReader::build(
            input,
            Some(ZipParts {
                archive,
                pickle: pkl_index,
            }),
            &unpickled.arena,
            unpickled.root,
            data,
            little_endian,
            limits,
        )
    }

    fn open_legacy(input: Input, limits: &Limits) -> Result<PtReader> {
        let parsed = legacy::parse(
            &input,
            &Self::pickle_limits(limits),
            limits.max_metadata_bytes,
        )?;
        let data = parsed
            .storages
            .iter()
            .map(|(k, s)| {
                let data = StorageData::Legacy {
                    storage: *s,
                    counted: OnceLock::new(),
                };
                (k.clone(), data)
            })
            .collect();
        PtReader::build(
            input,
            None,
            &parsed.object.arena,
            parsed.object.root,
            data,
            parsed.little_endian,
            limits,
        )
    }

    /// The reader of a checkpoint whose pickle made `arena`: a ZIP checkpoint (with
    /// its `archive`) or a legacy one (without).
    fn build(
        input: Input,
        zip: Option<ZipParts>,
        arena: &Arena,
        root: Id,
        storages: NameMap<Arc<str>, StorageData>,
        little_endian: bool,
        limits: &Limits,
    ) -> Result<PtReader> {
        let flat = flatten(arena, root, limits.depth(), limits.max_tensors)?;
        // Each part of a sparse tensor carries the tensor's layout and size: the
        // positions of the parts, in order, with their tensor's attributes.
        let mut sparse_parts = flat
            .sparse
            .iter()
            .flat_map(|&(_, sparse, first_part)| {
                let attributes = tensorwire_core::Attributes::from(sparse.attributes());
                let parts = first_part..first_part + sparse.parts.len();
                parts.map(move |at| (at, attributes.clone()))
            })
            .peekable();
        let mut index = TensorIndex::with_capacity(flat.tensors.len());
        let mut records = Vec::with_capacity(flat.tensors.len());
        // One pickled object reached under several names is one arena record: the
        // same address (sorted, so no hashing on the open path).
        let same_objects = same_keys(
            flat.tensors
                .iter()
                .map(|(_, record)| std::ptr::from_ref::<TensorRecord>(record)),
        );
        for (at, (name, record)) in flat.tensors.into_iter().enumerate() {
            Error::check_limit(
                "tensor name length",
                name.len() as u64,
                limits.max_name_bytes as u64,
            )?;
            let data = storages.get(&record.storage.key).ok_or_else(|| {
                Error::malformed(0, format!("storage `{}` has no data", record.storage.key))
            })?;
            let (start, end) = record.byte_extent()?;
            let (data_offset, deflated) = match data {
                StorageData::Zip(i) => {
                    let entry = zip_entry(&zip, *i);
                    (entry.data_offset, entry.method == Method::Deflated)
                }
                StorageData::Legacy { storage, .. } => (storage.data_offset, false),
            };
            let base = data_offset + record.storage.window()?.0;
            let mut attributes = match sparse_parts.next_if(|&(part, _)| part == at) {
                Some((_, of_sparse)) => of_sparse,
                None => quantization_attributes(&name, record),
            };
            if record.has_lazy_signs() {
                attributes.make_mut().extend(record.sign_attributes());
            }
            // What the stored bytes are: deflated, and a lazy view's conjugates or
            // negatives of the values.
            let encoding = match (deflated, record.sign_encoding()) {
                (false, None) => None,
                (true, None) => Some("deflate".to_owned()),
                (false, Some(signs)) => Some(signs.to_owned()),
                (true, Some(signs)) => Some(format!("deflate+{signs}")),
            };
            index.push(TensorInfo {
                name,
                dtype: record.dtype,
                shape: record.shape.clone(),
                layout: record
                    .torch_only
                    .map_or(Layout::Dense, TorchOnlyDType::layout),
                nbytes: record.shape.byte_len(record.dtype)?,
                stored_bytes: end - start,
                offset: base + start,
                encoding,
                attributes,
            })?;
            records.push(record.clone());
        }
        let mut meta: Vec<MetaEntry> = Vec::with_capacity(flat.meta.len());
        // One pickled object reached under several names: the same arena address.
        let mut first_of = std::collections::HashMap::new();
        for (at, (name, tensor, position)) in flat.meta.iter().enumerate() {
            Error::check_limit(
                "tensor name length",
                name.len() as u64,
                limits.max_name_bytes as u64,
            )?;
            let first = *first_of
                .entry(std::ptr::from_ref::<MetaTensor>(tensor))
                .or_insert(at);
            let same_as = (first != at).then_some(first);
            meta.push(MetaEntry {
                name: Arc::clone(name),
                tensor: (*tensor).clone(),
                position: *position,
                same_as,
            });
        }
        Ok(PtReader {
            input,
            records,
            same_objects,
            index,
            storages,
            attributes: flat.attributes,
            sparse: flat
                .sparse
                .into_iter()
                .map(|(name, sparse, _)| (name, sparse.clone()))
                .collect(),
            meta_names: meta.iter().map(|m| Arc::clone(&m.name)).collect(),
            meta,
            little_endian,
            limits: *limits,
            zip,
        })
    }

    /// The checkpoint object as `torch.load` builds it (dicts, `OrderedDict`s, lists,
    /// tuples, sets, scalars), each tensor named as in [`TensorSource::tensors`]:
    /// what a caller needs to rebuild the nested object (an optimizer's state with
    /// its int keys, a training checkpoint's `epoch`) instead of the flat view.
    ///
    /// The pickle runs again (the objects are not kept after opening), so this costs
    /// about what opening did. A tensor leaf the flat view lacks (the file changed
    /// since it was opened) is an error.
    pub fn structure(&self) -> Result<Node> {
        let limits = Self::pickle_limits(&self.limits);
        let object = match &self.zip {
            Some(zip) => {
                let entry = &zip.archive.entries()[zip.pickle];
                let pkl =
                    zip::read_entry(&self.input, entry, self.limits.max_metadata_bytes, true)?;
                pickle::unpickle(&pkl, entry.data_offset, &limits, &mut AnyStorage)?
            }
            None => legacy::parse(&self.input, &limits, self.limits.max_metadata_bytes)?.object,
        };
        let tree = structure(&object.arena, object.root, self.limits.depth())?;
        check_leaves(&tree, &self.index, &self.meta_names)?;
        Ok(tree)
    }

    /// The container format.
    pub fn pt_format(&self) -> PtFormat {
        if self.zip.is_some() {
            PtFormat::Zip
        } else {
            PtFormat::Legacy
        }
    }

    /// False for checkpoints written on a big-endian machine (read with byte swaps).
    pub fn is_little_endian(&self) -> bool {
        self.little_endian
    }

    /// The torch description of a tensor: storage, offset, sizes and strides.
    pub fn record(&self, name: &str) -> Result<&TensorRecord> {
        self.position(name).map(|i| &self.records[i])
    }

    /// Every tensor's record, in the order of [`TensorSource::tensors`].
    pub fn records(&self) -> &[TensorRecord] {
        &self.records
    }

    /// Positions of the tensors that do not have a storage to themselves: another
    /// tensor (or storage view) lies on the same stored storage, or the tensor covers
    /// only part of it, or it is a lazy conjugate or negative view
    /// ([`TensorRecord::has_lazy_signs`]: torch's tensor lies on the stored
    /// elements, with its bit set). For a tensor not listed, a view of just its bytes
    /// is all of its storage, as `torch.load` makes it; the listed ones need their
    /// whole storage to match torch (one storage for all its tensors, with their
    /// offsets and bits).
    pub fn partial_storages(&self) -> Vec<usize> {
        let n = self.records.len();
        let mut whole = Vec::with_capacity(n);
        // A stored storage is known by where its bytes start in the input: the
        // tensor's start less its offset into its storage and, for a legacy storage
        // view, less the view's start in its root (distinct records, distinct starts).
        let mut storage_starts = Vec::with_capacity(n);
        for (r, info) in self.records.iter().zip(self.index.infos()) {
            let extent = r.byte_extent().ok();
            let nbytes = r.storage.nbytes().ok();
            // (The offset, not the extent's start: an empty tensor's extent is kept
            // inside its storage, its offset is torch's.)
            whole.push(
                !r.has_lazy_signs()
                    && r.storage.view.is_none()
                    && r.storage_offset == 0
                    && extent.is_some_and(|(_, end)| Some(end) == nbytes),
            );
            let into_root = extent.map_or(0, |(start, _)| start)
                + r.storage.window().map_or(0, |(start, _)| start);
            storage_starts.push(info.offset.saturating_sub(into_root));
        }
        let mut shared = vec![false; n];
        for (at, first) in same_keys(storage_starts) {
            shared[at] = true;
            shared[first] = true;
        }
        (0..n).filter(|&i| shared[i] || !whole[i]).collect()
    }

    /// Positions of the tensors that are parts of a per-channel quantized tensor (its
    /// scales and zero points, named by [`Quantization::part_name`]): tensors of the
    /// flat view, but not leaves of [`PtReader::structure`], where they belong to
    /// their tensor.
    pub fn quantization_parts(&self) -> Vec<usize> {
        let mut parts = Vec::new();
        for (record, info) in self.records.iter().zip(self.index.infos()) {
            if let Some(Quantization::PerChannel { .. }) = record.quantization.as_deref() {
                for suffix in [Quantization::SCALES, Quantization::ZERO_POINTS] {
                    // `flatten` named them so, or the open failed.
                    let part = self.position(&Quantization::part_name(&info.name, suffix));
                    debug_assert!(part.is_ok(), "a part of `{}`", info.name);
                    parts.extend(part.ok());
                }
            }
        }
        parts
    }

    /// The tensors on torch's meta device, in the checkpoint's order: each has a
    /// dtype, sizes and strides but no data, so [`TensorSource::tensors`] does not
    /// list it (viewing one by name is [`Error::Unsupported`], saying so).
    pub fn meta_tensors(&self) -> &[MetaEntry] {
        &self.meta
    }

    /// The sparse tensors, by name, in the order the pickle lists them. A sparse
    /// tensor's parts (its indices and values) are tensors of the flat view, named by
    /// [`SparseTensor::part_names`], each with the per-tensor attributes
    /// [`SparseTensor::attributes`].
    pub fn sparse_tensors(&self) -> &[(Arc<str>, SparseTensor)] {
        &self.sparse
    }

    /// `(position, first position)` for every tensor that is the same pickled object
    /// as an earlier one (`{"embed": t, "lm_head": t}`: `torch.load` gives one tensor
    /// object under both names), in position order. Tensors that merely share a
    /// storage are not listed.
    pub fn same_objects(&self) -> &[(usize, usize)] {
        &self.same_objects
    }

    /// All of the stored storage that `record`'s tensor lies in (a legacy view's whole
    /// root storage), in this machine's byte order, with a flag saying whether it
    /// borrows the input: what `torch.load` hands a `map_location` function, and
    /// what the tensor lies in at its [`TensorRecord::stored_byte_offset`].
    ///
    /// For big-endian files it is a copy swapped in units of the storage's element
    /// type, or of the tensor's for an untyped (byte) storage, where torch leaves the
    /// bytes as stored (`uint16` and the other types without a storage class).
    ///
    /// These are the stored elements, as torch's storage holds them: those of a lazy
    /// conjugate or negative view are its values' conjugates or negatives
    /// ([`TensorRecord::resolve_signs`] turns them into its values).
    pub fn storage_bytes(&self, record: &TensorRecord) -> Result<(Bytes, bool)> {
        let storage = &record.storage;
        let (bytes, borrowed) = self.storage_range(&storage.key, 0, storage.nbytes()?)?;
        if self.little_endian {
            return Ok((bytes, borrowed));
        }
        let unit = if storage.dtype.bits() == 8 {
            record.dtype
        } else {
            storage.dtype
        };
        let mut copy = AlignedBuf::copy_from(&bytes)?;
        swap_bytes(copy.as_mut_slice(), unit);
        Ok((copy.into_bytes(), false))
    }

    /// The mapped input's bytes of tensor `position`'s extent (from its first element
    /// to its last), where [`TensorSource::strided_at`] lends them: a ZIP record stored
    /// as is, in a mapped little-endian checkpoint, without lazy signs. `None` where
    /// that view would be a copy (or `position` is past the last tensor). Cheaper than
    /// `strided_at`: it builds no view.
    pub fn in_place_extent(&self, position: usize) -> Option<Bytes> {
        let record = self.records.get(position)?;
        if !self.little_endian || record.has_lazy_signs() {
            return None;
        }
        // Only a stored record: a deflated one would be inflated to be looked at.
        match self.storages.get(&*record.storage.key)? {
            StorageData::Zip(i) if zip_entry(&self.zip, *i).method != Method::Deflated => {}
            _ => return None,
        }
        let (bytes, borrowed) = self.stored_extent(record).ok()?;
        borrowed.then_some(bytes)
    }

    /// The bytes of the stored storage `key`, from `start` to `end` (relative to the
    /// storage's first byte), with a flag saying whether they borrow the input.
    fn storage_range(&self, key: &str, start: u64, end: u64) -> Result<(Bytes, bool)> {
        let data = self
            .storages
            .get(key)
            .ok_or_else(|| Error::malformed(0, format!("storage `{key}` has no data")))?;
        match data {
            StorageData::Zip(i) => {
                let entry = zip_entry(&self.zip, *i);
                if entry.method == Method::Deflated {
                    let all =
                        zip::read_entry(&self.input, entry, self.limits.max_decoded_bytes, false)?;
                    // Inflated whole anyway: its CRC costs little beside that.
                    zip_parts(&self.zip).check_crc(*i, |entry| entry.check_crc32(&all))?;
                    Ok((all.slice_at(start, end - start)?, false))
                } else {
                    Ok((
                        self.input.read(entry.data_offset + start, end - start)?,
                        self.input.is_mapped(),
                    ))
                }
            }
            StorageData::Legacy { storage, counted } => {
                self.check_count(key, storage, counted)?;
                Ok((
                    self.input.read(storage.data_offset + start, end - start)?,
                    self.input.is_mapped(),
                ))
            }
        }
    }

    /// Checks a legacy storage's 8-byte element count once.
    fn check_count(
        &self,
        key: &str,
        storage: &LegacyStorage,
        counted: &OnceLock<()>,
    ) -> Result<()> {
        if counted.get().is_none() {
            legacy::check_prefix(&self.input, key, storage, self.little_endian)?;
            let _ = counted.set(());
        }
        Ok(())
    }

    /// The stored bytes of the extent of tensor `name` (before any byte swap), and
    /// whether they borrow the input; a CRC mismatch of the record they are read
    /// from names the tensor.
    fn extent(&self, name: &str, record: &TensorRecord) -> Result<(Bytes, bool)> {
        self.stored_extent(record)
            .map_err(|e| naming_tensor_record(e, name))
    }

    /// [`PtReader::extent`], its errors naming the record only.
    fn stored_extent(&self, record: &TensorRecord) -> Result<(Bytes, bool)> {
        let (start, end) = record.byte_extent()?;
        let window = record.storage.window()?.0;
        self.storage_range(&record.storage.key, window + start, window + end)
    }

    /// Checks every storage: legacy element counts and, for ZIP files, each record's
    /// CRC-32. Returns how many CRC-32s were checked (0 for a legacy file).
    fn verify_all(&self) -> Result<usize> {
        if let Some(zip) = &self.zip {
            return zip
                .archive
                .verify(&self.input, self.limits.max_decoded_bytes, true);
        }
        // A legacy file has no digests: its storages' element counts are checked, and
        // no digest is counted for them.
        for (key, data) in &self.storages {
            if let StorageData::Legacy { storage, counted } = data {
                self.check_count(key, storage, counted)?;
            }
        }
        Ok(0)
    }
}

/// The per-tensor attributes of the tensor `name`: a quantized tensor's scheme and
/// parameters ([`Quantization::attributes`]), none for the others (a lazy view's bits
/// are added by the caller: [`TensorRecord::sign_attributes`]).
fn quantization_attributes(name: &str, record: &TensorRecord) -> tensorwire_core::Attributes {
    match &record.quantization {
        None => Default::default(),
        Some(q) => q.attributes(name).into(),
    }
}

/// `error`, naming the tensor `name` when it is `Unsupported`.
fn naming_tensor(error: Error, name: &str) -> Error {
    match error {
        Error::Unsupported { what } => Error::unsupported(format!("tensor `{name}`: {what}")),
        other => other,
    }
}

/// `error`, naming the tensor `name` too when it is a CRC mismatch of the ZIP record
/// holding its storage, which names just the record (`archive/data/0`): the tensor
/// is what the user asked for.
fn naming_tensor_record(error: Error, name: &str) -> Error {
    match error {
        Error::DigestMismatch {
            tensor: record,
            algorithm,
            expected,
            found,
        } if record != name => Error::DigestMismatch {
            tensor: format!("{name} (zip record {record})"),
            algorithm,
            expected,
            found,
        },
        other => other,
    }
}

/// A ZIP checkpoint's archive (which every ZIP storage is a record of).
fn zip_parts(zip: &Option<ZipParts>) -> &ZipParts {
    zip.as_ref().expect("a ZIP checkpoint keeps its archive")
}

/// Record `index` of a ZIP checkpoint's archive.
fn zip_entry(zip: &Option<ZipParts>, index: usize) -> &ZipEntry {
    &zip_parts(zip).archive.entries()[index]
}

impl TensorSource for PtReader {
    fn format(&self) -> &'static str {
        match self.pt_format() {
            PtFormat::Zip => "pytorch-zip",
            PtFormat::Legacy => "pytorch-legacy",
        }
    }

    fn tensors(&self) -> &[TensorInfo] {
        self.index.infos()
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        &self.attributes
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.index.position(name).map_err(|e| {
            if self.meta_names.contains(name) {
                Error::unsupported(format!(
                    "reading tensor `{name}`, which is on torch's meta device: it has a \
                     dtype and shape but no data (tensorwire.pytorch.load gives it as a \
                     meta tensor)"
                ))
            } else {
                e
            }
        })
    }

    /// Contiguous tensors of a mapped little-endian file come back zero-copy; strided
    /// ones (transposes, slices, `expand`) as a row-major copy, and so do lazy
    /// conjugate and negative views, with their values (`Unsupported` where torch
    /// cannot negate the dtype either: [`TensorRecord::resolve_signs`]).
    fn view_at(&self, position: usize) -> Result<TensorView> {
        let name = &self.index.checked_at(position)?.name;
        let record = &self.records[position];
        let (bytes, borrowed) = self.extent(name, record)?;
        let shape = record.shape.clone();
        if record.is_contiguous() && self.little_endian && !record.has_lazy_signs() {
            return TensorView::new(name, record.dtype, shape, bytes, borrowed);
        }
        if borrowed {
            // A copy of the map's bytes: its record's CRC first, as for every copy.
            self.check_record_at(position)?;
        }
        // One copy: gathered into row-major order (or copied as is), then swapped in
        // place for big-endian files and given a lazy view's signs.
        let mut out = if record.is_contiguous() {
            AlignedBuf::copy_from(&bytes)?
        } else {
            record.gather(&bytes, self.limits.max_decoded_bytes)?
        };
        if !self.little_endian {
            swap_bytes(out.as_mut_slice(), record.dtype);
        }
        record
            .resolve_signs(out.as_mut_slice())
            .map_err(|e| naming_tensor(e, name))?;
        TensorView::new(name, record.dtype, shape, out.into_bytes(), false)
    }

    /// The tensor as torch lays it out: the bytes its strides reach, with its sizes
    /// and strides (a transpose or slice stays strided; strides come whenever they are
    /// not those of a new row-major tensor, so also the free strides of size-1
    /// dimensions and empty tensors). Zero-copy for a mapped little-endian file with
    /// the storage stored raw; for big-endian files the bytes are a byte-swapped copy,
    /// and for a lazy conjugate or negative view a copy holding its values.
    fn strided_at(&self, position: usize) -> Result<StridedView> {
        let name = &self.index.checked_at(position)?.name;
        let record = &self.records[position];
        let (bytes, borrowed) = self.extent(name, record)?;
        let (bytes, zero_copy) = if self.little_endian && !record.has_lazy_signs() {
            (bytes, borrowed)
        } else {
            if borrowed {
                self.check_record_at(position)?; // a copy: its record's CRC first
            }
            let mut copy = AlignedBuf::copy_from(&bytes)?;
            if !self.little_endian {
                swap_bytes(copy.as_mut_slice(), record.dtype);
            }
            // The extent starts and ends at whole elements: all of them get the signs
            // (those between the tensor's, which its strides skip, too).
            record
                .resolve_signs(copy.as_mut_slice())
                .map_err(|e| naming_tensor(e, name))?;
            (copy.into_bytes(), false)
        };
        Ok(StridedView {
            dtype: record.dtype,
            shape: record.shape.clone(),
            strides: (*record.strides != *row_major_strides(record.shape.dims()))
                .then(|| record.strides.to_vec()),
            bytes,
            zero_copy,
        })
    }

    /// The CRC-32 of the ZIP record holding the tensor's storage (all of it, once per
    /// reader), which `torch.load` itself does not check. A deflated record is
    /// checked by the reads that inflate it; a legacy checkpoint has no checksums
    /// (its storages' element counts are checked by every read).
    fn check_record_at(&self, position: usize) -> Result<()> {
        self.index.checked_at(position)?;
        let key = &self.records[position].storage.key;
        let Some(StorageData::Zip(i)) = self.storages.get(key) else {
            return Ok(());
        };
        if zip_entry(&self.zip, *i).method == Method::Stored {
            let max = self.limits.max_decoded_bytes;
            let name = &self.index.checked_at(position)?.name;
            zip_parts(&self.zip)
                .check_crc(*i, |entry| entry.check_stored_data(&self.input, max))
                .map_err(|e| naming_tensor_record(e, name))?;
        }
        Ok(())
    }

    fn verify(&self) -> Result<usize> {
        self.verify_all()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `(position, first position)` for each key equal to an earlier one, in position
/// order: a sort, not a hash map (this runs on every open).
fn same_keys<K: Ord + Copy>(keys: impl IntoIterator<Item = K>) -> Vec<(usize, usize)> {
    let mut sorted: Vec<(K, usize)> = keys.into_iter().zip(0..).collect();
    sorted.sort_unstable();
    let mut pairs: Vec<(usize, usize)> = sorted
        .chunk_by(|a, b| a.0 == b.0)
        .flat_map(|group| group[1..].iter().map(move |&(_, at)| (at, group[0].1)))
        .collect();
    pairs.sort_unstable();
    pairs
}
