//! Lazy conjugate and negative views (`z.conj()`, `z.conj().imag`): `torch.save`
//! writes their stored elements and the metadata `{"conj": True}` / `{"neg": True}`;
//! every read gives torch's values, as a copy, and says which bits the tensor has.

mod common;

use std::path::{Path, PathBuf};

use common::{legacy_with_object, Pickle, Storage};
use tensorwire_core::{Error, Limits, TensorSource, Value};
use tensorwire_pytorch::{PtReader, TensorRecord};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/pytorch")
        .join(name)
}

/// `conj_neg.pt` (written by torch, see `make_fixtures.py`): `conj` is `z.conj()` on
/// `z`'s storage, `both` has both bits.
#[test]
fn lazy_views_are_copies_with_torchs_values_and_name_their_bits() {
    for file in ["conj_neg.pt", "conj_neg.legacy.pt"] {
        let reader = PtReader::open(fixture(file)).unwrap();
        let z = reader.view("z").unwrap();
        let conj = reader.view("conj").unwrap();
        assert!(z.zero_copy, "{file}: a plain tensor stays zero-copy");
        assert!(!conj.zero_copy, "{file}");
        assert!(!reader.strided("conj").unwrap().zero_copy, "{file}");
        // The conjugates of z's values: each imaginary part's sign flipped.
        let mut want = z.bytes.to_vec();
        for imaginary in want.chunks_exact_mut(4).skip(1).step_by(2) {
            imaginary[3] ^= 0x80;
        }
        assert_eq!(&conj.bytes[..], &want[..], "{file}");
        // Where the stored elements lie: z's (shared) bytes, listed as encoded.
        let (z_info, conj_info) = (reader.info("z").unwrap(), reader.info("conj").unwrap());
        assert_eq!(
            (conj_info.offset, conj_info.stored_bytes),
            (z_info.offset, z_info.stored_bytes),
            "{file}"
        );
        assert_eq!(z_info.encoding, None);
        assert_eq!(conj_info.encoding.as_deref(), Some("conj"));
        assert_eq!(
            reader.info("imag").unwrap().encoding.as_deref(),
            Some("neg")
        );
        let both = reader.info("both").unwrap();
        assert_eq!(both.encoding.as_deref(), Some("conj+neg"));
        assert_eq!(
            both.attributes.get(TensorRecord::CONJ_ATTRIBUTE),
            Some(&Value::Bool(true))
        );
        assert_eq!(
            both.attributes.get(TensorRecord::NEG_ATTRIBUTE),
            Some(&Value::Bool(true))
        );
        // Python sets each on its stored storage, with its bits, as torch.load does.
        let lazy: Vec<usize> = (0..reader.tensors().len())
            .filter(|&at| reader.records()[at].has_lazy_signs())
            .collect();
        assert_eq!(lazy.len(), 9, "{file}");
        let partial = reader.partial_storages();
        assert!(lazy.iter().all(|at| partial.contains(at)), "{file}");
        // A nn.Parameter keeps its bit.
        let param = reader.record("param").unwrap();
        assert!(param.parameter && param.is_conj && param.requires_grad);
    }
}

/// A legacy checkpoint `{name: _rebuild_tensor_v2(storage, 0, (n,), (1,), False,
/// OrderedDict(), metadata)}` over one storage of `class`.
fn one_tensor(name: &str, class: &str, bytes: Vec<u8>, n: u64, metadata: &[u8]) -> Vec<u8> {
    let mut object = Pickle::new();
    object
        .op(b"}")
        .str(name)
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b"((")
        .str("storage")
        .global("torch", class)
        .str("0")
        .str("cpu")
        .int(n as i64)
        .op(b"Nt")
        .op(b"Q")
        .int(0)
        .ints(&[n])
        .ints(&[1])
        .op(b"\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .op(metadata)
        .op(b"tR")
        .op(b"s");
    legacy_with_object(
        object.stop(),
        &[Storage {
            key: "0",
            count: n,
            bytes,
        }],
    )
}

const NEG: &[u8] = b"}X\x03\x00\x00\x00neg\x88s";

#[test]
fn negative_views_torch_cannot_negate_open_but_do_not_read() {
    // torch.load gives `torch._neg_view(bool tensor)` back, but cannot negate it.
    let file = one_tensor("flags", "BoolStorage", vec![1, 0, 1], 3, NEG);
    let reader = PtReader::from_bytes(file.into(), &Limits::default()).unwrap();
    assert_eq!(
        reader.info("flags").unwrap().attributes.get("torch.is_neg"),
        Some(&Value::Bool(true))
    );
    for err in [
        reader.view("flags").unwrap_err(),
        reader.strided("flags").unwrap_err(),
    ] {
        assert!(
            matches!(err, Error::Unsupported { .. })
                && err.to_string().contains("`flags`")
                && err.to_string().contains("torch.bool"),
            "{err}"
        );
    }
    // Its storage, as torch's holds it, still reads.
    let (storage, _) = reader
        .storage_bytes(reader.record("flags").unwrap())
        .unwrap();
    assert_eq!(&storage[..], &[1, 0, 1]);

    // A short one is negated, wrapping as torch does.
    let shorts: Vec<u8> = [i16::MIN, -2, 300]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let file = one_tensor("s", "ShortStorage", shorts, 3, NEG);
    let reader = PtReader::from_bytes(file.into(), &Limits::default()).unwrap();
    let want: Vec<u8> = [i16::MIN, 2, -300]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(&reader.view("s").unwrap().bytes[..], &want[..]);
}

#[test]
fn metadata_tensorwire_does_not_know_fails_the_open_naming_it() {
    let other = b"}X\x06\x00\x00\x00sparse\x88s";
    let file = one_tensor("x", "FloatStorage", vec![0; 4], 1, other);
    let err = PtReader::from_bytes(file.into(), &Limits::default()).unwrap_err();
    assert!(
        matches!(err.root(), Error::Unsupported { .. }) && err.to_string().contains("\"sparse\""),
        "{err}"
    );
}
