//! The async (tokio) stream reader and writer: the same framing, limits and buffer as
//! the blocking ones, over `AsyncRead` / `AsyncWrite`.

use std::io::{self, IoSlice};

use tensorwire_core::{Bytes, DType, Result, Shape, TensorView};

use crate::value::Packet;
use crate::write::{encode_packet, PacketRef};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{check_one_packet, Next, PacketFramer, ReadState};
use crate::codec::{encode_parts, EncodeOptions, PacketLimits};

/// Reads packets one at a time from a tokio [`AsyncRead`] (a socket, a pipe, a
/// `DuplexStream`).
///
/// Same behaviour as [`PacketReader`](crate::PacketReader): the same framing and
/// limits, one 64-byte aligned buffer per packet that grows by at most
/// [`READ_CHUNK`](crate::READ_CHUNK) beyond the bytes received, `Ok(None)` at a clean
/// end, [`Error::Truncated`](tensorwire_core::Error::Truncated) inside a packet, and
/// no reading past a packet's end.
///
/// [`read_packet_bytes`](Self::read_packet_bytes) and [`read_packet`](Self::read_packet)
/// are cancel-safe: bytes already received stay in the reader's buffer when the
/// future is dropped (for example by `tokio::select!`), and the next call goes on from
/// there.
#[derive(Debug)]
pub struct AsyncPacketReader<R> {
    inner: R,
    state: ReadState,
}

impl<R: AsyncRead + Unpin> AsyncPacketReader<R> {
    /// A reader with the default [`PacketLimits`].
    pub fn new(reader: R) -> AsyncPacketReader<R> {
        AsyncPacketReader::with_limits(reader, PacketLimits::default())
    }

    /// A reader enforcing `limits`.
    pub fn with_limits(reader: R, limits: PacketLimits) -> AsyncPacketReader<R> {
        AsyncPacketReader {
            inner: reader,
            state: ReadState::new(limits),
        }
    }

    /// The next packet's bytes, framed but not decoded, in a 64-byte aligned buffer;
    /// `Ok(None)` at a clean end of the stream.
    pub async fn read_packet_bytes(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.state.next()? {
                Next::Packet(bytes) => return Ok(Some(bytes)),
                Next::Read(want) => {
                    // `take` bounds the read to the reserved room; `read_buf` appends
                    // to the buffer only what one completed read returned.
                    let result = (&mut self.inner)
                        .take(want as u64)
                        .read_buf(self.state.storage_mut())
                        .await;
                    self.state.after_read();
                    match result {
                        Ok(0) => {
                            self.state.at_eof()?;
                            return Ok(None);
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(self.state.io_error(e)),
                    }
                }
            }
        }
    }

    /// The next packet, decoded under the reader's limits; `Ok(None)` at a clean end
    /// of the stream.
    pub async fn read_packet(&mut self) -> Result<Option<Packet>> {
        match self.read_packet_bytes().await? {
            Some(bytes) => self.state.decode(&bytes).map(Some),
            None => Ok(None),
        }
    }
}

impl<R> AsyncPacketReader<R> {
    /// The limits it enforces.
    pub fn limits(&self) -> &PacketLimits {
        self.state.limits()
    }

    /// Packets read so far.
    pub fn packets_read(&self) -> u64 {
        self.state.packets
    }

    /// Stream offset of the packet being read.
    pub fn position(&self) -> u64 {
        self.state.consumed
    }

    /// Bytes of an unfinished packet held in the buffer.
    pub fn buffered(&self) -> usize {
        self.state.buf.len()
    }

    /// The largest buffer capacity the reader has allocated for one packet.
    pub fn peak_buffer_capacity(&self) -> usize {
        self.state.peak_capacity
    }

    /// True after an error that put the stream out of sync.
    pub fn is_failed(&self) -> bool {
        self.state.failed
    }

    /// The underlying reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The underlying reader, mutably.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The underlying reader; a half-read packet is dropped.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes packets to a tokio [`AsyncWrite`], dense bodies with vectored writes and no
/// copy; the async twin of [`PacketWriter`](crate::PacketWriter).
#[derive(Debug)]
pub struct AsyncPacketWriter<W> {
    inner: W,
    framer: PacketFramer,
    bytes: u64,
    packets: u64,
}

impl<W: AsyncWrite + Unpin> AsyncPacketWriter<W> {
    /// A writer that accepts packets within the default [`PacketLimits`].
    pub fn new(writer: W) -> AsyncPacketWriter<W> {
        AsyncPacketWriter::with_limits(writer, PacketLimits::default())
    }

    /// A writer that refuses packets outside `limits`.
    pub fn with_limits(writer: W, limits: PacketLimits) -> AsyncPacketWriter<W> {
        AsyncPacketWriter {
            inner: writer,
            framer: PacketFramer::new(limits),
            bytes: 0,
            packets: 0,
        }
    }

    /// Writes an encoded packet after checking it is exactly one packet.
    pub async fn write_packet_bytes(&mut self, packet: &[u8]) -> Result<u64> {
        check_one_packet(&mut self.framer, packet)?;
        self.write_parts(&mut [IoSlice::new(packet)]).await
    }

    /// Encodes a dense tensor and writes it without copying the body.
    pub async fn write_dense(
        &mut self,
        dtype: DType,
        shape: &Shape,
        body: &[u8],
        options: EncodeOptions,
    ) -> Result<u64> {
        let parts = encode_parts(dtype, shape, body, options)?;
        let footer = parts.footer.unwrap_or_default();
        let footer_len = if parts.footer.is_some() { 8 } else { 0 };
        self.write_parts(&mut [
            IoSlice::new(&parts.header),
            IoSlice::new(body),
            IoSlice::new(&footer[..footer_len]),
        ])
        .await
    }

    /// Writes a view as a dense packet.
    pub async fn write_view(&mut self, view: &TensorView, options: EncodeOptions) -> Result<u64> {
        self.write_dense(view.dtype, &view.shape, &view.bytes, options)
            .await
    }

    /// Encodes a packet of any kind and writes it; an uncompressed dense packet goes
    /// out without a copy of its body.
    pub async fn write_packet(
        &mut self,
        packet: &PacketRef<'_>,
        options: &EncodeOptions,
    ) -> Result<u64> {
        match packet {
            PacketRef::Dense { dtype, shape, body } if !options.compress => {
                self.write_dense(*dtype, shape, body, *options).await
            }
            _ => {
                let bytes = encode_packet(packet, options)?;
                self.write_parts(&mut [IoSlice::new(&bytes)]).await
            }
        }
    }

    async fn write_parts(&mut self, parts: &mut [IoSlice<'_>]) -> Result<u64> {
        let before = self.bytes;
        let mut bufs = parts;
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match self.inner.write_vectored(bufs).await {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => {
                    self.bytes += n as u64;
                    IoSlice::advance_slices(&mut bufs, n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.packets += 1;
        Ok(self.bytes - before)
    }

    /// Flushes the underlying writer.
    pub async fn flush(&mut self) -> Result<()> {
        Ok(self.inner.flush().await?)
    }

    /// Flushes and shuts down the underlying writer (the reader then sees the end of
    /// the stream).
    pub async fn shutdown(&mut self) -> Result<()> {
        Ok(self.inner.shutdown().await?)
    }
}

impl<W> AsyncPacketWriter<W> {
    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// Packets written completely.
    pub fn packets_written(&self) -> u64 {
        self.packets
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The underlying writer, mutably.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}
