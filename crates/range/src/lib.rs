//! Positional reads of byte ranges (`pread`), for when mapping a file is not wanted:
//! network file systems, files that may change underneath, or reading a few tensors of
//! a huge file into fresh aligned buffers.
//!
//! Not in scope: parsing formats, memory maps (`tensorwire-mmap`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tensorwire_core::{AlignedBuf, Bytes, Error, Result};

/// Something that can read a byte range at an absolute offset without a cursor.
pub trait RangeRead: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;

    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`. Fails with
    /// [`Error::Truncated`] if the range passes the end.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// Reads `offset..offset + len` into a new 64-byte-aligned buffer.
    fn read_range(&self, offset: u64, len: u64) -> Result<Bytes> {
        let n = usize::try_from(len).map_err(|_| Error::Overflow {
            what: "range length as usize",
        })?;
        let mut buf = AlignedBuf::zeroed(n)?;
        self.read_exact_at(offset, buf.as_mut_slice())?;
        Ok(buf.into_bytes())
    }
}

/// A file read with `pread`, counting the bytes it reads (so tests can prove a reader
/// touched only the ranges it needed).
#[derive(Debug)]
pub struct RangeFile {
    file: File,
    len: u64,
    path: PathBuf,
    bytes_read: AtomicU64,
}

impl RangeFile {
    /// Opens `path` for positional reads.
    pub fn open(path: impl AsRef<Path>) -> Result<RangeFile> {
        let path = path.as_ref();
        // A FIFO with no writer opens at once (and is refused) instead of hanging.
        let file =
            tensorwire_core::open_for_reading(path).map_err(|e| Error::from(e).with_path(path))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::from(e).with_path(path))?;
        tensorwire_core::check_regular_file(&meta, "read by position")
            .map_err(|e| e.with_path(path))?;
        let len = meta.len();
        Ok(RangeFile {
            file,
            len,
            path: path.to_owned(),
            bytes_read: AtomicU64::new(0),
        })
    }

    /// Total bytes read through this handle so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl RangeRead for RangeFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(offset, buf.len() as u64, self.len)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::from(e).with_path(&self.path))?;
        self.bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// In-memory bytes as a [`RangeRead`] (tests, already-mapped data).
impl RangeRead for Bytes {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let src = self
            .slice_at(offset, buf.len() as u64)
            .map_err(|_| Error::Truncated {
                offset,
                needed: buf.len() as u64,
                available: RangeRead::len(self).saturating_sub(offset),
            })?;
        buf.copy_from_slice(&src);
        Ok(())
    }

    fn read_range(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.slice_at(offset, len).map_err(|_| Error::Truncated {
            offset,
            needed: len,
            available: RangeRead::len(self).saturating_sub(offset),
        })
    }
}

fn check_range(offset: u64, len: u64, total: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(Error::Truncated {
            offset,
            needed: len,
            available: total.saturating_sub(offset),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_ranges_and_counts_bytes() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&(0u8..=255).collect::<Vec<_>>()).unwrap();
        let r = RangeFile::open(f.path()).unwrap();
        assert_eq!(r.len(), 256);
        let got = r.read_range(10, 4).unwrap();
        assert_eq!(&*got, &[10, 11, 12, 13]);
        assert!(got.is_aligned(64));
        assert_eq!(r.bytes_read(), 4);
    }

    #[test]
    fn reading_past_the_end_is_truncated() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0u8; 16]).unwrap();
        let r = RangeFile::open(f.path()).unwrap();
        assert!(matches!(
            r.read_range(10, 10),
            Err(Error::Truncated { available: 6, .. })
        ));
        assert!(matches!(
            r.read_range(u64::MAX, 2),
            Err(Error::Truncated { .. })
        ));
    }

    #[test]
    fn only_regular_files_are_opened_and_a_pipe_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opened on a thread: a blocking open would never return.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(RangeFile::open(&path).err());
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a pipe returned")
            .expect("a pipe is refused");
        let text = err.to_string();
        assert!(text.contains("not a regular file"), "{text}");
        assert!(text.contains(&fifo.display().to_string()), "{text}");
        let err = RangeFile::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
    }

    #[test]
    fn bytes_are_a_range_source_without_copying() {
        let b = Bytes::from_vec(vec![1, 2, 3, 4]);
        let r = b.read_range(1, 2).unwrap();
        assert_eq!(&*r, &[2, 3]);
        assert!(std::sync::Arc::ptr_eq(r.owner(), b.owner()));
    }
}
