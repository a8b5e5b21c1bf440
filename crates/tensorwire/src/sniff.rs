//! Recognising formats by their magic bytes, and opening them.

use std::path::Path;

use tensorwire_core::{Bytes, Error, Limits, Result, TensorSource};
use tensorwire_mmap::{MapMode, MappedFile};
use tensorwire_pytorch::PtReader;
use tensorwire_zt::ZtReader;

/// A file format tensorwire recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileFormat {
    /// `.zt` version 1.x (`ZTEN1000`).
    Zt,
    /// `.zt` version 0.1 (`ZTEN0001`).
    Zt01,
    /// A tenso tensor packet (`TNSO`).
    Packet,
    /// A PyTorch checkpoint: a ZIP archive (`PK\x03\x04`) or the legacy pickle format.
    PyTorch,
}

impl FileFormat {
    /// Short name (`"zt"`, `"zt-0.1"`).
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Zt => "zt",
            FileFormat::Zt01 => "zt-0.1",
            FileFormat::Packet => "tenso-packet",
            FileFormat::PyTorch => "pytorch",
        }
    }
}

/// Recognises a format from the first bytes of a file (at least 8 are needed; 32 for
/// legacy PyTorch checkpoints).
pub fn sniff(head: &[u8]) -> Result<FileFormat> {
    match head.get(..8) {
        Some(m) if m == tensorwire_zt::MAGIC => return Ok(FileFormat::Zt),
        Some(m) if m == tensorwire_zt::MAGIC_V01 => return Ok(FileFormat::Zt01),
        _ => {}
    }
    match head.get(..4) {
        Some(m) if m == tensorwire_packet::MAGIC => return Ok(FileFormat::Packet),
        _ => {}
    }
    if tensorwire_pytorch::sniff(head) {
        return Ok(FileFormat::PyTorch);
    }
    Err(Error::UnknownFormat {
        head: head.iter().take(16).copied().collect(),
    })
}

/// How [`open_with`] maps and checks a file.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Map mode: copy-on-write (writable private views, the default) or read-only.
    pub map_mode: MapMode,
    /// Parser limits.
    pub limits: Limits,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            map_mode: MapMode::CopyOnWrite,
            limits: Limits::default(),
        }
    }
}

/// Opens any supported tensor file, recognised by its magic bytes (not its
/// extension), mapped copy-on-write.
pub fn open(path: impl AsRef<Path>) -> Result<Box<dyn TensorSource>> {
    open_with(path, &OpenOptions::default())
}

/// Opens any supported tensor file with explicit options.
pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Box<dyn TensorSource>> {
    let path = path.as_ref();
    // Mapping is lazy, so sniffing the map costs no more than reading the head.
    let bytes = MappedFile::open_bytes(path, options.map_mode)?;
    open_bytes(bytes, &options.limits).map_err(|e| e.with_path(path))
}

/// Opens a tensor file image already in memory (a map, a shm segment, a buffer).
pub fn open_bytes(bytes: Bytes, limits: &Limits) -> Result<Box<dyn TensorSource>> {
    match sniff(&bytes)? {
        FileFormat::Zt | FileFormat::Zt01 => {
            Ok(Box::new(ZtReader::from_bytes_with(bytes, limits)?))
        }
        FileFormat::Packet => {
            let packet_limits = tensorwire_packet::PacketLimits {
                max_ndim: limits.max_ndim.min(32),
                ..Default::default()
            };
            Ok(Box::new(tensorwire_packet::PacketSource::from_bytes(
                bytes,
                &packet_limits,
            )?))
        }
        FileFormat::PyTorch => Ok(Box::new(PtReader::from_bytes(bytes, limits)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_by_magic() {
        assert_eq!(sniff(b"ZTEN1000....").unwrap(), FileFormat::Zt);
        assert_eq!(sniff(b"ZTEN0001").unwrap(), FileFormat::Zt01);
        assert_eq!(sniff(b"PK\x03\x04....").unwrap(), FileFormat::PyTorch);
        assert!(matches!(
            sniff(b"PK\x05\x06...."),
            Err(Error::UnknownFormat { .. })
        ));
        assert!(matches!(sniff(b""), Err(Error::UnknownFormat { .. })));
    }

    #[test]
    fn opens_a_tenso_packet_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/packet/worked_example_integrity.tnso");
        let src = open(&path).unwrap();
        assert_eq!(src.format(), "tenso-packet");
        let view = src.view(tensorwire_packet::PACKET_TENSOR_NAME).unwrap();
        assert_eq!(view.dtype, tensorwire_core::DType::F32);
        assert_eq!(&view.bytes[..4], &1.0f32.to_le_bytes());
        assert!(src.view("other").is_err());
    }
}
