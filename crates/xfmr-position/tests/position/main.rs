//! Tests of xfmr-position: the sinusoidal table against PyTorch's, and the properties each
//! encoding promises. One test binary.

use std::collections::HashSet;

use burn::backend::{Flex, NdArray, Wgpu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use xfmr_attention::{AttentionError, KvCache, MhaInput, MultiHeadAttentionConfig};
use xfmr_position::{
    alibi_slopes, sinusoidal_table, AlibiConfig, LearnedPositionConfig, LearnedPositionEmbedding,
    PositionCombine, PositionError, PositionInjectionConfig, RotaryConfig, RotaryLayout,
    SinusoidalConfig,
};
use xfmr_testing::{assert_close, max_abs_diff, to_vec, Fixture, TestRng};

type Cpu = NdArray<f32>;

/// The table equals `torch/sinusoidal` within 1e-6; sizes come from the fixture's metadata.
fn sinusoidal_matches_fixture<B: Backend>() {
    let fx = Fixture::load("torch/sinusoidal");
    let (max_len, d_model) = (fx.config_usize("max_len"), fx.config_usize("d_model"));
    let device = B::Device::default();
    let pe = SinusoidalConfig::new(d_model)
        .with_max_len(max_len)
        .init::<B>(&device)
        .unwrap();
    assert_close(
        &pe.encoding(max_len, 0),
        fx.host("output.table"),
        1e-6,
        0.0,
        "sinusoidal table",
    );
    // Computed on the fly past the precomputed rows: same values.
    let short = SinusoidalConfig::new(d_model)
        .with_max_len(3)
        .init::<B>(&device)
        .unwrap();
    assert_close(
        &short.encoding(max_len, 0),
        fx.host("output.table"),
        1e-6,
        0.0,
        "on-the-fly rows",
    );
}

#[test]
fn sinusoidal_matches_fixture_ndarray() {
    sinusoidal_matches_fixture::<Cpu>();
}

#[test]
fn sinusoidal_matches_fixture_flex() {
    sinusoidal_matches_fixture::<Flex>();
}

#[test]
fn sinusoidal_matches_fixture_wgpu() {
    sinusoidal_matches_fixture::<Wgpu>();
}

#[test]
fn sinusoidal_values_are_bounded_and_rows_distinct() {
    let (max_len, d_model) = (2048, 16);
    let table = sinusoidal_table(0, max_len, d_model, 10000.0);
    assert!(table.iter().all(|v| (-1.0..=1.0).contains(v)));
    let rows: HashSet<Vec<u32>> = table
        .chunks(d_model)
        .map(|row| row.iter().map(|v| v.to_bits()).collect())
        .collect();
    assert_eq!(rows.len(), max_len, "some positions share an encoding");
}

/// For each frequency pair, PE(pos + k) is a fixed rotation of PE(pos) (paper §3.5: PE_{pos+k} is
/// a linear function of PE_pos), with angle k·ω_i, ω_i = 1 / 10000^(2i/d). Tolerance 1e-5 (f32).
#[test]
fn sinusoidal_offset_is_a_fixed_rotation() {
    let (d_model, base) = (16, 10000.0f64);
    let table = sinusoidal_table(0, 200, d_model, base);
    let at = |pos: usize, col: usize| table[pos * d_model + col] as f64;
    for k in [1usize, 7, 50] {
        for i in 0..d_model / 2 {
            let omega = base.powf(-2.0 * i as f64 / d_model as f64);
            let (c, s) = ((k as f64 * omega).cos(), (k as f64 * omega).sin());
            for pos in 0..150 {
                let (sin_p, cos_p) = (at(pos, 2 * i), at(pos, 2 * i + 1));
                let sin_next = c * sin_p + s * cos_p;
                let cos_next = -s * sin_p + c * cos_p;
                assert!(
                    (sin_next - at(pos + k, 2 * i)).abs() < 1e-5,
                    "pos {pos}, k {k}, pair {i}"
                );
                assert!(
                    (cos_next - at(pos + k, 2 * i + 1)).abs() < 1e-5,
                    "pos {pos}, k {k}, pair {i}"
                );
            }
        }
    }
}

#[test]
fn sinusoidal_offset_forward_equals_slicing_and_odd_width_is_handled() {
    let device = Default::default();
    let pe = SinusoidalConfig::new(8)
        .with_max_len(64)
        .init::<Cpu>(&device)
        .unwrap();
    let full = pe.encoding(64, 0);
    assert_eq!(
        max_abs_diff(&pe.encoding(10, 37), &full.clone().narrow(0, 37, 10)),
        0.0
    );
    // One decoding step at position t is row t.
    assert_eq!(
        max_abs_diff(&pe.encoding(1, 63), &full.narrow(0, 63, 1)),
        0.0
    );
    // Past the table: computed, equal to the paper's formula written out here in f64
    // (PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(..)), to f32 rounding of
    // arguments up to 65 (≤ 65·2⁻²⁴ ≈ 4e-6).
    let beyond = to_vec(&pe.encoding(4, 62));
    for (r, row) in beyond.chunks(8).enumerate() {
        let pos = (62 + r) as f64;
        for (col, &got) in row.iter().enumerate() {
            let angle = pos / 10000f64.powf((col - col % 2) as f64 / 8.0);
            let want = if col % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            };
            assert!(
                (got - want).abs() < 1e-5,
                "PE({pos}, {col}) = {got}, formula {want}"
            );
        }
    }
    // Odd width: the unpaired last column is a sine.
    let odd = sinusoidal_table(3, 1, 7, 10000.0);
    assert_eq!(odd.len(), 7);
    assert!((odd[6] as f64 - (3.0 / 10000f64.powf(6.0 / 7.0)).sin()).abs() < 1e-7);
    assert_eq!(
        SinusoidalConfig::new(0).init::<Cpu>(&device).unwrap_err(),
        PositionError::InvalidConfig {
            field: "d_model",
            value: "0".into(),
            expected: "must be positive"
        }
    );
}

#[test]
fn learned_table_slices_loads_and_rejects_long_sequences() {
    let device = Default::default();
    let mut rng = TestRng::new(1);
    let table = rng.tensor::<Cpu, 2>([16, 4], 1.0, &device);
    let learned = LearnedPositionEmbedding::from_pretrained(table.clone());
    assert_eq!(
        max_abs_diff(
            &learned.encoding(3, 5).unwrap(),
            &table.clone().narrow(0, 5, 3)
        ),
        0.0
    );
    let err = learned.encoding(5, 14).unwrap_err();
    assert_eq!(
        err.to_string(),
        "positions 14..19 exceed the table's maximum length 16 (sequence length 5 at offset 14)"
    );
    let fresh = LearnedPositionConfig::new(16, 4)
        .init::<Cpu>(&device)
        .unwrap();
    let loaded = fresh.load_table(table.clone()).unwrap();
    assert_eq!(max_abs_diff(&loaded.table.val(), &table), 0.0);
    let wrong = LearnedPositionConfig::new(16, 4)
        .init::<Cpu>(&device)
        .unwrap();
    assert_eq!(
        wrong
            .load_table(Tensor::zeros([8, 4], &device))
            .unwrap_err()
            .to_string(),
        "position table has shape [8, 4], expected [max_len, 4]"
    );
}

/// RoPE preserves norms, makes q·k depend only on the offset between positions, matches the
/// pairwise rotation formula, and rotating a decoding step at its offset equals slicing the
/// full rotation (so cached keys stay valid). Checked on ndarray, flex and wgpu.
fn rotary_properties<B: Backend>(tol: f64) {
    let device = B::Device::default();
    let mut rng = TestRng::new(2);
    let d = 8;
    for layout in [RotaryLayout::HalfSplit, RotaryLayout::Interleaved] {
        let rope = RotaryConfig::new(d).with_layout(layout).init().unwrap();
        let x = rng.tensor::<B, 4>([2, 3, 6, d], 1.0, &device);
        let rotated = rope.apply(x.clone(), 5);
        let norms = |t: &Tensor<B, 4>| t.clone().powi_scalar(2).sum_dim(3).sqrt();
        assert!(
            max_abs_diff(&norms(&x), &norms(&rotated)) < tol,
            "{layout:?}: norms"
        );
        // Offset forward equals slicing.
        let step = rope.apply(x.clone().narrow(2, 4, 1), 5 + 4);
        assert!(
            max_abs_diff(&step, &rotated.clone().narrow(2, 4, 1)) < tol,
            "{layout:?}: offset"
        );
        // q·k depends only on p − p'.
        let q = rng.tensor::<B, 4>([1, 1, 1, d], 1.0, &device);
        let k = rng.tensor::<B, 4>([1, 1, 1, d], 1.0, &device);
        let dot = |p: usize, pk: usize| -> f64 {
            to_vec(&(rope.apply(q.clone(), p) * rope.apply(k.clone(), pk)).sum())
                .iter()
                .sum()
        };
        for shift in [1, 10, 100] {
            assert!(
                (dot(3, 1) - dot(3 + shift, 1 + shift)).abs() < tol * 10.0,
                "{layout:?}: relative"
            );
        }
        // The formula for one vector at position p.
        let v = to_vec(&q);
        let out = to_vec(&rope.apply(q.clone(), 3));
        for i in 0..d / 2 {
            let (a, b) = match layout {
                RotaryLayout::HalfSplit => (i, i + d / 2),
                RotaryLayout::Interleaved => (2 * i, 2 * i + 1),
            };
            let angle = 3.0 * 10000f64.powf(-2.0 * i as f64 / d as f64);
            assert!((out[a] - (v[a] * angle.cos() - v[b] * angle.sin())).abs() < tol);
            assert!((out[b] - (v[b] * angle.cos() + v[a] * angle.sin())).abs() < tol);
        }
    }
}

#[test]
fn rotary_properties_ndarray() {
    rotary_properties::<Cpu>(1e-5);
}

#[test]
fn rotary_properties_flex() {
    rotary_properties::<Flex>(1e-5);
}

#[test]
fn rotary_properties_wgpu() {
    rotary_properties::<Wgpu>(1e-4);
}

#[test]
fn rotary_rejects_odd_head_dim() {
    assert_eq!(
        RotaryConfig::new(7).init().unwrap_err().to_string(),
        "invalid configuration: `head_dim` = 7: must be even (rotated in pairs)"
    );
}

/// Slopes follow the published rule: powers of two give 2^(-8h/n); other counts take the
/// nearest lower power of two and every other slope of twice as many heads.
#[test]
fn alibi_slopes_follow_the_published_formula() {
    let close = |a: &[f64], b: &[f64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    };
    let pow2 = |e: &[f64]| e.iter().map(|&x| 2f64.powf(x)).collect::<Vec<_>>();
    assert!(close(
        &alibi_slopes(8),
        &pow2(&[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0])
    ));
    assert!(close(&alibi_slopes(4), &pow2(&[-2.0, -4.0, -6.0, -8.0])));
    assert!(close(
        &alibi_slopes(6),
        &pow2(&[-2.0, -4.0, -6.0, -8.0, -1.0, -3.0])
    ));
    assert!(close(
        &alibi_slopes(12),
        &pow2(&[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -0.5, -1.5, -2.5, -3.5])
    ));
}

/// The bias is -m·|i - j|; one decoding step's bias is the last row of the full bias.
fn alibi_bias<B: Backend>() {
    let device = B::Device::default();
    let alibi = AlibiConfig::new(4).init().unwrap();
    let full = alibi.bias::<B>(5, 5, &device);
    assert_eq!(full.dims(), [1, 4, 5, 5]);
    let values = to_vec(&full);
    let m = alibi_slopes(4);
    for h in 0..4 {
        for i in 0..5 {
            for j in 0..5 {
                let expected = -m[h] * (i as f64 - j as f64).abs();
                assert!((values[(h * 5 + i) * 5 + j] - expected).abs() < 1e-6);
            }
        }
    }
    let step = alibi.bias::<B>(1, 5, &device);
    assert!(max_abs_diff(&step, &full.narrow(2, 4, 1)) < 1e-7);
}

#[test]
fn alibi_bias_ndarray() {
    alibi_bias::<Cpu>();
}

#[test]
fn alibi_bias_flex() {
    alibi_bias::<Flex>();
}

#[test]
fn alibi_bias_wgpu() {
    alibi_bias::<Wgpu>();
}

#[test]
fn positions_are_added_or_concatenated() {
    let device = Default::default();
    let mut rng = TestRng::new(3);
    let x = rng.tensor::<Cpu, 3>([2, 5, 8], 1.0, &device);
    let pe = SinusoidalConfig::new(8)
        .init::<Cpu>(&device)
        .unwrap()
        .encoding(5, 0);

    let add = PositionInjectionConfig::new(8, 8).with_dropout(0.0);
    assert_eq!(add.d_output(), 8);
    let out = add.init().unwrap().forward(x.clone(), pe.clone());
    let expected = x.clone() + pe.clone().unsqueeze_dim::<3>(0);
    assert_eq!(max_abs_diff(&out, &expected), 0.0);

    let concat = PositionInjectionConfig::new(8, 8)
        .with_combine(PositionCombine::Concat)
        .with_dropout(0.0);
    assert_eq!(concat.d_output(), 16);
    let out = concat.init().unwrap().forward(x.clone(), pe.clone());
    assert_eq!(out.dims(), [2, 5, 16]);
    assert_eq!(max_abs_diff(&out.clone().narrow(2, 0, 8), &x), 0.0);
    assert_eq!(
        max_abs_diff(&out.narrow(2, 8, 8).narrow(0, 1, 1).reshape([5, 8]), &pe),
        0.0
    );

    assert_eq!(
        PositionInjectionConfig::new(8, 6)
            .init()
            .unwrap_err()
            .to_string(),
        "cannot add positions of width 6 to tokens of width 8: use equal widths or concatenation"
    );
    assert_eq!(
        PositionInjectionConfig::new(8, 8)
            .with_dropout(1.5)
            .init()
            .unwrap_err(),
        PositionError::InvalidConfig {
            field: "dropout",
            value: "1.5".into(),
            expected: "a dropout probability in [0, 1)"
        }
    );
}

/// RoPE and ALiBi through multi-head attention: decoding step by step through the key/value cache
/// equals one causal pass (≤ 1e-5), with grouped key/value heads.
#[test]
fn rotary_and_alibi_compose_with_the_kv_cache() {
    let device = Default::default();
    let mut rng = TestRng::new(4);
    let (batch, seq, d_model, heads) = (2, 7, 32, 4);
    let mha = MultiHeadAttentionConfig::new(d_model, heads)
        .with_n_kv_heads(Some(2))
        .init::<Cpu>(&device)
        .unwrap();
    let x = rng.tensor::<Cpu, 3>([batch, seq, d_model], 1.0, &device);
    let rope = RotaryConfig::new(d_model / heads).init().unwrap();
    let alibi = AlibiConfig::new(heads).init().unwrap();

    let full_rope = mha
        .forward(MhaInput::self_attn(x.clone()).causal().rotary(rope.clone()))
        .context;
    let full_alibi = mha
        .forward(
            MhaInput::self_attn(x.clone())
                .causal()
                .bias(alibi.bias(seq, seq, &device)),
        )
        .context;
    let (mut rope_cache, mut alibi_cache) = (KvCache::new(), KvCache::new());
    let (mut rope_steps, mut alibi_steps) = (Vec::new(), Vec::new());
    for t in 0..seq {
        let step = x.clone().narrow(1, t, 1);
        rope_steps.push(
            mha.forward_cached(
                MhaInput::self_attn(step.clone()).rotary(rope.clone()),
                &mut rope_cache,
            )
            .context,
        );
        alibi_steps.push(
            mha.forward_cached(
                MhaInput::self_attn(step).bias(alibi.bias(1, t + 1, &device)),
                &mut alibi_cache,
            )
            .context,
        );
    }
    assert!(
        max_abs_diff(&full_rope, &Tensor::cat(rope_steps, 1)) <= 1e-5,
        "RoPE"
    );
    assert!(
        max_abs_diff(&full_alibi, &Tensor::cat(alibi_steps, 1)) <= 1e-5,
        "ALiBi"
    );
    // Positions matter: without them the same layer gives other outputs.
    let plain = mha.forward(MhaInput::self_attn(x.clone()).causal()).context;
    assert!(max_abs_diff(&plain, &full_rope) > 1e-3);

    let memory = rng.tensor::<Cpu, 3>([batch, 3, d_model], 1.0, &device);
    let err = mha
        .try_forward(MhaInput::cross(x, memory).rotary(rope))
        .unwrap_err();
    assert_eq!(err, AttentionError::RotaryCrossAttention);
}
