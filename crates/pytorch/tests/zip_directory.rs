//! The ZIP directory read in two steps: records located in any grouping, on any
//! thread, make the same archive as a one-step parse, and a record left unlocated is
//! an error rather than a record with a wrong data offset.

use std::path::PathBuf;
use std::sync::Arc;

use tensorwire_pytorch::zip::{ZipArchive, ZipDirectory};
use tensorwire_pytorch::Input;
use tensorwire_range::RangeFile;

fn fixture_input(name: &str) -> Input {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/pytorch")
        .join(name);
    Input::ranged(Arc::new(RangeFile::open(path).unwrap()))
}

fn offsets(archive: &ZipArchive) -> Vec<(String, u64)> {
    archive
        .entries()
        .iter()
        .map(|e| (e.name.to_string(), e.data_offset))
        .collect()
}

#[test]
fn locating_in_parts_matches_one_parse() {
    let input = fixture_input("module.pt");
    let whole = ZipArchive::parse(&input, 1 << 10, 1 << 10).unwrap();
    let directory = ZipDirectory::read(&input, 1 << 10, 1 << 10).unwrap();
    assert!(directory.len() > 4, "the fixture has several records");
    // Odd and even records located apart, the evens on a helper thread, one record
    // located twice.
    let odd: Vec<usize> = (0..directory.len()).rev().filter(|i| i % 2 == 1).collect();
    let even: Vec<usize> = (0..directory.len()).filter(|i| i % 2 == 0).collect();
    let (odd, even) = std::thread::scope(|scope| {
        let even = scope.spawn(|| directory.locate(&input, &even, 0).unwrap());
        let odd = directory.locate(&input, &odd, 0).unwrap();
        (odd, even.join().unwrap())
    });
    let again = directory.locate(&input, &[1], 0).unwrap();
    let one = directory.located(&again[0]).unwrap();
    assert_eq!(one.data_offset, whole.entries()[1].data_offset);
    let parts = directory
        .into_archive(odd.into_iter().chain(again).chain(even))
        .unwrap();
    assert_eq!(offsets(&parts), offsets(&whole));
}

#[test]
fn a_record_left_unlocated_is_an_error() {
    let input = fixture_input("module.pt");
    let directory = ZipDirectory::read(&input, 1 << 10, 1 << 10).unwrap();
    let missing = directory.name(2).unwrap().to_string();
    let some: Vec<usize> = (0..directory.len()).filter(|&i| i != 2).collect();
    let located = directory.locate(&input, &some, 0).unwrap();
    let err = directory.into_archive(located).unwrap_err().to_string();
    assert!(
        err.contains(&missing) && err.contains("not located"),
        "{err}"
    );
}

#[test]
fn directory_entries_hold_their_local_header_offsets_until_located() {
    let input = fixture_input("module.pt");
    let directory = ZipDirectory::read(&input, 1 << 10, 1 << 10).unwrap();
    let located = directory.locate(&input, &[0], 0).unwrap();
    let entry = directory.located(&located[0]).unwrap();
    // The data follows the 30-byte local header, its name and its extra field.
    assert!(
        entry.data_offset >= directory.header_offset(0).unwrap() + 30 + entry.name.len() as u64
    );
    assert!(entry.head.is_none());
}

/// `image` with an archive comment of `len` bytes (the end record is its last 22).
fn with_comment(image: &[u8], len: usize) -> Vec<u8> {
    let mut out = image.to_vec();
    let at = out.len() - 2;
    out[at..].copy_from_slice(&(len as u16).to_le_bytes());
    out.extend((0..len).map(|i| b'a' + (i % 26) as u8));
    out
}

#[test]
fn archive_comments_of_any_length_are_skipped() {
    use tensorwire_core::{Bytes, Limits, TensorSource};
    use tensorwire_pytorch::PtReader;
    // A plain archive and a ZIP64 one (end record, locator and record); comments
    // that fit the first tail read, that leave the locator outside it (1000 bytes:
    // the end record starts 2 bytes into the first 1 KiB read) and that need the
    // second, full read.
    for name in ["module.pt", "zip64_full.pt"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/pytorch")
            .join(name);
        let image = std::fs::read(path).unwrap();
        let plain =
            PtReader::from_bytes(Bytes::from_vec(image.clone()), &Limits::default()).unwrap();
        for len in [100, 1000, 3000, 65_535] {
            let commented = with_comment(&image, len);
            let reader = PtReader::from_bytes(Bytes::from_vec(commented), &Limits::default())
                .unwrap_or_else(|e| panic!("{name} with a {len}-byte comment: {e}"));
            assert_eq!(reader.tensors().len(), plain.tensors().len());
            for info in plain.tensors() {
                let want = plain.view(&info.name).unwrap();
                let got = reader.view(&info.name).unwrap();
                assert_eq!(
                    &got.bytes[..],
                    &want.bytes[..],
                    "{name} {len} {}",
                    info.name
                );
            }
        }
    }
}

#[test]
fn locations_come_back_in_the_order_asked_for() {
    // `sorted_records.pt` stores `byteorder` before `data.pkl`; asking for them the
    // other way round must still give `data.pkl` first.
    let input = fixture_input("sorted_records.pt");
    let directory = ZipDirectory::read(&input, 1 << 10, 1 << 10).unwrap();
    let pkl = directory.index_of("archive/data.pkl").unwrap();
    let order = directory.index_of("archive/byteorder").unwrap();
    assert!(directory.header_offset(order) < directory.header_offset(pkl));
    let mut which: Vec<usize> = (0..directory.len()).rev().collect();
    which.retain(|&i| i != pkl && i != order);
    which.insert(0, pkl);
    which.insert(1, order);
    let located = directory.locate(&input, &which, 0).unwrap();
    let got: Vec<usize> = located.iter().map(|l| l.index()).collect();
    assert_eq!(got, which);
}

#[test]
fn indices_past_the_directory_are_errors() {
    let input = fixture_input("module.pt");
    let directory = ZipDirectory::read(&input, 1 << 10, 1 << 10).unwrap();
    let past = directory.len();
    assert!(directory.locate(&input, &[0, past], 0).is_err());
    assert_eq!(directory.name(past), None);
    // A location from a larger archive's directory is refused, not a panic.
    let bigger = fixture_input("optimizer.pt");
    let other = ZipDirectory::read(&bigger, 1 << 10, 1 << 10).unwrap();
    assert!(other.len() > directory.len());
    let foreign = other.locate(&bigger, &[other.len() - 1], 0).unwrap();
    assert!(directory.located(&foreign[0]).is_err());
    assert!(directory.into_archive(foreign).is_err());
}

#[test]
fn a_record_count_the_directory_cannot_hold_is_refused_up_front() {
    // An end record declaring `count` records in a 0-byte central directory.
    let end_record = |count: u16| {
        let mut eocd = 0x0605_4b50u32.to_le_bytes().to_vec();
        eocd.extend([0u8; 4]);
        eocd.extend(count.to_le_bytes());
        eocd.extend(count.to_le_bytes());
        eocd.extend([0u8; 10]);
        Input::mapped(tensorwire_core::Bytes::from(eocd))
    };
    let err = ZipDirectory::read(&end_record(65_534), 1 << 20, 1 << 10).unwrap_err();
    assert!(err.to_string().contains("cannot fit"), "{err}");
    // 0xFFFF is a saturated count: with no ZIP64 record, the directory's size says
    // how many (none here), as Python's zipfile reads it.
    let directory = ZipDirectory::read(&end_record(u16::MAX), 1 << 20, 1 << 10).unwrap();
    assert!(directory.is_empty());
}

#[test]
fn bytes_before_the_archive_or_a_second_archive_after_it_are_named() {
    use tensorwire_core::{Bytes, Error};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    // A second archive appended: its end records, found first, point into the first
    // archive. A prefix (which `PtReader` refuses by its magic before this): the
    // archive's own absolute offsets miss by its length. With ZIP64 end records, as
    // torch writes them, and without, as Python's zipfile writes small archives.
    for (name, second) in [
        ("module.pt", "views.pt"),
        ("../numpy/arrays.npz", "../numpy/compressed.npz"),
    ] {
        let image = std::fs::read(path.join(name)).unwrap();
        let mut appended = image.clone();
        appended.extend_from_slice(&std::fs::read(path.join(second)).unwrap());
        let mut prefixed = vec![b'#'; 100];
        prefixed.extend_from_slice(&image);
        for (what, file) in [("appended", appended), ("prefixed", prefixed)] {
            let input = Input::mapped(Bytes::from_vec(file));
            match ZipDirectory::read(&input, 1 << 10, 1 << 10) {
                Err(Error::Malformed { reason, .. }) => {
                    assert!(reason.contains("second archive"), "{name} {what}: {reason}")
                }
                other => panic!("{name} {what}: {:?}", other.map(|_| ())),
            }
        }
    }
}
