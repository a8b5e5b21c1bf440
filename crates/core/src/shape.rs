//! Tensor shapes and element-count arithmetic.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most dimensions any tensorwire shape may have.
pub const MAX_NDIM: usize = 64;

/// Ranks up to this many are stored inline (no heap allocation).
const INLINE: usize = 6;

/// The dimensions of a tensor, outermost first. An empty shape is a 0-d scalar (one
/// element); any zero dimension makes an empty tensor.
///
/// Shapes of rank ≤ 6 are stored inline, so creating and cloning them never allocates
/// (readers make one per tensor, and one per view).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    ndim: usize,
    /// The dimensions when `ndim <= INLINE`; unused slots stay zero.
    inline: [u64; INLINE],
    /// The dimensions when `ndim > INLINE`; empty otherwise.
    spill: Vec<u64>,
}

impl Shape {
    /// A shape from its dimensions, checking the rank and that the element count fits
    /// in `u64`.
    pub fn new(dims: impl Into<Vec<u64>>) -> Result<Shape> {
        Shape::from_vec(dims.into())
    }

    /// A shape from a slice of dimensions (no allocation for rank ≤ 6).
    pub fn from_dims(dims: &[u64]) -> Result<Shape> {
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        let shape = if dims.len() <= INLINE {
            let mut inline = [0u64; INLINE];
            inline[..dims.len()].copy_from_slice(dims);
            Shape {
                ndim: dims.len(),
                inline,
                spill: Vec::new(),
            }
        } else {
            Shape {
                ndim: dims.len(),
                inline: [0; INLINE],
                spill: dims.to_vec(),
            }
        };
        shape.numel()?;
        Ok(shape)
    }

    fn from_vec(dims: Vec<u64>) -> Result<Shape> {
        if dims.len() <= INLINE {
            return Shape::from_dims(&dims);
        }
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        let shape = Shape {
            ndim: dims.len(),
            inline: [0; INLINE],
            spill: dims,
        };
        shape.numel()?;
        Ok(shape)
    }

    /// The 0-d (scalar) shape.
    pub fn scalar() -> Shape {
        Shape::default()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u64] {
        if self.ndim <= INLINE {
            &self.inline[..self.ndim]
        } else {
            &self.spill
        }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.ndim
    }

    /// Number of elements (1 for a scalar), checked for overflow.
    pub fn numel(&self) -> Result<u64> {
        match self.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(d)) {
            Some(n) => Ok(n),
            None => Err(Error::Overflow {
                what: "element count",
            }),
        }
    }

    /// Bytes a C-contiguous tensor of this shape and `dtype` occupies, checked.
    pub fn byte_len(&self, dtype: DType) -> Result<u64> {
        dtype.byte_len(self.numel()?)
    }

    /// Row-major (C order) strides in elements.
    pub fn c_strides(&self) -> Vec<u64> {
        let mut strides = vec![1u64; self.ndim];
        let mut acc = 1u64;
        for (s, &d) in strides.iter_mut().zip(self.dims()).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        strides
    }

    /// The dimensions as `usize`, failing on a 32-bit host if one does not fit.
    pub fn to_usize_vec(&self) -> Result<Vec<usize>> {
        self.dims()
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| Error::Overflow {
                    what: "dimension as usize",
                })
            })
            .collect()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl TryFrom<Vec<u64>> for Shape {
    type Error = Error;
    fn try_from(dims: Vec<u64>) -> Result<Shape> {
        Shape::new(dims)
    }
}

impl TryFrom<&[usize]> for Shape {
    type Error = Error;
    fn try_from(dims: &[usize]) -> Result<Shape> {
        Shape::new(dims.iter().map(|&d| d as u64).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn scalar_and_empty() {
        assert_eq!(Shape::scalar().numel().unwrap(), 1);
        assert_eq!(Shape::new(vec![0, 3]).unwrap().numel().unwrap(), 0);
        assert_eq!(Shape::new(vec![2, 3]).unwrap().to_string(), "[2, 3]");
    }

    #[test]
    fn overflowing_shape_is_refused() {
        assert!(matches!(
            Shape::new(vec![u64::MAX, 2]),
            Err(Error::Overflow { .. })
        ));
        let too_deep = vec![1u64; MAX_NDIM + 1];
        assert!(matches!(
            Shape::new(too_deep),
            Err(Error::LimitExceeded { .. })
        ));
    }

    #[test]
    fn inline_and_spilled_shapes_compare_by_dims() {
        let small = Shape::from_dims(&[2, 3]).unwrap();
        assert_eq!(small, Shape::new(vec![2, 3]).unwrap());
        let big: Vec<u64> = (1..=9).collect();
        let spilled = Shape::new(big.clone()).unwrap();
        assert_eq!(spilled.dims(), &big[..]);
        assert_eq!(spilled, Shape::from_dims(&big).unwrap());
        assert_ne!(spilled, small);
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(
            Shape::new(vec![2, 3, 4]).unwrap().c_strides(),
            vec![12, 4, 1]
        );
    }

    proptest! {
        #[test]
        fn byte_len_matches_product(dims in proptest::collection::vec(0u64..50, 0..5)) {
            let shape = Shape::new(dims.clone()).unwrap();
            let n: u64 = dims.iter().product();
            prop_assert_eq!(shape.byte_len(DType::F32).unwrap(), n * 4);
        }
    }
}
