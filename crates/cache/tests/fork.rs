//! The fork hooks (`prepare_fork`, `parent_after_fork`, `child_after_fork`), alone in
//! this test binary: they walk every cache of the process, so other tests' caches
//! must not be there.

use tensorwire_cache::{
    child_after_fork, parent_after_fork, prepare_fork, CacheOptions, TensorCache,
};

struct Fixture(TensorCache);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.unlink();
    }
}

fn cache() -> Fixture {
    let options = CacheOptions {
        max_entries: Some(16),
        ..CacheOptions::default()
    };
    Fixture(TensorCache::create(None, 1 << 20, options).unwrap())
}

#[test]
fn fork_hooks() {
    // One test, run in order: the hooks see every cache of the process.
    a_forked_child_keeps_its_views_when_the_parent_drops_its_own(false);
    a_forked_child_keeps_its_views_when_the_parent_drops_its_own(true);
    a_view_dropped_just_before_the_fork_leaves_no_pin_in_the_child();
    forks_that_fail_leave_few_slots_claimed();
}

/// The parent drops its view and rewrites the entry in place right after the fork,
/// before the child has run: the child's inherited view is unchanged. Also for a view
/// taken between `prepare_fork` and the fork (`in_window`: other hooks and threads
/// run there).
fn a_forked_child_keeps_its_views_when_the_parent_drops_its_own(in_window: bool) {
    let f = cache();
    let c = &f.0;
    c.put("k", &[1u8; 4096], None).unwrap();
    let mut go = [0i32; 2];
    // SAFETY: a fresh array of two descriptors for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    let early = (!in_window).then(|| c.get("k").unwrap().unwrap());
    if in_window {
        // Something must be viewed for `prepare_fork` to reserve a slot at all.
        c.put("other", &[9u8; 64], None).unwrap();
    }
    let other = in_window.then(|| c.get("other").unwrap().unwrap());
    prepare_fork();
    let view = early.unwrap_or_else(|| c.get("k").unwrap().unwrap());
    // SAFETY: the child only calls the after-fork hook, reads a pipe, compares bytes
    // it inherited and leaves with `_exit`, as a forked child of a threaded process
    // may; the parent carries on as usual.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        child_after_fork();
        let mut byte = 0u8;
        // SAFETY: reading one byte into a local from the pipe's read end.
        unsafe { libc::read(go[0], (&mut byte as *mut u8).cast(), 1) };
        let same = view.iter().all(|&b| b == 1);
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(if same { 0 } else { 1 }) };
    }
    parent_after_fork();
    drop(view);
    drop(other);
    // Same size, and the parent no longer pins it: in place, were the child not
    // pinning it already.
    c.put("k", &[2u8; 4096], None).unwrap();
    // SAFETY: writing one byte from a local to the pipe's write end.
    unsafe { libc::write(go[1], [0u8].as_ptr().cast(), 1) };
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "{status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child's view changed");
    assert_eq!(&*c.get("k").unwrap().unwrap(), &[2u8; 4096][..]);
    // SAFETY: closing the two descriptors pipe(2) opened.
    unsafe {
        libc::close(go[0]);
        libc::close(go[1]);
    }
    c.check_consistency().unwrap();
}

/// A view dropped after `prepare_fork` pinned it for the child but before the fork
/// (other Python hooks run in between, and other threads with them): the child
/// holds no view of it, so its takeover clears that pin.
fn a_view_dropped_just_before_the_fork_leaves_no_pin_in_the_child() {
    let f = cache();
    let c = &f.0;
    c.put("gone", &[3u8; 4096], None).unwrap();
    c.put("kept", &[4u8; 4096], None).unwrap();
    let gone = c.get("gone").unwrap().unwrap();
    let kept = c.get("kept").unwrap().unwrap();
    let (mut up, mut down) = ([0i32; 2], [0i32; 2]);
    // SAFETY: fresh arrays of two descriptors for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe(up.as_mut_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(down.as_mut_ptr()) }, 0);
    prepare_fork();
    drop(gone);
    // SAFETY: as in the test above: the child calls the hook, talks over the pipes
    // and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        child_after_fork();
        let mut byte = 0u8;
        // SAFETY: one byte to and from locals over the pipes.
        unsafe {
            libc::write(up[1], [0u8].as_ptr().cast(), 1);
            libc::read(down[0], (&mut byte as *mut u8).cast(), 1);
        }
        let same = kept.iter().all(|&b| b == 4);
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(if same { 0 } else { 1 }) };
    }
    parent_after_fork();
    let mut byte = 0u8;
    // SAFETY: one byte into a local: the child has taken its slot over.
    unsafe { libc::read(up[0], (&mut byte as *mut u8).cast(), 1) };
    drop(kept);
    // With the child alive: `gone`'s block is no one's now; `kept` is the child's.
    assert!(c.delete("gone").unwrap());
    assert_eq!(c.stats().unwrap().pinned_bytes, 0, "a pin no view holds");
    assert!(c.delete("kept").unwrap());
    assert!(
        c.stats().unwrap().pinned_bytes > 0,
        "the child's view lost its pin"
    );
    c.check_consistency().unwrap();
    let mut status = 0;
    // SAFETY: one byte from a local to the child; then waiting for it.
    unsafe {
        libc::write(down[1], [0u8].as_ptr().cast(), 1);
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
    }
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child's view changed");
    for fd in up.into_iter().chain(down) {
        // SAFETY: closing the descriptors pipe(2) opened.
        unsafe { libc::close(fd) };
    }
}

/// `prepare_fork` and `parent_after_fork` with no child between them (a fork that
/// failed, as under a process limit): at most eight slots stay claimed for children
/// that never come, however many forks fail.
fn forks_that_fail_leave_few_slots_claimed() {
    let f = cache();
    let c = &f.0;
    c.put("k", &[7u8; 100], None).unwrap();
    let view = c.get("k").unwrap().unwrap();
    for _ in 0..50 {
        prepare_fork();
        parent_after_fork();
    }
    assert_eq!(c.stats().unwrap().processes, 1 + 8);
    // Those slots pin what this process viewed, until their deadline passes (30 s)
    // and a repair drops them, as a dead process's.
    drop(view);
    assert!(c.delete("k").unwrap());
    assert!(c.stats().unwrap().pinned_bytes > 0);
    c.check_consistency().unwrap();
}
