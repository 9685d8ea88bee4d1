//! Corpus BLEU, sentence BLEU and chrF, computed as sacreBLEU 2.6 computes them by default, so
//! that scores reported here can be put beside published ones.
//!
//! - **BLEU** (Papineni et al., 2002): the `13a` tokenisation of mteval-v13a (see
//!   [`tokenize_13a`]), n-grams up to 4, counts clipped by the largest count in any reference,
//!   the closest reference length (the shorter one on a tie) for the brevity penalty, and
//!   sacreBLEU's default `exp` smoothing (an order with no match counts as
//!   `1 / (2^k · total)`, `k` the number of such orders so far):
//!
//!   BLEU = BP · exp(¼ Σₙ log pₙ),   BP = min(1, exp(1 − r / c))
//!
//! - **Sentence BLEU**: the same on one segment with *effective order* (orders the hypothesis is
//!   too short to have are left out of the mean), as `BLEU(effective_order=True)`.
//! - **chrF** (Popović, 2015): character n-grams of orders 1..=6 with whitespace removed,
//!   precision and recall averaged over the orders both sides have, combined as F_β with β = 2;
//!   with several references a segment takes the statistics of its best-scoring one.
//!
//! Scores are percentages (0–100). Statistics are summed over the corpus before the score is
//! taken (a corpus score is not a mean of sentence scores).

use std::collections::HashMap;

use thiserror::Error;

/// Largest n-gram order of BLEU.
pub const BLEU_ORDER: usize = 4;
/// Largest character n-gram order of chrF.
pub const CHRF_ORDER: usize = 6;
/// β of chrF: recall weighs β² = 4 times as much as precision.
pub const CHRF_BETA: f64 = 2.0;

/// What can be wrong with a metric's input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MetricError {
    /// A reference stream whose length differs from the hypotheses'.
    #[error("reference stream {stream} has {refs} segments but there are {hyps} hypotheses")]
    LengthMismatch {
        /// Index of the reference stream.
        stream: usize,
        /// Number of hypotheses.
        hyps: usize,
        /// Number of segments in that stream.
        refs: usize,
    },
    /// No reference stream at all.
    #[error("no reference stream given")]
    NoReferences,
}

/// A BLEU score with the statistics it was computed from (as sacreBLEU's `BLEUScore`).
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// BLEU, 0–100.
    pub score: f64,
    /// Matched (clipped) n-grams of each order 1..=4.
    pub counts: [usize; BLEU_ORDER],
    /// Hypothesis n-grams of each order.
    pub totals: [usize; BLEU_ORDER],
    /// The (smoothed) n-gram precisions, 0–100.
    pub precisions: [f64; BLEU_ORDER],
    /// Brevity penalty.
    pub bp: f64,
    /// Hypothesis length in tokens.
    pub sys_len: usize,
    /// Effective reference length in tokens.
    pub ref_len: usize,
}

/// The `13a` tokenisation (mteval-v13a, sacreBLEU's default): unescapes `&quot; &amp; &lt;
/// &gt;`, splits off punctuation and symbols, splits `.` and `,` unless between digits, splits
/// `-` after a digit, and collapses whitespace (Python's definition of it).
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    let chars: Vec<char> = format!(" {line} ").chars().collect();

    // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) → " \1 "
    let mut pass = Vec::with_capacity(chars.len() * 2);
    for c in chars {
        if matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/') {
            pass.extend([' ', c, ' ']);
        } else {
            pass.push(c);
        }
    }
    let digit = |c: char| c.is_ascii_digit();
    let period = |c: char| c == '.' || c == ',';
    // ([^0-9])([\.,]) → "\1 \2 "
    let pass = substitute_pairs(
        &pass,
        |a, b| !digit(a) && period(b),
        |a, b| vec![a, ' ', b, ' '],
    );
    // ([\.,])([^0-9]) → " \1 \2"
    let pass = substitute_pairs(
        &pass,
        |a, b| period(a) && !digit(b),
        |a, b| vec![' ', a, ' ', b],
    );
    // ([0-9])(-) → "\1 \2 "
    let pass = substitute_pairs(
        &pass,
        |a, b| digit(a) && b == '-',
        |a, b| vec![a, ' ', b, ' '],
    );
    let joined: String = pass.into_iter().collect();
    py_split(&joined).collect::<Vec<_>>().join(" ")
}

/// `re.sub` of a pattern of two one-character classes: leftmost matches, not overlapping.
fn substitute_pairs(
    s: &[char],
    matches: impl Fn(char, char) -> bool,
    replace: impl Fn(char, char) -> Vec<char>,
) -> Vec<char> {
    let mut out = Vec::with_capacity(s.len() + s.len() / 2);
    let mut i = 0;
    while i < s.len() {
        if i + 1 < s.len() && matches(s[i], s[i + 1]) {
            out.extend(replace(s[i], s[i + 1]));
            i += 2;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Python's `str.isspace`: Unicode white space plus the ASCII separators U+001C–U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()`.
fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(py_space).filter(|w| !w.is_empty())
}

/// BLEU's sufficient statistics of one segment.
#[derive(Debug, Clone, Copy, Default)]
struct BleuStats {
    sys_len: usize,
    ref_len: usize,
    correct: [usize; BLEU_ORDER],
    total: [usize; BLEU_ORDER],
}

impl std::ops::AddAssign for BleuStats {
    fn add_assign(&mut self, o: Self) {
        self.sys_len += o.sys_len;
        self.ref_len += o.ref_len;
        for n in 0..BLEU_ORDER {
            self.correct[n] += o.correct[n];
            self.total[n] += o.total[n];
        }
    }
}

fn word_ngrams<'a>(tokens: &'a [&'a str]) -> HashMap<&'a [&'a str], usize> {
    let mut counts = HashMap::new();
    for n in 1..=BLEU_ORDER {
        for gram in tokens.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

fn bleu_segment(hyp: &str, refs: &[&str]) -> BleuStats {
    let hyp = tokenize_13a(py_rstrip(hyp));
    let refs: Vec<String> = refs.iter().map(|r| tokenize_13a(py_rstrip(r))).collect();
    let ref_tokens: Vec<Vec<&str>> = refs.iter().map(|r| py_split(r).collect()).collect();
    let mut ref_counts: HashMap<&[&str], usize> = HashMap::new();
    for tokens in &ref_tokens {
        for (gram, count) in word_ngrams(tokens) {
            let best = ref_counts.entry(gram).or_insert(0);
            *best = (*best).max(count);
        }
    }
    let hyp_tokens: Vec<&str> = py_split(&hyp).collect();
    let hyp_len = hyp_tokens.len();
    // The closest reference length; the shorter one on a tie.
    let mut ref_len = None::<usize>;
    for tokens in &ref_tokens {
        let len = tokens.len();
        ref_len = Some(match ref_len {
            None => len,
            Some(best) => {
                let (d, db) = (len.abs_diff(hyp_len), best.abs_diff(hyp_len));
                if d < db || (d == db && len < best) {
                    len
                } else {
                    best
                }
            }
        });
    }
    let mut stats = BleuStats {
        sys_len: hyp_len,
        ref_len: ref_len.unwrap_or(0),
        ..BleuStats::default()
    };
    for (gram, count) in word_ngrams(&hyp_tokens) {
        let n = gram.len() - 1;
        stats.total[n] += count;
        stats.correct[n] += count.min(ref_counts.get(gram).copied().unwrap_or(0));
    }
    stats
}

/// Python's `str.rstrip()`.
fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(py_space)
}

/// sacreBLEU's `my_log`: `log`, with `log 0` floored to −9 999 999 999.
fn floored_log(x: f64) -> f64 {
    if x == 0.0 {
        -9_999_999_999.0
    } else {
        x.ln()
    }
}

fn bleu_from_stats(stats: BleuStats, effective_order: bool) -> BleuScore {
    let BleuStats {
        sys_len,
        ref_len,
        correct,
        total,
    } = stats;
    let bp = if sys_len >= ref_len {
        1.0
    } else if sys_len > 0 {
        (1.0 - ref_len as f64 / sys_len as f64).exp()
    } else {
        0.0
    };
    let mut precisions = [0.0; BLEU_ORDER];
    // No match at all: 0 without smoothing (sacreBLEU's early stop).
    let mut score = 0.0;
    if correct.iter().any(|&c| c > 0) {
        let mut smooth = 1.0;
        let mut order = BLEU_ORDER;
        for n in 0..BLEU_ORDER {
            if total[n] == 0 {
                break;
            }
            if effective_order {
                order = n + 1;
            }
            precisions[n] = if correct[n] == 0 {
                smooth *= 2.0;
                100.0 / (smooth * total[n] as f64)
            } else {
                100.0 * correct[n] as f64 / total[n] as f64
            };
        }
        let mean_log = precisions[..order]
            .iter()
            .map(|&p| floored_log(p))
            .sum::<f64>()
            / order as f64;
        score = bp * mean_log.exp();
    }
    BleuScore {
        score,
        counts: correct,
        totals: total,
        precisions,
        bp,
        sys_len,
        ref_len,
    }
}

/// Checks that every reference stream is as long as the hypotheses, and returns segment `i`'s
/// references.
fn segments<'a, R: AsRef<str>>(
    n_hyps: usize,
    refs: &'a [Vec<R>],
) -> Result<impl Fn(usize) -> Vec<&'a str>, MetricError> {
    if refs.is_empty() {
        return Err(MetricError::NoReferences);
    }
    for (stream, r) in refs.iter().enumerate() {
        if r.len() != n_hyps {
            return Err(MetricError::LengthMismatch {
                stream,
                hyps: n_hyps,
                refs: r.len(),
            });
        }
    }
    Ok(move |i: usize| refs.iter().map(|stream| stream[i].as_ref()).collect())
}

/// Corpus BLEU of `hyps` against one or more reference streams (`refs[k][i]` is the `k`-th
/// reference of segment `i`), as sacreBLEU's `BLEU().corpus_score(hyps, refs)`.
///
/// # Errors
/// [`MetricError`] if no stream is given or a stream's length differs from the hypotheses'.
pub fn corpus_bleu<H: AsRef<str>, R: AsRef<str>>(
    hyps: &[H],
    refs: &[Vec<R>],
) -> Result<BleuScore, MetricError> {
    let refs_of = segments(hyps.len(), refs)?;
    let mut stats = BleuStats::default();
    for (i, hyp) in hyps.iter().enumerate() {
        stats += bleu_segment(hyp.as_ref(), &refs_of(i));
    }
    Ok(bleu_from_stats(stats, false))
}

/// BLEU of one segment with effective order, as sacreBLEU's
/// `BLEU(effective_order=True).sentence_score(hyp, refs)`.
pub fn sentence_bleu(hyp: &str, refs: &[&str]) -> BleuScore {
    bleu_from_stats(bleu_segment(hyp, refs), true)
}

/// chrF's statistics: per order, hypothesis n-grams, reference n-grams and matches.
type ChrfStats = [[usize; 3]; CHRF_ORDER];

fn char_ngrams(chars: &[char]) -> Vec<HashMap<&[char], usize>> {
    (1..=CHRF_ORDER)
        .map(|n| {
            let mut counts = HashMap::new();
            for gram in chars.windows(n) {
                *counts.entry(gram).or_insert(0) += 1;
            }
            counts
        })
        .collect()
}

fn chrf_score(stats: &ChrfStats) -> f64 {
    let eps = 1e-16;
    let factor = CHRF_BETA * CHRF_BETA;
    let (mut avg_prec, mut avg_rec, mut order) = (0.0, 0.0, 0usize);
    for &[n_hyp, n_ref, n_match] in stats {
        let prec = if n_hyp > 0 {
            n_match as f64 / n_hyp as f64
        } else {
            eps
        };
        let rec = if n_ref > 0 {
            n_match as f64 / n_ref as f64
        } else {
            eps
        };
        if n_hyp > 0 && n_ref > 0 {
            avg_prec += prec;
            avg_rec += rec;
            order += 1;
        }
    }
    if order == 0 {
        return 0.0;
    }
    avg_prec /= order as f64;
    avg_rec /= order as f64;
    if avg_prec + avg_rec == 0.0 {
        return 0.0;
    }
    100.0 * (1.0 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec)
}

fn chrf_segment(hyp: &str, refs: &[&str]) -> ChrfStats {
    let strip = |s: &str| py_split(s).flat_map(str::chars).collect::<Vec<char>>();
    let hyp_chars = strip(hyp);
    let hyp_grams = char_ngrams(&hyp_chars);
    let mut best: Option<(f64, ChrfStats)> = None;
    for r in refs {
        let ref_chars = strip(r);
        let ref_grams = char_ngrams(&ref_chars);
        let mut stats = [[0usize; 3]; CHRF_ORDER];
        for (n, (h, r)) in hyp_grams.iter().zip(&ref_grams).enumerate() {
            let hyp_count: usize = h.values().sum();
            let matches: usize = h
                .iter()
                .map(|(g, &c)| c.min(r.get(g).copied().unwrap_or(0)))
                .sum();
            // A hypothesis n-gram counts only where the reference has n-grams of that order.
            stats[n] = [
                if r.is_empty() { 0 } else { hyp_count },
                r.values().sum(),
                matches,
            ];
        }
        let f = chrf_score(&stats);
        if best.as_ref().is_none_or(|(b, _)| f > *b) {
            best = Some((f, stats));
        }
    }
    best.map(|(_, s)| s).unwrap_or([[0; 3]; CHRF_ORDER])
}

/// Corpus chrF (chrF2, character 6-grams) as sacreBLEU's `CHRF().corpus_score(hyps, refs)`.
///
/// # Errors
/// [`MetricError`] if no stream is given or a stream's length differs from the hypotheses'.
pub fn corpus_chrf<H: AsRef<str>, R: AsRef<str>>(
    hyps: &[H],
    refs: &[Vec<R>],
) -> Result<f64, MetricError> {
    let refs_of = segments(hyps.len(), refs)?;
    let mut total = [[0usize; 3]; CHRF_ORDER];
    for (i, hyp) in hyps.iter().enumerate() {
        let stats = chrf_segment(hyp.as_ref(), &refs_of(i));
        for (t, s) in total.iter_mut().zip(stats) {
            for k in 0..3 {
                t[k] += s[k];
            }
        }
    }
    Ok(chrf_score(&total))
}
