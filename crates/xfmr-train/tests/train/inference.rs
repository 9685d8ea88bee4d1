//! Inference helpers of trained runs: `fill_mask` on a masked language model.

use burn::backend::NdArray;

use xfmr_train::inference::{encoder_ids, fill_mask, FillMaskError};
use xfmr_train::spec::{Preset, RunSpec, Task};
use xfmr_train::trainer::TrainConfig;
use xfmr_translate::tokenizer::MASK;
use xfmr_translate::Pair;

/// An untrained `mlm` model ranks `k` fillers per mask, most probable first, with
/// probabilities of one softmax; a text without a mask and a vocabulary without the mask
/// token are typed errors.
#[test]
fn fill_mask_ranks_k_fillers_per_mask() {
    let pairs: Vec<Pair> = ["the cat sat", "a dog ran", "the dog sat on the mat"]
        .iter()
        .map(|t| Pair {
            src: String::new(),
            tgt: t.to_string(),
        })
        .collect();
    let tokenizer = Task::Mlm.learn_vocabulary(&pairs, 60).unwrap();
    let spec = Preset::Tiny
        .spec(Task::Mlm, &tokenizer, None, 20, TrainConfig::new())
        .unwrap();
    let RunSpec::Mlm { objective, .. } = spec else {
        panic!("an mlm run")
    };
    let device = Default::default();
    let model = objective.model.init::<NdArray>(&device).unwrap();
    let text = format!("the {MASK} sat on {MASK} mat");
    assert_eq!(
        encoder_ids(&tokenizer, &text)
            .unwrap()
            .iter()
            .filter(|&&id| Some(id) == tokenizer.mask_id())
            .count(),
        2
    );
    let fills = fill_mask(&model, &tokenizer, &text, 3, &device).unwrap();
    assert_eq!(fills.len(), 2);
    for fillers in &fills {
        assert_eq!(fillers.len(), 3);
        assert!(fillers
            .windows(2)
            .all(|w| w[0].probability >= w[1].probability));
        let total: f32 = fillers.iter().map(|f| f.probability).sum();
        assert!(total > 0.0 && total <= 1.0 + 1e-5, "{total}");
    }
    assert!(matches!(
        fill_mask(&model, &tokenizer, "the cat", 3, &device),
        Err(FillMaskError::NoMask { .. })
    ));
    let plain = Task::Lm.learn_vocabulary(&pairs, 60).unwrap();
    assert!(matches!(
        fill_mask(&model, &plain, &text, 3, &device),
        Err(FillMaskError::NoMaskToken)
    ));
}
