//! Feeds arbitrary bytes to the GGUF reader and, when a file opens, reads every
//! tensor. Opening may fail; once it succeeds no read may fail (the reader validates
//! the whole header on open), and nothing may panic, hang or allocate beyond the
//! small limits below.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Bytes, DType, Layout, Limits, TensorSource};
use tensorwire_formats::gguf::{sniff, GgufReader};

fn limits() -> Limits {
    Limits {
        max_metadata_bytes: 1 << 20,
        max_tensors: 10_000,
        max_name_bytes: 4096,
        max_depth: 8,
        ..Limits::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    let Ok(reader) = GgufReader::from_bytes(Bytes::from_vec(data.to_vec()), &limits) else {
        return;
    };
    assert!(sniff(data));
    assert!(matches!(reader.version(), 2 | 3));
    let alignment = reader.alignment();
    assert!(alignment.is_power_of_two());
    assert_eq!(reader.data_offset() % alignment, 0);
    let _ = format!("{reader:?}");
    assert_eq!(reader.format(), "gguf");
    // Values are checked on open and decoded on use: decoding one alone, all of them
    // and the attribute map must agree, and never fail (a failed decode is `Null`,
    // which no checked value is). Debug text compares NaN floats as equal.
    let keys: Vec<&str> = reader.metadata_keys().collect();
    let one_by_one: Vec<String> = keys
        .iter()
        .map(|key| format!("{:?}", reader.metadata_value(key).expect("a listed key")))
        .collect();
    assert_eq!(reader.attributes().len(), keys.len());
    assert_eq!(reader.metadata().len(), keys.len());
    for (((key, value), listed), alone) in reader.metadata().iter().zip(&keys).zip(&one_by_one) {
        assert_eq!(key, listed);
        assert!(!matches!(value, tensorwire_core::Value::Null), "{key}");
        assert_eq!(&format!("{value:?}"), alone, "{key}");
        assert_eq!(format!("{:?}", reader.attributes()[key]), *alone, "{key}");
    }
    assert_eq!(reader.tensors().len(), reader.gguf_tensors().len());

    let len = data.len() as u64;
    let mut spans = Vec::new();
    for (info, g) in reader.tensors().iter().zip(reader.gguf_tensors()) {
        let name: &str = &info.name;
        assert_eq!(info.name, g.name);
        assert_eq!(reader.info(name).unwrap(), info, "{name}: info by name");
        assert_eq!(reader.tensor(name).unwrap(), g, "{name}: tensor by name");
        assert_eq!(g.file_offset, reader.data_offset() + g.offset);
        assert_eq!(g.offset % alignment, 0);
        assert!(g.file_offset + g.nbytes <= len);
        assert_eq!(info.nbytes, g.nbytes);
        match g.ggml_type.dtype() {
            Some(d) => {
                assert_eq!(info.dtype, d);
                assert_eq!(info.layout, Layout::Dense);
                assert_eq!(info.shape.dims(), g.shape());
            }
            None => {
                assert_eq!(info.dtype, DType::U8);
                assert_eq!(
                    info.layout,
                    Layout::Other(format!("gguf:{}", g.ggml_type.name()))
                );
            }
        }

        let view = reader.view(name).expect("view of a validated tensor");
        assert!(view.zero_copy);
        assert_eq!(view.bytes.len() as u64, info.nbytes, "{name}: view length");
        assert_eq!(view.shape.byte_len(view.dtype).unwrap(), info.nbytes);
        let raw = reader.raw(name).expect("raw bytes of a validated tensor");
        assert_eq!(raw.as_slice(), view.bytes.as_slice());
        if g.nbytes > 0 {
            spans.push((g.file_offset, g.file_offset + g.nbytes));
        }
    }
    // The reader promised no two tensors share a byte.
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {w:?}");
    }

    let missing = "\u{0}no such tensor";
    assert!(reader.view(missing).is_err());
    assert!(reader.raw(missing).is_err());
});
