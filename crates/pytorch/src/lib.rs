//! PyTorch checkpoints (`.pt`, `.pth`, `.bin` from `torch.save`) read safely, lazily
//! and zero-copy, with no Python, no torch and no code execution.
//!
//! Both containers are read: the ZIP archive of torch ≥ 1.6 (ZIP64 included) and the
//! legacy format (a sequence of pickles followed by raw storages). The object pickle
//! runs on a [`pickle`] machine that only builds values: globals resolve against an
//! allowlist modelled on `torch.load(weights_only=True)` and anything else is refused
//! with [`tensorwire_core::Error::RefusedGlobal`]. Nested dicts, lists and
//! `OrderedDict`s of tensors are flattened to dotted names (`model.layers.0.weight`);
//! their other values become metadata ([`tensorwire_core::TensorSource::attributes`]).
//!
//! ```no_run
//! use tensorwire_core::TensorSource;
//! use tensorwire_pytorch::PtReader;
//! # fn main() -> tensorwire_core::Result<()> {
//! let ckpt = PtReader::open("model.pt")?;
//! for info in ckpt.tensors() {
//!     let view = ckpt.view(&info.name)?; // zero-copy when contiguous
//!     println!("{} {} {} zero-copy={}", info.name, view.dtype, view.shape, view.zero_copy);
//! }
//! # Ok(()) }
//! ```
//!
//! Quantized tensors (`torch.qint8`, `quint8`, `qint32`) read as their integers with
//! their scheme and parameters as per-tensor attributes ([`Quantization`]). Sparse
//! tensors (COO, CSR, CSC, BSR, BSC) read as their parts, the dense tensors of their
//! indices and values ([`SparseTensor`]). The dtypes only torch has
//! (`float8_e8m0fnu`, `float4_e2m1fn_x2`, `complex32`) read as the elements that hold
//! them ([`TorchOnlyDType`]). Lazy conjugate and negative views (`z.conj()` saved as
//! such) read as their values, copied, with torch's bits kept on the record
//! ([`TensorRecord::is_conj`], [`TensorRecord::is_neg`]).
//!
//! Not in scope: writing checkpoints; meta and subclassed tensors
//! (`Unsupported`, naming them) and nested ones (refused, as torch refuses them); the
//! pre-0.1.10 TAR container.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod flatten;
pub mod globals;
mod input;
mod legacy;
pub mod pickle;
mod reader;
mod sparse;
mod tensor;
pub mod zip;

pub use crate::flatten::{Node, ROOT_TENSOR_NAME};
pub use crate::input::Input;
pub use crate::pickle::DictKind;
pub use crate::reader::{MetaEntry, PtFormat, PtReader};
pub use crate::sparse::{SparseLayout, SparseTensor};
pub use crate::tensor::{
    MetaTensor, Quantization, StorageRef, TensorDType, TensorRecord, TorchOnlyDType,
};

/// True when `head` (a file's first bytes, 32 are enough) looks like a torch
/// checkpoint: a ZIP archive or the legacy format's magic-number pickle.
///
/// A ZIP archive is only a candidate: [`PtReader`] then requires `<folder>/data.pkl`.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || legacy::sniff(head)
}
