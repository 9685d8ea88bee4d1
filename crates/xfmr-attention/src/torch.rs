//! Importing PyTorch weights.
//!
//! PyTorch's `nn.Linear` stores its weight as `[out_features, in_features]` and computes
//! `y = x Wᵀ + b`; burn's [`Linear`] stores `[d_input, d_output]` and computes `y = x W + b`, so
//! every weight is transposed on the way in. `nn.MultiheadAttention` stacks the query, key and
//! value projections in one `in_proj_weight` `[3·d_model, d_model]` (rows `0..d`, `d..2d`,
//! `2d..3d`) with one `in_proj_bias` `[3·d_model]`, and keeps `W^O` in `out_proj`.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::{AttentionError, MultiHeadAttention};

/// The tensors of a PyTorch `nn.MultiheadAttention` state dict, in PyTorch's layout.
///
/// With grouped key/value heads the stacked rows are `[q_dim + 2·kv_dim, d_model]` with
/// `q_dim = n_heads·d_k` and `kv_dim = n_kv_heads·d_k` (the layout of a fused QKV projection).
#[derive(Debug, Clone)]
pub struct TorchMhaWeights<B: Backend> {
    /// `in_proj_weight`: `[q_dim + 2·kv_dim, d_model]`.
    pub in_proj_weight: Tensor<B, 2>,
    /// `in_proj_bias`: `[q_dim + 2·kv_dim]`, absent when the module was built with `bias=False`.
    pub in_proj_bias: Option<Tensor<B, 1>>,
    /// `out_proj.weight`: `[d_model, d_model]`.
    pub out_proj_weight: Tensor<B, 2>,
    /// `out_proj.bias`: `[d_model]`.
    pub out_proj_bias: Option<Tensor<B, 1>>,
}

/// Builds a burn [`Linear`] from a PyTorch `nn.Linear` weight `[out, in]` and bias `[out]`.
///
/// # Errors
/// [`AttentionError::WeightShape`] if the bias length differs from `out`.
pub fn linear_from_torch<B: Backend>(
    name: &str,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Result<Linear<B>, AttentionError> {
    let [d_out, d_in] = weight.dims();
    let mut linear = Linear {
        weight: burn::module::Param::from_tensor(Tensor::zeros([d_in, d_out], &weight.device())),
        bias: None,
    };
    load_linear_torch(&mut linear, name, weight, bias, None)?;
    Ok(linear)
}

/// Loads a PyTorch `nn.Linear` weight `[out, in]` (and bias) into an existing burn [`Linear`],
/// checking shapes against the layer's `[in, out]` and its bias switch.
///
/// `expect_bias` of `None` accepts either; `Some(b)` requires the bias's presence to be `b`.
///
/// # Errors
/// [`AttentionError::WeightShape`] or [`AttentionError::BiasMismatch`] naming `name`.
pub fn load_linear_torch<B: Backend>(
    linear: &mut Linear<B>,
    name: &str,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    expect_bias: Option<bool>,
) -> Result<(), AttentionError> {
    // `lazy_shape`: no random initialisation of a weight this replaces.
    let [d_in, d_out] = linear.weight.lazy_shape().dims::<2>();
    if weight.dims() != [d_out, d_in] {
        return Err(AttentionError::WeightShape {
            name: format!("{name}.weight"),
            actual: weight.dims().to_vec(),
            expected: vec![d_out, d_in],
        });
    }
    if let Some(b) = &bias {
        if b.dims() != [d_out] {
            return Err(AttentionError::WeightShape {
                name: format!("{name}.bias"),
                actual: b.dims().to_vec(),
                expected: vec![d_out],
            });
        }
    }
    if let Some(expected) = expect_bias {
        if expected != bias.is_some() {
            return Err(AttentionError::BiasMismatch {
                name: name.to_string(),
                given: bias.is_some(),
            });
        }
    }
    set_linear(linear, weight.transpose(), bias);
    Ok(())
}

impl<B: Backend> MultiHeadAttention<B> {
    /// Loads the weights of a PyTorch `nn.MultiheadAttention` (batch_first or not: the weights
    /// are the same) into this layer, splitting `in_proj_weight` into `W^Q`, `W^K`, `W^V` and
    /// transposing every matrix to burn's layout.
    ///
    /// ```text
    /// let mha = MultiHeadAttentionConfig::new(d_model, n_heads).init(&device)?
    ///     .load_torch(TorchMhaWeights { in_proj_weight, in_proj_bias: Some(b), out_proj_weight,
    ///                                   out_proj_bias: Some(ob) })?;
    /// ```
    ///
    /// # Errors
    /// [`AttentionError::WeightShape`] naming the PyTorch tensor whose shape is off, or
    /// [`AttentionError::BiasMismatch`] if a bias is present where this layer has none (or the
    /// reverse).
    pub fn load_torch(mut self, weights: TorchMhaWeights<B>) -> Result<Self, AttentionError> {
        let q_dim = self.n_heads * self.d_k;
        let kv_dim = self.n_kv_heads * self.d_k;
        let rows = q_dim + 2 * kv_dim;
        if weights.in_proj_weight.dims() != [rows, self.d_model] {
            return Err(AttentionError::WeightShape {
                name: "in_proj_weight".into(),
                actual: weights.in_proj_weight.dims().to_vec(),
                expected: vec![rows, self.d_model],
            });
        }
        if let Some(b) = &weights.in_proj_bias {
            if b.dims() != [rows] {
                return Err(AttentionError::WeightShape {
                    name: "in_proj_bias".into(),
                    actual: b.dims().to_vec(),
                    expected: vec![rows],
                });
            }
        }
        let parts = [(0, q_dim), (q_dim, kv_dim), (q_dim + kv_dim, kv_dim)];
        let names = ["in_proj (query)", "in_proj (key)", "in_proj (value)"];
        for (i, linear) in [&mut self.query, &mut self.key, &mut self.value]
            .into_iter()
            .enumerate()
        {
            let (start, len) = parts[i];
            let w = weights.in_proj_weight.clone().narrow(0, start, len);
            let b = weights
                .in_proj_bias
                .clone()
                .map(|b| b.narrow(0, start, len));
            let configured_bias = linear.bias.is_some();
            load_linear_torch(linear, names[i], w, b, Some(configured_bias))?;
        }
        let expect_out_bias = self.output.bias.is_some();
        load_linear_torch(
            &mut self.output,
            "out_proj",
            weights.out_proj_weight,
            weights.out_proj_bias,
            Some(expect_out_bias),
        )?;
        Ok(self)
    }
}

/// Replaces a [`Linear`]'s parameters, keeping their ids. The new tensors are marked as
/// requiring gradients (`Param::initialized` inherits the flag from its tensor, and an imported
/// tensor has none): imported weights stay trainable under autodiff.
pub(crate) fn set_linear<B: Backend>(
    linear: &mut Linear<B>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) {
    linear.weight = Param::initialized(linear.weight.id, weight.require_grad());
    linear.bias = match (linear.bias.take(), bias) {
        (Some(old), Some(b)) => Some(Param::initialized(old.id, b.require_grad())),
        (None, Some(b)) => Some(Param::from_tensor(b)),
        (_, None) => None,
    };
}
