//! `tensorwire bench`: how long opening, viewing and copying a file's tensors takes.

use std::hint::black_box;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::output::{gb_per_s, human_bytes};

/// Arguments of `tensorwire bench` (what it measures is its `--help`, on the
/// subcommand in `main.rs`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tensor file.
    file: PathBuf,
    /// Number of repetitions (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
}

/// Runs the command.
pub fn run(args: &Args) -> Result<()> {
    let mut view_times = Vec::new();
    let mut copy_times = Vec::new();
    let mut stats = Stats::default();
    for _ in 0..args.repeat {
        let start = Instant::now();
        let src = args.limits.open(&args.file)?;
        let at_path = |e: tensorwire::Error| e.with_path(&args.file);
        let mut views = Vec::with_capacity(src.tensors().len());
        stats = Stats::default();
        for t in src.tensors() {
            if !crate::verify::has_dense_view(src.as_ref(), t).map_err(at_path)? {
                stats.skipped += 1;
                continue;
            }
            let view = src.view(&t.name).map_err(at_path)?;
            stats.tensors += 1;
            stats.bytes += view.bytes.len() as u64;
            stats.zero_copy += usize::from(view.zero_copy);
            views.push(black_box(view));
        }
        view_times.push(start.elapsed());

        let start = Instant::now();
        for view in &views {
            black_box(tensorwire::mmap::fresh_copy(&view.bytes));
        }
        copy_times.push(start.elapsed());
    }

    let view = median(&mut view_times);
    let copy = median(&mut copy_times);
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{}: {} dense tensor{}, {}, median of {} run{}",
        args.file.display(),
        stats.tensors,
        if stats.tensors == 1 { "" } else { "s" },
        human_bytes(stats.bytes),
        args.repeat,
        if args.repeat == 1 { "" } else { "s" },
    )?;
    writeln!(
        out,
        "open + view: {:>10.3} ms  {:>12}  ({} of {} views zero-copy)",
        ms(view),
        gb_per_s(stats.bytes, view),
        stats.zero_copy,
        stats.tensors,
    )?;
    writeln!(
        out,
        "copy:        {:>10.3} ms  {:>12}",
        ms(copy),
        gb_per_s(stats.bytes, copy),
    )?;
    if stats.skipped > 0 {
        writeln!(
            out,
            "skipped {} tensors without a dense view (non-dense layouts, types without a dtype)",
            stats.skipped
        )?;
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Stats {
    tensors: usize,
    zero_copy: usize,
    skipped: usize,
    bytes: u64,
}

/// The median: the middle time, or the mean of the two middle ones for an even count.
fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    let n = times.len();
    match n {
        0 => Duration::ZERO,
        _ if n % 2 == 1 => times[n / 2],
        _ => (times[n / 2 - 1] + times[n / 2]) / 2,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(median(&mut ms(&[5, 1, 3])), Duration::from_millis(3));
        assert_eq!(median(&mut ms(&[4, 1, 2, 3])), Duration::from_micros(2500));
        assert_eq!(median(&mut ms(&[7])), Duration::from_millis(7));
        assert_eq!(median(&mut []), Duration::ZERO);
    }
}
