//! Tensors laid out by strides: the view type, contiguity, gathering into row-major
//! order, and byte swapping.

use crate::bytes::{AlignedBuf, Bytes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;

/// A tensor as its file lays it out: the bytes its strides reach, with its sizes and
/// strides (a transposed torch tensor, a Fortran-order NumPy array).
#[derive(Debug, Clone)]
pub struct StridedView {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub shape: Shape,
    /// Strides in elements (never negative); `None` for row-major, the common case,
    /// so a contiguous tensor costs no strides allocation.
    pub strides: Option<Vec<u64>>,
    /// The bytes from the first element to one past the last one the strides reach.
    pub bytes: Bytes,
    /// True when `bytes` borrows the source's memory.
    pub zero_copy: bool,
}

impl StridedView {
    /// True when the strides are row-major, so `bytes` already holds the elements in
    /// order.
    pub fn is_contiguous(&self) -> bool {
        self.strides
            .as_deref()
            .is_none_or(|s| is_row_major(self.shape.dims(), s))
    }

    /// The elements in row-major order, gathered into a fresh aligned buffer of
    /// `max_bytes` at most.
    pub fn to_contiguous(&self, max_bytes: u64) -> Result<AlignedBuf> {
        let row_major;
        let strides = match &self.strides {
            Some(strides) => strides,
            None => {
                row_major = self.shape.c_strides();
                &row_major
            }
        };
        gather(&self.bytes, self.dtype, &self.shape, strides, max_bytes)
    }
}

/// True when `strides` (in elements) are the row-major strides of `dims`, ignoring
/// dimensions of size 1 (whose stride never matters) and any tensor with no elements.
pub fn is_row_major(dims: &[u64], strides: &[u64]) -> bool {
    if dims.contains(&0) {
        return true;
    }
    let mut expected = 1u64;
    for (&size, &stride) in dims.iter().zip(strides).rev() {
        if size != 1 {
            if stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size);
        }
    }
    true
}

/// The strides (in elements) torch and numpy give a new row-major array of `dims`
/// (a dimension of size 0 or 1 counts as 1 for the dimensions before it).
pub fn row_major_strides(dims: &[u64]) -> Vec<u64> {
    let mut strides = vec![0; dims.len()];
    let mut step = 1u64;
    for (stride, &d) in strides.iter_mut().zip(dims).rev() {
        *stride = step;
        step = step.saturating_mul(d.max(1));
    }
    strides
}

/// The strides (in elements) of a column-major (Fortran-order) array of `dims`.
pub fn column_major_strides(dims: &[u64]) -> Vec<u64> {
    let mut strides = Vec::with_capacity(dims.len());
    let mut step = 1u64;
    for &d in dims {
        strides.push(step);
        step = step.saturating_mul(d.max(1));
    }
    strides
}

/// Bytes from a strided tensor's first element to one past its last: `(Σ (size−1) ·
/// stride + 1) · element size`, or 0 for a tensor with no elements.
pub fn extent_bytes(dtype: DType, dims: &[u64], strides: &[u64]) -> Result<u64> {
    let elem = element_size(dtype)? as u64;
    extent_elements(dims, strides)?
        .checked_mul(elem)
        .ok_or(Error::Overflow {
            what: "strided tensor extent",
        })
}

/// Elements from a strided tensor's first element to one past its last: `Σ (size−1)
/// · stride + 1`, or 0 for a tensor with no elements (for element sizes that are no
/// [`DType`]'s, such as torch's).
pub fn extent_elements(dims: &[u64], strides: &[u64]) -> Result<u64> {
    let overflow = || Error::Overflow {
        what: "strided tensor extent",
    };
    if dims.contains(&0) {
        return Ok(0);
    }
    let mut last = 0u64;
    for (&size, &stride) in dims.iter().zip(strides) {
        let reach = (size - 1).checked_mul(stride).ok_or_else(overflow)?;
        last = last.checked_add(reach).ok_or_else(overflow)?;
    }
    last.checked_add(1).ok_or_else(overflow)
}

fn element_size(dtype: DType) -> Result<usize> {
    dtype.size().ok_or_else(|| Error::Unsupported {
        what: format!("strided {dtype} tensors (elements smaller than a byte)"),
    })
}

/// Gathers a strided tensor's elements from `extent` (the bytes from its first element,
/// at least [`extent_bytes`] long) into a fresh row-major buffer of `max_bytes` at
/// most.
pub fn gather(
    extent: &[u8],
    dtype: DType,
    shape: &Shape,
    strides: &[u64],
    max_bytes: u64,
) -> Result<AlignedBuf> {
    let nbytes = shape.byte_len(dtype)?;
    Error::check_limit("contiguous copy of a strided tensor", nbytes, max_bytes)?;
    let dims = shape.dims();
    if strides.len() != dims.len() {
        return Err(Error::invalid(format!(
            "{} strides for {} dimensions",
            strides.len(),
            dims.len()
        )));
    }
    let needed = extent_bytes(dtype, dims, strides)?;
    if (extent.len() as u64) < needed {
        return Err(Error::Truncated {
            offset: 0,
            needed,
            available: extent.len() as u64,
        });
    }
    let len = usize::try_from(nbytes).map_err(|_| Error::Overflow {
        what: "tensor size as usize",
    })?;
    let mut out = AlignedBuf::zeroed(len)?;
    if len == 0 {
        return Ok(out);
    }
    let elem = element_size(dtype)?;
    // Every index below is bounded by `needed`, which fits in `extent`'s usize length.
    let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    let strides: Vec<usize> = strides.iter().map(|&s| s as usize * elem).collect();
    let ndim = dims.len();
    if ndim == 0 {
        out.as_mut_slice().copy_from_slice(&extent[..elem]);
        return Ok(out);
    }
    // Row by row over the innermost dimension; an index odometer for the rest.
    let inner = dims[ndim - 1];
    let inner_stride = strides[ndim - 1];
    let row_bytes = inner * elem;
    let mut index = vec![0usize; ndim - 1];
    for row in out.as_mut_slice().chunks_exact_mut(row_bytes) {
        let base: usize = index.iter().zip(&strides).map(|(&i, &s)| i * s).sum();
        if inner_stride == elem {
            row.copy_from_slice(&extent[base..base + row_bytes]);
        } else {
            for (j, d) in row.chunks_exact_mut(elem).enumerate() {
                let at = base + j * inner_stride;
                d.copy_from_slice(&extent[at..at + elem]);
            }
        }
        for axis in (0..ndim - 1).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Ok(out)
}

/// Reverses the byte order of every scalar in `bytes` (both halves of a complex number
/// separately): big-endian ↔ little-endian.
pub fn swap_bytes(bytes: &mut [u8], dtype: DType) {
    let unit = dtype.swap_unit();
    if unit > 1 {
        for scalar in bytes.chunks_exact_mut(unit) {
            scalar.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: &[u64]) -> Shape {
        Shape::new(d.to_vec()).unwrap()
    }

    #[test]
    fn gathers_a_transpose() {
        // A 2×3 row-major matrix of u8 read as its 3×2 transpose.
        let m = [0u8, 1, 2, 3, 4, 5];
        let t = gather(&m, DType::U8, &shape(&[3, 2]), &[1, 3], u64::MAX).unwrap();
        assert_eq!(t.as_slice(), &[0, 3, 1, 4, 2, 5]);
        assert!(!is_row_major(&[3, 2], &[1, 3]));
        assert!(is_row_major(&[3, 2], &[2, 1]));
        assert!(is_row_major(&[1, 2], &[99, 1]));
        assert_eq!(column_major_strides(&[2, 3, 4]), vec![1, 2, 6]);
        // torch's strides for `torch.empty(2, 3, 4)`, `(3, 1)` and `(0, 3)`.
        assert_eq!(row_major_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(row_major_strides(&[3, 1]), vec![1, 1]);
        assert_eq!(row_major_strides(&[0, 3]), vec![3, 1]);
        assert_eq!(row_major_strides(&[]), Vec::<u64>::new());
        assert_eq!(extent_bytes(DType::F32, &[3, 2], &[1, 3]).unwrap(), 24);
    }

    #[test]
    fn refuses_short_extents_and_big_copies() {
        assert!(matches!(
            gather(&[0u8; 5], DType::U8, &shape(&[3, 2]), &[1, 3], u64::MAX),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            gather(&[0u8; 6], DType::U8, &shape(&[3, 2]), &[1, 3], 5),
            Err(Error::LimitExceeded { .. })
        ));
        assert!(matches!(
            gather(&[0u8; 6], DType::U8, &shape(&[3, 2]), &[1], u64::MAX),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn swaps_complex_parts_separately() {
        let mut b = [1u8, 2, 3, 4, 5, 6, 7, 8];
        swap_bytes(&mut b, DType::Complex64);
        assert_eq!(b, [4, 3, 2, 1, 8, 7, 6, 5]);
        swap_bytes(&mut b, DType::U8);
        assert_eq!(b, [4, 3, 2, 1, 8, 7, 6, 5]);
    }
}
