//! The frame: a fixed 16-byte header, then a CBOR body.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "TWIP"
//!      4     2  protocol version (u16 LE), currently 2
//!      6     1  kind: 1 request, 2 response
//!      7     1  number of file descriptors sent with the frame (SCM_RIGHTS)
//!      8     4  request id (u32 LE), echoed by the response
//!     12     4  body length (u32 LE)
//!     16     …  body: one CBOR message (`schema::Request` or `schema::Response`)
//! ```
//!
//! Descriptors ride on the same `sendmsg` as the header, so they arrive with the
//! frame's first bytes. A receiver checks the magic, version, kind and both counts
//! against its [`FrameLimits`] before it reads or allocates the body.

use crate::error::{IpcError, Result};

/// The magic at the start of every frame.
pub const MAGIC: [u8; 4] = *b"TWIP";
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 2;
/// Size of the frame header.
pub const HEADER_LEN: usize = 16;
/// The most descriptors one frame may carry (the kernel's own cap is 253).
pub const MAX_FDS_PER_FRAME: usize = 64;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A client's request.
    Request = 1,
    /// The server's answer to one request.
    Response = 2,
}

/// Caps a receiver applies before trusting a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest body accepted, in bytes.
    pub max_body: u32,
    /// Most descriptors accepted with one frame.
    pub max_fds: u8,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_body: 16 << 20,
            max_fds: MAX_FDS_PER_FRAME as u8,
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request or response.
    pub kind: FrameKind,
    /// Descriptors that came with the frame.
    pub fd_count: u8,
    /// The request this frame belongs to.
    pub request_id: u32,
    /// Body length in bytes.
    pub body_len: u32,
}

impl Header {
    /// The header's 16 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out[6] = self.kind as u8;
        out[7] = self.fd_count;
        out[8..12].copy_from_slice(&self.request_id.to_le_bytes());
        out[12..16].copy_from_slice(&self.body_len.to_le_bytes());
        out
    }

    /// Parses and checks a header against `limits`.
    pub fn decode(bytes: &[u8; HEADER_LEN], limits: &FrameLimits) -> Result<Header> {
        if bytes[0..4] != MAGIC {
            return Err(IpcError::protocol(format!(
                "bad frame magic {:02x?} (expected \"TWIP\"): not a tensorwire peer",
                &bytes[0..4]
            )));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != PROTOCOL_VERSION {
            return Err(IpcError::Version {
                found: version,
                supported: PROTOCOL_VERSION,
            });
        }
        let kind = match bytes[6] {
            1 => FrameKind::Request,
            2 => FrameKind::Response,
            other => return Err(IpcError::protocol(format!("unknown frame kind {other}"))),
        };
        let fd_count = bytes[7];
        if fd_count > limits.max_fds {
            return Err(IpcError::protocol(format!(
                "frame announces {fd_count} descriptors, above the limit of {}",
                limits.max_fds
            )));
        }
        let request_id = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let body_len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        if body_len > limits.max_body {
            return Err(IpcError::FrameTooLarge {
                limit: limits.max_body.into(),
                found: body_len.into(),
            });
        }
        Ok(Header {
            kind,
            fd_count,
            request_id,
            body_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kind: FrameKind::Response,
            fd_count: 3,
            request_id: 0xdead_beef,
            body_len: 1234,
        }
    }

    #[test]
    fn round_trips() {
        let bytes = header().encode();
        assert_eq!(&bytes[..4], b"TWIP");
        assert_eq!(
            Header::decode(&bytes, &FrameLimits::default()).unwrap(),
            header()
        );
    }

    #[test]
    fn refuses_bad_magic_version_kind_and_counts() {
        let limits = FrameLimits::default();
        let good = header().encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            Header::decode(&b, &limits),
            Err(IpcError::Protocol { .. })
        ));
        let mut b = good;
        b[4] = 9;
        assert!(matches!(
            Header::decode(&b, &limits),
            Err(IpcError::Version { found: 9, .. })
        ));
        let mut b = good;
        b[6] = 7;
        assert!(matches!(
            Header::decode(&b, &limits),
            Err(IpcError::Protocol { .. })
        ));
        let mut b = good;
        b[7] = 65;
        assert!(matches!(
            Header::decode(&b, &limits),
            Err(IpcError::Protocol { .. })
        ));
        let small = FrameLimits {
            max_body: 1000,
            max_fds: 8,
        };
        assert!(matches!(
            Header::decode(&good, &small),
            Err(IpcError::FrameTooLarge {
                limit: 1000,
                found: 1234
            })
        ));
    }
}
