//! The cache: operations over one segment, each under the robust lock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tensorwire_core::{Bytes, Error, Owner, Result};
use tensorwire_packet::{packet_info, PacketInfo, PacketLimits};
use tensorwire_shm::{Access, CreateOptions, LockGuard, ProcessId, RobustMutex, Segment};

use crate::layout::{
    e, h, Layout, BLOCK_ALIGN, CHILD_CLAIM_DEADLINE, HEADER_SIZE, MAGIC, MAX_KEY_BYTES,
    MAX_PROCESSES,
};
use crate::region::Region;

/// Slot states.
pub(crate) const FREE: u8 = 0;
/// Reserved by a writer that is filling the block (invisible to readers).
pub(crate) const WRITING: u8 = 1;
/// Published: in the index and the LRU list.
pub(crate) const READY: u8 = 2;
/// Removed (deleted, evicted, overwritten, expired) while readers still pin it; freed
/// when the last pin goes.
pub(crate) const RETIRED: u8 = 3;

/// "No slot" in LRU links and the free-slot list.
pub(crate) const NONE: u32 = u32::MAX;
/// Index bucket states other than a slot number.
pub(crate) const EMPTY: u32 = u32::MAX;
pub(crate) const TOMBSTONE: u32 = u32::MAX - 1;
/// Header field (after the documented ones): head of the free-slot list.
pub(crate) const FREE_SLOT_HEAD: usize = 216;

/// Where a `put` can be told to stop for ever (crash tests: the process is killed
/// there). Not for production use.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutStage {
    /// Lock held, block and slot reserved.
    Reserved,
    /// Lock released, value half written.
    Filling,
    /// Lock held, new entry published, old entry not yet retired.
    Publishing,
    /// Lock held, an in-place update half written.
    InPlace,
}

/// How a cache is created or attached.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Entry slots (default: [`Layout::default_entries`] of the size).
    pub max_entries: Option<usize>,
    /// Processes (handles) that can attach at once, at most 256 (default 256).
    pub max_processes: usize,
    /// Longest wait for the lock before an operation fails with a timeout (default
    /// 10 s).
    pub lock_timeout: Duration,
    /// Permission bits of a new segment (default `0o600`).
    pub mode: u32,
    /// Called about every [`WAIT_SLICE`] while an operation waits for the pool lock
    /// held by someone else; `true` ends the wait with an [`std::io::ErrorKind::Interrupted`]
    /// I/O error (the Python binding checks for Ctrl-C here). `None`: one wait.
    pub wait_check: Option<fn() -> bool>,
    /// Crash-test hook: stop inside `put` at this stage.
    #[doc(hidden)]
    pub pause_at: Option<PutStage>,
}

/// How long one try of an interruptible lock wait lasts (see
/// [`CacheOptions::wait_check`]).
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            max_entries: None,
            max_processes: MAX_PROCESSES,
            lock_timeout: Duration::from_secs(10),
            mode: 0o600,
            wait_check: None,
            pause_at: None,
        }
    }
}

/// What [`TensorCache::info`] reports about one entry, without decoding it.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    /// Bytes of the stored value.
    pub size: u64,
    /// Bytes of its block in the pool.
    pub alloc_size: u64,
    /// Time since it was put.
    pub age: Duration,
    /// Its time to live, if any.
    pub ttl: Option<Duration>,
    /// The packet header, when the value is a dense tensor packet.
    pub packet: Option<PacketInfo>,
    /// The value's first bytes (at most [`INFO_HEAD_BYTES`]), enough for any packet
    /// header.
    pub head: Vec<u8>,
}

/// How many leading bytes of a value [`TensorCache::info`] returns.
pub const INFO_HEAD_BYTES: usize = 256;

/// Counters and occupancy of a cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheStats {
    /// Live entries (as [`TensorCache::len`] counts them: expired ones left out).
    pub entries: u64,
    /// Entry slots.
    pub max_entries: u64,
    /// Bytes of the segment.
    pub pool_size: u64,
    /// Bytes of the data region.
    pub data_region_size: u64,
    /// Bytes allocated to blocks (live and retired).
    pub used_bytes: u64,
    /// Bytes free in the data region.
    pub free_bytes: u64,
    /// Bytes held by removed entries that readers still pin.
    pub pinned_bytes: u64,
    /// Successful gets.
    pub hits: u64,
    /// Gets that found nothing (or an expired entry).
    pub misses: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Entries dropped because their TTL ran out.
    pub expirations: u64,
    /// Times the cache was repaired after a process died holding the lock.
    pub recoveries: u64,
    /// Live processes attached now (one registration per process and pool, however
    /// many handles it has).
    pub processes: u64,
}

impl CacheStats {
    /// `hits / (hits + misses)`, 0 before any get.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// This process's registration with one pool and the pins it holds: one for all the
/// handles of the pool in the process ([`registration`]), so views that outlive their
/// handle do not each keep a registry slot.
struct Me {
    pid: u32,
    slot: usize,
    /// The handles ([`Shared`]s) of the pool alive in this process; the slot is freed
    /// when the last goes.
    handles: usize,
    /// Local reference counts of pinned entry slots (the shared bitmap has one bit per
    /// process, so many views of one entry cost one bit), with each entry's sequence
    /// number when it was pinned (how a forked child knows an inherited view's entry
    /// is still the one it viewed).
    pins: HashMap<u32, (u32, u64)>,
    /// A registry slot [`prepare_fork`] took, under this process's id, for the child
    /// about to be forked, with the pins of `pins` set for it: the child takes it
    /// over ([`Shared::register`]) if it still holds that id. `None` in the parent
    /// once the fork is done.
    for_child: Option<ChildSlot>,
    /// Slots taken for children forked earlier that have not taken them over yet
    /// (slot, deadline): at most [`MAX_PENDING_CHILD_SLOTS`], so forks that fail
    /// (their slots wait out their deadline) take few.
    pending_children: Vec<(usize, u64)>,
    /// Pinned entry slots whose view went while the lock could not be taken (a
    /// timeout): the next operation that takes it releases them, so a lock held a
    /// while by another process does not leave an entry pinned for good. Each with
    /// the sequence number its view pinned (see [`Shared::unpin_locked`]).
    pending_unpins: Vec<(u32, u64)>,
}

/// A registry slot [`prepare_fork`] claimed for the child about to be forked.
struct ChildSlot {
    slot: usize,
    /// This (the parent) process's id words, which the slot holds until the child
    /// takes it over.
    words: [u64; 2],
    /// The deadline written in the slot (a later reservation of the same slot index
    /// has another).
    deadline: u64,
    /// The entries pinned in it: the parent's views, kept up to date by `pin` and
    /// `unpin` until the fork (other hooks and threads run between the hook and the
    /// fork), so the child's slot pins exactly the views it inherits.
    entries: std::collections::HashSet<u32>,
    /// The process the slot is for: `None` until the fork, then the child's pid
    /// (set by the `pthread_atfork` child handler); only that process takes it over,
    /// not a grandchild forked before it did.
    claimant: Option<u32>,
}

impl Me {
    /// Forgets a slot reserved for a child: the fork is done (or never came), so
    /// this process's later views are not pinned in it. A slot this process was
    /// itself forked for (a claimant) stays, to be taken over.
    fn forget_reserved_child(&mut self) {
        if self
            .for_child
            .as_ref()
            .is_some_and(|c| c.claimant.is_none())
        {
            self.for_child = None;
        }
    }

    fn new() -> Me {
        Me {
            pid: 0,
            slot: 0,
            handles: 0,
            pins: HashMap::new(),
            for_child: None,
            pending_children: Vec::new(),
            pending_unpins: Vec::new(),
        }
    }
}

/// A pool's registration in this process, by its segment's object id.
type Registration = ((u64, u64), Weak<Mutex<Me>>);

/// Each pool's registration in this process.
static REGISTRATIONS: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// This process's registration with the pool whose segment is the object `id`
/// ([`Segment::object_id`]), shared with every other handle of the pool here, counting
/// the new handle.
fn registration(id: (u64, u64)) -> Arc<Mutex<Me>> {
    let mut all = REGISTRATIONS.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|(_, w)| w.strong_count() > 0);
    let me = match all
        .iter()
        .find(|(k, _)| *k == id)
        .and_then(|(_, w)| w.upgrade())
    {
        Some(me) => me,
        None => {
            let me = Arc::new(Mutex::new(Me::new()));
            all.push((id, Arc::downgrade(&me)));
            me
        }
    };
    me.lock().unwrap_or_else(PoisonError::into_inner).handles += 1;
    me
}

/// How long a registry slot claimed for a child about to be forked waits for the
/// child to take it over.
const CHILD_CLAIM_WINDOW: Duration = Duration::from_secs(30);

/// Most slots a process keeps claimed for children that have not taken them over;
/// a fork beyond them leaves its child to register late.
const MAX_PENDING_CHILD_SLOTS: usize = 8;

/// The shared state of every cache handle alive in this process, and of the views
/// that outlive their handle: what the fork hooks walk.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// `shared`, tracked in [`LIVE`].
fn tracked(shared: Shared) -> Arc<Shared> {
    install_fork_handlers();
    let shared = Arc::new(shared);
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&shared));
    shared
}

/// Every cache state alive in this process.
fn live() -> Vec<Arc<Shared>> {
    let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.iter().filter_map(Weak::upgrade).collect()
}

/// The process-local locks a child needs, held by the forking thread across `fork`
/// so that no other thread holds one at that moment (the child would find it locked
/// for ever: a thread that held it does not exist there).
struct ForkGuards {
    // Fields drop in order: each pool's registration, then the registrations, then
    // the handle list (the reverse of taking them), then what the first borrow.
    _me: Vec<MutexGuard<'static, Me>>,
    _registrations: MutexGuard<'static, Vec<Registration>>,
    _live: MutexGuard<'static, Vec<Weak<Shared>>>,
    /// Keeps every mutex of `_me` alive while its guard lives.
    _pools: Vec<Arc<Mutex<Me>>>,
}

thread_local! {
    static FORK_GUARDS: RefCell<Option<ForkGuards>> = const { RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: takes [`ForkGuards`], the handle list, the
/// registrations, then each pool's registration (the order every other path takes
/// them in). It runs inside `fork` itself, after every Python-level hook: no Python
/// code runs (so no other thread takes the GIL) between it and the fork, and the
/// threads that may hold these locks hold them briefly, never waiting on the GIL.
extern "C" fn hold_locks_for_fork() {
    let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let registrations = REGISTRATIONS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools: Vec<Arc<Mutex<Me>>> = registrations
        .iter()
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    let me = pools
        .iter()
        .map(|pool| {
            let guard = pool.lock().unwrap_or_else(PoisonError::into_inner);
            // SAFETY: the guard borrows the mutex inside `pool`, an `Arc` that the same
            // `ForkGuards` keeps in `_pools` and drops after the guard (field order);
            // the guard never leaves this thread (a thread-local holds it).
            unsafe { std::mem::transmute::<MutexGuard<'_, Me>, MutexGuard<'static, Me>>(guard) }
        })
        .collect();
    let guards = ForkGuards {
        _me: me,
        _registrations: registrations,
        _live: live,
        _pools: pools,
    };
    FORK_GUARDS.with(|held| *held.borrow_mut() = Some(guards));
}

/// `pthread_atfork` parent handler: the slots reserved for the child are the child's
/// now (they stay under this process's id until the child takes them over, or their
/// deadline passes), so later views of this process are not pinned in them; then
/// lets go of what [`hold_locks_for_fork`] took.
extern "C" fn release_locks_in_parent() {
    FORK_GUARDS.with(|held| {
        if let Some(mut guards) = held.borrow_mut().take() {
            for me in &mut guards._me {
                me.forget_reserved_child();
            }
        }
    });
}

/// `pthread_atfork` child handler (the one thread is the forking one's copy, which
/// holds the locks): a slot reserved for this child is marked as this process's, one
/// its parent was still to take over is dropped (it is the parent's); then lets go.
extern "C" fn release_locks_in_child() {
    let pid = std::process::id();
    FORK_GUARDS.with(|held| {
        if let Some(mut guards) = held.borrow_mut().take() {
            for me in &mut guards._me {
                match me.for_child.as_mut() {
                    Some(child) if child.claimant.is_none() => child.claimant = Some(pid),
                    Some(_) => me.for_child = None,
                    None => {}
                }
            }
        }
    });
}

/// Installs the `pthread_atfork` handlers once, when the first cache is opened.
fn install_fork_handlers() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    tensorwire_shm::hold_across_fork(
        &INSTALLED,
        hold_locks_for_fork,
        release_locks_in_parent,
        release_locks_in_child,
    );
}

/// Call just before `fork` (Python does, from `os.register_at_fork`). For each cache
/// this process holds views of, it takes a registry slot for the child under this
/// process's id and pins every viewed entry for it, so the views the child inherits
/// stay as they are even if this process drops its own before the child runs (the
/// child has 30 s to take the slot over; after, a repair frees it). Then call
/// [`parent_after_fork`] in the parent and [`child_after_fork`] in the child.
/// Failures (a lock timeout, a full registry) are not reported: the child then
/// registers late, as without this call. (The process-local locks are held across
/// any `fork` by `pthread_atfork` handlers, with or without this call.)
pub fn prepare_fork() {
    // Half a second in all, however many pools: another process holding a pool's lock
    // longer leaves the child to register late with that one.
    let budget = std::time::Instant::now() + Duration::from_millis(500);
    for shared in live() {
        let left = budget.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = shared.reserve_for_child(left);
    }
}

/// Call in the parent right after `fork` (see [`prepare_fork`]): the slots taken for
/// the child are the child's now (they stay registered under this process's id until
/// the child takes them over, or their deadline passes).
pub fn parent_after_fork() {
    // The `pthread_atfork` parent handler has done it at the fork itself (so no view
    // this process takes after the fork is pinned in the child's slot); this is for
    // a `prepare_fork` that no `fork` followed.
    for shared in live() {
        shared
            .me
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .forget_reserved_child();
    }
}

/// Call in the child right after `fork`: registers it with every cache it holds a
/// handle or a view of (taking over the slots [`prepare_fork`] took), so the views it
/// inherited are pinned for it at once.
pub fn child_after_fork() {
    for shared in live() {
        // Not waiting long for a lock another process holds: the slot waits for this
        // child until its deadline, and the child's next cache operation takes it over.
        let _ = shared.locked_within(Duration::from_millis(100), |_| Ok(()));
    }
}

pub(crate) struct Shared {
    pub(crate) region: Region,
    pub(crate) layout: Layout,
    mutex: RobustMutex,
    name: String,
    options: CacheOptions,
    me: Arc<Mutex<Me>>,
}

/// A shared-memory tensor cache many processes attach to by name.
///
/// Values are byte strings (tensor packets, for the Python API), stored in
/// 64-byte-aligned blocks of one segment. [`get`](TensorCache::get) returns a
/// zero-copy [`Bytes`] view that pins the entry: while any view lives, the bytes stay
/// exactly as they were, even if another process deletes, evicts or overwrites the key
/// (the new value goes to a new block; the old block is freed when the last pin goes).
///
/// Every operation takes the segment's robust mutex. A process that dies holding it
/// (or mid-`put`) leaves no torn entry: the next locker rebuilds the index, LRU list
/// and free space from the entry slots, which are only ever published whole, and keeps
/// every healthy entry. See `docs/shm-cache.md`.
#[derive(Clone)]
pub struct TensorCache {
    shared: Arc<Shared>,
}

pub(crate) fn now_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid and is overwritten by clock_gettime.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and out-pointer. CLOCK_MONOTONIC is system-wide
    // (within one time namespace), so times written by one process compare with
    // another's.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// FNV-1a, 64 bits: the key index's hash (stored in the slot to skip most compares).
pub(crate) fn hash_key(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "cache key is {} bytes of UTF-8, above the limit of {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

fn unique_name() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("tw_cache_{}_{:x}_{n}", std::process::id(), now_ns())
}

impl TensorCache {
    /// Creates a cache of `size` bytes under `name` (a fresh unique name when `None`).
    /// Fails if the name is taken.
    pub fn create(name: Option<&str>, size: usize, options: CacheOptions) -> Result<TensorCache> {
        let name = name.map_or_else(unique_name, str::to_owned);
        let entries = options
            .max_entries
            .unwrap_or_else(|| Layout::default_entries(size));
        let layout = Layout::compute(size, entries, options.max_processes)?;
        // A pool fills as values arrive: its pages are not committed up front, but a
        // pool larger than what /dev/shm has free is refused now (`NoSpace`).
        let create = CreateOptions {
            mode: options.mode,
            exclusive: true,
            allocate: false,
        };
        let segment = Arc::new(Segment::create(&name, size, &create)?);
        let result = Self::initialize(Arc::clone(&segment), layout, name.clone(), options);
        if result.is_err() {
            let _ = Segment::unlink(&name);
        }
        result
    }

    fn initialize(
        segment: Arc<Segment>,
        layout: Layout,
        name: String,
        options: CacheOptions,
    ) -> Result<TensorCache> {
        let region = Region::new(Arc::clone(&segment))
            .ok_or_else(|| Error::invalid("cache segment is read-only"))?;
        for (off, value, width) in layout.header_fields() {
            match width {
                4 => region.set32(off, value as u32),
                _ => region.set64(off, value),
            }
        }
        let object = segment.object_id();
        // SAFETY: the segment was just created exclusively; no other process can have
        // found it yet (the magic, written last, is not there).
        let mutex = unsafe { RobustMutex::initialize(segment, h::MUTEX)? };
        let shared = Shared {
            region,
            layout,
            mutex,
            name,
            options,
            me: registration(object),
        };
        shared.reset_tables();
        // Publish: attachers wait for the magic before reading anything else.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        shared.region.write_bytes(h::MAGIC, MAGIC);
        let cache = TensorCache {
            shared: tracked(shared),
        };
        cache.shared.locked(|_| Ok(()))?;
        Ok(cache)
    }

    /// Attaches to the cache another process created under `name`. Waits up to one
    /// second for a creator that is still initializing it; refuses a segment that is
    /// not a tensorwire cache or whose header does not hold together.
    pub fn attach(name: &str, options: CacheOptions) -> Result<TensorCache> {
        const CREATOR_WAIT: Duration = Duration::from_secs(1);
        let deadline = std::time::Instant::now() + CREATOR_WAIT;
        // The creator makes the object, then sizes it, then writes the header.
        let segment = Arc::new(Segment::open_sized(name, Access::ReadWrite, CREATOR_WAIT)?);
        if segment.len() < HEADER_SIZE {
            return Err(Error::Truncated {
                offset: 0,
                needed: HEADER_SIZE as u64,
                available: segment.len() as u64,
            });
        }
        let layout = loop {
            let header = &segment.as_slice()[..HEADER_SIZE];
            match Layout::from_header(header, segment.len()) {
                Err(Error::BadMagic { found, .. })
                    if found.iter().all(|&b| b == 0) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                other => break other?,
            }
        };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let region = Region::new(Arc::clone(&segment))
            .ok_or_else(|| Error::invalid("cache segment is read-only"))?;
        let object = segment.object_id();
        // SAFETY: the header checked out (magic, version, geometry), so the creator
        // initialized the mutex at this offset before writing the magic.
        let mutex = unsafe { RobustMutex::attach(segment, h::MUTEX)? };
        let cache = TensorCache {
            shared: tracked(Shared {
                region,
                layout,
                mutex,
                name: name.to_owned(),
                options,
                me: registration(object),
            }),
        };
        cache.shared.locked(|_| Ok(()))?;
        Ok(cache)
    }

    /// Removes the segment's name (attached processes keep working; the memory goes
    /// when the last one detaches).
    pub fn unlink(&self) -> Result<()> {
        Segment::unlink(&self.shared.name)
    }

    /// The segment name other processes attach by.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The geometry.
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }

    /// Stores `value` under `key`, replacing what was there. Returns the bytes stored.
    pub fn put(&self, key: &str, value: &[u8], ttl: Option<Duration>) -> Result<usize> {
        self.put_with(key, value.len(), ttl, |buf| {
            buf[..value.len()].copy_from_slice(value);
            Ok(value.len())
        })
    }

    /// Stores a value written in place by `fill`, which gets a block of `len` bytes in
    /// shared memory (holding stale bytes) and returns how many it wrote (≤ `len`).
    /// Nobody sees the value until `fill` returns and it is published whole. A failing
    /// `fill` stores nothing; the old value stays, except when the update was going in
    /// place (the key's own block, unpinned and of the same size), where the key is
    /// removed, its old bytes being partly overwritten.
    ///
    /// Errors: the key is too long; `NoSpace` when the value is larger than the data
    /// region, or when it cannot fit even after evicting every entry (pinned memory
    /// and fragmentation); `Timeout` when the lock is not free in time.
    pub fn put_with<F>(
        &self,
        key: &str,
        len: usize,
        ttl: Option<Duration>,
        fill: F,
    ) -> Result<usize>
    where
        F: FnOnce(&mut [u8]) -> Result<usize>,
    {
        check_key(key)?;
        self.shared.put_with(key.as_bytes(), len, ttl, fill)
    }

    /// The value under `key`, as a zero-copy view that pins it; `None` when absent or
    /// expired.
    pub fn get(&self, key: &str) -> Result<Option<Bytes>> {
        check_key(key)?;
        Shared::get(&self.shared, key.as_bytes())
    }

    /// Registers the calling process now rather than at its next operation. Around a
    /// `fork`, use [`prepare_fork`], [`parent_after_fork`] and [`child_after_fork`]
    /// instead: they cover every cache of the process, and pin the child's inherited
    /// views before the parent can drop its own.
    pub fn register_process(&self) -> Result<()> {
        self.shared.locked(|_| Ok(()))
    }

    /// Removes `key`; true when it was there.
    pub fn delete(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.shared.locked(|_| {
            Ok(match self.shared.lookup(key.as_bytes()) {
                Some((bucket, slot)) => {
                    self.shared.remove(slot, Some(bucket));
                    true
                }
                None => false,
            })
        })
    }

    /// True when `key` holds a live (unexpired) value. Does not count as a hit or miss.
    pub fn contains(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let s = &self.shared;
        s.locked(|_| {
            let now = now_ns();
            Ok(s.lookup(key.as_bytes())
                .is_some_and(|(_, slot)| !s.expired(slot, now)))
        })
    }

    /// Size, age, TTL and packet header of `key`'s value, without decoding it.
    pub fn info(&self, key: &str) -> Result<Option<EntryInfo>> {
        check_key(key)?;
        let s = &self.shared;
        s.locked(|_| {
            let Some((bucket, slot)) = s.lookup(key.as_bytes()) else {
                return Ok(None);
            };
            let now = now_ns();
            if s.expired(slot, now) {
                s.expire(slot, bucket);
                return Ok(None);
            }
            let sl = s.layout.slot(slot);
            let r = &s.region;
            let (off, len) = s.value_range(slot)?;
            // The lock is held, so no process writes or frees the block meanwhile.
            let bytes = r.data(off, len).unwrap_or(&[]);
            let packet = packet_info(bytes, &PacketLimits::default()).ok();
            let head = bytes[..bytes.len().min(INFO_HEAD_BYTES)].to_vec();
            let created = r.get64(sl + e::CREATED_NS);
            let expires = r.get64(sl + e::EXPIRES_NS);
            Ok(Some(EntryInfo {
                size: len as u64,
                alloc_size: r.get64(sl + e::ALLOC_SIZE),
                age: Duration::from_nanos(now.saturating_sub(created)),
                ttl: (expires != 0).then(|| Duration::from_nanos(expires.saturating_sub(created))),
                packet,
                head,
            }))
        })
    }

    /// The live keys, most recently used first.
    pub fn keys(&self) -> Result<Vec<String>> {
        let s = &self.shared;
        s.locked(|_| {
            let mut keys = Vec::new();
            s.for_each_live(|slot| {
                keys.push(String::from_utf8_lossy(&s.key_of(slot)).into_owned())
            });
            Ok(keys)
        })
    }

    /// Number of live keys.
    pub fn len(&self) -> Result<usize> {
        let s = &self.shared;
        s.locked(|_| {
            let mut n = 0;
            s.for_each_live(|_| n += 1);
            Ok(n)
        })
    }

    /// True when no key is live.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Removes every entry (pinned values stay valid for their readers).
    pub fn clear(&self) -> Result<()> {
        let s = &self.shared;
        s.locked(|_| {
            for slot in 0..s.layout.max_entries as u32 {
                if s.region.get8(s.layout.slot(slot) + e::STATE) == READY {
                    s.remove(slot, None);
                }
            }
            s.rebuild_index();
            Ok(())
        })
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> Result<CacheStats> {
        let s = &self.shared;
        s.locked(|_| {
            let r = &s.region;
            let l = &s.layout;
            let mut pinned = 0;
            for slot in 0..l.max_entries as u32 {
                if r.get8(l.slot(slot) + e::STATE) == RETIRED {
                    pinned += r.get64(l.slot(slot) + e::ALLOC_SIZE);
                }
            }
            let now = now_ns();
            let processes = (0..l.max_processes)
                .filter(|&p| {
                    ProcessId::from_words(s.registered_words(p)).is_some()
                        && !s.registered_dead(p, now)
                })
                .count() as u64;
            let used = r.get64(h::USED_BYTES);
            // Entries past their TTL stay indexed until a put purges them; like `len`,
            // the count leaves them out.
            let mut entries = 0u64;
            s.for_each_live(|_| entries += 1);
            Ok(CacheStats {
                entries,
                max_entries: l.max_entries as u64,
                pool_size: l.segment_size as u64,
                data_region_size: l.data_size as u64,
                used_bytes: used,
                free_bytes: (l.data_size as u64).saturating_sub(used),
                pinned_bytes: pinned,
                hits: r.get64(h::HITS),
                misses: r.get64(h::MISSES),
                evictions: r.get64(h::EVICTIONS),
                expirations: r.get64(h::EXPIRATIONS),
                recoveries: r.get64(h::RECOVERIES),
                processes,
            })
        })
    }

    /// Checks every structure against the entry slots (index, LRU list, free table,
    /// counters, pins); an error names the first inconsistency. For tests and
    /// `tensorwire verify`.
    pub fn check_consistency(&self) -> Result<()> {
        self.shared.locked(|_| self.shared.check_consistency())
    }
}

impl Shared {
    /// Runs `f` under the lock, repairing the cache first when a holder died (or a
    /// repair was interrupted), with this handle registered. `f` gets this handle's
    /// registry slot.
    pub(crate) fn locked<T>(&self, f: impl FnOnce(usize) -> Result<T>) -> Result<T> {
        self.locked_within(self.options.lock_timeout, f)
    }

    /// [`Shared::locked`], waiting at most `timeout` for the lock.
    fn locked_within<T>(&self, timeout: Duration, f: impl FnOnce(usize) -> Result<T>) -> Result<T> {
        let mut guard = self.lock_within(timeout)?;
        self.repair_if_needed(&mut guard)?;
        let me = self.register()?;
        self.release_pending_unpins(me);
        f(me)
    }

    /// The pool lock, waiting at most `timeout`: in [`WAIT_SLICE`]s, between which
    /// [`CacheOptions::wait_check`] may end the wait, when there is one.
    fn lock_within(&self, timeout: Duration) -> Result<LockGuard<'_>> {
        let Some(stop) = self.options.wait_check else {
            return self.mutex.lock(Some(timeout));
        };
        let start = std::time::Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match self.mutex.lock(Some(left.min(WAIT_SLICE))) {
                Err(Error::Timeout { .. }) if left > WAIT_SLICE => {
                    if stop() {
                        return Err(Error::Io(std::io::Error::new(
                            std::io::ErrorKind::Interrupted,
                            "the wait for the cache's lock was interrupted",
                        )));
                    }
                }
                Err(Error::Timeout { what, .. }) => {
                    return Err(Error::Timeout {
                        what,
                        waited_ms: timeout.as_millis() as u64,
                    })
                }
                other => return other,
            }
        }
    }

    /// Releases the pins whose views went while the lock could not be taken
    /// ([`Me::pending_unpins`]). Lock held.
    fn release_pending_unpins(&self, me: usize) {
        let pending = {
            let mut local = self.me.lock().unwrap_or_else(|p| p.into_inner());
            if local.pending_unpins.is_empty() {
                return;
            }
            std::mem::take(&mut local.pending_unpins)
        };
        for (slot, seq) in pending {
            self.unpin_locked(slot, seq, me);
        }
    }

    fn repair_if_needed(&self, guard: &mut LockGuard<'_>) -> Result<()> {
        let r = &self.region;
        if guard.owner_died() || r.get32(h::NEEDS_RECOVERY) != 0 {
            // Mark first: if we die mid-repair, the next locker repairs again.
            r.set32(h::NEEDS_RECOVERY, 1);
            guard.mark_consistent()?;
            self.recover();
            r.add64(h::RECOVERIES, 1);
            r.set32(h::NEEDS_RECOVERY, 0);
        }
        Ok(())
    }

    /// Calls `f` with every unexpired READY slot, most recently used first (walking
    /// the LRU list, at most `max_entries` steps). Lock held.
    fn for_each_live(&self, mut f: impl FnMut(u32)) {
        let now = now_ns();
        let mut at = self.region.get32(h::LRU_HEAD);
        for _ in 0..self.layout.max_entries {
            let Some(slot) = self.valid_slot(at) else {
                break;
            };
            if !self.expired(slot, now) {
                f(slot);
            }
            at = self.region.get32(self.layout.slot(slot) + e::LRU_NEXT);
        }
    }

    /// This handle's registry slot, claiming one on first use and again in a forked
    /// child. Lock held.
    fn register(&self) -> Result<usize> {
        let mut me = self.me.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if me.pid == pid {
            return Ok(me.slot);
        }
        let id = ProcessId::current();
        // A slot the parent took for this child before the fork, still under the
        // parent's id (not freed by a repair since): this process takes it over, and
        // the pins set in it are already this process's.
        let now = now_ns();
        let reserved = me.for_child.take().filter(|child| {
            child.claimant == Some(pid)
                && self.waits_for_child(child.slot, child.words, child.deadline, now)
        });
        let slot = match reserved {
            Some(child) => {
                self.write_registered(child.slot, id.to_words());
                // Entries pinned for the child whose views went before the fork: no
                // view of this process holds them.
                for entry in child.entries {
                    if !me.pins.contains_key(&entry) {
                        self.clear_pin_bit(entry, child.slot);
                    }
                }
                child.slot
            }
            None => self.new_process_slot(id)?,
        };
        me.pid = pid;
        me.slot = slot;
        // The parent's children are not this process's.
        me.pending_children.clear();
        // In a forked child whose slot was not taken before the fork, the views
        // inherited from the parent are pinned by the parent's bit only, which the
        // parent may drop at any time: pin them for this process too, each while its
        // entry is still the one viewed (same sequence number, not freed); a view
        // whose entry already changed cannot be saved. (Where the slot was taken
        // before the fork, its bits are set already.)
        me.pins.retain(|&entry, &mut (_, seq)| {
            let sl = self.layout.slot(entry);
            let state = self.region.get8(sl + e::STATE);
            let same =
                (state == READY || state == RETIRED) && self.region.get64(sl + e::SEQ) == seq;
            if same {
                self.set_pin_bit(entry, slot);
            }
            same
        });
        Ok(slot)
    }

    /// A free registry slot claimed for `id`, making room by dropping processes that
    /// died without detaching. Lock held.
    fn new_process_slot(&self, id: ProcessId) -> Result<usize> {
        if let Some(slot) = self.claim_process_slot(id) {
            return Ok(slot);
        }
        self.recover();
        self.claim_process_slot(id).ok_or(Error::LimitExceeded {
            what: "processes attached to the cache",
            limit: self.layout.max_processes as u64,
            found: self.layout.max_processes as u64 + 1,
        })
    }

    /// [`prepare_fork`] for this cache: when this process pins entries, a registry
    /// slot under its own id for the child, with every pinned entry pinned for it.
    fn reserve_for_child(&self, timeout: Duration) -> Result<()> {
        {
            let me = self.me.lock().unwrap_or_else(PoisonError::into_inner);
            // A child that has not taken its own slot over yet does so first (its
            // `locked` below registers it); with nothing pinned, nothing to do.
            if me.pins.is_empty() {
                return Ok(());
            }
        }
        self.locked_within(timeout.min(self.options.lock_timeout), |_| {
            let mut me = self.me.lock().unwrap_or_else(PoisonError::into_inner);
            // Another handle of the pool took it already (one registration for all).
            if me.pins.is_empty() || me.for_child.is_some() {
                return Ok(());
            }
            let id = ProcessId::current();
            // Children that took their slots over (or whose slots expired) are done.
            let now = now_ns();
            let words = id.to_words();
            me.pending_children
                .retain(|&(slot, deadline)| self.waits_for_child(slot, words, deadline, now));
            if me.pending_children.len() >= MAX_PENDING_CHILD_SLOTS {
                return Ok(());
            }
            let slot = self.new_process_slot(id)?;
            // The child has until then to take it over; after, a repair drops it
            // with its pins (a fork that failed leaks nothing for long).
            let deadline = now.saturating_add(CHILD_CLAIM_WINDOW.as_nanos() as u64);
            self.region
                .set64(self.layout.process(slot) + CHILD_CLAIM_DEADLINE, deadline);
            let entries: std::collections::HashSet<u32> = me.pins.keys().copied().collect();
            for &entry in &entries {
                self.set_pin_bit(entry, slot);
            }
            me.for_child = Some(ChildSlot {
                slot,
                words: id.to_words(),
                deadline,
                entries,
                claimant: None,
            });
            me.pending_children.push((slot, deadline));
            Ok(())
        })
    }

    /// Sets process slot `me`'s bit in entry `slot`'s pin bitmap, counting the
    /// process in the entry's pin count when the bit was clear. Lock held.
    fn set_pin_bit(&self, slot: u32, me: usize) {
        let sl = self.layout.slot(slot);
        let bit = 1u64 << (me % 64);
        let before = self.region.or64(sl + e::PINS + me / 64 * 8, bit);
        if before & bit == 0 {
            let c = self.region.get32(sl + e::PIN_COUNT);
            self.region.set32(sl + e::PIN_COUNT, c.saturating_add(1));
        }
    }

    /// Clears process slot `me`'s bit in entry `slot`'s pin bitmap, uncounting it, and
    /// frees a retired entry no one pins any more. Lock held.
    fn clear_pin_bit(&self, slot: u32, me: usize) {
        let sl = self.layout.slot(slot);
        let bit = 1u64 << (me % 64);
        let before = self.region.and64(sl + e::PINS + me / 64 * 8, !bit);
        if before & bit != 0 {
            let c = self.region.get32(sl + e::PIN_COUNT).saturating_sub(1);
            self.region.set32(sl + e::PIN_COUNT, c);
            if c == 0 && self.region.get8(sl + e::STATE) == RETIRED {
                self.free_slot(slot);
            }
        }
    }

    /// True when a process in the registry is no longer alive (one `/proc` lookup
    /// per registered process). Lock held.
    fn any_registered_process_dead(&self) -> bool {
        let now = now_ns();
        (0..self.layout.max_processes).any(|p| self.registered_dead(p, now))
    }

    /// True when registry slot `p` holds a process that died, or a slot claimed for a
    /// forked child that did not take it over in time (the fork failed, or the child
    /// died first). Lock held.
    pub(crate) fn registered_dead(&self, p: usize, now: u64) -> bool {
        let Some(id) = ProcessId::from_words(self.registered_words(p)) else {
            return false;
        };
        // A slot waiting for a forked child is the child's until its deadline, even
        // if the parent, whose id it holds meanwhile, has exited.
        match self
            .region
            .get64(self.layout.process(p) + CHILD_CLAIM_DEADLINE)
        {
            0 => !id.is_alive(),
            deadline => now > deadline,
        }
    }

    fn claim_process_slot(&self, id: ProcessId) -> Option<usize> {
        let r = &self.region;
        let slot =
            (0..self.layout.max_processes).find(|&p| r.get64(self.layout.process(p)) == 0)?;
        // A free slot's pins belong to no one (closing clears a process's pins before
        // freeing its slot, and a repair those of the dead; a pool written by an
        // earlier version may still hold some): the new process must not take them
        // over.
        self.clear_process_pins(slot);
        self.write_registered(slot, id.to_words());
        Some(slot)
    }

    /// True when some entry is pinned by a free registry slot (no process). Lock
    /// held.
    fn pins_on_free_process_slots(&self) -> bool {
        let l = &self.layout;
        let words = l.max_processes.div_ceil(64);
        let mut free = [0u64; crate::layout::MAX_PROCESSES.div_ceil(64)];
        for p in 0..l.max_processes {
            if self.region.get64(l.process(p)) == 0 {
                free[p / 64] |= 1 << (p % 64);
            }
        }
        (0..l.max_entries as u32).any(|entry| {
            let sl = l.slot(entry);
            self.region.get8(sl + e::STATE) != FREE
                && (0..words).any(|w| self.region.get64(sl + e::PINS + w * 8) & free[w] != 0)
        })
    }

    /// Clears registry slot `p`'s pin bit on every entry (freeing retired entries
    /// no one pins any more). Lock held.
    fn clear_process_pins(&self, p: usize) {
        for entry in 0..self.layout.max_entries as u32 {
            if self.region.get8(self.layout.slot(entry) + e::STATE) != FREE {
                self.clear_pin_bit(entry, p);
            }
        }
    }

    /// The id words (pid, start time) registry slot `p` holds; zeros when free.
    pub(crate) fn registered_words(&self, p: usize) -> [u64; 2] {
        let off = self.layout.process(p);
        [self.region.get64(off), self.region.get64(off + 8)]
    }

    /// Registry slot `p` holds `words` (zeros: free), with no child-claim deadline.
    pub(crate) fn write_registered(&self, p: usize, [pid, start]: [u64; 2]) {
        let off = self.layout.process(p);
        self.region.set64(off + CHILD_CLAIM_DEADLINE, 0);
        self.region.set64(off + 8, start);
        self.region.set64(off, pid);
    }

    /// Whether registry slot `slot`, claimed for a forked child under the id `words`
    /// with `deadline`, still waits for that child at `now` (not taken over, not
    /// freed and claimed again since, deadline not passed).
    fn waits_for_child(&self, slot: usize, words: [u64; 2], deadline: u64, now: u64) -> bool {
        let off = self.layout.process(slot);
        self.registered_words(slot) == words
            && self.region.get64(off + CHILD_CLAIM_DEADLINE) == deadline
            && now <= deadline
    }

    /// Empty tables: all slots free, no index entries, one free extent. Creator only
    /// (and `recover` builds the same from the surviving entries).
    fn reset_tables(&self) {
        let l = &self.layout;
        for slot in 0..l.max_entries as u32 {
            self.region.zero(l.slot(slot), e::KEY);
        }
        self.rebuild_derived();
    }

    // ----- entry lifecycle (lock held) -----

    /// Takes a READY entry out of sight (index, LRU); frees it, or retires it when a
    /// reader pins it.
    fn remove(&self, slot: u32, bucket: Option<usize>) {
        let r = &self.region;
        let sl = self.layout.slot(slot);
        match bucket {
            Some(b) => self.index_remove(b),
            None => {
                // Find its bucket (clear() rebuilds the index afterwards anyway).
                let key = self.key_of(slot);
                if let Some((b, s)) = self.lookup(&key) {
                    if s == slot {
                        self.index_remove(b);
                    }
                }
            }
        }
        self.lru_unlink(slot);
        let count = r.get32(h::ENTRY_COUNT);
        r.set32(h::ENTRY_COUNT, count.saturating_sub(1));
        if r.get32(sl + e::PIN_COUNT) == 0 {
            self.free_slot(slot);
        } else {
            r.set8(sl + e::STATE, RETIRED);
        }
    }

    fn expire(&self, slot: u32, bucket: usize) {
        self.remove(slot, Some(bucket));
        self.region.add64(h::EXPIRATIONS, 1);
    }

    /// Removes every expired entry; true if any went.
    fn purge_expired(&self) -> bool {
        let now = now_ns();
        let mut any = false;
        for slot in 0..self.layout.max_entries as u32 {
            let sl = self.layout.slot(slot);
            if self.region.get8(sl + e::STATE) == READY && self.expired(slot, now) {
                let key = self.key_of(slot);
                if let Some((b, s)) = self.lookup(&key) {
                    if s == slot {
                        self.expire(slot, b);
                        any = true;
                    }
                }
            }
        }
        any
    }

    /// Bytes that no eviction can free while their holders live: blocks pinned by
    /// readers (published or already removed) and blocks of unfinished puts.
    fn unevictable_bytes(&self) -> u64 {
        let r = &self.region;
        (0..self.layout.max_entries as u32)
            .map(|slot| self.layout.slot(slot))
            .filter(|&sl| match r.get8(sl + e::STATE) {
                READY => r.get32(sl + e::PIN_COUNT) > 0,
                WRITING | RETIRED => true,
                _ => false,
            })
            .map(|sl| r.get64(sl + e::ALLOC_SIZE))
            .fold(0u64, u64::saturating_add)
    }

    /// Evicts the least recently used entry that no reader pins; false when there is
    /// none. A pinned entry is passed over: evicting it would free neither its block
    /// nor its slot until its readers let go, and would lose it from the cache.
    fn evict_lru(&self) -> bool {
        let r = &self.region;
        let mut at = r.get32(h::LRU_TAIL);
        // At most one step per slot: a corrupted list that loops ends here.
        for _ in 0..self.layout.max_entries {
            let Some(slot) = self.valid_slot(at) else {
                return false;
            };
            let sl = self.layout.slot(slot);
            if r.get32(sl + e::PIN_COUNT) == 0 {
                let key = self.key_of(slot);
                let bucket = self
                    .lookup(&key)
                    .filter(|&(_, s)| s == slot)
                    .map(|(b, _)| b);
                self.remove(slot, bucket);
                r.add64(h::EVICTIONS, 1);
                return true;
            }
            at = r.get32(sl + e::LRU_PREV);
        }
        false
    }

    /// A block of `size` bytes and a free slot, evicting (expired entries first, then
    /// from the LRU tail) and finally repairing (dead processes' pins and half-written
    /// blocks) until they fit.
    ///
    /// Before the first eviction it checks that the block could fit once every evictable
    /// entry is gone; when it could not (readers pin the rest), it fails at once rather
    /// than empty the cache for nothing.
    fn reserve(&self, size: u64) -> Result<(u32, u64)> {
        let mut purged = false;
        let mut recovered = false;
        let mut checked_fit = false;
        // Each round frees something or moves to the next stage; the bound only
        // matters for a corrupted LRU list that loops.
        for _ in 0..self.layout.max_entries * 2 + 4 {
            let free_slot_ready = self.valid_slot(self.region.get32(FREE_SLOT_HEAD)).is_some();
            if free_slot_ready {
                if let Some(off) = self.alloc_block(size) {
                    let slot = self
                        .pop_free_slot()
                        .ok_or_else(|| Error::malformed(0, "cache free-slot list is inconsistent"));
                    match slot {
                        Ok(slot) => return Ok((slot, off)),
                        Err(err) => {
                            self.free_block(off, size);
                            return Err(err);
                        }
                    }
                }
            }
            if !purged {
                purged = true;
                if self.purge_expired() {
                    continue;
                }
                // Blocks held by processes that died (their pins, their unfinished
                // puts) come back before any healthy entry is evicted.
                if self.any_registered_process_dead() {
                    recovered = true;
                    self.recover();
                    continue;
                }
            }
            if !checked_fit {
                // What dead processes held is not "held": repair first (the purge
                // above may have skipped that stage by freeing something).
                if !recovered && self.any_registered_process_dead() {
                    recovered = true;
                    self.recover();
                    continue;
                }
                let held = self.unevictable_bytes();
                let available = (self.layout.data_size as u64).saturating_sub(held);
                // Before refusing, one repair if pins sit on free registry slots
                // (which it drops): they are not held by anyone either.
                if size > available && !recovered && self.pins_on_free_process_slots() {
                    recovered = true;
                    self.recover();
                    continue;
                }
                checked_fit = true;
                if size > available {
                    return Err(Error::NoSpace {
                        what: format!(
                            "a cache value ({held} bytes are held by readers' pinned views \
                             and unfinished puts; nothing was evicted)"
                        ),
                        needed: size,
                        available,
                    });
                }
            }
            if self.evict_lru() {
                continue;
            }
            if !recovered {
                recovered = true;
                self.recover();
                continue;
            }
            let used = self.region.get64(h::USED_BYTES);
            return Err(Error::NoSpace {
                what: if free_slot_ready {
                    format!(
                        "a cache value ({used} bytes are held by readers' pinned views and unfinished puts; the rest is too fragmented)"
                    )
                } else {
                    "a cache entry slot (all pinned by readers)".into()
                },
                needed: size,
                available: (self.layout.data_size as u64).saturating_sub(used),
            });
        }
        Err(Error::malformed(
            h::LRU_TAIL as u64,
            "cache eviction did not converge (the LRU list is corrupted)",
        ))
    }

    fn pause(&self, stage: PutStage) {
        if self.options.pause_at == Some(stage) {
            eprintln!("tensorwire-cache: paused at {stage:?}");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    fn put_with<F>(&self, key: &[u8], len: usize, ttl: Option<Duration>, fill: F) -> Result<usize>
    where
        F: FnOnce(&mut [u8]) -> Result<usize>,
    {
        let alloc = (len.max(1) as u64).div_ceil(BLOCK_ALIGN as u64) * BLOCK_ALIGN as u64;
        if alloc > self.layout.data_size as u64 {
            return Err(Error::NoSpace {
                what: "a cache value larger than the whole pool".into(),
                needed: len as u64,
                available: self.layout.data_size as u64,
            });
        }
        let ttl_ns = ttl.map(|t| (t.as_nanos().min(u64::MAX as u128) as u64).max(1));
        let hash = hash_key(key);
        let r = &self.region;

        let mut fill = Some(fill);
        let reserved = self.locked(|me| {
            // In place: the key exists, nobody pins it, and its block is the same size
            // class. The lock stays held while writing, so readers wait rather than
            // miss; the slot is WRITING meanwhile, so a crash drops it, never tears it.
            if let Some((bucket, slot)) = self.lookup(key) {
                let sl = self.layout.slot(slot);
                let have = r.get64(sl + e::ALLOC_SIZE);
                if r.get32(sl + e::PIN_COUNT) == 0 && have >= alloc && have <= alloc * 2 {
                    r.set32(sl + e::WRITER, me as u32);
                    r.set8(sl + e::STATE, WRITING);
                    let (off, _) = self.value_range(slot)?;
                    // SAFETY: the slot is WRITING, unpinned and we hold the lock: no one
                    // else reads or writes the block until we publish or free it.
                    let buf = unsafe { r.data_mut(off, len) }
                        .ok_or_else(|| Error::malformed(sl as u64, "cache entry out of range"))?;
                    if self.options.pause_at == Some(PutStage::InPlace) {
                        buf[..len / 2].fill(0xEE);
                        self.pause(PutStage::InPlace);
                    }
                    let filler = fill
                        .take()
                        .ok_or_else(|| Error::invalid("fill used twice"))?;
                    return match filler(buf).and_then(|n| check_written(n, len)) {
                        Ok(n) => {
                            self.finish_entry(slot, n, ttl_ns);
                            r.set8(sl + e::STATE, READY);
                            self.touch(slot);
                            Ok(None)
                        }
                        Err(err) => {
                            // The old bytes are gone: drop the entry.
                            r.set8(sl + e::STATE, READY);
                            self.remove(slot, Some(bucket));
                            Err(err)
                        }
                    };
                }
            }
            let (slot, off) = self.reserve(alloc)?;
            let sl = self.layout.slot(slot);
            r.zero(sl, e::KEY);
            r.set32(sl + e::WRITER, me as u32);
            r.set64(sl + e::KEY_HASH, hash);
            r.set64(sl + e::DATA_OFFSET, off);
            r.set64(sl + e::ALLOC_SIZE, alloc);
            r.set8(sl + e::KEY_LEN, key.len() as u8);
            r.write_bytes(sl + e::KEY, key);
            r.set32(sl + e::LRU_PREV, NONE);
            r.set32(sl + e::LRU_NEXT, NONE);
            r.set8(sl + e::STATE, WRITING);
            self.pause(PutStage::Reserved);
            Ok(Some((slot, off)))
        });
        let Some((slot, off)) = reserved? else {
            return Ok(len);
        };

        // Fill outside the lock: the block is ours alone (WRITING, not indexed). It lies
        // in the data region: `alloc_block` takes blocks only from a free table whose
        // extents all do (it rebuilds one that does not), so this cannot overflow.
        let start = self.layout.data_offset + off as usize;
        // SAFETY: the slot is WRITING and owned by this handle; its block is neither
        // indexed, pinned nor free, so no other slice over it exists.
        let written = match unsafe { r.data_mut(start, len) } {
            Some(buf) => {
                let filler = fill
                    .take()
                    .ok_or_else(|| Error::invalid("fill used twice"))?;
                if len > 0 {
                    self.pause_filling(buf);
                }
                filler(buf).and_then(|n| check_written(n, len))
            }
            None => Err(Error::malformed(off, "cache block out of range")),
        };

        self.locked(|me| {
            let sl = self.layout.slot(slot);
            let ours = r.get8(sl + e::STATE) == WRITING && r.get32(sl + e::WRITER) as usize == me;
            if !ours {
                return Err(Error::malformed(
                    sl as u64,
                    "the cache entry being written was taken away (the cache was repaired as if this process had died)",
                ));
            }
            let n = match written {
                Ok(n) => n,
                Err(err) => {
                    self.free_slot(slot);
                    return Err(err);
                }
            };
            let old = self.lookup(key);
            self.finish_entry(slot, n, ttl_ns);
            r.set8(sl + e::STATE, READY);
            self.pause(PutStage::Publishing);
            if let Some((bucket, old_slot)) = old {
                self.remove(old_slot, Some(bucket));
            }
            self.index_insert(slot);
            self.touch_new(slot);
            r.set32(h::ENTRY_COUNT, r.get32(h::ENTRY_COUNT).saturating_add(1));
            Ok(n)
        })
    }

    /// The `Filling` crash hook: write half the block, then stop.
    fn pause_filling(&self, buf: &mut [u8]) {
        if self.options.pause_at == Some(PutStage::Filling) {
            let half = buf.len() / 2;
            buf[..half].fill(0xEE);
            self.pause(PutStage::Filling);
        }
    }

    /// Records a value just written into `slot`: its length, times and a new sequence
    /// number (every value, rewritten in place too, has its own: how a forked child
    /// registering late knows a view it inherited changed, and a repair which of two
    /// slots of one key is newer).
    fn finish_entry(&self, slot: u32, value_len: usize, ttl_ns: Option<u64>) {
        let r = &self.region;
        let sl = self.layout.slot(slot);
        let seq = r.get64(h::PUT_SEQ).wrapping_add(1);
        r.set64(h::PUT_SEQ, seq);
        r.set64(sl + e::SEQ, seq);
        let now = now_ns();
        r.set64(sl + e::VALUE_LEN, value_len as u64);
        r.set64(sl + e::CREATED_NS, now);
        r.set64(
            sl + e::EXPIRES_NS,
            ttl_ns.map_or(0, |t| now.saturating_add(t)),
        );
    }

    fn touch_new(&self, slot: u32) {
        let tick = self.region.get64(h::ACCESS_TICK).wrapping_add(1);
        self.region.set64(h::ACCESS_TICK, tick);
        self.region
            .set64(self.layout.slot(slot) + e::LAST_ACCESS, tick);
        self.lru_push_head(slot);
    }

    fn get(this: &Arc<Shared>, key: &[u8]) -> Result<Option<Bytes>> {
        let r = &this.region;
        let found = this.locked(|me| {
            let Some((bucket, slot)) = this.lookup(key) else {
                r.add64(h::MISSES, 1);
                return Ok(None);
            };
            if this.expired(slot, now_ns()) {
                this.expire(slot, bucket);
                r.add64(h::MISSES, 1);
                return Ok(None);
            }
            let (off, len) = this.value_range(slot)?;
            let seq = this.pin(slot, me);
            this.touch(slot);
            r.add64(h::HITS, 1);
            Ok(Some((slot, seq, off, len)))
        })?;
        Ok(found.map(|(slot, seq, off, len)| {
            Bytes::from_owner(Pinned {
                shared: Arc::clone(this),
                slot,
                seq,
                addr: this.region.addr(off),
                len,
            })
        }))
    }

    /// One more view of entry `slot`; returns the entry's sequence number, which the
    /// view gives back to [`Shared::unpin`]. Lock held.
    fn pin(&self, slot: u32, me: usize) -> u64 {
        let mut local = self.me.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.region.get64(self.layout.slot(slot) + e::SEQ);
        let (count, _) = local.pins.entry(slot).or_insert((0, seq));
        *count += 1;
        if *count == 1 {
            self.set_pin_bit(slot, me);
        }
        // A view taken between `prepare_fork` and the fork: the child inherits it.
        if let Some(child) = local.for_child.as_mut() {
            if child.claimant.is_none() && child.entries.insert(slot) {
                self.set_pin_bit(slot, child.slot);
            }
        }
        seq
    }

    fn unpin(&self, slot: u32, seq: u64) {
        let released = self.locked(|me| {
            self.unpin_locked(slot, seq, me);
            Ok(())
        });
        if released.is_err() {
            // The lock could not be taken (a timeout; `f` never ran): the next
            // operation that takes it releases the pin.
            let mut local = self.me.lock().unwrap_or_else(|p| p.into_inner());
            local.pending_unpins.push((slot, seq));
        }
    }

    /// One view of entry `slot`, pinned at sequence number `seq`, gone: its local
    /// count down, and the pin bits cleared with the last. A view whose pin this
    /// process no longer counts (one inherited by a forked child whose entry changed
    /// before the child registered: [`Shared::register`] forgot it) releases
    /// nothing, so it never takes the pin of a later view of the reused slot. Lock
    /// held.
    fn unpin_locked(&self, slot: u32, seq: u64, me: usize) {
        let mut local = self.me.lock().unwrap_or_else(|p| p.into_inner());
        let Some((count, pinned_seq)) = local.pins.get_mut(&slot) else {
            return;
        };
        if *pinned_seq != seq {
            return;
        }
        *count -= 1;
        if *count > 0 {
            return;
        }
        local.pins.remove(&slot);
        // Gone before the fork: the child will not have it either.
        let mut child = None;
        if let Some(c) = local.for_child.as_mut() {
            if c.claimant.is_none() && c.entries.remove(&slot) {
                child = Some(c.slot);
            }
        }
        drop(local);
        self.clear_pin_bit(slot, me);
        if let Some(child_slot) = child {
            self.clear_pin_bit(slot, child_slot);
        }
    }
}

fn check_written(n: usize, len: usize) -> Result<usize> {
    if n > len {
        return Err(Error::invalid(format!(
            "wrote {n} bytes into a {len}-byte cache block"
        )));
    }
    Ok(n)
}

/// The owner behind a [`TensorCache::get`] view: keeps the entry pinned (its bytes
/// unchanged and not freed) until dropped.
struct Pinned {
    shared: Arc<Shared>,
    slot: u32,
    /// The entry's sequence number when pinned.
    seq: u64,
    addr: usize,
    len: usize,
}

impl Owner for Pinned {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `addr..addr+len` is the entry's value inside the segment (checked by
        // `value_range`), mapped while `shared` lives; the pin this value holds keeps
        // every process from writing or freeing the block (writers copy on write,
        // deleters retire the slot) until `drop` below.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.shared.unpin(self.slot, self.seq);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle of the pool in this process detaches: frees the process's
        // registry slot (its pins are all gone: every pinned view holds an `Arc` to
        // its handle).
        let last = {
            let mut me = self.me.lock().unwrap_or_else(PoisonError::into_inner);
            me.handles = me.handles.saturating_sub(1);
            me.handles == 0 && me.pid == std::process::id()
        };
        if !last {
            return;
        }
        if let Ok(mut guard) = self.mutex.lock(Some(self.options.lock_timeout)) {
            if self.repair_if_needed(&mut guard).is_ok() {
                // Under the lock, as `register` takes it: a handle opened meanwhile
                // keeps the slot (and only this process's own slot is freed, never
                // the parent's slot a forked child that never registered still
                // names). Nothing pins while the lock is held.
                let slot = {
                    let me = self.me.lock().unwrap_or_else(PoisonError::into_inner);
                    (me.handles == 0 && me.pid == std::process::id()).then_some(me.slot)
                };
                if let Some(slot) = slot {
                    // Views that went while the lock was busy left their pins pending;
                    // no view is left now (each holds this handle), so no pin of this
                    // process is either: none may outlive its registry slot.
                    self.release_pending_unpins(slot);
                    self.clear_process_pins(slot);
                    self.write_registered(slot, [0, 0]);
                    self.me.lock().unwrap_or_else(PoisonError::into_inner).pid = 0;
                }
            }
        }
    }
}

impl std::fmt::Debug for TensorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorCache")
            .field("name", &self.shared.name)
            .field("layout", &self.shared.layout)
            .finish()
    }
}
