//! The structures derived from the entry slots, all changed under the lock: the
//! free-slot list, the key index (open addressing with tombstones), the LRU list and
//! the free-extent table (first-fit allocation, coalescing frees). `recover` rebuilds
//! each of them from the slots alone.

use tensorwire_core::{Error, Result};

use crate::cache::{hash_key, Shared, EMPTY, FREE, FREE_SLOT_HEAD, NONE, READY, TOMBSTONE};
use crate::layout::{e, h, MAX_KEY_BYTES};

impl Shared {
    // ----- slots -----

    pub(crate) fn valid_slot(&self, v: u32) -> Option<u32> {
        ((v as usize) < self.layout.max_entries).then_some(v)
    }

    pub(crate) fn key_of(&self, slot: u32) -> Vec<u8> {
        let sl = self.layout.slot(slot);
        let len = (self.region.get8(sl + e::KEY_LEN) as usize).min(MAX_KEY_BYTES);
        let mut key = vec![0u8; len];
        self.region.read_bytes(sl + e::KEY, &mut key);
        key
    }

    /// Absolute offset and length of a slot's value, checked against the data region.
    pub(crate) fn value_range(&self, slot: u32) -> Result<(usize, usize)> {
        let sl = self.layout.slot(slot);
        let r = &self.region;
        let off = r.get64(sl + e::DATA_OFFSET);
        let alloc = r.get64(sl + e::ALLOC_SIZE);
        let len = r.get64(sl + e::VALUE_LEN);
        if len > alloc
            || off
                .checked_add(alloc)
                .is_none_or(|end| end > self.layout.data_size as u64)
        {
            return Err(Error::malformed(
                sl as u64,
                format!("cache entry {slot} points outside the data region"),
            ));
        }
        Ok((self.layout.data_offset + off as usize, len as usize))
    }

    pub(crate) fn expired(&self, slot: u32, now: u64) -> bool {
        let at = self.region.get64(self.layout.slot(slot) + e::EXPIRES_NS);
        at != 0 && now >= at
    }

    /// Takes the first free slot off the free-slot list (rebuilding the list from the
    /// slot states if it is torn).
    pub(crate) fn pop_free_slot(&self) -> Option<u32> {
        let r = &self.region;
        let mut slot = self.valid_slot(r.get32(FREE_SLOT_HEAD))?;
        if r.get8(self.layout.slot(slot) + e::STATE) != FREE {
            self.rebuild_free_slots();
            slot = self.valid_slot(r.get32(FREE_SLOT_HEAD))?;
        }
        r.set32(
            FREE_SLOT_HEAD,
            r.get32(self.layout.slot(slot) + e::LRU_NEXT),
        );
        Some(slot)
    }

    /// Frees a slot and its block.
    pub(crate) fn free_slot(&self, slot: u32) {
        let r = &self.region;
        let sl = self.layout.slot(slot);
        let off = r.get64(sl + e::DATA_OFFSET);
        let alloc = r.get64(sl + e::ALLOC_SIZE);
        r.set8(sl + e::STATE, FREE);
        if alloc > 0 {
            self.free_block(off, alloc);
        }
        r.zero(sl, e::KEY);
        r.set32(sl + e::LRU_NEXT, r.get32(FREE_SLOT_HEAD));
        r.set32(FREE_SLOT_HEAD, slot);
    }

    pub(crate) fn rebuild_free_slots(&self) {
        let r = &self.region;
        let mut head = NONE;
        for slot in (0..self.layout.max_entries as u32).rev() {
            let sl = self.layout.slot(slot);
            if r.get8(sl + e::STATE) == FREE {
                r.set32(sl + e::LRU_NEXT, head);
                head = slot;
            }
        }
        r.set32(FREE_SLOT_HEAD, head);
    }

    // ----- key index -----

    pub(crate) fn bucket_off(&self, b: usize) -> usize {
        self.layout.index_offset + (b & (self.layout.index_capacity - 1)) * 4
    }

    pub(crate) fn slot_has_key(&self, slot: u32, key: &[u8], hash: u64) -> bool {
        let sl = self.layout.slot(slot);
        let r = &self.region;
        r.get8(sl + e::STATE) == READY
            && r.get64(sl + e::KEY_HASH) == hash
            && r.get8(sl + e::KEY_LEN) as usize == key.len()
            && key
                .iter()
                .enumerate()
                .all(|(i, &b)| r.get8(sl + e::KEY + i) == b)
    }

    /// `(bucket, slot)` of the live entry for `key`.
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<(usize, u32)> {
        let hash = hash_key(key);
        let cap = self.layout.index_capacity;
        for i in 0..cap {
            let b = (hash as usize).wrapping_add(i) & (cap - 1);
            match self.region.get32(self.bucket_off(b)) {
                EMPTY => return None,
                TOMBSTONE => continue,
                v => {
                    if let Some(slot) = self.valid_slot(v) {
                        if self.slot_has_key(slot, key, hash) {
                            return Some((b, slot));
                        }
                    }
                }
            }
        }
        None
    }

    pub(crate) fn index_insert(&self, slot: u32) {
        let hash = self.region.get64(self.layout.slot(slot) + e::KEY_HASH);
        let cap = self.layout.index_capacity;
        for i in 0..cap {
            let b = (hash as usize).wrapping_add(i) & (cap - 1);
            match self.region.get32(self.bucket_off(b)) {
                EMPTY => {
                    self.region.set32(self.bucket_off(b), slot);
                    return;
                }
                TOMBSTONE => {
                    self.region.set32(self.bucket_off(b), slot);
                    let t = self.region.get32(h::TOMBSTONES);
                    self.region.set32(h::TOMBSTONES, t.saturating_sub(1));
                    return;
                }
                _ => {}
            }
        }
        // Full of live buckets cannot happen (capacity ≥ 2 × slots); rebuild anyway.
        self.rebuild_index();
    }

    pub(crate) fn index_remove(&self, bucket: usize) {
        let r = &self.region;
        r.set32(self.bucket_off(bucket), TOMBSTONE);
        let t = r.get32(h::TOMBSTONES).saturating_add(1);
        r.set32(h::TOMBSTONES, t);
        if t as usize > self.layout.index_capacity / 4 {
            self.rebuild_index();
        }
    }

    /// The index from the READY slots (also clears tombstones).
    pub(crate) fn rebuild_index(&self) {
        let r = &self.region;
        let l = &self.layout;
        for b in 0..l.index_capacity {
            r.set32(l.index_offset + b * 4, EMPTY);
        }
        r.set32(h::TOMBSTONES, 0);
        for slot in 0..l.max_entries as u32 {
            if r.get8(l.slot(slot) + e::STATE) == READY {
                self.index_insert(slot);
            }
        }
    }

    // ----- LRU list (head = most recent) -----

    pub(crate) fn lru_push_head(&self, slot: u32) {
        let r = &self.region;
        let sl = self.layout.slot(slot);
        let head = r.get32(h::LRU_HEAD);
        r.set32(sl + e::LRU_PREV, NONE);
        r.set32(sl + e::LRU_NEXT, head);
        match self.valid_slot(head) {
            Some(hd) => r.set32(self.layout.slot(hd) + e::LRU_PREV, slot),
            None => r.set32(h::LRU_TAIL, slot),
        }
        r.set32(h::LRU_HEAD, slot);
    }

    pub(crate) fn lru_unlink(&self, slot: u32) {
        let r = &self.region;
        let sl = self.layout.slot(slot);
        let prev = r.get32(sl + e::LRU_PREV);
        let next = r.get32(sl + e::LRU_NEXT);
        match self.valid_slot(prev) {
            Some(p) => r.set32(self.layout.slot(p) + e::LRU_NEXT, next),
            None => r.set32(h::LRU_HEAD, next),
        }
        match self.valid_slot(next) {
            Some(n) => r.set32(self.layout.slot(n) + e::LRU_PREV, prev),
            None => r.set32(h::LRU_TAIL, prev),
        }
        r.set32(sl + e::LRU_PREV, NONE);
        r.set32(sl + e::LRU_NEXT, NONE);
    }

    pub(crate) fn touch(&self, slot: u32) {
        let tick = self.region.get64(h::ACCESS_TICK).wrapping_add(1);
        self.region.set64(h::ACCESS_TICK, tick);
        self.region
            .set64(self.layout.slot(slot) + e::LAST_ACCESS, tick);
        if self.region.get32(h::LRU_HEAD) != slot {
            self.lru_unlink(slot);
            self.lru_push_head(slot);
        }
    }

    // ----- free-extent table (offsets relative to the data region) -----

    pub(crate) fn extent(&self, i: usize) -> (u64, u64) {
        let off = self.layout.free_offset + i * 16;
        (self.region.get64(off), self.region.get64(off + 8))
    }

    pub(crate) fn set_extent(&self, i: usize, (o, n): (u64, u64)) {
        let off = self.layout.free_offset + i * 16;
        self.region.set64(off, o);
        self.region.set64(off + 8, n);
    }

    pub(crate) fn free_count(&self) -> usize {
        (self.region.get32(h::FREE_COUNT) as usize).min(self.layout.free_table_len())
    }

    /// First fit. Returns the block's offset in the data region. Lock held.
    ///
    /// A free table with an extent outside the data region (a corrupted segment) is
    /// rebuilt from the slots first: a block handed out from it would have its value
    /// written wherever the extent says, the header and the lock included.
    pub(crate) fn alloc_block(&self, size: u64) -> Option<u64> {
        if !self.free_table_in_range() {
            self.recover();
        }
        let count = self.free_count();
        let i = (0..count).find(|&i| self.extent(i).1 >= size)?;
        let (o, n) = self.extent(i);
        if n == size {
            for j in i..count - 1 {
                self.set_extent(j, self.extent(j + 1));
            }
            self.region.set32(h::FREE_COUNT, (count - 1) as u32);
        } else {
            self.set_extent(i, (o.wrapping_add(size), n - size));
        }
        self.region.add64(h::USED_BYTES, size);
        Some(o)
    }

    /// True when every free extent lies inside the data region.
    fn free_table_in_range(&self) -> bool {
        let end = self.layout.data_size as u64;
        // A count past the table (which `free_count` clamps) is damage too.
        let count_fits = self.region.get32(h::FREE_COUNT) as usize <= self.layout.free_table_len();
        count_fits
            && (0..self.free_count()).all(|i| {
                let (o, n) = self.extent(i);
                o.checked_add(n).is_some_and(|stop| stop <= end)
            })
    }

    /// Returns a block to the table, merging it with free neighbours.
    pub(crate) fn free_block(&self, off: u64, size: u64) {
        let count = self.free_count();
        let at = (0..count)
            .find(|&i| self.extent(i).0 > off)
            .unwrap_or(count);
        let merge_prev = at > 0 && {
            let (po, pn) = self.extent(at - 1);
            po.wrapping_add(pn) == off
        };
        let merge_next = at < count && off.wrapping_add(size) == self.extent(at).0;
        match (merge_prev, merge_next) {
            (true, true) => {
                let (po, pn) = self.extent(at - 1);
                let (_, nn) = self.extent(at);
                self.set_extent(at - 1, (po, pn.wrapping_add(size).wrapping_add(nn)));
                for j in at..count - 1 {
                    self.set_extent(j, self.extent(j + 1));
                }
                self.region.set32(h::FREE_COUNT, (count - 1) as u32);
            }
            (true, false) => {
                let (po, pn) = self.extent(at - 1);
                self.set_extent(at - 1, (po, pn.wrapping_add(size)));
            }
            (false, true) => {
                let (_, nn) = self.extent(at);
                self.set_extent(at, (off, size.wrapping_add(nn)));
            }
            (false, false) => {
                if count >= self.layout.free_table_len() {
                    // Cannot happen (one extent per gap between ≤ max_entries blocks);
                    // leave the bytes unused rather than corrupt the table.
                    return;
                }
                for j in (at..count).rev() {
                    self.set_extent(j + 1, self.extent(j));
                }
                self.set_extent(at, (off, size));
                self.region.set32(h::FREE_COUNT, (count + 1) as u32);
            }
        }
        let used = self.region.get64(h::USED_BYTES);
        self.region.set64(h::USED_BYTES, used.saturating_sub(size));
    }

    /// The free table as the complement of `blocks` (offset, size) in the data region.
    pub(crate) fn rebuild_free_table(&self, blocks: &mut [(u64, u64)]) {
        blocks.sort_unstable();
        let mut at = 0u64;
        let mut count = 0usize;
        let mut used = 0u64;
        for &(o, n) in blocks.iter() {
            if o > at {
                self.set_extent(count, (at, o - at));
                count += 1;
            }
            at = at.max(o.saturating_add(n));
            used = used.saturating_add(n);
        }
        let end = self.layout.data_size as u64;
        if end > at {
            self.set_extent(count, (at, end - at));
            count += 1;
        }
        self.region.set32(h::FREE_COUNT, count as u32);
        self.region.set64(h::USED_BYTES, used);
    }
}
