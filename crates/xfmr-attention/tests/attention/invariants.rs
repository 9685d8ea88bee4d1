//! Invariants that hold for any weights: cached == full decoding, projected cross-attention ==
//! uncached, cache reordering and truncation, padding invariance, permutation equivariance. (The
//! paths against each other: `paths.rs`.)

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_attention::{
    AttentionError, AttnMask, KvCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig,
};
use xfmr_testing::{max_abs_diff, TestRng};

use crate::Cpu;

pub(crate) fn random_mha<B: Backend>(
    d_model: usize,
    n_heads: usize,
    n_kv_heads: usize,
) -> MultiHeadAttention<B> {
    MultiHeadAttentionConfig::new(d_model, n_heads)
        .with_n_kv_heads(Some(n_kv_heads))
        .init(&Default::default())
        .unwrap()
}

pub(crate) fn indices<B: Backend>(values: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &Default::default(),
    )
}

/// Decoding one token at a time, and in uneven chunks, through the cache equals one causal pass
/// (≤ 1e-5), with and without grouped key/value heads.
#[test]
fn cached_decoding_equals_full_causal_pass() {
    cached_equals_full::<Cpu>(1e-5, &[4, 2, 1]);
}

/// The same on wgpu (found failing through SmolLM2's cached generation; tolerance for its f32
/// kernels), with grouped heads only, as SmolLM2's: every head layout is a new set of kernels for
/// lavapipe to compile (the three took 130 s on an AVX2 CPU without Mesa's shader cache).
#[test]
fn cached_decoding_equals_full_causal_pass_on_wgpu() {
    cached_equals_full::<burn::backend::Wgpu>(1e-4, &[2]);
}

/// The same on burn's CUDA backend (`--features cuda`, an NVIDIA GPU), whose f32 products run
/// in TF32 where their shapes take the tensor cores: the full pass and the one-row steps can
/// take different kernels, hence TF32's tolerance (`parity::TF32_ATOL`).
#[cfg(feature = "cuda")]
#[test]
fn cached_decoding_equals_full_causal_pass_on_cuda() {
    cached_equals_full::<burn::backend::Cuda>(crate::parity::TF32_ATOL as f32, &[4, 2, 1]);
}

/// Four query heads over each of `kv_heads` key/value heads.
fn cached_equals_full<B: Backend>(atol: f32, kv_heads: &[usize]) {
    let device = Default::default();
    let mut rng = TestRng::new(1);
    for &n_kv_heads in kv_heads {
        let mha = random_mha::<B>(32, 4, n_kv_heads);
        let x = rng.tensor::<B, 3>([2, 7, 32], 1.0, &device);
        let full = mha.forward(MhaInput::self_attn(x.clone()).causal()).context;

        let mut cache = KvCache::new();
        let steps: Vec<_> = (0..7)
            .map(|t| {
                mha.forward_cached(MhaInput::self_attn(x.clone().narrow(1, t, 1)), &mut cache)
                    .context
            })
            .collect();
        assert_eq!(cache.len(), 7);
        let stepped = Tensor::cat(steps, 1);
        let diff = max_abs_diff(&full, &stepped);
        assert!(
            diff <= atol as f64,
            "kv heads {n_kv_heads}: one token at a time: {diff}"
        );

        let mut cache = KvCache::new();
        let chunks: Vec<_> = [(0, 3), (3, 1), (4, 3)]
            .into_iter()
            .map(|(start, len)| {
                mha.forward_cached(
                    MhaInput::self_attn(x.clone().narrow(1, start, len)),
                    &mut cache,
                )
                .context
            })
            .collect();
        let chunked = Tensor::cat(chunks, 1);
        let diff = max_abs_diff(&full, &chunked);
        assert!(
            diff <= atol as f64,
            "kv heads {n_kv_heads}: chunks 3+1+3: {diff}"
        );
    }
}

/// Padding masks work with the cache too: the mask covers past and new keys.
#[test]
fn cached_decoding_with_padding_mask_equals_full_pass() {
    let device = Default::default();
    let mut rng = TestRng::new(2);
    let mha = random_mha::<Cpu>(16, 2, 2);
    let x = rng.tensor::<Cpu, 3>([2, 5, 16], 1.0, &device);
    // Left padding: sequence 1 starts at position 2.
    let keep = Tensor::<Cpu, 2, Int>::from_data(
        TensorData::new(vec![1i64, 1, 1, 1, 1, 0, 0, 1, 1, 1], [2, 5]),
        &device,
    );
    let pad = AttnMask::<Cpu>::from_keep_mask(keep);
    let full = mha
        .forward(MhaInput::self_attn(x.clone()).causal().mask(pad.clone()))
        .context;
    let mut cache = KvCache::new();
    let steps: Vec<_> = (0..5)
        .map(|t| {
            let step_mask = pad.clone().narrow_keys(0, t + 1);
            mha.forward_cached(
                MhaInput::self_attn(x.clone().narrow(1, t, 1)).mask(step_mask),
                &mut cache,
            )
            .context
        })
        .collect();
    assert!(max_abs_diff(&full, &Tensor::cat(steps, 1)) <= 1e-5);
}

/// Cross-attention over memory projected once equals the uncached layer, step by step; a
/// self-attention cache refuses a cross-attention input.
#[test]
fn projected_cross_attention_equals_uncached() {
    let device = Default::default();
    let mut rng = TestRng::new(3);
    let mha = random_mha::<Cpu>(16, 4, 4);
    let x = rng.tensor::<Cpu, 3>([2, 4, 16], 1.0, &device);
    let memory = rng.tensor::<Cpu, 3>([2, 6, 16], 1.0, &device);
    let mask = AttnMask::padding_from_lengths(&[6, 3], 6, &device).unwrap();
    let full = mha
        .forward(MhaInput::cross(x.clone(), memory.clone()).mask(mask.clone()))
        .context;
    let projected = mha.project_memory(memory.clone());
    assert_eq!(projected.len(), 6);
    let steps: Vec<_> = (0..4)
        .map(|t| {
            let query = x.clone().narrow(1, t, 1);
            let input = MhaInput::cross_projected(query, projected.clone()).mask(mask.clone());
            mha.forward(input).context
        })
        .collect();
    assert!(max_abs_diff(&full, &Tensor::cat(steps, 1)) <= 1e-5);
    assert_eq!(
        projected.len(),
        6,
        "the projected memory is read, never appended to"
    );

    let mut cache = KvCache::new();
    let err = mha
        .try_forward_cached(MhaInput::cross(x.narrow(1, 0, 1), memory), &mut cache)
        .unwrap_err();
    assert_eq!(err, AttentionError::CachedCrossAttention);
    assert!(cache.is_empty());
}

/// Reordering the cache along the batch (beam search) equals decoding the reordered inputs;
/// truncating and re-decoding equals the original.
#[test]
fn cache_reorder_and_truncate() {
    let device = Default::default();
    let mut rng = TestRng::new(4);
    let mha = random_mha::<Cpu>(16, 4, 2);
    let x = rng.tensor::<Cpu, 3>([3, 4, 16], 1.0, &device);
    let order = [2i64, 0, 0];

    let mut cache = KvCache::new();
    mha.forward_cached(MhaInput::self_attn(x.clone().narrow(1, 0, 3)), &mut cache);
    cache.reorder(indices(&order));
    assert_eq!(cache.batch_size(), Some(3));
    let x_reordered = x.clone().select(0, indices(&order));
    let last = mha
        .forward_cached(
            MhaInput::self_attn(x_reordered.clone().narrow(1, 3, 1)),
            &mut cache,
        )
        .context;
    let expected = mha
        .forward(MhaInput::self_attn(x_reordered.clone()).causal())
        .context
        .narrow(1, 3, 1);
    assert!(max_abs_diff(&last, &expected) <= 1e-5);

    // Truncate to the first 2 positions, then decode positions 2 and 3 again: the cache and
    // the outputs must equal the original decoding's.
    let keys_before = cache.keys().unwrap().clone();
    cache.truncate(2).unwrap();
    assert_eq!(cache.len(), 2);
    assert!(max_abs_diff(cache.keys().unwrap(), &keys_before.clone().narrow(2, 0, 2)) == 0.0);
    let redecoded = mha
        .forward_cached(
            MhaInput::self_attn(x_reordered.clone().narrow(1, 2, 2)),
            &mut cache,
        )
        .context;
    let full = mha
        .forward(MhaInput::self_attn(x_reordered).causal())
        .context;
    assert!(max_abs_diff(&redecoded, &full.narrow(1, 2, 2)) <= 1e-5);
    assert_eq!(cache.len(), 4);
    assert!(max_abs_diff(cache.keys().unwrap(), &keys_before) <= 1e-6);
    assert!(cache.truncate(5).is_err());
    assert_eq!(
        cache.len(),
        4,
        "a refused truncate leaves the cache as it was"
    );
}

/// Padded keys never change the outputs at real positions: a padded batch equals each sequence
/// run alone, whatever the padding holds.
#[test]
fn padding_never_changes_unpadded_outputs() {
    let device = Default::default();
    let mut rng = TestRng::new(5);
    let mha = random_mha::<Cpu>(24, 3, 3);
    let lengths = [6usize, 4, 1];
    let x = rng.tensor::<Cpu, 3>([3, 6, 24], 1.0, &device);
    let mask = AttnMask::padding_from_lengths(&lengths, 6, &device).unwrap();
    for causal in [false, true] {
        let mut input = MhaInput::self_attn(x.clone()).mask(mask.clone());
        if causal {
            input = input.causal();
        }
        let batched = mha.forward(input).context;
        // Different garbage in the padding must not matter either.
        let noise = rng.tensor::<Cpu, 3>([3, 6, 24], 100.0, &device);
        let keep = mask.tensor().clone().reshape([3, 6, 1]).expand([3, 6, 24]);
        let x_noisy = x.clone().mask_where(keep, noise);
        let mut input = MhaInput::self_attn(x_noisy).mask(mask.clone());
        if causal {
            input = input.causal();
        }
        let noisy = mha.forward(input).context;
        for (b, &len) in lengths.iter().enumerate() {
            let alone_in = x.clone().narrow(0, b, 1).narrow(1, 0, len);
            let mut input = MhaInput::self_attn(alone_in);
            if causal {
                input = input.causal();
            }
            let alone = mha.forward(input).context;
            let real = |t: &Tensor<Cpu, 3>| t.clone().narrow(0, b, 1).narrow(1, 0, len);
            assert!(
                max_abs_diff(&real(&batched), &alone) <= 1e-5,
                "row {b}, causal {causal}"
            );
            assert!(
                max_abs_diff(&real(&noisy), &alone) <= 1e-5,
                "row {b}, causal {causal}, noisy pad"
            );
        }
    }
}

/// Without positions, self-attention is permutation-equivariant: permuting the tokens permutes
/// the outputs the same way.
#[test]
fn self_attention_is_permutation_equivariant() {
    let device = Default::default();
    let mut rng = TestRng::new(6);
    let mha = random_mha::<Cpu>(16, 4, 4);
    let x = rng.tensor::<Cpu, 3>([2, 5, 16], 1.0, &device);
    let perm = indices::<Cpu>(&[3, 0, 4, 1, 2]);
    let out = mha.forward(MhaInput::self_attn(x.clone())).context;
    let out_of_permuted = mha
        .forward(MhaInput::self_attn(x.select(1, perm.clone())))
        .context;
    assert!(max_abs_diff(&out.select(1, perm), &out_of_permuted) <= 1e-5);
}
