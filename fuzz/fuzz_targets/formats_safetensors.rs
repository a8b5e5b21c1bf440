//! Opens arbitrary bytes as a safetensors file and, when it opens, reads every tensor
//! (`info`, `view`, `raw`), then writes the file back with `write_source`: a file that
//! opens must re-encode, and the re-encoded file must open with the same tensors and
//! bytes. None may panic or allocate beyond the small limits below.
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
    write_source(&reader, &mut out, &mut |_, _, _| {}).expect("an opened file re-encodes");
    let again = SafetensorsReader::from_bytes(out.into(), &limits).expect("our output opens");
    assert_eq!(again.tensors().len(), reader.tensors().len());
    for info in reader.tensors() {
        let other = again.info(&info.name).expect("same names");
        assert_eq!((other.dtype, &other.shape, &other.layout), (info.dtype, &info.shape, &info.layout));
        assert_eq!(&*again.raw(&info.name).unwrap(), &*reader.raw(&info.name).unwrap());
    }
});
