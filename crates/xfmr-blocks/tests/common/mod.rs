//! Shared by the test binaries (no tests here): building `nn.Transformer` stacks from the
//! `torch/transformer_*` fixtures (fixtures/README.md) and checking their gradients.
//! Dimensions, layer counts and options come from each fixture's metadata.

#![allow(dead_code)] // each binary uses part of it

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    Activation, Decoder, DecoderInput, Encoder, LayerConfig, NormPosition, SelfAttentionInput,
    StackConfig, StateDict,
};
use xfmr_testing::{fixtures_dir, Fixture};

pub const FIXTURES: [&str; 2] = ["transformer_postnorm_relu", "transformer_prenorm_gelu"];

/// Encoder and decoder stacks configured from the fixture metadata, with its weights.
pub fn stacks<B: Backend>(
    fx: &Fixture,
    name: &str,
    device: &B::Device,
) -> (Encoder<B>, Decoder<B>) {
    let config = fx.config();
    let activation = match config["activation"].as_str() {
        Some("relu") => Activation::Relu,
        Some("gelu") => Activation::Gelu,
        other => panic!("{name}: unsupported activation {other:?}"),
    };
    let norm_position = match config["norm_first"].as_bool() {
        Some(true) => NormPosition::Pre,
        Some(false) => NormPosition::Post,
        None => panic!("{name}: config has no boolean norm_first"),
    };
    let layer = LayerConfig::new(
        fx.config_usize("d_model"),
        fx.config_usize("n_heads"),
        fx.config_usize("d_ff"),
    )
    .with_dropout(0.0)
    .with_activation(activation)
    .with_norm_position(norm_position)
    .with_norm_eps(config["layer_norm_eps"].as_f64().expect("layer_norm_eps"));
    let dict =
        StateDict::from_file(&fixtures_dir().join(format!("torch/{name}.safetensors"))).unwrap();
    let encoder = StackConfig::new(layer.clone(), fx.config_usize("n_encoder_layers"))
        .with_final_norm(true)
        .init_encoder::<B>(device)
        .unwrap()
        .load_torch(&dict, "weights.encoder.")
        .unwrap();
    let decoder = StackConfig::new(layer, fx.config_usize("n_decoder_layers"))
        .with_final_norm(true)
        .init_decoder::<B>(device)
        .unwrap()
        .load_torch(&dict, "weights.decoder.")
        .unwrap();
    (encoder, decoder)
}

/// Runs encoder and decoder on the fixture's inputs and masks.
pub fn run<B: Backend>(
    fx: &Fixture,
    encoder: &Encoder<B>,
    decoder: &Decoder<B>,
    src: Tensor<B, 3>,
    tgt: Tensor<B, 3>,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let src_pad = AttnMask::from_key_padding(fx.bool("input.src_key_padding_mask", device));
    let tgt_pad = AttnMask::from_key_padding(fx.bool("input.tgt_key_padding_mask", device));
    // The decoder applies the causal mask itself: check it is the fixture's.
    let seq_tgt = tgt.dims()[1];
    let as_ints = |m: Tensor<B, 2, burn::tensor::Bool>| xfmr_testing::to_vec(&m.float());
    let ours = as_ints(
        AttnMask::<B>::causal(seq_tgt, seq_tgt, device)
            .into_tensor()
            .reshape([seq_tgt, seq_tgt]),
    );
    let theirs = as_ints(fx.bool::<B, 2>("input.tgt_mask", device));
    assert_eq!(
        ours, theirs,
        "the fixture's tgt_mask is not the causal mask"
    );
    let memory = encoder.forward(SelfAttentionInput::new(src).mask(src_pad.clone()));
    let out = decoder.forward(
        DecoderInput::new(tgt, &memory)
            .self_mask(tgt_pad)
            .memory_mask(src_pad),
    );
    (memory, out)
}

/// The gradient PyTorch names `grad.<param>`, taken from our parameters (split, transposed
/// and renamed back to PyTorch's layout).
pub fn param_grad<B: AutodiffBackend>(
    name: &str,
    encoder: &Encoder<B>,
    decoder: &Decoder<B>,
    grads: &B::Gradients,
) -> Vec<f64> {
    let path: Vec<&str> = name.trim_start_matches("grad.").split('.').collect();
    let g2 = |p: &burn::module::Param<Tensor<B, 2>>| {
        xfmr_testing::to_vec(
            &p.val()
                .grad(grads)
                .unwrap_or_else(|| panic!("{name}: no gradient"))
                .transpose(),
        )
    };
    let g1 = |p: &burn::module::Param<Tensor<B, 1>>| {
        xfmr_testing::to_vec(
            &p.val()
                .grad(grads)
                .unwrap_or_else(|| panic!("{name}: no gradient")),
        )
    };
    match path.as_slice() {
        [stack, "norm", which] => {
            let norm = match *stack {
                "encoder" => encoder.norm.as_ref(),
                _ => decoder.norm.as_ref(),
            }
            .expect("final norm");
            match *which {
                "weight" => g1(&norm.gamma),
                _ => g1(norm.beta.as_ref().unwrap()),
            }
        }
        [stack, "layers", i, sub @ ..] => {
            let i: usize = i.parse().unwrap();
            let (attn, ffn, norms) = if *stack == "encoder" {
                let l = &encoder.layers[i];
                (
                    [Some(&l.self_attn), None],
                    &l.ffn,
                    vec![&l.norm_attn, &l.norm_ff],
                )
            } else {
                let l = &decoder.layers[i];
                (
                    [Some(&l.self_attn), Some(&l.cross_attn)],
                    &l.ffn,
                    vec![&l.norm_self, &l.norm_cross, &l.norm_ff],
                )
            };
            match sub {
                [module @ ("self_attn" | "multihead_attn"), rest @ ..] => {
                    let mha = attn[usize::from(*module == "multihead_attn")].unwrap();
                    match rest {
                        ["in_proj_weight"] => [&mha.query, &mha.key, &mha.value]
                            .iter()
                            .flat_map(|l| g2(&l.weight))
                            .collect(),
                        ["in_proj_bias"] => [&mha.query, &mha.key, &mha.value]
                            .iter()
                            .flat_map(|l| g1(l.bias.as_ref().unwrap()))
                            .collect(),
                        ["out_proj", "weight"] => g2(&mha.output.weight),
                        ["out_proj", "bias"] => g1(mha.output.bias.as_ref().unwrap()),
                        _ => panic!("unknown gradient {name}"),
                    }
                }
                [linear @ ("linear1" | "linear2"), which] => {
                    let l = if *linear == "linear1" {
                        &ffn.linear1
                    } else {
                        &ffn.linear2
                    };
                    match *which {
                        "weight" => g2(&l.weight),
                        _ => g1(l.bias.as_ref().unwrap()),
                    }
                }
                [norm, which] if norm.starts_with("norm") => {
                    let n = norms[norm[4..].parse::<usize>().unwrap() - 1];
                    match *which {
                        "weight" => g1(&n.gamma),
                        _ => g1(n.beta.as_ref().unwrap()),
                    }
                }
                _ => panic!("unknown gradient {name}"),
            }
        }
        _ => panic!("unknown gradient {name}"),
    }
}

/// Gradients of `sum(decoder_output ⊙ r)` w.r.t. the inputs and every parameter the fixture
/// lists (whatever their names), compared with `tolerance(expected) = (atol, rtol)`.
pub fn check_gradients<B: AutodiffBackend>(
    tolerance: impl Fn(&xfmr_testing::HostTensor) -> (f64, f64),
) {
    let device = Default::default();
    for name in FIXTURES {
        let fx = Fixture::load(&format!("torch/{name}"));
        let (encoder, decoder) = stacks::<B>(&fx, name, &device);
        let src = fx.float::<B, 3>("input.src", &device).require_grad();
        let tgt = fx.float::<B, 3>("input.tgt", &device).require_grad();
        let (_, out) = run(&fx, &encoder, &decoder, src.clone(), tgt.clone(), &device);
        let grads = (out * fx.float::<B, 3>("loss.r", &device)).sum().backward();
        let mut checked = 0;
        for grad_name in fx.names().into_iter().filter(|n| n.starts_with("grad.")) {
            let expected = fx.host(grad_name);
            let actual = match grad_name {
                "grad.src" => xfmr_testing::to_vec(&src.grad(&grads).unwrap()),
                "grad.tgt" => xfmr_testing::to_vec(&tgt.grad(&grads).unwrap()),
                other => param_grad(other, &encoder, &decoder, &grads),
            };
            let (atol, rtol) = tolerance(expected);
            xfmr_testing::assert_close_slices(
                &actual,
                &expected.shape,
                &expected.values,
                &expected.shape,
                atol,
                rtol,
                &format!("{name}: {grad_name}"),
            );
            checked += 1;
        }
        assert!(checked >= 2, "{name}: no gradients in the fixture");
    }
}
