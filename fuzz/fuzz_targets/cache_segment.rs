//! Corrupts the mutable part of a live cache segment (header counters, LRU ends,
//! process registry, key index, free-extent table, entry slots) with arbitrary
//! patches, optionally flags it for repair, then runs every operation on it.
//!
//! Nothing may panic, hang or touch memory outside the segment, whatever the tables
//! say. When the repair flag is set (as after a process died holding the lock), the
//! first operation repairs the cache, and from then on `check_consistency` must pass.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tensorwire_cache::{CacheOptions, TensorCache};
use tensorwire_shm::{Access, Segment, MUTEX_SIZE};

/// Header offsets this target relies on (see `tensorwire_cache::layout`).
const MUTABLE_START: usize = 128;
const NEEDS_RECOVERY: usize = 208;
const MUTEX: usize = 256;

struct World {
    cache: TensorCache,
    raw: Segment,
    pristine: Vec<u8>,
    tables_end: usize,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let options = CacheOptions {
            max_entries: Some(16),
            max_processes: 8,
            lock_timeout: Duration::from_secs(5),
            ..CacheOptions::default()
        };
        let cache = TensorCache::create(None, 256 << 10, options).unwrap();
        let raw = Segment::open(cache.name(), Access::ReadWrite).unwrap();
        cache.unlink().unwrap(); // nothing left in /dev/shm when the fuzzer exits
        for (i, len) in [10usize, 100, 1000, 5000, 64, 20_000].into_iter().enumerate() {
            let ttl = (i == 2).then(|| Duration::from_secs(3600));
            cache.put(&format!("k{i}"), &vec![i as u8; len], ttl).unwrap();
        }
        let pristine = raw.as_slice().to_vec();
        let tables_end = cache.layout().data_offset;
        World {
            cache,
            raw,
            pristine,
            tables_end,
        }
    })
}

/// Writes segment bytes as a corruption would.
fn raw_write(segment: &Segment, offset: usize, data: &[u8]) {
    // SAFETY: the target holds no reference into the segment's bytes while it writes
    // (the cache reads them through its own map, between these writes).
    unsafe { segment.write_at(offset, data) }.unwrap();
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let Some((&flags, mut patches)) = data.split_first() else {
        return;
    };
    // Restore the pristine segment around the (unlocked) mutex.
    raw_write(&w.raw, 0, &w.pristine[..MUTEX]);
    let after_mutex = MUTEX + MUTEX_SIZE;
    raw_write(&w.raw, after_mutex, &w.pristine[after_mutex..]);

    // Patches: [offset u16 (scaled into the mutable area)][len u8][bytes].
    let span = w.tables_end - MUTABLE_START;
    while patches.len() >= 3 {
        let at = u16::from_le_bytes([patches[0], patches[1]]) as usize;
        let len = (patches[2] as usize).min(patches.len() - 3);
        let bytes = &patches[3..3 + len];
        patches = &patches[3 + len..];
        let off = MUTABLE_START + at * span / 65_536;
        let end = (off + bytes.len()).min(w.tables_end);
        // Never write over the mutex itself (that would be undefined behaviour in
        // pthreads, not a cache bug).
        for (i, &b) in bytes[..end - off].iter().enumerate() {
            let pos = off + i;
            if !(MUTEX..after_mutex).contains(&pos) {
                raw_write(&w.raw, pos, &[b]);
            }
        }
    }
    let repair = flags & 1 != 0;
    if repair {
        raw_write(&w.raw, NEEDS_RECOVERY, &1u32.to_le_bytes());
    }

    let c = &w.cache;
    let _ = c.stats();
    if repair {
        c.check_consistency().expect("a repaired cache is consistent");
    } else {
        // Damage unrepaired: the check may fail, never panic.
        let _ = c.check_consistency();
    }
    for i in 0..8 {
        if let Ok(Some(v)) = c.get(&format!("k{i}")) {
            let _ = v.iter().map(|&b| b as u64).sum::<u64>();
        }
        let _ = c.info(&format!("k{i}"));
    }
    let _ = c.keys();
    let len = (flags as usize >> 1) * 300;
    let _ = c.put("new", &vec![7; len], None);
    let _ = c.put("k1", &vec![9; 100], None);
    let _ = c.delete("k3");
    if let Ok(Some(v)) = c.get("new") {
        if repair {
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 7));
        }
    }
    if flags & 0x80 != 0 {
        let _ = c.clear();
    }
    if repair {
        c.check_consistency().expect("operations keep a repaired cache consistent");
    }
});
