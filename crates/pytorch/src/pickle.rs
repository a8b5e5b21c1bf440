//! A pickle virtual machine that builds values and executes nothing.
//!
//! It understands the opcodes of protocols 0–5. Objects live in an arena and the stack,
//! memo and containers hold their ids, so a memoized container that is filled after
//! it was memoized (torch memoizes each dict before its `SETITEMS`) is the same filled
//! object wherever it is referenced again. `GLOBAL`/`STACK_GLOBAL` resolve only
//! against [`crate::globals`]' allowlist; calls (`REDUCE`, `NEWOBJ`, `INST`, `OBJ`)
//! are interpreted by that module too, never executed. Every count, length and depth
//! is checked against [`PickleLimits`] before anything is allocated.

use std::collections::HashMap;
use std::sync::Arc;

use tensorwire_core::{BigInt, Error, NameMap, Result};

use crate::globals::{self, Global};
use crate::sparse::SparseTensor;
use crate::tensor::{MetaTensor, StorageRef, TensorRecord};

/// Index of an object in the [`Arena`].
pub type Id = usize;

/// The id of the shared `None` object.
pub const NONE: Id = 0;
const TRUE: Id = 1;
const FALSE: Id = 2;

/// Bounds the machine enforces on untrusted pickles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PickleLimits {
    /// Most objects created by one pickle.
    pub max_objects: usize,
    /// Most memo entries.
    pub max_memo: usize,
    /// Deepest value stack (marks included).
    pub max_stack: usize,
}

impl Default for PickleLimits {
    fn default() -> Self {
        PickleLimits {
            max_objects: 1 << 24,
            max_memo: 1 << 24,
            max_stack: 1 << 16,
        }
    }
}

/// The container-item and text budgets of a small pickle (see [`Arena::alloc`]).
const MIN_AMPLIFICATION_BUDGET: usize = 1 << 20;

/// One value built by a pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer that fits 64 bits.
    Int(i64),
    /// A wider integer (9 to 16 bytes), little-endian two's complement: the legacy
    /// format's magic number, or a value such as a 64-bit seed above `i64::MAX`.
    /// Sizes, strides and offsets refuse it.
    WideInt(Box<[u8]>),
    /// A float.
    Float(f64),
    /// A complex number (`builtins.complex`): real and imaginary parts.
    Complex(f64, f64),
    /// A str (shared: a memoized str referenced again costs no copy).
    Str(Arc<str>),
    /// bytes.
    Bytes(Box<[u8]>),
    /// A bytearray (`torch.load` gives one back, mutable, where `bytes` is not).
    ByteArray(Box<[u8]>),
    /// A list.
    List(Vec<Id>),
    /// A tuple: its items are [`Arena::items`] (tuples are immutable, so they live
    /// in one buffer shared by all tuples, and a copy of a tuple shares its items).
    Tuple(Span),
    /// A `torch.Size`: its sizes (torch's tuple of ints, which `torch.load` gives
    /// back as a `torch.Size`).
    Size(Box<[i64]>),
    /// A `torch.device`, as its text (`"cuda:0"`, `"cpu"`).
    Device(Arc<str>),
    /// A dict, items in insertion order.
    Dict {
        /// Key and value ids, in insertion order.
        items: Vec<(Id, Id)>,
        /// Which dict class.
        kind: DictKind,
    },
    /// A set.
    Set(Vec<Id>),
    /// A frozenset (built whole: `ADDITEMS` applies to sets only).
    FrozenSet(Vec<Id>),
    /// An allowlisted global (function, class or dtype).
    Global(Global),
    /// A storage named by a persistent id (see [`Arena::storage`]).
    Storage(StorageId),
    /// A tensor rebuilt by one of torch's rebuild functions.
    Tensor(Box<TensorRecord>),
    /// A sparse tensor (`_rebuild_sparse_tensor`).
    Sparse(Box<SparseTensor>),
    /// A tensor on the meta device, which holds no data.
    Meta(Box<MetaTensor>),
}

/// The class of a pickled dict: `torch.load` gives back the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DictKind {
    /// `dict`.
    Dict,
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `collections.Counter`.
    Counter,
}

impl Obj {
    /// Whether this is a mutable container (list, dict, set, bytearray): Python cannot
    /// hash one, so it can be no dict key or set item.
    pub fn is_unhashable(&self) -> bool {
        matches!(
            self,
            Obj::List(_) | Obj::Dict { .. } | Obj::Set(_) | Obj::ByteArray(_)
        )
    }

    /// The error for this [`Obj::is_unhashable`] object where Python hashes (`place`:
    /// "a dict key is", "a set item holds"), at `offset`: torch.load fails on it too.
    pub(crate) fn unhashable_error(&self, place: &str, offset: u64) -> Error {
        malformed(
            offset,
            format!(
                "{place} a {}, which Python cannot hash (torch.load fails on it too)",
                self.kind()
            ),
        )
    }

    /// A short type name for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Obj::None => "None",
            Obj::Bool(_) => "bool",
            Obj::Int(_) | Obj::WideInt(_) => "int",
            Obj::Float(_) => "float",
            Obj::Complex(..) => "complex",
            Obj::Str(_) => "str",
            Obj::Bytes(_) => "bytes",
            Obj::List(_) => "list",
            Obj::Tuple(_) => "tuple",
            Obj::Size(_) => "torch.Size",
            Obj::Device(_) => "torch.device",
            Obj::Dict { .. } => "dict",
            Obj::Set(_) => "set",
            Obj::FrozenSet(_) => "frozenset",
            Obj::ByteArray(_) => "bytearray",
            Obj::Global(_) => "global",
            Obj::Storage(_) => "storage",
            Obj::Tensor(_) => "tensor",
            Obj::Sparse(_) => "sparse tensor",
            Obj::Meta(_) => "meta tensor",
        }
    }
}

impl Obj {
    /// Items held by a container (0 for anything else): what the arena's item
    /// budget counts, so calls that copy containers cannot amplify a small pickle.
    fn slots(&self) -> usize {
        match self {
            Obj::List(items) | Obj::Set(items) | Obj::FrozenSet(items) => items.len(),
            Obj::Tuple(span) => span.len,
            Obj::Size(dims) => dims.len(),
            Obj::Dict { items, .. } => items.len() * 2,
            _ => 0,
        }
    }

    /// Bytes of a str or bytes object (0 for anything else): what the arena's text
    /// budget counts.
    fn text_len(&self) -> usize {
        match self {
            Obj::Str(s) | Obj::Device(s) => s.len(),
            Obj::Bytes(b) | Obj::ByteArray(b) | Obj::WideInt(b) => b.len(),
            _ => 0,
        }
    }
}

/// Which of its arena's storages an [`Obj::Storage`] is. Only the machine makes
/// these, as it runs a persistent id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageId(usize);

/// Where a tuple's items lie in its arena's shared item buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: usize,
    len: usize,
}

impl Span {
    /// The empty tuple's items.
    pub const EMPTY: Span = Span { start: 0, len: 0 };

    /// Number of items.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for the empty tuple.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The objects one pickle built.
#[derive(Debug)]
pub struct Arena {
    objects: Vec<Obj>,
    /// The storages of [`Obj::Storage`] objects (kept apart, so objects stay small).
    storages: Vec<StorageRef>,
    /// The items of every tuple, back to back.
    tuple_items: Vec<Id>,
    /// Items held by the containers made so far (see [`Obj::slots`]).
    slots: usize,
    max_slots: usize,
    max_objects: usize,
    /// Bytes of every str and bytes object made so far (see [`Obj::text_len`]).
    text_bytes: usize,
    max_text_bytes: usize,
    /// The attributes `BUILD` gave an `OrderedDict` (its `__dict__`: the
    /// `_metadata` of a state dict), by the dict's id: the id of a str-keyed dict.
    attributes: HashMap<Id, Id>,
}

impl Arena {
    fn new(max_objects: usize, max_slots: usize, max_text_bytes: usize) -> Arena {
        Arena {
            objects: vec![Obj::None, Obj::Bool(true), Obj::Bool(false)],
            storages: Vec::new(),
            tuple_items: Vec::new(),
            slots: 0,
            max_slots,
            max_objects,
            text_bytes: 0,
            max_text_bytes,
            attributes: HashMap::new(),
        }
    }

    /// The attributes (a dict of str keys) that `BUILD` set on the `OrderedDict`
    /// `id`, as `torch.load` sets them (`state_dict()`'s `_metadata`).
    pub fn attributes(&self, id: Id) -> Option<Id> {
        self.attributes.get(&id).copied()
    }

    /// The object with id `id`.
    pub fn get(&self, id: Id) -> &Obj {
        &self.objects[id]
    }

    /// The storage of an [`Obj::Storage`] of this arena (`None` for an id from
    /// another arena that this one does not have).
    pub fn storage(&self, id: StorageId) -> Option<&StorageRef> {
        self.storages.get(id.0)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Bytes held by the str and bytes objects (what copying every text once costs).
    pub fn text_bytes(&self) -> u64 {
        self.text_bytes as u64
    }

    /// True when only the shared constants exist.
    pub fn is_empty(&self) -> bool {
        self.objects.len() <= 3
    }

    /// Adds an object, failing past the object limit, when the items of all
    /// containers made so far pass it too, or when the text made so far passes its
    /// own limit (calls such as `_codecs.encode` copy text, so a small pickle could
    /// otherwise make far more of it than it holds).
    pub fn alloc(&mut self, obj: Obj) -> Result<Id> {
        Error::check_limit(
            "pickle object count",
            self.objects.len() as u64 + 1,
            self.max_objects as u64,
        )?;
        self.charge(obj.slots())?;
        self.text_bytes = self.text_bytes.saturating_add(obj.text_len());
        Error::check_limit(
            "pickle text bytes (str and bytes objects)",
            self.text_bytes as u64,
            self.max_text_bytes as u64,
        )?;
        self.objects.push(obj);
        Ok(self.objects.len() - 1)
    }

    /// Counts `n` more container items against the limit.
    fn charge(&mut self, n: usize) -> Result<()> {
        self.slots = self.slots.saturating_add(n);
        Error::check_limit(
            "pickle container items",
            self.slots as u64,
            self.max_slots as u64,
        )
    }

    /// A new tuple of `items` (not yet an object: [`Arena::alloc`] it).
    pub fn tuple(&mut self, items: &[Id]) -> Obj {
        let span = Span {
            start: self.tuple_items.len(),
            len: items.len(),
        };
        self.tuple_items.extend_from_slice(items);
        Obj::Tuple(span)
    }

    fn get_mut(&mut self, id: Id) -> &mut Obj {
        &mut self.objects[id]
    }

    /// The items of a tuple or list.
    pub fn items(&self, id: Id) -> Option<&[Id]> {
        match self.get(id) {
            Obj::Tuple(span) => Some(self.tuple_items(*span)),
            Obj::List(items) => Some(items),
            _ => None,
        }
    }

    /// The items of a tuple.
    pub fn tuple_items(&self, span: Span) -> &[Id] {
        &self.tuple_items[span.start..span.start + span.len]
    }
}

/// Turns a persistent id (the object `BINPERSID` pops) into the storage it names.
pub trait PersistentLoad {
    /// Resolves `pid`, an object of `arena`, at pickle offset `offset`.
    fn load(&mut self, arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef>;
}

/// The result of running one pickle.
#[derive(Debug)]
pub struct Unpickled {
    /// Every object the pickle built.
    pub arena: Arena,
    /// The value `STOP` returned.
    pub root: Id,
    /// Bytes consumed, `STOP` included.
    pub consumed: usize,
}

/// Runs the pickle at the start of `data` (more bytes may follow it). `base` is the
/// offset of `data` in its file, for error messages.
pub fn unpickle(
    data: &[u8],
    base: u64,
    limits: &PickleLimits,
    persistent: &mut dyn PersistentLoad,
) -> Result<Unpickled> {
    // Each container item takes at least one opcode byte, and text read from the
    // pickle is at most twice its bytes once decoded (latin-1 to UTF-8); calls that
    // copy containers (`torch.Size(list)`) or text (`_codecs.encode`, `bytearray`)
    // may add as much again. Anything past that is amplification.
    let budget = data.len().saturating_mul(4).max(MIN_AMPLIFICATION_BUDGET);
    let mut arena = Arena::new(limits.max_objects, budget.min(limits.max_objects), budget);
    // Torch pickles make about one object per 7.5 bytes; reserving one per 6 avoids
    // regrowing (objects are 32 bytes, so this is at most about 5× the pickle).
    arena
        .objects
        .reserve((data.len() / 6).min(limits.max_objects));
    let mut vm = Machine {
        input: Input { data, pos: 0, base },
        arena,
        stack: Vec::with_capacity(64),
        marks: Vec::with_capacity(16),
        // Torch pickles memoize about one object per 15 bytes.
        memo: Memo::with_capacity((data.len() / 12).min(limits.max_memo)),
        limits: *limits,
        ints: IntCache::new(),
    };
    let root = vm.run(persistent)?;
    Ok(Unpickled {
        consumed: vm.input.pos,
        arena: vm.arena,
        root,
    })
}

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Input<'a> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let available = self.data.len() - self.pos;
        if n > available {
            return Err(Error::Truncated {
                offset: self.offset(),
                needed: n as u64,
                available: available as u64,
            });
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A length-prefixed payload whose length came from the input.
    fn payload(&mut self, len: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(len).map_err(|_| Error::Overflow {
            what: "pickle payload length",
        })?;
        self.take(n)
    }

    /// A protocol-0 line, without its `\n`.
    fn line(&mut self) -> Result<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(Error::Truncated {
                offset: self.offset(),
                needed: rest.len() as u64 + 1,
                available: rest.len() as u64,
            }),
        }
    }
}

/// The memo: picklers number entries 0, 1, 2, … so a vector indexed by key serves
/// them; a key far past the end (only a hand-made pickle has one) goes to a map, so a
/// huge key cannot make the vector huge.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Id>>,
    sparse: NameMap<u64, Id>,
    len: usize,
}

/// How far past the dense part a key may land and still extend it; also how many
/// slots the dense part may hold beyond twice its entries, so that keys spread
/// out on purpose cannot grow it far past what the pickle filled.
const MEMO_DENSE_SLACK: u64 = 1 << 12;

impl Memo {
    fn with_capacity(entries: usize) -> Memo {
        Memo {
            dense: Vec::with_capacity(entries),
            ..Memo::default()
        }
    }

    fn get(&self, key: u64) -> Option<Id> {
        match usize::try_from(key).ok().and_then(|k| self.dense.get(k)) {
            Some(slot) => *slot,
            None => self.sparse.get(&key).copied(),
        }
    }

    /// Sets `key`; returns false when that would exceed `max` entries.
    fn put(&mut self, key: u64, id: Id, max: usize) -> bool {
        let dense_len = self.dense.len() as u64;
        let slot = if key < dense_len {
            &mut self.dense[key as usize]
        } else if key < dense_len + MEMO_DENSE_SLACK
            && key < 2 * self.len as u64 + MEMO_DENSE_SLACK
            && self.sparse.is_empty()
        {
            if key == dense_len {
                // The usual case (picklers number entries 0, 1, 2, …): one push.
                self.dense.push(None);
            } else {
                self.dense.resize(key as usize + 1, None);
            }
            &mut self.dense[key as usize]
        } else {
            if !self.sparse.contains_key(&key) {
                if self.len >= max {
                    return false;
                }
                self.len += 1;
            }
            self.sparse.insert(key, id);
            return true;
        };
        if slot.is_none() {
            if self.len >= max {
                return false;
            }
            self.len += 1;
        }
        *slot = Some(id);
        true
    }
}

struct Machine<'a> {
    input: Input<'a>,
    arena: Arena,
    stack: Vec<Id>,
    /// Stack heights at each `MARK`.
    marks: Vec<usize>,
    memo: Memo,
    limits: PickleLimits,
    /// Recently made ints by value (see [`Machine::int`]).
    ints: IntCache,
}

/// Ints already in the arena, by value: a pickle's ints are immutable values that
/// repeat (every tensor's sizes, strides and offset), so an int equal to a recent
/// one reuses its object instead of making another. A small direct-mapped table: a
/// miss only costs a new object.
struct IntCache {
    slots: [(i64, Id); INT_CACHE_SLOTS],
}

const INT_CACHE_SLOTS: usize = 256;

impl IntCache {
    fn new() -> IntCache {
        // Id 0 is `None`, never an int: an empty slot.
        IntCache {
            slots: [(0, NONE); INT_CACHE_SLOTS],
        }
    }

    fn slot(v: i64) -> usize {
        // Fibonacci hashing: the top 8 bits of the product.
        ((v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize
    }
}

fn malformed(offset: u64, reason: impl Into<String>) -> Error {
    Error::malformed(offset, format!("pickle: {}", reason.into()))
}

fn utf8(bytes: &[u8], offset: u64) -> Result<Arc<str>> {
    std::str::from_utf8(bytes)
        .map(Arc::from)
        .map_err(|_| malformed(offset, "string is not valid UTF-8"))
}

impl Machine<'_> {
    fn push(&mut self, id: Id) -> Result<()> {
        Error::check_limit(
            "pickle stack depth",
            (self.stack.len() + self.marks.len() + 1) as u64,
            self.limits.max_stack as u64,
        )?;
        self.stack.push(id);
        Ok(())
    }

    fn push_new(&mut self, obj: Obj) -> Result<()> {
        let id = self.arena.alloc(obj)?;
        self.push(id)
    }

    fn push_storage(&mut self, storage: StorageRef) -> Result<()> {
        let index = StorageId(self.arena.storages.len());
        let id = self.arena.alloc(Obj::Storage(index))?;
        self.arena.storages.push(storage);
        self.push(id)
    }

    fn pop(&mut self, at: u64) -> Result<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(malformed(at, "stack underflow"));
        }
        Ok(self.stack.pop().expect("checked non-empty"))
    }

    fn top(&self, at: u64) -> Result<Id> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(malformed(at, "stack underflow"));
        }
        Ok(*self.stack.last().expect("checked non-empty"))
    }

    /// Pops everything above the last mark, and the mark.
    fn pop_mark(&mut self, at: u64) -> Result<Vec<Id>> {
        let mark = self.take_mark(at)?;
        Ok(self.stack.split_off(mark))
    }

    /// Pops the last mark, returning the stack height it marked (the caller takes
    /// the items above it).
    fn take_mark(&mut self, at: u64) -> Result<usize> {
        self.marks
            .pop()
            .ok_or_else(|| malformed(at, "no mark on the stack"))
    }

    fn memo_put(&mut self, key: u64, at: u64) -> Result<()> {
        let id = self.top(at)?;
        if !self.memo.put(key, id, self.limits.max_memo) {
            return Err(Error::LimitExceeded {
                what: "pickle memo entries",
                limit: self.limits.max_memo as u64,
                found: self.limits.max_memo as u64 + 1,
            });
        }
        Ok(())
    }

    fn memo_get(&mut self, key: u64, at: u64) -> Result<()> {
        let id = self
            .memo
            .get(key)
            .ok_or_else(|| malformed(at, format!("memo key {key} is not set")))?;
        self.push(id)
    }

    fn int(&mut self, v: i64) -> Result<()> {
        let slot = IntCache::slot(v);
        let (cached, id) = self.ints.slots[slot];
        if id != NONE && cached == v {
            return self.push(id);
        }
        let id = self.arena.alloc(Obj::Int(v))?;
        self.ints.slots[slot] = (v, id);
        self.push(id)
    }

    /// A little-endian two's complement integer of `bytes.len()` bytes.
    fn long(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= 8 {
            let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
            let mut buf = [if negative { 0xff } else { 0 }; 8];
            buf[..bytes.len()].copy_from_slice(bytes);
            return self.int(i64::from_le_bytes(buf));
        }
        // Wider encodings of values that fit 64 bits are not canonical, but accept them.
        let (low, high) = bytes.split_at(8);
        let low_v = i64::from_le_bytes(low.try_into().expect("8 bytes"));
        let sign = if low_v < 0 { 0xff } else { 0 };
        if high.iter().all(|&b| b == sign) {
            return self.int(low_v);
        }
        // Any width Python's int has, up to a limit: the bytes kept in shortest form.
        self.push_new(Obj::WideInt(BigInt::shortest_le_bytes(bytes)?.into()))
    }

    /// An `INT` (`I`) or `LONG` (`L`) line of protocols 0 and 1, as Python's C
    /// unpickler (so `torch.load`) reads it where the two agree on the value: an `I`
    /// line of two characters worth 0 or 1 (`00`, `01`, `+0`, `-0`, `+1`) is a bool,
    /// and one trailing `L` of an `L` line is dropped. Only plain decimal text is
    /// read: Python reads a leading zero as octal (`I010` is 8) or refuses it, `0x`
    /// as hex, and takes spaces and `_`; such lines, which no pickler writes, are
    /// `Unsupported` rather than read as another value.
    fn text_int(&mut self, line: &[u8], at: u64, long: bool) -> Result<()> {
        let text = std::str::from_utf8(line).map_err(|_| malformed(at, "bad INT line"))?;
        let text = match long {
            true => text.strip_suffix('L').unwrap_or(text),
            false => text,
        };
        if !long {
            match text {
                "01" | "+1" => return self.push(TRUE),
                "00" | "+0" | "-0" => return self.push(FALSE),
                _ => {}
            }
        }
        let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !plain {
            return Err(Error::unsupported(format!(
                "pickle integer `{text}` at offset {at} (only plain decimal text is read: \
                 Python reads leading zeros, `0x`, spaces and `_` otherwise)"
            )));
        }
        if let Ok(v) = text.parse::<i64>() {
            return self.int(v);
        }
        // Past 64 bits, as LONG1 holds them.
        let bytes = BigInt::le_bytes_from_decimal(text).expect("plain decimal text")?;
        self.push_new(Obj::WideInt(bytes.into()))
    }

    fn run(&mut self, persistent: &mut dyn PersistentLoad) -> Result<Id> {
        loop {
            let at = self.input.offset();
            let op = self.input.u8()?;
            match op {
                // PROTO
                0x80 => {
                    let proto = self.input.u8()?;
                    if proto > 5 {
                        return Err(Error::unsupported(format!(
                            "pickle protocol {proto} (0 to 5 are supported)"
                        )));
                    }
                }
                // FRAME: a length hint; the whole pickle is in memory already.
                0x95 => {
                    let len = self.input.u64()?;
                    let available = (self.input.data.len() - self.input.pos) as u64;
                    if len > available {
                        return Err(Error::Truncated {
                            offset: self.input.offset(),
                            needed: len,
                            available,
                        });
                    }
                }
                // STOP
                b'.' => {
                    let root = self.pop(at)?;
                    return Ok(root);
                }
                // Integers.
                b'J' => {
                    let v = self.input.i32()?;
                    self.int(v.into())?;
                }
                b'K' => {
                    let v = self.input.u8()?;
                    self.int(v.into())?;
                }
                b'M' => {
                    let v = self.input.u16()?;
                    self.int(v.into())?;
                }
                b'I' | b'L' => {
                    let line = self.input.line()?;
                    self.text_int(line, at, op == b'L')?;
                }
                0x8a => {
                    let n = self.input.u8()?;
                    let bytes = self.input.take(n.into())?;
                    self.long(bytes)?;
                }
                0x8b => {
                    let n = self.input.i32()?;
                    if n < 0 {
                        return Err(malformed(at, "negative LONG4 length"));
                    }
                    let bytes = self.input.payload(n as u64)?;
                    self.long(bytes)?;
                }
                // Floats.
                b'G' => {
                    let v = f64::from_be_bytes(self.input.take(8)?.try_into().expect("8 bytes"));
                    self.push_new(Obj::Float(v))?;
                }
                b'F' => {
                    let line = self.input.line()?;
                    let v: f64 = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or_else(|| malformed(at, "bad FLOAT line"))?;
                    self.push_new(Obj::Float(v))?;
                }
                // Constants.
                b'N' => self.push(NONE)?,
                0x88 => self.push(TRUE)?,
                0x89 => self.push(FALSE)?,
                // Unicode strings.
                b'X' => {
                    let n = self.input.u32()?;
                    let s = utf8(self.input.payload(n.into())?, at)?;
                    self.push_new(Obj::Str(s))?;
                }
                0x8c => {
                    let n = self.input.u8()?;
                    let s = utf8(self.input.take(n.into())?, at)?;
                    self.push_new(Obj::Str(s))?;
                }
                0x8d => {
                    let n = self.input.u64()?;
                    let s = utf8(self.input.payload(n)?, at)?;
                    self.push_new(Obj::Str(s))?;
                }
                b'V' => {
                    let line = self.input.line()?;
                    let s = raw_unicode_escape(line, at)?;
                    self.push_new(Obj::Str(s.into()))?;
                }
                // Byte strings: Python 2 `str`, text as `torch.load` decodes it
                // (`python2_str`).
                b'T' => {
                    let n = self.input.i32()?;
                    if n < 0 {
                        return Err(malformed(at, "negative BINSTRING length"));
                    }
                    let s = python2_str(self.input.payload(n as u64)?);
                    self.push_new(Obj::Str(s.into()))?;
                }
                b'U' => {
                    let n = self.input.u8()?;
                    let s = python2_str(self.input.take(n.into())?);
                    self.push_new(Obj::Str(s.into()))?;
                }
                b'S' => {
                    let line = self.input.line()?;
                    let s = python_string_literal(line, at)?;
                    self.push_new(Obj::Str(python2_str(&s).into()))?;
                }
                b'B' => {
                    let n = self.input.u32()?;
                    let b = self.input.payload(n.into())?;
                    self.push_new(Obj::Bytes(b.into()))?;
                }
                b'C' => {
                    let n = self.input.u8()?;
                    let b = self.input.take(n.into())?;
                    self.push_new(Obj::Bytes(b.into()))?;
                }
                0x8e => {
                    let n = self.input.u64()?;
                    let b = self.input.payload(n)?;
                    self.push_new(Obj::Bytes(b.into()))?;
                }
                0x96 => {
                    let n = self.input.u64()?;
                    let b = self.input.payload(n)?;
                    self.push_new(Obj::ByteArray(b.into()))?;
                }
                // Containers.
                b']' => self.push_new(Obj::List(Vec::new()))?,
                b')' => self.push_new(Obj::Tuple(Span::EMPTY))?,
                b'}' => self.push_new(Obj::Dict {
                    items: Vec::new(),
                    kind: DictKind::Dict,
                })?,
                0x8f => self.push_new(Obj::Set(Vec::new()))?,
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push_new(Obj::List(items))?;
                }
                b't' => {
                    let mark = self.take_mark(at)?;
                    let tuple = self.arena.tuple(&self.stack[mark..]);
                    self.stack.truncate(mark);
                    self.push_new(tuple)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(malformed(at, "stack underflow"));
                    }
                    let start = self.stack.len() - n;
                    let tuple = self.arena.tuple(&self.stack[start..]);
                    self.stack.truncate(start);
                    self.push_new(tuple)?;
                }
                b'd' => {
                    let flat = self.pop_mark(at)?;
                    let items = pairs(&flat, at)?;
                    self.hashable(items.iter().map(|&(key, _)| key), "a dict key", at)?;
                    self.push_new(Obj::Dict {
                        items,
                        kind: DictKind::Dict,
                    })?;
                }
                0x91 => {
                    let items = self.pop_mark(at)?;
                    self.hashable(items.iter().copied(), "a frozenset item", at)?;
                    self.push_new(Obj::FrozenSet(items))?;
                }
                b'a' => {
                    let value = self.pop(at)?;
                    let list = self.top(at)?;
                    self.extend_list(list, &[value], at)?;
                }
                b'e' => {
                    let values = self.pop_mark(at)?;
                    let list = self.top(at)?;
                    self.extend_list(list, &values, at)?;
                }
                b's' => {
                    let value = self.pop(at)?;
                    let key = self.pop(at)?;
                    let dict = self.top(at)?;
                    self.set_items(dict, &[key, value], at)?;
                }
                b'u' => {
                    let flat = self.pop_mark(at)?;
                    let dict = self.top(at)?;
                    self.set_items(dict, &flat, at)?;
                }
                0x90 => {
                    let values = self.pop_mark(at)?;
                    self.hashable(values.iter().copied(), "a set item", at)?;
                    let set = self.top(at)?;
                    match self.arena.get_mut(set) {
                        Obj::Set(items) => items.extend_from_slice(&values),
                        other => {
                            return Err(malformed(at, format!("ADDITEMS on a {}", other.kind())))
                        }
                    }
                }
                // Stack manipulation.
                b'(' => {
                    Error::check_limit(
                        "pickle stack depth",
                        (self.stack.len() + self.marks.len() + 1) as u64,
                        self.limits.max_stack as u64,
                    )?;
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let top = self.top(at)?;
                    self.push(top)?;
                }
                // Memo.
                b'g' => {
                    let key = decimal(self.input.line()?, at)?;
                    self.memo_get(key, at)?;
                }
                b'h' => {
                    let key = self.input.u8()?;
                    self.memo_get(key.into(), at)?;
                }
                b'j' => {
                    let key = self.input.u32()?;
                    self.memo_get(key.into(), at)?;
                }
                b'p' => {
                    let key = decimal(self.input.line()?, at)?;
                    self.memo_put(key, at)?;
                }
                b'q' => {
                    let key = self.input.u8()?;
                    self.memo_put(key.into(), at)?;
                }
                b'r' => {
                    let key = self.input.u32()?;
                    self.memo_put(key.into(), at)?;
                }
                0x94 => {
                    let key = self.memo.len as u64;
                    self.memo_put(key, at)?;
                }
                // Globals and calls.
                b'c' => {
                    let module = self.input.line()?;
                    let name = self.input.line()?;
                    let global = globals::resolve(
                        &String::from_utf8_lossy(module),
                        &String::from_utf8_lossy(name),
                        at,
                    )?;
                    self.push_new(Obj::Global(global))?;
                }
                0x93 => {
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    let (Obj::Str(module), Obj::Str(name)) =
                        (self.arena.get(module), self.arena.get(name))
                    else {
                        return Err(malformed(at, "STACK_GLOBAL needs two strings"));
                    };
                    let global = globals::resolve(module, name, at)?;
                    self.push_new(Obj::Global(global))?;
                }
                b'R' => {
                    let args = self.pop(at)?;
                    let callable = self.pop(at)?;
                    let obj = globals::call(&self.arena, callable, args, at)?;
                    self.push_new(obj)?;
                }
                0x81 => {
                    let args = self.pop(at)?;
                    let class = self.pop(at)?;
                    let obj = globals::call(&self.arena, class, args, at)?;
                    self.push_new(obj)?;
                }
                0x92 => {
                    let kwargs = self.pop(at)?;
                    let args = self.pop(at)?;
                    let class = self.pop(at)?;
                    match self.arena.get(kwargs) {
                        Obj::Dict { items, .. } if items.is_empty() => {}
                        _ => {
                            return Err(Error::unsupported(format!(
                                "NEWOBJ_EX with keyword arguments at offset {at}"
                            )))
                        }
                    }
                    let obj = globals::call(&self.arena, class, args, at)?;
                    self.push_new(obj)?;
                }
                b'i' => {
                    let module = self.input.line()?;
                    let name = self.input.line()?;
                    let global = globals::resolve(
                        &String::from_utf8_lossy(module),
                        &String::from_utf8_lossy(name),
                        at,
                    )?;
                    let mark = self.take_mark(at)?;
                    let args = self.arena.tuple(&self.stack[mark..]);
                    self.stack.truncate(mark);
                    let class = self.arena.alloc(Obj::Global(global))?;
                    let args = self.arena.alloc(args)?;
                    let obj = globals::call(&self.arena, class, args, at)?;
                    self.push_new(obj)?;
                }
                b'o' => {
                    let mark = self.take_mark(at)?;
                    let Some(&class) = self.stack.get(mark) else {
                        return Err(malformed(at, "OBJ without a class"));
                    };
                    let args = self.arena.tuple(&self.stack[mark + 1..]);
                    self.stack.truncate(mark);
                    let args = self.arena.alloc(args)?;
                    let obj = globals::call(&self.arena, class, args, at)?;
                    self.push_new(obj)?;
                }
                b'b' => {
                    let state = self.pop(at)?;
                    let target = self.top(at)?;
                    if let Some(attributes) = globals::build(&self.arena, target, state, at)? {
                        // One BUILD per object, as pickle writes it (a second would
                        // update the first's attributes in Python).
                        if self.arena.attributes.insert(target, attributes).is_some() {
                            return Err(malformed(at, "a second BUILD of one OrderedDict"));
                        }
                    }
                }
                // Persistent ids: torch's storages.
                b'Q' => {
                    let pid = self.pop(at)?;
                    let storage = persistent.load(&self.arena, pid, at)?;
                    self.push_storage(storage)?;
                }
                b'P' => {
                    let line = self.input.line()?;
                    let pid = self.arena.alloc(Obj::Str(utf8(line, at)?))?;
                    let storage = persistent.load(&self.arena, pid, at)?;
                    self.push_storage(storage)?;
                }
                0x82..=0x84 => {
                    return Err(Error::unsupported(format!(
                        "pickle extension registry opcode (EXT) at offset {at}"
                    )))
                }
                0x97 | 0x98 => {
                    return Err(Error::unsupported(format!(
                        "pickle out-of-band buffer opcode at offset {at}"
                    )))
                }
                other => {
                    return Err(malformed(at, format!("unknown opcode 0x{other:02x}")));
                }
            }
        }
    }

    fn extend_list(&mut self, list: Id, values: &[Id], at: u64) -> Result<()> {
        self.arena.charge(values.len())?;
        match self.arena.get_mut(list) {
            Obj::List(items) => {
                items.extend_from_slice(values);
                Ok(())
            }
            other => Err(malformed(at, format!("APPEND on a {}", other.kind()))),
        }
    }

    /// Fails, as Python's unpickler does, when a dict key or set item is a mutable
    /// container ([`Obj::is_unhashable`]). Tuples holding one are caught where keys
    /// are read (`flatten`).
    fn hashable(&self, ids: impl Iterator<Item = Id>, what: &str, at: u64) -> Result<()> {
        match ids
            .map(|id| self.arena.get(id))
            .find(|obj| obj.is_unhashable())
        {
            Some(obj) => Err(obj.unhashable_error(&format!("{what} is"), at)),
            None => Ok(()),
        }
    }

    fn set_items(&mut self, dict: Id, flat: &[Id], at: u64) -> Result<()> {
        let new = pairs(flat, at)?;
        self.hashable(new.iter().map(|&(key, _)| key), "a dict key", at)?;
        self.arena.charge(flat.len())?;
        match self.arena.get_mut(dict) {
            Obj::Dict { items, .. } => {
                items.extend(new);
                Ok(())
            }
            other => Err(malformed(at, format!("SETITEM on a {}", other.kind()))),
        }
    }
}

fn pairs(flat: &[Id], at: u64) -> Result<Vec<(Id, Id)>> {
    if flat.len() % 2 != 0 {
        return Err(malformed(at, "odd number of items for a dict"));
    }
    Ok(flat.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
}

fn decimal(line: &[u8], at: u64) -> Result<u64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| malformed(at, "bad memo key"))
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// A Python 2 byte string (`BINSTRING`, `SHORT_BINSTRING`, `STRING`) as the text
/// `torch.load` makes of it: decoded as UTF-8 (its default `encoding="utf-8"`). Bytes
/// that are not UTF-8, on which `torch.load` fails, decode as latin-1, as
/// `torch.load(f, encoding="latin1")` gives them.
fn python2_str(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => latin1(bytes),
    }
}

/// Decodes the argument of protocol 0's `UNICODE` (raw-unicode-escape).
fn raw_unicode_escape(line: &[u8], at: u64) -> Result<String> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
            let width = if line[i + 1] == b'u' { 4 } else { 8 };
            let hex = line
                .get(i + 2..i + 2 + width)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
                .ok_or_else(|| malformed(at, "bad \\u escape in UNICODE"))?;
            out.push(hex);
            i += 2 + width;
        } else {
            out.push(char::from(b));
            i += 1;
        }
    }
    Ok(out)
}

/// Decodes the quoted Python 2 string literal of protocol 0's `STRING`.
fn python_string_literal(line: &[u8], at: u64) -> Result<Vec<u8>> {
    let bad = || malformed(at, "bad STRING literal");
    let (&quote, rest) = line.split_first().ok_or_else(bad)?;
    if quote != b'\'' && quote != b'"' || rest.last() != Some(&quote) {
        return Err(bad());
    }
    let body = &rest[..rest.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let esc = *body.get(i + 1).ok_or_else(bad)?;
        i += 2;
        match esc {
            b'\\' | b'\'' | b'"' => out.push(esc),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0' => out.push(0),
            b'x' => {
                let hex = body
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(bad)?;
                out.push(hex);
                i += 2;
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoPersistent;
    impl PersistentLoad for NoPersistent {
        fn load(&mut self, _: &Arena, _: Id, at: u64) -> Result<StorageRef> {
            Err(malformed(at, "no persistent ids here"))
        }
    }

    fn run(data: &[u8]) -> Result<Unpickled> {
        unpickle(data, 0, &PickleLimits::default(), &mut NoPersistent)
    }

    /// The objects of the tuple or list the pickle returned.
    fn items_of(u: &Unpickled) -> Vec<Obj> {
        let items = u.arena.items(u.root).unwrap();
        items.iter().map(|&i| u.arena.get(i).clone()).collect()
    }

    #[test]
    fn mutable_containers_are_refused_where_python_hashes() {
        for (pickle, what) in [
            (&b"\x80\x02}(]K\x01u."[..], "a dict key is a list"), // SETITEMS
            (b"\x80\x02}}K\x01s.", "a dict key is a dict"),       // SETITEM
            (b"\x80\x02(]K\x01d.", "a dict key is a list"),       // DICT
            (b"\x80\x04\x8f(]\x90.", "a set item is a list"),     // ADDITEMS
            (b"\x80\x04(\x8f\x91.", "a frozenset item is a set"), // FROZENSET
        ] {
            let err = run(pickle).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        }
    }

    #[test]
    fn frozensets_are_built_whole_and_bytearrays_kept_apart_from_bytes() {
        // (frozenset({1}), bytearray(b'ab'), b'ab') at protocol 5.
        let u =
            run(b"\x80\x05(K\x01\x91\x96\x02\x00\x00\x00\x00\x00\x00\x00abC\x02ab\x87.").unwrap();
        let items = items_of(&u);
        assert!(matches!(&items[0], Obj::FrozenSet(set) if set.len() == 1));
        assert!(matches!(&items[1], Obj::ByteArray(b) if &b[..] == b"ab"));
        assert!(matches!(&items[2], Obj::Bytes(b) if &b[..] == b"ab"));
        // ADDITEMS adds to a set, never to a frozenset (Python refuses it too).
        let err = run(b"\x80\x04(K\x01\x91(K\x02\x90.").unwrap_err();
        assert!(err.to_string().contains("ADDITEMS on a frozenset"), "{err}");
        let u = run(b"\x80\x04\x8f(K\x02\x90.").unwrap();
        assert!(matches!(u.arena.get(u.root), Obj::Set(set) if set.len() == 1));
    }

    #[test]
    fn memoized_dict_is_shared_after_it_is_filled() {
        // {} memoized as 0, then [d, d] where d is filled after being memoized:
        // `\x80\x02]q\x00(}q\x01(X\x01\x00\x00\x00aK\x01uh\x01e.`
        let data = b"\x80\x02]q\x00(}q\x01(X\x01\x00\x00\x00aK\x01uh\x01e.";
        let u = run(data).unwrap();
        let items = u.arena.items(u.root).unwrap().to_vec();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
        match u.arena.get(items[1]) {
            Obj::Dict { items, .. } => assert_eq!(items.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn integers_of_every_encoding() {
        let u = run(b"\x80\x02(J\xff\xff\xff\xffK\x07M\x00\x01\x8a\x02\x00\x80\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xffI42\nL-5L\nt.").unwrap();
        let got = items_of(&u);
        assert_eq!(
            got,
            vec![
                Obj::Int(-1),
                Obj::Int(7),
                Obj::Int(256),
                Obj::Int(-32768),
                Obj::Int(-1),
                Obj::Int(42),
                Obj::Int(-5)
            ]
        );
    }

    #[test]
    fn integers_past_64_bits_are_values_of_any_width_up_to_the_limit() {
        // Protocols 0 and 1 write them as `I`/`L` lines: 2**64 + 1, -2**70, 2**127 - 1,
        // -2**127, 2**127 (a numpy PCG64 state can be this large), -2**127 - 1, 2**200.
        let u = run(b"(L18446744073709551617L\nI-1180591620717411303424\n\
              L170141183460469231731687303715884105727L\n\
              L-170141183460469231731687303715884105728L\n\
              L170141183460469231731687303715884105728L\n\
              I-170141183460469231731687303715884105729\n\
              I1606938044258990275541962092341162602522202993782792835301376\nt.")
        .unwrap();
        let got: Vec<String> = items_of(&u)
            .iter()
            .map(|o| match o {
                Obj::WideInt(b) => {
                    assert!(b.len() >= 9, "{b:?}");
                    BigInt::value_from_le_bytes(b).unwrap().to_string()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                ((1i128 << 64) + 1).to_string(),
                (-(1i128 << 70)).to_string(),
                i128::MAX.to_string(),
                i128::MIN.to_string(),
                "170141183460469231731687303715884105728".into(),
                "-170141183460469231731687303715884105729".into(),
                "1606938044258990275541962092341162602522202993782792835301376".into(),
            ]
        );
        let Obj::WideInt(two_127) = &items_of(&u)[4] else {
            panic!("not a wide int")
        };
        assert!(matches!(
            BigInt::value_from_le_bytes(two_127),
            Ok(tensorwire_core::Value::BigInt(_))
        ));
        // LONG1 gives an equal object, in the text's shortest form; so does LONG4 with
        // sign bytes to spare.
        let long1 = run(b"\x80\x02\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
        let text = run(b"L18446744073709551617L\n.").unwrap();
        assert_eq!(long1.arena.get(long1.root), text.arena.get(text.root));
        let mut padded = b"\x80\x02\x8b\x40\x00\x00\x00".to_vec();
        padded.extend([1, 0, 0, 0, 0, 0, 0, 0, 1]);
        padded.extend([0; 64 - 9]);
        padded.push(b'.');
        let padded = run(&padded).unwrap();
        assert_eq!(padded.arena.get(padded.root), text.arena.get(text.root));
        // 2**127 as LONG1: 17 bytes, as Python writes it.
        let mut long1 = b"\x80\x02\x8a\x11".to_vec();
        long1.extend([0; 15]);
        long1.extend([0x80, 0, b'.']);
        let long1 = run(&long1).unwrap();
        let text = run(b"L170141183460469231731687303715884105728L\n.").unwrap();
        assert_eq!(long1.arena.get(long1.root), text.arena.get(text.root));
        // Past the limit (255 bytes, the most LONG1 holds; 614 digits): refused,
        // before any arithmetic.
        let mut wide = b"\x80\x02\x8b\x00\x01\x00\x00".to_vec();
        wide.extend([0x11; 0x100]);
        wide.push(b'.');
        let digits = format!("L{}L\n.", "7".repeat(615));
        for pickle in [&wide[..], digits.as_bytes()] {
            let err = run(pickle).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported { .. }) && err.to_string().contains("2040 bits"),
                "{err}"
            );
        }
        let mut widest = b"\x80\x02\x8a\xff".to_vec();
        widest.extend([0x11; 0xff]);
        widest.push(b'.');
        run(&widest).unwrap();
    }

    #[test]
    fn text_integers_read_as_pythons_c_unpickler_reads_them_or_not_at_all() {
        // Two-character INT lines worth 0 or 1 are bools; one `L` is dropped from a
        // LONG line; `+` is a sign.
        for (line, want) in [
            (&b"I01\n."[..], Obj::Bool(true)),
            (b"I+1\n.", Obj::Bool(true)),
            (b"I00\n.", Obj::Bool(false)),
            (b"I-0\n.", Obj::Bool(false)),
            (b"I+0\n.", Obj::Bool(false)),
            (b"I0\n.", Obj::Int(0)),
            (b"I1\n.", Obj::Int(1)),
            (b"I-1\n.", Obj::Int(-1)),
            (b"I+25\n.", Obj::Int(25)),
            (b"L-0L\n.", Obj::Int(0)),
            (b"L7\n.", Obj::Int(7)),
        ] {
            let u = run(line).unwrap();
            assert_eq!(
                u.arena.get(u.root),
                &want,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
        // Python reads these as other values (octal: `I010` is 8) or refuses them.
        for line in [
            &b"I010\n."[..],
            b"I0777777777777777777777\n.",
            b"L00L\n.",
            b"I12L\n.",
            b"L12LL\n.",
            b"I0x10\n.",
            b"I 5\n.",
            b"I1_000\n.",
            b"I\n.",
            b"I-\n.",
        ] {
            let err = run(line).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported { .. }) || err.to_string().contains("INT"),
                "{:?}: {err}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn python2_byte_strings_decode_as_torch_load_decodes_them() {
        // UTF-8, as torch.load's default encoding="utf-8": SHORT_BINSTRING, BINSTRING
        // and STRING.
        let cafe = "café".as_bytes();
        let mut p = b"(U".to_vec();
        p.push(cafe.len() as u8);
        p.extend(cafe);
        p.push(b'T');
        p.extend((cafe.len() as i32).to_le_bytes());
        p.extend(cafe);
        p.extend(b"S'caf\\xc3\\xa9'\nt.");
        let u = run(&p).unwrap();
        assert_eq!(items_of(&u), vec![Obj::Str("café".into()); 3]);
        // Not UTF-8 (torch.load fails): latin-1, as encoding="latin1" gives it.
        let u = run(b"(U\x04caf\xe9S'\\xff'\nt.").unwrap();
        assert_eq!(
            items_of(&u),
            vec![Obj::Str("café".into()), Obj::Str("\u{ff}".into())]
        );
    }

    #[test]
    fn repeated_ints_share_objects_and_keep_their_values() {
        // 3 000 ints over 100 values (some of which share a cache slot); each value
        // comes back as written.
        let values: Vec<i64> = (0..3000).map(|i| (i * 37) % 100 - 50).collect();
        let mut data = b"\x80\x02(".to_vec();
        for v in &values {
            data.push(b'J');
            data.extend_from_slice(&(*v as i32).to_le_bytes());
        }
        data.extend_from_slice(b"l.");
        let u = run(&data).unwrap();
        let ids = u.arena.items(u.root).unwrap();
        let got: Vec<i64> = ids
            .iter()
            .map(|&i| match u.arena.get(i) {
                Obj::Int(v) => *v,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, values);
        // Far fewer objects than ints.
        assert!(u.arena.len() < 1_000, "{} objects", u.arena.len());
    }

    #[test]
    fn refuses_what_it_cannot_represent() {
        // EXT1, NEXT_BUFFER.
        assert!(matches!(
            run(b"\x80\x02\x82\x01."),
            Err(Error::Unsupported { .. })
        ));
        assert!(matches!(
            run(b"\x80\x05\x97."),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn refuses_globals_outside_the_allowlist() {
        let err = run(b"cposix\nsystem\n(S'echo hi'\ntR.").unwrap_err();
        assert!(matches!(err, Error::RefusedGlobal { .. }), "{err}");
        assert!(err.to_string().contains("posix.system"), "{err}");
        let err =
            run(b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x8c\x04eval\x93.")
                .unwrap_err();
        assert!(err.to_string().contains("builtins.eval"), "{err}");
    }

    #[test]
    fn malformed_input_gives_typed_errors() {
        for data in [
            &b""[..],
            b"\x80\x02",
            b"\x80\x02.",
            b"\x80\x02h\x05.",
            b"\x80\x02X\xff\xff\xff\xff",
            b"\x80\x02(.",
            b"\x80\x02K\x01K\x02a.",
            b"\x80\x02\xff",
            b"\x80\x09.",
        ] {
            assert!(run(data).is_err(), "{data:?}");
        }
    }

    #[test]
    fn object_and_stack_limits_hold() {
        let limits = PickleLimits {
            max_objects: 100,
            max_memo: 10,
            max_stack: 50,
        };
        let mut many = b"\x80\x02(".to_vec();
        many.extend(std::iter::repeat_n(&b"K\x01"[..], 200).flatten());
        many.extend(b"l.");
        let err = unpickle(&many, 0, &limits, &mut NoPersistent).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
        let mut marks = b"\x80\x02".to_vec();
        marks.extend([b'('; 100]);
        let err = unpickle(&marks, 0, &limits, &mut NoPersistent).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    }

    /// Keys just inside the dense part's reach, one after another, would each
    /// extend it by 4 095 empty slots (64 KiB): 20 000 such 5-byte opcodes asked
    /// for 1.3 GB. The dense part now stays within twice its entries plus the slack.
    #[test]
    fn spread_out_memo_keys_do_not_grow_the_dense_part() {
        let mut memo = Memo::with_capacity(0);
        let keys: Vec<u64> = (1..=20_000u64).map(|i| i * MEMO_DENSE_SLACK - 1).collect();
        for (i, &key) in keys.iter().enumerate() {
            assert!(memo.put(key, i, usize::MAX));
        }
        assert!(
            memo.dense.len() as u64 <= 2 * memo.len as u64 + MEMO_DENSE_SLACK,
            "{} dense slots for {} entries",
            memo.dense.len(),
            memo.len
        );
        for (i, &key) in keys.iter().enumerate() {
            assert_eq!(memo.get(key), Some(i));
        }
    }

    #[test]
    fn memo_keys_in_order_out_of_order_and_far_apart() {
        let mut memo = Memo::with_capacity(2);
        // In order (the pushed fast path), past the reserved capacity.
        for key in 0..5 {
            assert!(memo.put(key, key as Id + 100, 8));
        }
        // Overwriting an entry does not count it again.
        assert!(memo.put(2, 7, 8));
        // A gap within the slack, then a key far past it (kept sparse).
        assert!(memo.put(9, 9, 8));
        assert!(memo.put(1 << 40, 40, 8));
        assert_eq!(memo.len, 7);
        assert_eq!(memo.get(0), Some(100));
        assert_eq!(memo.get(2), Some(7));
        assert_eq!(memo.get(6), None);
        assert_eq!(memo.get(9), Some(9));
        assert_eq!(memo.get(1 << 40), Some(40));
        // The limit holds on every path: next in order, in the dense gap, sparse.
        assert!(memo.put(10, 10, 8));
        assert!(!memo.put(11, 11, 8));
        assert!(!memo.put(6, 6, 8));
        assert!(!memo.put(1 << 41, 41, 8));
        assert!(memo.put(10, 1, 8), "an overwrite needs no room");
        // Once a key went to the map, later keys go there too, and are found.
        assert_eq!(memo.get(10), Some(1));
    }

    #[test]
    fn protocol_zero_strings() {
        let u = run(b"(S'a\\'b\\x41'\nVcaf\\u00e9\np0\ng0\nt.").unwrap();
        let got = items_of(&u);
        assert_eq!(
            got,
            vec![
                Obj::Str("a'bA".into()),
                Obj::Str("café".into()),
                Obj::Str("café".into())
            ]
        );
    }

    /// A pickle that copies one large str again and again through a call (here
    /// `_codecs.encode`) makes few objects but much text: the text budget refuses
    /// it at a few times the pickle's size.
    #[test]
    fn copying_text_through_calls_is_bounded() {
        let text = "x".repeat(1 << 18);
        let mut data = b"\x80\x02X".to_vec();
        data.extend((text.len() as u32).to_le_bytes());
        data.extend(text.as_bytes());
        data.extend(b"q\x00c_codecs\nencode\nq\x01");
        let call = b"h\x01h\x00X\x06\x00\x00\x00latin1\x86R0";
        // Three copies fit the 1 MiB floor (with the text itself); forty do not.
        let mut few = data.clone();
        few.extend(call.repeat(3));
        few.extend(b"N.");
        run(&few).unwrap();
        data.extend(call.repeat(40));
        data.extend(b"N.");
        let err = run(&data).unwrap_err();
        assert!(
            matches!(
                err,
                Error::LimitExceeded {
                    what: "pickle text bytes (str and bytes objects)",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A pickle that copies one large list again and again through a call (here
    /// `torch.Size(list)`) makes few objects but many container items: the item
    /// budget refuses it long before memory runs out.
    #[test]
    fn copying_containers_through_calls_is_bounded() {
        // [1] * 1000, memo 0; torch.Size, memo 1; then `calls` × Size(list).
        let copies = |calls: usize| {
            let mut data = b"\x80\x02]q\x00(".to_vec();
            data.extend(std::iter::repeat_n(&b"K\x01"[..], 1000).flatten());
            data.extend(b"ectorch\nSize\nq\x01");
            data.extend(b"h\x01h\x00\x85R0".repeat(calls));
            data.extend(b"N.");
            data
        };
        let is_item_limit = |err: &Error| {
            matches!(
                err,
                Error::LimitExceeded {
                    what: "pickle container items",
                    ..
                }
            )
        };
        let limits = PickleLimits {
            max_objects: 10_000,
            max_memo: 10,
            max_stack: 5_000,
        };
        let err = unpickle(&copies(50), 0, &limits, &mut NoPersistent).unwrap_err();
        assert!(is_item_limit(&err), "{err}");
        let u = unpickle(&copies(5), 0, &limits, &mut NoPersistent).unwrap();
        assert_eq!(u.arena.get(u.root), &Obj::None);
        // With the default limits, the budget follows the pickle's size: 2 000
        // copies (2 M items from a 16 KB pickle) are refused.
        let err = run(&copies(2000)).unwrap_err();
        assert!(is_item_limit(&err), "{err}");
    }

    #[test]
    fn tuples_of_every_opcode_hold_their_items() {
        // (1,) (1, 2) (1, 2, 3) MARK 1 2 3 4 TUPLE, EMPTY_TUPLE, in a list.
        let u =
            run(b"\x80\x02](K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87(K\x01K\x02K\x03K\x04t)e.")
                .unwrap();
        let tuples = u.arena.items(u.root).unwrap();
        let ints = |id: Id| -> Vec<i64> {
            u.arena
                .items(id)
                .unwrap()
                .iter()
                .map(|&i| match u.arena.get(i) {
                    Obj::Int(n) => *n,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let got: Vec<Vec<i64>> = tuples.iter().map(|&t| ints(t)).collect();
        assert_eq!(
            got,
            vec![vec![1], vec![1, 2], vec![1, 2, 3], vec![1, 2, 3, 4], vec![]]
        );
        // TUPLE2 with one item above the mark is an underflow, not a tuple.
        let err = run(b"\x80\x02K\x01(K\x02\x86.").unwrap_err();
        assert!(err.to_string().contains("underflow"), "{err}");
    }
}
