//! Open + zero-copy view of every tensor, and copy of every tensor, of a `.zt`
//! checkpoint (~100 MiB, 8 layers of width 512, 74 tensors), against the floor of mapping the file
//! and slicing it.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensorwire::mmap::{MapMode, MappedFile};
use tensorwire::zt::ZtReader;
use tensorwire::TensorSource;
use tensorwire_benches::write_checkpoint;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.zt");
    let total = write_checkpoint(&path, 8, 512).unwrap();
    let offsets: Vec<(u64, u64)> = {
        let r = ZtReader::open(&path).unwrap();
        r.objects()
            .iter()
            .map(|o| (o.components[0].offset, o.components[0].length))
            .collect()
    };

    let mut g = c.benchmark_group("zt_read");
    g.throughput(Throughput::Bytes(total));
    g.bench_function(BenchmarkId::new("floor_map_and_slice", total), |b| {
        b.iter(|| {
            let bytes = MappedFile::open_bytes(&path, MapMode::CopyOnWrite).unwrap();
            let mut n = 0usize;
            for &(off, len) in &offsets {
                n += bytes.slice_at(off, len).unwrap().len();
            }
            n
        })
    });
    g.bench_function(BenchmarkId::new("open_and_view_all", total), |b| {
        b.iter(|| {
            let src = tensorwire::open(&path).unwrap();
            let mut n = 0usize;
            for t in src.tensors() {
                n += src.view(&t.name).unwrap().bytes.len();
            }
            n
        })
    });
    let r = ZtReader::open(&path).unwrap();
    let mut bufs: Vec<Vec<u8>> = r
        .tensors()
        .iter()
        .map(|t| vec![0u8; t.nbytes as usize])
        .collect();
    g.bench_function(BenchmarkId::new("floor_memcpy_all", total), |b| {
        b.iter(|| {
            for ((off, len), buf) in offsets.iter().zip(bufs.iter_mut()) {
                buf.copy_from_slice(&r.bytes()[*off as usize..(*off + *len) as usize]);
            }
        })
    });
    g.bench_function(BenchmarkId::new("read_into_all", total), |b| {
        b.iter(|| {
            for (t, buf) in r.tensors().iter().zip(bufs.iter_mut()) {
                r.read_into(&t.name, buf).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
