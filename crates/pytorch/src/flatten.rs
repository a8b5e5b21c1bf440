//! Turning the unpickled object into named tensors and metadata.
//!
//! Dict keys and list/tuple positions join into dotted names
//! (`model.layers.0.weight`, `optimizer.state.0.exp_avg`), as users know them from
//! `state_dict()`. Tensors are leaves. A container holding no tensor at any depth
//! becomes one metadata value (`param_groups.0.betas = [0.9, 0.999]`); other
//! non-tensor leaves become metadata values under their own names.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{BigInt, Error, NameSet, Result, Value};

use crate::pickle::{Arena, DictKind, Id, Obj};
use crate::sparse::{SparseLayout, SparseTensor};
use crate::tensor::{MetaTensor, Quantization, TensorRecord};

/// The name of the tensor when the checkpoint is one bare tensor.
pub const ROOT_TENSOR_NAME: &str = "tensor";

/// The checkpoint object as `torch.load` builds it: containers keep their types and
/// key order, tensors are named as in the flat view (the reader's `tensors()`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Node {
    /// A tensor, by its name among the reader's tensors.
    Tensor(Arc<str>),
    /// A sparse tensor: its name, and its parts (indices and values, in the order of
    /// [`SparseLayout::parts`]) by their names among the reader's tensors.
    Sparse {
        /// The sparse tensor's name (`adj`; its parts are `adj.indices`, ...).
        name: Arc<str>,
        /// The layout.
        layout: SparseLayout,
        /// The parts' names.
        parts: Vec<Arc<str>>,
    },
    /// A tensor on the meta device (no data), by its name among the reader's
    /// [`PtReader::meta_tensors`](crate::PtReader::meta_tensors).
    Meta(Arc<str>),
    /// A scalar: None, bool, int, float, str, bytes, or an allowlisted global outside
    /// torch (`collections.OrderedDict`) by name.
    Value(Value),
    /// A complex number (`builtins.complex`); in the flat view's attributes it is
    /// its text, as Python's `str` writes it (`(1+2j)`).
    Complex {
        /// The real part.
        real: f64,
        /// The imaginary part.
        imag: f64,
    },
    /// An allowlisted global as a value (not called), by its dotted name: a torch
    /// dtype (`torch.float16`), quantization scheme (`torch.per_tensor_affine`),
    /// class (`torch.cuda.FloatTensor`, `torch.nn.parameter.Parameter`) or function,
    /// or a Python class (`collections.OrderedDict`, `builtins.set`).
    Global(&'static str),
    /// A dict, in insertion order.
    Dict {
        /// Keys and values.
        items: Vec<(Node, Node)>,
        /// Which dict class (`OrderedDict` where the checkpoint has one).
        kind: DictKind,
        /// The attributes the checkpoint sets on an `OrderedDict` (`state_dict()`'s
        /// `_metadata`, the modules' versions), by name; they hold no tensors.
        attributes: Vec<(Arc<str>, Node)>,
    },
    /// A list.
    List(Vec<Node>),
    /// A tuple.
    Tuple(Vec<Node>),
    /// A `torch.Size`: its sizes (a list of ints in the flat view's metadata).
    Size(Vec<i64>),
    /// A `torch.device`, as its text (`"cuda:0"`; so in the flat view's metadata).
    Device(Arc<str>),
    /// A set.
    Set(Vec<Node>),
    /// A frozenset.
    FrozenSet(Vec<Node>),
    /// A bytearray (a `bytes` is a [`Node::Value`]).
    ByteArray(Vec<u8>),
    /// A container the checkpoint holds in more than one place (one list, dict,
    /// tuple, set, bytearray, `torch.Size` or `torch.device`, pickled once and
    /// referenced again). Every place has
    /// the whole tree; `torch.load` gives one object for all places with the same
    /// `id`.
    Shared {
        /// Tells shared containers apart (the same within one tree).
        id: u64,
        /// The container.
        node: Box<Node>,
    },
}

impl Node {
    /// The names of the tensor leaves, depth first (the flat view's order); a sparse
    /// tensor's parts stand for it.
    pub fn tensor_names(&self) -> Vec<&Arc<str>> {
        let mut out = Vec::new();
        self.for_each_leaf(&mut |name, meta| {
            if !meta {
                out.push(name)
            }
        });
        out
    }

    /// The names of the meta tensor leaves, depth first.
    pub fn meta_names(&self) -> Vec<&Arc<str>> {
        let mut out = Vec::new();
        self.for_each_leaf(&mut |name, meta| {
            if meta {
                out.push(name)
            }
        });
        out
    }

    /// Calls `f(name, is_meta)` for each tensor leaf (a sparse tensor's parts), depth
    /// first.
    fn for_each_leaf<'a>(&'a self, f: &mut impl FnMut(&'a Arc<str>, bool)) {
        match self {
            Node::Tensor(name) => f(name, false),
            Node::Meta(name) => f(name, true),
            Node::Sparse { parts, .. } => parts.iter().for_each(|p| f(p, false)),
            Node::Value(_)
            | Node::Complex { .. }
            | Node::Global(_)
            | Node::ByteArray(_)
            | Node::Size(_)
            | Node::Device(_) => {}
            Node::Dict { items, .. } => items.iter().for_each(|(_, v)| v.for_each_leaf(f)),
            Node::List(items) | Node::Tuple(items) | Node::Set(items) | Node::FrozenSet(items) => {
                items.iter().for_each(|v| v.for_each_leaf(f))
            }
            Node::Shared { node, .. } => node.for_each_leaf(f),
        }
    }
}

/// What the object holds.
pub struct Flat<'a> {
    /// Tensors, in the order the pickle lists them (a top-level key's name is the
    /// pickle's own str, shared).
    pub tensors: Vec<(Arc<str>, &'a TensorRecord)>,
    /// Non-tensor values.
    pub attributes: BTreeMap<String, Value>,
    /// The sparse tensors: `(name, tensor, position of its first part in `tensors`)`.
    /// Its parts follow one another there, named `<name>.<part>`
    /// ([`SparseLayout::parts`]).
    pub sparse: Vec<(Arc<str>, &'a SparseTensor, usize)>,
    /// The meta tensors (no data, so not in `tensors`): `(name, tensor, the number of
    /// `tensors` listed before it)`.
    pub meta: Vec<(Arc<str>, &'a MetaTensor, usize)>,
}

/// Walks the object from `root`. `max_depth` bounds nesting (and so cycles);
/// `max_tensors` bounds the tensors. Shared sub-objects are visited (and their
/// values copied) once per reference, so the nodes visited and the text copied
/// have budgets in proportion to the arena ([`Budget`]): a small pickle cannot
/// expand into a huge tree.
pub fn flatten(arena: &Arena, root: Id, max_depth: usize, max_tensors: u64) -> Result<Flat<'_>> {
    let mut walker = Walker::new(arena, max_depth, max_tensors);
    walker.visit(root, root_name(arena, root), 0)?;
    Ok(walker.flat)
}

/// The flat name of the object at `root`: a bare tensor is [`ROOT_TENSOR_NAME`];
/// a container's children are named from the empty prefix.
fn root_name(arena: &Arena, root: Id) -> Arc<str> {
    match arena.get(root) {
        Obj::Tensor(_) | Obj::Sparse(_) | Obj::Meta(_) => ROOT_TENSOR_NAME.into(),
        _ => "".into(),
    }
}

/// The object from `root` as a [`Node`] tree, within the same bounds as [`flatten`]
/// (which must have accepted it: tensor names are made the same way).
pub fn structure(arena: &Arena, root: Id, max_depth: usize) -> Result<Node> {
    let mut walker = Walker::new(arena, max_depth, u64::MAX);
    walker.shared = shared_containers(arena, root);
    walker.node(root, root_name(arena, root), 0)
}

/// Which containers (by id) are reached from `root` more than once: an iterative walk
/// that enters each container once, so its cost is linear in the objects. A bytearray
/// counts as one: it is mutable, so `torch.load` gives one object for every place;
/// so do a `torch.Size` and a `torch.device`, which `torch.load` also builds once.
fn shared_containers(arena: &Arena, root: Id) -> Vec<bool> {
    let is_container = |id: Id| {
        matches!(
            arena.get(id),
            Obj::List(_)
                | Obj::Set(_)
                | Obj::FrozenSet(_)
                | Obj::Tuple(_)
                | Obj::Dict { .. }
                | Obj::ByteArray(_)
                | Obj::Size(_)
                | Obj::Device(_)
        )
    };
    let mut seen = vec![false; arena.len()];
    let mut shared = vec![false; arena.len()];
    let mut stack = vec![root];
    seen[root] = true;
    while let Some(id) = stack.pop() {
        let mut reach = |child: Id| {
            if !is_container(child) {
                return;
            }
            if seen[child] {
                shared[child] = true;
            } else {
                seen[child] = true;
                stack.push(child);
            }
        };
        match arena.get(id) {
            Obj::List(items) | Obj::Set(items) | Obj::FrozenSet(items) => {
                items.iter().copied().for_each(&mut reach)
            }
            Obj::Tuple(span) => arena
                .tuple_items(*span)
                .iter()
                .copied()
                .for_each(&mut reach),
            Obj::Dict { items, .. } => items.iter().for_each(|&(_, v)| reach(v)),
            _ => {}
        }
    }
    shared
}

/// What one walk may visit and copy. Shared sub-objects are walked once per
/// reference, so both grow with the sharing, not with the pickle: each budget is a
/// multiple of what the arena holds, with a floor that no real checkpoint's
/// metadata reaches.
struct Budget {
    /// Object nodes visited.
    nodes: u64,
    /// Bytes of text copied into names, metadata strings and bytes.
    text_bytes: u64,
}

impl Budget {
    fn of(arena: &Arena) -> Budget {
        Budget {
            nodes: (arena.len() as u64).saturating_mul(4).max(1 << 20),
            text_bytes: arena.text_bytes().saturating_mul(8).max(64 << 20),
        }
    }
}

struct Walker<'a> {
    arena: &'a Arena,
    max_depth: usize,
    max_tensors: u64,
    budget: Budget,
    nodes: u64,
    text_bytes: u64,
    flat: Flat<'a>,
    names: NameSet<Arc<str>>,
    /// Memo of [`Walker::holds_tensor`] per object.
    holds_tensor: Vec<Option<bool>>,
    /// Per object, whether it is a container reached more than once (only for
    /// [`structure`]; empty for [`flatten`]).
    shared: Vec<bool>,
}

/// The flat name of `key` under `prefix`: `prefix.key`, or `key` itself under the
/// empty prefix (a root container's children, a part of a tensor under the empty
/// key). Every flat name is joined so, the parts of quantized and sparse tensors too.
pub(crate) fn flat_name(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

fn join(prefix: &str, key: &str) -> Arc<str> {
    flat_name(prefix, key).into()
}

/// The name of the value under dict key `key` of the container named `prefix`.
fn child_name(arena: &Arena, prefix: &str, key: Id) -> Result<Arc<str>> {
    match arena.get(key) {
        // A top-level str key names its value as it is: share the str.
        Obj::Str(s) if prefix.is_empty() => Ok(Arc::clone(s)),
        _ => Ok(join(prefix, &key_text(arena, key)?)),
    }
}

/// A dict key as text: a str as it is; any other key as Python's `repr` writes it
/// (`0`, `True`, `None`, `1e-07`, `(1, 'a')`), as `str(key)` gives it, so tuple keys
/// (an optimizer state keyed by `(group, index)`) name their values too. Inside a
/// tuple, strs are quoted and escaped as `repr` does
/// ([`tensorwire_core::push_python_str`]).
fn key_text(arena: &Arena, key: Id) -> Result<Cow<'_, str>> {
    if let Obj::Str(s) = arena.get(key) {
        return Ok(Cow::Borrowed(&**s));
    }
    let mut text = String::new();
    write_key(arena, key, &mut text, 0)?;
    Ok(Cow::Owned(text))
}

/// The error for a mutable container nested in a tuple or frozenset where Python
/// hashes (`what`: a dict key, a set item). The walk keeps no offsets: 0.
fn unhashable(obj: &Obj, what: &str) -> Error {
    obj.unhashable_error(&format!("{what} holds"), 0)
}

/// Deepest tuple nesting in a dict key.
const MAX_KEY_DEPTH: usize = 32;
/// Longest text of one dict key: a tuple that holds one shared tuple many times
/// would otherwise write text exponential in the pickle's size.
const MAX_KEY_BYTES: u64 = 64 << 10;

fn write_key(arena: &Arena, key: Id, out: &mut String, depth: usize) -> Result<()> {
    use std::fmt::Write;
    match arena.get(key) {
        Obj::Str(s) if depth == 0 => out.push_str(s),
        Obj::Str(s) => {
            // Refused before its text is written (escapes may make it 4x longer).
            let most = (out.len() + s.len()) as u64;
            Error::check_limit("dict key text, in bytes", most, MAX_KEY_BYTES)?;
            tensorwire_core::push_python_str(out, s)
        }
        Obj::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Obj::WideInt(b) => {
            // Refused before its text is written: at most 2.5 digits per byte.
            let most = (out.len() + b.len() * 5 / 2 + 2) as u64;
            Error::check_limit("dict key text, in bytes", most, MAX_KEY_BYTES)?;
            let _ = write!(out, "{}", BigInt::value_from_le_bytes(b)?);
        }
        Obj::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Obj::None => out.push_str("None"),
        Obj::Float(f) => tensorwire_core::push_python_float(out, *f),
        Obj::Complex(re, im) => push_complex_repr(out, *re, *im),
        Obj::Tuple(span) => {
            if depth >= MAX_KEY_DEPTH {
                return Err(Error::LimitExceeded {
                    what: "tuple nesting in a dict key",
                    limit: MAX_KEY_DEPTH as u64,
                    found: depth as u64 + 1,
                });
            }
            let items = arena.tuple_items(*span);
            out.push('(');
            for (i, &item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_key(arena, item, out, depth + 1)?;
                Error::check_limit("dict key text, in bytes", out.len() as u64, MAX_KEY_BYTES)?;
            }
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        // `str(torch.Size([1, 2]))` and its `repr` alike.
        Obj::Size(dims) => {
            out.push_str("torch.Size([");
            for (i, n) in dims.iter().enumerate() {
                let _ = write!(out, "{}{n}", if i > 0 { ", " } else { "" });
                Error::check_limit("dict key text, in bytes", out.len() as u64, MAX_KEY_BYTES)?;
            }
            out.push_str("])");
        }
        // `str(torch.device("cuda:0"))` is its text; its `repr` (inside a tuple) is
        // `device(type='cuda', index=0)`.
        Obj::Device(text) if depth == 0 => out.push_str(text),
        Obj::Device(text) => {
            let (kind, index) = match text.split_once(':') {
                Some((kind, index)) => (kind, Some(index)),
                None => (&**text, None),
            };
            out.push_str("device(type=");
            tensorwire_core::push_python_str(out, kind);
            if let Some(index) = index {
                let _ = write!(out, ", index={index}");
            }
            out.push(')');
        }
        other if other.is_unhashable() => return Err(unhashable(other, "a dict key")),
        other => {
            return Err(Error::unsupported(format!(
                "a dict key of type {}",
                other.kind()
            )))
        }
    }
    Ok(())
}

/// Python's `repr` of `complex(re, im)`: `1j` when the real part is +0, else
/// `(1+2j)`, each part in the shortest form that reads back, without `float`'s `.0`.
fn push_complex_repr(out: &mut String, re: f64, im: f64) {
    let push_part = |out: &mut String, f: f64| {
        let start = out.len();
        tensorwire_core::push_python_float(out, f);
        if out[start..].ends_with(".0") {
            out.truncate(out.len() - 2);
        }
    };
    let bare = re == 0.0 && re.is_sign_positive();
    if !bare {
        out.push('(');
        push_part(out, re);
        // The imaginary part always has its sign (`nan` takes `+`, as in Python).
        if !im.is_sign_negative() || im.is_nan() {
            out.push('+');
        }
    }
    push_part(out, im);
    out.push('j');
    if !bare {
        out.push(')');
    }
}

impl<'a> Walker<'a> {
    fn new(arena: &'a Arena, max_depth: usize, max_tensors: u64) -> Self {
        Walker {
            arena,
            max_depth,
            max_tensors,
            budget: Budget::of(arena),
            nodes: 0,
            text_bytes: 0,
            flat: Flat {
                tensors: Vec::new(),
                attributes: Default::default(),
                sparse: Vec::new(),
                meta: Vec::new(),
            },
            names: NameSet::default(),
            holds_tensor: vec![None; arena.len()],
            shared: Vec::new(),
        }
    }

    fn count(&mut self) -> Result<()> {
        self.count_items(1)
    }

    /// Counts `n` nodes at once: the items a `torch.Size` copies on each visit.
    fn count_items(&mut self, n: usize) -> Result<()> {
        self.nodes = self.nodes.saturating_add(n as u64);
        Error::check_limit(
            "checkpoint object nodes visited",
            self.nodes,
            self.budget.nodes,
        )
    }

    /// Counts `text` (a name or value about to be kept) against the text budget.
    fn copy<T: AsRef<[u8]> + ?Sized>(&mut self, text: &T) -> Result<()> {
        self.count_text(text.as_ref().len() as u64)
    }

    /// Counts `len` bytes of text against the budget (see [`Walker::copy`]).
    fn count_text(&mut self, len: u64) -> Result<()> {
        self.text_bytes = self.text_bytes.saturating_add(len);
        Error::check_limit(
            "checkpoint text copied into names and values, in bytes",
            self.text_bytes,
            self.budget.text_bytes,
        )
    }

    /// `prefix.key`, counted against the text budget.
    fn join(&mut self, prefix: &str, key: &str) -> Result<Arc<str>> {
        let name = join(prefix, key);
        self.copy(&*name)?;
        Ok(name)
    }

    /// [`child_name`], counted against the text budget.
    fn child_name(&mut self, prefix: &str, key: Id) -> Result<Arc<str>> {
        let name = child_name(self.arena, prefix, key)?;
        // Only a top-level str key is shared rather than copied; any other key's
        // text (a tuple's may be long) is new and counted, at the top level too.
        if !prefix.is_empty() || !matches!(self.arena.get(key), Obj::Str(_)) {
            self.copy(&*name)?;
        }
        Ok(name)
    }

    fn too_deep(&self, name: &str) -> Error {
        Error::LimitExceeded {
            what: if name.is_empty() {
                "checkpoint object nesting"
            } else {
                "checkpoint object nesting (or a cycle)"
            },
            limit: self.max_depth as u64,
            found: self.max_depth as u64 + 1,
        }
    }

    /// Whether any tensor is reachable from `id` (cycles count as no tensor).
    fn holds_tensor(&mut self, id: Id, depth: usize) -> Result<bool> {
        if let Some(known) = self.holds_tensor[id] {
            return Ok(known);
        }
        if depth > self.max_depth {
            return Err(self.too_deep(""));
        }
        self.count()?;
        // Provisionally false, so a cycle terminates.
        self.holds_tensor[id] = Some(false);
        let children: Vec<Id> = match self.arena.get(id) {
            Obj::Tensor(_) | Obj::Sparse(_) | Obj::Meta(_) | Obj::Storage(_) => {
                self.holds_tensor[id] = Some(true);
                return Ok(true);
            }
            Obj::List(items) | Obj::Set(items) | Obj::FrozenSet(items) => items.clone(),
            Obj::Tuple(span) => self.arena.tuple_items(*span).to_vec(),
            Obj::Dict { items, .. } => items.iter().map(|&(_, v)| v).collect(),
            _ => Vec::new(),
        };
        let mut found = false;
        for child in children {
            if self.holds_tensor(child, depth + 1)? {
                found = true;
                break;
            }
        }
        self.holds_tensor[id] = Some(found);
        Ok(found)
    }

    fn check_tensor_count(&self) -> Result<()> {
        let listed = self.flat.tensors.len() + self.flat.meta.len();
        Error::check_limit("tensor count", listed as u64 + 1, self.max_tensors)
    }

    fn add_tensor(&mut self, name: Arc<str>, record: &'a TensorRecord) -> Result<()> {
        self.check_tensor_count()?;
        if !self.names.insert(Arc::clone(&name)) {
            return Err(name_taken(&name));
        }
        self.flat.tensors.push((name, record));
        Ok(())
    }

    fn add_attribute(&mut self, name: Arc<str>, value: Value) -> Result<()> {
        if !self.names.insert(Arc::clone(&name)) {
            return Err(name_taken(&name));
        }
        self.flat.attributes.insert(name.to_string(), value);
        Ok(())
    }

    fn visit(&mut self, id: Id, name: Arc<str>, depth: usize) -> Result<()> {
        if depth > self.max_depth {
            return Err(self.too_deep(&name));
        }
        self.count()?;
        let arena = self.arena;
        match arena.get(id) {
            Obj::Tensor(record) => {
                // A per-channel quantized tensor's scales and zero points follow it,
                // as tensors of their own (`<name>.q_per_channel_scales`).
                let parts = match record.quantization.as_deref() {
                    Some(Quantization::PerChannel {
                        scales,
                        zero_points,
                        ..
                    }) => Some([
                        (Quantization::SCALES, &**scales),
                        (Quantization::ZERO_POINTS, &**zero_points),
                    ]),
                    _ => None,
                };
                self.add_tensor(Arc::clone(&name), record)?;
                for (suffix, part) in parts.into_iter().flatten() {
                    let part_name: Arc<str> = Quantization::part_name(&name, suffix).into();
                    self.copy(&*part_name)?;
                    self.add_tensor(part_name, part)?;
                }
                Ok(())
            }
            Obj::Meta(meta) => {
                self.check_tensor_count()?;
                if !self.names.insert(Arc::clone(&name)) {
                    return Err(name_taken(&name));
                }
                let before = self.flat.tensors.len();
                self.flat.meta.push((name, meta, before));
                Ok(())
            }
            Obj::Sparse(sparse) => {
                // Its name is taken (a dense tensor may not have it), and its parts
                // are tensors of the flat view.
                if !self.names.insert(Arc::clone(&name)) {
                    return Err(name_taken(&name));
                }
                let first_part = self.flat.tensors.len();
                for (part, part_name) in sparse.parts.iter().zip(sparse.part_names(&name)) {
                    self.copy(&part_name)?;
                    self.add_tensor(part_name.into(), part)?;
                }
                self.flat.sparse.push((name, sparse, first_part));
                Ok(())
            }
            Obj::Storage(s) => Err(Error::unsupported(format!(
                "a bare storage (`{}`) in the checkpoint object",
                self.arena.storage(*s).map_or("?", |s| &*s.key)
            ))),
            Obj::Dict { items, .. } if self.holds_tensor(id, depth)? => {
                for &(k, v) in items {
                    let child = self.child_name(&name, k)?;
                    self.visit(v, child, depth + 1)?;
                }
                Ok(())
            }
            Obj::List(items) | Obj::Set(items) | Obj::FrozenSet(items)
                if self.holds_tensor(id, depth)? =>
            {
                for (i, &v) in items.iter().enumerate() {
                    let child = self.join(&name, &i.to_string())?;
                    self.visit(v, child, depth + 1)?;
                }
                Ok(())
            }
            Obj::Tuple(span) if self.holds_tensor(id, depth)? => {
                for (i, &v) in self.arena.tuple_items(*span).iter().enumerate() {
                    let child = self.join(&name, &i.to_string())?;
                    self.visit(v, child, depth + 1)?;
                }
                Ok(())
            }
            _ => {
                let value = self.value(id, depth)?;
                let name = if name.is_empty() {
                    "value".into()
                } else {
                    name
                };
                self.add_attribute(name, value)
            }
        }
    }

    /// The object `id`, named `name` in the flat view, as a [`Node`]. Names are
    /// made only on the way to tensors, as [`Walker::visit`] makes them, and each
    /// object is counted once, as there (dict keys not at all).
    fn node(&mut self, id: Id, name: Arc<str>, depth: usize) -> Result<Node> {
        if depth > self.max_depth {
            return Err(self.too_deep(&name));
        }
        self.count()?;
        let arena = self.arena;
        // A child, named (`name`) only when it holds a tensor.
        let child = |walker: &mut Self, item: Id, name: &dyn Fn(&mut Self) -> Result<Arc<str>>| {
            let name = if walker.holds_tensor(item, depth + 1)? {
                name(walker)?
            } else {
                "".into()
            };
            walker.node(item, name, depth + 1)
        };
        // A list, tuple or set: children named by position.
        let items = |walker: &mut Self, items: &[Id]| -> Result<Vec<Node>> {
            items
                .iter()
                .enumerate()
                .map(|(i, &v)| child(walker, v, &|w| w.join(&name, &i.to_string())))
                .collect()
        };
        let node = match arena.get(id) {
            Obj::Tensor(_) => Node::Tensor(name),
            Obj::Meta(_) => Node::Meta(name),
            Obj::Sparse(sparse) => Node::Sparse {
                parts: sparse
                    .part_names(&name)
                    .into_iter()
                    .map(|part| self.copy(&part).map(|()| part.into()))
                    .collect::<Result<_>>()?,
                layout: sparse.layout,
                name,
            },
            Obj::Storage(s) => {
                return Err(Error::unsupported(format!(
                    "a bare storage (`{}`) in the checkpoint object",
                    self.arena.storage(*s).map_or("?", |s| &*s.key)
                )))
            }
            Obj::Dict { items, kind } => Node::Dict {
                items: items
                    .iter()
                    .map(|&(k, v)| {
                        let key = self.key_node(k, depth + 1)?;
                        let value = child(self, v, &|w| w.child_name(&name, k))?;
                        Ok((key, value))
                    })
                    .collect::<Result<_>>()?,
                kind: *kind,
                attributes: self.attributes_of(id, depth)?,
            },
            Obj::List(list) => Node::List(items(self, list)?),
            Obj::Set(set) => {
                self.check_set_items(set, depth)?;
                Node::Set(items(self, set)?)
            }
            Obj::FrozenSet(set) => {
                self.check_set_items(set, depth)?;
                Node::FrozenSet(items(self, set)?)
            }
            Obj::ByteArray(b) => {
                self.copy(&**b)?;
                Node::ByteArray(b.to_vec())
            }
            Obj::Tuple(span) => Node::Tuple(items(self, arena.tuple_items(*span))?),
            Obj::Size(dims) => self.size_node(dims)?,
            Obj::Device(text) => self.device_node(text)?,
            Obj::Global(g) => Node::Global(g.name()),
            Obj::Complex(real, imag) => Node::Complex {
                real: *real,
                imag: *imag,
            },
            _ => Node::Value(self.value_uncounted(id, depth)?),
        };
        Ok(if self.shared.get(id).copied().unwrap_or(false) {
            Node::Shared {
                id: id as u64,
                node: Box::new(node),
            }
        } else {
            node
        })
    }

    /// The attributes `BUILD` set on the dict `id` (see [`Arena::attributes`]), as
    /// nodes; tensors there are `Unsupported` (the flat view would not list them).
    fn attributes_of(&mut self, id: Id, depth: usize) -> Result<Vec<(Arc<str>, Node)>> {
        let Some(state) = self.arena.attributes(id) else {
            return Ok(Vec::new());
        };
        if self.holds_tensor(state, depth + 1)? {
            return Err(Error::unsupported(
                "tensors in the attributes of an OrderedDict of the checkpoint",
            ));
        }
        let Obj::Dict { items, .. } = self.arena.get(state) else {
            return Ok(Vec::new()); // only dicts are kept by BUILD
        };
        items
            .iter()
            .map(|&(k, v)| {
                let key: Arc<str> = key_text(self.arena, k)?.into();
                self.copy(&*key)?;
                Ok((key, self.node(v, "".into(), depth + 1)?))
            })
            .collect()
    }

    /// A dict key as a node: a tuple key stays a tuple (a metadata value would make
    /// it a list, which Python cannot hash), each of its items counted.
    fn key_node(&mut self, key: Id, depth: usize) -> Result<Node> {
        if depth > self.max_depth {
            return Err(self.too_deep("dict key"));
        }
        let arena = self.arena;
        match arena.get(key) {
            obj if obj.is_unhashable() => Err(unhashable(obj, "a dict key")),
            Obj::Tuple(span) => Ok(Node::Tuple(
                self.key_nodes(arena.tuple_items(*span), depth)?,
            )),
            Obj::FrozenSet(items) => Ok(Node::FrozenSet(self.key_nodes(items, depth)?)),
            Obj::Size(dims) => self.size_node(dims),
            Obj::Device(text) => self.device_node(text),
            Obj::Complex(real, imag) => Ok(Node::Complex {
                real: *real,
                imag: *imag,
            }),
            _ => Ok(Node::Value(self.value_uncounted(key, depth)?)),
        }
    }

    /// A `torch.Size` as its node, its items counted (each visit copies them).
    fn size_node(&mut self, dims: &[i64]) -> Result<Node> {
        self.count_items(dims.len())?;
        Ok(Node::Size(dims.to_vec()))
    }

    /// A `torch.device` as its node, its text counted (each visit becomes a str).
    fn device_node(&mut self, text: &Arc<str>) -> Result<Node> {
        self.copy(&**text)?;
        Ok(Node::Device(text.clone()))
    }

    /// Fails unless Python can hash `id` (a set's item): no list, dict, set or
    /// bytearray, at any depth of tuples and frozensets (the pickle machine refuses
    /// those met directly, as Python's unpickler does).
    fn check_hashable(&mut self, id: Id, depth: usize) -> Result<()> {
        if depth > self.max_depth {
            return Err(self.too_deep("set item"));
        }
        let arena = self.arena;
        let items = match arena.get(id) {
            obj if obj.is_unhashable() => return Err(unhashable(obj, "a set item")),
            Obj::Tuple(span) => arena.tuple_items(*span),
            Obj::FrozenSet(items) => items,
            _ => return Ok(()),
        };
        items.iter().try_for_each(|&item| {
            self.count()?;
            self.check_hashable(item, depth + 1)
        })
    }

    /// [`Walker::check_hashable`] for each item of the set or frozenset at `depth`.
    fn check_set_items(&mut self, items: &[Id], depth: usize) -> Result<()> {
        items
            .iter()
            .try_for_each(|&item| self.check_hashable(item, depth + 1))
    }

    /// The items of a tuple or frozenset key as nodes, each counted.
    fn key_nodes(&mut self, items: &[Id], depth: usize) -> Result<Vec<Node>> {
        items
            .iter()
            .map(|&item| {
                self.count()?;
                self.key_node(item, depth + 1)
            })
            .collect()
    }

    /// The items of a list, tuple or set at `depth` as metadata values.
    fn values(&mut self, items: &[Id], depth: usize) -> Result<Vec<Value>> {
        items.iter().map(|&i| self.value(i, depth + 1)).collect()
    }

    /// A tensor-free object as a metadata value.
    fn value(&mut self, id: Id, depth: usize) -> Result<Value> {
        if depth > self.max_depth {
            return Err(self.too_deep("value"));
        }
        self.count()?;
        self.value_uncounted(id, depth)
    }

    /// [`Walker::value`] for an object already counted (or, a dict key, not counted
    /// by [`Walker::visit`] either).
    fn value_uncounted(&mut self, id: Id, depth: usize) -> Result<Value> {
        let arena = self.arena;
        Ok(match arena.get(id) {
            Obj::None => Value::Null,
            Obj::Bool(b) => Value::Bool(*b),
            Obj::Int(n) => Value::Int((*n).into()),
            Obj::WideInt(b) => {
                // Counted as the decimal text it becomes (in JSON, `convert`'s text),
                // at most 2.5 digits per byte, not as its bytes.
                self.count_text(b.len() as u64 * 5 / 2 + 2)?;
                BigInt::value_from_le_bytes(b)?
            }
            Obj::Float(f) => Value::Float(*f),
            Obj::Complex(re, im) => {
                let mut text = String::new();
                push_complex_repr(&mut text, *re, *im);
                Value::Str(text)
            }
            Obj::Str(s) => {
                self.copy(&**s)?;
                Value::Str(s.to_string())
            }
            Obj::Bytes(b) | Obj::ByteArray(b) => {
                self.copy(&**b)?;
                Value::Bytes(b.to_vec())
            }
            Obj::List(items) => Value::List(self.values(items, depth)?),
            Obj::Set(items) | Obj::FrozenSet(items) => {
                self.check_set_items(items, depth)?;
                Value::List(self.values(items, depth)?)
            }
            Obj::Tuple(span) => Value::List(self.values(arena.tuple_items(*span), depth)?),
            Obj::Size(dims) => {
                self.count_items(dims.len())?;
                Value::List(dims.iter().map(|&n| Value::Int(n.into())).collect())
            }
            Obj::Device(text) => {
                self.copy(&**text)?;
                Value::Str(text.to_string())
            }
            Obj::Dict { items, .. } => Value::Map(
                items
                    .iter()
                    .map(|&(k, v)| {
                        let key = key_text(self.arena, k)?.into_owned();
                        self.copy(&key)?;
                        Ok((key, self.value(v, depth + 1)?))
                    })
                    .collect::<Result<_>>()?,
            ),
            Obj::Global(g) => Value::Str(g.name().to_owned()),
            Obj::Storage(_) | Obj::Tensor(_) | Obj::Sparse(_) | Obj::Meta(_) => {
                return Err(Error::unsupported("a tensor inside a metadata value"))
            }
        })
    }
}

/// A second entry that flattens to a dotted name already taken
/// (`{"fc": {"weight": a}, "fc.weight": b}`, or an empty key lifting its children):
/// torch loads such a file, but the flat view needs distinct names.
fn name_taken(name: &str) -> Error {
    Error::unsupported(format!(
        "two entries of the checkpoint flatten to the dotted name `{name}` \
         (the flat view needs distinct names)"
    ))
}

#[cfg(test)]
mod tests {
    use super::push_complex_repr;
    use tensorwire_core::push_python_float as push_float_repr;
    use tensorwire_core::push_python_str as push_str_repr;

    fn float(f: f64) -> String {
        let mut out = String::new();
        push_float_repr(&mut out, f);
        out
    }

    fn quoted(s: &str) -> String {
        let mut out = String::new();
        push_str_repr(&mut out, s);
        out
    }

    /// The texts Python's `repr` gives (Python's own results are the oracle of
    /// `test_dict_keys_name_their_values_as_str_names_them` in the bindings).
    #[test]
    fn floats_read_as_python_writes_them() {
        for (f, python) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.5, "1.5"),
            (1e-4, "0.0001"),
            (9.999e-5, "9.999e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
        ] {
            assert_eq!(float(f), python, "{f:?}");
        }
    }

    /// Python's `repr(complex(re, im))` (the bindings' key test checks more against
    /// Python itself).
    #[test]
    fn complex_numbers_read_as_python_writes_them() {
        let nan = f64::NAN;
        for (re, im, python) in [
            (1.0, 2.0, "(1+2j)"),
            (0.0, 1.0, "1j"),
            (0.0, -0.0, "-0j"),
            (-0.0, 0.0, "(-0+0j)"),
            (-0.0, -1.5, "(-0-1.5j)"),
            (1e16, f64::INFINITY, "(1e+16+infj)"),
            (1e-5, 1e22, "(1e-05+1e+22j)"),
            (1.0, -nan, "(1+nanj)"),
            (nan, 1.0, "(nan+1j)"),
            (0.0, 1e16, "1e+16j"),
            (2.5, f64::NEG_INFINITY, "(2.5-infj)"),
        ] {
            let mut out = String::new();
            push_complex_repr(&mut out, re, im);
            assert_eq!(out, python, "{re:?} {im:?}");
        }
    }

    #[test]
    fn strs_are_quoted_as_python_quotes_them() {
        for (s, python) in [
            ("a", "'a'"),
            ("it's", "\"it's\""),
            ("both ' and \"", "'both \\' and \"'"),
            ("back\\slash", "'back\\\\slash'"),
            ("\t\n\r\0\u{7f}\u{85}", "'\\t\\n\\r\\x00\\x7f\\x85'"),
            ("ünïcode ✓", "'ünïcode ✓'"),
            // What Python does not print, in each escape width.
            ("\u{a0}\u{ad}\u{200b}", "'\\xa0\\xad\\u200b'"),
            ("\u{3000}\u{feff}", "'\\u3000\\ufeff'"),
            ("\u{e0001}\u{10fffd}", "'\\U000e0001\\U0010fffd'"),
        ] {
            assert_eq!(quoted(s), python, "{s:?}");
        }
    }
}
