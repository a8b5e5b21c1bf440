//! Fuzzes the packet decoders. Any input must give a value or a typed error, never a
//! panic. The dense decoder's view must re-encode to the input when the input used the
//! writer's canonical layout. A packet of any kind that `decode_packet` accepts must
//! re-encode (with and without `aligned_bundle`), and what it re-encodes to must decode
//! and re-encode to the very same bytes; the source built from it must serve every
//! tensor it lists.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Bytes, TensorSource};
use tensorwire_packet::{
    decode, decode_packet, encode, packet_info, EncodeOptions, PacketLimits, PacketSource,
};

fuzz_target!(|data: &[u8]| {
    let limits = PacketLimits::default();
    let input = Bytes::from_vec(data.to_vec());
    dense(data, &input, &limits);

    let Ok(packet) = decode_packet(&input) else {
        return;
    };
    let (flags, alignment) = match packet_info(data, &limits) {
        Ok(info) => (info.flags, info.alignment),
        Err(_) => (0, 64),
    };
    for (options, label) in [
        (EncodeOptions::default(), "default"),
        (
            EncodeOptions {
                alignment: alignment.max(1),
                integrity: flags & tensorwire_packet::flags::INTEGRITY != 0,
                compress: true,
                aligned_bundle: true,
            },
            "aligned",
        ),
    ] {
        let once = packet
            .encode(&options)
            .unwrap_or_else(|e| panic!("{label}: a decoded packet does not encode: {e}"));
        let again = decode_packet(&Bytes::from_vec(once.clone()))
            .unwrap_or_else(|e| panic!("{label}: our own packet does not decode: {e}"));
        let twice = again.encode(&options).unwrap();
        assert!(once == twice, "{label}: re-encoding is not stable");
    }
    if let Ok(src) = PacketSource::from_bytes(input, &limits) {
        for info in src.tensors() {
            let view = src.view(&info.name).unwrap();
            assert_eq!(view.bytes.len() as u64, info.nbytes);
        }
    }
});

/// The dense decoder: `packet_info` bounds every length by the input and aligns the
/// body; a decoded view in the canonical v4 layout re-encodes to the input.
fn dense(data: &[u8], input: &Bytes, limits: &PacketLimits) {
    let Ok(info) = packet_info(data, limits) else {
        return;
    };
    assert!(info.total_len <= data.len());
    assert_eq!(info.body_offset % info.alignment, 0);
    let Ok(view) = decode(input) else {
        return;
    };
    assert_eq!(view.bytes.len(), info.body_len);
    let options = EncodeOptions {
        alignment: info.alignment,
        integrity: info.flags & tensorwire_packet::flags::INTEGRITY != 0,
        ..EncodeOptions::default()
    };
    if let Ok(ours) = encode(view.dtype, &view.shape, &view.bytes, options) {
        let canonical = info.version == 4
            && data[..info.body_offset] == ours[..info.body_offset.min(ours.len())];
        if canonical {
            assert_eq!(ours, data);
        }
    }
}
