//! Masks, configuration errors and weight-import errors.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use xfmr_attention::{
    AttentionError, AttnMask, MhaInput, MultiHeadAttentionConfig, TorchMhaWeights,
};

use xfmr_testing::{assert_uniform, linear_values};

use crate::Cpu;

fn bools(mask: &AttnMask<Cpu>) -> Vec<bool> {
    mask.tensor().to_data().to_vec::<bool>().unwrap()
}

#[test]
fn padding_masks_agree_across_constructors() {
    let device = Default::default();
    let from_lengths = AttnMask::<Cpu>::padding_from_lengths(&[3, 1], 4, &device).unwrap();
    assert_eq!(from_lengths.dims(), [2, 1, 1, 4]);
    let expected = vec![false, false, false, true, false, true, true, true];
    assert_eq!(bools(&from_lengths), expected);

    let ids = Tensor::<Cpu, 2, Int>::from_data(
        TensorData::new(vec![5i64, 6, 7, 0, 9, 0, 0, 0], [2, 4]),
        &device,
    );
    assert_eq!(bools(&AttnMask::padding_from_ids(ids, 0)), expected);

    // Hugging Face keep-mask: 1 = attend, the opposite polarity.
    let keep = Tensor::<Cpu, 2, Int>::from_data(
        TensorData::new(vec![1i64, 1, 1, 0, 1, 0, 0, 0], [2, 4]),
        &device,
    );
    assert_eq!(bools(&AttnMask::from_keep_mask(keep)), expected);

    let ignored =
        Tensor::<Cpu, 2, Bool>::from_data(TensorData::new(expected.clone(), [2, 4]), &device);
    assert_eq!(bools(&AttnMask::from_key_padding(ignored)), expected);
}

#[test]
fn padding_length_too_long_is_an_error() {
    let err = AttnMask::<Cpu>::padding_from_lengths(&[2, 9], 4, &Default::default()).unwrap_err();
    assert_eq!(
        err,
        AttentionError::LengthTooLong {
            index: 1,
            length: 9,
            seq_len: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "length 9 of sequence 1 exceeds the padded length 4"
    );
}

#[test]
fn causal_mask_ignores_the_future_aligned_to_the_last_key() {
    let device = Default::default();
    let square = AttnMask::<Cpu>::causal(3, 3, &device);
    assert_eq!(square.dims(), [1, 1, 3, 3]);
    #[rustfmt::skip]
    assert_eq!(bools(&square), vec![
        false, true,  true,
        false, false, true,
        false, false, false,
    ]);
    // Two new queries over five keys (three cached): query i sits at position 3 + i.
    #[rustfmt::skip]
    assert_eq!(bools(&AttnMask::<Cpu>::causal(2, 5, &device)), vec![
        false, false, false, false, true,
        false, false, false, false, false,
    ]);
}

#[test]
fn union_ignores_what_either_mask_ignores() {
    let device = Default::default();
    let pad = AttnMask::<Cpu>::padding_from_lengths(&[3, 2], 3, &device).unwrap();
    let both = pad.union(AttnMask::causal(3, 3, &device));
    assert_eq!(both.dims(), [2, 1, 3, 3]);
    #[rustfmt::skip]
    assert_eq!(bools(&both), vec![
        // sequence 0 (length 3): causal only
        false, true,  true,
        false, false, true,
        false, false, false,
        // sequence 1 (length 2): causal, and key 2 is padding
        false, true,  true,
        false, false, true,
        false, false, true,
    ]);
}

#[test]
fn invalid_configs_are_typed_errors_with_values() {
    let cases: [(MultiHeadAttentionConfig, &str); 5] = [
        (
            MultiHeadAttentionConfig::new(30, 4),
            "d_model (30) must be divisible by n_heads (4)",
        ),
        (
            MultiHeadAttentionConfig::new(32, 0),
            "invalid configuration: `n_heads` = 0: must be positive",
        ),
        (
            MultiHeadAttentionConfig::new(32, 4).with_n_kv_heads(Some(3)),
            "n_heads (4) must be a multiple of n_kv_heads (3)",
        ),
        (
            MultiHeadAttentionConfig::new(32, 4).with_dropout(1.0),
            "invalid configuration: `dropout` = 1: a dropout probability in [0, 1)",
        ),
        (
            MultiHeadAttentionConfig::new(32, 4).with_dropout(-0.1),
            "invalid configuration: `dropout` = -0.1: a dropout probability in [0, 1)",
        ),
    ];
    for (config, message) in cases {
        let err = config.init::<Cpu>(&Default::default()).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn mismatched_mask_and_inputs_are_typed_errors() {
    let device = Default::default();
    let mha = MultiHeadAttentionConfig::new(8, 2)
        .init::<Cpu>(&device)
        .unwrap();
    let x = Tensor::<Cpu, 3>::zeros([2, 3, 8], &device);
    let wrong = AttnMask::padding_from_lengths(&[3, 3], 4, &device).unwrap();
    let err = mha
        .try_forward(MhaInput::self_attn(x.clone()).mask(wrong))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "mask of shape [2, 1, 1, 4] does not broadcast to the attention scores \
         [batch, heads, seq_q, seq_k] = [2, 2, 3, 3] (each dimension must match or be 1)"
    );
    let err = mha
        .try_forward(MhaInput::self_attn(Tensor::<Cpu, 3>::zeros(
            [2, 3, 6],
            &device,
        )))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "query has shape [2, 3, 6], expected [batch, seq, 8]"
    );
    let memory = Tensor::<Cpu, 3>::zeros([1, 5, 8], &device);
    let err = mha.try_forward(MhaInput::cross(x, memory)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "memory has shape [1, 5, 8], expected [2, seq_k, 8]"
    );
}

#[test]
#[should_panic(expected = "MultiHeadAttention::forward: mask of shape [2, 1, 1, 4]")]
fn forward_panics_with_the_error_message() {
    let device = Default::default();
    let mha = MultiHeadAttentionConfig::new(8, 2)
        .init::<Cpu>(&device)
        .unwrap();
    let x = Tensor::<Cpu, 3>::zeros([2, 3, 8], &device);
    let wrong = AttnMask::padding_from_lengths(&[3, 3], 4, &device).unwrap();
    mha.forward(MhaInput::self_attn(x).mask(wrong));
}

#[test]
fn torch_import_rejects_wrong_shapes_and_bias_mismatch() {
    let device = Default::default();
    let weights = |rows: usize, bias: bool| TorchMhaWeights::<Cpu> {
        in_proj_weight: Tensor::zeros([rows, 8], &device),
        in_proj_bias: bias.then(|| Tensor::zeros([rows], &device)),
        out_proj_weight: Tensor::zeros([8, 8], &device),
        out_proj_bias: Some(Tensor::zeros([8], &device)),
    };
    let mha = || {
        MultiHeadAttentionConfig::new(8, 2)
            .init::<Cpu>(&device)
            .unwrap()
    };
    let err = mha().load_torch(weights(20, true)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "weight `in_proj_weight` has shape [20, 8], expected [24, 8]"
    );
    let err = mha().load_torch(weights(24, false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "weight `in_proj (query)`: bias missing but the module is configured with a bias"
    );
    let no_bias = MultiHeadAttentionConfig::new(8, 2)
        .with_query_bias(false)
        .with_key_bias(false)
        .with_value_bias(false)
        .init::<Cpu>(&device)
        .unwrap();
    assert!(no_bias.load_torch(weights(24, false)).is_ok());
}

/// `select_batch` follows a reordered batch (rows repeated and permuted); a mask shared by the
/// batch stays as it is. `narrow_keys` keeps a key prefix and refuses keys past the end.
#[test]
fn masks_select_rows_and_narrow_keys() {
    let device = Default::default();
    let pad = AttnMask::<Cpu>::padding_from_lengths(&[3, 1, 2], 4, &device).unwrap();
    let idx = Tensor::<Cpu, 1, Int>::from_data(TensorData::new(vec![2i64, 0, 0, 1], [4]), &device);
    let picked = pad.clone().select_batch(idx.clone());
    assert_eq!(picked.dims(), [4, 1, 1, 4]);
    let rows = |lengths: &[usize]| {
        bools(&AttnMask::<Cpu>::padding_from_lengths(lengths, 4, &device).unwrap())
    };
    assert_eq!(bools(&picked), rows(&[2, 3, 3, 1]));
    let causal = AttnMask::<Cpu>::causal(3, 3, &device);
    assert_eq!(bools(&causal.clone().select_batch(idx)), bools(&causal));

    let prefix = pad.clone().narrow_keys(0, 2);
    assert_eq!(prefix.dims(), [3, 1, 1, 2]);
    assert_eq!(
        bools(&prefix),
        vec![false, false, false, true, false, false]
    );
    // Lengths 3, 1, 2 over keys 2..4: only the first row still has a real key (key 2).
    let tail = pad.clone().narrow_keys(2, 2);
    assert_eq!(bools(&tail), vec![false, true, true, true, true, true]);
    let narrow_past_end = std::panic::AssertUnwindSafe(|| pad.narrow_keys(3, 2));
    let past_end = std::panic::catch_unwind(narrow_past_end);
    assert!(past_end.is_err());
}

/// The default initialisation is PyTorch's `nn.MultiheadAttention`'s: q, k and v Xavier-uniform
/// with the fans of the packed `d_model × (d_model + 2·kv_dim)` matrix, `Wᴼ` uniform in
/// `±1/√d_model` (an `nn.Linear`), every bias zero; grouped heads shrink the packed matrix.
#[test]
fn mha_initialisation_is_pytorchs() {
    let (d_model, n_heads, n_kv_heads) = (128, 8, 2);
    let mha = MultiHeadAttentionConfig::new(d_model, n_heads)
        .with_n_kv_heads(Some(n_kv_heads))
        .init::<Cpu>(&Default::default())
        .unwrap();
    let kv_dim = n_kv_heads * d_model / n_heads;
    let packed = (6.0 / (d_model + d_model + 2 * kv_dim) as f64).sqrt();
    for (name, linear, bound) in [
        ("query", &mha.query, packed),
        ("key", &mha.key, packed),
        ("value", &mha.value, packed),
        ("output", &mha.output, 1.0 / (d_model as f64).sqrt()),
    ] {
        let (weight, bias) = linear_values(linear);
        assert_uniform(name, &weight, bound);
        assert!(!bias.is_empty(), "{name}: no bias");
        assert!(bias.iter().all(|&b| b == 0.0), "{name} bias not zero");
    }
}
