//! Small hostile files must not make a reader allocate far more than they hold.
//! Each case opens (and reads) one crafted image through `tensorwire::open_bytes`
//! while a counting allocator records the peak of live heap bytes; the cases run
//! one after another in this binary's only test, so no other test's allocations
//! interleave.
//!
//! The files come from a hostile-input review: before their fixes, each case
//! reserved (or decoded) hundreds of MiB to a few GiB.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorwire::{open_bytes, Bytes, Limits};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    // SAFETY: an `unsafe fn` because `GlobalAlloc` declares it so; callers keep its
    // contract (a non-zero-size layout), which is passed on to `System` as it is.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, as `GlobalAlloc` requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    // SAFETY: an `unsafe fn` because `GlobalAlloc` declares it so; callers hand back
    // a pointer this allocator gave with the same layout, passed on to `System`.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak heap bytes allocated while `f` runs, above what was live before.
fn peak_during(f: impl FnOnce()) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - before
}

/// Opens `image` and reads every tensor it lists; errors are fine, memory is not.
fn open_and_read(image: &Bytes) {
    if let Ok(source) = open_bytes(image.clone(), &Limits::default()) {
        for position in 0..source.tensors().len() {
            let _ = source.view_at(position);
        }
    }
}

/// A `.zt` v1 file whose manifest holds, under an unknown key, 60 nested arrays each
/// declaring 2^63 items, over 1 MiB of padding: each level reserved for the bytes
/// left (60 × 1 Mi × 32 bytes).
fn nested_cbor_zt() -> Vec<u8> {
    let mut manifest = b"\xa2\x67version\x651.2.0\x64junk".to_vec();
    for _ in 0..60 {
        manifest.push(0x9b);
        manifest.extend((1u64 << 63).to_be_bytes());
    }
    manifest.push(0x5a);
    manifest.extend((1u32 << 20).to_be_bytes());
    manifest.extend(vec![0u8; 1 << 20]);
    let mut out = b"ZTEN1000".to_vec();
    out.extend(&manifest);
    out.extend((manifest.len() as u64).to_le_bytes());
    out.extend(b"ZTEN1000");
    out
}

/// A GGUF file whose one metadata value is 63 nested arrays, each declaring as many
/// items as the bytes left could hold, over 1 MiB of zeros (which read as empty u8
/// arrays, 12 bytes each): each level reserved for the bytes left (63 × 2.7 MiB).
fn nested_gguf_arrays() -> Vec<u8> {
    let payload = 1usize << 20;
    let depth = 63;
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend(1u64.to_le_bytes()); // key-value pairs
    out.extend(1u64.to_le_bytes());
    out.push(b'k');
    out.extend(9u32.to_le_bytes()); // array
    let mut remaining = depth * 12 + payload;
    for _ in 0..depth {
        remaining -= 12;
        out.extend(9u32.to_le_bytes());
        out.extend(((remaining / 12) as u64).to_le_bytes());
    }
    out.extend(vec![0u8; payload]);
    out
}

/// A protocol-2 ZIP checkpoint pickle of `N` then 20 000 `LONG_BINPUT`s, each key
/// 4 095 past the previous one: the memo's dense part grew 64 KiB per opcode.
fn spread_memo_checkpoint() -> Vec<u8> {
    let mut pickle = b"\x80\x02N".to_vec();
    for i in 1..=20_000u32 {
        pickle.push(b'r');
        pickle.extend((4096 * i - 1).to_le_bytes());
    }
    pickle.push(b'.');
    zip(&[("archive/data.pkl", &pickle, false)])
}

/// An NPZ whose deflated member is a 4-byte float32 array followed by 32 MiB of
/// zeros (numpy ignores bytes after the array): the whole record was inflated.
fn npz_with_a_long_tail() -> Vec<u8> {
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let mut header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }".to_vec();
    header.resize(117, b' ');
    header.push(b'\n');
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(header);
    npy.extend(1.5f32.to_le_bytes());
    npy.resize(npy.len() + (32 << 20), 0);
    zip(&[("a.npy", &npy, true)])
}

/// A ZIP archive of `(name, data, deflate)` records (CRCs left 0: not checked).
fn zip(records: &[(&str, &[u8], bool)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for &(name, data, deflate) in records {
        let stored = if deflate {
            miniz_oxide::deflate::compress_to_vec(data, 6)
        } else {
            data.to_vec()
        };
        let method: u16 = if deflate { 8 } else { 0 };
        // version, flags, method, time, date, crc, compressed and full sizes, name
        // and extra lengths: the part local and central headers share.
        let mut common = 20u16.to_le_bytes().to_vec();
        common.extend(0u16.to_le_bytes());
        common.extend(method.to_le_bytes());
        common.extend([0; 8]);
        common.extend((stored.len() as u32).to_le_bytes());
        common.extend((data.len() as u32).to_le_bytes());
        common.extend((name.len() as u16).to_le_bytes());
        common.extend(0u16.to_le_bytes());
        let offset = out.len() as u32;
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(&common);
        out.extend(name.as_bytes());
        out.extend(&stored);
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        central.extend(&common);
        central.extend([0; 10]); // comment length, disk, attributes
        central.extend(offset.to_le_bytes());
        central.extend(name.as_bytes());
    }
    let dir_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0; 4]);
    out.extend((records.len() as u16).to_le_bytes());
    out.extend((records.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(dir_offset.to_le_bytes());
    out.extend([0; 2]);
    out
}

#[test]
fn small_hostile_files_cost_little_memory() {
    let cases: [(&str, Vec<u8>); 4] = [
        ("nested CBOR arrays", nested_cbor_zt()),
        ("nested GGUF arrays", nested_gguf_arrays()),
        ("spread-out memo keys", spread_memo_checkpoint()),
        ("NPZ member with a long tail", npz_with_a_long_tail()),
    ];
    for (what, image) in cases {
        let image = Bytes::from(image);
        let peak = peak_during(|| open_and_read(&image));
        // Twice the file (a copy and its parse) plus 16 MiB for what reading makes.
        let allowed = 2 * image.len() + (16 << 20);
        assert!(
            peak <= allowed,
            "{what}: {} KiB file, peak {} MiB (allowed {} MiB)",
            image.len() >> 10,
            peak >> 20,
            allowed >> 20
        );
    }
    // The array before the NPZ member's tail reads back whole.
    let npz = open_bytes(npz_with_a_long_tail().into(), &Limits::default()).unwrap();
    assert_eq!(&npz.view("a").unwrap().bytes[..], &1.5f32.to_le_bytes());
}
