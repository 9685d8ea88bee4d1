//! `xfmr generate`: text from a pretrained GGUF language model (SmolLM2), streamed to stdout
//! as it is produced, with prompt and generation speed on stderr; or, with `--run`, from the
//! GPT-like model of an `xfmr train --task lm` run ([`xfmr_train::inference::continue_text`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{DecoderOnly, DecoderOnlyConfig, GenerationOptions, SampleOptions, Strategy};
use xfmr_llm::quantized::CachePrecision;
use xfmr_llm::{LanguageModel, LmWeights, Message, WeightFormat};
use xfmr_train::inference::continue_text;
use xfmr_train::Task;

use crate::backend::{with_backend, BackendArg, BackendKind};
use crate::pretrained::gguf_path;
use crate::runs::load_run;

/// Options of `xfmr generate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArg,
    /// The run directory of `xfmr train --task lm`: its model continues the prompts instead
    /// of a GGUF model (--model, --chat and --min-tokens do not apply).
    #[arg(long, conflicts_with_all = ["model", "chat"])]
    pub run: Option<PathBuf>,
    /// `smollm2` (the file `xfmr fetch-model smollm2` puts in the cache) or a GGUF file's path.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Wrap each prompt in the model's chat template (SmolLM2's adds its default system
    /// message unless --system is given).
    #[arg(long)]
    pub chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// The most tokens generated per prompt (generation also stops at the end token).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// The end token is held off until this many tokens were generated (benchmarks).
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Sample among the k most probable tokens only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the most probable tokens whose probability reaches p (nucleus).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A string that ends the generation of a single prompt; the text stops before it and
    /// none of it is printed, even split over tokens (repeat for several).
    #[arg(long, conflicts_with = "run")]
    pub stop: Vec<String>,
    /// How the GGUF model's weights are held: `quantized` keeps the file's blocks and computes
    /// on the CPU (llama.cpp's scheme; the default on the CPU backends), `f32` dequantises them
    /// into xfmr's decoder-only model on the backend (the default on wgpu).
    #[arg(long, value_enum)]
    pub weights: Option<Weights>,
    /// What the quantised model's key/value cache keeps its elements in: `f16` (the default,
    /// as llama.cpp's: half the memory and the bytes attention reads) or `f32` (attention in
    /// `f32` throughout). burn's `f32` model (`--weights f32`) always caches `f32`.
    #[arg(long, value_enum, default_value = "f16")]
    pub cache_type: CacheType,
    /// Prompts. One is streamed; several run as one left-padded batch, printed when done.
    #[arg(required = true)]
    pub prompts: Vec<String>,
}

/// `--weights`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Weights {
    /// The file's quantised blocks, products on the CPU.
    Quantized,
    /// Dequantised to `f32` on the backend.
    F32,
}

/// `--cache-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheType {
    /// IEEE half precision.
    F16,
    /// Single precision.
    F32,
}

/// Runs `xfmr generate`.
pub fn run(args: Args) -> Result<()> {
    // Resolved once: `auto` probes the GPU drivers.
    let backend = args.backend.resolve();
    with_backend!(
        backend,
        "generate",
        wgpu = xfmr::backend::WgpuUnfused,
        |B| generate::<B>(&args, backend == BackendKind::Wgpu)
    )
}

fn options<B: Backend>(lm: &LanguageModel<B>, args: &Args) -> GenerationOptions {
    let options = lm.greedy(args.max_tokens).with_min_len(args.min_tokens);
    if args.temperature > 0.0 || args.top_k.is_some() || args.top_p.is_some() {
        options.with_strategy(Strategy::Sample(SampleOptions {
            temperature: if args.temperature > 0.0 {
                args.temperature
            } else {
                1.0
            },
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        }))
    } else {
        options
    }
}

/// Runs `xfmr generate` on backend `B`.
///
/// `gpu`: whether `B` is a GPU backend (`--weights` defaults to `f32` there).
fn generate<B: Backend>(args: &Args, gpu: bool) -> Result<()> {
    if let Some(run) = &args.run {
        return generate_from_run::<B>(run, args);
    }
    let path = gguf_path(&args.model)?;
    let device = B::Device::default();
    let start = std::time::Instant::now();
    let format = match args.weights {
        Some(Weights::Quantized) => WeightFormat::Quantized,
        Some(Weights::F32) => WeightFormat::F32,
        None if gpu => WeightFormat::F32,
        None => WeightFormat::Quantized,
    };
    let mut lm = LanguageModel::<B>::from_file_with(&path, &device, format)?;
    if let LmWeights::Quantized(q) = lm.model {
        lm.model = LmWeights::Quantized(q.with_cache_precision(match args.cache_type {
            CacheType::F16 => CachePrecision::F16,
            CacheType::F32 => CachePrecision::F32,
        }));
    }
    let c = &lm.config;
    let weights = match &lm.model {
        LmWeights::Quantized(m) => format!(
            "quantized weights ({} MB, on the CPU; {} MB of them interleaved for AVX-512 VNNI)",
            m.weight_bytes() / 1_000_000,
            m.interleaved_bytes() / 1_000_000
        ),
        LmWeights::F32(_) => "f32 weights".to_string(),
    };
    eprintln!(
        "{}: {} layers, d_model {}, {} heads sharing {} key/value heads, vocab {}, {weights}; \
         loaded in {:.1} s; key/value cache {} bytes per token",
        path.display(),
        c.n_layers,
        c.d_model,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        start.elapsed().as_secs_f64(),
        // The quantised model's cache in its precision (f16 by default), burn's in f32.
        c.cache_bytes_per_token(match &lm.model {
            LmWeights::Quantized(m) => m.cache_precision().bytes(),
            LmWeights::F32(_) => 4,
        }),
    );
    let prompts = args
        .prompts
        .iter()
        .map(|p| {
            if !args.chat {
                return Ok(p.clone());
            }
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", p));
            Ok(lm.chat_prompt(&messages)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let options = options(&lm, args);
    if let [prompt] = &prompts[..] {
        let mut stdout = std::io::stdout();
        let print = |text: &str| {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        };
        // Greedy or sampled: the one decoding loop `xfmr serve` runs too.
        let done = match lm.decode_request(&options)? {
            Some(request) => {
                lm.complete_request(prompt, request.with_stop(args.stop.clone()), print)?
            }
            None => lm.complete(prompt, &options, print)?,
        };
        println!();
        eprintln!(
            "prompt: {} tokens in {:.2} s ({:.1} tokens/s); generated: {} tokens, {:.1} tokens/s{}",
            done.prompt_tokens,
            done.prompt_time.as_secs_f64(),
            done.prompt_tokens_per_second(),
            done.tokens.len(),
            done.generation_tokens_per_second(),
            if done.stopped_at_eos {
                " (stopped at the end token or a stop string)"
            } else {
                ""
            },
        );
    } else {
        if !args.stop.is_empty() {
            anyhow::bail!(
                "--stop applies to a single prompt ({} given)",
                prompts.len()
            );
        }
        let start = std::time::Instant::now();
        let texts = lm.complete_batch(&prompts, &options)?;
        for (k, text) in texts.iter().enumerate() {
            println!("[{k}] {text}");
        }
        eprintln!(
            "{} prompts in one batch: {:.2} s",
            prompts.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `xfmr generate --run DIR`: the run's GPT-like model continues each prompt (greedy, or
/// sampled with `--temperature` above 0).
fn generate_from_run<B: Backend>(run: &Path, args: &Args) -> Result<()> {
    let (model, tokenizer): (DecoderOnly<B>, _) =
        load_run::<B, DecoderOnlyConfig>(run, Task::Lm, "generate --run")?;
    let strategy = if args.temperature > 0.0 {
        Strategy::Sample(SampleOptions {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        })
    } else {
        Strategy::Greedy
    };
    let prompts: Vec<&str> = args.prompts.iter().map(String::as_str).collect();
    let texts = continue_text(&model, &tokenizer, &prompts, strategy, args.max_tokens)?;
    for (prompt, text) in prompts.iter().zip(texts) {
        println!(
            "{prompt}{}{text}",
            if text.starts_with(' ') { "" } else { " " }
        );
    }
    Ok(())
}
