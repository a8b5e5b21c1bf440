//! The packet dtype codes.

use tensorwire_core::DType;

const CODES: [(u8, DType); 19] = [
    (1, DType::F32),
    (2, DType::I32),
    (3, DType::F64),
    (4, DType::I64),
    (5, DType::U8),
    (6, DType::U16),
    (7, DType::Bool),
    (8, DType::F16),
    (9, DType::I8),
    (10, DType::I16),
    (11, DType::U32),
    (12, DType::U64),
    (13, DType::Complex64),
    (14, DType::Complex128),
    (15, DType::BF16),
    (16, DType::QInt8),
    (17, DType::QUInt8),
    (18, DType::QInt4),
    (19, DType::QUInt4),
];

/// The packet code of a dtype (`None` for dtypes packets cannot carry, such as float8).
pub fn dtype_code(dtype: DType) -> Option<u8> {
    CODES.iter().find(|(_, d)| *d == dtype).map(|(c, _)| *c)
}

/// The dtype of a packet code (`None` for unknown codes and the string/bytes codes).
pub fn dtype_from_code(code: u8) -> Option<DType> {
    CODES.iter().find(|(c, _)| *c == code).map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (code, dtype) in CODES {
            assert_eq!(dtype_code(dtype), Some(code));
            assert_eq!(dtype_from_code(code), Some(dtype));
        }
        assert_eq!(dtype_code(DType::F8E4M3Fn), None);
        assert_eq!(dtype_from_code(0), None);
        assert_eq!(dtype_from_code(20), None);
    }
}
