//! `tensorwire verify`: check digests and that every tensor decodes.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Result;
use tensorwire::zt::ZtReader;
use tensorwire::{Layout, TensorInfo, TensorSource};

/// Arguments of `tensorwire verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tensor file.
    file: PathBuf,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
}

/// Runs the command: every stored digest is checked, then every tensor is read (and
/// decompressed) once. The first failure is returned as the library's typed error.
pub fn run(args: &Args) -> Result<()> {
    let (digests, unchecked, n) =
        check(&args.file, &args.limits).map_err(|e| e.with_path(&args.file))?;
    let mut out = io::stdout().lock();
    write!(
        out,
        "ok: {n} tensor{}, {digests} digest{} checked",
        if n == 1 { "" } else { "s" },
        if digests == 1 { "" } else { "s" },
    )?;
    if unchecked > 0 {
        write!(out, " ({unchecked} non-dense tensors not decoded)")?;
    }
    writeln!(out)?;
    Ok(())
}

/// Whether `info` reads as a dense view of typed elements: a dense tensor, unless it
/// is a `.zt` tensor whose logical type has no tensorwire dtype (`f4_e2m1`, a user's
/// type), whose bytes are read as its components instead.
pub(crate) fn has_dense_view(
    src: &dyn TensorSource,
    info: &TensorInfo,
) -> tensorwire::Result<bool> {
    if info.layout != Layout::Dense {
        return Ok(false);
    }
    match src.as_any().downcast_ref::<ZtReader>() {
        Some(zt) => Ok(zt.opaque_type(&info.name)?.is_none()),
        None => Ok(true),
    }
}

/// Checks digests, then reads every tensor; returns (digests checked, tensors that
/// could not be read, tensors).
fn check(
    path: &Path,
    limits: &crate::limits::LimitArgs,
) -> tensorwire::Result<(usize, usize, usize)> {
    let src = limits.open(path)?;
    let digests = src.verify()?;
    let zt = src.as_any().downcast_ref::<ZtReader>();
    let mut unchecked = 0usize;
    for t in src.tensors() {
        if has_dense_view(src.as_ref(), t)? {
            src.view(&t.name)?;
        } else if let Some(zt) = zt {
            for c in &zt.object(&t.name)?.components {
                zt.component(&t.name, &c.role)?;
            }
        } else {
            // No format-neutral way to read a non-dense tensor's parts.
            unchecked += 1;
        }
    }
    Ok((digests, unchecked, src.tensors().len()))
}
