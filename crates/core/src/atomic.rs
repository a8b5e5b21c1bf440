//! Files written atomically: the output goes to a temporary file beside the
//! destination, which is renamed into place once complete.
//!
//! The temporaries this process has created and not yet renamed or removed are kept
//! in a list, so that an interrupted program can remove them
//! ([`remove_temporaries_before_exit`]) without knowing their names.

use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{Error, Result};

/// A temporary created and not yet renamed into place or removed, and the slot that
/// holds its name for signal handlers, if it was published there.
struct Live {
    path: PathBuf,
    signal_slot: Option<usize>,
}

/// The live temporaries.
static LIVE: Mutex<Vec<Live>> = Mutex::new(Vec::new());

/// Names tried before [`create_temporary`] gives up (each taken one is skipped).
const ATTEMPTS: usize = 64;

fn live() -> MutexGuard<'static, Vec<Live>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn forget(live: &mut Vec<Live>, tmp: &Path) {
    live.retain(|entry| {
        if entry.path != tmp {
            return true;
        }
        #[cfg(unix)]
        if let Some(slot) = entry.signal_slot {
            for_signals::withdraw(slot);
        }
        false
    });
}

/// The live temporaries' paths as C strings, for the handler of a fatal signal
/// (SIGBUS), which may neither lock nor allocate: filled only in a program that asked
/// for it ([`keep_temporaries_for_signal_handlers`]), since each name is leaked (a
/// handler may be reading it when its file is renamed or removed).
#[cfg(unix)]
mod for_signals {
    use std::ffi::{c_char, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::ptr::null_mut;
    use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

    /// Most temporaries published at once (a writer has one at a time).
    const SLOTS: usize = 64;

    static ON: AtomicBool = AtomicBool::new(false);
    /// Each non-null entry is a NUL-terminated name from `CString::into_raw`, never
    /// freed.
    pub(super) static NAMES: [AtomicPtr<c_char>; SLOTS] =
        [const { AtomicPtr::new(null_mut()) }; SLOTS];

    pub(super) fn enable() {
        ON.store(true, Ordering::SeqCst);
    }

    /// Publishes `tmp` in a free slot and returns it (with none free it is not
    /// published, and its name stays allocated: best effort).
    pub(super) fn publish(tmp: &Path) -> Option<usize> {
        if !ON.load(Ordering::SeqCst) {
            return None;
        }
        let name = CString::new(tmp.as_os_str().as_bytes()).ok()?.into_raw();
        NAMES.iter().position(|slot| {
            slot.compare_exchange(null_mut(), name, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Empties `slot` (its name stays allocated: see the module).
    pub(super) fn withdraw(slot: usize) {
        NAMES[slot].store(null_mut(), Ordering::SeqCst);
    }
}

/// Makes [`temporary_names_for_signal_handlers`] list this process's temporaries:
/// from now on each temporary's name is also kept where a signal handler can read it
/// without locking. For programs that catch a fatal signal (the CLI catches SIGBUS,
/// which a source file truncated while mapped raises), not for libraries: each name
/// kept is leaked, a few dozen bytes per file written. Unix only.
pub fn keep_temporaries_for_signal_handlers() {
    #[cfg(unix)]
    for_signals::enable();
}

/// The names (NUL-terminated, never freed) of the temporaries not yet renamed into
/// place or removed, one per non-null slot, for the handler of a fatal signal: it may
/// read them with atomic loads and pass them to `unlink(2)`, both async-signal-safe.
/// Empty slots only, unless [`keep_temporaries_for_signal_handlers`] was called.
#[cfg(unix)]
pub fn temporary_names_for_signal_handlers(
) -> &'static [std::sync::atomic::AtomicPtr<std::ffi::c_char>] {
    &for_signals::NAMES
}

/// The file a write to `path` replaces: `path` itself or, when `path` is a symbolic
/// link (or a chain of them), the file it finally names, so that writing through a
/// link updates its target and keeps the link, as writing in place would.
pub fn write_destination(path: &Path) -> Result<PathBuf> {
    /// Links followed before giving up, as the kernel's own limit.
    const MAX_LINKS: usize = 40;
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let is_link = fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return Ok(at);
        }
        let target = fs::read_link(&at).map_err(|e| Error::from(e).with_path(&at))?;
        let resolved = match at.parent() {
            Some(folder) if target.is_relative() => folder.join(target),
            _ => target,
        };
        // A link the kernel follows but whose text names no path (`/proc/self/fd/1`
        // → `pipe:[…]` when stdout is a pipe): the link itself names what it reaches.
        if fs::symlink_metadata(&resolved).is_err() && fs::metadata(&at).is_ok() {
            return Ok(at);
        }
        at = resolved;
    }
    Err(Error::invalid(format!(
        "{}: more than {MAX_LINKS} levels of symbolic links",
        path.display()
    )))
}

/// Refuses to replace `destination` unless it is missing or a regular file (through
/// symbolic links, which [`write_destination`] resolves): renaming a new file over a
/// directory, a pipe, a socket or a device node (`/dev/null`) would replace the node
/// itself, not write to it. The error is [`Error::InvalidArgument`] with the path.
pub fn check_replaceable(destination: &Path) -> Result<()> {
    let refused = |reason: &str| Err(Error::invalid(reason).with_path(destination));
    match fs::metadata(destination) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(meta) if meta.is_dir() => refused("a directory: give the output file's name"),
        Ok(_) => refused(
            "not a regular file (a pipe, socket or device): only a regular file is \
             replaced by a written file",
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::from(e).with_path(destination)),
    }
}

/// A name for a temporary beside `destination`: `.NAME.tmp-PID-RANDOM`.
fn temporary_name(destination: &Path) -> Result<PathBuf> {
    let file_name = destination
        .file_name()
        .ok_or_else(|| Error::invalid(format!("not a file path: {}", destination.display())))?;
    // `RandomState` is seeded from the operating system's random source once per
    // thread and advances with every instance: a different, unguessable value each
    // time, which is all a name needs (`create_new` makes a taken name harmless).
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let mut name = OsString::from(".");
    name.push(file_name);
    name.push(format!(
        ".tmp-{}-{:016x}",
        std::process::id(),
        hasher.finish()
    ));
    Ok(destination.with_file_name(name))
}

/// Creates the temporary file a write to `destination` (as [`write_destination`]
/// gives it) goes to until [`replace_with_temporary`] renames it into place: a new
/// file beside the destination (so on the same file system, where the rename is
/// atomic) named `.NAME.tmp-PID-RANDOM`, opened for writing. Returns the file and its
/// path.
///
/// The destination must be missing or a regular file ([`check_replaceable`]). The
/// temporary is created exclusively (`O_CREAT | O_EXCL`, and `O_NOFOLLOW`): a file or
/// a symbolic link already at the name is never opened or followed, another name is
/// tried instead. Until it is renamed or removed ([`remove_temporary`]), it is on the
/// list [`remove_temporaries_before_exit`] removes.
pub fn create_temporary(destination: &Path) -> Result<(File, PathBuf)> {
    check_replaceable(destination)?;
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    // Created and listed under the lock, so an interrupt never misses it.
    let mut live = live();
    for _ in 0..ATTEMPTS {
        let tmp = temporary_name(destination)?;
        match options.open(&tmp) {
            Ok(file) => {
                #[cfg(unix)]
                let signal_slot = for_signals::publish(&tmp);
                #[cfg(not(unix))]
                let signal_slot = None;
                live.push(Live {
                    path: tmp.clone(),
                    signal_slot,
                });
                return Ok((file, tmp));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Io(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name beside the file after {ATTEMPTS} tries"),
    )))
}

/// Puts the finished temporary file `tmp` (from [`create_temporary`]) in place of
/// `destination` (as [`write_destination`] gave it when the write began, so a link
/// retargeted meanwhile does not move the rename elsewhere), with the permissions of
/// the file it replaces, if any (a new file keeps the mode it was created with). A
/// destination that is no longer missing or a regular file is refused
/// ([`check_replaceable`]); `tmp` is then left for the caller to remove.
pub fn replace_with_temporary(tmp: &Path, destination: &Path) -> Result<()> {
    check_replaceable(destination)?;
    if let Ok(old) = fs::metadata(destination) {
        fs::set_permissions(tmp, old.permissions())?;
    }
    let mut live = live();
    fs::rename(tmp, destination).map_err(|e| Error::from(e).with_path(destination))?;
    forget(&mut live, tmp);
    Ok(())
}

/// Removes the temporary `tmp` (from [`create_temporary`]) of an abandoned write,
/// ignoring a failure (it may be gone already).
pub fn remove_temporary(tmp: &Path) {
    let mut live = live();
    let _ = fs::remove_file(tmp);
    forget(&mut live, tmp);
}

/// Removes every temporary of this process not yet renamed into place or removed,
/// for a program about to exit on a signal, and keeps the list locked for good: a
/// write still under way can then neither create another temporary nor rename one
/// into place (it waits until the process exits). Call it only just before exiting.
pub fn remove_temporaries_before_exit() {
    let mut live = live();
    for tmp in live.drain(..) {
        let _ = fs::remove_file(tmp.path);
    }
    std::mem::forget(live);
}
