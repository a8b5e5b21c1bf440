//! Converting between formats.

use std::path::Path;

use tensorwire_core::{Error, Layout, Result, TensorSource, Value};
use tensorwire_zt::{Checksum, Compression, WriteOptions, ZtReader, ZtVersion, ZtWriter};

/// The tensor attribute under which `.zt` output records the layout of a tensor
/// written as raw bytes (`gguf:Q4_0`, `safetensors:F4`).
pub const SOURCE_LAYOUT_KEY: &str = "tensorwire.layout";

/// The format [`convert`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OutputFormat {
    /// `.zt` 1.2.
    #[default]
    Zt,
    /// `.zt` version 2 (what ztensor 2.x reads; ztensor 1.x cannot).
    Zt2,
    /// safetensors (as the `safetensors` package's `save_file` writes it).
    Safetensors,
}

impl OutputFormat {
    /// The output format a path's extension asks for.
    pub fn from_path(path: &Path) -> Result<OutputFormat> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("zt") => Ok(OutputFormat::Zt),
            Some("safetensors") => Ok(OutputFormat::Safetensors),
            other => Err(Error::unsupported(format!(
                "writing {} files (supported: .zt, .safetensors)",
                other.map_or_else(|| "extension-less".to_owned(), |e| format!(".{e}"))
            ))),
        }
    }
}

/// Options for [`convert`]. Compression and digests apply to `.zt` output;
/// safetensors has neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvertOptions {
    /// Output format; `None` picks it from the destination's extension.
    pub format: Option<OutputFormat>,
    /// Compression of each tensor in the output.
    pub compression: Compression,
    /// Digest recorded for each tensor in the output.
    pub checksum: Checksum,
}

/// Converts the file at `src` into a new file at `dst`, returning the number of tensors
/// written. `progress` is called after each tensor with (tensors done, total, bytes
/// done).
pub fn convert(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize, u64),
) -> Result<usize> {
    let source = crate::open(src)?;
    convert_source(source.as_ref(), dst, options, progress)
}

/// Writes every tensor of an open source into a new file at `dst`.
pub fn convert_source(
    source: &dyn TensorSource,
    dst: impl AsRef<Path>,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize, u64),
) -> Result<usize> {
    let dst = dst.as_ref();
    let format = match options.format {
        Some(f) => f,
        None => OutputFormat::from_path(dst)?,
    };
    if format == OutputFormat::Safetensors {
        tensorwire_formats::safetensors::save_source(source, dst, progress)?;
        return Ok(source.tensors().len());
    }
    let write = WriteOptions {
        compression: options.compression,
        checksum: options.checksum,
    };
    let version = if format == OutputFormat::Zt2 {
        ZtVersion::V2
    } else {
        ZtVersion::V1
    };
    let mut writer = ZtWriter::create_with_version(dst, version)?;
    writer.set_attributes(source.attributes().clone())?;
    let zt = source.as_any().downcast_ref::<ZtReader>();
    // Write in file order so the source is read sequentially.
    let mut order: Vec<usize> = (0..source.tensors().len()).collect();
    order.sort_by_key(|&at| source.read_order(at));
    let infos = order.into_iter().map(|at| &source.tensors()[at]);
    let total = source.tensors().len();
    let mut done_bytes = 0u64;
    for (i, info) in infos.enumerate() {
        if info.layout == Layout::Dense {
            let view = source.view(&info.name)?;
            writer.add_dense_with_attributes(
                &info.name,
                view.dtype,
                &view.shape,
                &view.bytes,
                (!info.attributes.is_empty()).then(|| info.attributes.clone().into_map()),
                write,
            )?;
        } else if let (Layout::Other(layout), None) = (&info.layout, zt) {
            // Blocks another format names but tensorwire does not decode (GGUF
            // quantized types, safetensors' packed floats) travel as their raw bytes,
            // with the layout and the source's attributes (type, logical shape).
            let view = source.view(&info.name)?;
            let mut attributes = info.attributes.clone().into_map();
            attributes.insert(SOURCE_LAYOUT_KEY.to_owned(), Value::Str(layout.clone()));
            writer.add_dense_with_attributes(
                &info.name,
                view.dtype,
                &view.shape,
                &view.bytes,
                Some(attributes),
                write,
            )?;
        } else {
            let zt = zt.ok_or_else(|| {
                Error::unsupported(format!("converting {} tensor `{}`", info.layout, info.name))
            })?;
            writer.copy_object(zt, &info.name, write)?;
        }
        done_bytes += info.nbytes;
        progress(i + 1, total, done_bytes);
    }
    writer.finish()?;
    Ok(total)
}
