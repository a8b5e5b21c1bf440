//! ZIP record names are decoded as Python's `zipfile` (and so `np.load`) decodes
//! them: UTF-8 when general-purpose flag bit 11 is set, code page 437 when it is
//! clear; a local header's name is decoded by its own flag and must equal the
//! directory's.

use tensorwire_core::{Bytes, Error};
use tensorwire_pytorch::zip::ZipArchive;
use tensorwire_pytorch::Input;

const UTF8: u16 = 1 << 11;

/// One stored record: its name's bytes in the central directory and in the local
/// header, with each one's general-purpose flags.
struct Record<'a> {
    central: (&'a [u8], u16),
    local: (&'a [u8], u16),
    data: &'a [u8],
}

impl<'a> Record<'a> {
    /// A record whose two headers agree.
    fn named(name: &'a [u8], flags: u16) -> Record<'a> {
        Record {
            central: (name, flags),
            local: (name, flags),
            data: b"data",
        }
    }
}

/// A ZIP archive of stored `records`.
fn archive(records: &[Record<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for r in records {
        let offset = out.len() as u32;
        let mut sizes = crc32fast::hash(r.data).to_le_bytes().to_vec();
        sizes.extend((r.data.len() as u32).to_le_bytes());
        sizes.extend((r.data.len() as u32).to_le_bytes());
        let (name, flags) = r.local;
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(20u16.to_le_bytes());
        out.extend(flags.to_le_bytes());
        out.extend([0u8; 6]); // method 0, time, date
        out.extend(&sizes);
        out.extend((name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(name);
        out.extend(r.data);
        let (name, flags) = r.central;
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend([20u8, 0, 20, 0]);
        central.extend(flags.to_le_bytes());
        central.extend([0u8; 6]);
        central.extend(&sizes);
        central.extend((name.len() as u16).to_le_bytes());
        central.extend([0u8; 12]);
        central.extend(offset.to_le_bytes());
        central.extend(name);
    }
    let dir_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((records.len() as u16).to_le_bytes());
    out.extend((records.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(dir_offset.to_le_bytes());
    out.extend([0u8; 2]);
    out
}

fn parse(image: Vec<u8>) -> tensorwire_core::Result<ZipArchive> {
    ZipArchive::parse(&Input::mapped(Bytes::from_vec(image)), 1 << 10, 1 << 10)
}

fn names(image: Vec<u8>) -> Vec<String> {
    let archive = parse(image).unwrap();
    let names: Vec<String> = archive
        .entries()
        .iter()
        .map(|e| e.name.to_string())
        .collect();
    for name in &names {
        assert!(archive.get(name).is_some(), "{name}");
    }
    names
}

#[test]
fn names_without_the_utf8_flag_are_code_page_437() {
    // As zipfile reads them: b"m\x81" is `mü`, and UTF-8 bytes without the flag are
    // read byte by byte (`café` written as UTF-8 reads as `caf├⌐`).
    assert_eq!(
        names(archive(&[Record::named(b"m\x81.npy", 0)])),
        ["mü.npy"]
    );
    assert_eq!(
        names(archive(&[Record::named("café.npy".as_bytes(), 0)])),
        ["caf├⌐.npy"]
    );
    // Every byte above ASCII (Python: `bytes(range(128, 256)).decode("cp437")`).
    let high: Vec<u8> = (0x80..=0xff).collect();
    assert_eq!(
        names(archive(&[Record::named(&high, 0)])),
        ["ÇüéâäàåçêëèïîìÄÅÉæÆôöòûùÿÖÜ¢£¥₧ƒáíóúñÑªº¿⌐¬½¼¡«»░▒▓│┤╡╢╖╕╣║╗╝╜╛┐└┴┬├─┼╞╟╚╔╩╦╠═╬╧╨╤╥╙╘╒╓╫╪┘┌█▄▌▐▀αßΓπΣσµτΦΘΩδ∞φε∩≡±≥≤⌠⌡÷≈°∙·√ⁿ²■\u{a0}"]
    );
    // ASCII, control bytes included, reads the same with the flag and without.
    let ascii: Vec<u8> = (1..0x80).collect();
    for flags in [0, UTF8] {
        assert_eq!(
            names(archive(&[Record::named(&ascii, flags)])),
            [String::from_utf8(ascii.clone()).unwrap()]
        );
    }
}

#[test]
fn names_with_the_utf8_flag_are_strict_utf8() {
    assert_eq!(
        names(archive(&[Record::named("café.npy".as_bytes(), UTF8)])),
        ["café.npy"]
    );
    match parse(archive(&[Record::named(b"m\x81.npy", UTF8)])) {
        Err(Error::Malformed { reason, .. }) => assert!(reason.contains("not UTF-8"), "{reason}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn local_header_names_are_decoded_by_their_own_flag() {
    // `mü` as code page 437 in the directory and as UTF-8 in the local header: the
    // same name, as zipfile compares them.
    let same = Record {
        central: (b"m\x81.npy", 0),
        local: ("mü.npy".as_bytes(), UTF8),
        data: b"data",
    };
    assert_eq!(names(archive(&[same])), ["mü.npy"]);
    let same = Record {
        central: ("mü.npy".as_bytes(), UTF8),
        local: (b"m\x81.npy", 0),
        data: b"data",
    };
    assert_eq!(names(archive(&[same])), ["mü.npy"]);
    // The same bytes under different flags are different names.
    for (central, local) in [(0, UTF8), (UTF8, 0)] {
        let differ = Record {
            central: ("café.npy".as_bytes(), central),
            local: ("café.npy".as_bytes(), local),
            data: b"data",
        };
        match parse(archive(&[differ])) {
            Err(Error::Malformed { reason, .. }) => {
                assert!(reason.contains("in its local header"), "{reason}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
    // A local name that is not UTF-8 under its flag is a mismatch too.
    let invalid = Record {
        central: (b"m\x81.npy", 0),
        local: (b"m\x81.npy", UTF8),
        data: b"data",
    };
    assert!(matches!(
        parse(archive(&[invalid])),
        Err(Error::Malformed { .. })
    ));
}

#[test]
fn torch_checkpoints_keep_their_names() {
    // torch writes ASCII names with the UTF-8 flag set.
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for entry in std::fs::read_dir(&path).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "pt") {
            continue;
        }
        let image = std::fs::read(&path).unwrap();
        if !image.starts_with(b"PK\x03\x04") {
            continue; // a legacy checkpoint
        }
        let archive = parse(image).unwrap();
        assert!(
            archive
                .entries()
                .iter()
                .any(|e| e.name.ends_with("/data.pkl")),
            "{}",
            path.display()
        );
    }
}
