//! `--limit NAME=N`: the parser limits every command opens files with.

use std::path::Path;

use tensorwire::{Limits, OpenOptions, TensorSource};

/// The parser-limit options shared by every command.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Raise or lower one parser limit (repeatable), e.g. `--limit max_depth=100`
    /// for a checkpoint nested deeper than 64 levels. NAME is one of
    /// max_metadata_bytes (default 1 GiB), max_tensors (1 Mi), max_ndim (64, the
    /// most), max_name_bytes (64 KiB), max_decoded_bytes (64 GiB), max_depth (64;
    /// 128 at most).
    #[arg(long = "limit", value_name = "NAME=N", value_parser = parse_limit)]
    limits: Vec<(String, u64)>,
}

impl LimitArgs {
    /// The limits: the defaults with each `--limit` applied in turn.
    pub fn limits(&self) -> Limits {
        let mut limits = Limits::default();
        for (name, value) in &self.limits {
            // Names were checked when parsed.
            let _ = limits.set(name, *value);
        }
        limits
    }

    /// Opens `path` (any format) with these limits.
    pub fn open(&self, path: &Path) -> tensorwire::Result<Box<dyn TensorSource>> {
        let options = OpenOptions {
            limits: self.limits(),
            ..OpenOptions::default()
        };
        tensorwire::open_with(path, &options)
    }
}

/// Parses `NAME=N`, checking the name and that N is a non-negative integer.
fn parse_limit(arg: &str) -> Result<(String, u64), String> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=N, not {arg:?}"))?;
    let value: u64 = value
        .trim()
        .parse()
        .map_err(|_| format!("the value of {name} must be an integer from 0 to 2^64-1"))?;
    Limits::default()
        .set(name, value)
        .map_err(|e| e.to_string())?;
    Ok((name.to_owned(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_by_name() {
        assert_eq!(parse_limit("max_depth=100"), Ok(("max_depth".into(), 100)));
        assert!(parse_limit("max_depth").unwrap_err().contains("NAME=N"));
        assert!(parse_limit("max_depth=-1").unwrap_err().contains("integer"));
        assert!(parse_limit("max_dpth=1")
            .unwrap_err()
            .contains("unknown limit \"max_dpth\""));
        let args = LimitArgs {
            limits: vec![("max_depth".into(), 100), ("max_tensors".into(), 5)],
        };
        let limits = args.limits();
        assert_eq!((limits.max_depth, limits.max_tensors), (100, 5));
        assert_eq!(limits.max_ndim, Limits::default().max_ndim);
    }
}
