//! The label-smoothed loss as one operation of burn's autodiff graph (feature `autodiff`),
//! generic over the inner backend `I` of `Autodiff<I>` and written with `I`'s own tensor
//! operations, which autodiff does not see.
//!
//! Forward: the loss's row statistics on `I` (the row maximum, `exp(z − m)`, its row sums, the
//! target's and the padding column's logits: [`LabelSmoothedCrossEntropy`]'s formula), the value
//! `L` as the node's output. Backward, given `∂ℓ/∂L` (a scalar):
//!
//! ```text
//! ∂ℓ/∂z_tv = ∂ℓ/∂L · w_t · (p_tv − q_tv),   p = softmax(z),   w_t = [y_t ≠ pad] / #{t : y_t ≠ pad}
//! ```
//!
//! with `q` the smoothed target distribution of the module docs of `loss.rs`. The node keeps
//! `exp(z − m)` `[tokens, V]` (what the generic path's surrogate product keeps too) and the
//! row sums; nothing of the loss's formula enters the graph, so the backward pass is this one
//! closed form instead of the formula's log-softmax, gather and sums differentiated.

use std::any::{Any, TypeId};
use std::fmt;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend, BackendTypes};
use burn::tensor::{Int, Tensor, TensorPrimitive};

use crate::loss::Rows;
use crate::{LabelSmoothedCrossEntropy, SmoothedLoss};

/// The float tensor of `Autodiff<I>`: `I`'s tensor and its node in the graph.
type AutodiffTensor<I> = <Autodiff<I> as BackendTypes>::FloatTensorPrimitive;

impl LabelSmoothedCrossEntropy {
    /// [`forward`](Self::forward) on an autodiff backend, the loss as one node of the graph
    /// whose backward is the closed form `∂L/∂z = w · (softmax(z) − q)` (see `loss_op.rs`):
    /// one operation forward and one backward instead of the generic path's statistics and
    /// surrogate product. `B` is `Autodiff<I>` for any inner backend `I` (burn's default
    /// checkpointing); any other autodiff backend takes [`forward`](Self::forward), and so
    /// does `Autodiff<Flex>` with the feature `flex` (its `forward` is the host kernel's one
    /// node). Values and gradients equal `forward`'s up to float rounding.
    ///
    /// # Shapes
    /// - `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]`
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_autodiff<B: AutodiffBackend>(
        &self,
        logits: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> SmoothedLoss<B> {
        if TypeId::of::<B>() != TypeId::of::<Autodiff<B::InnerBackend>>() {
            return self.forward(logits, targets);
        }
        // On Autodiff<Flex> `forward` takes the host kernel, itself one node of the graph.
        #[cfg(feature = "flex")]
        if xfmr_kernels::runs_on_autodiff::<B>(logits.dtype()) {
            return self.forward(logits, targets);
        }
        self.check(&logits.dims(), &targets.dims());
        self.one_node::<B>(logits, targets.inner())
    }

    /// The operation on `Autodiff<I>`, `I = B::InnerBackend`, reached where `B` is
    /// `Autodiff<I>` (compared by `TypeId` by the caller).
    fn one_node<B: AutodiffBackend>(
        &self,
        logits: Tensor<B, 3>,
        targets: Tensor<B::InnerBackend, 2, Int>,
    ) -> SmoothedLoss<B> {
        let [batch, seq, vocab] = logits.dims();
        let tracked = same::<B::FloatTensorPrimitive, AutodiffTensor<B::InnerBackend>>(
            logits.into_primitive().tensor(),
        );
        let z = Tensor::<B::InnerBackend, 3>::from_primitive(TensorPrimitive::Float(
            tracked.primitive.clone(),
        ))
        .reshape([batch * seq, vocab]);
        let rows = self.rows(z, targets.reshape([batch * seq, 1]));
        let (nll, tokens) = (rows.nll.clone(), rows.tokens);
        let prepared = <LossBackward as Backward<B::InnerBackend, 1>>::prepare::<NoCheckpointing>(
            LossBackward,
            [tracked.node.clone()],
        )
        .compute_bound()
        .stateful();
        let loss = match prepared {
            OpsKind::Tracked(prep) => {
                let value = rows.loss.clone().into_primitive().tensor();
                let state = Saved {
                    loss: *self,
                    rows,
                    shape: [batch, seq, vocab],
                };
                prep.finish(state, value)
            }
            OpsKind::UnTracked(prep) => prep.finish(rows.loss.into_primitive().tensor()),
        };
        SmoothedLoss {
            loss: Tensor::from_primitive(TensorPrimitive::Float(same::<
                AutodiffTensor<B::InnerBackend>,
                B::FloatTensorPrimitive,
            >(loss))),
            nll: Tensor::from_inner(nll),
            tokens,
        }
    }
}

/// The loss's node in burn's graph.
#[derive(Debug)]
struct LossBackward;

/// What the backward pass reads: the loss's parameters, its row statistics and the logits'
/// shape.
#[derive(Clone)]
struct Saved<I: Backend> {
    loss: LabelSmoothedCrossEntropy,
    rows: Rows<I>,
    shape: [usize; 3],
}

impl<I: Backend> fmt::Debug for Saved<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saved")
            .field("loss", &self.loss)
            .field("shape", &self.shape)
            .finish()
    }
}

impl<I: Backend> Backward<I, 1> for LossBackward {
    type State = Saved<I>;

    fn backward(self, ops: Ops<Saved<I>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        // ∂ℓ/∂L, `[1]`.
        let grad =
            Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let Some(node) = node else {
            return;
        };
        let Saved { loss, rows, shape } = ops.state;
        let gradient = loss.gradient(rows) * grad.reshape([1, 1]);
        grads.register::<I>(node.id, gradient.reshape(shape).into_primitive().tensor());
    }
}

/// `x` as type `U`; the caller has checked that `T` is `U` (a `TypeId` comparison).
fn same<T: 'static, U: 'static>(x: T) -> U {
    *(Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| panic!("xfmr-models: the loss's op called off `Autodiff<I>`"))
}
