//! Translating sentences with a trained model (greedy or beam, n-best), choosing and keeping
//! beam search's length penalty, the attention maps of one translation, and scoring
//! translations with BLEU and chrF.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use xfmr_io::write_atomic;
use xfmr_models::{BeamOptions, GenerationOptions, ModelError, Strategy, Transformer};

use xfmr_models::framed;
use xfmr_models::ladder::{record_shape, SourceBatches};

use crate::data::Pair;
use crate::error::TranslateError;
use crate::metrics::{corpus_bleu, corpus_chrf, BleuScore, MetricError};
use crate::tokenizer::SubwordTokenizer;

mod sources;

pub use sources::{
    encode_sources, max_source_tokens, EncodedSources, Overlong, SourceLimit,
    DEFAULT_MAX_SOURCE_TOKENS,
};

/// One candidate translation.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Detokenised text.
    pub text: String,
    /// Target ids (no start or end token).
    pub tokens: Vec<u32>,
    /// The generation's ranking score (log-probability; length-penalised for beam search).
    pub score: f64,
    /// Per target token, the cross-attention over the source tokens (end token included), when
    /// the options asked for it.
    pub attention: Option<Vec<Vec<f32>>>,
}

/// Translates `sentences`, `batches.rows` at a time (sorted by length so a batch wastes little
/// padding; results in input order), each batch padded as `batches` says (a `usize`: to its
/// longest source; [`SourceBatches::with_ladder`]: to a few shapes, [`xfmr_models::ladder`]). Each
/// source gets the end token appended, as in training; decoding starts from `bos_id`. Returns
/// per sentence its candidates, best first.
///
/// Sources longer than the model takes are refused ([`SourceLimit::of_model`]); to truncate
/// them instead, or set another limit, [`encode_sources`] then [`translate_ids`]. The options'
/// [`cancel`](GenerationOptions::cancel) token is checked before each batch and each decoding
/// step.
///
/// # Errors
/// [`TranslateError::SourceTooLong`] naming the source; encoding, an id outside the vocabulary,
/// invalid options; `TranslateError::Model(ModelError::Cancelled)` once cancelled.
pub fn translate<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sentences: &[&str],
    options: &GenerationOptions,
    batches: impl Into<SourceBatches>,
) -> Result<Vec<Vec<Candidate>>, TranslateError> {
    options.check_cancelled()?;
    let sources = encode_sources(tokenizer, sentences, SourceLimit::of_model(model))?;
    translate_ids(model, tokenizer, &sources.ids, options, batches)
}

/// [`translate`] of sources already encoded (each with its end token: [`encode_sources`]).
///
/// # Errors
/// An id outside the vocabulary, invalid options, a source longer than a learned position
/// table; `TranslateError::Model(ModelError::Cancelled)` once the options' token is cancelled
/// (checked before each batch and each decoding step).
pub fn translate_ids<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sources: &[Vec<u32>],
    options: &GenerationOptions,
    batches: impl Into<SourceBatches>,
) -> Result<Vec<Vec<Candidate>>, TranslateError> {
    let batches = batches.into();
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| sources[i].len());
    let mut out = vec![Vec::new(); sources.len()];
    for chunk in order.chunks(batches.rows.max(1)) {
        // Between batches: the encoder's work on the next one is not started for nobody.
        options.check_cancelled()?;
        let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| sources[i].clone()).collect();
        // Filler rows (copies) come after the chunk's own: `zip` leaves their results out.
        let batch = batches.pad(batch, tokenizer.pad_id());
        let longest = batch.iter().map(Vec::len).max().unwrap_or(0);
        record_shape("decoding", [batch.len(), longest, 0]);
        let generation = model.generate(&batch, tokenizer.bos_id(), options)?;
        for (&i, hypotheses) in chunk.iter().zip(generation.hypotheses) {
            out[i] = hypotheses
                .into_iter()
                .map(|h| {
                    Ok(Candidate {
                        text: tokenizer.decode(&h.tokens)?,
                        tokens: h.tokens,
                        score: h.score,
                        attention: h.attention,
                    })
                })
                .collect::<Result<Vec<_>, TranslateError>>()?;
        }
    }
    Ok(out)
}

/// [`translate`], keeping only the best candidate's text of each sentence (empty when the
/// search returned none).
///
/// # Errors
/// As [`translate`].
pub fn translate_best<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sentences: &[&str],
    options: &GenerationOptions,
    batches: impl Into<SourceBatches>,
) -> Result<Vec<String>, TranslateError> {
    Ok(translate(model, tokenizer, sentences, options, batches)?
        .into_iter()
        .map(|c| c.into_iter().next().map(|c| c.text).unwrap_or_default())
        .collect())
}

/// The length penalties [`choose_length_penalty`] tries by default: the paper's 0.6 and three
/// larger ones. On the ten-minute run's models beam search at 0.6 comes out short (brevity
/// penalty 0.92-0.96 on the test split); their validation split chose 1.0 or 1.5
/// (docs/training.md).
pub const LENGTH_PENALTIES: [f64; 4] = [0.6, 1.0, 1.5, 2.0];

/// Where a run directory records the length penalty chosen for it ([`DecodingChoice::save`]).
pub const DECODING_FILE: &str = "decoding.json";

/// The beam search length penalty α chosen for a trained model on held-out pairs, as the paper
/// chose its α = 0.6 and beam 4 "after experimentation on the development set"; what
/// `xfmr train` records in a run's [`DECODING_FILE`] and `xfmr translate`, `eval` and `serve`
/// then use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodingChoice {
    /// Beam size it was chosen for.
    pub beam_size: usize,
    /// The chosen α: the highest corpus BLEU, the first tried on ties.
    pub length_penalty: f64,
    /// Held-out pairs it was chosen on (0 when it was given, not chosen: `xfmr train
    /// --length-penalty`).
    pub sentences: usize,
    /// Every α tried, in order, with its corpus BLEU (none when it was given).
    pub tried: Vec<(f64, f64)>,
}

impl DecodingChoice {
    /// Beam search options with this choice's beam size and α (one hypothesis returned).
    pub fn beam_options(&self) -> BeamOptions {
        BeamOptions {
            beam_size: self.beam_size,
            length_penalty: self.length_penalty,
            ..BeamOptions::default()
        }
    }

    /// Writes it to `run_dir`'s [`DECODING_FILE`] (temporary file, then rename).
    ///
    /// # Errors
    /// [`TranslateError::Io`] naming the file, also for an α that is not finite or a beam size of
    /// 0 (nothing is written).
    pub fn save(&self, run_dir: &Path) -> Result<(), TranslateError> {
        let path = run_dir.join(DECODING_FILE);
        self.check(&path)?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| TranslateError::io(&path, e))?;
        Ok(write_atomic(&path, &json)?)
    }

    /// Reads `run_dir`'s [`DECODING_FILE`]; `None` when the run has none (trained before it
    /// existed, or without held-out pairs).
    ///
    /// # Errors
    /// [`TranslateError::Io`] naming the file when it cannot be read or parsed, or holds an α that
    /// is not finite or a beam size of 0.
    pub fn load(run_dir: &Path) -> Result<Option<Self>, TranslateError> {
        let path = run_dir.join(DECODING_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TranslateError::io(&path, e)),
        };
        let choice: Self =
            serde_json::from_slice(&bytes).map_err(|e| TranslateError::io(&path, e))?;
        choice.check(&path)?;
        Ok(Some(choice))
    }

    /// The length penalty `run_dir` records ([`DecodingChoice::load`]), else the paper's 0.6
    /// (`BeamOptions::default()`'s).
    ///
    /// # Errors
    /// As [`DecodingChoice::load`].
    pub fn length_penalty_of(run_dir: &Path) -> Result<f64, TranslateError> {
        Ok(
            Self::load(run_dir)?
                .map_or(BeamOptions::default().length_penalty, |c| c.length_penalty),
        )
    }

    /// Removes `run_dir`'s [`DECODING_FILE`] if there is one: a run whose final model was not
    /// given a length penalty must not keep the one of an earlier model.
    ///
    /// # Errors
    /// [`TranslateError::Io`] naming the file.
    pub fn forget(run_dir: &Path) -> Result<(), TranslateError> {
        let path = run_dir.join(DECODING_FILE);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TranslateError::io(&path, e)),
            _ => Ok(()),
        }
    }

    /// A finite α and a beam of at least 1, or an error naming `path`.
    fn check(&self, path: &Path) -> Result<(), TranslateError> {
        if !self.length_penalty.is_finite() || self.beam_size == 0 {
            return Err(TranslateError::io(
                path,
                format!(
                    "length_penalty {} must be finite and beam_size {} at least 1",
                    self.length_penalty, self.beam_size
                ),
            ));
        }
        Ok(())
    }
}

/// Chooses beam search's length penalty α for `model` on held-out `pairs`: translates them
/// with beam `beam_size` (at most `max_len` tokens; source batches as `batches` says, see
/// [`translate`]) once per α in `candidates` and keeps the
/// one with the highest corpus BLEU (the first on ties, so list the paper's 0.6 first). The
/// GNMT penalty divides a hypothesis's log-probability by ((5 + |Y|) / 6)^α: a larger α
/// favours longer translations, which a briefly trained model needs (its beam search ends
/// early; see [`LENGTH_PENALTIES`]).
///
/// # Errors
/// [`TranslateError::InvalidConfig`] for no pairs, no candidates, a candidate that is not finite
/// or a beam size below 2; encoding and generation errors.
pub fn choose_length_penalty<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    pairs: &[Pair],
    beam_size: usize,
    candidates: &[f64],
    max_len: usize,
    batches: impl Into<SourceBatches>,
) -> Result<DecodingChoice, TranslateError> {
    let batches = batches.into();
    let invalid = |field, value: String, expected| TranslateError::InvalidConfig {
        field,
        value,
        expected,
    };
    if pairs.is_empty() {
        return Err(invalid("pairs", "0".into(), "at least one held-out pair"));
    }
    if beam_size < 2 {
        return Err(invalid(
            "beam_size",
            beam_size.to_string(),
            "at least 2 (greedy search has no length penalty)",
        ));
    }
    if candidates.is_empty() || candidates.iter().any(|a| !a.is_finite()) {
        return Err(invalid(
            "length penalties",
            format!("{candidates:?}"),
            "at least one, all finite",
        ));
    }
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = pairs.iter().map(|p| p.tgt.clone()).collect();
    let mut tried = Vec::with_capacity(candidates.len());
    for &alpha in candidates {
        let options = GenerationOptions::greedy(max_len, tokenizer.eos_id(), tokenizer.pad_id())
            .with_strategy(Strategy::Beam(BeamOptions {
                beam_size,
                length_penalty: alpha,
                ..BeamOptions::default()
            }));
        let hyps = translate_best(model, tokenizer, &sources, &options, batches)?;
        let bleu = score(&hyps, &refs).map_err(|e| invalid("pairs", e.to_string(), "scorable"))?;
        tried.push((alpha, bleu.bleu.score));
    }
    let best = tried
        .iter()
        .fold(tried[0], |best, &t| if t.1 > best.1 { t } else { best });
    Ok(DecodingChoice {
        beam_size,
        length_penalty: best.0,
        sentences: pairs.len(),
        tried,
    })
}

/// What a translation model attends to while translating one sentence: see
/// [`translation_attention`].
#[derive(Debug, Clone, PartialEq)]
pub struct TranslationAttention {
    /// The greedy translation.
    pub translation: String,
    /// Source subword pieces, the end token included (the encoder's positions).
    pub source: Vec<String>,
    /// Target subword pieces the decoder predicted, the end token included (the decoder's
    /// query positions: row `i` is the step that produced piece `i`).
    pub target: Vec<String>,
    /// Per encoder layer, its self-attention `[heads, source, source]`, row-major.
    pub encoder: Vec<Vec<f32>>,
    /// Per decoder layer, its cross-attention `[heads, target, source]`, row-major.
    pub cross: Vec<Vec<f32>>,
    /// Heads per layer.
    pub heads: usize,
}

/// Translates `sentence` greedily (at most `max_len` tokens), then runs the model once more,
/// teacher-forced on that translation, keeping every layer's and head's encoder self-attention
/// and decoder cross-attention: what attention maps and the server's explorer show.
///
/// # Errors
/// Encoding, an id outside the vocabulary.
pub fn translation_attention<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sentence: &str,
    max_len: usize,
) -> Result<TranslationAttention, TranslateError> {
    let device = model.src_embedding.weight.device();
    let options = GenerationOptions::greedy(max_len, tokenizer.eos_id(), tokenizer.pad_id());
    let candidate = translate(model, tokenizer, &[sentence], &options, 1)?
        .into_iter()
        .flatten()
        .next();
    let (translation, target) =
        candidate.map_or((String::new(), Vec::new()), |c| (c.text, c.tokens));
    let src = framed(None, &tokenizer.encode(sentence)?, Some(tokenizer.eos_id()));
    let tgt_in = framed(Some(tokenizer.bos_id()), &target, None);
    let piece = |&id: &u32| tokenizer.piece(id).unwrap_or_else(|| format!("#{id}"));
    let tensor = |ids: &[u32]| {
        let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
        let n = ids.len();
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device)
    };
    let maps = model.forward_with_attention(tensor(&src), tensor(&tgt_in))?;
    let host = |layers: Vec<Tensor<B, 4>>| -> Result<Vec<Vec<f32>>, TranslateError> {
        layers
            .into_iter()
            .map(|w| {
                w.into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| {
                        TranslateError::Model(ModelError::InvalidInput(format!(
                            "attention weights: {e:?}"
                        )))
                    })
            })
            .collect()
    };
    let heads = maps.encoder.first().map_or(0, |w| w.dims()[1]);
    Ok(TranslationAttention {
        translation,
        source: src.iter().map(piece).collect(),
        target: target
            .iter()
            .chain([&tokenizer.eos_id()])
            .map(piece)
            .collect(),
        encoder: host(maps.encoder)?,
        cross: host(maps.cross)?,
        heads,
    })
}

/// Corpus BLEU and chrF of hypotheses against one reference each.
#[derive(Debug, Clone)]
pub struct Scores {
    /// sacreBLEU's corpus BLEU (13a tokenisation, exponential smoothing).
    pub bleu: BleuScore,
    /// sacreBLEU's chrF (character 6-grams, β = 2).
    pub chrf: f64,
}

/// BLEU and chrF of `hyps` against `refs` (one reference per hypothesis).
///
/// # Errors
/// [`MetricError`] if the counts differ.
pub fn score(hyps: &[String], refs: &[String]) -> Result<Scores, MetricError> {
    let refs = vec![refs.to_vec()];
    Ok(Scores {
        bleu: corpus_bleu(hyps, &refs)?,
        chrf: corpus_chrf(hyps, &refs)?,
    })
}

/// `bleu` as sacreBLEU prints it: `BLEU = 26.19 58.1/32.0/19.9/12.8 (BP = 1.000 ratio = 1.007
/// hyp_len = 1234 ref_len = 1225)` (score to 2 decimals, the n-gram precisions to 1, brevity
/// penalty and length ratio to 3; the ratio is 0 without reference tokens).
pub fn sacrebleu_line(bleu: &BleuScore) -> String {
    let precisions: Vec<String> = bleu.precisions.iter().map(|p| format!("{p:.1}")).collect();
    let ratio = match bleu.ref_len {
        0 => 0.0,
        n => bleu.sys_len as f64 / n as f64,
    };
    format!(
        "BLEU = {:.2} {} (BP = {:.3} ratio = {ratio:.3} hyp_len = {} ref_len = {})",
        bleu.score,
        precisions.join("/"),
        bleu.bp,
        bleu.sys_len,
        bleu.ref_len
    )
}

/// The scores of the sentences whose source length falls in one range.
#[derive(Debug, Clone)]
pub struct LengthBucket {
    /// Shortest source in the range, in characters (inclusive).
    pub min_chars: usize,
    /// The range's end in characters (exclusive); `None` for the last, open range.
    pub max_chars: Option<usize>,
    /// Sentences in the range.
    pub sentences: usize,
    /// Their corpus BLEU (brevity penalty in `bleu.bp`) and chrF.
    pub scores: Scores,
}

/// [`score`] per source-length range: `edges` (characters, ascending) cut the sources into
/// `[0, e₁)`, `[e₁, e₂)`, …, `[eₙ, ∞)`; empty ranges are left out. Where a model's quality
/// depends on the length it was trained on, this shows it: BLEU falling and the brevity penalty
/// dropping below 1 on long inputs means translations stop early.
///
/// # Errors
/// [`MetricError::LengthMismatch`] if `sources`, `hyps` and `refs` differ in length.
pub fn score_by_source_length(
    sources: &[&str],
    hyps: &[String],
    refs: &[String],
    edges: &[usize],
) -> Result<Vec<LengthBucket>, MetricError> {
    for (stream, n) in [(0, refs.len()), (1, sources.len())] {
        if n != hyps.len() {
            return Err(MetricError::LengthMismatch {
                stream,
                hyps: hyps.len(),
                refs: n,
            });
        }
    }
    let bucket = |chars: usize| edges.iter().take_while(|&&e| e <= chars).count();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); edges.len() + 1];
    for (i, source) in sources.iter().enumerate() {
        members[bucket(source.chars().count())].push(i);
    }
    members
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(b, m)| {
            let pick = |all: &[String]| m.iter().map(|&i| all[i].clone()).collect::<Vec<_>>();
            Ok(LengthBucket {
                min_chars: if b == 0 { 0 } else { edges[b - 1] },
                max_chars: edges.get(b).copied(),
                sentences: m.len(),
                scores: score(&pick(hyps), &pick(refs))?,
            })
        })
        .collect()
}
