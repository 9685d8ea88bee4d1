//! Importing PyTorch `nn.Transformer` / `nn.TransformerEncoder` / `nn.TransformerDecoder` weights
//! from a safetensors state dict, by PyTorch's own tensor names.
//!
//! | PyTorch (under the stack's prefix) | xfmr |
//! |---|---|
//! | `layers.{i}.self_attn.{in_proj_weight, in_proj_bias, out_proj.*}` | `layers[i].self_attn` (split into Q, K, V; transposed) |
//! | `layers.{i}.multihead_attn.*` (decoder) | `layers[i].cross_attn` |
//! | `layers.{i}.linear1.*`, `layers.{i}.linear2.*` | `layers[i].ffn.linear1`, `.linear2` (transposed) |
//! | encoder `norm1`, `norm2` | `norm_attn`, `norm_ff` |
//! | decoder `norm1`, `norm2`, `norm3` | `norm_self`, `norm_cross`, `norm_ff` |
//! | `norm.{weight, bias}` | the stack's final `norm` |
//!
//! Norms map by the sublayer they belong to, whatever their placement (`norm_first`). Every
//! problem is collected and returned at once as a [`BlockError::Import`] listing missing,
//! unexpected and wrong-shape tensors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Element, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use xfmr_attention::{load_linear_torch, MultiHeadAttention, TorchMhaWeights};

use crate::{BlockError, Decoder, Encoder, FeedForward, ImportReport, Norm};

/// A PyTorch state dict held on the host: tensor name → shape and `f32` values (and the element
/// type the file stored).
#[derive(Debug, Clone, Default)]
pub struct StateDict {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    dtypes: BTreeMap<String, String>,
}

impl StateDict {
    /// Reads a safetensors file. See [`from_bytes`](Self::from_bytes) for the element types read.
    ///
    /// # Errors
    /// [`BlockError::Read`] naming the file and the problem; [`BlockError::UnsupportedDtype`].
    pub fn from_file(path: &Path) -> Result<Self, BlockError> {
        let bytes = std::fs::read(path)
            .map_err(|e| BlockError::Read(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            BlockError::Read(msg) => BlockError::Read(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parses safetensors bytes. Every tensor is held as `f32`:
    ///
    /// - F32 as is; F16 and BF16 exactly (every half value is an `f32` value); F64 rounded;
    /// - integer and boolean tensors (buffers such as BERT's `position_ids`, masks saved beside
    ///   the weights) as their values, exact up to 2²⁴ in magnitude; BOOL as 0 or 1.
    ///
    /// [`dtype`](Self::dtype) says what the file stored.
    ///
    /// # Errors
    /// [`BlockError::Read`] if the bytes are not safetensors; [`BlockError::UnsupportedDtype`]
    /// naming the first tensor of an 8-bit or smaller float type (FP8, MXF4, MXF6), which would
    /// need its block scales to mean anything.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, BlockError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| BlockError::Read(format!("{e:?}")))?;
        let mut dict = Self::default();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f32> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::F64 => data
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                    .collect(),
                Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
                Dtype::BOOL => data.iter().map(|&b| f32::from(u8::from(b != 0))).collect(),
                Dtype::U8 => data.iter().map(|&b| f32::from(b)).collect(),
                Dtype::I8 => data.iter().map(|&b| f32::from(b as i8)).collect(),
                Dtype::I16 => data
                    .chunks_exact(2)
                    .map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])))
                    .collect(),
                Dtype::U16 => data
                    .chunks_exact(2)
                    .map(|c| f32::from(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
                Dtype::I32 => data
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                    .collect(),
                Dtype::U32 => data
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                    .collect(),
                Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                    .collect(),
                Dtype::U64 => data
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                    .collect(),
                other => {
                    return Err(BlockError::UnsupportedDtype {
                        name,
                        dtype: format!("{other:?}"),
                    })
                }
            };
            dict.dtypes
                .insert(name.clone(), format!("{:?}", view.dtype()));
            dict.tensors.insert(name, (view.shape().to_vec(), values));
        }
        Ok(dict)
    }

    /// The element type a tensor had in the file it was read from, as safetensors names it
    /// (`"F16"`, `"I64"`, ...); `None` for an absent tensor or one added by [`insert`](Self::insert).
    pub fn dtype(&self, name: &str) -> Option<&str> {
        self.dtypes.get(name).map(String::as_str)
    }

    /// Adds or replaces a tensor (row-major values).
    ///
    /// # Panics
    /// If `values` does not fill `shape`.
    pub fn insert(&mut self, name: impl Into<String>, shape: Vec<usize>, values: Vec<f32>) {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "StateDict::insert: shape and values disagree"
        );
        let name = name.into();
        self.dtypes.remove(&name);
        self.tensors.insert(name, (shape, values));
    }

    /// Removes a tensor.
    pub fn remove(&mut self, name: &str) -> bool {
        self.dtypes.remove(name);
        self.tensors.remove(name).is_some()
    }

    /// A tensor's shape and row-major values.
    pub fn get(&self, name: &str) -> Option<(&[usize], &[f32])> {
        self.tensors
            .get(name)
            .map(|(shape, values)| (shape.as_slice(), values.as_slice()))
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

/// IEEE 754 half precision to `f32`, exactly (every f16 value is an f32 value).
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        // Subnormal: mantissa · 2^-24, exact in f32.
        (0, m) => {
            let value = m as f32 * 2f32.powi(-24);
            return if sign == 0 { value } else { -value };
        }
        (0x1f, 0) => 0xff << 23,
        (0x1f, m) => (0xff << 23) | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Takes tensors out of a [`StateDict`] by name into modules, recording every missing,
/// wrong-shape and (at [`finish`](Self::finish)) unexpected tensor, so that an import reports
/// all its problems at once. Used by the stacks' `load_torch` and by model importers
/// (e.g. `xfmr_models::hf`) that map other naming schemes onto the same blocks.
pub struct StateDictImporter<'a, B: Backend> {
    dict: &'a StateDict,
    used: BTreeSet<String>,
    report: ImportReport,
    device: B::Device,
}

impl<'a, B: Backend> StateDictImporter<'a, B> {
    /// Starts an import from `dict`; tensors are created on `device`.
    pub fn new(dict: &'a StateDict, device: B::Device) -> Self {
        Self {
            dict,
            used: BTreeSet::new(),
            report: ImportReport::default(),
            device,
        }
    }

    /// The tensor `name`, which must have `shape` (else recorded as missing or wrong-shape).
    pub fn take<const D: usize>(&mut self, name: &str, shape: [usize; D]) -> Option<Tensor<B, D>> {
        let Some((found, values)) = self.dict.tensors.get(name) else {
            self.report.missing.push((name.to_string(), shape.to_vec()));
            return None;
        };
        self.used.insert(name.to_string());
        if found.as_slice() != shape.as_slice() {
            self.report
                .wrong_shape
                .push((name.to_string(), shape.to_vec(), found.clone()));
            return None;
        }
        let dtype = <B::FloatElem as Element>::dtype();
        let data = TensorData::new(values.clone(), shape).convert_dtype(dtype);
        Some(Tensor::from_data(data, (&self.device, dtype)))
    }

    /// The tensor `name` into `param`, with the parameter's shape; the parameter stays
    /// trainable.
    pub fn param<const D: usize>(&mut self, param: &mut Param<Tensor<B, D>>, name: &str) {
        // `lazy_shape`: the shape without running the parameter's random initialisation,
        // which the imported tensor replaces (most of loading MiniLM went to sampling it).
        if let Some(t) = self.take(name, param.lazy_shape().dims::<D>()) {
            // `Param::initialized` inherits `require_grad` from the tensor.
            *param = Param::initialized(param.id, t.require_grad());
        }
    }

    /// Marks `name` as deliberately not imported (a buffer, a tied copy), so that
    /// [`finish`](Self::finish) does not report it as unexpected.
    pub fn ignore(&mut self, name: &str) {
        if self.dict.tensors.contains_key(name) {
            self.used.insert(name.to_string());
        }
    }

    /// Records a problem that is not about one tensor.
    pub fn report_other(&mut self, message: String) {
        self.report.other.push(message);
    }

    /// `{name}.weight` (`[out, in]`, transposed into burn's `[in, out]`) and `{name}.bias`
    /// into `linear`.
    pub fn linear(&mut self, linear: &mut Linear<B>, name: &str) {
        let [d_in, d_out] = linear.weight.lazy_shape().dims::<2>();
        let weight = self.take(&format!("{name}.weight"), [d_out, d_in]);
        let bias = match linear.bias.is_some() {
            true => self.take(&format!("{name}.bias"), [d_out]),
            false => None,
        };
        if let Some(weight) = weight {
            if linear.bias.is_some() && bias.is_none() {
                return;
            }
            if let Err(e) = load_linear_torch(linear, name, weight, bias, None) {
                self.report.other.push(e.to_string());
            }
        }
    }

    fn mha(&mut self, mha: MultiHeadAttention<B>, name: &str) -> MultiHeadAttention<B> {
        let rows = (mha.n_heads + 2 * mha.n_kv_heads) * mha.d_k;
        let d = mha.d_model;
        let in_w = self.take(&format!("{name}.in_proj_weight"), [rows, d]);
        let in_b = mha
            .query
            .bias
            .is_some()
            .then(|| self.take(&format!("{name}.in_proj_bias"), [rows]))
            .flatten();
        let out_w = self.take(&format!("{name}.out_proj.weight"), [d, d]);
        let out_b = mha
            .output
            .bias
            .is_some()
            .then(|| self.take(&format!("{name}.out_proj.bias"), [d]))
            .flatten();
        let complete = in_w.is_some()
            && out_w.is_some()
            && (mha.query.bias.is_none() || in_b.is_some())
            && (mha.output.bias.is_none() || out_b.is_some());
        if !complete {
            return mha;
        }
        let weights = TorchMhaWeights {
            in_proj_weight: in_w.expect("checked"),
            in_proj_bias: in_b,
            out_proj_weight: out_w.expect("checked"),
            out_proj_bias: out_b,
        };
        match mha.clone().load_torch(weights) {
            Ok(loaded) => loaded,
            Err(e) => {
                self.report.other.push(format!("{name}: {e}"));
                mha
            }
        }
    }

    /// `{name}.weight` and `{name}.bias` (LayerNorm only) into `norm`.
    pub fn norm(&mut self, norm: &mut Norm<B>, name: &str) {
        self.param(&mut norm.gamma, &format!("{name}.weight"));
        if let Some(beta) = norm.beta.as_mut() {
            self.param(beta, &format!("{name}.bias"));
        }
    }

    /// `{prefix}linear1`, `{prefix}linear2`: PyTorch's feed-forward (no SwiGLU counterpart).
    fn ffn(&mut self, ffn: &mut FeedForward<B>, prefix: &str) {
        self.linear(&mut ffn.linear1, &format!("{prefix}linear1"));
        self.linear(&mut ffn.linear2, &format!("{prefix}linear2"));
        if ffn.gate().is_some() {
            self.report.other.push(format!(
                "{prefix}: SwiGLU has no PyTorch nn.Transformer counterpart"
            ));
        }
    }

    /// Loads a stack's final `{prefix}norm` (if the stack has one), then [`finish`](Self::finish).
    fn finish_stack(mut self, norm: Option<&mut Norm<B>>, prefix: &str) -> Result<(), BlockError> {
        if let Some(norm) = norm {
            self.norm(norm, &format!("{prefix}norm"));
        }
        self.finish(prefix)
    }

    /// Names under `prefix` that nothing took become `unexpected`; errors if anything is off.
    /// Ends the import: names starting with `prefix` that nothing took are `unexpected`.
    ///
    /// # Errors
    /// [`BlockError::Import`] listing every problem, if there is any.
    pub fn finish(mut self, prefix: &str) -> Result<(), BlockError> {
        self.report.unexpected = self
            .dict
            .names()
            .filter(|n| n.starts_with(prefix) && !self.used.contains(*n))
            .map(str::to_string)
            .collect();
        if self.report.is_empty() {
            Ok(())
        } else {
            Err(BlockError::Import(self.report))
        }
    }
}

impl<B: Backend> Encoder<B> {
    /// Loads a PyTorch `nn.TransformerEncoder` (or the `encoder.` part of `nn.Transformer`) whose
    /// tensors are named `{prefix}layers.{i}.…` and `{prefix}norm.…` (e.g. `prefix = "encoder."`).
    ///
    /// # Errors
    /// [`BlockError::Import`] listing every missing, unexpected and wrong-shape tensor.
    pub fn load_torch(mut self, dict: &StateDict, prefix: &str) -> Result<Self, BlockError> {
        let device = self.layers[0].norm_ff.gamma.device();
        let mut imp = StateDictImporter::<B>::new(dict, device);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let p = format!("{prefix}layers.{i}.");
            layer.self_attn = imp.mha(layer.self_attn.clone(), &format!("{p}self_attn"));
            imp.ffn(&mut layer.ffn, &p);
            imp.norm(&mut layer.norm_attn, &format!("{p}norm1"));
            imp.norm(&mut layer.norm_ff, &format!("{p}norm2"));
        }
        imp.finish_stack(self.norm.as_mut(), prefix)?;
        Ok(self)
    }
}

impl<B: Backend> Decoder<B> {
    /// Loads a PyTorch `nn.TransformerDecoder` (or the `decoder.` part of `nn.Transformer`) whose
    /// tensors are named `{prefix}layers.{i}.…` and `{prefix}norm.…`.
    ///
    /// # Errors
    /// [`BlockError::Import`] listing every missing, unexpected and wrong-shape tensor.
    pub fn load_torch(mut self, dict: &StateDict, prefix: &str) -> Result<Self, BlockError> {
        let device = self.layers[0].norm_ff.gamma.device();
        let mut imp = StateDictImporter::<B>::new(dict, device);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let p = format!("{prefix}layers.{i}.");
            layer.self_attn = imp.mha(layer.self_attn.clone(), &format!("{p}self_attn"));
            layer.cross_attn = imp.mha(layer.cross_attn.clone(), &format!("{p}multihead_attn"));
            imp.ffn(&mut layer.ffn, &p);
            imp.norm(&mut layer.norm_self, &format!("{p}norm1"));
            imp.norm(&mut layer.norm_cross, &format!("{p}norm2"));
            imp.norm(&mut layer.norm_ff, &format!("{p}norm3"));
        }
        imp.finish_stack(self.norm.as_mut(), prefix)?;
        Ok(self)
    }
}
