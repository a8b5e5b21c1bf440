//! A minimal pickle writer for building legacy checkpoints in tests: big ones (to show
//! which bytes a read touches) and broken ones (lying counts, missing storages).
#![allow(dead_code)]

/// Pickle opcodes for protocol 2, written by hand.
#[derive(Default)]
pub struct Pickle(pub Vec<u8>);

impl Pickle {
    pub fn new() -> Pickle {
        Pickle(b"\x80\x02".to_vec())
    }
    pub fn int(&mut self, v: i64) -> &mut Self {
        match i32::try_from(v) {
            Ok(small) => {
                self.0.push(b'J');
                self.0.extend(small.to_le_bytes());
            }
            Err(_) => {
                self.0.extend(b"\x8a\x08");
                self.0.extend(v.to_le_bytes());
            }
        }
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    pub fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.0.extend(format!("c{module}\n{name}\n").as_bytes());
        self
    }
    pub fn op(&mut self, op: &[u8]) -> &mut Self {
        self.0.extend(op);
        self
    }
    pub fn ints(&mut self, v: &[u64]) -> &mut Self {
        self.op(b"(");
        for &x in v {
            self.int(x as i64);
        }
        self.op(b"t")
    }
    pub fn stop(&mut self) -> Vec<u8> {
        self.0.push(b'.');
        std::mem::take(&mut self.0)
    }
}

/// One tensor of a synthetic checkpoint, over `f32` storage `key`.
pub struct Tensor<'a> {
    pub name: &'a str,
    pub key: &'a str,
    pub storage_numel: u64,
    pub offset: u64,
    pub shape: Vec<u64>,
    pub strides: Vec<u64>,
}

/// One storage: its key, the element count written before it, and its bytes.
pub struct Storage<'a> {
    pub key: &'a str,
    pub count: u64,
    pub bytes: Vec<u8>,
}

/// A legacy checkpoint `{name: tensor}` with the storages in the given order.
pub fn legacy(tensors: &[Tensor<'_>], storages: &[Storage<'_>]) -> Vec<u8> {
    let mut object = Pickle::new();
    object.op(b"}(");
    for t in tensors {
        object.str(t.name);
        tensor(&mut object, t);
    }
    object.op(b"u");
    legacy_with_object(object.stop(), storages)
}

/// Pushes `t` (its name aside) as torch pickles a tensor.
pub fn tensor(object: &mut Pickle, t: &Tensor<'_>) {
    object
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b"(")
        .op(b"(")
        .str("storage")
        .global("torch", "FloatStorage")
        .str(t.key)
        .str("cpu")
        .int(t.storage_numel as i64)
        .op(b"Nt")
        .op(b"Q")
        .int(t.offset as i64)
        .ints(&t.shape)
        .ints(&t.strides)
        .op(b"\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .op(b"tR");
}

/// A legacy checkpoint whose object is the pickle `object` (protocol header and
/// `STOP` included), with the storages in the given order.
pub fn legacy_with_object(object: Vec<u8>, storages: &[Storage<'_>]) -> Vec<u8> {
    let mut out = Pickle::new()
        .op(b"\x8a\x0a")
        .op(&[0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19])
        .stop();
    out.extend(Pickle::new().int(1001).stop());
    out.extend(
        Pickle::new()
            .op(b"}(")
            .str("protocol_version")
            .int(1001)
            .str("little_endian")
            .op(b"\x88")
            .op(b"u")
            .stop(),
    );
    out.extend(object);
    let mut keys = Pickle::new();
    keys.op(b"(");
    for s in storages {
        keys.str(s.key);
    }
    out.extend(keys.op(b"l").stop());
    for s in storages {
        out.extend(s.count.to_le_bytes());
        out.extend(&s.bytes);
    }
    out
}

/// `n` little-endian f32 values starting at `first`.
pub fn f32s(first: f32, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (first + i as f32).to_le_bytes())
        .collect()
}

/// Pushes a tensor of 4 floats over storage `0` ([`four_floats_storage`]).
pub fn four_floats(object: &mut Pickle) {
    let t = Tensor {
        name: "",
        key: "0",
        storage_numel: 4,
        offset: 0,
        shape: vec![4],
        strides: vec![1],
    };
    tensor(object, &t);
}

/// Storage `0`: the floats 0 to 3.
pub fn four_floats_storage() -> Storage<'static> {
    Storage {
        key: "0",
        count: 4,
        bytes: f32s(0.0, 4),
    }
}
