//! Large memory copies shared between the calling thread and a few helper threads:
//! a large copy is cut into chunks that the caller and the helpers take from one
//! queue ([`crate::helpers::for_each`]).

/// Total bytes below which a copy runs on the calling thread alone (waking a helper
/// costs more than it saves).
pub const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// Bytes per chunk of work: small enough that the last chunk a helper finishes is
/// short, large enough that taking chunks costs nothing next to copying them.
const CHUNK: usize = 128 << 10;

/// Copies `src` into `dst`, in parallel when large.
///
/// # Panics
///
/// When the lengths differ (as [`slice::copy_from_slice`]).
pub fn copy(dst: &mut [u8], src: &[u8]) {
    copy_pairs(vec![(dst, src)]);
}

/// Copies each `(destination, source)` pair, in parallel when the total is large.
///
/// # Panics
///
/// When a pair's lengths differ (as [`slice::copy_from_slice`]), before anything is
/// copied.
pub fn copy_pairs(pairs: Vec<(&mut [u8], &[u8])>) {
    let mut total = 0usize;
    for (dst, src) in &pairs {
        assert_eq!(dst.len(), src.len(), "copy_pairs: lengths differ");
        total = total.saturating_add(src.len());
    }
    if total < PARALLEL_MIN_BYTES {
        for (dst, src) in pairs {
            dst.copy_from_slice(src);
        }
        return;
    }
    let mut chunks = Vec::with_capacity(pairs.len() + total / CHUNK);
    for (dst, src) in pairs {
        chunks.extend(dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)));
    }
    let helpers = total / PARALLEL_MIN_BYTES;
    crate::helpers::for_each(chunks, helpers, |(dst, src)| dst.copy_from_slice(src));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn small_and_large_copies_are_exact() {
        for len in [0, 1, 4095, CHUNK + 3, PARALLEL_MIN_BYTES * 3 + 17] {
            let src = pattern(len, 7);
            let mut dst = vec![0u8; len];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "len {len}");
        }
    }

    #[test]
    fn pairs_land_in_their_own_destinations() {
        // Unaligned sources of many sizes, some below and some above a chunk, with a
        // total over the parallel threshold.
        let src = pattern(6 << 20, 3);
        let sizes = [
            1usize,
            513,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            700_000,
            1 << 20,
            3,
        ];
        let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut at = 1;
        let mut expected = Vec::new();
        let mut pairs = Vec::new();
        for (dst, &n) in dsts.iter_mut().zip(&sizes) {
            expected.push(&src[at..at + n]);
            pairs.push((dst.as_mut_slice(), &src[at..at + n]));
            at += n + 5;
        }
        copy_pairs(pairs);
        for (dst, want) in dsts.iter().zip(expected) {
            assert_eq!(dst.as_slice(), want);
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn mismatched_lengths_panic_before_copying() {
        let mut dst = [0u8; 3];
        copy_pairs(vec![(&mut dst[..], &[1u8, 2][..])]);
    }
}
