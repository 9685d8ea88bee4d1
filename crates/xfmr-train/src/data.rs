//! Batches of parallel text by token count (§5.1: "each training batch contained a set of
//! sentence pairs containing approximately 25000 source tokens and 25000 target tokens"), and
//! the seeded batch order of each epoch. The corpora themselves (reading, splitting) are
//! `xfmr_translate::data`'s.

use xfmr_translate::data::SplitMix64;

/// Groups pairs into batches by token count: pairs sorted by length (so a batch holds pairs of
/// similar lengths and wastes little padding), then cut so that a batch's padded size,
/// `rows × max(longest source, longest target)`, stays within `max_tokens`. A pair longer than
/// `max_tokens` alone gets a batch of its own. Returns indices into `lengths`
/// (`(source tokens, target tokens)` per pair); the batch order is by length, shuffle it per
/// epoch with [`shuffled`].
pub fn token_batches(lengths: &[(usize, usize)], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| (lengths[i].1, lengths[i].0, i));
    let mut batches = Vec::new();
    let mut batch: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        let len = lengths[i].0.max(lengths[i].1);
        let wider = longest.max(len);
        if !batch.is_empty() && (batch.len() + 1) * wider > max_tokens {
            batches.push(std::mem::take(&mut batch));
            longest = 0;
        }
        longest = longest.max(len);
        batch.push(i);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// The batch order of epoch `epoch` (a seeded Fisher–Yates shuffle of `0..n`), the same on every
/// run and platform, so that a resumed run sees the batches an uninterrupted one would.
pub fn shuffled(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}
