//! Runs the PyTorch pickle machine on arbitrary bytes, with small limits and a
//! persistent-id loader that parses storage references as the checkpoint reader does.
//! Any result may be an error; none may panic, hang or allocate past the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::Result;
use tensorwire_pytorch::pickle::{unpickle, Arena, Id, PersistentLoad, PickleLimits};
use tensorwire_pytorch::StorageRef;

struct Storages;

impl PersistentLoad for Storages {
    fn load(&mut self, arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef> {
        let storage = StorageRef::from_persistent_id(arena, pid, offset)?;
        // The accessors must not panic on whatever the pickle described.
        let _ = storage.nbytes();
        let _ = storage.window();
        Ok(storage)
    }
}

const LIMITS: PickleLimits = PickleLimits {
    max_objects: 100_000,
    max_memo: 100_000,
    max_stack: 10_000,
};

fuzz_target!(|data: &[u8]| {
    let Ok(out) = unpickle(data, 0, &LIMITS, &mut Storages) else {
        return;
    };
    assert!(
        out.consumed <= data.len(),
        "consumed {} of {} bytes",
        out.consumed,
        data.len()
    );
    assert!(out.arena.len() <= LIMITS.max_objects);
    assert!(out.root < out.arena.len());
    let _ = out.arena.get(out.root).kind();
});
