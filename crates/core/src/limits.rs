//! Size and count limits applied by every parser.

/// Upper bounds a parser enforces on untrusted input before it allocates or trusts a
/// declared size. The defaults accept every real checkpoint we know of while keeping a
/// hostile file from asking for unbounded memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest metadata block (manifest, header) accepted, in bytes.
    pub max_metadata_bytes: u64,
    /// Most tensors (objects) in one file.
    pub max_tensors: u64,
    /// Most dimensions of one tensor.
    pub max_ndim: usize,
    /// Longest tensor name, in bytes.
    pub max_name_bytes: usize,
    /// Largest decoded (decompressed) size of one tensor component, in bytes.
    pub max_decoded_bytes: u64,
    /// Deepest nesting of metadata values (attributes).
    pub max_depth: usize,
}

impl Limits {
    /// The default limits (1 GiB metadata as the `.zt` spec sets, 1 M tensors, 64
    /// dimensions, 64 KiB names, 64 GiB per decoded component, nesting 64).
    pub const DEFAULT: Limits = Limits {
        max_metadata_bytes: 1 << 30,
        max_tensors: 1 << 20,
        max_ndim: crate::shape::MAX_NDIM,
        max_name_bytes: 64 << 10,
        max_decoded_bytes: 64 << 30,
        max_depth: 64,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}
