//! `tensorwire_core::copy`: the copies a packet decode makes for bundle members whose
//! bodies are not element-aligned (130 pieces of 64 or 256 KiB at odd offsets of a
//! 20 MiB buffer, ~9 MiB in all), and one 64 MiB copy, against the same copies made
//! with `copy_from_slice` on one thread, and with rayon's `par_chunks` on its global
//! pool (what the decoders used before).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rayon::prelude::*;
use tensorwire::core::copy::copy_pairs;

/// `(source offset, destination offset, length)` of each piece.
fn pieces() -> Vec<(usize, usize, usize)> {
    let (mut src, mut dst) = (13, 0);
    (0..130)
        .map(|i| {
            let len = if i % 4 == 3 { 256 << 10 } else { 64 << 10 };
            let piece = (src, dst, len);
            src += len + 97;
            dst += len;
            piece
        })
        .collect()
}

fn pairs<'a>(
    src: &'a [u8],
    mut dst: &'a mut [u8],
    pieces: &[(usize, usize, usize)],
) -> Vec<(&'a mut [u8], &'a [u8])> {
    let mut out = Vec::with_capacity(pieces.len());
    for &(s, _, len) in pieces {
        let (head, tail) = std::mem::take(&mut dst).split_at_mut(len);
        out.push((head, &src[s..s + len]));
        dst = tail;
    }
    out
}

fn bench(c: &mut Criterion) {
    let pieces = pieces();
    let total: usize = pieces.iter().map(|p| p.2).sum();
    let src: Vec<u8> = (0..20usize << 20).map(|i| i as u8).collect();
    let mut dst = vec![0u8; total];

    let mut g = c.benchmark_group("copy_pieces");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function(BenchmarkId::new("one_thread", total), |b| {
        b.iter(|| {
            for (d, s) in pairs(&src, &mut dst, &pieces) {
                d.copy_from_slice(s);
            }
        })
    });
    g.bench_function(BenchmarkId::new("rayon_par_iter", total), |b| {
        b.iter(|| {
            pairs(&src, &mut dst, &pieces)
                .into_par_iter()
                .for_each(|(d, s)| d.copy_from_slice(s))
        })
    });
    g.bench_function(BenchmarkId::new("core_copy_pairs", total), |b| {
        b.iter(|| copy_pairs(pairs(&src, &mut dst, &pieces)))
    });
    g.finish();

    let big = 64 << 20;
    let src = vec![7u8; big];
    let mut dst = vec![0u8; big];
    let mut g = c.benchmark_group("copy_64mib");
    g.throughput(Throughput::Bytes(big as u64));
    g.sample_size(20);
    g.bench_function("one_thread", |b| b.iter(|| dst.copy_from_slice(&src)));
    g.bench_function("rayon_par_chunks", |b| {
        b.iter(|| {
            dst.par_chunks_mut(1 << 20)
                .zip(src.par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s))
        })
    });
    g.bench_function("core_copy", |b| {
        b.iter(|| tensorwire::core::copy::copy(&mut dst, &src))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
