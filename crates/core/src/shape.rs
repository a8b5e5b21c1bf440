//! Tensor shapes and element-count arithmetic.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most dimensions any tensorwire shape may have.
pub const MAX_NDIM: usize = 64;

/// Ranks up to this many are stored inline (no heap allocation).
const INLINE: usize = 6;

/// A short list of `u64`s — a shape's dimensions, a tensor's strides — stored inline
/// (no heap allocation) when it has at most 6 items. Unlike [`Shape`] it checks
/// nothing: strides, for one, may multiply past `u64`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Dims {
    len: usize,
    /// The items when `len <= INLINE`; unused slots stay zero.
    inline: [u64; INLINE],
    /// The items when `len > INLINE`; empty otherwise.
    spill: Vec<u64>,
}

impl Dims {
    /// Dims holding a copy of `items`.
    pub fn new(items: &[u64]) -> Dims {
        if items.len() <= INLINE {
            let mut inline = [0u64; INLINE];
            inline[..items.len()].copy_from_slice(items);
            Dims {
                len: items.len(),
                inline,
                spill: Vec::new(),
            }
        } else {
            Dims::from_vec(items.to_vec())
        }
    }

    /// Dims holding `items` (kept as they are when too many to store inline).
    pub fn from_vec(items: Vec<u64>) -> Dims {
        if items.len() <= INLINE {
            return Dims::new(&items);
        }
        Dims {
            len: items.len(),
            inline: [0; INLINE],
            spill: items,
        }
    }

    /// Appends `item` (moving the items to the heap when they no longer fit inline).
    pub fn push(&mut self, item: u64) {
        if self.len < INLINE {
            self.inline[self.len] = item;
        } else {
            if self.len == INLINE {
                self.spill.reserve(2 * INLINE);
                self.spill.extend_from_slice(&self.inline);
                // Unused inline slots stay zero, so equal lists compare equal.
                self.inline = [0; INLINE];
            }
            self.spill.push(item);
        }
        self.len += 1;
    }

    /// The items.
    pub fn as_slice(&self) -> &[u64] {
        if self.len <= INLINE {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl FromIterator<u64> for Dims {
    fn from_iter<I: IntoIterator<Item = u64>>(items: I) -> Dims {
        let mut dims = Dims::default();
        items.into_iter().for_each(|item| dims.push(item));
        dims
    }
}

impl<'a> IntoIterator for &'a Dims {
    type Item = &'a u64;
    type IntoIter = std::slice::Iter<'a, u64>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl std::ops::Deref for Dims {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        self.as_slice()
    }
}

/// The product of the non-zero numbers in `dims`, `None` on overflow.
fn nonzero_product(dims: &[u64]) -> Option<u64> {
    dims.iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |n, &d| n.checked_mul(d))
}

/// The dimensions of a tensor, outermost first. An empty shape is a 0-d scalar (one
/// element); any zero dimension makes an empty tensor.
///
/// Shapes of rank ≤ 6 are stored inline (see [`Dims`]), so creating and cloning them
/// never allocates (readers make one per tensor, and one per view).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: Dims,
}

impl Shape {
    /// A shape from its dimensions, checking the rank and that the product of its
    /// non-zero dimensions fits in `i64` (so strides do, as numpy and torch require:
    /// an empty tensor's other dimensions are bounded too).
    pub fn new(dims: impl Into<Vec<u64>>) -> Result<Shape> {
        Shape::try_from_dims(Dims::from_vec(dims.into()))
    }

    /// A shape from a slice of dimensions (no allocation for rank ≤ 6).
    pub fn from_dims(dims: &[u64]) -> Result<Shape> {
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        Shape::try_from_dims(Dims::new(dims))
    }

    /// A shape of `dims`, checked as by [`Shape::new`].
    pub fn try_from_dims(dims: Dims) -> Result<Shape> {
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        match nonzero_product(dims.as_slice()) {
            Some(n) if n <= i64::MAX as u64 => Ok(Shape { dims }),
            _ => Err(Error::Overflow {
                what: "element count (of the non-zero dimensions, which must fit i64)",
            }),
        }
    }

    /// The product of the non-zero dimensions (at most `i64::MAX`, checked on
    /// construction): the element count, or for an empty tensor what strides span.
    pub fn nonzero_numel(&self) -> u64 {
        nonzero_product(self.dims()).unwrap_or(u64::MAX)
    }

    /// The 0-d (scalar) shape.
    pub fn scalar() -> Shape {
        Shape::default()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u64] {
        self.dims.as_slice()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.len
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
        let mut strides = vec![1u64; self.ndim()];
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
    fn the_non_zero_dimensions_must_multiply_within_i64() {
        let max = i64::MAX as u64;
        assert!(Shape::new(vec![max]).is_ok());
        assert!(Shape::new(vec![0, max]).is_ok());
        assert!(Shape::new(vec![max, 1, 0]).is_ok());
        for dims in [
            vec![max + 1],
            vec![0, max + 1],
            vec![0, 1 << 32, 1 << 31],
            vec![u64::MAX, 0],
        ] {
            assert!(
                matches!(Shape::new(dims.clone()), Err(Error::Overflow { .. })),
                "{dims:?}"
            );
        }
    }

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
    fn pushed_and_collected_dims_equal_those_made_whole() {
        for n in [0u64, 1, 6, 7, 13] {
            let items: Vec<u64> = (1..=n).collect();
            let mut pushed = Dims::default();
            items.iter().for_each(|&i| pushed.push(i));
            assert_eq!(pushed, Dims::new(&items), "{n}");
            assert_eq!(items.iter().copied().collect::<Dims>(), Dims::new(&items));
            assert_eq!(pushed.as_slice(), &items[..]);
        }
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
