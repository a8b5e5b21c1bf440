//! Files replaced atomically: through symbolic links, keeping the old file's mode.
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use tensorwire_core::{replace_with_temporary, temporary_sibling, write_destination};

fn write_through(path: &Path, bytes: &[u8]) {
    let destination = write_destination(path).unwrap();
    let tmp = temporary_sibling(&destination).unwrap();
    assert_eq!(
        tmp,
        temporary_sibling(path).unwrap(),
        "the same name either way"
    );
    fs::write(&tmp, bytes).unwrap();
    replace_with_temporary(&tmp, &destination).unwrap();
    assert!(!tmp.exists(), "the temporary file was renamed away");
}

#[test]
fn a_link_keeps_pointing_at_the_replaced_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("models").join("real.zt");
    fs::create_dir(target.parent().unwrap()).unwrap();
    fs::write(&target, b"old").unwrap();
    let link = dir.path().join("current.zt");
    symlink("models/real.zt", &link).unwrap();
    let chain = dir.path().join("latest.zt");
    symlink(&link, &chain).unwrap();

    assert_eq!(
        write_destination(&chain).unwrap(),
        dir.path().join("models/real.zt")
    );
    assert_eq!(
        temporary_sibling(&chain).unwrap().parent(),
        target.parent(),
        "written beside the target, on its file system"
    );
    write_through(&chain, b"new");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(&chain)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&target).unwrap(), b"new");
}

#[test]
fn a_dangling_link_gets_its_target_created() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("out.safetensors");
    symlink("made-later.safetensors", &link).unwrap();
    write_through(&link, b"data");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read(dir.path().join("made-later.safetensors")).unwrap(),
        b"data"
    );
}

#[test]
fn the_replaced_files_mode_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private.zt");
    fs::write(&path, b"old").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    write_through(&path, b"new");
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(fs::read(&path).unwrap(), b"new");
}

#[test]
fn a_link_loop_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    symlink(&b, &a).unwrap();
    symlink(&a, &b).unwrap();
    let err = temporary_sibling(&a).unwrap_err().to_string();
    assert!(err.contains("symbolic links"), "{err}");
}
