//! Prefix caching: the key/value caches of earlier sequences, kept so that a new sequence
//! which begins with the same tokens starts from them instead of feeding those tokens again.
//!
//! A causal model's keys and values at position `i` depend only on the tokens at positions
//! `0..=i`, so any common prefix of two token sequences has the same cached rows in both.
//! A server's prompts mostly begin the same way (a chat template's system prompt, a
//! conversation's earlier turns), which makes the prompt's processing (the prefill) mostly
//! a copy: llama.cpp's server and vLLM keep caches across requests for the same reason.

use xfmr_kernels::HeadCache;

use super::SequenceCache;

/// One kept sequence: the tokens fed and, per layer and key/value head, their keys and values.
#[derive(Debug, Clone)]
struct Entry {
    tokens: Vec<u32>,
    heads: Vec<HeadCache>,
    /// The [`PrefixCache`]'s clock when it was last stored or used (least recently used goes
    /// first).
    used: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        bytes(&self.heads, self.tokens.len())
    }
}

/// Whether two sequences' caches are of one model and precision (as many heads, as wide, their
/// elements of one type): only then is one a prefix of the other's.
fn same_kind(a: &[HeadCache], b: &[HeadCache]) -> bool {
    let kind = |heads: &[HeadCache]| heads.first().map(|h| (h.d_k(), h.precision()));
    a.len() == b.len() && kind(a) == kind(b)
}

/// What keeping `tokens` positions with these keys and values costs.
fn bytes(heads: &[HeadCache], tokens: usize) -> usize {
    heads.iter().map(HeadCache::bytes).sum::<usize>() + tokens * std::mem::size_of::<u32>()
}

/// Key/value caches of earlier sequences of one [`QuantizedLlama`], at most `max_bytes` of
/// them, the least recently used dropped first.
///
/// [`restore`](Self::restore) starts an empty [`SequenceCache`] from the longest prefix of a
/// prompt that any kept sequence shares (copying those positions' keys and values), so only
/// the rest of the prompt has to be fed; [`store`](Self::store) keeps what a sequence has
/// been fed. The logits after a restored prefix are those of feeding the whole prompt up to
/// the products' rounding (a different number of rows per product can take another kernel,
/// which sums in another order).
///
/// ```
/// use xfmr_llm::quantized::PrefixCache;
///
/// let mut prefixes = PrefixCache::new(64 << 20);
/// assert_eq!(prefixes.bytes(), 0);
/// // With a model: `let reused = prefixes.restore(&prompt, &mut cache);` then feed
/// // `&prompt[reused..]`, and after the step `prefixes.store(&prompt, &cache);`.
/// ```
///
/// [`QuantizedLlama`]: super::QuantizedLlama
#[derive(Debug, Clone, Default)]
pub struct PrefixCache {
    entries: Vec<Entry>,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
}

impl PrefixCache {
    /// An empty cache that keeps at most `max_bytes` of keys, values and tokens (0 keeps
    /// nothing).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            ..Self::default()
        }
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sequences kept now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Starts `cache` (empty, as [`QuantizedLlama::sequence`] makes it) from the longest
    /// prefix of `prompt` shared with a kept sequence, leaving at least the prompt's last
    /// token to be fed (the step that feeds it gives the logits that follow the prompt).
    /// Returns how many positions were reused: feed `&prompt[reused..]` next.
    ///
    /// A cache that is not empty is left alone (0). One `PrefixCache` serves one model: kept
    /// sequences with another number of layers and heads, another head width or another cache
    /// precision are passed over.
    ///
    /// [`QuantizedLlama::sequence`]: super::QuantizedLlama::sequence
    pub fn restore(&mut self, prompt: &[u32], cache: &mut SequenceCache) -> usize {
        if !cache.is_empty() || cache.skip != 0 || prompt.len() < 2 {
            return 0;
        }
        let limit = prompt.len() - 1;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| same_kind(&e.heads, &cache.heads))
            .map(|e| {
                let shared = e
                    .tokens
                    .iter()
                    .zip(&prompt[..limit])
                    .take_while(|(a, b)| a == b)
                    .count();
                (shared, e)
            })
            .max_by_key(|(shared, _)| *shared);
        let Some((shared, entry)) = best else {
            return 0;
        };
        if shared == 0 {
            return 0;
        }
        for (to, from) in cache.heads.iter_mut().zip(&entry.heads) {
            to.copy_prefix(from, shared);
        }
        cache.len = shared;
        self.clock += 1;
        entry.used = self.clock;
        shared
    }

    /// Keeps the keys and values of the tokens `cache` has been fed: `tokens` starts with
    /// them (its first `cache.len()` are used; given fewer, nothing is kept). A kept sequence
    /// of the same model and cache precision that begins with these tokens already holds them
    /// (nothing is added); kept sequences of that kind that these tokens extend are replaced.
    /// Then the least recently used go until the rest fit. A sequence larger than the whole
    /// budget is not kept (nor copied).
    pub fn store(&mut self, tokens: &[u32], cache: &SequenceCache) {
        if cache.skip != 0 || cache.len == 0 || tokens.len() < cache.len {
            return;
        }
        let tokens = &tokens[..cache.len];
        let size = bytes(&cache.heads, tokens.len());
        if size > self.max_bytes {
            return;
        }
        self.clock += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(tokens) && same_kind(&e.heads, &cache.heads))
        {
            e.used = self.clock;
            return;
        }
        let entry = Entry {
            tokens: tokens.to_vec(),
            heads: cache.heads.clone(),
            used: self.clock,
        };
        let mut freed = 0;
        self.entries.retain(|e| {
            let covered = tokens.starts_with(&e.tokens) && same_kind(&e.heads, &cache.heads);
            if covered {
                freed += e.bytes();
            }
            !covered
        });
        self.bytes -= freed;
        while self.bytes + size > self.max_bytes {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].used)
                .expect("bytes are kept, so entries are");
            self.bytes -= self.entries.swap_remove(oldest).bytes();
        }
        self.bytes += size;
        self.entries.push(entry);
    }
}
