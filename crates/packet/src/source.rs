//! A packet file as a [`TensorSource`] (one tensor).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{Bytes, Error, Layout, Result, TensorInfo, TensorSource, TensorView, Value};

use crate::codec::{decode_with, packet_info, PacketLimits};

/// The name a single-packet source gives its tensor.
pub const PACKET_TENSOR_NAME: &str = "tensor";

/// One dense packet (a `.tnso` file, a shm segment) seen as a source of one tensor
/// named [`PACKET_TENSOR_NAME`]. The packet is validated (integrity included) on open.
#[derive(Debug)]
pub struct PacketSource {
    view: TensorView,
    infos: [TensorInfo; 1],
    attributes: BTreeMap<String, Value>,
}

impl PacketSource {
    /// Decodes `bytes` (exactly one packet).
    pub fn from_bytes(bytes: Bytes, limits: &PacketLimits) -> Result<PacketSource> {
        let info = packet_info(&bytes, limits)?;
        let view = decode_with(&bytes, limits)?;
        let tensor = TensorInfo {
            name: Arc::from(PACKET_TENSOR_NAME),
            dtype: view.dtype,
            shape: view.shape.clone(),
            layout: Layout::Dense,
            nbytes: info.body_len as u64,
            stored_bytes: info.total_len as u64,
            offset: info.body_offset as u64,
            encoding: None,
            attributes: BTreeMap::new(),
        };
        Ok(PacketSource {
            view,
            infos: [tensor],
            attributes: BTreeMap::new(),
        })
    }
}

impl TensorSource for PacketSource {
    fn format(&self) -> &'static str {
        "tenso-packet"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        &self.attributes
    }

    fn view(&self, name: &str) -> Result<TensorView> {
        if name == PACKET_TENSOR_NAME {
            Ok(self.view.clone())
        } else {
            Err(Error::NotFound {
                name: name.to_owned(),
            })
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
