//! Converting between formats.

use std::collections::BTreeMap;
use std::path::Path;

use tensorwire_core::progress::within_tensor;
use tensorwire_core::{
    Bytes, DType, Error, Layout, Result, Shape, TensorInfo, TensorSource, Value, SOURCE_LAYOUT_KEY,
};
use tensorwire_formats::gguf::GgmlType;
use tensorwire_formats::safetensors::{float4_values_as_pairs, StDType};
use tensorwire_zt::{
    gguf_layout_id, ByteType, Checksum, ComponentData, Compression, WriteOptions, ZtReader,
    ZtVersion, ZtWriter, GGUF_BLOCK_BYTES, GGUF_ELEMS_PER_BLOCK,
};

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
        let extension = path.extension().and_then(|e| e.to_str());
        match extension.map(str::to_ascii_lowercase).as_deref() {
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
    /// Parser limits [`convert`] opens the source with.
    pub limits: tensorwire_core::Limits,
}

/// Converts the file at `src` into a new file at `dst`, returning the number of tensors
/// written. `progress` is called with (tensors done, total, bytes done) as the
/// conversion goes: after each tensor, and within a large one every
/// [`tensorwire_core::progress::PROGRESS_CHUNK`] bytes. An error it returns (such as
/// [`Error::Cancelled`]; it comes back as it is, or with the path: see
/// [`Error::root`]) stops the conversion, and no output is left behind. Once the last
/// tensor is reported the file is finished (written out, synced and renamed into
/// place) without further reports.
pub fn convert(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize, u64) -> Result<()>,
) -> Result<usize> {
    let open = crate::OpenOptions {
        limits: options.limits,
        ..crate::OpenOptions::default()
    };
    let source = crate::open_with(&src, &open)?;
    refuse_overwriting_source(src.as_ref(), source.as_ref(), dst.as_ref())?;
    convert_source(source.as_ref(), dst, options, progress)
}

/// Refuses a destination that is the source file, or one of the files a sharded
/// source reads (an index's shards, a GGUF model's splits): the converted file would
/// replace what it was converted from (the write itself is atomic, so nothing read is
/// corrupted, but the source set is gone). [`Error::InvalidArgument`] names both.
pub fn refuse_overwriting_source(src: &Path, source: &dyn TensorSource, dst: &Path) -> Result<()> {
    if same_file(src, dst)? {
        return Err(Error::invalid(format!(
            "refusing to overwrite the source: {} and {} are the same file",
            src.display(),
            dst.display()
        )));
    }
    if let Some(sharded) = source.as_any().downcast_ref::<crate::ShardedSource>() {
        for shard in sharded.shard_paths() {
            if same_file(&shard, dst)? {
                return Err(Error::invalid(format!(
                    "refusing to overwrite the source: {} is {}, one of the files {} reads",
                    dst.display(),
                    shard.display(),
                    src.display()
                )));
            }
        }
    }
    Ok(())
}

/// True when `dst` exists and is the same file as `src` (the same inode on Unix,
/// the same canonical path elsewhere).
fn same_file(src: &Path, dst: &Path) -> Result<bool> {
    let (Ok(src_meta), Ok(dst_meta)) = (std::fs::metadata(src), std::fs::metadata(dst)) else {
        return Ok(false);
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = (src, dst);
        Ok(src_meta.dev() == dst_meta.dev() && src_meta.ino() == dst_meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = (src_meta, dst_meta);
        Ok(std::fs::canonicalize(src)? == std::fs::canonicalize(dst)?)
    }
}

/// Writes every tensor of an open source into a new file at `dst`.
pub fn convert_source(
    source: &dyn TensorSource,
    dst: impl AsRef<Path>,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(usize, usize, u64) -> Result<()>,
) -> Result<usize> {
    let dst = dst.as_ref();
    let format = match options.format {
        Some(f) => f,
        None => OutputFormat::from_path(dst)?,
    };
    refuse_meta_tensors(source)?;
    let zt = source.as_any().downcast_ref::<ZtReader>();
    if format == OutputFormat::Safetensors {
        match zt {
            Some(zt) => {
                let typed = ZtAsSafetensors::new(zt)?;
                tensorwire_formats::safetensors::save_source(&typed, dst, progress)?;
            }
            None => {
                tensorwire_formats::safetensors::save_source(source, dst, progress)?;
            }
        }
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
    writer.set_attributes(
        source
            .attributes()
            .iter()
            .map(|(k, v)| (k.clone(), cbor_storable(v.clone())))
            .collect(),
    )?;
    // Write in file order so the source is read sequentially.
    let mut order: Vec<usize> = (0..source.tensors().len()).collect();
    order.sort_by_key(|&at| source.read_order(at));
    let total = source.tensors().len();
    let mut done_bytes = 0u64;
    for (i, at) in order.into_iter().enumerate() {
        let info = &source.tensors()[at];
        // Every byte is read: the record's checksum (an NPZ member's, a `.pt`
        // record's CRC-32) first, so a damaged source stops the conversion.
        source.check_record_at(at)?;
        // Within the tensor, bytes as the writer consumes them; its end is reported
        // once, as done (below).
        let mut within = within_tensor(progress, (i, total), done_bytes, info.nbytes);
        let opaque = match zt {
            Some(zt) => zt.opaque_type(&info.name)?,
            None => None,
        };
        if let (Some(logical), Some(zt)) = (opaque, zt) {
            // A type tensorwire has no dtype for (`f8_e8m0`, a user's type): its view
            // would be the storage elements, so the object is copied as it is.
            if logical == "f4_e2m1" && zt.version() != version {
                let (shape, bytes, attributes) = f4_as_torch_pairs(zt, info)?;
                writer.add_dense_with_progress(
                    &info.name,
                    DType::U8,
                    &shape,
                    &bytes,
                    Some(attributes),
                    write,
                    &mut within,
                )?;
            } else {
                writer.copy_object_with_progress(zt, &info.name, write, &mut within)?;
            }
        } else if let Some((logical, shape)) = zt_byte_type(info, version)? {
            // Another format's bytes of a type version 2 registers: written as that
            // type, which ztensor 2.x and tensorwire's reader name (as torch does).
            let view = source.view_at(at)?;
            let mut attributes = info.attributes.clone().into_map();
            for listing in [SOURCE_LAYOUT_KEY, "safetensors.dtype", "safetensors.shape"] {
                attributes.remove(listing);
            }
            let data = [ComponentData {
                role: "data",
                dtype: DType::U8,
                logical_type: Some(logical),
                data: &view.bytes,
            }];
            let attributes = (!attributes.is_empty()).then_some(attributes);
            writer.add_object_with_progress(
                &info.name,
                &shape,
                Layout::Dense,
                attributes,
                &data,
                write,
                &mut within,
            )?;
        } else if let Some(blocks) = gguf_block_object(info, version) {
            // GGUF quantized blocks into version 2: ztensor 2's registered object for
            // the type, which ztensor 2.x reads as such (and tensorwire's reader turns
            // back into the rows of blocks the GGUF reader gives).
            let view = source.view_at(at)?;
            let data = [ComponentData {
                role: "data",
                dtype: DType::U8,
                logical_type: None,
                data: &view.bytes,
            }];
            writer.add_object_with_progress(
                &info.name,
                &blocks.shape,
                Layout::Other(blocks.layout),
                Some(blocks.attributes),
                &data,
                write,
                &mut within,
            )?;
        } else if info.layout == Layout::Dense
            || (matches!(info.layout, Layout::Other(_)) && zt.is_none())
        {
            // Blocks another format names but tensorwire does not decode (GGUF
            // quantized types, safetensors' packed floats) travel as their raw bytes,
            // with the layout and the source's attributes (type, logical shape).
            let view = source.view_at(at)?;
            let attributes = match &info.layout {
                Layout::Other(layout) => {
                    let mut attributes = info.attributes.clone().into_map();
                    attributes.insert(SOURCE_LAYOUT_KEY.to_owned(), Value::Str(layout.clone()));
                    Some(attributes)
                }
                _ => (!info.attributes.is_empty()).then(|| info.attributes.clone().into_map()),
            };
            writer.add_dense_with_progress(
                &info.name,
                view.dtype,
                &view.shape,
                &view.bytes,
                attributes,
                write,
                &mut within,
            )?;
        } else {
            let zt = zt.ok_or_else(|| {
                Error::unsupported(format!("converting {} tensor `{}`", info.layout, info.name))
            })?;
            writer.copy_object_with_progress(zt, &info.name, write, &mut within)?;
        }
        drop(within); // gives `progress` back
        done_bytes += info.nbytes;
        progress(i + 1, total, done_bytes)?;
    }
    writer.finish()?;
    Ok(total)
}

/// Fails on a PyTorch checkpoint holding tensors on torch's meta device: they have a
/// dtype and shape but no data, which neither `.zt` nor safetensors can store, and
/// leaving them out would lose them without a word.
fn refuse_meta_tensors(source: &dyn TensorSource) -> Result<()> {
    let Some(pt) = source
        .as_any()
        .downcast_ref::<tensorwire_pytorch::PtReader>()
    else {
        return Ok(());
    };
    match pt.meta_tensors() {
        [] => Ok(()),
        [first, rest @ ..] => Err(Error::unsupported(format!(
            "converting tensors on torch's meta device (`{}`{}), which have a dtype and \
             shape but no data to write (save the model after loading its weights)",
            first.name,
            match rest.len() {
                0 => String::new(),
                n => format!(" and {n} more names"),
            }
        ))),
    }
}

/// For `.zt` version 2 output: the registered type and logical shape of a tensor that
/// its source lists as raw bytes of one (a PyTorch checkpoint's
/// `float8_e8m0fnu`/`float4_e2m1fn_x2`, safetensors' `F8_E8M0`/`F4`, or a `.zt` 1.x
/// tensor that recorded one of those layouts). torch's float4 pairs hold the first
/// value in the low nibble, as `f4_e2m1` does; their last dimension doubles.
fn zt_byte_type(info: &TensorInfo, version: ZtVersion) -> Result<Option<(&'static str, Shape)>> {
    if version != ZtVersion::V2 || info.dtype != DType::U8 {
        return Ok(None);
    }
    let Layout::Other(layout) = info.source_layout() else {
        return Ok(None);
    };
    let (logical, dims) = match layout.as_str() {
        "pytorch:float8_e8m0fnu" => ("f8_e8m0", Some(info.shape.dims().to_vec())),
        // A 0-d pair has no dimension to double: it stays a byte.
        "pytorch:float4_e2m1fn_x2" => (
            "f4_e2m1",
            tensorwire_formats::safetensors::float4_pairs_as_values(info.shape.dims())?,
        ),
        // Only a recorded shape that counts the bytes (else the bytes travel as they
        // are, with their listing), and for F4 one whose last dimension pairs up, as
        // the way back to safetensors needs.
        "safetensors:F8_E8M0" => ("f8_e8m0", StDType::F8E8M0.fitting_recorded_shape(info)),
        "safetensors:F4" => (
            "f4_e2m1",
            StDType::F4
                .fitting_recorded_shape(info)
                .filter(|d| float4_values_as_pairs(d).is_some()),
        ),
        _ => return Ok(None),
    };
    dims.map(|d| Ok((logical, Shape::new(d)?))).transpose()
}

/// A GGUF quantized tensor (from a GGUF file, or a `.zt` file holding one's rows of
/// blocks) as ztensor 2 writes it into a version 2 file.
struct GgufBlocks {
    /// `gguf.<type>/1`, the type's name in lower case.
    layout: String,
    /// The logical shape (elements, not bytes).
    shape: Shape,
    /// The source's attributes without the GGUF listing, with `block_bytes` and
    /// `elems_per_block`.
    attributes: BTreeMap<String, Value>,
}

/// [`GgufBlocks`] for `info` when writing version 2 and `info` is a GGUF quantized
/// type's rows of blocks whose logical shape (`gguf.shape`) agrees with them; `None`
/// otherwise (such a tensor then goes as its bytes, as to 1.x).
fn gguf_block_object(info: &TensorInfo, version: ZtVersion) -> Option<GgufBlocks> {
    if version != ZtVersion::V2 || info.dtype != DType::U8 {
        return None;
    }
    let name = info.source_layout_name()?.strip_prefix("gguf:")?;
    let ty = *GgmlType::ALL
        .iter()
        .find(|t| t.name() == name && t.is_quantized())?;
    let Some(Value::List(dims)) = info.attributes.get("gguf.shape") else {
        return None;
    };
    let dims: Vec<u64> = dims
        .iter()
        .map(|d| match d {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let (&last, lead) = dims.split_last()?;
    let row_bytes = ty.row_bytes(last).ok()?;
    if info.shape.dims().split_last() != Some((&row_bytes, lead)) {
        return None;
    }
    let mut attributes = info.attributes.clone().into_map();
    for listing in [SOURCE_LAYOUT_KEY, "gguf.type", "gguf.shape"] {
        attributes.remove(listing);
    }
    attributes.insert(
        GGUF_BLOCK_BYTES.to_owned(),
        Value::Int(ty.type_size().into()),
    );
    attributes.insert(
        GGUF_ELEMS_PER_BLOCK.to_owned(),
        Value::Int(ty.block_size().into()),
    );
    Some(GgufBlocks {
        layout: gguf_layout_id(name),
        shape: Shape::new(dims).ok()?,
        attributes,
    })
}

/// A version 2 `f4_e2m1` tensor as `.zt` 1.x holds it. 1.x has no type that packs two
/// values per byte, so it goes as torch's `float4_e2m1fn_x2` pairs, which are the same
/// bytes (the first value in the low nibble): `u8` holders of the pairs' shape with
/// that layout recorded, which `read_torch` reads as torch's dtype and a conversion
/// back to version 2 as the same `f4_e2m1` tensor. Pairs run along the last
/// dimension, so an odd one, or a 0-d tensor, is refused.
fn f4_as_torch_pairs(
    zt: &ZtReader,
    info: &TensorInfo,
) -> Result<(Shape, Bytes, BTreeMap<String, Value>)> {
    let logical = &zt.object(&info.name)?.shape;
    let pairs = float4_values_as_pairs(logical.dims()).ok_or_else(|| {
        Error::unsupported(format!(
            "converting f4_e2m1 tensor `{}` of shape {logical} to .zt 1.x, which stores \
             one value per byte: it goes there as torch's float4_e2m1fn_x2 pairs along \
             the last dimension, which must be even (keep version 2 for this one)",
            info.name
        ))
    })?;
    let mut attributes = info.attributes.clone().into_map();
    attributes.insert(
        SOURCE_LAYOUT_KEY.to_owned(),
        Value::Str("pytorch:float4_e2m1fn_x2".to_owned()),
    );
    Ok((
        Shape::new(pairs)?,
        zt.component(&info.name, "data")?,
        attributes,
    ))
}

/// `value` as a `.zt` file's CBOR can hold it: an integer outside CBOR's
/// [-2^64, 2^64) (a checkpoint's Python int, such as a numpy PCG64 generator's
/// 128-bit state) becomes its decimal text, as the flat view already writes the
/// Python values CBOR lacks (complex numbers, devices) as text; everything else as it
/// is. (ztensor writes such an int as the nearest float; a `Writer` given one refuses
/// it, leaving the choice to its caller.)
fn cbor_storable(value: Value) -> Value {
    match value {
        int if tensorwire_zt::is_int_outside_cbor(&int) => Value::Str(int.to_string()),
        Value::List(items) => Value::List(items.into_iter().map(cbor_storable).collect()),
        Value::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k, cbor_storable(v)))
                .collect(),
        ),
        other => other,
    }
}

/// A `.zt` source as safetensors output sees it: a dense tensor whose logical type is
/// `f8_e8m0` (one byte per element, which tensorwire has no dtype for) is listed as
/// safetensors' raw `F8_E8M0`, as a [`tensorwire_formats::SafetensorsReader`] lists
/// it, and a version 2 `f4_e2m1` one whose last dimension pairs up as `F4` (the
/// bytes torch's `float4_e2m1fn_x2` and the safetensors package share); any other
/// type without a dtype is refused rather than written as its storage.
struct ZtAsSafetensors<'a> {
    zt: &'a ZtReader,
    infos: Vec<tensorwire_core::TensorInfo>,
    /// Per tensor, whether it is read as its `data` component's bytes.
    raw: Vec<bool>,
}

impl<'a> ZtAsSafetensors<'a> {
    fn new(zt: &'a ZtReader) -> Result<Self> {
        let mut infos = zt.tensors().to_vec();
        let mut raw = vec![false; infos.len()];
        for (info, raw) in infos.iter_mut().zip(&mut raw) {
            let Some(logical) = zt.opaque_type(&info.name)? else {
                continue;
            };
            let logical_shape = &zt.object(&info.name)?.shape;
            // F4 counts single values along the last dimension, and torch reads pairs
            // along it: an odd one (or a 0-d tensor) has no F4 form.
            let pairs = float4_values_as_pairs(logical_shape.dims()).is_some();
            let st = match zt.byte_type(&info.name)? {
                Some(ByteType::F8E8M0) => StDType::F8E8M0,
                Some(ByteType::F4E2M1) if pairs => StDType::F4,
                _ => {
                    return Err(Error::unsupported(format!(
                        "writing tensor `{}` of .zt logical type `{logical}` and shape \
                         {logical_shape} to safetensors (convert to .zt of the same version \
                         to keep it)",
                        info.name
                    )))
                }
            };
            let (dtype, shape, layout, attributes) = st.raw_listing(logical_shape, info.nbytes)?;
            info.attributes.make_mut().extend(attributes);
            (info.dtype, info.shape, info.layout) = (dtype, shape, layout);
            *raw = true;
        }
        Ok(ZtAsSafetensors { zt, infos, raw })
    }
}

impl TensorSource for ZtAsSafetensors<'_> {
    fn format(&self) -> &'static str {
        self.zt.format()
    }

    fn tensors(&self) -> &[tensorwire_core::TensorInfo] {
        &self.infos
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        self.zt.attributes()
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.zt.position(name)
    }

    fn view_at(&self, position: usize) -> Result<tensorwire_core::TensorView> {
        if !self.raw.get(position).copied().unwrap_or(false) {
            return self.zt.view_at(position);
        }
        let info = &self.infos[position];
        let bytes = self.zt.component(&info.name, "data")?;
        tensorwire_core::TensorView::new(&info.name, info.dtype, info.shape.clone(), bytes, false)
    }

    fn read_order(&self, position: usize) -> (usize, u64) {
        self.zt.read_order(position)
    }

    /// The `.zt` reader underneath (this view of it is not `'static`).
    fn as_any(&self) -> &dyn std::any::Any {
        self.zt.as_any()
    }
}
