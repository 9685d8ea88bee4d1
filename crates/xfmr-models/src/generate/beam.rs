//! Beam search with the GNMT length penalty and fairseq's early stop.

use super::{
    host_step, length_penalty, ranked, BeamOptions, Generation, GenerationOptions, HostSteps,
    Hypothesis,
};
use crate::ModelError;

#[derive(Debug, Clone)]
struct Beam {
    tokens: Vec<u32>,
    log_prob: f64,
    attention: Vec<Vec<f32>>,
}

/// Beam search of every input of `first` at once: its `k` beams are rows `b·k .. (b+1)·k` of
/// each step of `steps`.
pub(super) fn beam_search(
    steps: &mut dyn HostSteps,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    beam: &BeamOptions,
) -> Result<Generation, ModelError> {
    let batch = first.len();
    let k = beam.beam_size;
    let alpha = beam.length_penalty;
    let finish = |b: &Beam, len: usize, finished: bool| Hypothesis {
        tokens: b.tokens.clone(),
        finished,
        log_prob: b.log_prob,
        score: b.log_prob / length_penalty(len, alpha),
        attention: options.return_attention.then(|| b.attention.clone()),
    };
    // Row b·k + j is beam j of input b. At the start all k rows are copies: only beam 0 is
    // alive (the others at -inf), so the first expansion does not pick k copies of one token.
    let expand: Vec<usize> = (0..batch * k).map(|r| r / k).collect();
    steps.reorder(&expand);
    let mut beams: Vec<Vec<Beam>> = (0..batch)
        .map(|_| {
            (0..k)
                .map(|j| Beam {
                    tokens: Vec::new(),
                    log_prob: if j == 0 { 0.0 } else { f64::NEG_INFINITY },
                    attention: Vec::new(),
                })
                .collect()
        })
        .collect();
    let mut finished: Vec<Vec<Hypothesis>> = vec![Vec::new(); batch];
    let mut done = vec![false; batch];
    let mut width = first[0].len();
    let mut input: Vec<u32> = expand
        .iter()
        .flat_map(|&b| first[b].iter().copied())
        .collect();
    for t in 0..options.max_len {
        options.check_cancelled()?;
        let (log_probs, attention) = host_step(steps, &input, width, t, options)?;
        let mut reorder: Vec<usize> = (0..batch * k).collect();
        let mut next = vec![options.pad_id; batch * k];
        for b in 0..batch {
            if done[b] {
                continue;
            }
            // The 2k best continuations of every beam, then the 2k best overall: enough to
            // refill k beams even if k of them end.
            let mut candidates: Vec<(f64, usize, usize)> = Vec::with_capacity(2 * k * k);
            for (j, bm) in beams[b].iter().enumerate() {
                if bm.log_prob == f64::NEG_INFINITY {
                    continue;
                }
                let row = &log_probs[b * k + j];
                for token in ranked(row, Some(2 * k)) {
                    candidates.push((bm.log_prob + row[token], j, token));
                }
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
            let mut alive = Vec::with_capacity(k);
            for (rank, &(log_prob, j, token)) in candidates.iter().enumerate() {
                if alive.len() == k {
                    break;
                }
                let parent = &beams[b][j];
                if token as u32 == options.eos_id {
                    // Only an end among the k best counts (fairseq): the rest would not have
                    // survived the cut anyway.
                    if rank < k {
                        let ended = Beam {
                            log_prob,
                            ..parent.clone()
                        };
                        finished[b].push(finish(&ended, t + 1, true));
                    }
                    continue;
                }
                let mut child = parent.clone();
                child.tokens.push(token as u32);
                child.log_prob = log_prob;
                if let Some(attn) = attention.as_ref() {
                    child.attention.push(attn[b * k + j].clone());
                }
                reorder[b * k + alive.len()] = b * k + j;
                next[b * k + alive.len()] = token as u32;
                alive.push(child);
            }
            while alive.len() < k {
                // Fewer live continuations than beams (tiny vocabularies): dead fillers.
                reorder[b * k + alive.len()] = b * k;
                alive.push(Beam {
                    tokens: Vec::new(),
                    log_prob: f64::NEG_INFINITY,
                    attention: Vec::new(),
                });
            }
            beams[b] = alive;
            // Early stop: once k hypotheses ended, none alive can enter the k best
            // under fairseq's rule, which also makes beam 1 equal greedy.
            if finished[b].len() >= k {
                done[b] = true;
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
        steps.reorder(&reorder);
        input = next;
        width = 1;
    }
    let hypotheses = (0..batch)
        .map(|b| {
            let mut all = std::mem::take(&mut finished[b]);
            if all.len() < beam.n_best {
                // Ran out of length: the live beams compete, unfinished.
                for bm in &beams[b] {
                    if bm.log_prob > f64::NEG_INFINITY {
                        all.push(finish(bm, bm.tokens.len(), false));
                    }
                }
            }
            all.sort_by(|x, y| y.score.total_cmp(&x.score));
            all.truncate(beam.n_best);
            all
        })
        .collect();
    Ok(Generation { hypotheses })
}
