//! Opens arbitrary bytes as a safetensors file and, when it opens, reads every tensor
//! (`info`, `view`, `raw`), then writes the file back with `write_source`: a file that
//! opens must re-encode, and the re-encoded file must open with the same tensors and
//! bytes. None may panic or allocate beyond the small limits below. A header the
//! reader accepts must be valid JSON to serde_json too, with the same tensor names
//! and metadata (the reader has its own JSON scanner).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Limits, TensorSource};
use tensorwire_formats::safetensors::{write_source, SafetensorsReader};

fn limits() -> Limits {
    Limits {
        max_metadata_bytes: 1 << 20,
        max_tensors: 10_000,
        max_decoded_bytes: 1 << 24,
        ..Limits::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    let Ok(reader) = SafetensorsReader::from_bytes(data.to_vec().into(), &limits) else {
        return;
    };
    let header = &data[8..8 + reader.header_len() as usize];
    let json: serde_json::Value =
        serde_json::from_slice(header).expect("an accepted header is valid JSON");
    let object = json.as_object().expect("an accepted header is an object");
    let names: Vec<&str> = object.keys().map(String::as_str).filter(|k| *k != "__metadata__").collect();
    let mut listed: Vec<&str> = reader.tensors().iter().map(|t| &*t.name).collect();
    listed.sort_unstable();
    let mut expected = names.clone();
    expected.sort_unstable();
    assert_eq!(listed, expected, "tensor names differ from serde_json's");
    // serde_json keeps the last of repeated keys; so does a map built in order.
    let theirs: std::collections::BTreeMap<String, String> = match object.get("__metadata__") {
        Some(serde_json::Value::Object(m)) => m
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().expect("metadata values are strings").to_owned()))
            .collect(),
        _ => Default::default(),
    };
    let ours: std::collections::BTreeMap<String, String> =
        reader.metadata().iter().cloned().collect();
    assert_eq!(ours, theirs, "metadata differs from serde_json's");
    let mut covered = 0u64;
    for info in reader.tensors() {
        let raw = reader.raw(&info.name).expect("listed tensor has bytes");
        assert_eq!(raw.len() as u64, info.nbytes);
        covered += info.nbytes;
        let view = reader.view(&info.name).expect("listed tensor has a view");
        assert_eq!(view.bytes.len() as u64, info.nbytes);
        assert!(view.zero_copy);
    }
    // The tensors tile the data region exactly.
    assert_eq!(8 + reader.header_len() + covered, data.len() as u64);

    let mut out = Vec::new();
    write_source(&reader, &mut out, &mut |_, _, _| Ok(())).expect("an opened file re-encodes");
    let again = SafetensorsReader::from_bytes(out.into(), &limits).expect("our output opens");
    assert_eq!(again.tensors().len(), reader.tensors().len());
    for info in reader.tensors() {
        let other = again.info(&info.name).expect("same names");
        assert_eq!((other.dtype, &other.shape, &other.layout), (info.dtype, &info.shape, &info.layout));
        assert_eq!(&*again.raw(&info.name).unwrap(), &*reader.raw(&info.name).unwrap());
    }
});
