//! `tensorwire convert`: copy every tensor of one file into a new file.

use std::fs;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::builder::PossibleValuesParser;
use clap::builder::TypedValueParser as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tensorwire::zt::{Checksum, Compression, DEFAULT_ZSTD_LEVEL};
use tensorwire::{ConvertOptions, OutputFormat};

use crate::output::{human_bytes, mb_per_s};

/// Arguments of `tensorwire convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The file to read.
    src: PathBuf,
    /// The file to write (replaced if it exists; written under a temporary name and
    /// renamed into place when complete).
    dst: PathBuf,
    /// Compress every tensor with zstd, at LEVEL (1-22; 3 when no level is given).
    #[arg(
        long,
        value_name = "LEVEL",
        num_args = 0..=1,
        require_equals = true,
        value_parser = clap::value_parser!(i32).range(1..=22),
    )]
    compress: Option<Option<i32>>,
    /// Digest recorded for every stored blob of `.zt` output (xxh3 needs
    /// `--zt-version 2`; 1.x records crc32c or sha256).
    #[arg(
        long,
        default_value = "none",
        value_parser = PossibleValuesParser::new(["none", "crc32c", "sha256", "xxh3"])
            .try_map(|s| Checksum::from_name(&s)),
    )]
    checksum: Checksum,
    /// Output format (by default, from DST's extension).
    #[arg(long, value_enum)]
    format: Option<FormatArg>,
    /// Version of `.zt` output: 1 (ztensor 1.x reads it) or 2 (ztensor 2.x reads it).
    #[arg(long, default_value = "1", value_parser = PossibleValuesParser::new(["1", "2"]))]
    zt_version: String,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
}

/// Output formats `--format` accepts.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    /// `.zt` (version 1.2, or 2 with `--zt-version 2`).
    Zt,
    /// safetensors.
    Safetensors,
}

impl From<FormatArg> for OutputFormat {
    fn from(f: FormatArg) -> OutputFormat {
        match f {
            FormatArg::Zt => OutputFormat::Zt,
            FormatArg::Safetensors => OutputFormat::Safetensors,
        }
    }
}

/// Runs the command.
pub fn run(args: &Args) -> Result<()> {
    if args.dst.is_dir() {
        bail!(
            "{} is a directory: give the output file's name",
            args.dst.display()
        );
    }
    // A pipe, socket or device node (`/dev/null`) would be replaced by a regular file
    // (the writers refuse it too; checked here before the source is read).
    tensorwire::core::check_replaceable(&tensorwire::core::write_destination(&args.dst)?)?;
    let format = match args.format {
        Some(f) => OutputFormat::from(f),
        None => OutputFormat::from_path(&args.dst)?,
    };
    let format = match (format, args.zt_version.as_str()) {
        (OutputFormat::Zt, "2") => OutputFormat::Zt2,
        (other, "1") => other,
        _ => bail!("--zt-version applies to .zt output only"),
    };
    if format == OutputFormat::Safetensors
        && (args.compress.is_some() || args.checksum != Checksum::None)
    {
        bail!("safetensors files have no compression and no digests: drop --compress / --checksum, or write .zt");
    }
    let options = ConvertOptions {
        format: Some(format),
        compression: match args.compress {
            None => Compression::Raw,
            Some(level) => Compression::Zstd(level.unwrap_or(DEFAULT_ZSTD_LEVEL)),
        },
        checksum: args.checksum,
        limits: args.limits.limits(),
    };

    remove_on_interrupt()?;
    let start = Instant::now();
    let src = args.limits.open(&args.src)?;
    tensorwire::refuse_overwriting_source(&args.src, src.as_ref(), &args.dst)?;
    let total_bytes: u64 = src.tensors().iter().map(|t| t.nbytes).sum();
    let bar = progress_bar(total_bytes);
    let result = tensorwire::convert_source(
        src.as_ref(),
        &args.dst,
        &options,
        &mut |_done, _total, bytes| {
            bar.set_position(bytes);
            Ok(())
        },
    );
    bar.finish_and_clear();
    let count = result.with_context(|| {
        format!(
            "converting {} to {}",
            args.src.display(),
            args.dst.display()
        )
    })?;
    let elapsed = start.elapsed();
    let written = fs::metadata(&args.dst).map(|m| m.len()).ok();

    let mut out = io::stdout().lock();
    write!(
        out,
        "converted {count} tensor{} ({}) to {} in {:.2} s, {}",
        if count == 1 { "" } else { "s" },
        human_bytes(total_bytes),
        args.dst.display(),
        elapsed.as_secs_f64(),
        mb_per_s(total_bytes, elapsed),
    )?;
    if let Some(n) = written {
        write!(out, "; file is {}", human_bytes(n))?;
    }
    writeln!(out)?;
    Ok(())
}

/// On SIGINT, SIGTERM, SIGHUP or SIGQUIT, removes the temporary file the output is
/// written to until it is renamed into place (`tensorwire::core::create_temporary`
/// keeps the list) and exits as the signal would (128 + its number): an interrupted
/// conversion leaves no hidden partial file behind. The destination is never touched,
/// and a finished output was renamed away from its temporary already.
///
/// SIGBUS (a source truncated by another program while it is mapped) still ends the
/// process, but its handler first removes the temporaries
/// (`tensorwire::mmap::remove_temporaries_on_bus_error`).
fn remove_on_interrupt() -> Result<()> {
    #[cfg(unix)]
    tensorwire::mmap::remove_temporaries_on_bus_error();
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])?;
    std::thread::Builder::new()
        .name("tensorwire-interrupt".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tensorwire::core::remove_temporaries_before_exit();
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

/// A byte-count progress bar on stderr, hidden when stderr is not a terminal.
fn progress_bar(total_bytes: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}
