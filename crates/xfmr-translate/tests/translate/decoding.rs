//! Beam search's length penalty chosen on held-out pairs, and the run file that records it.

use std::fs;
use std::time::{Duration, Instant};

use burn::backend::NdArray;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorData};
use xfmr_models::generate::Cancel;
use xfmr_models::ladder::{LengthLadder, SourceBatches};
use xfmr_models::{
    BeamOptions, GenerationOptions, ModelError, Strategy, Transformer, TransformerConfig,
};
use xfmr_translate::data::{Pair, SplitMix64};
use xfmr_translate::translate::{
    choose_length_penalty, encode_sources, max_source_tokens, sacrebleu_line, score, translate,
    translate_best, translate_ids, DecodingChoice, Overlong, SourceLimit, DECODING_FILE,
};
use xfmr_translate::{SubwordTokenizer, TranslateError};

type Infer = NdArray<f32>;

const MAX_LEN: usize = 24;
const BEAM: usize = 4;
const EOS_BIAS: f32 = -1.0;
const WEIGHT: f32 = 1.0;

/// A small vocabulary and an untrained tiny model with seeded weights, its output layer biased
/// so that the length penalty changes the translations.
fn model() -> (Transformer<Infer>, SubwordTokenizer, Vec<Pair>) {
    // One-letter words: most pieces of the vocabulary are whole words ("▁a"), so even an
    // untrained model's translations have words for BLEU to count.
    let text = ["a b c d e f", "g h i j k l", "a c e g i k", "b d f h j l"];
    let corpus: Vec<&str> = (0..10).flat_map(|_| text).collect();
    let tokenizer = SubwordTokenizer::train(corpus.iter(), 29).unwrap();
    let device = Default::default();
    // Weights from a seeded generator of the test's own, not burn's global one, which the other
    // tests running in parallel draw from.
    let mut config = TransformerConfig::tiny(tokenizer.vocab_size());
    config.tie_output = false;
    let model = config.init::<Infer>(&device).unwrap();
    let mut model = model.map(&mut Fill(SplitMix64(11)));
    // The output layer's bias: whole words only (a piece "▁x"; the others far down), so that
    // every translation is a sequence of words for BLEU to count; and the end token moved by
    // EOS_BIAS so that some beams end early and others run on (found by trying: at 0 and
    // above nearly every translation at α = 0 is empty, at -2 and below most run to MAX_LEN).
    let output = model.output.as_mut().unwrap();
    let bias = output.bias.take().unwrap().val();
    let eos = tokenizer.eos_id();
    let shift: Vec<f32> = (0..tokenizer.vocab_size() as u32)
        .map(|id| match tokenizer.piece(id) {
            _ if id == eos => EOS_BIAS,
            Some(p) if p.starts_with('▁') && p.chars().count() > 1 => 0.0,
            _ => -30.0,
        })
        .collect();
    let n = shift.len();
    let shift = Tensor::<Infer, 1>::from_data(TensorData::new(shift, [n]), &device);
    output.bias = Some(Param::from_tensor(bias + shift));
    let sources = [
        "a b",
        "c d e",
        "f",
        "g h i j",
        "k l a",
        "b",
        "c e g i k",
        "d f",
        "h j l",
        "a l",
    ];
    let pairs = sources
        .iter()
        .map(|s| Pair {
            src: s.to_string(),
            tgt: String::new(),
        })
        .collect();
    (model, tokenizer, pairs)
}

/// Replaces every weight with a uniform draw in [-WEIGHT, WEIGHT] from its generator.
struct Fill(SplitMix64);

impl ModuleMapper<Infer> for Fill {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<Infer, D>>,
    ) -> Param<Tensor<Infer, D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let values: Vec<f32> = (0..shape.num_elements())
            .map(|_| {
                ((self.0.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * WEIGHT
            })
            .collect();
        let filled = Tensor::from_data(TensorData::new(values, shape), &tensor.device());
        Param::from_mapped_value(id, filled, mapper)
    }
}

/// Beam search's best hypothesis per source at length penalty `alpha`.
fn beam(
    model: &Transformer<Infer>,
    tok: &SubwordTokenizer,
    pairs: &[Pair],
    alpha: f64,
) -> Vec<String> {
    let options = GenerationOptions::greedy(MAX_LEN, tok.eos_id(), tok.pad_id()).with_strategy(
        Strategy::Beam(BeamOptions {
            beam_size: BEAM,
            length_penalty: alpha,
            ..BeamOptions::default()
        }),
    );
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    // Batches of 32, as `choose_length_penalty` translates: the same padding, the same sums.
    translate_best(model, tok, &sources, &options, 32).unwrap()
}

/// With each length penalty's own translations as the references, that penalty scores BLEU 100
/// and is chosen over the other; every BLEU recorded is the corpus BLEU of that penalty's
/// translations; ties go to the first tried.
#[test]
fn the_length_penalty_with_the_best_bleu_is_chosen() {
    let (model, tok, pairs) = model();
    let (short, long) = (0.0, 5.0);
    let at = |alpha| beam(&model, &tok, &pairs, alpha);
    let (short_hyps, long_hyps) = (at(short), at(long));
    // The premise: the penalty changes what beam search returns on these sources.
    assert_ne!(
        short_hyps, long_hyps,
        "the length penalty changes nothing here"
    );
    for (refs, expected) in [(&short_hyps, short), (&long_hyps, long)] {
        let held_out: Vec<Pair> = pairs
            .iter()
            .zip(refs.iter())
            .map(|(p, r)| Pair {
                src: p.src.clone(),
                tgt: r.clone(),
            })
            .collect();
        let choice =
            choose_length_penalty(&model, &tok, &held_out, BEAM, &[short, long], MAX_LEN, 32)
                .unwrap();
        assert_eq!(choice.length_penalty, expected, "{choice:?}");
        // The premise of the comparison: a penalty's own translations score 100 against
        // themselves (some are long enough to have 4-grams).
        let own = choice.tried.iter().find(|t| t.0 == expected).unwrap().1;
        assert!((own - 100.0).abs() < 1e-9, "{choice:?}");
        assert_eq!((choice.beam_size, choice.sentences), (BEAM, pairs.len()));
        let tried: Vec<f64> = choice.tried.iter().map(|t| t.0).collect();
        assert_eq!(tried, [short, long]);
        for &(alpha, bleu) in &choice.tried {
            let direct = score(&at(alpha), refs).unwrap().bleu.score;
            assert_eq!(bleu, direct, "α {alpha}");
        }
        // Ties: two penalties that translate alike score alike, and the first is kept.
        let (a, b) = (long, long + 1.0);
        assert_eq!(at(a), at(b), "the premise: α {a} and {b} translate alike");
        for (first, second) in [(a, b), (b, a)] {
            let tie =
                choose_length_penalty(&model, &tok, &held_out, BEAM, &[first, second], MAX_LEN, 32)
                    .unwrap();
            assert_eq!(tie.tried[0].1, tie.tried[1].1);
            assert_eq!(tie.length_penalty, first);
        }
    }
    // No pairs, greedy search, no penalties, a penalty that is not finite.
    let invalid = |pairs: &[Pair], beam: usize, candidates: &[f64]| {
        let r = choose_length_penalty(&model, &tok, pairs, beam, candidates, MAX_LEN, 32);
        assert!(
            matches!(r, Err(TranslateError::InvalidConfig { .. })),
            "{r:?}"
        )
    };
    invalid(&[], BEAM, &[0.6]);
    invalid(&pairs, 1, &[0.6]);
    invalid(&pairs, BEAM, &[]);
    invalid(&pairs, BEAM, &[f64::NAN]);
}

/// The run file: saved and read back unchanged, absent is `None`, unreadable or out of range
/// is an error naming the file.
#[test]
fn the_decoding_choice_round_trips_through_the_run_directory() {
    let dir = std::env::temp_dir().join(format!("xfmr-decoding-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let _ = fs::remove_file(dir.join(DECODING_FILE));
    assert_eq!(DecodingChoice::load(&dir).unwrap(), None);
    assert_eq!(
        DecodingChoice::length_penalty_of(&dir).unwrap(),
        0.6,
        "the paper's"
    );
    let choice = DecodingChoice {
        beam_size: 4,
        length_penalty: 1.5,
        sentences: 500,
        tried: vec![(0.6, 32.87), (1.0, 33.37), (1.5, 33.88), (2.0, 33.57)],
    };
    choice.save(&dir).unwrap();
    assert_eq!(DecodingChoice::load(&dir).unwrap(), Some(choice.clone()));
    assert_eq!(DecodingChoice::length_penalty_of(&dir).unwrap(), 1.5);
    // An α that is not finite is not written.
    let nan = DecodingChoice {
        length_penalty: f64::NAN,
        ..choice.clone()
    };
    let err = nan.save(&dir).unwrap_err().to_string();
    assert!(err.contains(DECODING_FILE), "{err}");
    assert_eq!(DecodingChoice::load(&dir).unwrap(), Some(choice.clone()));
    // Forgotten: gone, and forgetting again is no error.
    DecodingChoice::forget(&dir).unwrap();
    assert_eq!(DecodingChoice::load(&dir).unwrap(), None);
    DecodingChoice::forget(&dir).unwrap();
    choice.save(&dir).unwrap();
    assert_eq!(choice.beam_options().length_penalty, 1.5);
    assert_eq!(choice.beam_options().beam_size, 4);
    for bad in [
        "{ not json".to_string(),
        serde_json::to_string(&DecodingChoice {
            beam_size: 0,
            ..choice.clone()
        })
        .unwrap(),
    ] {
        fs::write(dir.join(DECODING_FILE), bad).unwrap();
        let err = DecodingChoice::load(&dir).unwrap_err().to_string();
        assert!(err.contains(DECODING_FILE), "{err}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// Source batches on a length ladder (rows filled with copies of the batch's sources, each
/// padded to its rung) translate every sentence as batches padded to their longest source do,
/// greedy and beam: the same tokens, scores within 1e-4.
#[test]
fn bucketed_batches_leave_translations_unchanged() {
    let (model, tok, pairs) = model();
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let ladder = SourceBatches::new(4).with_ladder(Some(LengthLadder::new(4)), None);
    for strategy in [
        Strategy::Greedy,
        Strategy::Beam(BeamOptions {
            beam_size: BEAM,
            length_penalty: 1.0,
            n_best: 2,
        }),
    ] {
        let options = GenerationOptions::greedy(MAX_LEN, tok.eos_id(), tok.pad_id())
            .with_strategy(strategy.clone());
        let plain = translate(&model, &tok, &sources, &options, 4).unwrap();
        let padded = translate(&model, &tok, &sources, &options, ladder).unwrap();
        assert_eq!(plain.len(), padded.len());
        for (a, b) in plain.iter().zip(&padded) {
            assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(b) {
                assert_eq!(a.tokens, b.tokens, "{strategy:?}");
                assert!(
                    (a.score - b.score).abs() <= 1e-4,
                    "{} vs {}",
                    a.score,
                    b.score
                );
            }
        }
    }
}

/// A token cancelled before the call, or past its deadline, stops `translate` and
/// `translate_best` (greedy and beam) with `ModelError::Cancelled`; a live token changes
/// nothing.
#[test]
fn translate_stops_when_cancelled() {
    let (model, tok, pairs) = model();
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let cancelled = Cancel::new();
    cancelled.cancel();
    let expired = Cancel::with_deadline(Instant::now());
    let live = Cancel::with_deadline(Instant::now() + Duration::from_secs(3600));
    for strategy in [
        Strategy::Greedy,
        Strategy::Beam(BeamOptions {
            beam_size: BEAM,
            length_penalty: 1.0,
            n_best: 1,
        }),
    ] {
        let options = GenerationOptions::greedy(MAX_LEN, tok.eos_id(), tok.pad_id())
            .with_strategy(strategy.clone());
        let plain = translate_best(&model, &tok, &sources, &options, 4).unwrap();
        for token in [&cancelled, &expired] {
            let options = options.clone().with_cancel(token.clone());
            assert!(
                matches!(
                    translate(&model, &tok, &sources, &options, 4),
                    Err(TranslateError::Model(ModelError::Cancelled))
                ),
                "{strategy:?}, {token:?}"
            );
            assert!(
                matches!(
                    translate_best(&model, &tok, &sources, &options, 4),
                    Err(TranslateError::Model(ModelError::Cancelled))
                ),
                "{strategy:?}, {token:?}"
            );
        }
        let options = options.with_cancel(live.clone());
        assert_eq!(
            translate_best(&model, &tok, &sources, &options, 4).unwrap(),
            plain
        );
    }
}

/// The source limit is the model's position table (end token included): a source that fills
/// it translates, one token more is refused naming its index and length, and a 1 MB line is
/// refused on its byte length alone (no token count: it was not tokenised). Truncating keeps
/// each long source's first tokens (the end token appended) and lists which were cut.
#[test]
fn sources_beyond_the_models_positions_are_refused_or_truncated() {
    let (_, tok, _) = model();
    const POSITIONS: usize = 12;
    let config = TransformerConfig::tiny(tok.vocab_size()).with_max_len(POSITIONS);
    let model = config.init::<Infer>(&Default::default()).unwrap();
    assert_eq!(max_source_tokens(&model), POSITIONS);
    let limit = SourceLimit::of_model(&model);
    assert_eq!(
        limit,
        SourceLimit {
            max_tokens: POSITIONS,
            overlong: Overlong::Refuse
        }
    );
    // One-letter words, one token each in this vocabulary (checked below): 11 words and the
    // end token fill the 12 positions.
    let words = |n: usize| -> String {
        let letters = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
        (0..n)
            .map(|i| letters[i % letters.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (fits, over) = (words(POSITIONS - 1), words(POSITIONS));
    assert_eq!(tok.encode(&fits).unwrap().len(), POSITIONS - 1);
    assert_eq!(tok.encode(&over).unwrap().len(), POSITIONS);
    let huge = "a ".repeat(500_000);
    assert!(huge.len() > limit.max_bytes(&tok));

    let options = GenerationOptions::greedy(4, tok.eos_id(), tok.pad_id());
    let out = translate(&model, &tok, &["a b", &fits], &options, 4).unwrap();
    assert_eq!(out.len(), 2);
    match translate(&model, &tok, &["a b", &fits, &over], &options, 4) {
        Err(TranslateError::SourceTooLong {
            index: 2,
            tokens: Some(13),
            bytes,
            max_tokens: POSITIONS,
        }) => assert_eq!(bytes, over.len()),
        other => panic!("{other:?}"),
    }
    let e = translate(&model, &tok, &["a b", &huge], &options, 4).unwrap_err();
    assert!(
        matches!(
            e,
            TranslateError::SourceTooLong {
                index: 1,
                tokens: None,
                bytes: 1_000_000,
                max_tokens: POSITIONS
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "source 1: 1000000 bytes, more than the 12 tokens (end token included) the model's \
         positions hold"
    );

    let truncating = limit.with_overlong(Overlong::Truncate);
    let encoded = encode_sources(&tok, &["a b", &over, &fits, &huge], truncating).unwrap();
    assert_eq!(encoded.truncated, [1, 3]);
    let whole = |s: &str| {
        let mut ids = tok.encode(s).unwrap();
        ids.push(tok.eos_id());
        ids
    };
    assert_eq!(encoded.ids[0], whole("a b"));
    assert_eq!(encoded.ids[2], whole(&fits));
    for (i, long) in [(1, over.clone()), (3, huge.clone())] {
        let ids = &encoded.ids[i];
        assert_eq!(ids.len(), POSITIONS, "source {i}");
        // The first 11 tokens of the whole source (of a 22-byte prefix for the huge one, which
        // is never tokenised whole).
        let head = &long[..long.len().min(2 * POSITIONS)];
        assert_eq!(
            ids[..POSITIONS - 1],
            whole(head)[..POSITIONS - 1],
            "source {i}"
        );
        assert_eq!(ids[POSITIONS - 1], tok.eos_id(), "source {i}");
    }
    let out = translate_ids(&model, &tok, &encoded.ids, &options, 4).unwrap();
    assert_eq!(out.len(), 4);
}

/// sacreBLEU's line: `BLEU = score p1/p2/p3/p4 (BP = … ratio = … hyp_len = … ref_len = …)`,
/// the digits it prints, on a score computed here (the ratio is hyp_len / ref_len).
#[test]
fn bleu_is_printed_as_sacrebleu_prints_it() {
    let hyps = ["the cat sat on the mat".to_string()];
    let refs = ["the cat sat on a mat today".to_string()];
    let bleu = score(&hyps, &refs).unwrap().bleu;
    let line = sacrebleu_line(&bleu);
    let p = &bleu.precisions;
    assert_eq!(
        line,
        format!(
            "BLEU = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = 6 ref_len \
             = 7)",
            bleu.score,
            p[0],
            p[1],
            p[2],
            p[3],
            bleu.bp,
            6.0 / 7.0
        )
    );
    // 5 of the 6 unigrams match: 83.3.
    assert!(
        line.starts_with("BLEU = ") && line.contains(" 83.3/"),
        "{line}"
    );
    assert!(line.contains("ratio = 0.857"), "{line}");
}
