//! Times `tensorwire::open` plus a zero-copy view of every tensor, and the close
//! (dropping the source unmaps the file), many times over:
//! a harness for profilers (`perf record`) and a quick check of the open path.
//!
//! ```text
//! cargo run --release -p tensorwire --example open_all -- FILE [REPEAT]
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: open_all FILE [REPEAT]")?;
    let repeat: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1001);
    let mut open_times = Vec::with_capacity(repeat);
    let mut total_times = Vec::with_capacity(repeat);
    let mut close_times = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let start = Instant::now();
        let src = tensorwire::open(&path)?;
        let opened = start.elapsed();
        for t in src.tensors() {
            black_box(src.view(&t.name)?);
        }
        total_times.push(start.elapsed());
        open_times.push(opened);
        let closing = Instant::now();
        drop(src);
        close_times.push(closing.elapsed());
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    println!(
        "{path}: open {:?}, open + view all {:?}, close {:?} (median of {repeat})",
        median(&mut open_times),
        median(&mut total_times),
        median(&mut close_times)
    );
    Ok(())
}
