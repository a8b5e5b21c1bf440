//! Packets of every kind written by the real tenso 0.24 (`fixtures/packet/make_fixtures.py`;
//! two hand-built ones say so in `made_by`) decode to the values that made them, and
//! re-encoding each decoded value with the same options gives the very same bytes.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tensorwire_core::{Bytes, TensorSource, TensorView};
use tensorwire_packet::{
    decode_packet, EncodeOptions, Packet, PacketLimits, PacketSource, RaggedFraming,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fixtures() -> (PathBuf, Vec<(String, Json)>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/packet");
    let expected: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let cases = expected
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (dir, cases)
}

fn dims(j: &Json) -> Vec<u64> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}

fn check_dense(at: &str, v: &TensorView, want: &Json) {
    assert_eq!(
        v.dtype.name(),
        want["dtype"].as_str().unwrap(),
        "{at}: dtype"
    );
    assert_eq!(v.shape.dims(), &dims(&want["shape"])[..], "{at}: shape");
    assert_eq!(hex(&v.bytes), want["hex"].as_str().unwrap(), "{at}: body");
}

fn f32_hex(v: &[f32]) -> String {
    v.iter().map(|x| hex(&x.to_le_bytes())).collect()
}

/// Compares a decoded packet with the description `make_fixtures.py` built from the
/// inputs.
fn check(at: &str, p: &Packet, want: &Json) {
    let kind = want.get("kind").and_then(Json::as_str).unwrap_or("dense");
    assert_eq!(p.kind(), kind, "{at}: kind");
    match p {
        Packet::Dense(v) => check_dense(at, v, want),
        Packet::Bundle(b) => {
            let entries = want["entries"].as_array().unwrap();
            assert_eq!(b.entries.len(), entries.len(), "{at}: entry count");
            for ((key, member), e) in b.entries.iter().zip(entries) {
                assert_eq!(key, e[0].as_str().unwrap(), "{at}: key");
                check(&format!("{at}.{key}"), member, &e[1]);
            }
        }
        Packet::Sparse(s) => {
            assert_eq!(s.format.name(), want["format"].as_str().unwrap(), "{at}");
            assert_eq!(s.shape.dims(), &dims(&want["shape"])[..], "{at}: shape");
            check_dense(&format!("{at}.data"), &s.data, &want["data"]);
            check_dense(&format!("{at}.indices"), &s.indices, &want["indices"]);
            check_dense(&format!("{at}.pointers"), &s.pointers, &want["pointers"]);
        }
        Packet::Strings(s) => {
            let items: Vec<String> = s.iter().map(hex).collect();
            let want: Vec<&str> = want["items_hex"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_str().unwrap())
                .collect();
            assert_eq!(items, want, "{at}: strings");
            for i in 0..s.count() {
                s.get_str(i).unwrap();
            }
        }
        Packet::Ragged(r) => {
            let framing = match r.framing {
                RaggedFraming::Bundle => "bundle",
                RaggedFraming::Flag => "flag",
            };
            assert_eq!(framing, want["framing"].as_str().unwrap(), "{at}: framing");
            let offsets: Vec<u64> = r
                .offsets
                .bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(offsets, dims(&want["offsets"]), "{at}: offsets");
            check_dense(&format!("{at}.flat"), &r.flat, &want["flat"]);
        }
        Packet::Quantized(q) => {
            assert_eq!(q.dtype.name(), want["dtype"].as_str().unwrap(), "{at}");
            assert_eq!(q.shape.dims(), &dims(&want["shape"])[..], "{at}: shape");
            assert_eq!(u64::from(q.scheme.code()), want["scheme"].as_u64().unwrap());
            assert_eq!(
                u64::from(q.axis),
                want["axis"].as_u64().unwrap(),
                "{at}: axis"
            );
            assert_eq!(
                u64::from(q.group_size),
                want["group_size"].as_u64().unwrap()
            );
            assert_eq!(f32_hex(&q.scales), want["scales_hex"].as_str().unwrap());
            assert_eq!(
                f32_hex(&q.zero_points),
                want["zero_points_hex"].as_str().unwrap()
            );
            assert_eq!(
                hex(&q.data),
                want["data_hex"].as_str().unwrap(),
                "{at}: data"
            );
        }
        Packet::IpcRef(r) => {
            assert_eq!(hex(&r.handle), want["handle_hex"].as_str().unwrap());
            assert_eq!(r.byte_offset, want["byte_offset"].as_u64().unwrap());
            assert_eq!(r.nbytes, want["nbytes"].as_u64().unwrap());
            assert_eq!(
                hex(&r.device_uuid),
                want["device_uuid_hex"].as_str().unwrap()
            );
        }
        other => panic!("{at}: unexpected {}", other.kind()),
    }
}

fn options(want: &Json) -> EncodeOptions {
    EncodeOptions {
        alignment: want["alignment"].as_u64().unwrap() as usize,
        integrity: want["integrity"].as_bool().unwrap(),
        compress: want
            .get("compress")
            .and_then(Json::as_bool)
            .unwrap_or(false),
        aligned_bundle: false,
    }
}

#[test]
fn every_fixture_decodes_to_its_value_and_reencodes_byte_for_byte() {
    let (dir, cases) = fixtures();
    let kinds: std::collections::BTreeSet<&str> = cases
        .iter()
        .map(|(_, w)| w.get("kind").and_then(Json::as_str).unwrap_or("dense"))
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "bundle",
            "dense",
            "ipc_ref",
            "quantized",
            "ragged",
            "sparse",
            "strings"
        ]
    );
    for (name, want) in &cases {
        let file = std::fs::read(dir.join(format!("{name}.tnso"))).unwrap();
        let packet =
            decode_packet(&Bytes::from_vec(file.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(name, &packet, want);
        let ours = packet
            .encode(&options(want))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            ours == file,
            "{name}: our packet differs from tenso's\n ours {}\n file {}",
            hex(&ours),
            hex(&file)
        );
    }
}

#[test]
fn every_fixture_opens_as_a_source() {
    let (dir, cases) = fixtures();
    for (name, _) in &cases {
        let file = std::fs::read(dir.join(format!("{name}.tnso"))).unwrap();
        let src = PacketSource::from_bytes(Bytes::from_vec(file), &PacketLimits::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for info in src.tensors() {
            let view = src.view(&info.name).unwrap();
            assert_eq!(
                view.bytes.len() as u64,
                info.nbytes,
                "{name}: {}",
                info.name
            );
        }
    }
    let file = std::fs::read(dir.join("bundle_nested.tnso")).unwrap();
    let src = PacketSource::from_bytes(Bytes::from_vec(file), &PacketLimits::default()).unwrap();
    let names: Vec<&str> = src.tensors().iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["a", "b", "bb.c", "bb.d.e", "s"]);
    let file = std::fs::read(dir.join("bundle_with_sparse.tnso")).unwrap();
    let src = PacketSource::from_bytes(Bytes::from_vec(file), &PacketLimits::default()).unwrap();
    let names: Vec<&str> = src.tensors().iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["w.data", "w.indices", "w.indptr", "x"]);
    // `verify` counts the integrity footers open checked: one per packet with one.
    let open = |name: &str| {
        let file = std::fs::read(dir.join(format!("{name}.tnso"))).unwrap();
        PacketSource::from_bytes(Bytes::from_vec(file), &PacketLimits::default()).unwrap()
    };
    assert_eq!(open("worked_example_integrity").verify().unwrap(), 1);
    assert_eq!(open("bundle_nested").verify().unwrap(), 0);
}
