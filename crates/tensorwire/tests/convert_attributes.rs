//! `convert` to `.zt` keeps a checkpoint's non-tensor values as file attributes. CBOR
//! holds integers in [-2^64, 2^64) only; a pickled Python int outside it (a numpy
//! PCG64 generator's state, `2**200`) goes as its decimal text rather than stopping
//! the conversion or being rounded to a float as ztensor would.

use tensorwire::core::Value;
use tensorwire::{convert, ConvertOptions, OutputFormat};

#[test]
fn ints_outside_cbor_convert_to_zt_as_their_decimal_text() {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch/big_ints.pt");
    let dir = tempfile::tempdir().unwrap();
    let source = tensorwire::open(&src).unwrap();
    for (name, format) in [("v1.zt", OutputFormat::Zt), ("v2.zt", OutputFormat::Zt2)] {
        let dst = dir.path().join(name);
        let options = ConvertOptions {
            format: Some(format),
            ..ConvertOptions::default()
        };
        convert(&src, &dst, &options, &mut |_, _, _| Ok(())).unwrap();
        let out = tensorwire::open(&dst).unwrap();
        let got = out.attributes();
        let text = |s: &str| Value::Str(s.to_owned());
        assert_eq!(
            got["big"],
            text("1606938044258990275541962092341162602522202993782792835301376"),
            "{name}"
        );
        assert_eq!(
            got["rng"].get("state").unwrap().get("state").unwrap(),
            &text("207833532711051698738587646355624148094"),
            "{name}"
        );
        // Within CBOR's range, ints stay ints; its edges are 2^64 - 1 and -2^64.
        assert_eq!(got["rng"].get("has_uint32"), Some(&Value::Int(0)), "{name}");
        let Value::List(edges) = &got["edges"] else {
            panic!("{name}: {:?}", got["edges"])
        };
        assert_eq!(edges[4], text("18446744073709551616"), "{name}");
        assert_eq!(edges[5], text("-18446744073709551617"), "{name}");
        assert_eq!(got.len(), source.attributes().len(), "{name}");
        assert_eq!(
            out.view_at(0).unwrap().bytes.to_vec(),
            source.view_at(0).unwrap().bytes.to_vec(),
            "{name}"
        );
    }
}
