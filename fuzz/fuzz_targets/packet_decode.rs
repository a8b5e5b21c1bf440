//! Fuzzes the dense packet decoder: any input must give a view or a typed error, and
//! a decoded view must re-encode to the same bytes when the input used the writer's
//! canonical layout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::Bytes;
use tensorwire_packet::{decode, encode, packet_info, EncodeOptions, PacketLimits};

fuzz_target!(|data: &[u8]| {
    let limits = PacketLimits::default();
    let Ok(info) = packet_info(data, &limits) else {
        return;
    };
    assert!(info.total_len <= data.len());
    assert_eq!(info.body_offset % info.alignment, 0);
    let Ok(view) = decode(&Bytes::from_vec(data.to_vec())) else {
        return;
    };
    assert_eq!(view.bytes.len(), info.body_len);
    // Re-encoding reproduces the packet when its padding is zero and it is v4 with the
    // flags our encoder would choose.
    let options = EncodeOptions {
        alignment: info.alignment,
        integrity: info.flags & tensorwire_packet::flags::INTEGRITY != 0,
    };
    if let Ok(ours) = encode(view.dtype, &view.shape, &view.bytes, options) {
        let canonical = info.version == 4
            && data[..info.body_offset] == ours[..info.body_offset.min(ours.len())];
        if canonical {
            assert_eq!(ours, data);
        }
    }
});
