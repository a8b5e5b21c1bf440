//! Tensor shapes and element-count arithmetic.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most dimensions any tensorwire shape may have.
pub const MAX_NDIM: usize = 64;

/// The dimensions of a tensor, outermost first. An empty shape is a 0-d scalar (one
/// element); any zero dimension makes an empty tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<u64>);

impl Shape {
    /// A shape from its dimensions, checking the rank and that the element count fits
    /// in `u64`.
    pub fn new(dims: impl Into<Vec<u64>>) -> Result<Shape> {
        let dims = dims.into();
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        let shape = Shape(dims);
        shape.numel()?;
        Ok(shape)
    }

    /// The 0-d (scalar) shape.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u64] {
        &self.0
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar), checked for overflow.
    pub fn numel(&self) -> Result<u64> {
        self.0
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or(Error::Overflow {
                what: "element count",
            })
    }

    /// Bytes a C-contiguous tensor of this shape and `dtype` occupies, checked.
    pub fn byte_len(&self, dtype: DType) -> Result<u64> {
        dtype.byte_len(self.numel()?)
    }

    /// Row-major (C order) strides in elements.
    pub fn c_strides(&self) -> Vec<u64> {
        let mut strides = vec![1u64; self.0.len()];
        let mut acc = 1u64;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        strides
    }

    /// The dimensions as `usize`, failing on a 32-bit host if one does not fit.
    pub fn to_usize_vec(&self) -> Result<Vec<usize>> {
        self.0
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
        for (i, d) in self.0.iter().enumerate() {
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
