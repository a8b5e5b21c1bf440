//! Frames over a Unix stream socket: descriptors passed with `SCM_RIGHTS`, peer
//! credentials from `SO_PEERCRED`, and bounded, deadline-checked reads.
//!
//! This is the crate's only use of raw socket calls; each `unsafe` block says why the
//! buffers and lengths it hands the kernel are valid.

use std::io::{self, Read, Write};
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::error::{IpcError, Result};
use crate::frame::{FrameKind, FrameLimits, Header, HEADER_LEN, MAX_FDS_PER_FRAME};

/// One frame as received.
#[derive(Debug)]
pub struct Frame {
    /// Its header.
    pub header: Header,
    /// The CBOR body.
    pub body: Vec<u8>,
    /// Descriptors that came with it (closed when dropped).
    pub fds: Vec<OwnedFd>,
}

/// What a receive found.
#[derive(Debug)]
pub enum Received {
    /// A whole frame.
    Frame(Frame),
    /// The peer closed the connection between frames.
    Closed,
    /// The socket's read timeout passed before the first byte of a frame.
    Idle,
    /// A whole frame whose descriptors this process could not take: it has none left
    /// (`EMFILE`/`ENFILE`), so the kernel dropped them. The descriptors that did arrive
    /// were closed. The frame's bytes were all read, so the stream is still in step:
    /// answer or report [`LostDescriptors::error`] and go on reading.
    DescriptorsLost(LostDescriptors),
}

/// A frame whose descriptors were lost on the way in (see [`Received::DescriptorsLost`]).
#[derive(Debug)]
pub struct LostDescriptors {
    /// Its header (`fd_count` is what the sender announced).
    pub header: Header,
    /// The CBOR body, whole.
    pub body: Vec<u8>,
    /// How many descriptors arrived (fewer than announced; already closed).
    pub arrived: usize,
}

impl LostDescriptors {
    /// What happened, for a process that reports it about itself (`receiver` names it:
    /// "this process", "the server").
    pub fn describe(&self, receiver: &str) -> String {
        let announced = self.header.fd_count;
        let limit = crate::util::descriptor_limit_reached();
        format!(
            "{receiver} has no descriptor left to receive the {announced} descriptor(s) sent \
             with a frame (only {arrived} arrived; the kernel dropped the rest): it reached \
             {limit}. Close values it no longer needs or raise the limit; the connection is still usable",
            arrived = self.arrived,
        )
    }

    /// The error for this process: an [`IpcError::Io`] that
    /// [`is_out_of_descriptors`] recognises.
    pub fn error(&self) -> IpcError {
        IpcError::Io(io::Error::other(OutOfDescriptors(
            self.describe("this process"),
        )))
    }
}

/// The payload of [`LostDescriptors::error`].
#[derive(Debug)]
struct OutOfDescriptors(String);

impl std::fmt::Display for OutOfDescriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfDescriptors {}

/// True for the error of a frame whose descriptors this process could not receive
/// ([`LostDescriptors::error`]): the connection is still usable.
pub fn is_out_of_descriptors(e: &IpcError) -> bool {
    matches!(e, IpcError::Io(io) if io.get_ref().is_some_and(|inner| inner.is::<OutOfDescriptors>()))
}

/// The credentials the kernel reports for a socket's peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// The peer's credentials (`SO_PEERCRED`), as of when it connected.
pub fn peer_credentials(stream: &UnixStream) -> Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its exact size, as SO_PEERCRED needs.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Sends one frame: header and body in as few writes as the kernel allows, with `fds`
/// attached to the first.
pub fn send_frame(
    stream: &UnixStream,
    kind: FrameKind,
    request_id: u32,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<()> {
    if fds.len() > MAX_FDS_PER_FRAME {
        return Err(IpcError::protocol(format!(
            "{} descriptors in one frame, above the limit of {MAX_FDS_PER_FRAME}",
            fds.len()
        )));
    }
    let body_len = u32::try_from(body.len()).map_err(|_| IpcError::FrameTooLarge {
        limit: u32::MAX.into(),
        found: body.len() as u64,
    })?;
    let header = Header {
        kind,
        fd_count: fds.len() as u8,
        request_id,
        body_len,
    }
    .encode();
    // A failure here sent nothing (a write timeout, too: the stream is still in step).
    let sent = sendmsg_with_fds(stream, &header, body, fds)?;
    // The rest, if the first call sent only part of it (descriptors already went).
    let total = HEADER_LEN + body.len();
    if sent < total {
        let mut writer = stream;
        let rest = if sent < HEADER_LEN {
            writer
                .write_all(&header[sent..])
                .and_then(|()| writer.write_all(body))
        } else {
            writer.write_all(&body[sent - HEADER_LEN..])
        };
        if let Err(e) = rest {
            if is_timeout(&e) {
                // Part of the frame went out: the peer would read what follows as its
                // rest, so this stream cannot carry another frame. `TimedOut`, where a
                // timeout that sent nothing is `WouldBlock` (see [`sent_part_of_a_frame`]).
                return Err(IpcError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("a frame was only partly sent before the write timeout ({e})"),
                )));
            }
            return Err(e.into());
        }
    }
    Ok(())
}

fn sendmsg_with_fds(
    stream: &UnixStream,
    header: &[u8],
    body: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut libc::c_void,
            iov_len: header.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let fd_bytes = mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = if body.is_empty() { 1 } else { 2 };
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is `space` bytes, enough for one cmsghdr carrying
        // `fd_bytes` of data (CMSG_SPACE), so the first header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    loop {
        // SAFETY: `msg` points at live iovecs and control data for the whole call;
        // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err.into());
        }
    }
}

/// Receives one frame, or reports a clean close or an idle timeout.
///
/// The socket's read timeout bounds each wait; once a frame has started, the whole
/// frame must arrive within `frame_deadline` or the read fails with
/// [`IpcError::Timeout`] (a slow sender cannot hold a connection half-read).
///
/// Descriptors the kernel could not hand over (`MSG_CTRUNC`) do not stop the read:
/// truncation concerns the ancillary data only, the bytes still arrive, so the frame is
/// read whole and the stream stays in step. The header then tells whose fault it was.
/// It announces at most [`MAX_FDS_PER_FRAME`] descriptors (more is refused), and the
/// control buffer always has room for that many, so if fewer arrived than announced the
/// kernel failed to install them here: this process is out of descriptors, and the
/// frame comes back as [`Received::DescriptorsLost`]. If as many arrived as announced
/// and more were cut off, the peer sent descriptors it did not announce: a protocol
/// error, like any other count mismatch.
pub fn recv_frame(
    stream: &UnixStream,
    limits: &FrameLimits,
    frame_deadline: Duration,
) -> Result<Received> {
    let mut header = [0u8; HEADER_LEN];
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut got = 0;
    let mut started: Option<Instant> = None;
    let mut truncated = false;
    while got < HEADER_LEN {
        match recvmsg_with_fds(stream, &mut header[got..], &mut fds) {
            Ok((0, _)) if got == 0 => return Ok(Received::Closed),
            Ok((0, _)) => {
                return Err(closed(format!(
                    "connection closed inside a frame header ({got} of {HEADER_LEN} bytes)"
                )))
            }
            Ok((n, cut)) => {
                got += n;
                truncated |= cut;
                started.get_or_insert_with(Instant::now);
            }
            Err(e) if is_timeout(&e) => {
                if got == 0 {
                    return Ok(Received::Idle);
                }
                check_deadline(started, frame_deadline)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let started = started.unwrap_or_else(Instant::now);
    let header = Header::decode(&header, limits)?;
    let mut body = vec![0u8; header.body_len as usize];
    let mut filled = 0;
    let mut reader = stream;
    while filled < body.len() {
        match reader.read(&mut body[filled..]) {
            Ok(0) => {
                return Err(closed(format!(
                    "connection closed inside a frame body ({filled} of {} bytes)",
                    body.len()
                )))
            }
            Ok(n) => filled += n,
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                check_deadline(Some(started), frame_deadline)?
            }
            Err(e) => return Err(e.into()),
        }
        check_deadline(Some(started), frame_deadline)?;
    }
    if truncated {
        if fds.len() < usize::from(header.fd_count) {
            let arrived = fds.len();
            drop(fds);
            return Ok(Received::DescriptorsLost(LostDescriptors {
                header,
                body,
                arrived,
            }));
        }
        return Err(IpcError::protocol(format!(
            "frame announces {} descriptors but more were sent with it (control data truncated)",
            header.fd_count
        )));
    }
    if fds.len() != usize::from(header.fd_count) {
        return Err(IpcError::protocol(format!(
            "frame announces {} descriptors but {} arrived",
            header.fd_count,
            fds.len()
        )));
    }
    Ok(Received::Frame(Frame { header, body, fds }))
}

/// The peer closed the connection in the middle of a frame: an `UnexpectedEof` I/O
/// error, so callers can tell a lost peer from a malformed frame by its kind.
fn closed(reason: String) -> IpcError {
    IpcError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, reason))
}

/// True for the error [`send_frame`] gives when its write timeout passed after part
/// of the frame was sent: the stream is out of step and must be closed. (A timeout
/// before anything was sent is `WouldBlock`, and the stream is still usable.)
pub fn sent_part_of_a_frame(e: &IpcError) -> bool {
    matches!(e, IpcError::Io(io) if io.kind() == io::ErrorKind::TimedOut)
}

/// True for the error a read or write timeout (`SO_RCVTIMEO`, `SO_SNDTIMEO`) gives.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn check_deadline(started: Option<Instant>, deadline: Duration) -> Result<()> {
    match started {
        Some(t) if t.elapsed() > deadline => Err(IpcError::Timeout {
            what: "the rest of a frame".into(),
            waited_ms: deadline.as_millis() as u64,
        }),
        _ => Ok(()),
    }
}

/// One `recvmsg` into `buf`, collecting any descriptors into `fds` (at most
/// [`MAX_FDS_PER_FRAME`] in all; more is a protocol error, and they are closed).
/// Returns the bytes read and whether the ancillary data was truncated (`MSG_CTRUNC`:
/// descriptors were dropped, because more were sent than the buffer holds or because
/// this process could not install them; the caller tells which).
fn recvmsg_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let fd_bytes = MAX_FDS_PER_FRAME * mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` points at `buf` (writable, `buf.len()` bytes) and the control
        // buffer (`space` bytes), both live for the call. MSG_CMSG_CLOEXEC marks
        // received descriptors close-on-exec atomically.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    // Take ownership of every descriptor first, so they are closed on any error below.
    let mut received = Vec::new();
    // SAFETY: after a successful recvmsg the kernel filled `msg_controllen` bytes of
    // well-formed cmsg headers; CMSG_FIRSTHDR/NXTHDR stay inside that length.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let data_len = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                let count = data_len / mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    // The kernel installed this descriptor for us; nothing else owns it.
                    received.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    fds.extend(received);
    if fds.len() > MAX_FDS_PER_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many descriptors sent with one frame",
        ));
    }
    Ok((n, truncated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn frame_with_descriptors_round_trips() {
        let (a, b) = pair();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"hello through a descriptor").unwrap();
        let body = vec![7u8; 100_000];
        let sender = std::thread::spawn({
            let body = body.clone();
            move || {
                use std::os::fd::AsFd;
                send_frame(&a, FrameKind::Request, 42, &body, &[file.as_fd()]).unwrap();
                a
            }
        });
        let frame = match recv_frame(&b, &FrameLimits::default(), Duration::from_secs(5)).unwrap() {
            Received::Frame(f) => f,
            other => panic!("{other:?}"),
        };
        let _a = sender.join().unwrap();
        assert_eq!(frame.header.request_id, 42);
        assert_eq!(frame.header.kind, FrameKind::Request);
        assert_eq!(frame.body, body);
        assert_eq!(frame.fds.len(), 1);
        let mut received = std::fs::File::from(frame.fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello through a descriptor");
    }

    #[test]
    fn clean_close_idle_and_truncation() {
        let (a, b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(matches!(
            recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap(),
            Received::Idle
        ));
        let mut w = &a;
        w.write_all(b"TWIP\x02\x00").unwrap();
        drop(a);
        let err = recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("inside a frame header"), "{err}");

        let (a, b) = pair();
        drop(a);
        assert!(matches!(
            recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap(),
            Received::Closed
        ));
    }

    #[test]
    fn oversized_body_refused_before_reading_it() {
        let (a, b) = pair();
        let header = Header {
            kind: FrameKind::Request,
            fd_count: 0,
            request_id: 1,
            body_len: u32::MAX,
        }
        .encode();
        (&a).write_all(&header).unwrap();
        let err = recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, IpcError::FrameTooLarge { .. }), "{err}");
    }

    #[test]
    fn slow_sender_hits_the_frame_deadline() {
        let (a, b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let header = Header {
            kind: FrameKind::Request,
            fd_count: 0,
            request_id: 1,
            body_len: 10,
        }
        .encode();
        (&a).write_all(&header).unwrap();
        (&a).write_all(b"abc").unwrap();
        let err = recv_frame(&b, &FrameLimits::default(), Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, IpcError::Timeout { .. }), "{err}");
    }

    #[test]
    fn descriptor_count_must_match_the_header() {
        let (a, b) = pair();
        let file = tempfile::tempfile().unwrap();
        use std::os::fd::AsFd;
        // A header claiming no descriptors, sent with one.
        let header = Header {
            kind: FrameKind::Request,
            fd_count: 0,
            request_id: 1,
            body_len: 0,
        }
        .encode();
        sendmsg_with_fds(&a, &header, &[], &[file.as_fd()]).unwrap();
        let err = recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("descriptors"), "{err}");
    }

    #[test]
    fn more_descriptors_than_announced_and_truncated_is_a_protocol_error() {
        use std::os::fd::AsFd;
        let (a, b) = pair();
        let file = tempfile::tempfile().unwrap();
        // 70 descriptors (more than the receiver's buffer holds) with a header that
        // announces 3: the receiver gets 64 and MSG_CTRUNC, not a lost-descriptor frame.
        let fds: Vec<BorrowedFd<'_>> = (0..70).map(|_| file.as_fd()).collect();
        let header = Header {
            kind: FrameKind::Request,
            fd_count: 3,
            request_id: 1,
            body_len: 0,
        }
        .encode();
        sendmsg_with_fds(&a, &header, &[], &fds).unwrap();
        let err = recv_frame(&b, &FrameLimits::default(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, IpcError::Protocol { .. }), "{err}");
        assert!(err.to_string().contains("more were sent"), "{err}");
        assert!(!is_out_of_descriptors(&err));
    }

    #[test]
    fn lost_descriptors_describe_the_limit() {
        let lost = LostDescriptors {
            header: Header {
                kind: FrameKind::Response,
                fd_count: 2,
                request_id: 5,
                body_len: 0,
            },
            body: Vec::new(),
            arrived: 1,
        };
        let err = lost.error();
        assert!(is_out_of_descriptors(&err));
        let text = err.to_string();
        assert!(
            text.contains("this process has no descriptor left to receive the 2")
                && text.contains("RLIMIT_NOFILE")
                && text.contains("only 1 arrived"),
            "{text}"
        );
        assert!(!is_out_of_descriptors(&IpcError::protocol("x")));
        assert!(lost.describe("the server").starts_with("the server has no"));
    }

    #[test]
    fn peer_credentials_are_ours() {
        let (a, _b) = pair();
        let cred = peer_credentials(&a).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, crate::util::effective_uid());
    }
}
