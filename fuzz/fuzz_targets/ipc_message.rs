//! Fuzzes the control plane of `tensorwire-cuda-ipc`: the 16-byte frame header, the
//! CBOR messages (`Request`, `Response`, `Payload`), payload validation, the default
//! cache key, and `recv_frame` reading arbitrary bytes from a socket.
//!
//! Any input must give a value or a typed error, never a panic. A header that decodes
//! must be within the limits and encode back to its 16 bytes. A message that decodes
//! must re-encode, and what it re-encodes to must decode and re-encode to the very same
//! bytes (bytes, not values: a NaN float is not equal to itself). A payload that
//! `validate(n)` accepts must hold only in-range indices, known byte-sized dtypes, at
//! most `MAX_ELEMENTS` elements per tensor and extents inside their storages, and must
//! pass `validate(m)` for every `m ≥ n`.
#![no_main]

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use tensorwire_core::{strided, MAX_NDIM};
use tensorwire_cuda_ipc::frame::{FrameKind, FrameLimits, Header, HEADER_LEN};
use tensorwire_cuda_ipc::schema::{self, Location, Node, Payload, Request, Response};
use tensorwire_cuda_ipc::service::default_cache_key;
use tensorwire_cuda_ipc::socket::{recv_frame, send_frame, Received};

/// Limits for the socket checks: small, so a header announcing a large body does not
/// make every run allocate 16 MiB.
const SOCKET_LIMITS: FrameLimits = FrameLimits {
    max_body: 1 << 16,
    max_fds: 64,
};

fuzz_target!(|data: &[u8]| {
    let limits = FrameLimits::default();
    let mut fd_count = None;
    if data.len() >= HEADER_LEN {
        let head: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
        match Header::decode(&head, &limits) {
            Ok(h) => {
                assert!(h.body_len <= limits.max_body, "body_len above the limit");
                assert!(h.fd_count <= limits.max_fds, "fd_count above the limit");
                assert_eq!(h.encode(), head, "header does not encode back");
                fd_count = Some(usize::from(h.fd_count));
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
        messages(&data[HEADER_LEN..], fd_count);
    }
    messages(data, None);
    socket_feed(data);
});

/// Decodes `body` as each message type; checks what decodes.
fn messages(body: &[u8], fd_count: Option<usize>) {
    match schema::decode::<Request>(body) {
        Ok(request) => {
            round_trip(&request, Some(FrameKind::Request));
            match &request {
                Request::Call { args, .. }
                | Request::Submit { args, .. }
                | Request::InvalidateCall { args, .. } => payload(args, fd_count),
                _ => {}
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    match schema::decode::<Response>(body) {
        Ok(response) => {
            round_trip(&response, Some(FrameKind::Response));
            if let Response::Value(shared) = &response {
                payload(&shared.payload, fd_count);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    match schema::decode::<Payload>(body) {
        Ok(p) => {
            round_trip(&p, None);
            payload(&p, fd_count);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// encode(decode(encode(x))) == encode(x); for a request or response, the encoding
/// also goes through `send_frame` / `recv_frame` unchanged.
fn round_trip<T: Serialize + DeserializeOwned>(message: &T, kind: Option<FrameKind>) {
    let once = schema::encode(message).expect("a decoded message does not encode");
    let again: T =
        schema::decode(&once).unwrap_or_else(|e| panic!("our own encoding does not decode: {e}"));
    let twice = schema::encode(&again).unwrap();
    assert!(once == twice, "re-encoding is not stable");
    if let Some(kind) = kind {
        framed(kind, &once);
    }
}

/// `send_frame` then `recv_frame` on a socket pair (no descriptors).
fn framed(kind: FrameKind, body: &[u8]) {
    if body.len() > SOCKET_LIMITS.max_body as usize {
        return;
    }
    let (a, b) = UnixStream::pair().unwrap();
    b.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let request_id = body.len() as u32 ^ 0x5a5a_0001;
    send_frame(&a, kind, request_id, body, &[]).unwrap();
    match recv_frame(&b, &SOCKET_LIMITS, Duration::from_secs(5)).unwrap() {
        Received::Frame(frame) => {
            assert_eq!(frame.header.kind, kind);
            assert_eq!(frame.header.request_id, request_id);
            assert_eq!(frame.header.fd_count, 0);
            assert_eq!(frame.header.body_len as usize, body.len());
            assert!(frame.body == body, "body changed on the way");
            assert!(frame.fds.is_empty());
        }
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// Writes the raw input into a socket, closes the writing side, and reads one frame:
/// `recv_frame` must agree with `Header::decode` on the first 16 bytes.
fn socket_feed(data: &[u8]) {
    let (a, b) = UnixStream::pair().unwrap();
    b.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    (&a).write_all(data).unwrap();
    a.shutdown(Shutdown::Write).unwrap();
    let got = recv_frame(&b, &SOCKET_LIMITS, Duration::from_secs(5));
    if data.is_empty() {
        assert!(matches!(got, Ok(Received::Closed)), "{got:?}");
        return;
    }
    if data.len() < HEADER_LEN {
        assert!(got.is_err(), "a partial header gave {got:?}");
        return;
    }
    let head: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
    let rest = &data[HEADER_LEN..];
    let header = match Header::decode(&head, &SOCKET_LIMITS) {
        Ok(h) => h,
        Err(_) => {
            assert!(got.is_err(), "a refused header gave {got:?}");
            return;
        }
    };
    // Within the small limits means within the default ones too.
    assert_eq!(
        Header::decode(&head, &FrameLimits::default()).ok(),
        Some(header)
    );
    let body_len = header.body_len as usize;
    if body_len > rest.len() || header.fd_count != 0 {
        assert!(
            got.is_err(),
            "truncated body or missing descriptors gave {got:?}"
        );
        return;
    }
    match got {
        Ok(Received::Frame(frame)) => {
            assert_eq!(frame.header, header);
            assert!(
                frame.body == rest[..body_len],
                "body differs from the input"
            );
            assert!(frame.fds.is_empty());
        }
        other => panic!("a whole frame gave {other:?}"),
    }
}

/// `validate` for a few descriptor counts; what it accepts must be consistent.
fn payload(p: &Payload, fd_count: Option<usize>) {
    let mut accepted_at: Option<usize> = None;
    for n in [0usize, 1, 64].into_iter().chain(fd_count) {
        match p.validate(n) {
            Ok(()) => {
                check_valid(p, n);
                accepted_at = Some(accepted_at.map_or(n, |m| m.min(n)));
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    // More descriptors can only help.
    if let Some(n) = accepted_at {
        for m in [0usize, 1, 64].into_iter().chain(fd_count) {
            if m >= n {
                assert!(p.validate(m).is_ok(), "valid with {n} descriptors, not {m}");
            }
        }
    }
    match default_cache_key(p) {
        Ok(Some(key)) => {
            assert!(
                p.tensors.is_empty(),
                "a cache key for a payload with tensors"
            );
            assert!(key.len() % 2 == 0 && key.bytes().all(|c| c.is_ascii_hexdigit()));
        }
        Ok(None) => assert!(!p.tensors.is_empty(), "no cache key without tensors"),
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// What `validate(fd_count)` promises.
fn check_valid(p: &Payload, fd_count: usize) {
    for (i, s) in p.storages.iter().enumerate() {
        match &s.location {
            Location::Memfd { fd, offset } => {
                assert!((*fd as usize) < fd_count, "storage {i}: descriptor {fd}");
                assert!(offset.checked_add(s.len).is_some(), "storage {i}: overflow");
            }
            Location::Cuda {
                device_uuid,
                handle,
                alloc_size,
                offset,
                event,
            } => {
                assert_eq!(device_uuid.len(), 16, "storage {i}: uuid");
                assert_eq!(handle.len(), 64, "storage {i}: handle");
                assert!(event.is_empty() || event.len() == 64, "storage {i}: event");
                let end = offset.checked_add(s.len).expect("CUDA storage overflows");
                assert!(end <= *alloc_size, "storage {i} outside its allocation");
            }
            Location::CudaEmpty { device_uuid } => {
                assert_eq!(device_uuid.len(), 16, "storage {i}: uuid");
                assert_eq!(s.len, 0, "storage {i}: empty CUDA storage with bytes");
            }
        }
    }
    for (i, t) in p.tensors.iter().enumerate() {
        let storage = p
            .storages
            .get(t.storage as usize)
            .unwrap_or_else(|| panic!("tensor {i}: storage {} out of range", t.storage));
        let dtype = t
            .dtype()
            .unwrap_or_else(|e| panic!("tensor {i}: dtype does not parse: {e}"));
        assert!(dtype.size().is_some(), "tensor {i}: sub-byte dtype");
        assert!(t.shape.len() <= MAX_NDIM, "tensor {i}: too many dimensions");
        let elements = t.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        assert!(
            elements.is_some_and(|n| n <= schema::MAX_ELEMENTS),
            "tensor {i}: more than MAX_ELEMENTS elements"
        );
        assert_eq!(t.shape.len(), t.strides.len(), "tensor {i}: strides");
        let extent = strided::extent_bytes(dtype, &t.shape, &t.strides)
            .unwrap_or_else(|e| panic!("tensor {i}: extent: {e}"));
        let end = t.offset.checked_add(extent).expect("tensor end overflows");
        assert!(
            extent == 0 || end <= storage.len,
            "tensor {i} outside its storage"
        );
    }
    // Every tensor leaf in range (iteratively: trees can be deep).
    let mut stack = vec![&p.value];
    while let Some(node) = stack.pop() {
        match node {
            Node::Tensor(i) => assert!(
                (*i as usize) < p.tensors.len(),
                "leaf names tensor {i} of {}",
                p.tensors.len()
            ),
            Node::List(items) | Node::Tuple(items) => stack.extend(items),
            Node::Map(entries) => stack.extend(entries.iter().map(|(_, v)| v)),
            Node::Tagged(_, inner) => stack.push(inner),
            Node::Null
            | Node::Bool(_)
            | Node::Int(_)
            | Node::Float(_)
            | Node::Str(_)
            | Node::Bytes(_) => {}
        }
    }
}
