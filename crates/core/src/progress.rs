//! Progress of long writes: a tensor's bytes handed on in chunks, with a report after
//! each, so that a progress bar moves within a large tensor too, and a caller can stop
//! the write between two chunks.

use crate::Result;

/// Bytes between two progress reports within one write.
pub const PROGRESS_CHUNK: usize = 8 << 20;

/// Called with the number of bytes just written; an error (such as
/// [`crate::Error::Cancelled`]) stops the write.
pub type Progress<'a> = &'a mut dyn FnMut(u64) -> Result<()>;

/// The byte reports of one tensor's write, for a caller that reports `(tensors done,
/// total, bytes done)`: bytes counted from `start` (the bytes done before the tensor)
/// as they go, with `done` tensors done; the tensor's end, at `start + nbytes`, is left
/// for the caller to report with the tensor counted as done.
pub fn within_tensor<'a>(
    progress: &'a mut dyn FnMut(usize, usize, u64) -> Result<()>,
    (done, total): (usize, usize),
    start: u64,
    nbytes: u64,
) -> impl FnMut(u64) -> Result<()> + 'a {
    let (mut at, end) = (start, start + nbytes);
    move |n| {
        at += n;
        if at < end {
            progress(done, total, at)?;
        }
        Ok(())
    }
}

/// Calls `write` on `data` in chunks of at most [`PROGRESS_CHUNK`] bytes (once, with
/// no bytes, for empty data), reporting each chunk's length to `progress` after it is
/// written. Stops at the first error, from `write` or from `progress`.
pub fn write_in_chunks(
    data: &[u8],
    progress: Progress<'_>,
    mut write: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    if data.is_empty() {
        return write(data);
    }
    for chunk in data.chunks(PROGRESS_CHUNK) {
        write(chunk)?;
        progress(chunk.len() as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn every_byte_is_written_once_in_order_and_reported() {
        let data: Vec<u8> = (0..PROGRESS_CHUNK * 2 + 5).map(|i| i as u8).collect();
        let (mut out, mut reports) = (Vec::new(), Vec::new());
        write_in_chunks(
            &data,
            &mut |n| {
                reports.push(n);
                Ok(())
            },
            |c| {
                out.extend_from_slice(c);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(out, data);
        assert_eq!(reports, [PROGRESS_CHUNK as u64, PROGRESS_CHUNK as u64, 5]);

        let mut calls = 0;
        write_in_chunks(&[], &mut |_| panic!("no bytes, no report"), |c| {
            calls += 1;
            assert!(c.is_empty());
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 1);
    }

    #[test]
    fn within_a_tensor_bytes_count_from_its_start_and_its_end_is_left_out() {
        let mut calls = Vec::new();
        let mut report = |done, total, bytes| {
            calls.push((done, total, bytes));
            Ok(())
        };
        let mut within = within_tensor(&mut report, (2, 5), 100, 30);
        for n in [10, 10, 10] {
            within(n).unwrap();
        }
        drop(within);
        assert_eq!(calls, [(2, 5, 110), (2, 5, 120)]);
    }

    #[test]
    fn the_first_error_of_a_write_or_a_report_stops_the_write() {
        let data = vec![0u8; PROGRESS_CHUNK * 3];
        // A failed chunk is not reported.
        let (mut reported, mut tries) = (0, 0);
        let err = write_in_chunks(
            &data,
            &mut |n| {
                reported += n;
                Ok(())
            },
            |_| {
                tries += 1;
                match tries {
                    2 => Err(Error::invalid("full")),
                    _ => Ok(()),
                }
            },
        );
        assert!(matches!(err, Err(Error::InvalidArgument { .. })));
        assert_eq!((reported, tries), (PROGRESS_CHUNK as u64, 2));

        // A report that fails stops the write before the next chunk.
        let mut tries = 0;
        let err = write_in_chunks(
            &data,
            &mut |_| Err(Error::Cancelled { what: "a test" }),
            |_| {
                tries += 1;
                Ok(())
            },
        );
        assert!(matches!(err, Err(Error::Cancelled { .. })));
        assert_eq!(tries, 1);
    }
}
