//! Where everything lives in a cache segment, and the checks an attaching process
//! runs on the header before trusting any offset in it.
//!
//! ```text
//! 0        header (4096 bytes): magic, version, geometry, counters, LRU ends, mutex
//! 4096     process registry: max_processes × 32 bytes (pid, start time, the deadline
//!          of a slot claimed for a child about to be forked, 8 reserved)
//! …        key index: index_capacity × u32 (open addressing, linear probing)
//! …        free-extent table: (max_entries + 2) × 16 bytes (offset, length), sorted
//! …        entry table: max_entries × 256-byte slots
//! …        data region (page-aligned start): 64-byte-aligned value blocks
//! ```

use tensorwire_core::{Error, Result};
use tensorwire_shm::MUTEX_SIZE;

/// First 8 bytes of every cache segment.
pub const MAGIC: &[u8; 8] = b"TWCACHE\0";
/// Layout version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of the pool header.
pub const HEADER_SIZE: usize = 4096;
/// Bytes of one entry slot.
pub const SLOT_SIZE: usize = 256;
/// Bytes of one process-registry slot.
pub const PROCESS_SLOT_SIZE: usize = 32;
/// Where a process-registry slot claimed for a child about to be forked holds the
/// time (`CLOCK_MONOTONIC` ns) until which the child may take it over; 0 in any other
/// slot. Past it, the slot counts as a dead process's.
pub const CHILD_CLAIM_DEADLINE: usize = 16;
/// Alignment (and size granule) of value blocks in the data region.
pub const BLOCK_ALIGN: usize = 64;
/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 128;
/// Most processes (cache handles) attached at once: one bit each in an entry's pin
/// bitmap.
pub const MAX_PROCESSES: usize = 256;
/// Most entry slots in one cache.
pub const MAX_ENTRIES: usize = 1 << 20;
/// Fewest entry slots in one cache.
pub const MIN_ENTRIES: usize = 4;

/// Header field offsets.
pub(crate) mod h {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HEADER_SIZE: usize = 12;
    pub const SEGMENT_SIZE: usize = 16;
    pub const MAX_ENTRIES: usize = 24;
    pub const MAX_PROCESSES: usize = 28;
    pub const INDEX_CAPACITY: usize = 32;
    pub const REGISTRY_OFFSET: usize = 40;
    pub const INDEX_OFFSET: usize = 48;
    pub const FREE_OFFSET: usize = 56;
    pub const ENTRIES_OFFSET: usize = 64;
    pub const DATA_OFFSET: usize = 72;
    pub const DATA_SIZE: usize = 80;
    // Mutable state, changed only under the lock.
    pub const ENTRY_COUNT: usize = 128;
    pub const FREE_COUNT: usize = 132;
    pub const USED_BYTES: usize = 136;
    pub const LRU_HEAD: usize = 144;
    pub const LRU_TAIL: usize = 148;
    pub const PUT_SEQ: usize = 152;
    pub const ACCESS_TICK: usize = 160;
    pub const HITS: usize = 168;
    pub const MISSES: usize = 176;
    pub const EVICTIONS: usize = 184;
    pub const EXPIRATIONS: usize = 192;
    pub const RECOVERIES: usize = 200;
    pub const NEEDS_RECOVERY: usize = 208;
    pub const TOMBSTONES: usize = 212;
    pub const MUTEX: usize = 256;
}

/// Entry slot field offsets (within a slot).
pub(crate) mod e {
    pub const STATE: usize = 0;
    pub const KEY_LEN: usize = 1;
    pub const WRITER: usize = 4;
    pub const KEY_HASH: usize = 8;
    pub const DATA_OFFSET: usize = 16;
    pub const ALLOC_SIZE: usize = 24;
    pub const VALUE_LEN: usize = 32;
    pub const SEQ: usize = 40;
    pub const CREATED_NS: usize = 48;
    pub const EXPIRES_NS: usize = 56;
    pub const LAST_ACCESS: usize = 64;
    pub const LRU_PREV: usize = 72;
    pub const LRU_NEXT: usize = 76;
    pub const PIN_COUNT: usize = 80;
    pub const PINS: usize = 96;
    pub const KEY: usize = 128;
}

/// The geometry of one cache segment. Every offset is computed from the four numbers
/// the creator chose, so an attaching process recomputes them and refuses a header
/// that disagrees (a different writer, or corruption) instead of following its
/// offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of the whole segment.
    pub segment_size: usize,
    /// Entry slots.
    pub max_entries: usize,
    /// Process-registry slots.
    pub max_processes: usize,
    /// Buckets of the key index (a power of two ≥ 2 × max_entries).
    pub index_capacity: usize,
    /// Offset of the process registry.
    pub registry_offset: usize,
    /// Offset of the key index.
    pub index_offset: usize,
    /// Offset of the free-extent table.
    pub free_offset: usize,
    /// Offset of the entry table.
    pub entries_offset: usize,
    /// Offset of the data region.
    pub data_offset: usize,
    /// Bytes of the data region (a multiple of [`BLOCK_ALIGN`]).
    pub data_size: usize,
}

fn align_up(v: usize, a: usize) -> Option<usize> {
    v.checked_add(a - 1).map(|x| x / a * a)
}

impl Layout {
    /// Rows of the free-extent table: one per gap between at most `max_entries`
    /// blocks, and the ends.
    pub fn free_table_len(&self) -> usize {
        self.max_entries + 2
    }

    /// The default number of entry slots for a segment of `segment_size` bytes: one
    /// per 16 KiB, between 16 and 65,536.
    pub fn default_entries(segment_size: usize) -> usize {
        (segment_size / (16 << 10)).clamp(16, 1 << 16)
    }

    /// Computes the layout, or explains why these numbers cannot make a cache.
    pub fn compute(
        segment_size: usize,
        max_entries: usize,
        max_processes: usize,
    ) -> Result<Layout> {
        if !(MIN_ENTRIES..=MAX_ENTRIES).contains(&max_entries) {
            return Err(Error::invalid(format!(
                "max_entries is {max_entries}, must be {MIN_ENTRIES}..={MAX_ENTRIES}"
            )));
        }
        if !(1..=MAX_PROCESSES).contains(&max_processes) {
            return Err(Error::invalid(format!(
                "max_processes is {max_processes}, must be 1..={MAX_PROCESSES}"
            )));
        }
        let overflow = || Error::Overflow {
            what: "cache layout",
        };
        let index_capacity = (max_entries * 2).next_power_of_two();
        let registry_offset = HEADER_SIZE;
        let index_offset = registry_offset + max_processes * PROCESS_SLOT_SIZE;
        let free_offset = align_up(index_offset + index_capacity * 4, 8).ok_or_else(overflow)?;
        let entries_offset =
            align_up(free_offset + (max_entries + 2) * 16, BLOCK_ALIGN).ok_or_else(overflow)?;
        let data_offset =
            align_up(entries_offset + max_entries * SLOT_SIZE, 4096).ok_or_else(overflow)?;
        let data_size = segment_size.saturating_sub(data_offset) / BLOCK_ALIGN * BLOCK_ALIGN;
        if data_size < BLOCK_ALIGN {
            return Err(Error::invalid(format!(
                "a cache of {segment_size} bytes has no room for data after its {data_offset}-byte header and tables ({max_entries} entries); give it more memory or fewer entries"
            )));
        }
        Ok(Layout {
            segment_size,
            max_entries,
            max_processes,
            index_capacity,
            registry_offset,
            index_offset,
            free_offset,
            entries_offset,
            data_offset,
            data_size,
        })
    }

    /// Reads and checks the geometry in a header (the first [`HEADER_SIZE`] bytes of a
    /// segment of `segment_len` bytes): magic, version, and every offset equal to what
    /// the sizes imply. Any disagreement is an error naming the field.
    pub fn from_header(header: &[u8], segment_len: usize) -> Result<Layout> {
        if header.len() < HEADER_SIZE || segment_len < HEADER_SIZE {
            return Err(Error::Truncated {
                offset: 0,
                needed: HEADER_SIZE as u64,
                available: header.len().min(segment_len) as u64,
            });
        }
        if &header[..8] != MAGIC {
            return Err(Error::BadMagic {
                offset: 0,
                expected: "a tensorwire cache (TWCACHE)",
                found: header[..8].to_vec(),
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(h::VERSION);
        if version != VERSION {
            return Err(Error::unsupported(format!(
                "tensorwire cache layout version {version} (this build reads {VERSION})"
            )));
        }
        let corrupt = |field: &str, found: u64, expected: u64| {
            Error::malformed(
                0,
                format!("corrupted cache header: {field} is {found}, expected {expected}"),
            )
        };
        if u32_at(h::HEADER_SIZE) as usize != HEADER_SIZE {
            return Err(corrupt(
                "header size",
                u32_at(h::HEADER_SIZE).into(),
                HEADER_SIZE as u64,
            ));
        }
        let segment_size = u64_at(h::SEGMENT_SIZE);
        if segment_size != segment_len as u64 {
            return Err(corrupt("segment size", segment_size, segment_len as u64));
        }
        let layout = Layout::compute(
            segment_len,
            u32_at(h::MAX_ENTRIES) as usize,
            u32_at(h::MAX_PROCESSES) as usize,
        )
        .map_err(|e| Error::malformed(0, format!("corrupted cache header: {e}")))?;
        let checks: [(&str, u64, usize); 7] = [
            (
                "index capacity",
                u32_at(h::INDEX_CAPACITY).into(),
                layout.index_capacity,
            ),
            (
                "registry offset",
                u64_at(h::REGISTRY_OFFSET),
                layout.registry_offset,
            ),
            ("index offset", u64_at(h::INDEX_OFFSET), layout.index_offset),
            (
                "free-table offset",
                u64_at(h::FREE_OFFSET),
                layout.free_offset,
            ),
            (
                "entry-table offset",
                u64_at(h::ENTRIES_OFFSET),
                layout.entries_offset,
            ),
            ("data offset", u64_at(h::DATA_OFFSET), layout.data_offset),
            ("data size", u64_at(h::DATA_SIZE), layout.data_size),
        ];
        for (field, found, expected) in checks {
            if found != expected as u64 {
                return Err(corrupt(field, found, expected as u64));
            }
        }
        Ok(layout)
    }

    /// The geometry fields of the header, as [`Layout::from_header`] reads them (the
    /// magic excluded: it is written last, once the segment is ready).
    pub(crate) fn header_fields(&self) -> Vec<(usize, u64, usize)> {
        vec![
            (h::VERSION, VERSION.into(), 4),
            (h::HEADER_SIZE, HEADER_SIZE as u64, 4),
            (h::SEGMENT_SIZE, self.segment_size as u64, 8),
            (h::MAX_ENTRIES, self.max_entries as u64, 4),
            (h::MAX_PROCESSES, self.max_processes as u64, 4),
            (h::INDEX_CAPACITY, self.index_capacity as u64, 4),
            (h::REGISTRY_OFFSET, self.registry_offset as u64, 8),
            (h::INDEX_OFFSET, self.index_offset as u64, 8),
            (h::FREE_OFFSET, self.free_offset as u64, 8),
            (h::ENTRIES_OFFSET, self.entries_offset as u64, 8),
            (h::DATA_OFFSET, self.data_offset as u64, 8),
            (h::DATA_SIZE, self.data_size as u64, 8),
        ]
    }

    /// Offset of entry slot `i`.
    pub(crate) fn slot(&self, i: u32) -> usize {
        self.entries_offset + i as usize * SLOT_SIZE
    }

    /// Offset of process slot `i`.
    pub(crate) fn process(&self, i: usize) -> usize {
        self.registry_offset + i * PROCESS_SLOT_SIZE
    }
}

const _: () = assert!(h::MUTEX + MUTEX_SIZE <= HEADER_SIZE && h::MUTEX % 8 == 0);
const _: () = assert!(e::KEY + MAX_KEY_BYTES == SLOT_SIZE && e::PINS + MAX_PROCESSES / 8 <= e::KEY);

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(layout: &Layout) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_SIZE];
        bytes[..8].copy_from_slice(MAGIC);
        for (off, value, width) in layout.header_fields() {
            bytes[off..off + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
        bytes
    }

    #[test]
    fn layout_is_ordered_aligned_and_fits() {
        let l = Layout::compute(64 << 20, Layout::default_entries(64 << 20), 256).unwrap();
        assert_eq!(l.max_entries, 4096);
        assert!(l.registry_offset < l.index_offset && l.index_offset < l.free_offset);
        assert!(l.free_offset < l.entries_offset && l.entries_offset < l.data_offset);
        assert_eq!(l.data_offset % 4096, 0);
        assert_eq!(l.data_size % BLOCK_ALIGN, 0);
        assert!(l.data_offset + l.data_size <= l.segment_size);
        assert_eq!(
            Layout::from_header(&header_of(&l), l.segment_size).unwrap(),
            l
        );
    }

    #[test]
    fn headers_round_trip_and_corruption_is_named() {
        let l = Layout::compute(1 << 20, 16, 8).unwrap();
        let good = header_of(&l);
        assert_eq!(Layout::from_header(&good, l.segment_size).unwrap(), l);

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            Layout::from_header(&bad, l.segment_size),
            Err(Error::BadMagic { .. })
        ));
        let mut bad = good.clone();
        bad[h::VERSION] = 9;
        assert!(matches!(
            Layout::from_header(&bad, l.segment_size),
            Err(Error::Unsupported { .. })
        ));
        let mut bad = good.clone();
        bad[h::DATA_OFFSET] ^= 0x40;
        let err = Layout::from_header(&bad, l.segment_size).unwrap_err();
        assert!(err.to_string().contains("data offset"), "{err}");
        let err = Layout::from_header(&good, l.segment_size + 4096).unwrap_err();
        assert!(err.to_string().contains("segment size"), "{err}");
        let mut bad = good.clone();
        bad[h::MAX_ENTRIES..h::MAX_ENTRIES + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Layout::from_header(&bad, l.segment_size).is_err());
        assert!(Layout::from_header(&good[..100], l.segment_size).is_err());
    }

    #[test]
    fn too_small_or_silly_geometry_is_refused() {
        assert!(Layout::compute(8192, 16, 8).is_err());
        assert!(Layout::compute(1 << 20, 0, 8).is_err());
        assert!(Layout::compute(1 << 20, 16, 0).is_err());
        assert!(Layout::compute(1 << 20, 16, 257).is_err());
    }
}
