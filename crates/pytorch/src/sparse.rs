//! Sparse tensors (`torch._utils._rebuild_sparse_tensor`): a layout, a size, and the
//! dense tensors that hold the indices and values.
//!
//! tensorwire keeps a sparse tensor as its parts, each an ordinary tensor of the flat
//! view named after the torch method that returns it (`adj.indices`, `adj.values`;
//! `m.crow_indices`, `m.col_indices`, `m.values`). The checks here are the ones on
//! dtypes and shapes, which make the parts fit together; the index values themselves
//! (in range, sorted, coalesced) are what torch checks when it builds the tensor
//! (`check_invariants`, as `torch.load` does after loading).

use std::collections::BTreeMap;

use tensorwire_core::{DType, Dims, Error, Result, Value};

use crate::flatten::flat_name;
use crate::globals::{bad_args, Global};
use crate::pickle::{Arena, Id, Obj};
use crate::tensor::{dims_of, TensorRecord};

/// A sparse layout, as `torch.layout` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseLayout {
    /// `torch.sparse_coo`: `indices` (sparse dims × nnz) and `values`.
    Coo,
    /// `torch.sparse_csr`: compressed rows.
    Csr,
    /// `torch.sparse_csc`: compressed columns.
    Csc,
    /// `torch.sparse_bsr`: compressed rows of blocks.
    Bsr,
    /// `torch.sparse_bsc`: compressed columns of blocks.
    Bsc,
}

impl SparseLayout {
    /// Every layout.
    pub const ALL: [SparseLayout; 5] = [
        SparseLayout::Coo,
        SparseLayout::Csr,
        SparseLayout::Csc,
        SparseLayout::Bsr,
        SparseLayout::Bsc,
    ];

    /// torch's name (`torch.sparse_coo`).
    pub fn name(self) -> &'static str {
        match self {
            SparseLayout::Coo => "torch.sparse_coo",
            SparseLayout::Csr => "torch.sparse_csr",
            SparseLayout::Csc => "torch.sparse_csc",
            SparseLayout::Bsr => "torch.sparse_bsr",
            SparseLayout::Bsc => "torch.sparse_bsc",
        }
    }

    /// The layout torch names `name`.
    pub fn from_name(name: &str) -> Option<SparseLayout> {
        Self::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The parts, in the order `_rebuild_sparse_tensor` takes them, named after the
    /// torch methods that return them.
    pub fn parts(self) -> &'static [&'static str] {
        match self {
            SparseLayout::Coo => &["indices", "values"],
            SparseLayout::Csr | SparseLayout::Bsr => &["crow_indices", "col_indices", "values"],
            SparseLayout::Csc | SparseLayout::Bsc => &["ccol_indices", "row_indices", "values"],
        }
    }

    fn blocked(self) -> bool {
        matches!(self, SparseLayout::Bsr | SparseLayout::Bsc)
    }
}

/// A sparse tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTensor {
    /// The layout.
    pub layout: SparseLayout,
    /// The tensor's size (`t.size()`; its element count may exceed what a dense
    /// tensor could hold).
    pub size: Dims,
    /// `t.is_coalesced()` as saved (COO tensors of torch ≥ 1.13; `None` otherwise).
    pub is_coalesced: Option<bool>,
    /// The parts, in the order of [`SparseLayout::parts`].
    pub parts: Vec<TensorRecord>,
    /// Pickled as an `nn.Parameter` (`_rebuild_parameter`), which `torch.load`
    /// returns as one, with this `requires_grad`.
    pub parameter: Option<bool>,
}

impl SparseTensor {
    /// Per-tensor attribute naming a part's sparse layout (`torch.sparse_coo`).
    pub const LAYOUT_ATTRIBUTE: &'static str = "torch.layout";

    /// Builds the sparse tensor of `_rebuild_sparse_tensor(layout, data)`: `data` is
    /// `(indices, values, size[, is_coalesced])` for COO and `(compressed_indices,
    /// plain_indices, values, size)` for the compressed layouts.
    pub fn from_rebuild(arena: &Arena, layout: Id, data: Id, offset: u64) -> Result<SparseTensor> {
        let bad = |reason: String| bad_args(Global::RebuildSparseTensor.name(), offset, reason);
        let layout = match arena.get(layout) {
            Obj::Global(g) => SparseLayout::from_name(g.name()),
            _ => None,
        }
        .ok_or_else(|| bad("the layout is not a sparse layout".into()))?;
        let items = arena
            .items(data)
            .ok_or_else(|| bad("the data is not a tuple".into()))?;
        let n_parts = layout.parts().len();
        let (parts, size, coalesced) = match (layout, items.len()) {
            (SparseLayout::Coo, 3) => (&items[..2], items[2], None),
            (SparseLayout::Coo, 4) => (&items[..2], items[2], Some(items[3])),
            (_, 4) if n_parts == 3 => (&items[..3], items[3], None),
            (_, n) => return Err(bad(format!("{n} items of {} data", layout.name()))),
        };
        let parts = parts
            .iter()
            .zip(layout.parts())
            .map(|(&id, role)| match arena.get(id) {
                Obj::Tensor(t) => match (t.torch_only, &t.quantization) {
                    (Some(dtype), _) => Err(Error::unsupported(format!(
                        "sparse tensors of torch.{}",
                        dtype.name()
                    ))),
                    (None, None) => Ok((**t).clone()),
                    (None, Some(_)) => Err(bad(format!("{role}: a quantized tensor"))),
                },
                other => Err(bad(format!("{role}: a {}, not a tensor", other.kind()))),
            })
            .collect::<Result<Vec<_>>>()?;
        let is_coalesced = match coalesced.map(|id| arena.get(id)) {
            None | Some(Obj::None) => None,
            Some(Obj::Bool(b)) => Some(*b),
            Some(other) => return Err(bad(format!("is_coalesced is a {}", other.kind()))),
        };
        let size = dims_of(arena, size, "sparse size", offset)?;
        // torch multiplies the sizes in order, refusing a product past i64 (a later
        // zero does not save it).
        let numel = size.as_slice().iter().try_fold(1u64, |n, &d| {
            n.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
        });
        if numel.is_none() {
            return Err(bad(format!(
                "size {:?}: its element count does not fit i64",
                size.as_slice()
            )));
        }
        let tensor = SparseTensor {
            layout,
            size,
            is_coalesced,
            parts,
            parameter: None,
        };
        tensor.check_shapes().map_err(bad)?;
        Ok(tensor)
    }

    /// The dtype and shape rules torch's constructors apply, so that the parts fit
    /// the size.
    fn check_shapes(&self) -> std::result::Result<(), String> {
        let size = self.size.as_slice();
        let values = self.parts.last().expect("every layout has values");
        let values_dims = values.shape.dims();
        if values_dims.is_empty() {
            return Err("values: a 0-d tensor".into());
        }
        if self.layout == SparseLayout::Coo {
            let indices = self.parts[0].shape.dims();
            // torch takes int32 indices too (and converts them).
            if !matches!(self.parts[0].dtype, DType::I64 | DType::I32) {
                return Err(format!(
                    "indices are {}, not i64 or i32",
                    self.parts[0].dtype
                ));
            }
            let [sparse_dims, nnz] = indices[..] else {
                return Err(format!("indices of shape {indices:?}, not 2-d"));
            };
            if nnz != values_dims[0] {
                return Err(format!("{nnz} indices but {} values", values_dims[0]));
            }
            let sparse_dims = usize::try_from(sparse_dims).unwrap_or(usize::MAX);
            let dense = &values_dims[1..];
            if sparse_dims.checked_add(dense.len()) != Some(size.len())
                || size[sparse_dims..] != *dense
            {
                return Err(format!(
                    "{sparse_dims} sparse dimensions and values of shape {values_dims:?} \
                     do not make size {size:?}"
                ));
            }
            return Ok(());
        }
        let (compressed, plain) = (&self.parts[0], &self.parts[1]);
        if !matches!(compressed.dtype, DType::I32 | DType::I64) || plain.dtype != compressed.dtype {
            return Err(format!(
                "compressed and plain indices are {} and {}, not both i32 or both i64",
                compressed.dtype, plain.dtype
            ));
        }
        let (compressed, plain) = (compressed.shape.dims(), plain.shape.dims());
        let batch = compressed
            .len()
            .checked_sub(1)
            .ok_or("0-d compressed indices")?;
        let block = if self.layout.blocked() { 2 } else { 0 };
        let dense = values_dims
            .len()
            .checked_sub(batch + 1 + block)
            .ok_or_else(|| {
                format!("values of shape {values_dims:?} for {batch} batch dimensions")
            })?;
        let nnz = plain.last().copied().unwrap_or(0);
        if plain.len() != compressed.len()
            || compressed[..batch] != plain[..batch]
            || values_dims[..batch] != plain[..batch]
            || size.get(..batch) != Some(&compressed[..batch])
            || values_dims[batch] != nnz
            || size.len() != batch + 2 + dense
            || values_dims[batch + 1 + block..] != size[batch + 2..]
        {
            return Err(format!(
                "indices of shapes {compressed:?} and {plain:?} and values of shape \
                 {values_dims:?} do not make size {size:?}"
            ));
        }
        // Blocks tile the rows and columns; one more compressed index than rows
        // (CSR/BSR) or columns (CSC/BSC), counted in blocks.
        let (block_rows, block_cols) = if self.layout.blocked() {
            (values_dims[batch + 1], values_dims[batch + 2])
        } else {
            (1, 1)
        };
        let (rows, cols) = (size[batch], size[batch + 1]);
        if block_rows == 0 || block_cols == 0 || rows % block_rows != 0 || cols % block_cols != 0 {
            return Err(format!(
                "size {size:?} is not made of blocks of {block_rows} × {block_cols}"
            ));
        }
        let (compressed_axis, count) =
            if matches!(self.layout, SparseLayout::Csc | SparseLayout::Bsc) {
                ("columns", cols / block_cols)
            } else {
                ("rows", rows / block_rows)
            };
        if compressed[batch] != count + 1 {
            return Err(format!(
                "{} compressed indices for {count} {compressed_axis} (of blocks)",
                compressed[batch]
            ));
        }
        Ok(())
    }

    /// The flat names of the parts of the sparse tensor `name`, in the order of
    /// [`SparseLayout::parts`], joined as the flat view joins names (`adj.indices`;
    /// under the empty key, `indices`).
    pub fn part_names(&self, name: &str) -> Vec<String> {
        let parts = self.layout.parts().iter();
        parts.map(|part| flat_name(name, part)).collect()
    }

    /// The per-tensor attributes each part carries in the flat view: the layout
    /// ([`SparseTensor::LAYOUT_ATTRIBUTE`]), `torch.size` and, where saved,
    /// `torch.is_coalesced`.
    pub fn attributes(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        out.insert(
            Self::LAYOUT_ATTRIBUTE.to_owned(),
            Value::Str(self.layout.name().into()),
        );
        let size = self.size.as_slice().iter().map(|&d| Value::Int(d.into()));
        out.insert("torch.size".into(), Value::List(size.collect()));
        if let Some(c) = self.is_coalesced {
            out.insert("torch.is_coalesced".into(), Value::Bool(c));
        }
        out
    }
}
