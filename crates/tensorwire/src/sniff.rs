//! Recognising formats by their magic bytes, and opening them.

use std::path::Path;
use std::sync::Arc;

use tensorwire_core::{Bytes, Error, Limits, Result, TensorSource};
use tensorwire_formats::gguf::{self, GgufReader};
use tensorwire_formats::npy::{self, NumpyReader};
use tensorwire_formats::safetensors::{self, SafetensorsReader};
use tensorwire_formats::shards;
use tensorwire_mmap::{MapMode, MappedFile};
use tensorwire_pytorch::zip::ZipArchive;
use tensorwire_pytorch::{Input, PtReader};
use tensorwire_range::RangeFile;
use tensorwire_zt::ZtReader;

use crate::sharded::ShardedSource;

/// A file format tensorwire recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileFormat {
    /// `.zt` version 1.x (`ZTEN1000`).
    Zt,
    /// `.zt` version 0.1 (`ZTEN0001`).
    Zt01,
    /// `.zt` version 2 (ztensor 2.x, `\x89ZT2\r\n\x1a\n`).
    Zt2,
    /// A tenso tensor packet (`TNSO`).
    Packet,
    /// A PyTorch checkpoint: a ZIP archive (`PK\x03\x04`) or the legacy pickle format.
    PyTorch,
    /// A safetensors file (a header length, then a JSON object).
    Safetensors,
    /// A GGUF file (`GGUF`).
    Gguf,
    /// A NumPy array (`\x93NUMPY`).
    Npy,
    /// A NumPy `.npz` archive (a ZIP archive of `.npy` members).
    Npz,
    /// A shard index: the JSON table of contents of a checkpoint split over several
    /// files (`model.safetensors.index.json`).
    ShardIndex,
}

impl FileFormat {
    /// Short name of the sniffed format (`"zt"`, `"zt-0.1"`, `"zt-2"`, `"tenso-packet"`,
    /// `"pytorch"`, `"safetensors"`, `"gguf"`, `"npy"`, `"npz"`, `"shard-index"`).
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Zt => "zt",
            FileFormat::Zt01 => "zt-0.1",
            FileFormat::Zt2 => "zt-2",
            FileFormat::Packet => "tenso-packet",
            FileFormat::PyTorch => "pytorch",
            FileFormat::Safetensors => "safetensors",
            FileFormat::Gguf => "gguf",
            FileFormat::Npy => "npy",
            FileFormat::Npz => "npz",
            FileFormat::ShardIndex => "shard-index",
        }
    }
}

/// Recognises a format from the first bytes of a file (at least 8 are needed; 32 for
/// legacy PyTorch checkpoints, and for a ZIP archive its first record's name).
///
/// A ZIP archive whose first record is an `.npy` member is an NPZ archive; any other
/// ZIP archive is taken for a PyTorch checkpoint (whose first record is `data.pkl`),
/// which [`open`] confirms from the archive's directory.
pub fn sniff(head: &[u8]) -> Result<FileFormat> {
    match head.get(..8) {
        Some(m) if m == tensorwire_zt::MAGIC => return Ok(FileFormat::Zt),
        Some(m) if m == tensorwire_zt::MAGIC_V01 => return Ok(FileFormat::Zt01),
        Some(m) if m == tensorwire_zt::MAGIC_V2 => return Ok(FileFormat::Zt2),
        _ => {}
    }
    match head.get(..4) {
        Some(m) if m == tensorwire_packet::MAGIC => return Ok(FileFormat::Packet),
        _ => {}
    }
    if gguf::sniff(head) {
        return Ok(FileFormat::Gguf);
    }
    if npy::sniff(head) {
        return Ok(FileFormat::Npy);
    }
    if head.starts_with(b"PK\x05\x06") {
        // An archive with no records at all (`np.savez(path)`); a checkpoint always
        // holds some.
        return Ok(FileFormat::Npz);
    }
    if head.starts_with(b"PK\x03\x04") {
        return Ok(match first_zip_name(head) {
            Some(name) if name.ends_with(b".npy") => FileFormat::Npz,
            _ => FileFormat::PyTorch,
        });
    }
    if tensorwire_pytorch::sniff(head) {
        return Ok(FileFormat::PyTorch);
    }
    if safetensors::sniff(head) {
        return Ok(FileFormat::Safetensors);
    }
    if shards::sniff(head) {
        return Ok(FileFormat::ShardIndex);
    }
    if head.is_empty() {
        // Every format starts with a magic or a header length.
        return Err(Error::Truncated {
            offset: 0,
            needed: 8,
            available: 0,
        });
    }
    Err(Error::UnknownFormat {
        head: head.iter().take(16).copied().collect(),
    })
}

/// The name of a ZIP archive's first record, from its local header.
fn first_zip_name(head: &[u8]) -> Option<&[u8]> {
    let len = u16::from_le_bytes(head.get(26..28)?.try_into().ok()?) as usize;
    head.get(30..30 + len)
}

/// Decides between a PyTorch checkpoint and an NPZ archive whose first record did not
/// say (another tool wrote the archive): torch's have a `data.pkl` record.
fn zip_format(input: &Input, limits: &Limits) -> Result<FileFormat> {
    let archive = ZipArchive::parse(input, limits.max_tensors, limits.max_name_bytes)?;
    let last_parts = || archive.entries().iter().map(|e| e.name.rsplit('/').next());
    if last_parts().any(|name| name == Some("data.pkl")) {
        return Ok(FileFormat::PyTorch);
    }
    // torch.export's `.pt2` package: `<folder>/archive_format` holds `pt2`.
    if last_parts().any(|name| name == Some("archive_format")) {
        return Err(Error::unsupported(
            "a torch.export package (.pt2: an exported program, not a torch.save \
             checkpoint; its weights load through torch.export.load)",
        ));
    }
    let npy_member = archive.entries().iter().any(|e| {
        let name = e.name.as_ref();
        name.ends_with(".npy") || !name.contains('/')
    });
    if !npy_member && !archive.entries().is_empty() {
        return Err(Error::unsupported(
            "a ZIP archive that is neither a torch checkpoint (no `<folder>/data.pkl` \
             record) nor an NPZ archive (no `.npy` member)",
        ));
    }
    Ok(FileFormat::Npz)
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
/// extension), mapped copy-on-write. A shard index opens every shard it names, as a
/// [`ShardedSource`](crate::ShardedSource).
pub fn open(path: impl AsRef<Path>) -> Result<Box<dyn TensorSource>> {
    open_with(path, &OpenOptions::default())
}

/// Opens any supported tensor file with explicit options.
pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Box<dyn TensorSource>> {
    open_file(path.as_ref(), options, true)
}

/// Opens one file; a shard index only when `index_allowed` (a shard must be a tensor
/// file, not another index).
pub(crate) fn open_file(
    path: &Path,
    options: &OpenOptions,
    index_allowed: bool,
) -> Result<Box<dyn TensorSource>> {
    // Mapping is lazy, so sniffing the map costs no more than reading the head.
    let bytes = MappedFile::open_bytes(path, options.map_mode)?;
    let opened = match sniff(&bytes) {
        Ok(FileFormat::ShardIndex) if index_allowed => {
            return Ok(Box::new(ShardedSource::from_index(path, &bytes, options)?));
        }
        Ok(FileFormat::ShardIndex) => Err(Error::unsupported(
            "a shard index as a shard of another index",
        )),
        // ZIP-based and legacy checkpoints keep headers all over the file (one per
        // record or storage): they are read with positional reads, a syscall each,
        // instead of first touches of map pages, a page fault each plus page-table
        // entries to tear down at unmap. Tensor bytes still come from the map.
        Ok(FileFormat::PyTorch | FileFormat::Npz) => {
            let file = Arc::new(RangeFile::open(path)?);
            let head = bytes.clone();
            open_zip_or_pickle(
                &head,
                Input::mapped_with_file(bytes, file)?,
                &options.limits,
            )
        }
        Ok(FileFormat::Gguf) if index_allowed => {
            let first = open_bytes(bytes, &options.limits).map_err(|e| e.with_path(path))?;
            return ShardedSource::gguf_splits(path, first, options);
        }
        _ => open_bytes(bytes, &options.limits),
    };
    opened.map_err(|e| e.with_path(path))
}

/// Opens a PyTorch checkpoint or an NPZ archive (a ZIP of either kind, told apart by
/// its records, or a legacy pickle checkpoint) read through `input`; `image` is the
/// file in memory (the map), whose first bytes were sniffed already.
fn open_zip_or_pickle(
    image: &[u8],
    input: Input,
    limits: &Limits,
) -> Result<Box<dyn TensorSource>> {
    if image.starts_with(b"PK\x05\x06") {
        return Ok(Box::new(NumpyReader::npz(input, limits)?));
    }
    if image.starts_with(b"PK\x03\x04") {
        let format = match first_zip_name(image) {
            Some(name) if name.ends_with(b".npy") => FileFormat::Npz,
            Some(name) if name.ends_with(b"data.pkl") => FileFormat::PyTorch,
            _ => zip_format(&input, limits)?,
        };
        if format == FileFormat::Npz {
            return Ok(Box::new(NumpyReader::npz(input, limits)?));
        }
    }
    Ok(Box::new(PtReader::from_input(input, limits)?))
}

/// Opens a tensor file image already in memory (a map, a shm segment, a buffer).
pub fn open_bytes(bytes: Bytes, limits: &Limits) -> Result<Box<dyn TensorSource>> {
    match sniff(&bytes)? {
        FileFormat::Zt | FileFormat::Zt01 | FileFormat::Zt2 => {
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
        FileFormat::PyTorch | FileFormat::Npz => {
            open_zip_or_pickle(&bytes.clone(), Input::mapped(bytes), limits)
        }
        FileFormat::Npy => Ok(Box::new(NumpyReader::from_bytes(bytes, limits)?)),
        FileFormat::Safetensors => Ok(Box::new(SafetensorsReader::from_bytes(bytes, limits)?)),
        FileFormat::Gguf => Ok(Box::new(GgufReader::from_bytes(bytes, limits)?)),
        FileFormat::ShardIndex => Err(Error::unsupported(
            "a shard index in memory: its shards are files beside it, so open it by path",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_by_magic() {
        assert_eq!(sniff(b"ZTEN1000....").unwrap(), FileFormat::Zt);
        assert_eq!(sniff(b"ZTEN0001").unwrap(), FileFormat::Zt01);
        assert_eq!(sniff(b"\x89ZT2\r\n\x1a\n").unwrap(), FileFormat::Zt2);
        assert_eq!(sniff(b"PK\x03\x04....").unwrap(), FileFormat::PyTorch);
        let mut npz = b"PK\x03\x04".to_vec();
        npz.extend_from_slice(&[0; 22]);
        npz.extend_from_slice(&5u16.to_le_bytes());
        npz.extend_from_slice(&[0, 0]);
        npz.extend_from_slice(b"x.npy");
        assert_eq!(sniff(&npz).unwrap(), FileFormat::Npz);
        assert_eq!(sniff(b"\x93NUMPY\x01\x00").unwrap(), FileFormat::Npy);
        assert_eq!(sniff(b"GGUF\x03\x00\x00\x00").unwrap(), FileFormat::Gguf);
        assert_eq!(
            sniff(b"\x10\0\0\0\0\0\0\0{\"").unwrap(),
            FileFormat::Safetensors
        );
        assert_eq!(
            sniff(b"{\n  \"metadata\": {\"total_size\": 8},").unwrap(),
            FileFormat::ShardIndex
        );
        // An end record first: an archive with no records, as `np.savez(path)` writes.
        assert_eq!(sniff(b"PK\x05\x06....").unwrap(), FileFormat::Npz);
        assert!(matches!(
            sniff(b"PK\x07\x08...."),
            Err(Error::UnknownFormat { .. })
        ));
        assert!(matches!(
            sniff(b""),
            Err(Error::Truncated { available: 0, .. })
        ));
        // Directories and other non-files are named as such, not as a device error.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let err = open(dir).err().expect("a directory does not open");
        assert!(err.to_string().contains("a directory"), "{err}");
        let err = open("/dev/null").err().expect("a device does not open");
        assert!(err.to_string().contains("not a regular file"), "{err}");
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
