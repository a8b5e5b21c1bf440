//! A checkpoint split over several files (Hugging Face's `model.safetensors.index.json`
//! and `pytorch_model.bin.index.json`), served as one [`TensorSource`].

use std::any::Any;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use tensorwire_core::{
    Error, Result, StridedView, TensorIndex, TensorInfo, TensorSource, TensorView, Value,
};
use tensorwire_formats::shards::ShardIndex;

use crate::sniff::{open_file, OpenOptions};

/// The tensors a shard index lists, read from its shards: each shard is opened (and
/// mapped) as the file it is, and each tensor is served by its shard, zero-copy as that
/// format allows.
///
/// Tensors come shard by shard (in shard-name order), in each shard's own order, as
/// their shards describe them ([`ShardedSource::shard_of`] names a tensor's shard);
/// the index's `metadata` are the source's attributes. Only the tensors the index lists are
/// served: a shard's other tensors are not. A tensor the index lists but its shard
/// lacks, a missing shard, or a shard that is itself an index, fails the open.
pub struct ShardedSource {
    /// Shard file names (sorted) and their opened sources.
    shards: Vec<(String, Box<dyn TensorSource>)>,
    /// The folder the shards are in (for naming them in errors).
    folder: PathBuf,
    /// For each tensor: its shard's position in `shards`, and its position there.
    places: Vec<(usize, usize)>,
    index: TensorIndex,
    attributes: BTreeMap<String, Value>,
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
        let text = read_capped(path, options.limits.max_metadata_bytes)?;
        let index = ShardIndex::parse(&text, &options.limits).map_err(|e| e.with_path(path))?;
        let folder = path.parent().unwrap_or_else(|| Path::new("."));
        let shards = index
            .shards()
            .iter()
            .map(|name| Ok((name.clone(), open_file(&folder.join(name), options, false)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut source = ShardedSource::assemble(&index, shards).map_err(|e| e.with_path(path))?;
        source.folder = folder.to_owned();
        Ok(source)
    }

    /// Builds the source from a parsed index and its opened shards (in
    /// `index.shards()` order).
    fn assemble(
        index: &ShardIndex,
        shards: Vec<(String, Box<dyn TensorSource>)>,
    ) -> Result<ShardedSource> {
        // Each listed tensor's place in its shard; then, shard by shard, the listed
        // tensors in the shard's own order.
        let mut places = Vec::with_capacity(index.tensors().len());
        for (name, shard) in index.tensors() {
            let (shard_name, source) = &shards[*shard];
            let at = source.position(name).map_err(|_| {
                Error::malformed(
                    0,
                    format!(
                        "the shard index puts `{name}` in `{shard_name}`, which has no such tensor"
                    ),
                )
            })?;
            places.push((*shard, at));
        }
        places.sort_unstable();
        let mut tensors = TensorIndex::with_capacity(places.len());
        for &(shard, at) in &places {
            tensors.push(shards[shard].1.info_at(at)?.clone())?;
        }
        Ok(ShardedSource {
            shards,
            folder: PathBuf::new(),
            places,
            index: tensors,
            attributes: index.metadata().clone(),
        })
    }

    /// The shard file names, sorted.
    pub fn shard_names(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().map(|(name, _)| name.as_str())
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

/// Reads a whole (small) file, refusing one longer than `max` bytes.
fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>> {
    let in_path = |e: std::io::Error| Error::from(e).with_path(path);
    let file = std::fs::File::open(path).map_err(in_path)?;
    let len = file.metadata().map_err(in_path)?.len();
    Error::check_limit("shard index size", len, max).map_err(|e| e.with_path(path))?;
    let mut text = Vec::with_capacity(len as usize);
    file.take(max.saturating_add(1))
        .read_to_end(&mut text)
        .map_err(in_path)?;
    Error::check_limit("shard index size", text.len() as u64, max)
        .map_err(|e| e.with_path(path))?;
    Ok(text)
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

    /// Checks every shard's digests (only those the shards' formats carry).
    fn verify(&self) -> Result<usize> {
        self.shards.iter().try_fold(0, |checked, (name, source)| {
            let path_less = source.verify().map_err(|e| e.with_path(Path::new(name)))?;
            Ok(checked + path_less)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
