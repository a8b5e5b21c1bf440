//! Feeds arbitrary bytes to the `.zt` reader (1.x and 0.1) and, when a file opens,
//! exercises every read path. Any result may be an error; none may panic, hang or
//! allocate beyond the small limits below.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Bytes, Layout, Limits, TensorSource};
use tensorwire_zt::{ByteType, Encoding, ZtReader};

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

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    let Ok(reader) = ZtReader::from_bytes_with(Bytes::from_vec(data.to_vec()), &limits) else {
        return;
    };

    // Metadata accessors.
    let _ = reader.version();
    let _ = reader.manifest_version();
    let _ = format!("{reader:?}");
    let _ = reader.format();
    let _ = reader.attributes().len();
    assert_eq!(reader.tensors().len(), reader.objects().len());

    for (obj, info) in reader.objects().iter().zip(reader.tensors()) {
        assert_eq!(obj.name, info.name);
        let name: &str = &obj.name;
        assert!(reader.object(name).is_ok(), "object `{name}` not found by name");
        assert!(reader.info(name).is_ok(), "info `{name}` not found by name");
        let _ = obj.dtype();
        let _ = obj.primary();

        for comp in &obj.components {
            let role: &str = &comp.role[..];
            let decoded = comp.decoded_length();
            // The reader promised this on open.
            assert!(decoded <= limits.max_decoded_bytes);

            let stored = reader.stored(name, role);
            if let Ok(stored) = &stored {
                assert_eq!(stored.len() as u64, comp.length);
            }

            let whole = reader.component(name, role);
            if let Ok(bytes) = &whole {
                assert_eq!(bytes.len() as u64, decoded, "{name}/{role}: component length");
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
            assert_eq!(v.shape, reader.info(name).unwrap().shape);
            // A version 2 f4_e2m1 tensor (two elements per byte) is viewed as its bytes.
            if reader.byte_type(name).unwrap() != Some(ByteType::F4E2M1) {
                assert_eq!(v.shape, obj.shape);
            }
            assert_eq!(v.bytes.len() as u64, v.shape.byte_len(v.dtype).unwrap());
        }
        if obj.layout == Layout::Dense {
            if let Some(data) = obj.component("data") {
                if data.decoded_length() <= MAX_BUF {
                    let mut buf = vec![0u8; data.decoded_length() as usize];
                    let _ = reader.read_into(name, &mut buf);
                }
            }
        }
    }

    let _ = reader.verify();
    // Unknown names are errors.
    let missing = "\u{0}no such tensor";
    if reader.object(missing).is_err() {
        assert!(reader.view(missing).is_err());
        assert!(reader.component(missing, "data").is_err());
    }
});
