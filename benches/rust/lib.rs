//! Shared set-up for the criterion benchmarks: a transformer-shaped `.zt` checkpoint.
#![deny(missing_docs)]

use std::path::Path;

use tensorwire::zt::{WriteOptions, ZtWriter};
use tensorwire::{DType, Result, Shape};

/// Tensor shapes of a small transformer: an embedding, `layers` blocks of attention,
/// MLP and norms, and a final norm. `hidden` sets the width.
pub fn transformer_shapes(layers: usize, hidden: u64) -> Vec<(String, Vec<u64>)> {
    let mut out = vec![("embed.weight".to_owned(), vec![4 * hidden, hidden])];
    for l in 0..layers {
        for p in ["q", "k", "v", "o"] {
            out.push((format!("layers.{l}.attn.{p}.weight"), vec![hidden, hidden]));
        }
        out.push((
            format!("layers.{l}.mlp.up.weight"),
            vec![hidden * 11 / 4, hidden],
        ));
        out.push((
            format!("layers.{l}.mlp.gate.weight"),
            vec![hidden * 11 / 4, hidden],
        ));
        out.push((
            format!("layers.{l}.mlp.down.weight"),
            vec![hidden, hidden * 11 / 4],
        ));
        out.push((format!("layers.{l}.norm1.weight"), vec![hidden]));
        out.push((format!("layers.{l}.norm2.weight"), vec![hidden]));
    }
    out.push(("norm.weight".to_owned(), vec![hidden]));
    out
}

/// Writes a float32 checkpoint of `transformer_shapes(layers, hidden)` to `path`,
/// returning its total tensor bytes.
pub fn write_checkpoint(path: &Path, layers: usize, hidden: u64) -> Result<u64> {
    let mut w = ZtWriter::create(path)?;
    let mut total = 0;
    for (i, (name, dims)) in transformer_shapes(layers, hidden).into_iter().enumerate() {
        let shape = Shape::new(dims)?;
        let n = shape.byte_len(DType::F32)? as usize;
        let data: Vec<u8> = (0..n).map(|b| (b as u8) ^ (i as u8)).collect();
        w.add_dense(&name, DType::F32, &shape, &data, WriteOptions::default())?;
        total += n as u64;
    }
    w.finish()?;
    Ok(total)
}
