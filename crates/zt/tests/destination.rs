//! Where `ZtWriter::create` writes: never over a pipe or device, never through a
//! link planted where its temporary file goes; and a pipe is never opened blocking.
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::Path;

use tensorwire_core::{DType, Error, Shape};
use tensorwire_zt::{WriteOptions, ZtReader, ZtWriter};

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}

fn write_one(path: &Path) -> tensorwire_core::Result<u64> {
    let mut w = ZtWriter::create(path)?;
    w.add_dense(
        "x",
        DType::U8,
        &Shape::new(vec![3]).unwrap(),
        &[1, 2, 3],
        WriteOptions::default(),
    )?;
    w.finish()
}

#[test]
fn a_pipe_is_refused_as_destination_and_as_file_to_append_to() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("out.zt");
    mkfifo(&fifo);
    let err = write_one(&fifo).unwrap_err();
    assert!(
        matches!(err.root(), Error::InvalidArgument { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary");
    // Appending maps the file first: refused at once, not blocked in `open`.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(ZtWriter::append(&path).err().map(|e| e.to_string()));
    });
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("appending to a pipe returned")
        .expect("refused");
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn a_link_planted_at_the_temporary_name_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, b"precious").unwrap();
    let out = dir.path().join("out.zt");
    // Where the temporary file used to be: `.NAME.tmp-PID`.
    let planted = dir
        .path()
        .join(format!(".out.zt.tmp-{}", std::process::id()));
    symlink(&victim, &planted).unwrap();
    write_one(&out).unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(fs::symlink_metadata(&out).unwrap().is_file());
    assert_eq!(ZtReader::open(&out).unwrap().objects().len(), 1);
    assert!(fs::symlink_metadata(&planted)
        .unwrap()
        .file_type()
        .is_symlink());
    // Only the output and the two files planted are left.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);
}
