//! Files replaced atomically: through symbolic links, keeping the old file's mode,
//! never over a pipe or device, through temporaries that are new files.
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::path::Path;

use std::io::Write;
use std::process::Command;

use tensorwire_core::{
    check_replaceable, create_temporary, remove_temporary, replace_with_temporary,
    write_destination, Error,
};

fn write_through(path: &Path, bytes: &[u8]) {
    let destination = write_destination(path).unwrap();
    let (mut file, tmp) = create_temporary(&destination).unwrap();
    file.write_all(bytes).unwrap();
    drop(file);
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
    let (_, tmp) = create_temporary(&write_destination(&chain).unwrap()).unwrap();
    assert_eq!(
        tmp.parent(),
        target.parent(),
        "written beside the target, on its file system"
    );
    remove_temporary(&tmp);
    assert!(!tmp.exists());
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
    let err = write_destination(&a).unwrap_err().to_string();
    assert!(err.contains("symbolic links"), "{err}");
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

#[track_caller]
fn assert_refused_as_not_regular(e: Error, path: &Path) {
    assert!(matches!(e.root(), Error::InvalidArgument { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("not a regular file"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn a_pipe_or_device_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("out.zt");
    mkfifo(&fifo);
    let e = create_temporary(&fifo).unwrap_err();
    assert_refused_as_not_regular(e, &fifo);
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary was created"
    );
    // The rename is refused too, should the destination change after the temporary
    // was created.
    let later = dir.path().join("later.zt");
    let (_, tmp) = create_temporary(&later).unwrap();
    mkfifo(&later);
    let e = replace_with_temporary(&tmp, &later).unwrap_err();
    assert_refused_as_not_regular(e, &later);
    assert!(fs::symlink_metadata(&later).unwrap().file_type().is_fifo());
    remove_temporary(&tmp);

    // A device node, directly or through a link (resolved first, as a write does);
    // only checked, so that nothing is ever created beside it.
    let null = Path::new("/dev/null");
    assert_refused_as_not_regular(check_replaceable(null).unwrap_err(), null);
    let link = dir.path().join("null.zt");
    symlink(null, &link).unwrap();
    let e = check_replaceable(&write_destination(&link).unwrap()).unwrap_err();
    assert_refused_as_not_regular(e, null);
    assert!(fs::metadata(null).unwrap().file_type().is_char_device());

    let e = check_replaceable(dir.path()).unwrap_err().to_string();
    assert!(e.contains("a directory"), "{e}");
    check_replaceable(&dir.path().join("missing.zt")).unwrap();
}

#[test]
fn a_temporary_is_a_new_file_never_a_planted_one() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, b"precious").unwrap();
    let destination = dir.path().join("out.zt");
    // Links at the names a temporary could have had (the old `.NAME.tmp-PID`).
    symlink(
        &victim,
        dir.path()
            .join(format!(".out.zt.tmp-{}", std::process::id())),
    )
    .unwrap();
    let (mut a, tmp_a) = create_temporary(&destination).unwrap();
    let (_, tmp_b) = create_temporary(&destination).unwrap();
    assert_ne!(tmp_a, tmp_b, "each temporary has a name of its own");
    for tmp in [&tmp_a, &tmp_b] {
        let name = tmp.file_name().unwrap().to_str().unwrap();
        let prefix = format!(".out.zt.tmp-{}-", std::process::id());
        assert!(name.starts_with(&prefix), "{name}");
        assert!(!fs::symlink_metadata(tmp).unwrap().file_type().is_symlink());
    }
    a.write_all(b"new").unwrap();
    drop(a);
    replace_with_temporary(&tmp_a, &destination).unwrap();
    remove_temporary(&tmp_b);
    assert!(!tmp_b.exists());
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(fs::symlink_metadata(&destination).unwrap().is_file());
    assert_eq!(fs::read(&destination).unwrap(), b"new");
}
