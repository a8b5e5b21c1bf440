//! Feeds arbitrary bytes to the `.zt` reader as a version 2 file and, when it opens,
//! exercises every read path. Any result may be an error; none may panic, hang or
//! allocate beyond the small limits below.
//!
//! Each input runs twice: as it is, and with the footer's manifest hash set to the
//! XXH3-64 of the bytes the footer points at (when they are in the file). Without the
//! second pass almost every mutation of a manifest would stop at the hash check, and
//! the manifest parser and validator would go unexplored.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Bytes, Layout, Limits, TensorSource};
use tensorwire_zt::{ByteType, Checksum, Digest, Encoding, ZtReader, ZtVersion, MAGIC_V2};

/// Largest buffer the target itself allocates for `component_into`.
const MAX_BUF: u64 = 1 << 20;

fn limits() -> Limits {
    Limits {
        max_decoded_bytes: 1 << 20,
        max_metadata_bytes: 1 << 20,
        max_tensors: 10_000,
        ..Limits::default()
    }
}

/// The input with a correct manifest hash, or `None` when the footer does not point
/// inside the input or the hash is already right.
fn with_fixed_hash(data: &[u8]) -> Option<Vec<u8>> {
    let n = data.len();
    if n < 48 {
        return None;
    }
    let footer = &data[n - 40..];
    let field = |at: usize| u64::from_le_bytes(footer[at..at + 8].try_into().unwrap());
    let (offset, length, hash) = (field(0), field(8), field(16));
    let end = offset.checked_add(length)?;
    if end > n as u64 {
        return None;
    }
    let Some(Digest::Xxh3(h)) = Checksum::Xxh3.compute(&data[offset as usize..end as usize]) else {
        return None;
    };
    if h == hash {
        return None;
    }
    let mut fixed = data.to_vec();
    fixed[n - 24..n - 16].copy_from_slice(&h.to_le_bytes());
    Some(fixed)
}

fn exercise(data: &[u8]) {
    let limits = limits();
    let Ok(reader) = ZtReader::from_bytes_with(Bytes::from_vec(data.to_vec()), &limits) else {
        return;
    };
    if data.starts_with(MAGIC_V2) {
        assert_eq!(reader.version(), ZtVersion::V2);
        assert_eq!(reader.format(), "zt-2");
    }
    let v2 = reader.version() == ZtVersion::V2;

    // Metadata accessors.
    let _ = reader.manifest_version();
    let _ = format!("{reader:?}");
    let _ = reader.attributes().len();
    assert_eq!(reader.tensors().len(), reader.objects().len());

    for (obj, info) in reader.objects().iter().zip(reader.tensors()) {
        assert_eq!(obj.name, info.name);
        let name: &str = &obj.name;
        assert!(
            reader.object(name).is_ok(),
            "object `{name}` not found by name"
        );
        assert!(reader.info(name).is_ok(), "info `{name}` not found by name");
        let _ = obj.dtype();
        let _ = obj.primary();

        for comp in &obj.components {
            let role: &str = &comp.role[..];
            let decoded = comp.decoded_length();
            // The reader promised these on open.
            assert!(decoded <= limits.max_decoded_bytes);
            if v2 {
                assert_eq!(comp.offset % 4096, 0, "{name}/{role}: misaligned");
                assert!(comp.offset >= 4096);
                assert!(comp.offset + comp.length <= data.len() as u64 - 40);
                assert!(matches!(
                    comp.encoding,
                    Encoding::Raw | Encoding::ZstdSeekable
                ));
                assert!(comp
                    .digest
                    .as_ref()
                    .is_none_or(|d| !matches!(d, Digest::Crc32c(_))));
            }

            let stored = reader.stored(name, role);
            if let Ok(stored) = &stored {
                assert_eq!(stored.len() as u64, comp.length);
            }

            let whole = reader.component(name, role);
            if let Ok(bytes) = &whole {
                assert_eq!(
                    bytes.len() as u64,
                    decoded,
                    "{name}/{role}: component length"
                );
                if comp.encoding == Encoding::Raw {
                    assert_eq!(bytes.as_slice(), stored.as_ref().unwrap().as_slice());
                }
            }

            if decoded <= MAX_BUF {
                let mut buf = vec![0u8; decoded as usize];
                let into = reader.component_into(name, role, &mut buf);
                // Both paths see the same stored bytes, so they must agree.
                assert_eq!(
                    into.is_ok(),
                    whole.is_ok(),
                    "{name}/{role}: component() and component_into() disagree: {into:?} vs {:?}",
                    whole.as_ref().map(|b| b.len())
                );
                if let (Ok(()), Ok(bytes)) = (&into, &whole) {
                    assert_eq!(&buf[..], bytes.as_slice(), "{name}/{role}: different bytes");
                }
                // A wrong-size destination is an error, never a panic.
                let mut short = vec![0u8; (decoded as usize).saturating_sub(1).min(16)];
                if short.len() as u64 != decoded {
                    assert!(reader.component_into(name, role, &mut short).is_err());
                }
            }
        }

        let view = reader.view(name);
        if let Ok(v) = &view {
            assert_eq!(obj.layout, Layout::Dense);
            assert_eq!(v.shape, info.shape);
            // An f4_e2m1 tensor (two elements per byte) is viewed as its bytes.
            if reader.byte_type(name).unwrap() != Some(ByteType::F4E2M1) {
                assert_eq!(v.shape, obj.shape);
            }
            assert_eq!(v.dtype, info.dtype);
            assert_eq!(v.bytes.len() as u64, v.shape.byte_len(v.dtype).unwrap());
        }
        if obj.layout == Layout::Dense {
            if let Some(data) = obj.component("data") {
                if data.decoded_length() <= MAX_BUF {
                    let mut buf = vec![0u8; data.decoded_length() as usize];
                    let into = reader.read_into(name, &mut buf);
                    if let (Ok(()), Ok(v)) = (&into, &view) {
                        assert_eq!(
                            &buf[..],
                            v.bytes.as_slice(),
                            "{name}: read_into and view differ"
                        );
                    }
                }
            }
        }
    }

    let verified = reader.verify();
    if let Ok(n) = verified {
        let digests = reader
            .objects()
            .iter()
            .flat_map(|o| &o.components)
            .filter(|c| c.digest.is_some())
            .count();
        assert_eq!(n, digests, "verify() counted {n} of {digests} digests");
    }
    // Unknown names are errors.
    let missing = "\u{0}no such tensor";
    if reader.object(missing).is_err() {
        assert!(reader.view(missing).is_err());
        assert!(reader.component(missing, "data").is_err());
    }
}

fuzz_target!(|data: &[u8]| {
    exercise(data);
    if let Some(fixed) = with_fixed_hash(data) {
        exercise(&fixed);
    }
});
