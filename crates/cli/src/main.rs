//! `tensorwire`: the command line for inspecting, converting, verifying and
//! benchmarking tensor files.
//!
//! Every command goes through the `tensorwire` facade; this crate only parses
//! arguments, formats output and maps errors to exit codes.
//!
//! Not in scope: format logic of any kind (that lives in the library crates).
#![forbid(unsafe_code)]

mod bench;
mod convert;
mod inspect;
mod limits;
mod output;
mod verify;

use std::io;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the file is corrupt or failed verification (digest mismatch, undecodable
     data, malformed structure), or holds a pickle global refused as unsafe
  2  usage error, I/O error, unrecognised or unsupported format";

/// Inspect, convert, verify and benchmark tensor files.
///
/// Reads .zt (1.x and 2), PyTorch checkpoints (.pt/.pth/.bin, ZIP and legacy),
/// safetensors (and sharded *.index.json), GGUF (and splits), .npy/.npz and tenso
/// packets (.tnso), recognised by their bytes, not their extension. Writes .zt and
/// .safetensors.
#[derive(Debug, Parser)]
#[command(name = "tensorwire", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List a file's tensors: name, dtype, shape, layout and sizes.
    #[command(after_help = EXIT_CODES)]
    Inspect(inspect::Args),
    /// Copy every tensor of SRC into a new file DST.
    #[command(after_help = EXIT_CODES)]
    Convert(convert::Args),
    /// Check every stored digest and that every tensor can be read and decoded.
    #[command(after_help = EXIT_CODES)]
    Verify(verify::Args),
    /// Time opening a file, viewing every tensor and copying every tensor.
    ///
    /// Each repetition opens the file afresh, then times (1) the open plus a view of
    /// every tensor (zero-copy for raw tensors, so this reads almost none of the data:
    /// its GB/s is not a read speed; compressed tensors are decoded) and (2) a copy
    /// of every tensor's bytes into fresh memory, as the library copies (on several
    /// threads when large; this reads all of the data). The
    /// median of the repetitions is printed. The page cache is not dropped: after the
    /// first repetition the file is usually in memory.
    #[command(after_help = EXIT_CODES)]
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Verify(args) => verify::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            // Error messages quote names from the file: escaped like the tables.
            eprintln!("error: {}", output::escape_controls(&chain_message(&err)));
            ExitCode::from(exit_code(&err))
        }
    }
}

/// True when the error is (or wraps) a write to a closed pipe, as when the output is
/// piped into `head`.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        // serde_json keeps the io error's kind but not the error itself in its chain.
        if let Some(json) = e.downcast_ref::<serde_json::Error>() {
            return json.io_error_kind() == Some(io::ErrorKind::BrokenPipe);
        }
        let io = e.downcast_ref::<io::Error>().or_else(|| {
            match e
                .downcast_ref::<tensorwire::Error>()
                .map(tensorwire::Error::root)
            {
                Some(tensorwire::Error::Io(io)) => Some(io),
                _ => None,
            }
        });
        io.is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The error and its sources joined by `: `, leaving out a source whose message the
/// previous one already ends with (`path: reason` followed by `reason`).
fn chain_message(err: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for e in err.chain() {
        let msg = e.to_string();
        if !last.is_empty() && last.ends_with(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
        last = msg;
    }
    out
}

/// 1 when the file itself is bad, 2 for everything else (usage, I/O, format not
/// recognised or not supported, and errors raised by the CLI itself).
fn exit_code(err: &anyhow::Error) -> u8 {
    let Some(tw) = err
        .chain()
        .find_map(|e| e.downcast_ref::<tensorwire::Error>())
    else {
        return 2;
    };
    if tw.is_corrupt_data() {
        1
    } else {
        2
    }
}
