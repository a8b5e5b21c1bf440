//! Opens arbitrary bytes as an `.npy` file or `.npz` archive and, when it opens, reads
//! every array through `info`, `header`, `view` and `strided`; a view must hold
//! `nbytes` bytes and a strided view, gathered, the same bytes as the view. Any read
//! may fail (a deflated member can be corrupt); none may panic or allocate beyond the
//! small limits below.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Limits, TensorSource};
use tensorwire_formats::npy::NumpyReader;

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
    let Ok(reader) = NumpyReader::from_bytes(data.to_vec().into(), &limits) else {
        return;
    };
    let names: Vec<_> = reader.tensors().iter().map(|t| t.name.clone()).collect();
    for name in &names {
        let info = reader.info(name).expect("listed array has info").clone();
        let header = reader.header(name).expect("listed array has a header");
        assert_eq!(header.nbytes, info.nbytes);
        let view = reader.view(name);
        if let Ok(view) = &view {
            assert_eq!(view.bytes.len() as u64, info.nbytes);
            assert_eq!((view.dtype, &view.shape), (info.dtype, &info.shape));
        }
        if let Ok(strided) = reader.strided(name) {
            let gathered = strided.to_contiguous(limits.max_decoded_bytes);
            if let (Ok(g), Ok(v)) = (gathered, &view) {
                assert_eq!(g.as_slice(), &*v.bytes, "strided and view disagree on `{name}`");
            }
        }
    }
});
