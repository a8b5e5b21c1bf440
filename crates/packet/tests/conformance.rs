//! Packets written by the real tenso 0.24 (`fixtures/packet/make_fixtures.py`) decode
//! to the arrays that made them, and our encoder writes the very same bytes.

use std::path::Path;

use serde_json::Value as Json;
use tensorwire_core::{Bytes, DType, Shape};
use tensorwire_packet::{decode, encode, packet_info, EncodeOptions, PacketLimits};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn tenso_packets_decode_and_reencode_byte_for_byte() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/packet");
    let expected: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let cases = expected.as_object().unwrap();
    assert!(cases.len() >= 25, "fixture set incomplete: {}", cases.len());
    for (name, want) in cases.iter().filter(|(_, w)| w.get("kind").is_none()) {
        let file = std::fs::read(dir.join(format!("{name}.tnso"))).unwrap();
        let view = decode(&Bytes::from_vec(file.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dtype: DType = want["dtype"].as_str().unwrap().parse().unwrap();
        let dims: Vec<u64> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(view.dtype, dtype, "{name}");
        assert_eq!(view.shape.dims(), &dims[..], "{name}");
        assert_eq!(
            hex(&view.bytes),
            want["hex"].as_str().unwrap(),
            "{name}: body"
        );
        assert!(view.zero_copy);

        let alignment = want["alignment"].as_u64().unwrap() as usize;
        let info = packet_info(&file, &PacketLimits::default()).unwrap();
        assert_eq!(info.alignment, alignment, "{name}");
        assert_eq!(info.body_offset % alignment, 0, "{name}");

        let options = EncodeOptions {
            alignment,
            integrity: want["integrity"].as_bool().unwrap(),
            ..EncodeOptions::default()
        };
        let ours = encode(dtype, &Shape::new(dims).unwrap(), &view.bytes, options).unwrap();
        assert!(ours == file, "{name}: our packet differs from tenso's");
    }
}
