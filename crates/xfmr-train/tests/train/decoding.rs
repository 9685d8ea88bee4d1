//! Beam search's length penalty chosen on held-out pairs, and the run file that records it.

use std::fs;

use burn::backend::NdArray;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorData};
use xfmr_models::{BeamOptions, GenerationOptions, Strategy, Transformer, TransformerConfig};
use xfmr_train::data::{Pair, SplitMix64};
use xfmr_train::translate::{
    choose_length_penalty, score, translate, translate_best, DecodingChoice, DECODING_FILE,
};
use xfmr_train::{LengthLadder, SourceBatches, SubwordTokenizer, TrainError};

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
        assert!(matches!(r, Err(TrainError::InvalidConfig { .. })), "{r:?}")
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
