//! The label-smoothed loss (both smoothing masses) against its formula, computed on the host in
//! f64 from the same inputs, and its closed-form gradient against the autodiff of the formula;
//! the loss as one autodiff node (`forward_autodiff`, `loss_op_*`) against the generic path on
//! ndarray, flex and wgpu, and against finite differences in f64.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::{
    activation::log_softmax, backend::Backend, DType, ElementConversion, Int, Tensor, TensorData,
};
use xfmr_models::{LabelSmoothedCrossEntropyConfig, SmoothedLoss, SmoothingMass};

type B = NdArray<f32>;

const MASSES: [SmoothingMass; 2] = [SmoothingMass::NonPadding, SmoothingMass::AllTokens];

/// The loss under test.
fn smoothed<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    pad: u32,
    eps: f64,
    mass: SmoothingMass,
) -> SmoothedLoss<B> {
    LabelSmoothedCrossEntropyConfig::new(pad)
        .with_epsilon(eps)
        .with_mass(mass)
        .init()
        .unwrap()
        .forward(logits, targets)
}

/// A small deterministic generator (splitmix64), so the inputs need no global seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 6.0 - 3.0
        })
        .collect()
}

/// `L = Σ_t [−(1−ε) log p(y_t) − ε/|S| Σ_{v∈S} log p(v)] / #non-pad`, `S` the tokens other than
/// `y_t` and padding (`NonPadding`) or every token (`AllTokens`), and the NLL.
fn host_loss(
    logits: &[f32],
    targets: &[i64],
    vocab: usize,
    pad: u32,
    eps: f64,
    mass: SmoothingMass,
) -> (f64, f64) {
    let pad = pad as usize;
    let (mut loss, mut nll, mut count) = (0.0, 0.0, 0usize);
    for (t, &y) in targets.iter().enumerate() {
        if y as usize == pad {
            continue;
        }
        let row: Vec<f64> = logits[t * vocab..(t + 1) * vocab]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let lp = |v: usize| row[v] - log_z;
        let set: Vec<usize> = match mass {
            SmoothingMass::NonPadding => (0..vocab)
                .filter(|&v| v != y as usize && v != pad)
                .collect(),
            SmoothingMass::AllTokens => (0..vocab).collect(),
        };
        let others: f64 = set.iter().map(|&v| lp(v)).sum();
        loss += -(1.0 - eps) * lp(y as usize) - eps / set.len() as f64 * others;
        nll += -lp(y as usize);
        count += 1;
    }
    (loss / count as f64, nll / count as f64)
}

#[test]
fn label_smoothed_loss_equals_its_formula() {
    let device = Default::default();
    let (batch, seq, vocab, pad) = (3, 5, 11, 0);
    let logits = values(batch * seq * vocab, 7);
    // Row 1 ends in padding, row 2 is padding after its first token.
    let targets: Vec<i64> = vec![4, 2, 9, 1, 10, 3, 3, 7, 0, 0, 5, 0, 0, 0, 0];
    for (eps, mass) in [0.0, 0.1, 0.3]
        .into_iter()
        .flat_map(|eps| MASSES.map(|mass| (eps, mass)))
    {
        let out = smoothed(
            Tensor::<B, 3>::from_data(
                TensorData::new(logits.clone(), [batch, seq, vocab]),
                &device,
            ),
            Tensor::<B, 2, Int>::from_data(TensorData::new(targets.clone(), [batch, seq]), &device),
            pad,
            eps,
            mass,
        );
        let (want_loss, want_nll) = host_loss(&logits, &targets, vocab, pad, eps, mass);
        let loss = f64::from(out.loss.into_scalar());
        let nll = f64::from(out.nll.into_scalar());
        // f32 log-softmax over 11 logits in [-3, 3]: a few ulps of values near 3.
        assert!(
            (loss - want_loss).abs() <= 1e-5,
            "ε={eps}, {mass:?}: loss {loss} vs {want_loss}"
        );
        assert!(
            (nll - want_nll).abs() <= 1e-5,
            "ε={eps}, {mass:?}: nll {nll} vs {want_nll}"
        );
        assert_eq!(out.tokens, 9);
    }
}

/// Padding changes nothing: appending padded positions (with any logits) leaves loss and NLL.
#[test]
fn label_smoothed_loss_ignores_padding_positions() {
    let device = Default::default();
    let vocab = 7;
    let logits = values(2 * 6 * vocab, 11);
    let short: Vec<i64> = vec![3, 4, 5, 6];
    let long: Vec<i64> = vec![3, 4, 1, 1, 1, 1, 5, 6, 1, 1, 1, 1];
    let short_logits: Vec<f32> = [&logits[..2 * vocab], &logits[6 * vocab..8 * vocab]].concat();
    let run = |l: Vec<f32>, t: Vec<i64>, seq: usize, mass| {
        let out = smoothed(
            Tensor::<B, 3>::from_data(TensorData::new(l, [2, seq, vocab]), &device),
            Tensor::<B, 2, Int>::from_data(TensorData::new(t, [2, seq]), &device),
            1,
            0.1,
            mass,
        );
        (f64::from(out.loss.into_scalar()), out.tokens)
    };
    for mass in MASSES {
        let (a, na) = run(short_logits.clone(), short.clone(), 2, mass);
        let (b, nb) = run(logits.clone(), long.clone(), 6, mass);
        assert_eq!(na, nb);
        assert!((a - b).abs() <= 1e-6, "{mass:?}: {a} vs {b}");
    }
}

/// The loss's formula differentiated by autodiff: log-softmax, the target's and the padding
/// column's log-probabilities, the row sums: the formula whose gradient
/// `LabelSmoothedCrossEntropy` hands autodiff in closed form.
fn formula_loss<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 2, Int>,
    pad: u32,
    eps: f64,
    mass: SmoothingMass,
) -> Tensor<B, 1> {
    let [n, vocab] = logits.dims();
    let log_probs = log_softmax(logits, 1);
    let keep = targets
        .clone()
        .not_equal_elem(i64::from(pad))
        .float()
        .reshape([n]);
    let count = keep.clone().sum();
    let target_lp = log_probs.clone().gather(1, targets).reshape([n]);
    let pad_lp = log_probs.clone().narrow(1, pad as usize, 1).reshape([n]);
    let all = log_probs.sum_dim(1).reshape([n]);
    let (others, set) = match mass {
        SmoothingMass::NonPadding => (all - target_lp.clone() - pad_lp, vocab - 2),
        SmoothingMass::AllTokens => (all, vocab),
    };
    let per_token = target_lp.mul_scalar(-(1.0 - eps)) - others.mul_scalar(eps / set as f64);
    (per_token * keep).sum() / count
}

/// The closed-form gradient the loss gives autodiff equals the autodiff of its formula, padded
/// rows get none, and the value is unchanged.
#[test]
fn label_smoothed_loss_gradient_equals_autodiff_of_its_formula() {
    type Ad = Autodiff<B>;
    let device = Default::default();
    let (batch, seq, vocab, pad) = (3, 5, 11, 0);
    let logits = values(batch * seq * vocab, 13);
    let targets: Vec<i64> = vec![4, 2, 9, 1, 10, 3, 3, 7, 0, 0, 5, 0, 0, 0, 0];
    let n = batch * seq;
    for (eps, mass) in [0.0, 0.1, 0.3]
        .into_iter()
        .flat_map(|eps| MASSES.map(|mass| (eps, mass)))
    {
        let leaf = || {
            Tensor::<Ad, 2>::from_data(TensorData::new(logits.clone(), [n, vocab]), &device)
                .require_grad()
        };
        let ids =
            || Tensor::<Ad, 2, Int>::from_data(TensorData::new(targets.clone(), [n, 1]), &device);
        let (ours, reference) = (leaf(), leaf());
        let out = smoothed(
            ours.clone().reshape([batch, seq, vocab]),
            ids().reshape([batch, seq]),
            pad,
            eps,
            mass,
        );
        let want = formula_loss(reference.clone(), ids(), pad, eps, mass);
        let (value, want_value) = (
            f64::from(out.loss.clone().into_scalar()),
            f64::from(want.clone().into_scalar()),
        );
        assert!(
            (value - want_value).abs() <= 1e-5,
            "ε={eps}, {mass:?}: {value} vs {want_value}"
        );
        let got = ours.grad(&out.loss.backward()).unwrap().into_data();
        let want = reference.grad(&want.backward()).unwrap().into_data();
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        // Entries are (p − q) / 9 with p, q ≤ 1: both sides are f32 softmaxes a few ulps
        // (2⁻²⁴ ≈ 6e-8) from exact, so 1e-7 absolute is ~10 ulps of the largest entry.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-7,
                "ε={eps}, {mass:?}, entry {i}: {g} vs {w}"
            );
        }
        for (t, &y) in targets.iter().enumerate() {
            if y == i64::from(pad) {
                assert!(got[t * vocab..(t + 1) * vocab].iter().all(|&g| g == 0.0));
            }
        }
    }
}

/// An `ε` outside `[0, 1)` is a typed error naming the field.
#[test]
fn label_smoothed_loss_refuses_an_epsilon_outside_its_range() {
    for eps in [1.0, -0.1, f64::NAN] {
        let err = LabelSmoothedCrossEntropyConfig::new(0)
            .with_epsilon(eps)
            .init()
            .unwrap_err();
        assert!(err.to_string().contains("`epsilon`"), "{err}");
    }
}

/// The loss of `logits` `[n, vocab]` through the one-node op and, for the same values, through
/// the generic path, on `Autodiff<I>`: both losses, NLLs and token counts, and the gradients of
/// `3 · loss` (so the op's backward scales by its output's gradient).
fn op_and_generic<I: Backend>(
    device: &I::Device,
    logits: &[f32],
    targets: &[i64],
    [batch, seq, vocab]: [usize; 3],
    (pad, eps, mass): (u32, f64, SmoothingMass),
) -> [(f64, f64, usize, Vec<f32>); 2] {
    type Ad<I> = Autodiff<I>;
    let loss = LabelSmoothedCrossEntropyConfig::new(pad)
        .with_epsilon(eps)
        .with_mass(mass)
        .init()
        .unwrap();
    let run = |one_node: bool| {
        let leaf = Tensor::<Ad<I>, 3>::from_data(
            TensorData::new(logits.to_vec(), [batch, seq, vocab]),
            device,
        )
        .require_grad();
        let ids = Tensor::<Ad<I>, 2, Int>::from_data(
            TensorData::new(targets.to_vec(), [batch, seq]),
            device,
        );
        let out = if one_node {
            loss.forward_autodiff(leaf.clone(), ids)
        } else {
            loss.forward(leaf.clone(), ids)
        };
        let grads = out.loss.clone().mul_scalar(3.0).backward();
        let grad = leaf.grad(&grads).unwrap().into_data();
        (
            out.loss.into_scalar().elem::<f64>(),
            out.nll.into_scalar().elem::<f64>(),
            out.tokens,
            grad.convert::<f32>().to_vec::<f32>().unwrap(),
        )
    };
    [run(true), run(false)]
}

/// Asserts the op's results equal the generic path's: values ≤ 1e-6, gradient entries ≤ 1e-7
/// (entries are 3 (p − q) / 9: the same f32 statistics, so a few ulps at most), and no
/// gradient on the padded targets' rows.
fn assert_op_equals_generic(
    results: [(f64, f64, usize, Vec<f32>); 2],
    targets: &[i64],
    vocab: usize,
    pad: u32,
    what: &str,
) {
    let [(loss, nll, tokens, grad), (want_loss, want_nll, want_tokens, want_grad)] = results;
    assert!(
        (loss - want_loss).abs() <= 1e-6,
        "{what}: loss {loss} vs {want_loss}"
    );
    assert!(
        (nll - want_nll).abs() <= 1e-6,
        "{what}: nll {nll} vs {want_nll}"
    );
    assert_eq!(tokens, want_tokens, "{what}");
    for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
        assert!((g - w).abs() <= 1e-7, "{what}, entry {i}: {g} vs {w}");
    }
    for (t, &y) in targets.iter().enumerate() {
        if y == i64::from(pad) {
            let row = &grad[t * vocab..(t + 1) * vocab];
            assert!(row.iter().all(|&g| g == 0.0), "{what}: padded row {t}");
        }
    }
}

/// The one-node loss equals the generic path on `Autodiff<NdArray>` and `Autodiff<Flex>`: loss,
/// NLL, token count and gradient, for both smoothing masses, ε ∈ {0, 0.1, 0.3}, with padded
/// targets (ignored: no gradient on their rows). (With the feature `flex`, which this binary
/// has, both paths on `Autodiff<Flex>` are the host kernel: the next test compares it.)
#[test]
fn loss_op_equals_the_generic_path_on_the_cpu() {
    let (batch, seq, vocab, pad) = (3, 5, 11, 0);
    let logits = values(batch * seq * vocab, 17);
    let targets: Vec<i64> = vec![4, 2, 9, 1, 10, 3, 3, 7, 0, 0, 5, 0, 0, 0, 0];
    for (eps, mass) in [0.0, 0.1, 0.3]
        .into_iter()
        .flat_map(|eps| MASSES.map(|mass| (eps, mass)))
    {
        let shape = [batch, seq, vocab];
        let what = format!("ndarray, ε={eps}, {mass:?}");
        let results = op_and_generic::<B>(
            &Default::default(),
            &logits,
            &targets,
            shape,
            (pad, eps, mass),
        );
        assert_op_equals_generic(results, &targets, vocab, pad, &what);
        let what = format!("flex, ε={eps}, {mass:?}");
        let results = op_and_generic::<Flex>(
            &Default::default(),
            &logits,
            &targets,
            shape,
            (pad, eps, mass),
        );
        assert_op_equals_generic(results, &targets, vocab, pad, &what);
    }
}

/// The same on wgpu (`Autodiff` over the unfused wgpu backend, lavapipe here), once per mass.
#[test]
fn loss_op_equals_the_generic_path_on_wgpu() {
    let (device, _) = crate::long_inputs::wgpu_device();
    let (batch, seq, vocab, pad) = (2, 3, 37, 1);
    let logits = values(batch * seq * vocab, 19);
    let targets: Vec<i64> = vec![4, 1, 9, 30, 1, 1];
    for mass in MASSES {
        let results = op_and_generic::<crate::long_inputs::WgpuUnfused>(
            &device,
            &logits,
            &targets,
            [batch, seq, vocab],
            (pad, 0.1, mass),
        );
        assert_op_equals_generic(results, &targets, vocab, pad, &format!("wgpu, {mass:?}"));
    }
}

/// The one-node loss's gradient equals central finite differences of the loss in f64
/// (`Autodiff<NdArray<f64>>`, h = 1e-6, every entry of a 2 × 3 × 5 input; the loss is smooth,
/// so the differences are within ~1e-9), both masses, one padded target.
#[test]
fn loss_op_gradient_equals_finite_differences() {
    type F = NdArray<f64>;
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let (batch, seq, vocab, pad) = (2, 3, 5, 0);
    let logits: Vec<f64> = values(batch * seq * vocab, 23)
        .into_iter()
        .map(f64::from)
        .collect();
    let targets: Vec<i64> = vec![3, 1, 4, 2, 0, 0];
    for mass in MASSES {
        let loss = LabelSmoothedCrossEntropyConfig::new(pad)
            .with_epsilon(0.1)
            .with_mass(mass)
            .init()
            .unwrap();
        let ids = || {
            Tensor::<Autodiff<F>, 2, Int>::from_data(
                TensorData::new(targets.clone(), [batch, seq]),
                &device,
            )
        };
        let value = |x: Vec<f64>| {
            let x = Tensor::<Autodiff<F>, 3>::from_data(
                TensorData::new(x, [batch, seq, vocab]),
                (&device, DType::F64),
            );
            loss.forward_autodiff(x, ids())
                .loss
                .into_scalar()
                .elem::<f64>()
        };
        let leaf = Tensor::<Autodiff<F>, 3>::from_data(
            TensorData::new(logits.clone(), [batch, seq, vocab]),
            (&device, DType::F64),
        )
        .require_grad();
        let out = loss.forward_autodiff(leaf.clone(), ids());
        let grad = leaf.grad(&out.loss.backward()).unwrap().into_data();
        assert_eq!(grad.dtype, DType::F64, "{mass:?}: an f64 gradient");
        let grad = grad.to_vec::<f64>().unwrap();
        let h = 1e-6;
        for (i, &g) in grad.iter().enumerate() {
            let (mut up, mut down) = (logits.clone(), logits.clone());
            up[i] += h;
            down[i] -= h;
            let fd = (value(up) - value(down)) / (2.0 * h);
            assert!((g - fd).abs() <= 1e-8, "{mass:?}, entry {i}: {g} vs {fd}");
        }
    }
}

/// With the feature `flex`, the loss on `Autodiff<Flex>` and on `Flex` is xfmr's host kernel
/// (`xfmr_kernels::smoothed_cross_entropy`: its gradient bit for bit, the proof of the path),
/// and equals the generic path on ndarray: loss and NLL within 1e-5 relative, the gradient
/// (with an incoming gradient of 3, not 1) within 1e-5 relative plus 1e-9 per entry, the token
/// count exactly, no gradient on padded rows; both masses, ε ∈ {0, 0.1}, a 4,000-token
/// vocabulary over 40 rows (several parallel blocks of rows) with padded targets.
#[test]
fn loss_on_flex_takes_the_kernel_and_equals_the_generic_path() {
    let (batch, seq, vocab, pad) = (4, 10, 4_000, 2);
    let logits = values(batch * seq * vocab, 29);
    let targets: Vec<i64> = (0..batch * seq)
        .map(|t| {
            if t % 7 == 3 {
                2
            } else {
                ((t * 613) % vocab) as i64
            }
        })
        .collect();
    assert!(targets.contains(&i64::from(pad)) && targets.contains(&0));
    let close = |a: f64, b: f64, what: &str| {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{what}: {a} vs {b}");
    };
    for (eps, mass) in [0.0, 0.1]
        .into_iter()
        .flat_map(|eps| MASSES.map(|mass| (eps, mass)))
    {
        let what = format!("ε={eps}, {mass:?}");
        let shape = [batch, seq, vocab];
        let [(loss, nll, tokens, grad), _] = op_and_generic::<Flex>(
            &Default::default(),
            &logits,
            &targets,
            shape,
            (pad, eps, mass),
        );
        let [_, (want_loss, want_nll, want_tokens, want_grad)] = op_and_generic::<B>(
            &Default::default(),
            &logits,
            &targets,
            shape,
            (pad, eps, mass),
        );
        close(loss, want_loss, &format!("{what}: loss"));
        close(nll, want_nll, &format!("{what}: nll"));
        assert_eq!(tokens, want_tokens, "{what}");
        for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs() + 1e-9,
                "{what}, entry {i}: {g} vs {w}"
            );
        }
        for (t, &y) in targets.iter().enumerate() {
            if y == i64::from(pad) {
                assert!(grad[t * vocab..(t + 1) * vocab].iter().all(|&g| g == 0.0));
            }
        }
        // The kernel itself, called directly: the same gradient bit for bit.
        let leaf = Tensor::<Autodiff<Flex>, 2>::from_data(
            TensorData::new(logits.clone(), [batch * seq, vocab]),
            &Default::default(),
        )
        .require_grad();
        let ids: Vec<u32> = targets.iter().map(|&t| t as u32).collect();
        let smoothing = xfmr_kernels::Smoothing {
            pad,
            epsilon: eps as f32,
            excludes_target_and_pad: mass == SmoothingMass::NonPadding,
        };
        let out = xfmr_kernels::smoothed_cross_entropy(leaf.clone(), &ids, smoothing);
        let direct = leaf
            .grad(&out.loss.mul_scalar(3.0).backward())
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert!(
            direct == grad,
            "{what}: the loss on Autodiff<Flex> is not the kernel"
        );
        // Flex without autodiff: the value only, as ndarray's.
        let device = Default::default();
        let out = smoothed(
            Tensor::<Flex, 3>::from_data(TensorData::new(logits.clone(), shape), &device),
            Tensor::<Flex, 2, Int>::from_data(
                TensorData::new(targets.clone(), [batch, seq]),
                &device,
            ),
            pad,
            eps,
            mass,
        );
        let flex_loss = out.loss.into_scalar().elem::<f64>();
        close(flex_loss, want_loss, &format!("{what}: flex loss"));
        close(
            out.nll.into_scalar().elem::<f64>(),
            want_nll,
            &format!("{what}: flex nll"),
        );
        let direct = xfmr_kernels::smoothed_cross_entropy(
            Tensor::<Flex, 2>::from_data(
                TensorData::new(logits.clone(), [batch * seq, vocab]),
                &Default::default(),
            ),
            &ids,
            smoothing,
        );
        assert_eq!(
            flex_loss,
            direct.loss.into_scalar().elem::<f64>(),
            "{what}: the loss on Flex is not the kernel"
        );
    }
}

/// The loss kernel on `Autodiff<Flex>` where the logits' buffer is its own (written in place)
/// and where another tensor shares it (copied first): the same gradient bit for bit, and the
/// shared tensor's values unchanged after the forward and backward passes; a transposed
/// (non-contiguous) input gives the contiguous one's gradient, transposed; a batch of padding
/// only scores 0 over 0 tokens, with a zero gradient.
#[test]
fn loss_on_autodiff_flex_leaves_shared_logits_intact() {
    type A = Autodiff<Flex>;
    let (rows, vocab) = (6, 300);
    let logits = values(rows * vocab, 31);
    let ids: Vec<u32> = vec![5, 0, 299, 17, 0, 42];
    let smoothing = xfmr_kernels::Smoothing {
        pad: 0,
        epsilon: 0.1,
        excludes_target_and_pad: true,
    };
    let device = Default::default();
    let leaf = || {
        Tensor::<A, 2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), &device)
            .require_grad()
    };
    let gradient = |leaf: &Tensor<A, 2>, input: Tensor<A, 2>, ids: &[u32]| {
        let out = xfmr_kernels::smoothed_cross_entropy(input, ids, smoothing);
        let grads = out.loss.backward();
        let grad: Vec<f32> = leaf.grad(&grads).unwrap().into_data().to_vec().unwrap();
        (out.tokens, grad)
    };
    let shared = leaf();
    let (_, from_shared) = gradient(&shared, shared.clone(), &ids);
    let kept: Vec<f32> = shared.into_data().to_vec().unwrap();
    assert!(kept == logits, "the shared logits were overwritten");
    let own = leaf();
    // `mul_scalar(1.0)`: the same values in a buffer nothing else holds.
    let (_, from_own) = gradient(&own, own.clone().mul_scalar(1.0), &ids);
    assert!(from_own == from_shared, "in place and on a copy differ");

    let transposed: Vec<f32> = (0..vocab * rows)
        .map(|i| logits[(i % rows) * vocab + i / rows])
        .collect();
    let leaf_t = Tensor::<A, 2>::from_data(TensorData::new(transposed, [vocab, rows]), &device)
        .require_grad();
    let (_, from_view) = gradient(&leaf_t, leaf_t.clone().swap_dims(0, 1), &ids);
    for (i, g) in from_view.iter().enumerate() {
        let (v, r) = (i / rows, i % rows);
        assert_eq!(*g, from_shared[r * vocab + v], "row {r}, token {v}");
    }

    let padding = leaf();
    let input = padding.clone();
    let out = xfmr_kernels::smoothed_cross_entropy(input, &[0; 6], smoothing);
    assert_eq!(out.tokens, 0);
    assert_eq!(out.loss.clone().into_scalar().elem::<f64>(), 0.0);
    let grad: Vec<f32> = padding
        .grad(&out.loss.backward())
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap();
    assert!(grad.iter().all(|&g| g == 0.0));
}
