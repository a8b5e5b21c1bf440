//! The read trait every format reader implements.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::bytes::Bytes;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::strided::StridedView;
use crate::value::Value;

/// The tensor attribute under which a dense tensor records that its bytes are another
/// format's type, kept as raw `u8` (`gguf:Q4_0`, `safetensors:F4`): what `convert`
/// writes into `.zt` for a [`Layout::Other`] tensor, so the layout survives.
pub const SOURCE_LAYOUT_KEY: &str = "tensorwire.layout";

/// How a tensor's elements are laid out in its components.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// One contiguous, row-major array.
    Dense,
    /// Compressed sparse row: values, column indices, row pointers.
    SparseCsr,
    /// Coordinate list: values and coordinates.
    SparseCoo,
    /// Group-wise quantized weights: packed weights, scales, zero points.
    QuantizedGroup,
    /// A layout this version does not interpret, by its name in the file.
    Other(String),
}

impl Layout {
    /// The `.zt` spelling of the layout.
    pub fn name(&self) -> &str {
        match self {
            Layout::Dense => "dense",
            Layout::SparseCsr => "sparse_csr",
            Layout::SparseCoo => "sparse_coo",
            Layout::QuantizedGroup => "quantized_group",
            Layout::Other(s) => s,
        }
    }

    /// Parses the `.zt` spelling; unknown names become [`Layout::Other`].
    pub fn from_name(name: &str) -> Layout {
        match name {
            "dense" => Layout::Dense,
            "sparse_csr" => Layout::SparseCsr,
            "sparse_coo" => Layout::SparseCoo,
            "quantized_group" => Layout::QuantizedGroup,
            other => Layout::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a reader knows about one tensor without touching its data.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name in the file (shared with the reader's own records, so
    /// listing tensors never copies names).
    pub name: Arc<str>,
    /// Element type (the logical type: `complex64`, not its `f32` storage).
    pub dtype: DType,
    /// Logical shape.
    pub shape: Shape,
    /// Layout of the components.
    pub layout: Layout,
    /// Bytes of the decoded dense data (`shape × dtype`); for non-dense layouts, the
    /// sum of the decoded components.
    pub nbytes: u64,
    /// Bytes the tensor occupies in the file (compressed size, all components).
    pub stored_bytes: u64,
    /// File offset of the tensor's first stored byte, for ordering reads.
    pub offset: u64,
    /// Encoding of the stored bytes (`None` = raw).
    pub encoding: Option<String>,
    /// Per-tensor metadata.
    pub attributes: Attributes,
}

impl TensorInfo {
    /// The layout of the tensor's bytes: [`Self::layout`], or for a dense tensor that
    /// records another format's layout under [`SOURCE_LAYOUT_KEY`], that layout.
    pub fn source_layout(&self) -> Layout {
        match (&self.layout, self.attributes.get(SOURCE_LAYOUT_KEY)) {
            (Layout::Dense, Some(Value::Str(name))) => Layout::Other(name.clone()),
            (layout, _) => layout.clone(),
        }
    }

    /// The name of [`Self::source_layout`] when it is another format's
    /// ([`Layout::Other`]), borrowed.
    pub fn source_layout_name(&self) -> Option<&str> {
        match (&self.layout, self.attributes.get(SOURCE_LAYOUT_KEY)) {
            (Layout::Dense, Some(Value::Str(name))) => Some(name),
            (Layout::Other(name), _) => Some(name),
            _ => None,
        }
    }
}

/// Per-tensor metadata: a map shared (not copied) between the tensors that have the
/// same, such as every `F32` tensor of a GGUF file (`{"gguf.type": "F32"}`), and
/// between clones. Reads go through `Deref` to the map; [`Attributes::make_mut`]
/// copies it first when it is shared.
#[derive(Clone, PartialEq)]
pub struct Attributes(Arc<BTreeMap<String, Value>>);

impl Attributes {
    /// The map, writable (copied first when shared).
    pub fn make_mut(&mut self) -> &mut BTreeMap<String, Value> {
        Arc::make_mut(&mut self.0)
    }

    /// The map itself (copied when shared).
    pub fn into_map(self) -> BTreeMap<String, Value> {
        Arc::unwrap_or_clone(self.0)
    }
}

impl Default for Attributes {
    /// No attributes: one empty map for the whole process, so a tensor without
    /// attributes allocates nothing.
    fn default() -> Self {
        static EMPTY: std::sync::OnceLock<Attributes> = std::sync::OnceLock::new();
        EMPTY
            .get_or_init(|| Attributes(Arc::new(BTreeMap::new())))
            .clone()
    }
}

impl std::ops::Deref for Attributes {
    type Target = BTreeMap<String, Value>;

    fn deref(&self) -> &BTreeMap<String, Value> {
        &self.0
    }
}

impl From<BTreeMap<String, Value>> for Attributes {
    fn from(map: BTreeMap<String, Value>) -> Self {
        if map.is_empty() {
            return Attributes::default();
        }
        Attributes(Arc::new(map))
    }
}

impl fmt::Debug for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A dense tensor's bytes with their dtype and shape.
///
/// `bytes` holds the elements in row-major order, little-endian. When `zero_copy` is
/// true they borrow the file's memory (a map), otherwise they are a decoded copy.
#[derive(Debug, Clone)]
pub struct TensorView {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// The elements.
    pub bytes: Bytes,
    /// True when `bytes` borrows the source's memory instead of a decoded buffer.
    pub zero_copy: bool,
}

impl TensorView {
    /// A view, checking that `bytes` holds exactly `shape × dtype` bytes.
    pub fn new(
        name: &str,
        dtype: DType,
        shape: Shape,
        bytes: Bytes,
        zero_copy: bool,
    ) -> Result<TensorView> {
        let expected = shape.byte_len(dtype)?;
        if expected != bytes.len() as u64 {
            return Err(Error::SizeMismatch {
                tensor: name.to_owned(),
                expected,
                found: bytes.len() as u64,
            });
        }
        Ok(TensorView {
            dtype,
            shape,
            bytes,
            zero_copy,
        })
    }
}

/// A readable collection of named tensors: what every format reader provides.
///
/// ```
/// use tensorwire_core::{TensorSource, Result};
/// fn total_bytes(src: &dyn TensorSource) -> u64 {
///     src.tensors().iter().map(|t| t.nbytes).sum()
/// }
/// ```
pub trait TensorSource: Send + Sync {
    /// Short name of the format (`"zt"`, `"zt-0.1"`, `"safetensors"`, …).
    fn format(&self) -> &'static str;

    /// Every tensor, in the reader's canonical order.
    fn tensors(&self) -> &[TensorInfo];

    /// File-level metadata.
    fn attributes(&self) -> &BTreeMap<String, Value>;

    /// The position of `name` in [`Self::tensors`], or [`Error::NotFound`]. Readers
    /// with a name index override this scan.
    fn position(&self, name: &str) -> Result<usize> {
        self.tensors()
            .iter()
            .position(|t| &*t.name == name)
            .ok_or_else(|| Error::NotFound {
                name: name.to_owned(),
            })
    }

    /// The info of one tensor.
    fn info(&self, name: &str) -> Result<&TensorInfo> {
        let position = self.position(name)?;
        Ok(&self.tensors()[position])
    }

    /// The info of the tensor at `position` in [`Self::tensors`]; a position past the
    /// end is [`Error::NotFound`].
    fn info_at(&self, position: usize) -> Result<&TensorInfo> {
        self.tensors()
            .get(position)
            .ok_or_else(|| Error::no_tensor_at(position))
    }

    /// The dense bytes of the tensor at `position` in [`Self::tensors`]: borrowed from
    /// the source when stored raw, decoded otherwise. Blocks a format names but
    /// tensorwire does not decode (GGUF quantized types, safetensors' packed floats:
    /// [`Layout::Other`] with a `u8` dtype) come back as their raw bytes; other
    /// non-dense layouts fail with [`Error::Unsupported`]. A position past the end is
    /// [`Error::NotFound`].
    fn view_at(&self, position: usize) -> Result<TensorView>;

    /// [`Self::view_at`] by name.
    fn view(&self, name: &str) -> Result<TensorView> {
        self.view_at(self.position(name)?)
    }

    /// The tensor at `position` as the file lays it out: its bytes with sizes and
    /// strides (in elements). Sources that store every tensor row-major return
    /// [`Self::view_at`] (strides `None`); torch checkpoints (transposes, slices) and
    /// Fortran-order NumPy arrays return their own strides, zero-copy where `view`
    /// would gather.
    fn strided_at(&self, position: usize) -> Result<StridedView> {
        let view = self.view_at(position)?;
        Ok(StridedView {
            strides: None,
            dtype: view.dtype,
            shape: view.shape,
            bytes: view.bytes,
            zero_copy: view.zero_copy,
        })
    }

    /// [`Self::strided_at`] by name.
    fn strided(&self, name: &str) -> Result<StridedView> {
        self.strided_at(self.position(name)?)
    }

    /// Where the tensor at `position` lies, as a key that orders reads sequentially:
    /// the number of the file it is in (sources of several files, such as a sharded
    /// checkpoint), then its [`TensorInfo::offset`] there. Panics past the end, as
    /// indexing [`Self::tensors`] does.
    fn read_order(&self, position: usize) -> (usize, u64) {
        (0, self.tensors()[position].offset)
    }

    /// Checks the CRC-32 the container stores for the record that the tensor at
    /// `position` lies in (an NPZ member, a ZIP checkpoint's storage record), once per
    /// reader, as `np.load` and `zipfile` do when they read a member. Readers that
    /// take every byte (a conversion, a copy) call it first, so a damaged file is an
    /// error rather than a faithful copy of the damage; zero-copy views skip it and
    /// touch no byte they need not. Sources without such checksums return `Ok(())`
    /// (a `.zt` file's digests are checked on request, by [`Self::verify`]).
    fn check_record_at(&self, position: usize) -> Result<()> {
        let _ = position;
        Ok(())
    }

    /// Checks every stored digest, returning how many were checked. Sources without
    /// digests return `Ok(0)`.
    fn verify(&self) -> Result<usize> {
        Ok(0)
    }

    /// The concrete reader, for format-specific APIs (`downcast_ref::<ZtReader>()`).
    fn as_any(&self) -> &dyn Any;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_shared_until_written() {
        let empty = Attributes::default();
        assert!(empty.is_empty());
        assert!(std::ptr::eq(&*empty, &*Attributes::from(BTreeMap::new())));

        let a = Attributes::from(BTreeMap::from([("k".to_owned(), Value::Int(1))]));
        let mut b = a.clone();
        assert!(std::ptr::eq(&*a, &*b), "a clone shares the map");
        b.make_mut().insert("j".to_owned(), Value::Int(2));
        assert_eq!(a.len(), 1, "writing a shared map copies it first");
        assert_eq!(b.len(), 2);
        assert_ne!(a, b);
        assert_eq!(b.clone().into_map().get("j"), Some(&Value::Int(2)));
        assert_eq!(format!("{a:?}"), r#"{"k": Int(1)}"#);
    }
}
