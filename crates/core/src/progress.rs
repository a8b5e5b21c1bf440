//! Progress of long writes: a tensor's bytes handed on in chunks, with a report after
//! each, so that a progress bar moves within a large tensor too.

/// Bytes between two progress reports within one write.
pub const PROGRESS_CHUNK: usize = 8 << 20;

/// Calls `write` on `data` in chunks of at most [`PROGRESS_CHUNK`] bytes (once, with
/// no bytes, for empty data), reporting each chunk's length to `progress` after it is
/// written. Stops at the first error.
pub fn write_in_chunks<E>(
    data: &[u8],
    progress: &mut dyn FnMut(u64),
    mut write: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    if data.is_empty() {
        return write(data);
    }
    for chunk in data.chunks(PROGRESS_CHUNK) {
        write(chunk)?;
        progress(chunk.len() as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_written_once_in_order_and_reported() {
        let data: Vec<u8> = (0..PROGRESS_CHUNK * 2 + 5).map(|i| i as u8).collect();
        let (mut out, mut reports) = (Vec::new(), Vec::new());
        write_in_chunks(&data, &mut |n| reports.push(n), |c| {
            out.extend_from_slice(c);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(out, data);
        assert_eq!(reports, [PROGRESS_CHUNK as u64, PROGRESS_CHUNK as u64, 5]);

        let mut calls = 0;
        write_in_chunks(&[], &mut |_| panic!("no bytes, no report"), |c| {
            calls += 1;
            assert!(c.is_empty());
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(calls, 1);

        // The first error stops the write, and the failed chunk is not reported.
        let mut reported = 0;
        let mut tries = 0;
        let err = write_in_chunks(&data, &mut |n| reported += n, |_| {
            tries += 1;
            if tries == 2 {
                Err("full")
            } else {
                Ok(())
            }
        });
        assert_eq!(
            (err, reported, tries),
            (Err("full"), PROGRESS_CHUNK as u64, 2)
        );
    }
}
