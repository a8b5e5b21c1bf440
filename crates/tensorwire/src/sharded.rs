//! A checkpoint split over several files (Hugging Face's `model.safetensors.index.json`
//! and `pytorch_model.bin.index.json`), served as one [`TensorSource`].

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tensorwire_core::{
    Error, Result, StridedView, TensorIndex, TensorInfo, TensorSource, TensorView, Value,
};
use tensorwire_formats::gguf::GgufReader;
use tensorwire_formats::shards::ShardIndex;
use tensorwire_mmap::MappedFile;
use tensorwire_zt::ZtReader;

use crate::sniff::{open_file, OpenOptions};

/// A shard's file name and its opened source.
type Shard = (String, Box<dyn TensorSource>);

/// The tensors a shard index lists, read from its shards: each shard is opened (and
/// mapped) as the file it is, and each tensor is served by its shard, zero-copy as that
/// format allows.
///
/// Tensors come shard by shard (in shard-name order), in each shard's own order, as
/// their shards describe them ([`ShardedSource::shard_of`] names a tensor's shard);
/// the index's `metadata` are the source's attributes, with every attribute all shards
/// hold alike (a Hugging Face checkpoint's `format: pt`, which `transformers` asks
/// of a safetensors file) where the index has no such key. Only the tensors the index lists are
/// served: a shard's other tensors are not. A tensor the index lists but its shard
/// lacks, a missing shard, or a shard that is itself an index, fails the open.
pub struct ShardedSource {
    /// Shard file names and their opened sources (sorted by name for an index, in
    /// split order for GGUF splits).
    shards: Vec<Shard>,
    /// The folder the shards are in (for naming them in errors).
    folder: PathBuf,
    /// For each tensor: its shard's position in `shards`, and its position there.
    places: Vec<(usize, usize)>,
    index: TensorIndex,
    attributes: BTreeMap<String, Value>,
}

/// `attributes` (the index's metadata) plus each attribute every shard holds with
/// one value, where `attributes` has no such key: what a file merged from the shards
/// should carry (a safetensors shard's `format: pt`, without which `transformers`
/// refuses the merged file).
fn with_common_shard_attributes(
    mut attributes: BTreeMap<String, Value>,
    shards: &[Shard],
) -> BTreeMap<String, Value> {
    let Some(((_, first), rest)) = shards.split_first() else {
        return attributes;
    };
    for (key, value) in first.attributes() {
        if !attributes.contains_key(key)
            && rest
                .iter()
                .all(|(_, shard)| shard.attributes().get(key) == Some(value))
        {
            attributes.insert(key.clone(), value.clone());
        }
    }
    attributes
}

impl std::fmt::Debug for ShardedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedSource")
            .field("shards", &self.shard_names().collect::<Vec<_>>())
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl ShardedSource {
    /// Opens the shard index at `path` and every shard it names (files in the same
    /// folder), with `options` for each shard.
    pub fn open(path: impl AsRef<Path>, options: &OpenOptions) -> Result<ShardedSource> {
        let path = path.as_ref();
        let text = MappedFile::open_bytes(path, options.map_mode)?;
        ShardedSource::from_index(path, &text, options)
    }

    /// Opens the shards named by the index `text`, read from the file at `path`.
    pub(crate) fn from_index(
        path: &Path,
        text: &[u8],
        options: &OpenOptions,
    ) -> Result<ShardedSource> {
        let index = ShardIndex::parse(text, &options.limits).map_err(|e| e.with_path(path))?;
        let folder = path.parent().unwrap_or_else(|| Path::new("."));
        let shards = index
            .shards()
            .iter()
            .map(|name| Ok((name.clone(), open_file(&folder.join(name), options, false)?)))
            .collect::<Result<Vec<_>>>()?;
        // Each listed tensor's place in its shard; then, shard by shard, the listed
        // tensors in the shard's own order.
        let mut places = Vec::with_capacity(index.tensors().len());
        for (name, shard) in index.tensors() {
            let (shard_name, source) = &shards[*shard];
            let at = source.position(name).map_err(|e| {
                // A name the shard holds but cannot serve (a PyTorch shard's tensor on
                // the meta device, which has no data) says so; a missing one is the
                // index's fault.
                let e = match e.root() {
                    Error::Unsupported { .. } => e,
                    _ => Error::malformed(
                        0,
                        format!(
                            "the shard index puts `{name}` in `{shard_name}`, which has no \
                             such tensor"
                        ),
                    ),
                };
                e.with_path(path)
            })?;
            places.push((*shard, at));
        }
        places.sort_unstable();
        let attributes = with_common_shard_attributes(index.metadata().clone(), &shards);
        ShardedSource::new(path, shards, places, attributes, options)
    }

    /// The source serving, in order, the tensors at `places` (shard, position there)
    /// of `shards`; `path` is the index or first split, named in errors.
    fn new(
        path: &Path,
        shards: Vec<Shard>,
        places: Vec<(usize, usize)>,
        attributes: BTreeMap<String, Value>,
        options: &OpenOptions,
    ) -> Result<ShardedSource> {
        let in_path = |e: Error| e.with_path(path);
        Error::check_limit(
            "tensor count",
            places.len() as u64,
            options.limits.max_tensors,
        )
        .map_err(in_path)?;
        let mut index = TensorIndex::with_capacity(places.len());
        for &(shard, at) in &places {
            index
                .push(shards[shard].1.info_at(at)?.clone())
                .map_err(in_path)?;
        }
        Ok(ShardedSource {
            shards,
            folder: path.parent().map(Path::to_owned).unwrap_or_default(),
            places,
            index,
            attributes,
        })
    }

    /// The GGUF file `first`, opened from `path`: when it is the first of the splits
    /// llama.cpp's `gguf-split` (or gguf-py with `split_max_tensors` /
    /// `split_max_size`) writes, named `<prefix>-00001-of-<count>.gguf`, the whole
    /// model, read from every split; otherwise `first` itself.
    ///
    /// Each split must be a GGUF file in the same folder whose `split.no` and
    /// `split.count` say it is that split of that set; together they must hold
    /// `split.tensors.count` distinct tensors. The source's attributes are the first
    /// split's (the model's metadata) without the `split.*` keys; tensors come split
    /// by split.
    pub(crate) fn gguf_splits(
        path: &Path,
        first: Box<dyn TensorSource>,
        options: &OpenOptions,
    ) -> Result<Box<dyn TensorSource>> {
        let (Some(0), Some(count)) = (
            split_key(&*first, "split.no"),
            split_key(&*first, "split.count"),
        ) else {
            return Ok(first);
        };
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return Ok(first);
        };
        let suffix = format!("-00001-of-{count:05}.gguf");
        // llama.cpp stores the count as a u16; a larger one names no real set.
        let Some(prefix) = name
            .strip_suffix(&suffix)
            .filter(|_| (2..=u64::from(u16::MAX)).contains(&count))
        else {
            return Ok(first);
        };
        let folder = path.parent().unwrap_or_else(|| Path::new("."));
        // The model's metadata, without the keys that describe the split files: the
        // joined source (and a file converted from it) is not split.
        let mut attributes = first.attributes().clone();
        attributes.retain(|key, _| !SPLIT_KEYS.contains(&key.as_str()));
        let expected = split_key(&*first, "split.tensors.count");
        // Not sized by `count`: the file says it, and a missing split stops the loop.
        let mut shards = vec![(name.to_owned(), first)];
        for number in 1..count {
            let split_name = format!("{prefix}-{:05}-of-{count:05}.gguf", number + 1);
            let split_path = folder.join(&split_name);
            let split = open_file(&split_path, options, false)?;
            let says = (
                split.format(),
                split_key(&*split, "split.no"),
                split_key(&*split, "split.count"),
            );
            if says != ("gguf", Some(number), Some(count)) {
                return Err(Error::malformed(
                    0,
                    format!(
                        "not split {} of the {count} of `{name}` (its split.no and split.count say otherwise)",
                        number + 1
                    ),
                )
                .with_path(split_path));
            }
            shards.push((split_name, split));
        }
        let places: Vec<(usize, usize)> = shards
            .iter()
            .enumerate()
            .flat_map(|(shard, (_, source))| (0..source.tensors().len()).map(move |at| (shard, at)))
            .collect();
        if let Some(expected) = expected.filter(|&n| n != places.len() as u64) {
            return Err(Error::malformed(
                0,
                format!(
                    "the splits hold {} tensors, but split.tensors.count says {expected}",
                    places.len()
                ),
            )
            .with_path(path));
        }
        let joined = ShardedSource::new(path, shards, places, attributes, options)?;
        Ok(Box::new(joined))
    }

    /// The shard file names: sorted for an index, in split order for GGUF splits.
    pub fn shard_names(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().map(|(name, _)| name.as_str())
    }

    /// The path of every shard file, in [`ShardedSource::shard_names`] order.
    pub fn shard_paths(&self) -> impl Iterator<Item = PathBuf> + '_ {
        self.shards.iter().map(|(name, _)| self.folder.join(name))
    }

    /// The opened shard called `name` (a file name from the index).
    pub fn shard(&self, name: &str) -> Option<&dyn TensorSource> {
        self.shards
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, source)| &**source)
    }

    /// The file name of the shard holding tensor `name`.
    pub fn shard_of(&self, name: &str) -> Result<&str> {
        let (shard, _) = self.places[self.index.position(name)?];
        Ok(&self.shards[shard].0)
    }

    /// The shard holding the tensor at `position`, and the tensor's position there.
    fn place(&self, position: usize) -> Result<(&dyn TensorSource, usize)> {
        let &(shard, at) = self
            .places
            .get(position)
            .ok_or_else(|| Error::no_tensor_at(position))?;
        Ok((&*self.shards[shard].1, at))
    }
}

/// The `.zt` reader that holds tensor `name` of `source`: the source itself, or the
/// shard of an index that holds it; `None` for other formats. For what only `.zt`
/// files say of a tensor (its object, its logical type).
pub fn zt_holding<'a>(source: &'a dyn TensorSource, name: &str) -> Option<&'a ZtReader> {
    let any = source.as_any();
    if let Some(zt) = any.downcast_ref::<ZtReader>() {
        return Some(zt);
    }
    let sharded = any.downcast_ref::<ShardedSource>()?;
    let shard = sharded.shard(sharded.shard_of(name).ok()?)?;
    shard.as_any().downcast_ref::<ZtReader>()
}

/// The GGUF keys that describe a split file rather than the model.
const SPLIT_KEYS: [&str; 3] = ["split.no", "split.count", "split.tensors.count"];

/// A non-negative integer attribute of a GGUF split (`split.no`, `split.count`),
/// read without decoding the rest of its metadata.
fn split_key(source: &dyn TensorSource, key: &str) -> Option<u64> {
    let value = match source.as_any().downcast_ref::<GgufReader>() {
        Some(gguf) => gguf.metadata_value(key)?,
        None => source.attributes().get(key)?.clone(),
    };
    match value {
        Value::Int(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

impl TensorSource for ShardedSource {
    fn format(&self) -> &'static str {
        "sharded"
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

    fn read_order(&self, position: usize) -> (usize, u64) {
        let (shard, _) = self.places[position];
        (shard, self.index.at(position).offset)
    }

    fn view_at(&self, position: usize) -> Result<TensorView> {
        let (shard, at) = self.place(position)?;
        shard.view_at(at)
    }

    fn strided_at(&self, position: usize) -> Result<StridedView> {
        let (shard, at) = self.place(position)?;
        shard.strided_at(at)
    }

    fn check_record_at(&self, position: usize) -> Result<()> {
        let (shard, at) = self.place(position)?;
        shard.check_record_at(at)
    }

    /// Checks every shard's digests (only those the shards' formats carry).
    fn verify(&self) -> Result<usize> {
        self.shards.iter().try_fold(0, |checked, (name, source)| {
            let shard_checked = source
                .verify()
                .map_err(|e| e.with_path(self.folder.join(name)))?;
            Ok(checked + shard_checked)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
