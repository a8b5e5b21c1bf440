//! The legacy container (torch < 1.6, or `_use_new_zipfile_serialization=False`):
//! five pickles back to back, then the storages.
//!
//! The pickles are: the magic number `0x1950a86a20f9469cfc6c`; the protocol version
//! `1001`; sys info (`little_endian`, type sizes); the object, whose persistent ids
//! name storages by key; the list of storage keys. Then, for each key in that list's
//! order, an 8-byte element count and the storage's raw bytes. The layout makes every
//! storage's byte range computable from the pickles alone, so the reader reads only
//! the pickles at open and each storage when a tensor on it is asked for.

use std::sync::Arc;

use tensorwire_core::{Error, NameMap, Result};

use crate::input::Input;
use crate::pickle::{self, Arena, Id, Obj, PersistentLoad, PickleLimits, Unpickled};
use crate::tensor::StorageRef;

/// The legacy magic number, as the little-endian bytes of pickle's `LONG1`.
pub const MAGIC_LE: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// The protocol version torch writes and reads.
const PROTOCOL_VERSION: i64 = 1001;

/// The legacy magic number as pickle protocols 0 and 1 write it: a text `LONG`
/// (`torch.save(..., pickle_protocol=1)`).
const MAGIC_TEXT: &[u8] = b"L119547037146038801333356L\n";

/// True when `head` (the first bytes of a file) starts like a legacy checkpoint.
pub fn sniff(head: &[u8]) -> bool {
    let binary = head.first() == Some(&0x80)
        && head
            .get(..32.min(head.len()))
            .is_some_and(|h| h.windows(MAGIC_LE.len()).any(|w| w == MAGIC_LE));
    binary || head.starts_with(MAGIC_TEXT)
}

/// Where one storage's bytes are.
#[derive(Debug, Clone, Copy)]
pub struct LegacyStorage {
    /// File offset of the 8-byte element count.
    pub prefix_offset: u64,
    /// Elements the pickle declares.
    pub numel: u64,
    /// File offset of the first byte.
    pub data_offset: u64,
}

/// A parsed legacy file: the object pickle and where each storage is.
pub struct Legacy {
    /// The object pickle.
    pub object: Unpickled,
    /// Storage key → location.
    pub storages: NameMap<Arc<str>, LegacyStorage>,
    /// False for files written on a big-endian machine.
    pub little_endian: bool,
}

/// Collects the storages the object pickle names, checking that a key always comes
/// with the same type and size.
#[derive(Default)]
struct Storages {
    seen: NameMap<Arc<str>, StorageRef>,
}

impl PersistentLoad for Storages {
    fn load(&mut self, arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef> {
        let storage = StorageRef::from_persistent_id(arena, pid, offset)?;
        if let Some(known) = self.seen.get(&storage.key) {
            if known.dtype.bits() * known.numel != storage.dtype.bits() * storage.numel {
                return Err(Error::malformed(
                    offset,
                    format!("storage `{}` is declared with two sizes", storage.key),
                ));
            }
        } else {
            self.seen.insert(storage.key.clone(), storage.clone());
        }
        Ok(storage)
    }
}

struct NoPersistentIds;

impl PersistentLoad for NoPersistentIds {
    fn load(&mut self, _: &Arena, _: Id, offset: u64) -> Result<StorageRef> {
        Err(Error::malformed(
            offset,
            "persistent id outside the object pickle",
        ))
    }
}

/// What the five pickles say.
struct Pickles {
    object: Unpickled,
    keys: Vec<Arc<str>>,
    storages: Storages,
    little_endian: bool,
    /// Offset just past the last pickle: the first storage's element count.
    end: u64,
}

/// Runs the five pickles in `head` (the file's first bytes). Fails with
/// [`Error::Truncated`] when `head` ends inside them, so the caller can read more.
fn parse_pickles(head: &[u8], limits: &PickleLimits) -> Result<Pickles> {
    let mut pos = 0usize;
    let mut next = |persistent: &mut dyn PersistentLoad| -> Result<Unpickled> {
        let u = pickle::unpickle(&head[pos..], pos as u64, limits, persistent)?;
        pos += u.consumed;
        Ok(u)
    };
    let magic = next(&mut NoPersistentIds)?;
    match magic.arena.get(magic.root) {
        Obj::WideInt(bytes) if **bytes == MAGIC_LE => {}
        _ => {
            return Err(Error::BadMagic {
                offset: 0,
                expected: "the legacy torch magic number 0x1950a86a20f9469cfc6c",
                found: head[..head.len().min(16)].to_vec(),
            })
        }
    }
    let version = next(&mut NoPersistentIds)?;
    match version.arena.get(version.root) {
        Obj::Int(PROTOCOL_VERSION) => {}
        other => {
            return Err(Error::unsupported(format!(
                "legacy checkpoint protocol version {other:?} (1001 is supported)"
            )))
        }
    }
    let sys_info = next(&mut NoPersistentIds)?;
    let little_endian = match sys_info.arena.get(sys_info.root) {
        Obj::Dict { items, .. } => items
            .iter()
            .find(|(k, _)| matches!(sys_info.arena.get(*k), Obj::Str(s) if &**s == "little_endian"))
            .map(|&(_, v)| sys_info.arena.get(v) != &Obj::Bool(false))
            .unwrap_or(true),
        _ => return Err(Error::malformed(0, "legacy sys info is not a dict")),
    };
    let mut storages = Storages::default();
    let object = next(&mut storages)?;
    let keys_pickle = next(&mut NoPersistentIds)?;
    let keys = keys_pickle
        .arena
        .items(keys_pickle.root)
        .ok_or_else(|| Error::malformed(0, "legacy storage-key list is not a list"))?
        .iter()
        .map(|&k| match keys_pickle.arena.get(k) {
            Obj::Str(s) => Ok(s.clone()),
            Obj::Int(n) => Ok(n.to_string().into()),
            other => Err(Error::malformed(
                0,
                format!("legacy storage key is a {}", other.kind()),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Pickles {
        object,
        keys,
        storages,
        little_endian,
        end: pos as u64,
    })
}

/// Parses a legacy file: the pickles (read in growing prefixes, at most
/// `max_metadata` bytes), then the storage layout, reading nothing of the storages but
/// their 8-byte counts.
pub fn parse(input: &Input, limits: &PickleLimits, max_metadata: u64) -> Result<Legacy> {
    // The pickles of a large model take tens of KiB: start small, grow fourfold.
    let mut want = (4u64 << 10).min(input.len());
    let Pickles {
        object,
        keys,
        storages,
        little_endian,
        end,
    } = loop {
        let head = input.read_meta(0, want)?;
        match parse_pickles(&head, limits) {
            Err(Error::Truncated { .. }) if want < input.len() && want < max_metadata => {
                want = want.saturating_mul(4).min(input.len()).min(max_metadata);
            }
            other => break other?,
        }
    };
    let mut layout = NameMap::with_capacity_and_hasher(keys.len(), Default::default());
    let mut at = end;
    for key in keys {
        let storage = storages.seen.get(&key).ok_or_else(|| {
            Error::malformed(at, format!("storage `{key}` is listed but never used"))
        })?;
        let data_offset = at.checked_add(8).ok_or(Error::Overflow {
            what: "legacy storage offset",
        })?;
        let nbytes = storage.nbytes()?;
        let next = data_offset.checked_add(nbytes).ok_or(Error::Overflow {
            what: "legacy storage offset",
        })?;
        if next > input.len() {
            return Err(Error::OutOfBounds {
                tensor: format!("storage {key}"),
                offset: data_offset,
                length: nbytes,
                limit: input.len(),
            });
        }
        let entry = LegacyStorage {
            prefix_offset: at,
            numel: storage.numel,
            data_offset,
        };
        if layout.insert(key.clone(), entry).is_some() {
            return Err(Error::Duplicate {
                name: format!("storage {key}"),
            });
        }
        at = next;
    }
    if let Some(missing) = storages.seen.keys().find(|k| !layout.contains_key(*k)) {
        return Err(Error::malformed(
            end,
            format!("storage `{missing}` is used but not in the storage list"),
        ));
    }
    Ok(Legacy {
        object,
        storages: layout,
        little_endian,
    })
}

/// Checks a storage's 8-byte element count against what the pickle declared.
pub fn check_prefix(input: &Input, key: &str, storage: &LegacyStorage, little: bool) -> Result<()> {
    let raw = input.read_meta(storage.prefix_offset, 8)?;
    let bytes: [u8; 8] = raw[..8].try_into().expect("8 bytes");
    let count = if little {
        u64::from_le_bytes(bytes)
    } else {
        u64::from_be_bytes(bytes)
    };
    if count != storage.numel {
        return Err(Error::SizeMismatch {
            tensor: format!("storage {key}"),
            expected: storage.numel,
            found: count,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_takes_the_magic_number_binary_or_as_text() {
        let mut binary = vec![0x80, 0x02, 0x8a, 0x0a];
        binary.extend_from_slice(&MAGIC_LE);
        assert!(sniff(&binary));
        assert!(sniff(b"L119547037146038801333356L\n.M\xe9\x03."));
        // Another text long, or the text without the binary pickle's first byte.
        assert!(!sniff(b"L119547037146038801333357L\n."));
        assert!(!sniff(b"119547037146038801333356L\n"));
        assert!(!sniff(&binary[1..]));
    }
}
