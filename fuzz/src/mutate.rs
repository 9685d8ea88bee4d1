//! Random mutations of kept inputs, for the replayer's short runs (libFuzzer has its own).
//!
//! The mutations of a byte-level fuzzer: flips, interesting values (0, 0xFF, 0x7F, 0x80, the
//! field separator), the little-endian bytes of boundary integers written over a count or a
//! length, deletions, duplications, insertions and splices of two inputs. Deterministic for a
//! seed, so a failure found in CI is found again by the same command.

/// The seeded generator the tests use (SplitMix64): the same input for the same seed.
pub use xfmr_testing::TestRng as Rng;

/// Integers that sit on the boundaries parsers get wrong, as 8 little-endian bytes.
const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7F,
    0xFF,
    0x7FFF,
    0xFFFF,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

/// `input` changed by one to four random mutations (`other`, another kept input, for
/// splices), at most `max_len` bytes long.
pub fn mutate(input: &[u8], other: &[u8], max_len: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = [0, 0xFF, 0x7F, 0x80, 0x20, b'\n', b'\t', b'"'][rng.below(8)];
            }
            2 if len > 0 => {
                let i = rng.below(len);
                let bytes = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let width = [1, 2, 4, 8][rng.below(4)];
                for (k, b) in bytes.iter().take(width).enumerate() {
                    if let Some(slot) = out.get_mut(i + k) {
                        *slot = *b;
                    }
                }
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                out.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(32)).min(len);
                let copy = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, copy);
            }
            5 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                out.splice(at..at, bytes);
            }
            6 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            7 => {
                let at = rng.below(len + 1);
                out.insert(at, 0xFF);
            }
            _ if len > 0 => {
                out.truncate(rng.below(len));
            }
            _ => out.push(rng.next_u64() as u8),
        }
    }
    out.truncate(max_len);
    out
}
