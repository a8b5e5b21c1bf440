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
    a_forked_child_keeps_its_views_when_the_parent_drops_its_own();
    forks_that_fail_leave_few_slots_claimed();
}

/// The parent drops its view and rewrites the entry in place right after the fork,
/// before the child has run: the child's inherited view is unchanged.
fn a_forked_child_keeps_its_views_when_the_parent_drops_its_own() {
    let f = cache();
    let c = &f.0;
    c.put("k", &[1u8; 4096], None).unwrap();
    let view = c.get("k").unwrap().unwrap();
    let mut go = [0i32; 2];
    // SAFETY: a fresh array of two descriptors for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    prepare_fork();
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
