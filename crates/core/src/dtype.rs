//! Element types.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The element type of a tensor.
///
/// Covers every type the `.zt` format and tensor packets name: the 13 storage
/// primitives, the float8 and complex logical types, and the packed quantized types.
/// Names follow the `.zt` spelling (`f32`, `bf16`, `f8_e4m3fn`, `complex64`, `qint4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of a binary32).
    BF16,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 16-bit integer.
    I16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 64-bit integer.
    U64,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// OCP float8 E4M3 (finite, NaN only).
    F8E4M3Fn,
    /// OCP float8 E5M2.
    F8E5M2,
    /// AMD float8 E4M3 (finite, unsigned zero).
    F8E4M3Fnuz,
    /// AMD float8 E5M2 (finite, unsigned zero).
    F8E5M2Fnuz,
    /// Complex number of two binary32 (real, imaginary).
    Complex64,
    /// Complex number of two binary64 (real, imaginary).
    Complex128,
    /// Quantized signed 8-bit integer (packet format).
    QInt8,
    /// Quantized unsigned 8-bit integer (packet format).
    QUInt8,
    /// Quantized signed 4-bit integer, two per byte, element `2i` in the low nibble.
    QInt4,
    /// Quantized unsigned 4-bit integer, two per byte, element `2i` in the low nibble.
    QUInt4,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 23] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::Complex64,
        DType::Complex128,
        DType::QInt8,
        DType::QUInt8,
        DType::QInt4,
        DType::QUInt4,
    ];

    /// The canonical (`.zt`) name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::F8E4M3Fn => "f8_e4m3fn",
            DType::F8E5M2 => "f8_e5m2",
            DType::F8E4M3Fnuz => "f8_e4m3fnuz",
            DType::F8E5M2Fnuz => "f8_e5m2fnuz",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
            DType::QInt8 => "qint8",
            DType::QUInt8 => "quint8",
            DType::QInt4 => "qint4",
            DType::QUInt4 => "quint4",
        }
    }

    /// Size of one element in bits (4 for the packed 4-bit types).
    pub const fn bits(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::I8
            | DType::U8
            | DType::Bool
            | DType::F8E4M3Fn
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::QInt8
            | DType::QUInt8 => 8,
            DType::Complex64 => 64,
            DType::Complex128 => 128,
            DType::QInt4 | DType::QUInt4 => 4,
        }
    }

    /// Size of one element in bytes, or `None` for sub-byte (packed 4-bit) types.
    pub const fn size(self) -> Option<usize> {
        let bits = self.bits();
        if bits % 8 == 0 {
            Some((bits / 8) as usize)
        } else {
            None
        }
    }

    /// Alignment a typed view of this dtype needs (the size of its scalar part).
    pub const fn alignment(self) -> usize {
        match self {
            DType::Complex64 => 4,
            DType::Complex128 => 8,
            DType::QInt4 | DType::QUInt4 => 1,
            other => (other.bits() / 8) as usize,
        }
    }

    /// Number of bytes `numel` elements occupy (packed types round up), checked.
    pub fn byte_len(self, numel: u64) -> Result<u64, Error> {
        // A `match` rather than `ok_or`: building the error eagerly costs a drop on
        // every successful call, and this runs per tensor on open.
        match numel.checked_mul(self.bits()) {
            Some(bits) => Ok(bits.div_ceil(8)),
            None => Err(Error::Overflow {
                what: "tensor byte length",
            }),
        }
    }

    /// The storage primitive and the number of storage elements per logical element,
    /// as the `.zt` format records them (`complex64` is two `f32`, float8 is `u8`).
    pub const fn storage(self) -> (DType, u64) {
        match self {
            DType::F8E4M3Fn | DType::F8E5M2 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz => {
                (DType::U8, 1)
            }
            DType::Complex64 => (DType::F32, 2),
            DType::Complex128 => (DType::F64, 2),
            DType::QInt8 => (DType::I8, 1),
            DType::QUInt8 | DType::QInt4 | DType::QUInt4 => (DType::U8, 1),
            other => (other, 1),
        }
    }

    /// True for the 13 storage primitives of the `.zt` format.
    pub const fn is_primitive(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::F16
                | DType::BF16
                | DType::I64
                | DType::I32
                | DType::I16
                | DType::I8
                | DType::U64
                | DType::U32
                | DType::U16
                | DType::U8
                | DType::Bool
        )
    }

    /// Size of the unit that must be byte-swapped to change endianness (1 = none).
    pub const fn swap_unit(self) -> usize {
        self.alignment()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parses the canonical name and the common long spellings
    /// (`float32`, `bfloat16`, `int64`, `float8_e4m3fn`, …).
    fn from_str(s: &str) -> Result<Self, Error> {
        let dtype = match s {
            "f64" | "float64" | "double" => DType::F64,
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i64" | "int64" => DType::I64,
            "i32" | "int32" => DType::I32,
            "i16" | "int16" => DType::I16,
            "i8" | "int8" => DType::I8,
            "u64" | "uint64" => DType::U64,
            "u32" | "uint32" => DType::U32,
            "u16" | "uint16" => DType::U16,
            "u8" | "uint8" => DType::U8,
            "bool" => DType::Bool,
            "f8_e4m3fn" | "float8_e4m3fn" => DType::F8E4M3Fn,
            "f8_e5m2" | "float8_e5m2" => DType::F8E5M2,
            "f8_e4m3fnuz" | "float8_e4m3fnuz" => DType::F8E4M3Fnuz,
            "f8_e5m2fnuz" | "float8_e5m2fnuz" => DType::F8E5M2Fnuz,
            "complex64" | "c64" => DType::Complex64,
            "complex128" | "c128" => DType::Complex128,
            "qint8" => DType::QInt8,
            "quint8" => DType::QUInt8,
            "qint4" => DType::QInt4,
            "quint4" => DType::QUInt4,
            other => {
                return Err(Error::UnknownDType {
                    name: other.to_owned(),
                })
            }
        };
        Ok(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
    }

    #[test]
    fn unknown_name_is_a_typed_error() {
        assert!(matches!(
            "f128".parse::<DType>(),
            Err(Error::UnknownDType { .. })
        ));
    }

    #[test]
    fn packed_types_round_up() {
        assert_eq!(DType::QInt4.byte_len(3).unwrap(), 2);
        assert_eq!(DType::QInt4.size(), None);
        assert_eq!(DType::Complex128.byte_len(2).unwrap(), 32);
        assert!(DType::F64.byte_len(u64::MAX).is_err());
    }

    #[test]
    fn storage_of_logical_types() {
        assert_eq!(DType::Complex64.storage(), (DType::F32, 2));
        assert_eq!(DType::F8E5M2.storage(), (DType::U8, 1));
        assert_eq!(DType::BF16.storage(), (DType::BF16, 1));
    }
}
