//! [`dropout`]: burn's `Dropout` with a faster mask on the CPU.

use std::cell::Cell;

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// Dropout (paper §5.4): during training (an autodiff backend) each element of `x` is zeroed
/// with probability `p = dropout.prob` and the others scaled by `1/(1 − p)`; elsewhere, or at
/// `p = 0`, `x` itself. The same operation as burn's [`Dropout::forward`]; xfmr's attention
/// (on its weights, in the reference path), blocks and models apply their dropout through this
/// function (the positional encodings' own in `xfmr-position` keeps burn's). Re-exported as
/// `xfmr_blocks::dropout`.
///
/// Under `Autodiff<Flex>` (training on the CPU, with this crate's `flex` feature) the mask comes
/// from `xfmr_kernels::dropout_mask` instead of burn's generator (a counter-based hash filled
/// in parallel, its seed drawn from burn's generator, so `Backend::seed` still fixes it, or
/// inside [`with_dropout_seed`] from the calling thread's own stream of seeds), and
/// the dropout is one product instead of two: burn's per-element sampler was 8% of a training
/// step (docs/benchmarks.md). The two generators give different masks of the same law.
///
/// # Shapes
/// - `x`: any; output: the same
pub fn dropout<B: Backend, const D: usize>(dropout: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    if !B::ad_enabled(&x.device()) || dropout.prob == 0.0 {
        return x;
    }
    // (p = 1, which xfmr's configurations refuse, is left to burn.)
    #[cfg(feature = "flex")]
    if dropout.prob < 1.0 && xfmr_kernels::runs_on_autodiff::<B>(x.dtype()) {
        use burn::tensor::{Distribution, TensorData};
        let device = x.device();
        // 48 bits of seed from burn's generator (two uniform f32 draws, 24 bits each).
        let seed = next_seed().unwrap_or_else(|| {
            let draws: Vec<f32> = Tensor::<B, 1>::random([2], Distribution::Default, &device)
                .into_data()
                .to_vec()
                .expect("f32 draws");
            let bits = |u: f32| (f64::from(u) * 16_777_216.0) as u64;
            bits(draws[0]) << 24 | bits(draws[1])
        });
        let shape = x.shape();
        let keep = (1.0 - dropout.prob) as f32;
        let mask = xfmr_kernels::dropout_mask(shape.num_elements(), keep, seed);
        return x * Tensor::from_data(TensorData::new(mask, shape), &device);
    }
    dropout.forward(x)
}

thread_local! {
    /// The state of the calling thread's stream of dropout seeds inside [`with_dropout_seed`].
    static STREAM: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Runs `f` with the calling thread's dropout masks seeded from a stream of its own, started at
/// `seed`, instead of the backend's generator, and restores the previous stream after it (also
/// when `f` panics). Nested calls take the innermost.
///
/// What data-parallel replicas that share one device need: burn's CPU backends have one
/// generator per process, so replicas that each seeded it and drew from it at once drew
/// in an order the scheduler chose, and a run with a fixed seed was not repeatable (two
/// replicas on two cores, the default `xfmr train`). The stream is read by the host masks
/// (`Autodiff<Flex>`, this crate's `flex` feature); other backends keep their generator.
///
/// (Tested in xfmr-blocks: `dropout_seed_stream_is_the_threads_own`.)
pub fn with_dropout_seed<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            STREAM.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(STREAM.with(|s| s.replace(Some(seed))));
    f()
}

/// The next seed of the calling thread's stream (SplitMix64), if [`with_dropout_seed`] set one.
#[cfg(feature = "flex")]
fn next_seed() -> Option<u64> {
    STREAM.with(|stream| {
        let mut state = stream.get()?;
        let seed = xfmr_kernels::splitmix64(&mut state);
        stream.set(Some(state));
        Some(seed)
    })
}
