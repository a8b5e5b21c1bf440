//! Times the stages of opening a .zt file (development aid).
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).expect("path");
    let bytes = tensorwire_mmap::MappedFile::open_bytes(&path, tensorwire_mmap::MapMode::CopyOnWrite).unwrap();
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        let r = tensorwire_zt::ZtReader::from_bytes(bytes.clone()).unwrap();
        std::hint::black_box(&r);
    }
    println!("from_bytes: {:?}", t.elapsed() / n);
    let len = bytes.len();
    let msize = u64::from_le_bytes(bytes[len - 16..len - 8].try_into().unwrap()) as usize;
    let m = &bytes[len - 16 - msize..len - 16];
    let t = Instant::now();
    for _ in 0..n {
        let mut rd = m;
        let v: ciborium::Value = ciborium::de::from_reader(&mut rd).unwrap();
        std::hint::black_box(&v);
    }
    println!("ciborium Value ({} bytes): {:?}", msize, t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..200 {
        let b = tensorwire_mmap::MappedFile::open_bytes(&path, tensorwire_mmap::MapMode::CopyOnWrite).unwrap();
        std::hint::black_box(&b);
    }
    println!("map: {:?}", t.elapsed() / 200);
}
