//! Turning the unpickled object into named tensors and metadata.
//!
//! Dict keys and list/tuple positions join into dotted names
//! (`model.layers.0.weight`, `optimizer.state.0.exp_avg`), as users know them from
//! `state_dict()`. Tensors are leaves. A container holding no tensor at any depth
//! becomes one metadata value (`param_groups.0.betas = [0.9, 0.999]`); other
//! non-tensor leaves become metadata values under their own names.

use std::collections::BTreeMap;

use tensorwire_core::{Error, NameSet, Result, Value};

use crate::globals::{torch_dtype_name, Global};
use crate::pickle::{Arena, Id, Obj};
use crate::tensor::TensorRecord;

/// The name of the tensor when the checkpoint is one bare tensor.
pub const ROOT_TENSOR_NAME: &str = "tensor";

/// What the object holds.
pub struct Flat<'a> {
    /// Tensors, in the order the pickle lists them.
    pub tensors: Vec<(String, &'a TensorRecord)>,
    /// Non-tensor values.
    pub attributes: BTreeMap<String, Value>,
}

/// Walks the object from `root`. `max_depth` bounds nesting (and so cycles);
/// `max_nodes` bounds the nodes visited (shared sub-objects are visited once per
/// reference, so a small pickle cannot expand into a huge tree); `max_tensors` bounds
/// the tensors.
pub fn flatten(
    arena: &Arena,
    root: Id,
    max_depth: usize,
    max_nodes: u64,
    max_tensors: u64,
) -> Result<Flat<'_>> {
    let mut walker = Walker {
        arena,
        max_depth,
        max_nodes,
        max_tensors,
        nodes: 0,
        flat: Flat {
            tensors: Vec::new(),
            attributes: Default::default(),
        },
        names: NameSet::default(),
        holds_tensor: vec![None; arena.len()],
    };
    if matches!(arena.get(root), Obj::Tensor(_)) {
        walker.visit(root, ROOT_TENSOR_NAME.to_owned(), 0)?;
    } else {
        walker.visit(root, String::new(), 0)?;
    }
    Ok(walker.flat)
}

struct Walker<'a> {
    arena: &'a Arena,
    max_depth: usize,
    max_nodes: u64,
    max_tensors: u64,
    nodes: u64,
    flat: Flat<'a>,
    names: NameSet<String>,
    /// Memo of [`Walker::holds_tensor`] per object.
    holds_tensor: Vec<Option<bool>>,
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

impl<'a> Walker<'a> {
    fn count(&mut self) -> Result<()> {
        self.nodes += 1;
        Error::check_limit(
            "checkpoint object nodes visited",
            self.nodes,
            self.max_nodes,
        )
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
            Obj::Tensor(_) | Obj::Storage(_) => {
                self.holds_tensor[id] = Some(true);
                return Ok(true);
            }
            Obj::List(items) | Obj::Set(items) => items.clone(),
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

    fn key_text(&self, key: Id) -> Result<String> {
        Ok(match self.arena.get(key) {
            Obj::Str(s) => s.to_string(),
            Obj::Int(n) => n.to_string(),
            Obj::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
            Obj::None => "None".to_owned(),
            Obj::Float(f) => format!("{f:?}"),
            other => {
                return Err(Error::unsupported(format!(
                    "a dict key of type {} next to tensors",
                    other.kind()
                )))
            }
        })
    }

    fn add_attribute(&mut self, name: String, value: Value) -> Result<()> {
        if !self.names.insert(name.clone()) {
            return Err(Error::Duplicate { name });
        }
        self.flat.attributes.insert(name, value);
        Ok(())
    }

    fn visit(&mut self, id: Id, name: String, depth: usize) -> Result<()> {
        if depth > self.max_depth {
            return Err(self.too_deep(&name));
        }
        self.count()?;
        let arena = self.arena;
        match arena.get(id) {
            Obj::Tensor(record) => {
                Error::check_limit(
                    "tensor count",
                    self.flat.tensors.len() as u64 + 1,
                    self.max_tensors,
                )?;
                if !self.names.insert(name.clone()) {
                    return Err(Error::Duplicate { name });
                }
                self.flat.tensors.push((name, record));
                Ok(())
            }
            Obj::Storage(s) => Err(Error::unsupported(format!(
                "a bare storage (`{}`) in the checkpoint object",
                s.key
            ))),
            Obj::Dict { items, .. } if self.holds_tensor(id, depth)? => {
                for &(k, v) in items {
                    let key = self.key_text(k)?;
                    self.visit(v, join(&name, &key), depth + 1)?;
                }
                Ok(())
            }
            Obj::List(items) | Obj::Set(items) if self.holds_tensor(id, depth)? => {
                for (i, &v) in items.iter().enumerate() {
                    self.visit(v, join(&name, &i.to_string()), depth + 1)?;
                }
                Ok(())
            }
            Obj::Tuple(span) if self.holds_tensor(id, depth)? => {
                for (i, &v) in self.arena.tuple_items(*span).iter().enumerate() {
                    self.visit(v, join(&name, &i.to_string()), depth + 1)?;
                }
                Ok(())
            }
            _ => {
                let value = self.value(id, depth)?;
                let name = if name.is_empty() {
                    "value".to_owned()
                } else {
                    name
                };
                self.add_attribute(name, value)
            }
        }
    }

    /// A tensor-free object as a metadata value.
    fn value(&mut self, id: Id, depth: usize) -> Result<Value> {
        if depth > self.max_depth {
            return Err(self.too_deep("value"));
        }
        self.count()?;
        let arena = self.arena;
        Ok(match arena.get(id) {
            Obj::None => Value::Null,
            Obj::Bool(b) => Value::Bool(*b),
            Obj::Int(n) => Value::Int((*n).into()),
            Obj::WideInt(_) => {
                return Err(Error::unsupported(
                    "an integer wider than 64 bits in the checkpoint",
                ))
            }
            Obj::Float(f) => Value::Float(*f),
            Obj::Str(s) => Value::Str(s.to_string()),
            Obj::Bytes(b) => Value::Bytes(b.to_vec()),
            Obj::List(items) | Obj::Set(items) => Value::List(
                items
                    .iter()
                    .map(|&i| self.value(i, depth + 1))
                    .collect::<Result<_>>()?,
            ),
            Obj::Tuple(span) => Value::List(
                self.arena
                    .tuple_items(*span)
                    .iter()
                    .map(|&i| self.value(i, depth + 1))
                    .collect::<Result<_>>()?,
            ),
            Obj::Dict { items, .. } => Value::Map(
                items
                    .iter()
                    .map(|&(k, v)| Ok((self.key_text(k)?, self.value(v, depth + 1)?)))
                    .collect::<Result<_>>()?,
            ),
            Obj::Global(Global::Dtype(d)) => Value::Str(torch_dtype_name(*d).to_owned()),
            Obj::Global(g) => Value::Str(g.name().to_owned()),
            Obj::Storage(_) | Obj::Tensor(_) => {
                return Err(Error::unsupported("a tensor inside a metadata value"))
            }
        })
    }
}
