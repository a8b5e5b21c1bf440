//! Streaming: packets one at a time over `std::io::Read` / `Write` (and, with the
//! `tokio` feature, over `tokio::io::AsyncRead` / `AsyncWrite`).
//!
//! A stream is packets back to back, with nothing between them, as `tenso.write_stream`
//! writes it. The readers find where each packet ends from its own framing
//! ([`PacketFramer`]) and never read past that end, so the underlying reader is left
//! right after the packet; wrap a socket in a `BufReader` when packets are small.
//!
//! Hostile input costs little: no declared size is trusted before it is checked
//! against [`PacketLimits`], and a packet's buffer grows by at most [`READ_CHUNK`]
//! bytes beyond what has actually arrived, so a 20-byte packet announcing 16 GiB
//! allocates one chunk, then fails with [`Error::Truncated`].

use std::io::{self, IoSlice, Read, Write};

use tensorwire_core::{Bytes, DType, Error, Result, Shape, TensorView};

use crate::codec::{encode_parts, EncodeOptions, PacketLimits};
use crate::read::decode_packet_with;
use crate::value::Packet;
use crate::write::{encode_packet, PacketRef};

#[cfg(feature = "tokio")]
mod async_io;
mod buffer;
pub(crate) mod framing;

#[cfg(feature = "tokio")]
pub use self::async_io::{AsyncPacketReader, AsyncPacketWriter};
use self::buffer::PacketBuf;
pub use self::framing::{Framing, PacketFramer};

/// The most a stream reader asks its source for in one go, and so the most its packet
/// buffer ever holds beyond the bytes received (4 MiB).
pub const READ_CHUNK: usize = 4 << 20;

/// What the shared reading logic wants next.
pub(crate) enum Next {
    /// A whole packet.
    Packet(Bytes),
    /// Read at most this many bytes (at least one) into the buffer, then ask again.
    Read(usize),
}

/// The state both readers share: the framer, the packet buffer, counters.
#[derive(Debug)]
pub(crate) struct ReadState {
    framer: PacketFramer,
    buf: PacketBuf,
    /// Bytes the packet is known to need (from the last framing step).
    need: u64,
    /// A data error or a fatal I/O error happened: the stream is out of sync.
    failed: bool,
    packets: u64,
    /// Bytes of the packets handed out so far.
    consumed: u64,
    peak_capacity: usize,
}

impl ReadState {
    pub(crate) fn new(limits: PacketLimits) -> ReadState {
        ReadState {
            framer: PacketFramer::new(limits),
            buf: PacketBuf::default(),
            need: 0,
            failed: false,
            packets: 0,
            consumed: 0,
            peak_capacity: 0,
        }
    }

    pub(crate) fn limits(&self) -> &PacketLimits {
        self.framer.limits()
    }

    /// Frames what has arrived: a finished packet, or how much to read next (the
    /// buffer then has room for it).
    pub(crate) fn next(&mut self) -> Result<Next> {
        if self.failed {
            return Err(Error::invalid(
                "the packet stream is out of sync after an earlier error",
            ));
        }
        let framing = self.framer.advance(self.buf.data());
        match framing {
            Ok(Framing::Complete { len }) => {
                debug_assert_eq!(len, self.buf.len() as u64);
                self.packets += 1;
                self.consumed += len;
                self.need = 0;
                Ok(Next::Packet(self.buf.take()))
            }
            Ok(Framing::Incomplete { need }) => {
                self.need = need;
                let have = self.buf.len();
                let need = usize::try_from(need).map_err(|_| Error::LimitExceeded {
                    what: "packet length",
                    limit: usize::MAX as u64,
                    found: need,
                })?;
                let want = (need - have).min(READ_CHUNK);
                // Grow geometrically, but never past one chunk beyond what arrived.
                let hint = need.min(have.saturating_add(READ_CHUNK));
                if let Err(e) = self.buf.reserve(want, hint) {
                    return Err(self.fail(e));
                }
                self.peak_capacity = self.peak_capacity.max(self.buf.capacity());
                Ok(Next::Read(want))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The buffer readers append to (after [`next`](Self::next) said how much).
    pub(crate) fn storage_mut(&mut self) -> &mut Vec<u8> {
        self.buf.storage_mut()
    }

    /// Called after every read: keeps the buffer aligned and the peak up to date.
    pub(crate) fn after_read(&mut self) {
        self.buf.realign();
        self.peak_capacity = self.peak_capacity.max(self.buf.capacity());
    }

    /// The source ended: `Ok` for a clean end between packets, [`Error::Truncated`]
    /// inside one.
    pub(crate) fn at_eof(&mut self) -> Result<()> {
        let have = self.buf.len() as u64;
        if have == 0 {
            return Ok(());
        }
        let e = Error::Truncated {
            offset: 0,
            needed: self.need,
            available: have,
        };
        Err(self.fail(e))
    }

    /// An I/O error: `WouldBlock`, `TimedOut` and `Interrupted` leave the partial
    /// packet buffered (the next call goes on with it); any other stops the stream.
    pub(crate) fn io_error(&mut self, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                Error::Io(e)
            }
            _ => self.fail(Error::Io(e)),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        self.failed = true;
        self.buf.clear();
        e
    }

    pub(crate) fn decode(&self, packet: &Bytes) -> Result<Packet> {
        decode_packet_with(packet, self.framer.limits())
    }
}

/// Reads packets one at a time from a blocking [`Read`].
///
/// Each packet comes back in its own 64-byte aligned buffer, so decoded bodies are
/// aligned and zero-copy. The reader stops at each packet's last byte (it never reads
/// ahead), handles `Interrupted`, and returns `Ok(None)` when the source ends cleanly
/// between packets. A source that ends inside a packet gives [`Error::Truncated`]
/// (`needed`: the bytes the packet was known to need, `available`: the bytes read);
/// offsets in errors count from the first byte of the packet being read, which is
/// [`position`](Self::position) bytes into the stream.
///
/// After a data error (bad magic, limits, truncation, malformed framing) or an I/O
/// error the stream is out of sync and every later call fails. Exceptions: a packet
/// that frames but does not decode fails alone in [`read_packet`](Self::read_packet)
/// (the next packet can be read), and `WouldBlock` / `TimedOut` keep the partial
/// packet, so the call can be repeated on a non-blocking or timed socket. For
/// non-blocking I/O use the `tokio` feature's `AsyncPacketReader`.
///
/// ```
/// use std::io::Cursor;
/// use tensorwire_core::{DType, Shape};
/// use tensorwire_packet::{EncodeOptions, PacketReader, PacketWriter};
///
/// let shape = Shape::from_dims(&[2]).unwrap();
/// let mut w = PacketWriter::new(Vec::new());
/// w.write_dense(DType::U8, &shape, &[1, 2], EncodeOptions::default()).unwrap();
/// w.write_dense(DType::U8, &shape, &[3, 4], EncodeOptions::default()).unwrap();
/// let stream = w.into_inner();
///
/// let mut r = PacketReader::new(Cursor::new(stream));
/// let bodies: Vec<Vec<u8>> = r
///     .by_ref()
///     .map(|p| p.unwrap().as_dense().unwrap().bytes.to_vec())
///     .collect();
/// assert_eq!(bodies, [vec![1, 2], vec![3, 4]]);
/// assert_eq!(r.packets_read(), 2);
/// ```
#[derive(Debug)]
pub struct PacketReader<R> {
    inner: R,
    state: ReadState,
}

impl<R: Read> PacketReader<R> {
    /// A reader with the default [`PacketLimits`].
    pub fn new(reader: R) -> PacketReader<R> {
        PacketReader::with_limits(reader, PacketLimits::default())
    }

    /// A reader enforcing `limits` (including [`PacketLimits::max_packet_bytes`]).
    pub fn with_limits(reader: R, limits: PacketLimits) -> PacketReader<R> {
        PacketReader {
            inner: reader,
            state: ReadState::new(limits),
        }
    }

    /// The next packet's bytes, undecoded (but framed: exactly one whole packet), in a
    /// 64-byte aligned buffer; `Ok(None)` at a clean end of the stream.
    pub fn read_packet_bytes(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.state.next()? {
                Next::Packet(bytes) => return Ok(Some(bytes)),
                Next::Read(want) => {
                    let before = self.state.buf.len();
                    // `take` bounds the read to the reserved room; `read_to_end` retries
                    // `Interrupted` and keeps what it read before an error.
                    let result = (&mut self.inner)
                        .take(want as u64)
                        .read_to_end(self.state.storage_mut());
                    self.state.after_read();
                    match result {
                        Ok(_) if self.state.buf.len() - before < want => {
                            self.state.at_eof()?;
                            return Ok(None);
                        }
                        Ok(_) => {}
                        Err(e) => return Err(self.state.io_error(e)),
                    }
                }
            }
        }
    }

    /// The next packet, decoded ([`decode_packet_with`](crate::decode_packet_with) under
    /// the reader's limits: bodies and members borrow the packet buffer); `Ok(None)` at
    /// a clean end of the stream.
    pub fn read_packet(&mut self) -> Result<Option<Packet>> {
        match self.read_packet_bytes()? {
            Some(bytes) => self.state.decode(&bytes).map(Some),
            None => Ok(None),
        }
    }
}

impl<R> PacketReader<R> {
    /// The limits it enforces.
    pub fn limits(&self) -> &PacketLimits {
        self.state.limits()
    }

    /// Packets read so far.
    pub fn packets_read(&self) -> u64 {
        self.state.packets
    }

    /// Stream offset of the packet being read (the bytes of the packets returned so
    /// far).
    pub fn position(&self) -> u64 {
        self.state.consumed
    }

    /// Bytes of an unfinished packet held in the buffer.
    pub fn buffered(&self) -> usize {
        self.state.buf.len()
    }

    /// The largest buffer capacity, in bytes, the reader has allocated for one packet
    /// (at most the packet's bytes received plus [`READ_CHUNK`] and a little slack).
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

    /// The underlying reader, mutably (reading from it directly desynchronizes the
    /// stream unless no packet is half read).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The underlying reader; a half-read packet is dropped.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Decoded packets until the stream ends. An error that puts the stream out of sync is
/// yielded once, then the iterator ends.
impl<R: Read> Iterator for PacketReader<R> {
    type Item = Result<Packet>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.state.failed {
            return None;
        }
        self.read_packet().transpose()
    }
}

/// Writes packets to a blocking [`Write`], dense tensors without copying their bodies.
///
/// [`write_dense`](Self::write_dense) sends the header, the caller's body and the
/// footer with vectored writes (partial writes resumed where they stopped);
/// [`write_packet_bytes`](Self::write_packet_bytes) checks that the bytes are exactly
/// one packet before writing them, so a stream is never left out of frame by a bad
/// buffer. After an I/O error the stream may hold part of a packet.
#[derive(Debug)]
pub struct PacketWriter<W> {
    inner: W,
    framer: PacketFramer,
    bytes: u64,
    packets: u64,
}

impl<W: Write> PacketWriter<W> {
    /// A writer that accepts packets within the default [`PacketLimits`].
    pub fn new(writer: W) -> PacketWriter<W> {
        PacketWriter::with_limits(writer, PacketLimits::default())
    }

    /// A writer that refuses packets outside `limits`.
    pub fn with_limits(writer: W, limits: PacketLimits) -> PacketWriter<W> {
        PacketWriter {
            inner: writer,
            framer: PacketFramer::new(limits),
            bytes: 0,
            packets: 0,
        }
    }

    /// Writes an encoded packet after checking it is exactly one packet (any kind).
    /// Returns the bytes written.
    pub fn write_packet_bytes(&mut self, packet: &[u8]) -> Result<u64> {
        check_one_packet(&mut self.framer, packet)?;
        self.write_parts(&mut [IoSlice::new(packet)])
    }

    /// Encodes a dense tensor (`body`: `shape × dtype` little-endian bytes, row-major)
    /// and writes it without copying the body. Returns the bytes written.
    pub fn write_dense(
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
    }

    /// Writes a view (for example one read from another stream) as a dense packet.
    pub fn write_view(&mut self, view: &TensorView, options: EncodeOptions) -> Result<u64> {
        self.write_dense(view.dtype, &view.shape, &view.bytes, options)
    }

    /// Encodes a packet of any kind with [`encode_packet`](crate::encode_packet) and
    /// writes it; an uncompressed dense packet goes out without a copy of its body.
    pub fn write_packet(&mut self, packet: &PacketRef<'_>, options: &EncodeOptions) -> Result<u64> {
        match packet {
            PacketRef::Dense { dtype, shape, body } if !options.compress => {
                self.write_dense(*dtype, shape, body, *options)
            }
            _ => {
                let bytes = encode_packet(packet, options)?;
                self.write_parts(&mut [IoSlice::new(&bytes)])
            }
        }
    }

    fn write_parts(&mut self, parts: &mut [IoSlice<'_>]) -> Result<u64> {
        let before = self.bytes;
        write_all_vectored(&mut self.inner, parts, &mut self.bytes)?;
        self.packets += 1;
        Ok(self.bytes - before)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.inner.flush()?)
    }
}

impl<W> PacketWriter<W> {
    /// Bytes written so far (including those of a packet whose write failed midway).
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

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// Checks that `packet` is exactly one packet (the framer is left at a packet start).
pub(crate) fn check_one_packet(framer: &mut PacketFramer, packet: &[u8]) -> Result<()> {
    framer.reset();
    let framing = framer.advance(packet);
    framer.reset();
    match framing? {
        Framing::Complete { len } if len == packet.len() as u64 => Ok(()),
        Framing::Complete { len } => Err(Error::malformed(
            len,
            format!(
                "{} bytes after the end of the packet",
                packet.len() as u64 - len
            ),
        )),
        Framing::Incomplete { need } => Err(Error::Truncated {
            offset: 0,
            needed: need,
            available: packet.len() as u64,
        }),
    }
}

/// Writes every slice, resuming after partial writes and retrying `Interrupted`;
/// `written` counts the bytes that went out, also when it fails.
fn write_all_vectored<W: Write>(
    w: &mut W,
    mut bufs: &mut [IoSlice<'_>],
    written: &mut u64,
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n as u64;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
