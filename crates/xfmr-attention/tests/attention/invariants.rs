//! Invariants that hold for any weights: cached == full decoding, padding invariance, permutation
//! equivariance, fused == reference, zero rows for fully masked queries, gradients == finite
//! differences.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use xfmr_attention::{
    attention_decomposed, attention_fused, attention_reference, scaled_dot_product_attention,
    AttentionError, AttentionKernel, AttentionOptions, AttnMask, KvCache, MhaInput,
    MultiHeadAttention, MultiHeadAttentionConfig,
};
use xfmr_testing::{assert_tensors_close, max_abs_diff, to_vec, TestRng};

use crate::Cpu;

fn random_mha<B: Backend>(
    d_model: usize,
    n_heads: usize,
    n_kv_heads: usize,
) -> MultiHeadAttention<B> {
    MultiHeadAttentionConfig::new(d_model, n_heads)
        .with_n_kv_heads(Some(n_kv_heads))
        .init(&Default::default())
}

fn indices<B: Backend>(values: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &Default::default(),
    )
}

/// Decoding one token at a time, and in uneven chunks, through the cache equals one causal pass
/// (≤ 1e-5), with and without grouped key/value heads.
#[test]
fn cached_decoding_equals_full_causal_pass() {
    cached_equals_full::<Cpu>(1e-5);
}

/// The same on wgpu (found failing through SmolLM2's cached generation; tolerance for its f32
/// kernels).
#[test]
fn cached_decoding_equals_full_causal_pass_on_wgpu() {
    cached_equals_full::<burn::backend::Wgpu>(1e-4);
}

fn cached_equals_full<B: Backend>(atol: f32) {
    let device = Default::default();
    let mut rng = TestRng::new(1);
    for n_kv_heads in [4, 2, 1] {
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
            let input = MhaInput::self_attn(x.clone().narrow(1, t, 1)).mask(mask.clone());
            mha.forward_projected(input, &projected).context
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

/// Options with a random mask `[batch, 1, seq_q, seq_k]` (a third of the keys ignored, and every
/// key of query row 0 of batch 1), and on odd trials a random bias `[1, heads, seq_q, seq_k]`.
fn random_mask_and_bias<B: Backend>(
    rng: &mut TestRng,
    trial: usize,
    [batch, heads, seq_q, seq_k]: [usize; 4],
) -> AttentionOptions<B> {
    let device = Default::default();
    let mut ignored: Vec<bool> = (0..batch * seq_q * seq_k)
        .map(|_| rng.below(3) == 0)
        .collect();
    ignored[seq_q * seq_k..seq_q * seq_k + seq_k].fill(true);
    let mask = AttnMask::from_tensor(Tensor::from_data(
        TensorData::new(ignored, [batch, 1, seq_q, seq_k]),
        &device,
    ));
    let options = AttentionOptions::default().with_mask(mask);
    match trial % 2 {
        1 => options.with_bias(rng.tensor::<B, 4>([1, heads, seq_q, seq_k], 1.0, &device)),
        _ => options,
    }
}

/// Random q, k, v, masks (some rows fully masked) and biases: the fused, decomposed and reference
/// paths agree (≤ 1e-5) on ndarray and on flex, and fully masked rows are exactly zero on all.
fn attention_paths_agree<B: Backend>() {
    let device = Default::default();
    let mut rng = TestRng::new(7);
    for trial in 0..6 {
        let (batch, heads, seq_q, seq_k, d_k) = (2, 3, 1 + rng.below(6), 1 + rng.below(9), 8);
        let q = rng.tensor::<B, 4>([batch, heads, seq_q, d_k], 1.0, &device);
        let k = rng.tensor::<B, 4>([batch, heads, seq_k, d_k], 1.0, &device);
        let v = rng.tensor::<B, 4>([batch, heads, seq_k, d_k], 1.0, &device);
        let mut options = random_mask_and_bias(&mut rng, trial, [batch, heads, seq_q, seq_k]);
        if trial % 3 == 2 {
            options = options.with_scale(0.3);
        }
        let reference =
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let fused = attention_fused(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let decomposed = attention_decomposed(q, k, v, options).unwrap();
        for (path, context) in [("fused", &fused), ("decomposed", &decomposed)] {
            assert_tensors_close(
                context,
                &reference.context,
                1e-5,
                0.0,
                &format!("trial {trial}, {path}"),
            );
            let zero_row = context.clone().narrow(0, 1, 1).narrow(2, 0, 1);
            assert!(
                to_vec(&zero_row).iter().all(|&x| x == 0.0),
                "{path}: fully masked row is not zero: {zero_row}"
            );
        }
        let weights = reference.weights.unwrap();
        assert!(to_vec(&weights).iter().all(|x| x.is_finite()));
        let zero_weights = weights.narrow(0, 1, 1).narrow(2, 0, 1);
        assert!(to_vec(&zero_weights).iter().all(|&x| x == 0.0));
    }
}

#[test]
fn attention_paths_agree_ndarray() {
    attention_paths_agree::<NdArray<f32>>();
}

#[test]
fn attention_paths_agree_flex() {
    attention_paths_agree::<Flex>();
}

/// xfmr's own flex kernel ([`AttentionKernel::Cpu`]) against the reference path on flex
/// (≤ 1e-5 absolute, as the other paths): random q, k, v read through strided head-split views
/// (as multi-head attention hands them over), grouped key/value heads, masks with a fully masked
/// row (exactly zero) and masks computed by ops (a causal ∪ padding union), biases, a non-default
/// scale, `d_v ≠ d_k`, and a case long enough to be cut into several blocks of query rows.
/// `Auto` takes the same kernel on flex (bit for bit) and not under autodiff.
#[test]
fn cpu_kernel_equals_reference_flex() {
    type B = Flex;
    if !AttentionKernel::cpu_supported::<B>(DType::F32) {
        eprintln!(
            "SKIPPED cpu_kernel_equals_reference_flex: xfmr-attention built without its `flex` \
             feature; run `cargo test -p xfmr-attention --features flex` (the workspace's \
             `cargo test --workspace` turns it on)"
        );
        assert!(
            std::env::var_os("CI").is_none(),
            "the flex kernel is not built in CI"
        );
        return;
    }
    assert!(!AttentionKernel::cpu_supported::<Autodiff<B>>(DType::F32));
    let device = Default::default();
    let mut rng = TestRng::new(23);
    let cases = [
        // (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)
        (2, 6, 6, 5, 9, 8, 8),
        (2, 6, 2, 4, 7, 8, 5),
        (2, 6, 3, 1, 11, 16, 4),
        (2, 6, 1, 6, 1, 8, 8),
        (1, 2, 2, 300, 700, 8, 6),
        (3, 4, 2, 33, 17, 12, 12),
    ];
    for (trial, (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)) in cases.into_iter().enumerate() {
        // [batch, seq, heads, d] storage viewed as [batch, heads, seq, d], as in multi-head
        // attention: the kernel reads the strided views in place.
        let q = rng
            .tensor::<B, 4>([batch, seq_q, heads, d_k], 1.0, &device)
            .swap_dims(1, 2);
        let k = rng
            .tensor::<B, 4>([batch, seq_k, heads_kv, d_k], 1.0, &device)
            .swap_dims(1, 2);
        let v = rng
            .tensor::<B, 4>([batch, seq_k, heads_kv, d_v], 1.0, &device)
            .swap_dims(1, 2);
        let mut options = match trial {
            // A fully masked row needs batch ≥ 2 (`random_mask_and_bias` masks row 0 of batch 1).
            t if batch >= 2 => random_mask_and_bias(&mut rng, t, [batch, heads, seq_q, seq_k]),
            // Masks computed by ops (a comparison, a union), which flex may store as bytes.
            _ => {
                let ids: Vec<i64> = (0..seq_k as i64).map(|j| j % 5).collect();
                let padding = AttnMask::padding_from_ids(
                    Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq_k]), &device),
                    0,
                );
                AttentionOptions::default()
                    .with_mask(AttnMask::causal(seq_q, seq_k, &device).union(padding))
            }
        };
        if trial % 3 == 2 {
            options = options.with_scale(0.3);
        }
        let what = format!("case {trial} {:?}", cases[trial]);
        let reference =
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let cpu = scaled_dot_product_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            options.clone().with_kernel(AttentionKernel::Cpu),
        )
        .unwrap()
        .context;
        assert_tensors_close(&cpu, &reference.context, 1e-5, 0.0, &what);
        if batch >= 2 {
            let zero_row = cpu.clone().narrow(0, 1, 1).narrow(2, 0, 1);
            assert!(
                to_vec(&zero_row).iter().all(|&x| x == 0.0),
                "{what}: fully masked row is not zero: {zero_row}"
            );
        }
        let auto = scaled_dot_product_attention(q, k, v, options)
            .unwrap()
            .context;
        assert_eq!(
            to_vec(&auto),
            to_vec(&cpu),
            "{what}: Auto is not the Cpu kernel"
        );
    }
}

/// Attention with `h_kv < h` key/value heads (grouped-query) equals attention with each key/value
/// head copied for its `h / h_kv` query heads (built here by index selection), on every path —
/// reference (weights too), fused, decomposed — with masks, a fully masked row and biases
/// (≤ 1e-6: the same sums in the same order); a head count that does not divide is an error.
fn grouped_heads_equal_repeated_heads<B: Backend>() {
    let device = Default::default();
    let mut rng = TestRng::new(11);
    let (batch, heads, d_k, d_v) = (2, 6, 8, 5);
    for (trial, heads_kv) in [1, 2, 3, 2, 3, 1].into_iter().enumerate() {
        let (seq_q, seq_k) = (1 + rng.below(5), 1 + rng.below(9));
        let q = rng.tensor::<B, 4>([batch, heads, seq_q, d_k], 1.0, &device);
        let k = rng.tensor::<B, 4>([batch, heads_kv, seq_k, d_k], 1.0, &device);
        let v = rng.tensor::<B, 4>([batch, heads_kv, seq_k, d_v], 1.0, &device);
        let group = heads / heads_kv;
        let shared: Vec<i64> = (0..heads).map(|h| (h / group) as i64).collect();
        let (k_rep, v_rep) = (
            k.clone().select(1, indices::<B>(&shared)),
            v.clone().select(1, indices::<B>(&shared)),
        );
        let options = random_mask_and_bias(&mut rng, trial, [batch, heads, seq_q, seq_k]);
        let what = |path: &str| format!("trial {trial}, h_kv {heads_kv}, {path}");
        let reference = |k: &Tensor<B, 4>, v: &Tensor<B, 4>| {
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap()
        };
        let (grouped, repeated) = (reference(&k, &v), reference(&k_rep, &v_rep));
        assert_tensors_close(
            &grouped.context,
            &repeated.context,
            1e-6,
            0.0,
            &what("reference"),
        );
        assert_tensors_close(
            &grouped.weights.unwrap(),
            &repeated.weights.unwrap(),
            1e-6,
            0.0,
            &what("reference weights"),
        );
        for (path, run) in [
            ("fused", attention_fused::<B> as fn(_, _, _, _) -> _),
            ("decomposed", attention_decomposed::<B>),
        ] {
            let a = run(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
            let b = run(q.clone(), k_rep.clone(), v_rep.clone(), options.clone()).unwrap();
            assert_tensors_close(&a, &b, 1e-6, 0.0, &what(path));
        }
    }
    let q = Tensor::<B, 4>::zeros([1, 6, 2, 4], &device);
    let kv = Tensor::<B, 4>::zeros([1, 4, 3, 4], &device);
    let err = scaled_dot_product_attention(q, kv.clone(), kv, AttentionOptions::default());
    assert!(
        matches!(err, Err(AttentionError::InputShape { what: "key", .. })),
        "{err:?}"
    );
}

#[test]
fn grouped_heads_equal_repeated_heads_ndarray() {
    grouped_heads_equal_repeated_heads::<NdArray<f32>>();
}

#[test]
fn grouped_heads_equal_repeated_heads_flex() {
    grouped_heads_equal_repeated_heads::<Flex>();
}

/// Grouped-query attention equals full multi-head attention whose key/value heads are copies
/// of the shared ones.
#[test]
fn grouped_query_attention_equals_repeated_heads() {
    let device = Default::default();
    let mut rng = TestRng::new(9);
    let (d_model, n_heads, n_kv, d_k) = (24, 6, 2, 4);
    let gqa = random_mha::<Cpu>(d_model, n_heads, n_kv);
    let mut full = random_mha::<Cpu>(d_model, n_heads, n_heads);
    // Copy values (not clones: burn parameters are initialised lazily, and a clone of an
    // uninitialised parameter draws its own random values).
    let copy = |src: &Linear<Cpu>, columns: Option<&Tensor<Cpu, 1, Int>>| {
        let (mut weight, mut bias) = (src.weight.val(), src.bias.as_ref().unwrap().val());
        if let Some(idx) = columns {
            weight = weight.select(1, idx.clone());
            bias = bias.select(0, idx.clone());
        }
        Linear {
            weight: Param::from_tensor(weight),
            bias: Some(Param::from_tensor(bias)),
        }
    };
    // Query head h uses key/value head h / group: its columns are that head's block.
    let group = n_heads / n_kv;
    let head_index: Vec<i64> = (0..n_heads)
        .flat_map(|h| (0..d_k).map(move |c| ((h / group) * d_k + c) as i64))
        .collect();
    let idx = indices::<Cpu>(&head_index);
    full.query = copy(&gqa.query, None);
    full.output = copy(&gqa.output, None);
    full.key = copy(&gqa.key, Some(&idx));
    full.value = copy(&gqa.value, Some(&idx));
    let x = rng.tensor::<Cpu, 3>([2, 5, d_model], 1.0, &device);
    let a = gqa.forward(MhaInput::self_attn(x.clone()).causal().need_weights());
    let b = full.forward(MhaInput::self_attn(x).causal().need_weights());
    assert!(max_abs_diff(&a.context, &b.context) <= 1e-5);
    assert!(max_abs_diff(&a.weights.unwrap(), &b.weights.unwrap()) <= 1e-6);
}

/// Attention dropout acts on the weights after softmax: under autodiff (training) each weight is
/// either dropped (0) or scaled by 1/(1-p); with the inner backend (inference) it is inactive.
#[test]
fn dropout_is_applied_to_weights_after_softmax() {
    type B = Autodiff<NdArray<f32>>;
    let device = Default::default();
    let mut rng = TestRng::new(10);
    let q = rng.tensor::<NdArray<f32>, 4>([1, 2, 4, 8], 1.0, &device);
    let k = rng.tensor::<NdArray<f32>, 4>([1, 2, 6, 8], 1.0, &device);
    let v = rng.tensor::<NdArray<f32>, 4>([1, 2, 6, 8], 1.0, &device);
    let p = 0.5;
    let plain = attention_reference(q.clone(), k.clone(), v.clone(), AttentionOptions::default())
        .unwrap()
        .weights
        .unwrap();
    let inference = scaled_dot_product_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        AttentionOptions::default()
            .with_dropout(p)
            .with_weights(true),
    )
    .unwrap()
    .weights
    .unwrap();
    assert!(
        max_abs_diff(&plain, &inference) == 0.0,
        "dropout must be inactive without autodiff"
    );
    let trained = scaled_dot_product_attention(
        Tensor::<B, 4>::from_inner(q),
        Tensor::<B, 4>::from_inner(k),
        Tensor::<B, 4>::from_inner(v),
        AttentionOptions::default()
            .with_dropout(p)
            .with_weights(true),
    )
    .unwrap()
    .weights
    .unwrap()
    .inner();
    let (mut dropped, mut kept) = (0, 0);
    for (t, w) in to_vec(&trained).into_iter().zip(to_vec(&plain)) {
        if t == 0.0 {
            dropped += 1;
        } else {
            kept += 1;
            assert!(
                (t - w / (1.0 - p)).abs() <= 1e-6,
                "kept weight {t} is not {w} / (1 - {p})"
            );
        }
    }
    assert!(dropped > 0 && kept > 0, "dropped {dropped}, kept {kept}");
}
