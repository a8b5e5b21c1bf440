//! The `zt.zstd-seekable/1` encoding of `.zt` version 2: the zstd seekable format.
//!
//! An encoded part is a run of independent zstd frames followed by a seek table in a
//! skippable frame:
//!
//! ```text
//! frame 0 | frame 1 | … | 5E 2A 4D 18 | size u32 | entries | frames u32 | descriptor u8 | B1 EA 92 8F
//! ```
//!
//! Each entry is the frame's compressed size and decoded size (u32 LE each), plus a
//! u32 checksum (the low 32 bits of XXH64 of the decoded frame) when bit 7 of the
//! descriptor is set. The profile (`spec/profiles/zt.zstd-seekable-1.md`) adds: every
//! frame decodes to at most 16 MiB, all frames but the last decode to the same size,
//! and the frames decode to exactly the part's `decoded_length`.
//!
//! ztensor 2.x writes 1 MiB frames at zstd level 3 with a content checksum, through
//! zstd's streaming encoder (so the frame header carries no content size), and no
//! checksum column; [`encode_to`] writes the same bytes.
//!
//! Decoding writes each frame straight into its slice of the destination, which is
//! exactly `decoded_length` long, so a frame that inflates beyond what the table says
//! fails instead of allocating.

use std::io::Write;

use tensorwire_core::{Error, Result};

/// Decoded bytes per frame that ztensor's (and our) encoder uses.
pub(crate) const FRAME_BYTES: usize = 1 << 20;
/// Largest decoded frame the profile allows.
pub(crate) const MAX_FRAME: u64 = 16 << 20;
/// Magic of the skippable frame that holds the seek table.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// Magic at the very end of the seek table.
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// Skippable-frame header (magic + size) plus the seek-table footer (frames,
/// descriptor, magic).
const TABLE_OVERHEAD: usize = 8 + 9;

/// The manifest name of the encoding.
pub(crate) const NAME: &str = crate::ZSTD_SEEKABLE;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A checked seek table.
struct Table<'a> {
    /// The entries, `entry_size` bytes each.
    entries: &'a [u8],
    entry_size: usize,
    /// Whether entries carry a checksum of the decoded frame.
    checksums: bool,
}

impl Table<'_> {
    /// `(compressed, decoded, checksum)` of every frame, in order.
    fn frames(&self) -> impl Iterator<Item = (usize, usize, Option<u32>)> + '_ {
        self.entries.chunks_exact(self.entry_size).map(|e| {
            (
                le32(e, 0) as usize,
                le32(e, 4) as usize,
                self.checksums.then(|| le32(e, 8)),
            )
        })
    }
}

/// Reads and checks the seek table of `stored` against `decoded_length`: its
/// framing, the per-frame limits, that the frames tile the bytes before the table,
/// and that they decode to `decoded_length` in all.
fn table(stored: &[u8], decoded_length: u64) -> std::result::Result<Table<'_>, String> {
    let n = stored.len();
    if n < TABLE_OVERHEAD {
        return Err(format!("{n} bytes is too short for a seek table"));
    }
    if le32(stored, n - 4) != SEEKABLE_MAGIC {
        return Err("missing the seekable footer magic".into());
    }
    let descriptor = stored[n - 5];
    if descriptor & 0x7f != 0 {
        return Err(format!(
            "reserved seek-table descriptor bits set ({descriptor:#04x})"
        ));
    }
    let checksums = descriptor & 0x80 != 0;
    let entry_size = if checksums { 12 } else { 8 };
    let frames = le32(stored, n - 9) as usize;
    let content = frames
        .checked_mul(entry_size)
        .and_then(|v| v.checked_add(9))
        .filter(|&c| c + 8 <= n)
        .ok_or_else(|| {
            format!("a seek table of {frames} frames is larger than the {n} stored bytes")
        })?;
    let table_start = n - 8 - content;
    if le32(stored, table_start) != SKIPPABLE_MAGIC
        || le32(stored, table_start + 4) as usize != content
    {
        return Err("malformed seek-table skippable frame header".into());
    }
    let t = Table {
        entries: &stored[table_start + 8..n - 9],
        entry_size,
        checksums,
    };
    let (mut compressed, mut decoded) = (0u64, 0u64);
    let mut first = None;
    let mut last = 0;
    for (i, (c, d, _)) in t.frames().enumerate() {
        if d as u64 > MAX_FRAME {
            return Err(format!(
                "frame {i} decodes to {d} bytes, above the 16 MiB limit"
            ));
        }
        if i > 0 && Some(last) != first {
            return Err(format!(
                "frame {} is not the last but has a different size",
                i - 1
            ));
        }
        first.get_or_insert(d);
        last = d;
        compressed += c as u64;
        decoded += d as u64;
    }
    if decoded != decoded_length {
        return Err(format!(
            "the seek table adds up to {decoded} decoded bytes, the manifest says {decoded_length}"
        ));
    }
    if compressed != table_start as u64 {
        return Err(format!(
            "the frames take {compressed} bytes but the seek table starts at {table_start}"
        ));
    }
    Ok(t)
}

fn decode_error(what: &str, reason: String) -> Error {
    Error::Decode {
        tensor: what.to_owned(),
        encoding: NAME.to_owned(),
        reason,
    }
}

/// Decodes frame `i` (its compressed bytes in `frame`) into `dst`, which is exactly
/// the decoded size the seek table gives it, and checks the table's checksum.
fn decode_frame(
    decompressor: &mut zstd::bulk::Decompressor<'_>,
    i: usize,
    frame: &[u8],
    dst: &mut [u8],
    checksum: Option<u32>,
    what: &str,
) -> Result<()> {
    let n = decompressor
        .decompress_to_buffer(frame, dst)
        .map_err(|e| decode_error(what, format!("frame {i}: {e}")))?;
    if n != dst.len() {
        return Err(decode_error(
            what,
            format!(
                "frame {i} decoded to {n} bytes, the seek table says {}",
                dst.len()
            ),
        ));
    }
    if let Some(want) = checksum {
        let got = xxhash_rust::xxh64::xxh64(dst, 0) as u32;
        if got != want {
            return Err(decode_error(
                what,
                format!("frame {i}: checksum {got:#010x}, the seek table says {want:#010x}"),
            ));
        }
    }
    Ok(())
}

/// Checks the seek table and prepares a decompressor.
fn open<'a>(
    stored: &'a [u8],
    decoded_length: u64,
    what: &str,
) -> Result<(Table<'a>, zstd::bulk::Decompressor<'static>)> {
    let t = table(stored, decoded_length).map_err(|r| decode_error(what, r))?;
    let d = zstd::bulk::Decompressor::new().map_err(|e| decode_error(what, e.to_string()))?;
    Ok((t, d))
}

/// Decodes `stored` into `dst`, which must be exactly the part's decoded length.
pub(crate) fn decode_into(stored: &[u8], dst: &mut [u8], what: &str) -> Result<()> {
    let (t, mut decompressor) = open(stored, dst.len() as u64, what)?;
    let (mut at, mut rest) = (0usize, dst);
    for (i, (c, d, checksum)) in t.frames().enumerate() {
        // The table adds up to `dst.len()` and tiles the bytes before it, so both
        // splits are in range.
        let (head, tail) = rest.split_at_mut(d);
        decode_frame(
            &mut decompressor,
            i,
            &stored[at..at + c],
            head,
            checksum,
            what,
        )?;
        rest = tail;
        at += c;
    }
    Ok(())
}

/// Decodes `stored` frame by frame through one frame-sized scratch buffer, handing
/// each decoded frame to `each` (for hashing without holding the whole part).
pub(crate) fn for_each_frame(
    stored: &[u8],
    decoded_length: u64,
    what: &str,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let (t, mut decompressor) = open(stored, decoded_length, what)?;
    // Every frame is at most 16 MiB and at most the whole part, both checked.
    let cap = t.frames().map(|(_, d, _)| d).max().unwrap_or(0);
    let mut scratch = vec![0u8; cap];
    let mut at = 0usize;
    for (i, (c, d, checksum)) in t.frames().enumerate() {
        let dst = &mut scratch[..d];
        decode_frame(
            &mut decompressor,
            i,
            &stored[at..at + c],
            dst,
            checksum,
            what,
        )?;
        each(dst)?;
        at += c;
    }
    Ok(())
}

/// Encodes `data` as ztensor does (1 MiB frames, each with a content checksum, then
/// the seek table) and writes it to `out`, reporting the input bytes encoded to
/// `progress` every [`tensorwire_core::progress::PROGRESS_CHUNK`] bytes and at the
/// end. Returns the number of bytes written.
pub(crate) fn encode_to(
    data: &[u8],
    level: i32,
    out: &mut impl Write,
    progress: tensorwire_core::progress::Progress<'_>,
) -> Result<u64> {
    let frames = data.chunks(FRAME_BYTES);
    let mut table = Vec::with_capacity(frames.len() * 8 + TABLE_OVERHEAD);
    let mut written = 0u64;
    let mut unreported = 0u64;
    for chunk in data.chunks(FRAME_BYTES) {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), level)?;
        enc.include_checksum(true)?;
        enc.write_all(chunk)?;
        let frame = enc.finish()?;
        let c = u32::try_from(frame.len()).map_err(|_| Error::Overflow {
            what: "zstd frame size",
        })?;
        table.extend_from_slice(&c.to_le_bytes());
        table.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        out.write_all(&frame)?;
        written += frame.len() as u64;
        unreported += chunk.len() as u64;
        if unreported >= tensorwire_core::progress::PROGRESS_CHUNK as u64 {
            progress(std::mem::take(&mut unreported))?;
        }
    }
    if unreported > 0 {
        progress(unreported)?;
    }
    let count = (table.len() / 8) as u32;
    let mut tail = Vec::with_capacity(table.len() + TABLE_OVERHEAD);
    tail.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    tail.extend_from_slice(&(table.len() as u32 + 9).to_le_bytes());
    tail.extend_from_slice(&table);
    tail.extend_from_slice(&count.to_le_bytes());
    tail.push(0);
    tail.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
    out.write_all(&tail)?;
    Ok(written + tail.len() as u64)
}
