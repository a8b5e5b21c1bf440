//! Opens arbitrary bytes as a PyTorch checkpoint (ZIP or legacy) and, when it opens,
//! reads every tensor through every path: `info`, `record`, `view`, `strided`, its
//! whole storage (`storage_bytes`), each record's CRC (`check_record_at`), `verify` and
//! the nested object (`structure`);
//! meta tensors (no data) must not be listed or viewable; an int past 128 bits in the
//! metadata must read back from its decimal text as the same value.
//! Any call may return an error; none may panic, hang or allocate beyond the small
//! limits below. Opening with the metadata read positionally (as `tensorwire::open`
//! does) must give the same tensors as opening the image alone.
#![no_main]

mod record_checks;

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{BigInt, Limits, TensorSource, Value};
use tensorwire_pytorch::{Input, PtReader};

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
    let opened = PtReader::from_bytes(image.clone(), &limits);
    let positional = Input::mapped_with_file(image.clone(), std::sync::Arc::new(image))
        .and_then(|input| PtReader::from_input(input, &limits));
    match (&opened, &positional) {
        (Ok(a), Ok(b)) => assert_eq!(a.tensors(), b.tensors(), "the two opens disagree"),
        (Err(_), Err(_)) => {}
        _ => panic!("one open failed and not the other"),
    }
    let Ok(reader) = opened else {
        return;
    };
    let _ = reader.format();
    let _ = reader.pt_format();
    let _ = reader.is_little_endian();
    reader.attributes().values().for_each(check_ints);

    let names: Vec<_> = reader.tensors().iter().map(|t| t.name.clone()).collect();
    for name in &names {
        let name: &str = name;
        let info = reader
            .info(name)
            .unwrap_or_else(|e| panic!("listed tensor `{name}` has no info: {e}"))
            .clone();
        let record = reader
            .record(name)
            .unwrap_or_else(|e| panic!("listed tensor `{name}` has no record: {e}"));
        let _ = record.is_contiguous();
        let extent = record.byte_extent();

        if let Ok(view) = reader.view(name) {
            assert_eq!(
                view.bytes.len() as u64,
                info.nbytes,
                "view of `{name}` holds the wrong number of bytes"
            );
            assert_eq!(view.dtype, info.dtype);
            assert_eq!(view.shape, info.shape);
        }
        // `in_place_extent` names the very bytes a zero-copy strided view lends, and
        // only where it lends them.
        let position = reader.position(name).expect("listed tensor has a position");
        if let Some(in_place) = reader.in_place_extent(position) {
            let lent = reader
                .strided_at(position)
                .unwrap_or_else(|e| panic!("`{name}` in place but no strided view: {e}"));
            assert!(lent.zero_copy, "`{name}` in place but copied");
            assert_eq!(
                in_place.as_ptr(),
                lent.bytes.as_ptr(),
                "`{name}` in place elsewhere"
            );
            assert_eq!(
                in_place.len(),
                lent.bytes.len(),
                "`{name}` in place, other length"
            );
        }
        if let Ok(strided) = reader.strided(name) {
            let (start, end) = extent.expect("strided view without a byte extent");
            assert_eq!(
                strided.bytes.len() as u64,
                end - start,
                "strided view of `{name}` does not cover its byte extent"
            );
            assert_eq!(strided.dtype, record.dtype);
            // The tensor's bytes are its whole storage's from its stored offset on.
            if let Ok((storage, _)) = reader.storage_bytes(record) {
                let start = record
                    .stored_byte_offset()
                    .expect("offset of a read tensor");
                let end = start + strided.bytes.len() as u64;
                assert!(
                    end <= storage.len() as u64,
                    "`{name}` ends past its storage"
                );
                // A conjugate or negative view's bytes are its stored elements with
                // their signs resolved (reads resolve them, or fail when torch cannot).
                let mut stored = storage[start as usize..end as usize].to_vec();
                if record.resolve_signs(&mut stored).is_ok() {
                    assert_eq!(
                        &stored[..],
                        &strided.bytes[..],
                        "`{name}` is not where its storage holds it"
                    );
                }
            }
        }
    }
    record_checks::assert_record_checks_agree_with_verify(&reader);

    // Partial storages are listed once each, in order, within the tensors.
    let partial = reader.partial_storages();
    assert!(
        partial.windows(2).all(|w| w[0] < w[1]) && partial.iter().all(|&at| at < names.len()),
        "partial storages {partial:?} of {} tensors",
        names.len()
    );

    // A tensor reached again names an earlier one with the very same record.
    let records = reader.records();
    for &(at, first) in reader.same_objects() {
        assert!(
            first < at && at < records.len(),
            "same object {at} -> {first}"
        );
        assert_eq!(
            records[at], records[first],
            "same object, different records"
        );
    }

    // Meta tensors (no data) are not listed, cannot be viewed, come in checkpoint
    // order and name only earlier entries as the same object.
    let meta = reader.meta_tensors();
    for (at, m) in meta.iter().enumerate() {
        assert!(
            !names.contains(&m.name),
            "meta tensor `{}` is also listed",
            m.name
        );
        assert!(
            reader.view(&m.name).is_err(),
            "meta tensor `{}` viewed",
            m.name
        );
        assert!(m.position <= names.len(), "meta position {}", m.position);
        assert!(at == 0 || meta[at - 1].position <= m.position, "meta order");
        if let Some(first) = m.same_as {
            assert!(first < at && meta[first].tensor == m.tensor, "meta same_as");
        }
        assert_eq!(m.tensor.strides.len(), m.tensor.shape.ndim());
    }

    // The nested object names exactly the listed tensors, in order, less the parts
    // of quantized tensors (their scales and zero points), and the meta tensors.
    if let Ok(tree) = reader.structure() {
        let meta_leaves: Vec<_> = tree.meta_names().into_iter().cloned().collect();
        let meta_names: Vec<_> = meta.iter().map(|m| m.name.clone()).collect();
        assert_eq!(
            meta_leaves, meta_names,
            "the structure's meta tensors differ"
        );
        let leaves: Vec<_> = tree.tensor_names().into_iter().cloned().collect();
        let parts = reader.quantization_parts();
        let names: Vec<_> = names
            .iter()
            .enumerate()
            .filter(|(at, _)| !parts.contains(at))
            .map(|(_, name)| name.clone())
            .collect();
        assert_eq!(
            leaves, names,
            "the structure's tensors differ from the flat view"
        );
    }
});

/// Every `Value::BigInt` in `value` must be the value its decimal text reads as, and
/// never one that fits `Value::Int`.
fn check_ints(value: &Value) {
    match value {
        Value::BigInt(b) => {
            let text = b.to_string();
            match BigInt::value_from_decimal(&text) {
                Some(Ok(again)) => assert_eq!(&again, value, "{text} reads back otherwise"),
                other => panic!("{text} does not read back: {other:?}"),
            }
            assert!(b.to_le_bytes().len() > 16, "{text} fits 128 bits");
        }
        Value::List(items) => items.iter().for_each(check_ints),
        Value::Map(entries) => entries.iter().for_each(|(_, v)| check_ints(v)),
        _ => {}
    }
}
