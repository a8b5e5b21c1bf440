//! Repair after a process died holding the lock (or mid-`put`), and the consistency
//! check tests use.
//!
//! The entry slots are the truth. A slot becomes visible (READY) in one store, after
//! every other field of it is written, and leaves visibility in one store too; the
//! index, LRU list, free-slot list, free-extent table and counters are all derived
//! from the slots. So whatever a dead process was doing, repair can:
//!
//! 1. drop registry entries of dead processes, and their pins;
//! 2. free WRITING slots whose writer is dead (a `put` that never published: its value
//!    was never visible, so nothing torn is ever seen), RETIRED slots nobody pins, and
//!    slots whose fields are out of range;
//! 3. when two READY slots hold one key (a `put` died between publishing the new
//!    value and retiring the old), keep the newer;
//! 4. rebuild the derived structures from what is left.
//!
//! Every healthy entry survives: nothing is wiped.

use std::collections::HashMap;

use tensorwire_core::{Error, Result};
use tensorwire_shm::ProcessId;

use crate::cache::{Shared, FREE, NONE, READY, RETIRED, WRITING};
use crate::layout::{e, h, BLOCK_ALIGN, MAX_KEY_BYTES};

impl Shared {
    /// Rebuilds everything derived from the entry slots. Lock held.
    pub(crate) fn recover(&self) {
        let r = &self.region;
        let l = &self.layout;

        // 1. Dead processes (and slots claimed for a forked child that never took
        // them over).
        let now = crate::cache::now_ns();
        let mut dead = vec![false; l.max_processes];
        for (p, is_dead) in dead.iter_mut().enumerate() {
            match ProcessId::from_words(self.registered_words(p)) {
                Some(_) if !self.registered_dead(p, now) => {}
                Some(_) => {
                    *is_dead = true;
                    self.write_registered(p, [0, 0]);
                }
                None => *is_dead = true,
            }
        }

        // 2. Slots.
        let mut blocks: Vec<(u64, u64, u32)> = Vec::new();
        for slot in 0..l.max_entries as u32 {
            let sl = l.slot(slot);
            let state = r.get8(sl + e::STATE);
            if state == FREE {
                continue;
            }
            // Pins of dead processes go.
            let mut pins = 0;
            for word in 0..(l.max_processes.div_ceil(64)) {
                let mut bits = r.get64(sl + e::PINS + word * 8);
                for bit in 0..64 {
                    let p = word * 64 + bit;
                    if bits & (1 << bit) != 0 && (p >= l.max_processes || dead[p]) {
                        bits &= !(1 << bit);
                    }
                }
                r.set64(sl + e::PINS + word * 8, bits);
                pins += bits.count_ones();
            }
            r.set32(sl + e::PIN_COUNT, pins);

            let off = r.get64(sl + e::DATA_OFFSET);
            let alloc = r.get64(sl + e::ALLOC_SIZE);
            let len = r.get64(sl + e::VALUE_LEN);
            let sane = r.get8(sl + e::KEY_LEN) as usize <= MAX_KEY_BYTES
                && alloc > 0
                && off % BLOCK_ALIGN as u64 == 0
                && alloc % BLOCK_ALIGN as u64 == 0
                && len <= alloc
                && off
                    .checked_add(alloc)
                    .is_some_and(|end| end <= l.data_size as u64);
            let keep = sane
                && match state {
                    READY => true,
                    RETIRED => pins > 0,
                    WRITING => {
                        let w = r.get32(sl + e::WRITER) as usize;
                        w < l.max_processes && !dead[w]
                    }
                    _ => false,
                };
            if keep {
                blocks.push((off, alloc, slot));
            } else {
                r.zero(sl, e::KEY);
                r.set8(sl + e::STATE, FREE);
            }
        }

        // Overlapping blocks can only come from corruption: keep the first of each.
        blocks.sort_unstable();
        let mut end = 0u64;
        blocks.retain(|&(off, alloc, slot)| {
            if off < end {
                let sl = l.slot(slot);
                r.zero(sl, e::KEY);
                r.set8(sl + e::STATE, FREE);
                false
            } else {
                end = off + alloc;
                true
            }
        });

        // 3. One READY slot per key: the newest.
        let mut newest: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut dropped = Vec::new();
        for &(_, _, slot) in &blocks {
            if r.get8(l.slot(slot) + e::STATE) != READY {
                continue;
            }
            let key = self.key_of(slot);
            r.set64(l.slot(slot) + e::KEY_HASH, crate::cache::hash_key(&key));
            match newest.get(&key) {
                Some(&other)
                    if r.get64(l.slot(other) + e::SEQ) >= r.get64(l.slot(slot) + e::SEQ) =>
                {
                    dropped.push(slot)
                }
                Some(&other) => {
                    dropped.push(other);
                    newest.insert(key, slot);
                }
                None => {
                    newest.insert(key, slot);
                }
            }
        }
        for slot in dropped {
            let sl = l.slot(slot);
            if r.get32(sl + e::PIN_COUNT) > 0 {
                r.set8(sl + e::STATE, RETIRED);
            } else {
                r.zero(sl, e::KEY);
                r.set8(sl + e::STATE, FREE);
                blocks.retain(|&(_, _, s)| s != slot);
            }
        }

        // 4. Derived structures.
        self.rebuild_derived();
    }

    /// Rebuilds everything derived from the slots as they are: the free-extent table
    /// (the complement of the blocks of non-free slots), the free-slot list, the index,
    /// the LRU list (by last-access tick) and the entry count. Lock held; the slots
    /// must already be sane (as `recover` leaves them, or all free).
    pub(crate) fn rebuild_derived(&self) {
        let r = &self.region;
        let l = &self.layout;
        let mut extents = Vec::new();
        let mut ready: Vec<(u64, u32)> = Vec::new();
        for slot in 0..l.max_entries as u32 {
            let sl = l.slot(slot);
            match r.get8(sl + e::STATE) {
                FREE => continue,
                READY => ready.push((r.get64(sl + e::LAST_ACCESS), slot)),
                _ => {}
            }
            extents.push((r.get64(sl + e::DATA_OFFSET), r.get64(sl + e::ALLOC_SIZE)));
        }
        self.rebuild_free_table(&mut extents);
        self.rebuild_free_slots();
        self.rebuild_index();
        ready.sort_unstable();
        r.set32(h::LRU_HEAD, NONE);
        r.set32(h::LRU_TAIL, NONE);
        for &(_, slot) in &ready {
            self.lru_push_head(slot);
        }
        r.set32(h::ENTRY_COUNT, ready.len() as u32);
    }

    /// Verifies the derived structures against the slots. Lock held.
    pub(crate) fn check_consistency(&self) -> Result<()> {
        let r = &self.region;
        let l = &self.layout;
        let bad = |what: String| Err(Error::malformed(0, format!("cache inconsistent: {what}")));
        let mut blocks = Vec::new();
        let mut ready = 0u32;
        for slot in 0..l.max_entries as u32 {
            let sl = l.slot(slot);
            let state = r.get8(sl + e::STATE);
            if state == FREE {
                continue;
            }
            if state == READY {
                ready += 1;
                let key = self.key_of(slot);
                match self.lookup(&key) {
                    Some((_, s)) if s == slot => {}
                    other => {
                        return bad(format!(
                            "slot {slot} is READY but the index gives {other:?}"
                        ))
                    }
                }
            }
            let mut pins = 0;
            for word in 0..(l.max_processes.div_ceil(64)) {
                pins += r.get64(sl + e::PINS + word * 8).count_ones();
            }
            if pins != r.get32(sl + e::PIN_COUNT) {
                return bad(format!(
                    "slot {slot} pin count {} but {pins} bits",
                    r.get32(sl + e::PIN_COUNT)
                ));
            }
            if state == RETIRED && pins == 0 {
                return bad(format!("slot {slot} is RETIRED with no pins"));
            }
            blocks.push((r.get64(sl + e::DATA_OFFSET), r.get64(sl + e::ALLOC_SIZE)));
        }
        if ready != r.get32(h::ENTRY_COUNT) {
            return bad(format!(
                "{ready} READY slots, header says {}",
                r.get32(h::ENTRY_COUNT)
            ));
        }
        // The LRU list holds exactly the READY slots, linked both ways.
        let mut seen = 0u32;
        let mut prev = NONE;
        let mut at = r.get32(h::LRU_HEAD);
        while let Some(slot) = self.valid_slot(at) {
            let sl = l.slot(slot);
            if r.get8(sl + e::STATE) != READY || r.get32(sl + e::LRU_PREV) != prev {
                return bad(format!("LRU list broken at slot {slot}"));
            }
            seen += 1;
            if seen > ready {
                return bad("LRU list longer than the READY set".into());
            }
            prev = slot;
            at = r.get32(sl + e::LRU_NEXT);
        }
        if seen != ready || r.get32(h::LRU_TAIL) != prev {
            return bad(format!("LRU list has {seen} of {ready} entries"));
        }
        // Blocks and free extents tile the data region exactly.
        let mut all: Vec<(u64, u64)> = blocks;
        let free_count = r.get32(h::FREE_COUNT) as usize;
        if free_count > l.free_table_len() {
            return bad(format!(
                "free extent count {free_count} is past the table's {}",
                l.free_table_len()
            ));
        }
        for i in 0..free_count {
            let off = l.free_offset + i * 16;
            all.push((r.get64(off), r.get64(off + 8)));
        }
        all.sort_unstable();
        let mut end = 0;
        for (off, len) in all {
            if off != end {
                return bad(format!(
                    "data region gap or overlap at {off} (expected {end})"
                ));
            }
            end = off.wrapping_add(len);
        }
        if end != l.data_size as u64 {
            return bad(format!(
                "blocks and free space end at {end}, region is {}",
                l.data_size
            ));
        }
        Ok(())
    }
}
