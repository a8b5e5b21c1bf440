//! The ZIP container of `torch.save` (torch ≥ 1.6): the central directory, ZIP64, and
//! the byte range of each record's data.
//!
//! Only what checkpoints need: single-disk archives, records stored (method 0) or
//! deflated (method 8), no encryption. Record data is located through the central
//! directory (sizes there are authoritative: torch writes data descriptors) and each
//! record's local header (whose extra field holds torch's alignment padding). CRCs are
//! not checked on reads, since torch can write archives with CRCs turned off; they
//! are checked by [`ZipArchive::verify`] (and [`ZipEntry::check_crc32`] checks one
//! record's data for readers that hold it whole).
//!
//! Record names are decoded as Python's `zipfile` decodes them: UTF-8 when the
//! record's general-purpose flag bit 11 is set, code page 437 otherwise (ASCII names,
//! such as every name torch writes, read the same either way).

use std::sync::{Arc, OnceLock};

use tensorwire_core::{AlignedBuf, Bytes, Error, NameMap, Result};

use crate::input::Input;

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: u64 = 22;
/// The end of the file read first when looking for the end record: the record, the
/// ZIP64 locator before it and room for a short comment.
const EOCD_SHORT_TAIL: u64 = 1024;
const CENTRAL_LEN: usize = 46;
/// General-purpose flag bit 11: the record's name (and comment) are UTF-8.
const UTF8_NAME_FLAG: u16 = 1 << 11;
const LOCAL_LEN: u64 = 30;
/// Extra-field bytes a combined local-header-and-head read allows for.
const LOCAL_EXTRA_SLACK: u64 = 96;

/// How a record's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Uncompressed.
    Stored,
    /// Raw DEFLATE.
    Deflated,
}

/// One record of the archive.
#[derive(Debug, Clone)]
pub struct ZipEntry {
    /// Full name in the archive.
    pub name: Arc<str>,
    /// Storage method.
    pub method: Method,
    /// CRC-32 from the central directory (0 when the writer did not compute one).
    pub crc32: u32,
    /// Bytes stored.
    pub compressed_size: u64,
    /// Bytes after decompression.
    pub size: u64,
    /// File offset of the record's data.
    pub data_offset: u64,
    /// The first bytes of the record's stored data, read together with its local
    /// header when [`ZipArchive::parse_with_heads`] was asked for them (at most that
    /// many, fewer for a shorter record or when the read did not reach them); `None`
    /// otherwise.
    pub head: Option<Bytes>,
    /// Set once [`ZipEntry::check_once`] has passed.
    crc_checked: OnceLock<()>,
}

impl ZipEntry {
    /// Checks `data`, the record's whole data (inflated when deflated), against its
    /// CRC-32; a mismatch is [`Error::DigestMismatch`] naming the record.
    pub fn check_crc32(&self, data: &[u8]) -> Result<()> {
        self.expect_crc32(crc32fast::hash(data))
    }

    /// Checks the record's data in `input` against its CRC-32: a stored record's bytes
    /// in one pass over the map, a mismatch confirmed against the bytes as the file
    /// holds them ([`Input::file_crc32`]: a write to a private map's zero-copy view
    /// is not damage); a deflated record inflated whole (at most `max_bytes`).
    pub fn check_stored_data(&self, input: &Input, max_bytes: u64) -> Result<()> {
        match self.method {
            Method::Stored => {
                let (offset, len) = (self.data_offset, self.compressed_size);
                if input.crc32(offset, len)? == self.crc32 {
                    return Ok(());
                }
                self.expect_crc32(input.file_crc32(offset, len)?)
            }
            Method::Deflated => self.check_crc32(&read_entry(input, self, max_bytes, false)?),
        }
    }

    /// `check` (a check of this record's CRC-32), once per entry: a later call after
    /// a pass does nothing; a failure is not remembered, so it fails again.
    pub fn check_once(&self, check: impl FnOnce(&ZipEntry) -> Result<()>) -> Result<()> {
        if self.crc_checked.get().is_none() {
            check(self)?;
            let _ = self.crc_checked.set(());
        }
        Ok(())
    }

    /// Checks `found`, the CRC-32 of the record's whole data, against the one it
    /// declares (see [`ZipEntry::check_crc32`]).
    pub fn expect_crc32(&self, found: u32) -> Result<()> {
        if found != self.crc32 {
            return Err(Error::DigestMismatch {
                tensor: self.name.to_string(),
                algorithm: "crc32",
                expected: format!("0x{:08x}", self.crc32),
                found: format!("0x{found:08x}"),
            });
        }
        Ok(())
    }
}

/// The records of a ZIP archive.
#[derive(Debug)]
pub struct ZipArchive {
    entries: Vec<ZipEntry>,
    by_name: NameMap<Arc<str>, usize>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn bad(offset: u64, reason: impl Into<String>) -> Error {
    Error::malformed(offset, format!("zip: {}", reason.into()))
}

/// Where the central directory is, from the end records.
struct Directory {
    offset: u64,
    size: u64,
    /// The record count; `None` when the end record's is saturated (0xFFFF) and no
    /// ZIP64 record gives the real one: the records then fill the directory's size.
    entries: Option<u64>,
}

fn find_directory(input: &Input) -> Result<Directory> {
    let len = input.len();
    if len < EOCD_LEN {
        return Err(Error::Truncated {
            offset: 0,
            needed: EOCD_LEN,
            available: len,
        });
    }
    // The end record is 22 bytes plus a comment of at most 65 535 bytes. Archives
    // rarely have a comment (torch and numpy write none), so the last few KiB are
    // read first, and all 64 KiB only when the record is not among them.
    // The record is chosen as Python's zipfile and miniz (torch's reader) choose it:
    // one with no comment in the last 22 bytes, else the last signature with a whole
    // record after it (a comment cut short, or bytes appended after the archive, do
    // not matter).
    let find = |tail_len: u64| -> Result<Option<(Bytes, usize, u64)>> {
        let tail_start = len - tail_len;
        let tail = input.read_meta(tail_start, tail_len)?;
        // Searching backwards, a record in the last 22 bytes is found first.
        let last = tail.len() - EOCD_LEN as usize;
        let pos = (0..=last).rev().find(|&i| u32_at(&tail, i) == EOCD_SIG);
        Ok(pos.map(|pos| (tail, pos, tail_start)))
    };
    // The last signature of a window is also the last of any longer window ending at
    // the same byte, so the short tail alone decides when it holds one.
    let short = len.min(EOCD_SHORT_TAIL);
    let full = len.min(EOCD_LEN + 0xffff);
    let found = match find(short)? {
        Some(found) => Some(found),
        None if full > short => find(full)?,
        None => None,
    };
    let Some((tail, pos, tail_start)) = found else {
        let last = input.read_meta(len - 4, 4)?;
        return Err(Error::BadMagic {
            offset: len - EOCD_LEN,
            expected: "a ZIP end-of-central-directory record",
            found: last.to_vec(),
        });
    };
    let eocd = &tail[pos..];
    let eocd_offset = tail_start + pos as u64;
    if u16_at(eocd, 4) != 0 || u16_at(eocd, 6) != 0 {
        return Err(Error::unsupported("multi-disk ZIP archives"));
    }
    let mut dir = Directory {
        entries: match u16_at(eocd, 10) {
            // Saturated: unless a ZIP64 record below gives the real count, the records
            // fill the directory's size, as Python's zipfile reads them (its writer
            // stores exactly 65 535 records so without ZIP64; other writers may store
            // more).
            0xffff => None,
            n => Some(n.into()),
        },
        size: u32_at(eocd, 12).into(),
        offset: u32_at(eocd, 16).into(),
    };
    // With a ZIP64 locator before the end record, the ZIP64 end record gives every
    // value; without one, the end record's values are taken as they are (a
    // saturated count as above).
    let mut directory_end_limit = eocd_offset;
    if eocd_offset >= 20 {
        // The ZIP64 locator, if any, sits right before the end record: usually in the
        // tail already read.
        let locator = match pos.checked_sub(20) {
            Some(at) => tail.slice(at..pos)?,
            None => input.read_meta(eocd_offset - 20, 20)?,
        };
        if u32_at(&locator, 0) == ZIP64_LOCATOR_SIG {
            let record_offset = u64_at(&locator, 8);
            let record = input
                .read_meta(record_offset, 56)
                .map_err(|_| bad(eocd_offset - 20, "ZIP64 end record lies outside the file"))?;
            if u32_at(&record, 0) != ZIP64_EOCD_SIG {
                return Err(bad(
                    record_offset,
                    format!("bad ZIP64 end-record signature{SHIFTED}"),
                ));
            }
            // The record ends where the locator starts (its size field counts the
            // bytes after itself), as every writer puts it and Python's zipfile
            // requires: a locator copied into a comment, before a planted end record,
            // points at a record that does not.
            let record_end = u64_at(&record, 4)
                .checked_add(record_offset)
                .and_then(|end| end.checked_add(12));
            if record_end != Some(eocd_offset - 20) {
                return Err(bad(
                    record_offset,
                    format!("the ZIP64 end record does not end where its locator starts{SHIFTED}"),
                ));
            }
            directory_end_limit = record_offset;
            dir = Directory {
                entries: Some(u64_at(&record, 32)),
                size: u64_at(&record, 40),
                offset: u64_at(&record, 48),
            };
        }
    }
    match dir.offset.checked_add(dir.size) {
        Some(end) if end <= directory_end_limit => Ok(dir),
        _ => Err(Error::OutOfBounds {
            tensor: "zip central directory".into(),
            offset: dir.offset,
            length: dir.size,
            limit: directory_end_limit,
        }),
    }
}

/// The ZIP64 extended-information extra field overrides the 32-bit values that are
/// saturated, in this order.
fn apply_zip64(
    extra: &[u8],
    size: &mut u64,
    compressed: &mut u64,
    header_offset: &mut u64,
    at: u64,
) -> Result<()> {
    let mut rest = extra;
    while rest.len() >= 4 {
        let id = u16_at(rest, 0);
        let len = usize::from(u16_at(rest, 2));
        let body = rest
            .get(4..4 + len)
            .ok_or_else(|| bad(at, "extra field runs past its header"))?;
        if id == 0x0001 {
            let mut fields = body.chunks_exact(8).map(|c| u64_at(c, 0));
            for value in [size, compressed, header_offset] {
                if *value == 0xffff_ffff {
                    *value = fields
                        .next()
                        .ok_or_else(|| bad(at, "ZIP64 extra field is too short"))?;
                }
            }
            return Ok(());
        }
        rest = &rest[4 + len..];
    }
    Ok(())
}

impl ZipArchive {
    /// Reads the central directory and every record's local header. At most
    /// `max_entries` records, names of at most `max_name` bytes.
    pub fn parse(input: &Input, max_entries: u64, max_name: usize) -> Result<ZipArchive> {
        ZipArchive::parse_with_heads(input, max_entries, max_name, 0)
    }

    /// Like [`ZipArchive::parse`], and also keeps the first `head_len` bytes of each
    /// record's data ([`ZipEntry::head`]), read in the same read as its local header:
    /// for formats that must look at every record's start (an NPZ member's `.npy`
    /// header), this halves the scattered reads.
    pub fn parse_with_heads(
        input: &Input,
        max_entries: u64,
        max_name: usize,
        head_len: u64,
    ) -> Result<ZipArchive> {
        let directory = ZipDirectory::read(input, max_entries, max_name)?;
        let all: Vec<usize> = (0..directory.len()).collect();
        let locations = directory.locate(input, &all, head_len)?;
        directory.into_archive(locations)
    }

    /// Every record, in central-directory order.
    pub fn entries(&self) -> &[ZipEntry] {
        &self.entries
    }

    /// The record called `name`.
    pub fn get(&self, name: &str) -> Option<&ZipEntry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// Checks every record's CRC-32 and returns how many were checked. With
    /// `zero_is_unset`, records whose stored CRC is 0 are skipped: torch writes 0 when
    /// CRCs are switched off (`torch.serialization.set_crc32_options(False)`).
    pub fn verify(&self, input: &Input, max_bytes: u64, zero_is_unset: bool) -> Result<usize> {
        let mut checked = 0;
        for entry in &self.entries {
            if zero_is_unset && entry.crc32 == 0 {
                continue;
            }
            entry.check_stored_data(input, max_bytes)?;
            checked += 1;
        }
        Ok(checked)
    }
}

/// The central directory of a ZIP archive: every record's name, method and sizes, but
/// not yet where its data starts, which only its local header says.
///
/// [`ZipDirectory::locate`] reads local headers (of some records or all, on several
/// threads at once if the caller likes) and [`ZipDirectory::into_archive`] turns the
/// directory and every record's [`Location`] into a [`ZipArchive`]. Splitting the two
/// lets a reader overlap those scattered reads with work that needs only the
/// directory, such as running a checkpoint's pickle.
#[derive(Debug, Clone)]
pub struct ZipDirectory {
    /// Records in central-directory order; each `data_offset` holds the offset of the
    /// record's local header until the record is located.
    entries: Vec<ZipEntry>,
    by_name: NameMap<Arc<str>, usize>,
    /// Where the central directory starts: every record's data must end before it.
    end: u64,
}

/// Where one record's data starts, read from its local header by
/// [`ZipDirectory::locate`].
#[derive(Debug, Clone)]
pub struct Location {
    index: usize,
    data_offset: u64,
    head: Option<Bytes>,
}

impl Location {
    /// The record's index in its directory.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl ZipDirectory {
    /// Reads the end records and the central directory (no local headers). At most
    /// `max_entries` records, names of at most `max_name` bytes.
    pub fn read(input: &Input, max_entries: u64, max_name: usize) -> Result<ZipDirectory> {
        let dir = find_directory(input)?;
        if let Some(count) = dir.entries {
            Error::check_limit("zip record count", count, max_entries)?;
        }
        let central = input.read_meta(dir.offset, dir.size)?;
        // Each record takes at least its fixed part: a count the directory cannot
        // hold is refused before anything is reserved for it.
        let most = central.len() as u64 / CENTRAL_LEN as u64;
        if let Some(count) = dir.entries.filter(|&count| count > most) {
            return Err(bad(
                dir.offset,
                format!(
                    "{count} records cannot fit a central directory of {} bytes",
                    central.len()
                ),
            ));
        }
        let capacity = dir.entries.unwrap_or(most).min(max_entries) as usize;
        let mut entries = Vec::with_capacity(capacity);
        let mut by_name = NameMap::with_capacity_and_hasher(capacity, Default::default());
        let mut pos = 0usize;
        loop {
            match dir.entries {
                Some(count) if entries.len() as u64 == count => break,
                None if pos == central.len() => break,
                None => {
                    Error::check_limit("zip record count", entries.len() as u64 + 1, max_entries)?
                }
                Some(_) => {}
            }
            let at = dir.offset + pos as u64;
            let head = central
                .get(pos..pos + CENTRAL_LEN)
                .ok_or_else(|| bad(at, "central directory ends inside a record"))?;
            if u32_at(head, 0) != CENTRAL_SIG {
                // The end record's offsets are absolute: an archive with bytes before
                // it (or a second archive after it, whose end record is the one found)
                // points its first record at something else.
                return Err(bad(
                    at,
                    if pos == 0 {
                        format!("the end record puts the central directory here, but none starts here{SHIFTED}")
                    } else {
                        "bad central-directory record signature".to_owned()
                    },
                ));
            }
            let flags = u16_at(head, 8);
            let method = match u16_at(head, 10) {
                0 => Method::Stored,
                8 => Method::Deflated,
                other => {
                    return Err(Error::unsupported(format!(
                        "zip compression method {other} (stored and deflate are supported)"
                    )))
                }
            };
            if flags & 0x1 != 0 {
                return Err(Error::unsupported("encrypted zip records"));
            }
            let crc32 = u32_at(head, 16);
            let mut compressed = u64::from(u32_at(head, 20));
            let mut size = u64::from(u32_at(head, 24));
            let name_len = usize::from(u16_at(head, 28));
            let extra_len = usize::from(u16_at(head, 30));
            let comment_len = usize::from(u16_at(head, 32));
            let mut header_offset = u64::from(u32_at(head, 42));
            Error::check_limit("zip record name length", name_len as u64, max_name as u64)?;
            let var = central
                .get(pos + CENTRAL_LEN..pos + CENTRAL_LEN + name_len + extra_len + comment_len)
                .ok_or_else(|| bad(at, "central directory ends inside a record"))?;
            let name = decode_name(&var[..name_len], flags)
                .ok_or_else(|| bad(at, "record name is not UTF-8 (its flag bit 11 says it is)"))?;
            Error::check_limit("zip record name length", name.len() as u64, max_name as u64)?;
            apply_zip64(
                &var[name_len..name_len + extra_len],
                &mut size,
                &mut compressed,
                &mut header_offset,
                at,
            )?;
            if method == Method::Stored && compressed != size {
                return Err(bad(at, format!("stored record `{name}` has two sizes")));
            }
            let name: Arc<str> = Arc::from(name);
            if by_name.insert(name.clone(), entries.len()).is_some() {
                return Err(Error::Duplicate {
                    name: name.to_string(),
                });
            }
            entries.push(ZipEntry {
                name,
                method,
                crc32,
                compressed_size: compressed,
                size,
                // Found from the local header by `locate`; until then, where that starts.
                data_offset: header_offset,
                head: None,
                crc_checked: OnceLock::new(),
            });
            pos += CENTRAL_LEN + name_len + extra_len + comment_len;
        }
        // The end record's count and size must describe the same records: a count
        // that falls short would hide members, and a size too large would hide bytes
        // other readers take for records.
        if pos != central.len() {
            return Err(bad(
                dir.offset + pos as u64,
                format!(
                    "the end record counts {} records, which take {pos} of the central directory's {} bytes",
                    entries.len(),
                    central.len()
                ),
            ));
        }
        Ok(ZipDirectory {
            entries,
            by_name,
            end: dir.offset,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True for an archive without records.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The index of the record called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Record `index`'s name, or `None` past the last record.
    pub fn name(&self, index: usize) -> Option<&str> {
        self.entries.get(index).map(|e| &*e.name)
    }

    /// Record `index`'s size once decompressed, or `None` past the last record.
    pub fn size(&self, index: usize) -> Option<u64> {
        self.entries.get(index).map(|e| e.size)
    }

    /// Where record `index`'s local header starts, or `None` past the last record.
    pub fn header_offset(&self, index: usize) -> Option<u64> {
        // Until located, an entry's `data_offset` holds its local header's offset;
        // entries are only handed out located (see `located`), never from here.
        self.entries.get(index).map(|e| e.data_offset)
    }

    /// Every record's name, in central-directory order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| &*e.name)
    }

    /// Reads the local headers of the records `which` (indices, in any order), and,
    /// when `head_len` is not 0, up to that many bytes of each record's data in the
    /// same read; returns their locations in the order of `which`. Headers are read in
    /// file order, one read covering every header that lies within `GROUP_SPAN` of
    /// the first, so an archive of many small records costs far fewer reads than
    /// records. An index past the last record is an error.
    pub fn locate(&self, input: &Input, which: &[usize], head_len: u64) -> Result<Vec<Location>> {
        let entries = &self.entries;
        if let Some(&bad_index) = which.iter().find(|&&i| i >= entries.len()) {
            return Err(self.no_record(bad_index));
        }
        // What a read must cover from a header: the fixed part and the name (checked
        // against the directory's), and with a head, room for torch-style alignment
        // padding in the extra field, and the head.
        let want = |e: &ZipEntry| -> u64 {
            if head_len == 0 {
                LOCAL_LEN + e.name.len() as u64
            } else {
                LOCAL_LEN
                    + e.name.len() as u64
                    + LOCAL_EXTRA_SLACK
                    + e.compressed_size.min(head_len)
            }
        };
        // Positions in `which`, in the file order of their local headers.
        let mut order: Vec<usize> = (0..which.len()).collect();
        order.sort_by_key(|&k| entries[which[k]].data_offset);
        // Every group is read into this one buffer: no allocation (and no zeroing) per
        // read, which for hundreds of records costs more than the reads' copying.
        let mut scratch: Vec<u8> = Vec::new();
        // The file range the buffer holds: `(start, length)`.
        let mut window: Option<(u64, usize)> = None;
        // Every head, back to back, and where each record's lies: one buffer for all.
        let mut heads: Vec<u8> = Vec::new();
        let mut head_ranges: Vec<Option<std::ops::Range<usize>>> = vec![None; which.len()];
        let mut located: Vec<Option<Location>> = vec![None; which.len()];
        for (n, &k) in order.iter().enumerate() {
            let i = which[k];
            let start = entries[i].data_offset;
            let end = start.saturating_add(want(&entries[i]));
            let covered = window.is_some_and(|(at, len)| start >= at && end <= at + len as u64);
            if !covered {
                let mut group_end = end;
                for &next in &order[n + 1..] {
                    let next = &entries[which[next]];
                    let next_end = next.data_offset.saturating_add(want(next));
                    if next_end - start > GROUP_SPAN {
                        break;
                    }
                    group_end = group_end.max(next_end);
                }
                // Fewer bytes at the end of the file (a header that does not fit fails
                // in `parse_local_header`).
                let len = (group_end - start).min(input.len().saturating_sub(start)) as usize;
                if scratch.len() < len {
                    scratch.resize(len, 0);
                }
                input
                    .read_meta_into(start, &mut scratch[..len])
                    .map_err(|_| local_out_of_bounds(input, &entries[i]))?;
                window = Some((start, len));
            }
            let (at, len) = window.expect("set above");
            let local = &scratch[(start - at) as usize..len];
            let (data_offset, head) = parse_local_header(input, &entries[i], local, head_len)?;
            head_ranges[k] = (!head.is_empty()).then(|| heads.len()..heads.len() + head.len());
            heads.extend_from_slice(head);
            located[k] = Some(Location {
                index: i,
                data_offset,
                head: None,
            });
        }
        let heads = (!heads.is_empty()).then(|| Bytes::from_vec(heads));
        located
            .into_iter()
            .zip(head_ranges)
            .map(|(location, range)| {
                let mut location = location.expect("every position was located");
                if let (Some(heads), Some(range)) = (&heads, range) {
                    location.head = Some(heads.slice(range)?);
                }
                Ok(location)
            })
            .collect()
    }

    fn no_record(&self, index: usize) -> Error {
        Error::invalid(format!(
            "zip record index {index} is past the directory's {} records",
            self.entries.len()
        ))
    }

    /// The record at `location` as it is once located: its data offset and head set,
    /// and its data checked to end before the central directory.
    pub fn located(&self, location: &Location) -> Result<ZipEntry> {
        let mut entry = self
            .entries
            .get(location.index)
            .ok_or_else(|| self.no_record(location.index))?
            .clone();
        entry.data_offset = location.data_offset;
        entry.head = location.head.clone();
        self.check_extent(&entry)?;
        Ok(entry)
    }

    fn check_extent(&self, entry: &ZipEntry) -> Result<()> {
        match entry.data_offset.checked_add(entry.compressed_size) {
            Some(end) if end <= self.end => Ok(()),
            _ => Err(Error::OutOfBounds {
                tensor: format!("zip record `{}`", entry.name),
                offset: entry.data_offset,
                length: entry.compressed_size,
                limit: self.end,
            }),
        }
    }

    /// The archive, from this directory and the [`Location`] of every one of its
    /// records (in any order; a record located twice must be located alike).
    pub fn into_archive(
        mut self,
        locations: impl IntoIterator<Item = Location>,
    ) -> Result<ZipArchive> {
        let mut done = vec![false; self.entries.len()];
        for location in locations {
            if location.index >= self.entries.len() {
                return Err(self.no_record(location.index));
            }
            let entry = &mut self.entries[location.index];
            if done[location.index] {
                if entry.data_offset != location.data_offset {
                    return Err(Error::invalid(format!(
                        "zip record `{}` was located at two offsets",
                        entry.name
                    )));
                }
                continue;
            }
            done[location.index] = true;
            entry.data_offset = location.data_offset;
            entry.head = location.head;
        }
        if let Some(missing) = done.iter().position(|&d| !d) {
            return Err(Error::invalid(format!(
                "zip record `{}` was not located",
                self.entries[missing].name
            )));
        }
        for entry in &self.entries {
            self.check_extent(entry)?;
        }
        Ok(ZipArchive {
            entries: self.entries,
            by_name: self.by_name,
        })
    }
}

/// Added to the errors of an end record whose absolute offsets miss their targets:
/// what a file made by adding bytes to a whole archive looks like.
const SHIFTED: &str = " (were bytes added before the archive, or a second archive after it?)";

/// The most output one byte of deflate data can make.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// Bytes one read may span to cover the local headers of several records: records
/// smaller than this (norms, biases) share reads with their neighbours.
const GROUP_SPAN: u64 = 8 << 10;

fn local_out_of_bounds(input: &Input, entry: &ZipEntry) -> Error {
    Error::OutOfBounds {
        tensor: format!("zip local header of `{}`", entry.name),
        offset: entry.data_offset,
        length: LOCAL_LEN,
        limit: input.len(),
    }
}

/// The characters of code page 437's bytes 0x80 to 0xFF (bytes below 0x80 are ASCII),
/// as Python's `cp437` codec maps them.
const CP437_HIGH: [char; 128] = [
    '\u{00c7}', '\u{00fc}', '\u{00e9}', '\u{00e2}', '\u{00e4}', '\u{00e0}', '\u{00e5}', '\u{00e7}',
    '\u{00ea}', '\u{00eb}', '\u{00e8}', '\u{00ef}', '\u{00ee}', '\u{00ec}', '\u{00c4}', '\u{00c5}',
    '\u{00c9}', '\u{00e6}', '\u{00c6}', '\u{00f4}', '\u{00f6}', '\u{00f2}', '\u{00fb}', '\u{00f9}',
    '\u{00ff}', '\u{00d6}', '\u{00dc}', '\u{00a2}', '\u{00a3}', '\u{00a5}', '\u{20a7}', '\u{0192}',
    '\u{00e1}', '\u{00ed}', '\u{00f3}', '\u{00fa}', '\u{00f1}', '\u{00d1}', '\u{00aa}', '\u{00ba}',
    '\u{00bf}', '\u{2310}', '\u{00ac}', '\u{00bd}', '\u{00bc}', '\u{00a1}', '\u{00ab}', '\u{00bb}',
    '\u{2591}', '\u{2592}', '\u{2593}', '\u{2502}', '\u{2524}', '\u{2561}', '\u{2562}', '\u{2556}',
    '\u{2555}', '\u{2563}', '\u{2551}', '\u{2557}', '\u{255d}', '\u{255c}', '\u{255b}', '\u{2510}',
    '\u{2514}', '\u{2534}', '\u{252c}', '\u{251c}', '\u{2500}', '\u{253c}', '\u{255e}', '\u{255f}',
    '\u{255a}', '\u{2554}', '\u{2569}', '\u{2566}', '\u{2560}', '\u{2550}', '\u{256c}', '\u{2567}',
    '\u{2568}', '\u{2564}', '\u{2565}', '\u{2559}', '\u{2558}', '\u{2552}', '\u{2553}', '\u{256b}',
    '\u{256a}', '\u{2518}', '\u{250c}', '\u{2588}', '\u{2584}', '\u{258c}', '\u{2590}', '\u{2580}',
    '\u{03b1}', '\u{00df}', '\u{0393}', '\u{03c0}', '\u{03a3}', '\u{03c3}', '\u{00b5}', '\u{03c4}',
    '\u{03a6}', '\u{0398}', '\u{03a9}', '\u{03b4}', '\u{221e}', '\u{03c6}', '\u{03b5}', '\u{2229}',
    '\u{2261}', '\u{00b1}', '\u{2265}', '\u{2264}', '\u{2320}', '\u{2321}', '\u{00f7}', '\u{2248}',
    '\u{00b0}', '\u{2219}', '\u{00b7}', '\u{221a}', '\u{207f}', '\u{00b2}', '\u{25a0}', '\u{00a0}',
];

/// The character code page 437 gives `byte`.
fn cp437_char(byte: u8) -> char {
    match byte {
        0..=0x7f => char::from(byte),
        _ => CP437_HIGH[usize::from(byte - 0x80)],
    }
}

/// A record name's bytes decoded as Python's `zipfile` decodes them: UTF-8 when the
/// record's `flags` have bit 11 set (`None` when the bytes are not UTF-8), code page
/// 437 otherwise (every byte is a character; ASCII reads the same either way).
fn decode_name(raw: &[u8], flags: u16) -> Option<std::borrow::Cow<'_, str>> {
    if flags & UTF8_NAME_FLAG != 0 || raw.is_ascii() {
        return std::str::from_utf8(raw)
            .ok()
            .map(std::borrow::Cow::Borrowed);
    }
    Some(std::borrow::Cow::Owned(
        raw.iter().copied().map(cp437_char).collect(),
    ))
}

/// True when the name bytes `raw` of a record with general-purpose `flags` decode
/// (see [`decode_name`]) to `name`, without allocating.
fn name_matches(raw: &[u8], flags: u16, name: &str) -> bool {
    if flags & UTF8_NAME_FLAG != 0 || raw.is_ascii() {
        // `name` is UTF-8, so equal bytes are valid UTF-8 that decodes to it.
        return raw == name.as_bytes();
    }
    name.chars().eq(raw.iter().copied().map(cp437_char))
}

/// Where `entry`'s data starts, from its local header at the start of `local`, and
/// the head of its data (up to `head_len` bytes of it that `local` holds).
fn parse_local_header<'a>(
    input: &Input,
    entry: &ZipEntry,
    local: &'a [u8],
    head_len: u64,
) -> Result<(u64, &'a [u8])> {
    let header_offset = entry.data_offset;
    if (local.len() as u64) < LOCAL_LEN {
        return Err(local_out_of_bounds(input, entry));
    }
    if u32_at(local, 0) != LOCAL_SIG {
        return Err(bad(
            header_offset,
            format!("bad local-header signature for `{}`", entry.name),
        ));
    }
    let flags = u16_at(local, 6);
    let name_len = usize::from(u16_at(local, 26));
    let name_at = LOCAL_LEN as usize;
    match local.get(name_at..name_at + name_len) {
        Some(name) if name_matches(name, flags, &entry.name) => {}
        Some(name) => {
            let local_name =
                decode_name(name, flags).unwrap_or_else(|| String::from_utf8_lossy(name));
            return Err(bad(
                header_offset,
                format!(
                    "record `{}` is called `{local_name}` in its local header",
                    entry.name,
                ),
            ));
        }
        None => return Err(local_out_of_bounds(input, entry)),
    }
    let var = name_len as u64 + u64::from(u16_at(local, 28));
    let data_offset = header_offset + LOCAL_LEN + var;
    let start = ((LOCAL_LEN + var) as usize).min(local.len());
    let len = entry.compressed_size.min(head_len) as usize;
    let end = start.saturating_add(len).min(local.len());
    let head = &local[start..end];
    Ok((data_offset, head))
}

/// A record's data: a slice of the input when stored, inflated into a buffer of
/// exactly its declared size (at most `max_bytes`) when deflated. `meta` reads it as
/// metadata (see [`Input::read_meta`]).
pub fn read_entry(input: &Input, entry: &ZipEntry, max_bytes: u64, meta: bool) -> Result<Bytes> {
    let raw = if meta {
        input.read_meta(entry.data_offset, entry.compressed_size)?
    } else {
        input.read(entry.data_offset, entry.compressed_size)?
    };
    match entry.method {
        Method::Stored => Ok(raw),
        Method::Deflated => inflate(&raw, entry, entry.size, max_bytes),
    }
}

/// The first `len` bytes of a record's data (`len` at most its size), inflated when
/// it is deflated: only as much of the stream as those bytes need, so a small
/// array followed by a long run of padding costs the array, not the record.
pub fn read_entry_prefix(
    input: &Input,
    entry: &ZipEntry,
    len: u64,
    max_bytes: u64,
) -> Result<Bytes> {
    if len > entry.size {
        return Err(Error::OutOfBounds {
            tensor: entry.name.to_string(),
            offset: 0,
            length: len,
            limit: entry.size,
        });
    }
    match entry.method {
        Method::Stored => input.read(entry.data_offset, len),
        Method::Deflated => {
            let raw = input.read(entry.data_offset, entry.compressed_size)?;
            inflate(&raw, entry, len, max_bytes)
        }
    }
}

/// Inflates the first `len` bytes of `entry`'s deflated stream `raw`; when `len` is
/// the record's size, the stream must end there.
fn inflate(raw: &[u8], entry: &ZipEntry, len: u64, max_bytes: u64) -> Result<Bytes> {
    Error::check_limit("decompressed zip record size", len, max_bytes)?;
    // Deflate expands at most 1032:1 (a 258-byte match per 2 bits), so a declared
    // size beyond that cannot be true: refuse it before allocating the buffer.
    let most = (raw.len() as u64)
        .saturating_mul(MAX_DEFLATE_RATIO)
        .saturating_add(258);
    if len > most {
        return Err(Error::Decode {
            tensor: entry.name.to_string(),
            encoding: "deflate".into(),
            reason: format!(
                "{len} bytes cannot come from {} compressed bytes (deflate expands at most {MAX_DEFLATE_RATIO}:1)",
                raw.len()
            ),
        });
    }
    let whole = len == entry.size;
    let len = usize::try_from(len).map_err(|_| Error::Overflow {
        what: "zip record size as usize",
    })?;
    let mut out = AlignedBuf::zeroed(len)?;
    let decode_error = |reason: String| Error::Decode {
        tensor: entry.name.to_string(),
        encoding: "deflate".into(),
        reason,
    };
    let mut state = miniz_oxide::inflate::stream::InflateState::new(miniz_oxide::DataFormat::Raw);
    let flush = if whole {
        miniz_oxide::MZFlush::Finish
    } else {
        miniz_oxide::MZFlush::None
    };
    let result = miniz_oxide::inflate::stream::inflate(&mut state, raw, out.as_mut_slice(), flush);
    let full = result.bytes_written == len;
    match result.status {
        Ok(miniz_oxide::MZStatus::StreamEnd) if full => Ok(out.into_bytes()),
        Ok(_) | Err(miniz_oxide::MZError::Buf) if full && !whole => Ok(out.into_bytes()),
        Ok(_) | Err(miniz_oxide::MZError::Buf) => Err(decode_error(format!(
            "inflated to a size other than the declared {} bytes",
            entry.size
        ))),
        Err(e) => Err(decode_error(format!("{e:?}"))),
    }
}
