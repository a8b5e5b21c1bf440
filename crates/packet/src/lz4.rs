//! LZ4 frame bodies (flag 0x04), as tenso 0.24 writes them with `lz4_flex` 0.11.

use std::io::{Read, Write};

use lz4_flex::frame::{FrameDecoder, FrameEncoder};
use tensorwire_core::{AlignedBuf, Error, Result};

/// How many output bytes one LZ4 input byte can produce, at most: a match length grows
/// by 255 per extension byte, so no frame inflates more than 255× (plus a constant).
/// A body declaring more than this for its compressed length is refused before any
/// buffer is allocated.
const MAX_RATIO: u64 = 255;
/// Slack for frame and block headers on tiny bodies.
const RATIO_SLACK: u64 = 1024;
/// The magic number that opens an LZ4 frame (`0x184D2204`, little-endian).
const FRAME_MAGIC: [u8; 4] = [0x04, 0x22, 0x4D, 0x18];

fn lz4_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Decode {
        tensor: what.to_owned(),
        encoding: "lz4 frame".to_owned(),
        reason: e.to_string(),
    }
}

/// Compresses `data` into one LZ4 frame exactly as tenso 0.24 does: `lz4_flex`'s
/// default frame settings (independent blocks, no checksums, no content size), the
/// block size picked from the whole body in one write (64 KiB up to 64 KiB, 256 KiB up
/// to 256 KiB, 4 MiB above).
pub(crate) fn compress(data: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let mut encoder = FrameEncoder::new(out);
    encoder
        .write_all(data)
        .and_then(|()| encoder.finish().map(|_| ()).map_err(std::io::Error::other))
        .map_err(|e| lz4_error("packet body", e))
}

/// Decompresses a frame that must hold exactly `expected` bytes into a new 64-aligned
/// buffer. Never allocates more than `expected` bytes (plus the decoder's block buffer,
/// at most 2 × 8 MiB), and refuses `expected` when the frame is too short to produce
/// it; a frame that holds more than `expected` (a bomb) fails after one extra block.
pub(crate) fn decompress(frame: &[u8], expected: usize, what: &str) -> Result<AlignedBuf> {
    if frame.get(..4) != Some(&FRAME_MAGIC[..]) {
        return Err(lz4_error(
            what,
            "the body does not start with an LZ4 frame magic",
        ));
    }
    let bound = (frame.len() as u64)
        .saturating_mul(MAX_RATIO)
        .saturating_add(RATIO_SLACK);
    if expected as u64 > bound {
        return Err(lz4_error(
            what,
            format!(
                "{} compressed bytes cannot hold the {expected} bytes the header declares",
                frame.len()
            ),
        ));
    }
    let mut buf = AlignedBuf::zeroed(expected)?;
    let mut decoder = FrameDecoder::new(frame);
    decoder
        .read_exact(buf.as_mut_slice())
        .map_err(|e| lz4_error(what, format!("{e} (expected {expected} bytes)")))?;
    let mut probe = [0u8; 1];
    match decoder.read(&mut probe) {
        Ok(0) => Ok(buf),
        Ok(_) => Err(lz4_error(
            what,
            format!("frame holds more than the {expected} bytes the header declares"),
        )),
        Err(e) => Err(lz4_error(what, e)),
    }
}
