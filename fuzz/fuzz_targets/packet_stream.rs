//! Fuzzes the stream reader: arbitrary bytes, delivered in pseudo-random chunks (with
//! `Interrupted` now and then), are read packet by packet until the end or an error.
//! No panic; every packet is 64-byte aligned, frames to its own length, and the
//! packets tile the input from its start; the outcome does not depend on the chunking
//! (the framer given the whole rest of the input agrees); and the reader's buffer
//! never grows past the bytes it was given plus one read chunk.
#![no_main]

use std::io::{self, Read};

use libfuzzer_sys::fuzz_target;
use tensorwire_core::Bytes;
use tensorwire_packet::{
    decode_packet_with, Framing, PacketFramer, PacketLimits, PacketReader, READ_CHUNK,
};

/// Hands out `data` in chunks of 1 to 64 bytes chosen by an LCG, interrupted on some
/// calls.
struct Chunks<'a> {
    data: &'a [u8],
    state: u64,
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = self.state >> 33;
        if r % 13 == 0 {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = ((r % 64) as usize + 1).min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    // The chunking and the limits derive from the input, so seeds can be plain packets.
    let seed = data
        .iter()
        .rev()
        .take(8)
        .fold(data.len() as u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let limits = match seed % 4 {
        0 => PacketLimits::default(),
        1 => PacketLimits {
            max_packet_bytes: 4096,
            max_nesting: 3,
            ..PacketLimits::default()
        },
        2 => PacketLimits {
            max_ndim: 4,
            max_elements: 1000,
            max_bundle_entries: 4,
            max_alignment_exponent: 8,
            ..PacketLimits::default()
        },
        _ => PacketLimits {
            max_nesting: usize::MAX,
            ..PacketLimits::default()
        },
    };
    let mut reader = PacketReader::with_limits(Chunks { data, state: seed }, limits);
    let mut position = 0usize;
    loop {
        // What the framer says about the rest of the input, given all of it at once.
        let rest = &data[position..];
        let whole = PacketFramer::new(limits).advance(rest);
        let result = reader.read_packet_bytes();
        assert!(
            reader.peak_buffer_capacity() <= data.len() + READ_CHUNK + 256,
            "buffer {} for {} input bytes",
            reader.peak_buffer_capacity(),
            data.len()
        );
        match result {
            Ok(Some(packet)) => {
                assert!(packet.is_aligned(64));
                assert_eq!(whole.unwrap(), Framing::Complete { len: packet.len() as u64 });
                assert_eq!(&packet[..], &rest[..packet.len()]);
                let mut alone = PacketFramer::new(limits);
                assert_eq!(
                    alone.advance(&packet).unwrap(),
                    Framing::Complete { len: packet.len() as u64 }
                );
                position += packet.len();
                assert_eq!(reader.position(), position as u64);
                // Decoding may fail, never panic.
                let _ = decode_packet_with(&packet, &limits);
                let _ = decode_packet_with(&Bytes::from_vec(packet.to_vec()), &limits);
            }
            Ok(None) => {
                assert!(rest.is_empty());
                break;
            }
            Err(e) => {
                match whole {
                    Ok(Framing::Incomplete { need }) => {
                        assert!(need as usize > rest.len());
                        assert!(
                            matches!(e, tensorwire_core::Error::Truncated { .. }),
                            "{e}"
                        );
                    }
                    Ok(Framing::Complete { len }) => {
                        panic!("reader failed ({e}) on a {len}-byte packet the framer accepts")
                    }
                    Err(_) => {}
                }
                assert!(reader.is_failed());
                assert!(reader.read_packet_bytes().is_err());
                break;
            }
        }
    }
});
