//! The cache shared by real processes: concurrent writers and readers, processes
//! SIGKILLed inside `put`, readers' views while other processes overwrite, dead
//! readers' pins.
//!
//! Children are this test binary run again with `TW_CACHE_CHILD` naming their role
//! (the `child` test below dispatches on it and is ignored in normal runs).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tensorwire_cache::{CacheOptions, PutStage, TensorCache};

const ROLE: &str = "TW_CACHE_CHILD";

struct Fixture(TensorCache);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.unlink();
    }
}

fn cache(size: usize, entries: usize) -> Fixture {
    let options = CacheOptions {
        max_entries: Some(entries),
        ..CacheOptions::default()
    };
    Fixture(TensorCache::create(None, size, options).unwrap())
}

/// A value that checks itself: `[key u8][writer u8][seq u64][len u32][payload][fnv u64]`.
fn make_value(key: u8, writer: u8, seq: u64, payload_len: usize) -> Vec<u8> {
    let mut v = vec![key, writer];
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&(payload_len as u32).to_le_bytes());
    v.extend((0..payload_len).map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i) as u8));
    let sum = fnv(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The value's key if it is whole and consistent.
fn verify(v: &[u8]) -> Result<u8, String> {
    if v.len() < 22 {
        return Err(format!("value of {} bytes is too short", v.len()));
    }
    let (body, sum) = v.split_at(v.len() - 8);
    if fnv(body).to_le_bytes() != sum {
        return Err("checksum mismatch: a torn or foreign value".into());
    }
    let len = u32::from_le_bytes(body[10..14].try_into().unwrap()) as usize;
    if body.len() != 14 + len {
        return Err("length mismatch".into());
    }
    Ok(body[0])
}

fn spawn(role: &str, name: &str, extra: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env("TW_CACHE_NAME", name)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits until the child writes a line containing `marker` on stderr.
fn wait_for(child: &mut Child, marker: &str) {
    let stderr = child.stderr.as_mut().unwrap();
    let mut reader = BufReader::new(stderr);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "child exited before printing {marker:?}");
        if line.contains(marker) {
            return;
        }
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let name = env("TW_CACHE_NAME");
    let pause_at = match env("TW_PAUSE_AT").as_str() {
        "reserved" => Some(PutStage::Reserved),
        "filling" => Some(PutStage::Filling),
        "publishing" => Some(PutStage::Publishing),
        "in-place" => Some(PutStage::InPlace),
        _ => None,
    };
    let options = CacheOptions {
        pause_at,
        ..CacheOptions::default()
    };
    let cache = TensorCache::attach(&name, options).unwrap();
    let id: u8 = env("TW_ID").parse().unwrap_or(0);
    match role.as_str() {
        "writer" | "reader" => {
            let until = Instant::now() + Duration::from_millis(env("TW_MILLIS").parse().unwrap());
            let mut seq = 0u64;
            let mut checked = 0u64;
            while Instant::now() < until {
                seq += 1;
                let key = (seq.wrapping_mul(7).wrapping_add(id as u64) % 16) as u8;
                if role == "writer" {
                    let len = (seq as usize * 997 + id as usize * 131) % 30_000;
                    cache
                        .put(&format!("k{key}"), &make_value(key, id, seq, len), None)
                        .unwrap();
                    if seq % 13 == 0 {
                        cache.delete(&format!("k{}", (key + 5) % 16)).unwrap();
                    }
                } else if let Some(v) = cache.get(&format!("k{key}")).unwrap() {
                    let copy = v.to_vec();
                    match verify(&v) {
                        Ok(k) if k == key => {}
                        Ok(k) => panic!("k{key} holds a value for k{k}"),
                        Err(e) => panic!("k{key}: {e}"),
                    }
                    std::thread::yield_now();
                    assert_eq!(&v[..], &copy[..], "a held view changed");
                    checked += 1;
                }
            }
            eprintln!("done {checked}");
        }
        "pause" => {
            // Overwrite `victim` (pinned-free, so size decides in-place vs new block).
            let len: usize = env("TW_LEN").parse().unwrap();
            cache
                .put("victim", &make_value(99, id, 2, len), None)
                .unwrap();
            eprintln!("put finished without pausing");
        }
        "overwriter" => {
            for seq in 0..200u64 {
                cache
                    .put("watched", &make_value(7, id, seq, 4000), None)
                    .unwrap();
            }
            cache.delete("watched").unwrap();
            cache
                .put("watched", &make_value(7, id, 1000, 10), None)
                .unwrap();
            eprintln!("done");
        }
        "pinner" => {
            let view = cache.get("pinned").unwrap().unwrap();
            eprintln!("pinned {}", view.len());
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn writers_and_readers_hammer_one_cache() {
    let f = cache(4 << 20, 64);
    let millis = if cfg!(debug_assertions) { 1500 } else { 3000 };
    let mut children: Vec<Child> = (0..3)
        .flat_map(|i| {
            let args = [("TW_ID", i.to_string()), ("TW_MILLIS", millis.to_string())];
            [
                spawn("writer", f.0.name(), &args),
                spawn("reader", f.0.name(), &args),
            ]
        })
        .collect();
    // This process reads too, holding views across others' writes: for as long as
    // they run, and on (to a long deadline) until it has seen a value, however slowly
    // the children started on a loaded machine.
    let until = Instant::now() + Duration::from_millis(millis);
    let give_up = Instant::now() + Duration::from_secs(60);
    let mut checked = 0;
    while Instant::now() < until || (checked == 0 && Instant::now() < give_up) {
        for key in 0..16u8 {
            if let Some(v) = f.0.get(&format!("k{key}")).unwrap() {
                assert_eq!(verify(&v), Ok(key));
                checked += 1;
            }
        }
    }
    for child in &mut children {
        let out = child.wait().unwrap();
        assert!(out.success(), "a child failed: {out}");
    }
    assert!(checked > 0);
    f.0.check_consistency().unwrap();
    let stats = f.0.stats().unwrap();
    assert!(stats.hits > 0 && stats.entries > 0, "{stats:?}");
    assert_eq!(stats.processes, 1, "children detached: {stats:?}");
    for key in 0..16u8 {
        if let Some(v) = f.0.get(&format!("k{key}")).unwrap() {
            assert_eq!(verify(&v), Ok(key));
        }
    }
}

/// Fills a cache with 20 healthy entries and a `victim`, lets a child die inside a
/// `put` of `victim` at `stage`, and checks what survives.
fn killed_mid_put(stage: &str, new_len: usize) {
    let f = cache(2 << 20, 64);
    let healthy: Vec<Vec<u8>> = (0..20)
        .map(|i| make_value(i, 0, 1, 1000 + i as usize * 50))
        .collect();
    for (i, v) in healthy.iter().enumerate() {
        f.0.put(&format!("h{i}"), v, None).unwrap();
    }
    let old = make_value(99, 0, 1, 3000);
    f.0.put("victim", &old, None).unwrap();

    let mut child = spawn(
        "pause",
        f.0.name(),
        &[
            ("TW_PAUSE_AT", stage.into()),
            ("TW_ID", "1".into()),
            ("TW_LEN", new_len.to_string()),
        ],
    );
    wait_for(&mut child, "paused at");
    kill(&mut child);

    for (i, v) in healthy.iter().enumerate() {
        let got =
            f.0.get(&format!("h{i}"))
                .unwrap()
                .expect("healthy entry lost");
        assert_eq!(&got[..], &v[..]);
    }
    let new = make_value(99, 1, 2, new_len);
    match f.0.get("victim").unwrap() {
        Some(v) => {
            assert_eq!(verify(&v), Ok(99), "torn victim");
            assert!(v[..] == old[..] || v[..] == new[..]);
        }
        // Only an in-place update may lose the key (its old bytes were being rewritten).
        None => assert_eq!(stage, "in-place"),
    }
    f.0.check_consistency().unwrap();
    let stats = f.0.stats().unwrap();
    if stage != "filling" {
        assert!(stats.recoveries >= 1, "{stats:?}");
    }
    // The dead child's reservations are reclaimed once their space is needed.
    let data = f.0.layout().data_size;
    f.0.put("fill", &vec![1; data - 64], None).unwrap();
    f.0.check_consistency().unwrap();
    assert_eq!(f.0.stats().unwrap().processes, 1);
}

#[test]
fn killed_holding_the_lock_after_reserving() {
    killed_mid_put("reserved", 5000);
}

#[test]
fn killed_while_filling_outside_the_lock() {
    killed_mid_put("filling", 5000);
}

#[test]
fn killed_between_publishing_and_retiring_the_old_value() {
    killed_mid_put("publishing", 5000);
}

#[test]
fn killed_while_updating_in_place() {
    // Same block size as the old value: the update goes in place under the lock.
    killed_mid_put("in-place", 3000);
}

#[test]
fn a_readers_view_is_unchanged_while_another_process_overwrites() {
    let f = cache(2 << 20, 64);
    let original = make_value(7, 0, 1, 4000);
    f.0.put("watched", &original, None).unwrap();
    let view = f.0.get("watched").unwrap().unwrap();
    let mut child = spawn("overwriter", f.0.name(), &[("TW_ID", "3".into())]);
    assert!(child.wait().unwrap().success());
    assert_eq!(&view[..], &original[..]);
    let now = f.0.get("watched").unwrap().unwrap();
    assert_eq!(&now[..], &make_value(7, 3, 1000, 10)[..]);
    f.0.check_consistency().unwrap();
}

/// A cache holding, past half its data region, a block only a killed reader pinned;
/// returns the fixture and that block's size.
fn pinned_by_a_dead_reader() -> (Fixture, usize) {
    let f = cache(1 << 20, 16);
    let half = f.0.layout().data_size / 2 + 4096;
    f.0.put("pinned", &vec![5; half], None).unwrap();
    let mut child = spawn("pinner", f.0.name(), &[]);
    wait_for(&mut child, "pinned");
    f.0.delete("pinned").unwrap();
    assert!(f.0.stats().unwrap().pinned_bytes >= half as u64);
    kill(&mut child);
    (f, half)
}

#[test]
fn a_dead_readers_pins_are_reclaimed() {
    let (f, half) = pinned_by_a_dead_reader();
    // Needing the space makes the cache repair itself: the dead reader's pin goes.
    f.0.put("big", &vec![6; half], None).unwrap();
    assert_eq!(f.0.stats().unwrap().pinned_bytes, 0);
    f.0.check_consistency().unwrap();
}

#[test]
fn a_dead_readers_pins_are_reclaimed_even_when_an_expired_entry_goes_first() {
    // The first reserve round purges the expired entry and so skips the dead-process
    // stage; the room check must still not count the dead reader's pin as held.
    let (f, half) = pinned_by_a_dead_reader();
    f.0.put("short", &[1u8; 100], Some(Duration::from_millis(1)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    f.0.put("big", &vec![6; half], None).unwrap();
    assert_eq!(f.0.stats().unwrap().pinned_bytes, 0);
    f.0.check_consistency().unwrap();
}

/// A handle whose `wait_check` says stop ends its wait for a lock another process
/// holds (a child paused holding it) after that many slices, with an `Interrupted`
/// I/O error; without a check the wait runs its whole `lock_timeout`, and times out
/// naming all of it.
#[test]
fn a_wait_check_ends_a_lock_wait_early() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CHECKS: AtomicU32 = AtomicU32::new(0);
    fn stop_on_third_check() -> bool {
        CHECKS.fetch_add(1, Ordering::SeqCst) >= 2
    }
    let f = cache(1 << 20, 16);
    let mut child = spawn(
        "pause",
        f.0.name(),
        &[
            ("TW_PAUSE_AT", "reserved".into()),
            ("TW_ID", "1".into()),
            ("TW_LEN", "100".into()),
        ],
    );
    wait_for(&mut child, "paused at");
    // Attaching registers this process under the pool lock: it waits for the child.
    let attach = |wait_check, lock_timeout| {
        let options = CacheOptions {
            lock_timeout,
            wait_check,
            ..CacheOptions::default()
        };
        let started = Instant::now();
        (TensorCache::attach(f.0.name(), options), started.elapsed())
    };
    let (stopped, waited) = attach(Some(stop_on_third_check), Duration::from_secs(5));
    let (timed_out, waited_out) = attach(None, Duration::from_millis(300));
    kill(&mut child);
    match stopped {
        Err(tensorwire_core::Error::Io(e)) => {
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "{e}")
        }
        other => panic!("expected an interrupted wait, got {:?}", other.map(|_| ())),
    }
    assert_eq!(CHECKS.load(Ordering::SeqCst), 3);
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    match timed_out {
        Err(tensorwire_core::Error::Timeout { waited_ms, .. }) => assert_eq!(waited_ms, 300),
        other => panic!("expected a timeout, got {:?}", other.map(|_| ())),
    }
    assert!(waited_out >= Duration::from_millis(300), "{waited_out:?}");
}
