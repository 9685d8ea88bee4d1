//! Kernel launches per training step on wgpu: how many compute kernels one training step of an
//! encoder-decoder built from xfmr's blocks launches on burn's fused `Wgpu` backend under
//! `Autodiff`, and which kernels they are (docs/benchmarks.md, "Kernel launches per training
//! step").
//!
//! **The step** is the translation model's (`xfmr_models::Transformer`, paper Figure 1) at toy
//! widths, assembled here from the blocks so that it depends on nothing above them: one
//! embedding table shared by source, target and output (×√d_model), sinusoidal positions,
//! dropout 0.1 on the embedding sums and every residual, 2 post-norm encoder layers over the
//! padded source, 2 decoder layers (causal self-attention, cross-attention over the memory), the
//! tied output projection, cross-entropy with label smoothing 0.1 over the non-padding targets
//! (burn's `CrossEntropyLoss`), the backward pass, and Adam (β = 0.9, 0.98) updating every
//! parameter; the loss is read back, as the trainer does. Every step has the same shapes.
//!
//! **How it counts.** cubecl 0.10 logs every kernel it launches when its profiling logger's
//! level is `minimal` ("Executing <kernel>", one line per launch, no timing and no added
//! synchronisation: `cubecl-runtime`'s `ComputeClient::launch_inner`). Its configuration is read
//! once, from a `cubecl.toml` in the working directory or above; this program writes one into a
//! fresh temporary directory and moves there before touching the device, so no file of the
//! repository is involved. After `warmup` steps (autotuning, and fusion's search for its
//! optimisations, happen then), each of `steps` steps runs between two `Backend::sync` calls;
//! the lines the logger wrote in between are that step's launches. The sync at the end of a
//! step runs the optimiser's update within it (without it, the next step's first read would
//! flush the same kernels).
//!
//! The model is tiny because lavapipe (Mesa's CPU Vulkan driver) is slow: the launches per
//! step depend on the layers and operations, hardly on the widths.
//!
//! ```text
//! cargo build --workspace --examples
//! target/debug/examples/launches [warmup] [steps] [top]
//! ```
//!
//! On a machine without a GPU: `apt-get install mesa-vulkan-drivers libvulkan1` (lavapipe) and
//! point `XDG_RUNTIME_DIR` at a writable directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Wgpu};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::Dropout;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    add_positions, Decoder, DecoderInput, Encoder, LayerConfig, PositionEncoding, Positions,
    SelfAttentionInput, StackConfig, TokenEmbedding, TokenEmbeddingConfig,
};

type B = Autodiff<Wgpu>;

/// Rows per batch, tokens per row (the last `PADDED` of every other row are padding).
const ROWS: usize = 8;
const LEN: usize = 13;
const PADDED: usize = 3;
const VOCAB: usize = 64;
const PAD: u32 = 0;

/// The translation model of `xfmr_models::Transformer`, from the blocks.
#[derive(Module, Debug)]
struct Seq2Seq<B: Backend> {
    /// Source, target and output table.
    embedding: TokenEmbedding<B>,
    positions: Option<Positions<B>>,
    dropout: Dropout,
    encoder: Encoder<B>,
    decoder: Decoder<B>,
}

impl<B: Backend> Seq2Seq<B> {
    fn new(layer: LayerConfig, layers: usize, device: &B::Device) -> Self {
        let d_model = layer.d_model;
        Self {
            embedding: TokenEmbeddingConfig::new(VOCAB, d_model)
                .init(device)
                .expect("a valid embedding"),
            positions: PositionEncoding::Sinusoidal
                .init_input(1024, d_model, device)
                .expect("valid positions"),
            dropout: layer.residual_dropout().expect("a valid dropout"),
            encoder: StackConfig::new(layer.clone(), layers)
                .init_encoder(device)
                .expect("a valid encoder"),
            decoder: StackConfig::new(layer, layers)
                .init_decoder(device)
                .expect("a valid decoder"),
        }
    }

    /// Embedding ×√d_model + positions, then dropout.
    fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = add_positions(self.positions.as_ref(), self.embedding.forward(ids), 0)
            .expect("positions within the table");
        xfmr_blocks::dropout(&self.dropout, x)
    }

    /// Teacher-forced logits `[batch, seq_tgt, vocab]`.
    fn forward(&self, src: Tensor<B, 2, Int>, tgt_in: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mask = AttnMask::padding_from_ids(src.clone(), PAD);
        let memory = self
            .encoder
            .forward(SelfAttentionInput::new(self.embed(src)).mask(mask.clone()));
        let h = self
            .decoder
            .forward(DecoderInput::new(self.embed(tgt_in), &memory).memory_mask(mask));
        self.embedding.logits(h)
    }
}

/// `[ROWS, LEN]` ids from `f(row, column)`, padded at the end of every other row.
fn batch(device: &WgpuDevice, f: impl Fn(usize, usize) -> u32) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = (0..ROWS * LEN)
        .map(|k| {
            let (row, col) = (k / LEN, k % LEN);
            if row % 2 == 1 && col >= LEN - PADDED {
                i64::from(PAD)
            } else {
                i64::from(f(row, col))
            }
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [ROWS, LEN]), device)
}

/// The launches logged so far: one "Executing <kernel>" line each.
fn launches(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("Executing "))
        .map(str::to_owned)
        .collect()
}

/// Waits for the device, then for cubecl's logger thread (which writes asynchronously) to have
/// written every launch: until the log stops growing.
fn settle(device: &WgpuDevice, log: &Path) -> usize {
    B::sync(device).expect("the device finishes its work");
    let mut seen = launches(log).len();
    let mut quiet = 0;
    while quiet < 3 {
        std::thread::sleep(Duration::from_millis(100));
        let now = launches(log).len();
        quiet = if now == seen { quiet + 1 } else { 0 };
        seen = now;
    }
    seen
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: launches [warmup] [steps] [top]"))
        .collect();
    let warmup = args.first().copied().unwrap_or(3);
    let steps = args.get(1).copied().unwrap_or(2).max(1);
    let top = args.get(2).copied().unwrap_or(30);

    // cubecl reads `cubecl.toml` from the working directory (or above) when a device starts.
    let dir = std::env::temp_dir().join(format!("xfmr-launches-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let log = dir.join("launches.log");
    std::fs::write(
        dir.join("cubecl.toml"),
        format!(
            "[profiling.logger]\nlevel = \"minimal\"\nappend = false\nfile = {:?}\n",
            log.display().to_string()
        ),
    )
    .expect("cubecl.toml written");
    std::env::set_current_dir(&dir).expect("into the temporary directory");

    // The paper's layer (post-norm LayerNorm, ReLU, dropout 0.1, sinusoids) at toy widths.
    let layer = LayerConfig::new(32, 4, 64);
    let layers = 2;
    let device = WgpuDevice::default();
    B::seed(&device, 7);
    let mut model = Seq2Seq::<B>::new(layer.clone(), layers, &device);
    let mut optim = AdamConfig::new()
        .with_beta_2(0.98)
        .with_epsilon(1e-9)
        .init();
    let loss_fn = CrossEntropyLossConfig::new()
        .with_pad_tokens(Some(vec![PAD as usize]))
        .with_smoothing(Some(0.1))
        .init(&device);
    let src = batch(&device, |row, col| {
        3 + ((row * 7 + col * 5) % (VOCAB - 3)) as u32
    });
    let tgt = batch(&device, |row, col| {
        3 + ((row * 3 + col * 11) % (VOCAB - 3)) as u32
    });
    // Teacher forcing: the decoder reads `[bos, y₀, …]` (bos = 1) and predicts `y`.
    let bos = Tensor::<B, 2, Int>::ones([ROWS, 1], &device);
    let tgt_in = Tensor::cat(vec![bos, tgt.clone().narrow(1, 0, LEN - 1)], 1);

    let mut step = |model: Seq2Seq<B>, i: usize| -> (Seq2Seq<B>, f64) {
        B::seed(&device, i as u64);
        let logits = model.forward(src.clone(), tgt_in.clone());
        let loss = loss_fn.forward(
            logits.reshape([ROWS * LEN, VOCAB]),
            tgt.clone().flatten(0, 1),
        );
        let value = loss.clone().into_scalar().elem::<f64>();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        (optim.step(1e-3, model, grads), value)
    };

    for i in 0..warmup {
        model = step(model, i).0;
    }
    let mut before = settle(&device, &log);
    let mut last = Vec::new();
    println!(
        "encoder-decoder from xfmr-blocks: {layers} + {layers} layers, d_model {}, {} heads, \
         d_ff {}; batch {ROWS} x {LEN} tokens; warm-up {warmup} steps",
        layer.d_model, layer.n_heads, layer.d_ff,
    );
    for i in warmup..warmup + steps {
        let loss;
        (model, loss) = step(model, i);
        let after = settle(&device, &log);
        last = launches(&log)[before..after].to_vec();
        println!(
            "step {}: {} launches (loss {loss:.4})",
            i + 1,
            after - before
        );
        before = after;
    }

    let mut by_kernel: BTreeMap<&str, usize> = BTreeMap::new();
    for name in &last {
        *by_kernel.entry(name.as_str()).or_default() += 1;
    }
    let mut ranked: Vec<(&str, usize)> = by_kernel.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    println!(
        "last step: {} launches of {} distinct kernels; top {top}:",
        last.len(),
        ranked.len()
    );
    for (name, count) in ranked.iter().take(top) {
        println!("{count:6}  {name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
