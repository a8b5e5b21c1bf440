//! [`TensorIndex`]: a reader's tensor list with lookup by name.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::source::TensorInfo;

/// A hash map for names read from files: foldhash, seeded per process, is several
/// times faster than the standard SipHash on short keys, and the readers' count
/// limits bound what a file crafted against it could cost.
pub type NameMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set with the hasher of [`NameMap`].
pub type NameSet<K> = HashSet<K, foldhash::fast::RandomState>;

/// The tensors a reader lists, in its canonical order, with a name → position index:
/// what every [`TensorSource`](crate::TensorSource) implementation keeps, so
/// `tensors()` and `info()` are one line each and a position also indexes the
/// reader's own per-tensor records.
#[derive(Debug, Clone, Default)]
pub struct TensorIndex {
    infos: Vec<TensorInfo>,
    by_name: NameMap<Arc<str>, usize>,
}

impl TensorIndex {
    /// An empty index with room for `n` tensors.
    pub fn with_capacity(n: usize) -> TensorIndex {
        TensorIndex {
            infos: Vec::with_capacity(n),
            by_name: NameMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Appends a tensor, returning its position; a name already listed is an
    /// [`Error::Duplicate`].
    pub fn push(&mut self, info: TensorInfo) -> Result<usize> {
        // A refused duplicate leaves the index as it was.
        let at = self.infos.len();
        match self.by_name.entry(Arc::clone(&info.name)) {
            Entry::Occupied(_) => Err(Error::Duplicate {
                name: info.name.to_string(),
            }),
            Entry::Vacant(slot) => {
                slot.insert(at);
                self.infos.push(info);
                Ok(at)
            }
        }
    }

    /// The position of `name`, or [`Error::NotFound`].
    pub fn position(&self, name: &str) -> Result<usize> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| Error::NotFound {
                name: name.to_owned(),
            })
    }

    /// The info of `name`, or [`Error::NotFound`].
    pub fn get(&self, name: &str) -> Result<&TensorInfo> {
        self.position(name).map(|i| &self.infos[i])
    }

    /// Every tensor, in the order they were pushed.
    pub fn infos(&self) -> &[TensorInfo] {
        &self.infos
    }

    /// The info at a position returned by [`TensorIndex::position`].
    pub fn at(&self, position: usize) -> &TensorInfo {
        &self.infos[position]
    }

    /// The info at `position`, or [`Error::NotFound`] past the end.
    pub fn checked_at(&self, position: usize) -> Result<&TensorInfo> {
        self.infos
            .get(position)
            .ok_or_else(|| Error::no_tensor_at(position))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.infos.len()
    }

    /// True when no tensor is listed.
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::{DType, Layout, Shape};

    fn info(name: &str) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: DType::U8,
            shape: Shape::scalar(),
            layout: Layout::Dense,
            nbytes: 1,
            stored_bytes: 1,
            offset: 0,
            encoding: None,
            attributes: Default::default(),
        }
    }

    #[test]
    fn finds_by_name_and_refuses_duplicates() {
        let mut index = TensorIndex::with_capacity(2);
        assert_eq!(index.push(info("a")).unwrap(), 0);
        assert_eq!(index.push(info("b")).unwrap(), 1);
        assert!(matches!(
            index.push(info("a")),
            Err(Error::Duplicate { .. })
        ));
        assert_eq!(index.len(), 2);
        assert_eq!(index.position("b").unwrap(), 1);
        assert_eq!(&*index.get("a").unwrap().name, "a");
        assert!(matches!(index.get("c"), Err(Error::NotFound { .. })));
    }
}
