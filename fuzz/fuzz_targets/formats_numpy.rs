//! Opens arbitrary bytes as an `.npy` file or `.npz` archive and, when it opens, reads
//! every array through `info`, `header`, `view`, `strided` and `check_record_at` (and
//! `verify`); a view must hold
//! `nbytes` bytes and a strided view, gathered, the same bytes as the view. Any read
//! may fail (a deflated member can be corrupt); none may panic or allocate beyond the
//! small limits below. An archive opened with its member headers read positionally
//! (as `NumpyReader::open` and `tensorwire::open` do) must give the same arrays.
#![no_main]

mod record_checks;

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Limits, TensorSource};
use tensorwire_formats::npy::{self, NumpyReader};
use tensorwire_pytorch::Input;

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
    let image: tensorwire_core::Bytes = data.to_vec().into();
    let opened = NumpyReader::from_bytes(image.clone(), &limits);
    if !npy::sniff(data) {
        let positional = Input::mapped_with_file(image.clone(), std::sync::Arc::new(image))
            .and_then(|input| NumpyReader::npz(input, &limits));
        match (&opened, &positional) {
            (Ok(a), Ok(b)) => assert_eq!(a.tensors(), b.tensors(), "the two opens disagree"),
            (Err(_), Err(_)) => {}
            _ => panic!("one open failed and not the other"),
        }
    }
    let Ok(reader) = opened else {
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
    record_checks::assert_record_checks_agree_with_verify(&reader);
});
