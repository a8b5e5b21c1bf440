//! Opening tensor files for reading: regular files only.

use std::fs::{File, Metadata};
use std::io;
use std::path::Path;

use crate::{Error, Result};

/// Opens `path` for reading with `O_NONBLOCK` (on Unix): a FIFO with no writer then
/// opens at once, to be refused by [`check_regular_file`], instead of hanging in
/// `open(2)`. The flag changes nothing for a regular file's reads.
pub fn open_for_reading(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Refuses anything but a regular file (`InvalidArgument`): a directory, or a pipe,
/// socket or device, whose bytes cannot be `how` ("mapped", "read by position").
pub fn check_regular_file(meta: &Metadata, how: &str) -> Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(Error::invalid(if meta.is_dir() {
        "a directory, not a tensor file".to_owned()
    } else {
        format!("not a regular file (a pipe, socket or device): tensor files are {how}")
    }))
}
