//! Single-process behaviour of the cache: values, pins, LRU, TTL, space, bad segments.

use std::time::Duration;

use proptest::prelude::*;
use tensorwire_cache::{CacheOptions, TensorCache};
use tensorwire_core::Error;
use tensorwire_shm::{CreateOptions, Segment};

struct Fixture(TensorCache);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.unlink();
    }
}

fn cache(size: usize, entries: Option<usize>) -> Fixture {
    let options = CacheOptions {
        max_entries: entries,
        ..CacheOptions::default()
    };
    Fixture(TensorCache::create(None, size, options).unwrap())
}

fn value(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

#[test]
fn put_get_delete_round_trip() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    assert!(c.get("missing").unwrap().is_none());
    c.put("a", &value(1, 1000), None).unwrap();
    c.put("ключ", &value(2, 10), None).unwrap();
    assert_eq!(&*c.get("a").unwrap().unwrap(), &value(1, 1000)[..]);
    assert_eq!(&*c.get("ключ").unwrap().unwrap(), &value(2, 10)[..]);
    assert!(c.contains("a").unwrap());
    assert_eq!(c.len().unwrap(), 2);
    assert!(c.delete("a").unwrap());
    assert!(!c.delete("a").unwrap());
    assert!(c.get("a").unwrap().is_none());
    let stats = c.stats().unwrap();
    assert_eq!((stats.entries, stats.hits, stats.misses), (1, 2, 2));
    assert!((stats.hit_rate() - 0.5).abs() < 1e-9);
    c.check_consistency().unwrap();
}

#[test]
fn views_are_zero_copy_aligned_and_survive_delete_and_overwrite() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    c.put("k", &value(7, 5000), None).unwrap();
    let view = c.get("k").unwrap().unwrap();
    let again = c.get("k").unwrap().unwrap();
    assert_eq!(
        view.as_ptr(),
        again.as_ptr(),
        "two gets view the same bytes"
    );
    assert_eq!(view.as_ptr() as usize % 64, 0);

    // Overwrite with the same size while pinned: copy on write, old view unchanged.
    c.put("k", &value(9, 5000), None).unwrap();
    assert_eq!(&*view, &value(7, 5000)[..]);
    assert_eq!(&*c.get("k").unwrap().unwrap(), &value(9, 5000)[..]);
    c.delete("k").unwrap();
    assert_eq!(&*view, &value(7, 5000)[..]);
    assert!(c.stats().unwrap().pinned_bytes >= 5000);
    c.check_consistency().unwrap();
    drop(view);
    assert!(
        c.stats().unwrap().pinned_bytes >= 5000,
        "still one view alive"
    );
    drop(again);
    let stats = c.stats().unwrap();
    assert_eq!((stats.pinned_bytes, stats.used_bytes), (0, 0));
    c.check_consistency().unwrap();
}

#[test]
fn unpinned_same_size_update_is_in_place() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    c.put("k", &value(1, 4096), None).unwrap();
    let first = c.get("k").unwrap().unwrap().as_ptr() as usize;
    c.put("k", &value(2, 4000), None).unwrap();
    let view = c.get("k").unwrap().unwrap();
    assert_eq!(view.as_ptr() as usize, first, "same block reused");
    assert_eq!(&*view, &value(2, 4000)[..]);
    assert_eq!(c.stats().unwrap().used_bytes, 4096);
    c.check_consistency().unwrap();
}

#[test]
fn a_failing_fill_stores_nothing_and_keeps_the_old_value() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    c.put("k", b"old", None).unwrap();
    let pin = c.get("k").unwrap().unwrap(); // forces the copy-on-write path
    let err = c
        .put_with("k", 100, None, |_| Err(Error::invalid("encoder failed")))
        .unwrap_err();
    assert!(err.to_string().contains("encoder failed"));
    drop(pin);
    assert_eq!(&*c.get("k").unwrap().unwrap(), b"old");
    // Unpinned and the same size: the update goes in place, so a failure drops the key.
    let err = c.put_with("k", 10, None, |_| Ok(11)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }));
    assert!(c.get("k").unwrap().is_none());
    c.check_consistency().unwrap();
}

#[test]
fn least_recently_used_goes_first() {
    // 4 entry slots: the fifth put evicts the least recently used key.
    let f = cache(64 << 10, Some(4));
    let c = &f.0;
    for k in ["a", "b", "c", "d"] {
        c.put(k, b"v", None).unwrap();
    }
    drop(c.get("a").unwrap());
    c.put("e", b"v", None).unwrap();
    assert_eq!(c.keys().unwrap(), ["e", "a", "d", "c"]);
    assert_eq!(c.stats().unwrap().evictions, 1);

    // Space, not slots: a big value evicts from the tail until it fits.
    let f = cache(256 << 10, Some(64));
    let c = &f.0;
    let data = c.layout().data_size;
    for i in 0..4 {
        c.put(&format!("k{i}"), &vec![i; data / 4], None).unwrap();
    }
    drop(c.get("k0").unwrap());
    c.put("big", &vec![9; data / 2], None).unwrap();
    assert_eq!(c.keys().unwrap(), ["big", "k0", "k3"]);
    c.check_consistency().unwrap();
}

/// The TTL of entries a test waits out.
const SHORT_TTL: Duration = Duration::from_secs(2);

#[test]
fn entries_expire() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    // A TTL long enough that a test thread stalled on a loaded machine still finds the
    // entry alive, then a sleep past it (a sleep only ever lasts longer).
    c.put("short", b"x", Some(SHORT_TTL)).unwrap();
    c.put("long", b"y", Some(Duration::from_secs(3600)))
        .unwrap();
    c.put("forever", b"z", None).unwrap();
    let info = c.info("short").unwrap().unwrap();
    assert_eq!(info.ttl, Some(SHORT_TTL));
    assert!(c.get("short").unwrap().is_some());
    std::thread::sleep(SHORT_TTL + Duration::from_millis(100));
    assert!(c.get("short").unwrap().is_none());
    assert!(!c.contains("short").unwrap());
    assert_eq!(c.keys().unwrap().len(), 2);
    assert_eq!(c.stats().unwrap().expirations, 1);
    assert!(c.info("forever").unwrap().unwrap().ttl.is_none());
    c.check_consistency().unwrap();
}

#[test]
fn stats_count_entries_as_len_does_expired_ones_left_out() {
    let f = cache(256 << 10, None);
    let c = &f.0;
    c.put("short", b"x", Some(SHORT_TTL)).unwrap();
    c.put("forever", b"y", None).unwrap();
    assert_eq!(c.stats().unwrap().entries, 2);
    std::thread::sleep(SHORT_TTL + Duration::from_millis(100));
    // Nothing has touched the expired entry yet; it is still indexed.
    assert_eq!(c.len().unwrap(), 1);
    assert_eq!(c.stats().unwrap().entries, 1);
}

#[test]
fn a_pool_larger_than_dev_shm_has_free_is_refused_at_creation() {
    let Err(err) = TensorCache::create(None, 1 << 50, CacheOptions::default()) else {
        panic!("a 1 PiB pool was made");
    };
    assert!(matches!(err.root(), Error::NoSpace { .. }), "{err}");
}

#[test]
fn a_value_larger_than_the_pool_fails_without_evicting() {
    let f = cache(256 << 10, None);
    let c = &f.0;
    c.put("keep", b"v", None).unwrap();
    let too_big = c.layout().data_size + 1;
    let err = c.put_with("huge", too_big, None, |_| Ok(0)).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(c.contains("keep").unwrap());
    assert_eq!(c.stats().unwrap().evictions, 0);
}

#[test]
fn pinned_memory_cannot_be_evicted_until_released() {
    let f = cache(256 << 10, Some(16));
    let c = &f.0;
    let half = c.layout().data_size / 2 + 64;
    c.put("a", &vec![1; half], None).unwrap();
    let pin = c.get("a").unwrap().unwrap();
    let err = c.put("b", &vec![2; half], None).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("pinned views"), "{err}");
    assert_eq!(pin[0], 1, "the evicted value is still readable");
    drop(pin);
    c.put("b", &vec![2; half], None).unwrap();
    c.check_consistency().unwrap();
}

/// Eviction passes over the entries readers pin: evicting one would free neither its
/// block nor its slot while the reader holds it, and would lose it from the cache.
#[test]
fn eviction_passes_over_entries_readers_pin() {
    let f = cache(256 << 10, Some(16));
    let c = &f.0;
    let quarter = c.layout().data_size / 4 - 4096;
    for k in ["a", "b", "c"] {
        c.put(k, &vec![k.as_bytes()[0]; quarter], None).unwrap();
    }
    let pin = c.get("a").unwrap().unwrap();
    // `a`, pinned, is the least recently used again.
    drop(c.get("b").unwrap());
    drop(c.get("c").unwrap());
    c.put("d", &vec![b'd'; quarter], None).unwrap();
    c.put("e", &vec![b'e'; quarter], None).unwrap();
    assert_eq!(c.stats().unwrap().evictions, 1);
    assert!(c.contains("a").unwrap(), "the pinned entry was evicted");
    assert!(
        !c.contains("b").unwrap(),
        "the next least recently used stays"
    );
    assert_eq!(pin[0], b'a');
    c.check_consistency().unwrap();
}

/// Every entry slot pinned by a reader: a put fails with `NoSpace` and evicts nothing.
#[test]
fn a_put_without_a_slot_beside_pinned_entries_evicts_nothing() {
    let f = cache(1 << 20, Some(4));
    let c = &f.0;
    let pins: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|k| {
            c.put(k, &[1, 2, 3], None).unwrap();
            c.get(k).unwrap().unwrap()
        })
        .collect();
    let err = c.put("e", &[4], None).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("slot"), "{err}");
    assert_eq!(c.stats().unwrap().evictions, 0);
    assert_eq!(c.len().unwrap(), 4);
    drop(pins);
    c.put("e", &[4], None).unwrap();
    assert_eq!(c.stats().unwrap().evictions, 1);
    c.check_consistency().unwrap();
}

#[test]
fn a_put_that_cannot_fit_beside_pinned_memory_evicts_nothing() {
    let f = cache(256 << 10, Some(16));
    let c = &f.0;
    let half = c.layout().data_size / 2 + 64;
    c.put("pinned", &vec![1; half], None).unwrap();
    for i in 0..4 {
        c.put(&format!("small{i}"), &[i as u8; 100], None).unwrap();
    }
    let pin = c.get("pinned").unwrap().unwrap();
    let err = c.put("big", &vec![2; half], None).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("nothing was evicted"), "{err}");
    assert_eq!(c.stats().unwrap().evictions, 0);
    for i in 0..4 {
        assert!(
            c.contains(&format!("small{i}")).unwrap(),
            "small{i} was evicted"
        );
    }
    assert!(c.contains("pinned").unwrap());
    drop(pin);
    // Once the reader lets go, the same put evicts what it needs and fits.
    c.put("big", &vec![2; half], None).unwrap();
    c.check_consistency().unwrap();
}

#[test]
fn keys_info_and_clear() {
    let f = cache(1 << 20, None);
    let c = &f.0;
    assert!(c.put(&"k".repeat(129), b"v", None).is_err());
    c.put(&"k".repeat(128), b"v", None).unwrap();
    let packet = tensorwire_packet::encode(
        tensorwire_core::DType::F32,
        &tensorwire_core::Shape::from_dims(&[2, 3]).unwrap(),
        &[0u8; 24],
        Default::default(),
    )
    .unwrap();
    c.put("t", &packet, None).unwrap();
    let info = c.info("t").unwrap().unwrap();
    let p = info.packet.unwrap();
    assert_eq!(
        (p.dtype, p.shape.dims()),
        (tensorwire_core::DType::F32, &[2u64, 3][..])
    );
    assert_eq!(info.size, packet.len() as u64);
    assert!(c.info(&"k".repeat(128)).unwrap().unwrap().packet.is_none());
    let pin = c.get("t").unwrap().unwrap();
    c.clear().unwrap();
    assert!(c.keys().unwrap().is_empty());
    assert_eq!(&pin[..], &packet[..]);
    c.check_consistency().unwrap();
}

#[test]
fn a_second_handle_attaches_by_name() {
    let f = cache(1 << 20, None);
    f.0.put("shared", b"hello", None).unwrap();
    let other = TensorCache::attach(f.0.name(), CacheOptions::default()).unwrap();
    assert_eq!(&*other.get("shared").unwrap().unwrap(), b"hello");
    other.put("back", b"world", None).unwrap();
    assert_eq!(&*f.0.get("back").unwrap().unwrap(), b"world");
    // One registration per process and pool, whatever its handles.
    assert_eq!(f.0.stats().unwrap().processes, 1);
    drop(other);
    assert_eq!(f.0.stats().unwrap().processes, 1);
}

/// Handles opened and dropped one after another, each leaving a view alive, share the
/// process's one registry slot: 300 of them (more than the registry's 256 slots) do
/// not lock other processes out, and their pins hold until the views go.
#[test]
fn views_outliving_their_handles_share_one_registry_slot() {
    let f = cache(1 << 20, None);
    f.0.put("k", b"value", None).unwrap();
    let name = f.0.name().to_owned();
    let views: Vec<_> = (0..300)
        .map(|_| {
            let handle = TensorCache::attach(&name, CacheOptions::default()).unwrap();
            handle.get("k").unwrap().unwrap()
        })
        .collect();
    assert_eq!(f.0.stats().unwrap().processes, 1);
    assert!(f.0.delete("k").unwrap());
    assert!(
        f.0.stats().unwrap().pinned_bytes > 0,
        "the views pin the value"
    );
    assert!(views.iter().all(|v| &v[..] == b"value"));
    drop(views);
    assert_eq!(f.0.stats().unwrap().pinned_bytes, 0);
    f.0.check_consistency().unwrap();
}

/// Overwrites segment bytes behind the cache's back, as a corruption would.
fn raw_write(segment: &Segment, offset: usize, data: &[u8]) {
    // SAFETY: this test holds no reference into the segment's bytes while writing.
    unsafe { segment.write_at(offset, data) }.unwrap();
}

#[test]
fn a_free_table_pointing_outside_the_data_region_is_rebuilt_not_written_through() {
    // A free extent whose offset wraps the data region's start around to the header:
    // a put taking it used to write its value over the header and the lock.
    let f = cache(256 << 10, Some(16));
    let c = &f.0;
    c.put("kept", &[5u8; 1000], None).unwrap();
    let raw = Segment::open(c.name(), tensorwire_shm::Access::ReadWrite).unwrap();
    let header = raw.as_slice()[..c.layout().free_offset].to_vec();
    let wrap = (c.layout().data_offset as u64).wrapping_neg();
    let mut extent = wrap.to_le_bytes().to_vec();
    extent.extend_from_slice(&(1u64 << 20).to_le_bytes());
    raw_write(&raw, c.layout().free_offset, &extent);

    c.put("new", &[7u8; 4096], None).unwrap();
    assert_eq!(
        &raw.as_slice()[..64],
        &header[..64],
        "the header was written over"
    );
    c.check_consistency().unwrap();
    assert_eq!(&c.get("kept").unwrap().unwrap()[..], &[5u8; 1000][..]);
    assert_eq!(&c.get("new").unwrap().unwrap()[..], &[7u8; 4096][..]);
}

#[test]
fn a_free_extent_count_past_the_table_is_an_error_and_rebuilt() {
    // The header's free-extent count (offset 132) set far past the table: `check`
    // once read the table that far (a panic); now it names the count, and the
    // next put rebuilds the table from the slots, losing no space.
    let f = cache(256 << 10, Some(16));
    let c = &f.0;
    c.put("kept", &[5u8; 1000], None).unwrap();
    c.put("gone", &[6u8; 1000], None).unwrap();
    let raw = Segment::open(c.name(), tensorwire_shm::Access::ReadWrite).unwrap();
    raw_write(&raw, 132, &u32::MAX.to_le_bytes());
    let err = c.check_consistency().unwrap_err();
    assert!(err.to_string().contains("free extent count"), "{err}");
    c.delete("gone").unwrap();
    c.put("new", &[7u8; 4096], None).unwrap();
    c.check_consistency().unwrap();
    assert_eq!(&c.get("kept").unwrap().unwrap()[..], &[5u8; 1000][..]);
    assert_eq!(&c.get("new").unwrap().unwrap()[..], &[7u8; 4096][..]);
    let stats = c.stats().unwrap();
    assert_eq!(stats.used_bytes + stats.free_bytes, stats.data_region_size);
}

#[test]
fn bad_segments_and_names_are_refused() {
    let missing = TensorCache::attach("tw_no_such_cache_xyz", CacheOptions::default()).unwrap_err();
    assert!(matches!(missing.root(), Error::Io(_)), "{missing}");
    assert!(TensorCache::create(Some("a/b"), 1 << 20, CacheOptions::default()).is_err());
    assert!(TensorCache::create(None, 4096, CacheOptions::default()).is_err());

    let name = format!("tw_bad_cache_{}", std::process::id());
    let seg = Segment::create(&name, 1 << 20, &CreateOptions::default()).unwrap();
    raw_write(&seg, 0, b"NOTCACHE");
    let err = TensorCache::attach(&name, CacheOptions::default()).unwrap_err();
    assert!(matches!(err, Error::BadMagic { .. }), "{err}");
    drop(seg);
    Segment::unlink(&name).unwrap();

    // A real cache whose header is then corrupted.
    let f = cache(1 << 20, None);
    let raw = Segment::open(f.0.name(), tensorwire_shm::Access::ReadWrite).unwrap();
    raw_write(&raw, 72, &[1, 2, 3, 4]); // data offset
    let err = TensorCache::attach(f.0.name(), CacheOptions::default()).unwrap_err();
    assert!(err.to_string().contains("corrupted cache header"), "{err}");
    raw_write(&raw, 8, &[9]); // version
    let err = TensorCache::attach(f.0.name(), CacheOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");

    let small = format!("tw_small_cache_{}", std::process::id());
    let seg = Segment::create(&small, 100, &CreateOptions::default()).unwrap();
    let err = TensorCache::attach(&small, CacheOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }), "{err}");
    drop(seg);
    Segment::unlink(&small).unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, usize),
    Get(u8),
    Delete(u8),
    Hold(u8),
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, 0usize..20_000).prop_map(|(k, n)| Op::Put(k, n)),
        3 => (0u8..12).prop_map(Op::Get),
        1 => (0u8..12).prop_map(Op::Delete),
        1 => (0u8..12).prop_map(Op::Hold),
        1 => Just(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random operations on a small cache (so evictions happen): every hit returns
    /// exactly the last value put under that key, every held view keeps its bytes,
    /// and the structures stay consistent.
    #[test]
    fn random_operations_keep_the_cache_consistent(ops in prop::collection::vec(op(), 1..80)) {
        let f = cache(128 << 10, Some(8));
        let c = &f.0;
        let mut latest: std::collections::HashMap<u8, Vec<u8>> = Default::default();
        let mut held: Vec<(tensorwire_core::Bytes, Vec<u8>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Put(k, n) => {
                    let v = value(i as u8, n);
                    match c.put(&k.to_string(), &v, None) {
                        Ok(_) => { latest.insert(k, v); }
                        // A failed put stores nothing: the old value stays, unless it
                        // was evicted while making room (then a get misses).
                        Err(Error::NoSpace { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Get(k) => {
                    if let Some(got) = c.get(&k.to_string()).unwrap() {
                        prop_assert_eq!(Some(&got.to_vec()), latest.get(&k));
                    }
                }
                Op::Delete(k) => {
                    c.delete(&k.to_string()).unwrap();
                    latest.remove(&k);
                }
                Op::Hold(k) => {
                    if let Some(got) = c.get(&k.to_string()).unwrap() {
                        let copy = got.to_vec();
                        held.push((got, copy));
                    }
                }
                Op::Release => { held.pop(); }
            }
            for (view, copy) in &held {
                prop_assert_eq!(&view[..], &copy[..]);
            }
            c.check_consistency().unwrap();
        }
        drop(held);
        prop_assert_eq!(c.stats().unwrap().pinned_bytes, 0);
    }
}
