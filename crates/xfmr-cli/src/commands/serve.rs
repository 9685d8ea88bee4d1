//! `xfmr serve`: loads the models it is given and serves them over HTTP ([`xfmr_serve`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use xfmr::attention::MatmulPrecision;
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{Transformer, TransformerConfig};
use xfmr_llm::{LanguageModel, WeightFormat};
use xfmr_sentence::{fetch, SentenceEncoder};
use xfmr_serve::{ServeConfig, Server};
use xfmr_train::RunDir;

use crate::backend::{with_backend, BackendArg};
use crate::pretrained::{gguf_path, precision_for};

/// `xfmr serve`'s options.
#[derive(clap::Args)]
pub struct Args {
    // The encoder models' backend (the language model runs its quantised weights on the CPU).
    #[command(flatten)]
    backend: BackendArg,
    /// Address to listen on (loopback by default: pass 0.0.0.0 to serve other machines).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one, printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The language model: `smollm2` (fetched with `xfmr fetch-model smollm2`) or a GGUF
    /// file. Served under `smollm2` or the file's stem.
    #[arg(long)]
    llm: Option<String>,
    /// The sentence encoder: `minilm` (fetched with `xfmr fetch-model minilm`) or a model
    /// directory. Served under `minilm` or the directory's name.
    #[arg(long)]
    embeddings: Option<String>,
    /// What the sentence encoder's products may compute in: `f32`, or `bf16` (bf16 factors,
    /// f32 sums, on the flex backend of a CPU with AMX or AVX-512 BF16, for batches of at
    /// least 128 token rows: 2.1x the sentences/s with AMX on an Intel Xeon on 1,000
    /// sentences, embeddings within cosine 0.999 of f32; f32 elsewhere).
    #[arg(long, default_value = "f32")]
    embeddings_precision: MatmulPrecision,
    /// A translation run of `xfmr train`. Served under the directory's name; its beam search
    /// uses the length penalty chosen for the run (`decoding.json`), else the paper's 0.6.
    #[arg(long)]
    translation: Option<PathBuf>,
    /// Language-model requests decoded together.
    #[arg(long, default_value_t = ServeConfig::default().max_batch)]
    max_batch: usize,
    /// Requests that may wait beyond the batch (then 429).
    #[arg(long, default_value_t = ServeConfig::default().max_waiting)]
    max_waiting: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = ServeConfig::default().max_tokens)]
    max_tokens: usize,
    /// Seconds one request may take (504 after it).
    #[arg(long, default_value_t = ServeConfig::default().request_timeout.as_secs())]
    request_timeout: u64,
    /// Seconds a connection may stay silent.
    #[arg(long, default_value_t = ServeConfig::default().idle_timeout.as_secs())]
    idle_timeout: u64,
    /// MiB of earlier prompts' keys and values kept, so that a request beginning the same
    /// way (the chat template's system prompt, earlier turns) skips those tokens; 0: none.
    #[arg(long, default_value_t = ServeConfig::default().prefix_cache_bytes >> 20)]
    prefix_cache_mib: usize,
    /// A further `Host` the server answers to (repeatable), e.g. a name a reverse proxy
    /// forwards; bound to a loopback address, any other name gets a 403 (DNS rebinding).
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// A further browser origin whose pages may call the server (repeatable), e.g.
    /// `http://localhost:3000`, or `*` for any.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// No line per request on stderr (method, path, status, tokens, milliseconds).
    #[arg(long)]
    no_request_log: bool,
}

/// The name a model given by path is served under: the path's file stem.
fn served_name(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string()
}

/// Runs `xfmr serve`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(
        args.backend.resolve(),
        "serve",
        wgpu = xfmr::backend::WgpuUnfused,
        |B| serve::<B>(&args)
    )
}

/// Loads the models, starts the server and serves until killed.
fn serve<B: Backend>(args: &Args) -> Result<()> {
    if args.llm.is_none() && args.embeddings.is_none() && args.translation.is_none() {
        bail!(
            "nothing to serve: pass --llm smollm2|FILE.gguf, --embeddings minilm|DIR and/or \
             --translation RUN_DIR"
        );
    }
    // A translation run's beam search uses the length penalty chosen for it on its validation
    // split (`decoding.json`), else the paper's.
    let translation_length_penalty = match &args.translation {
        Some(run) => RunDir::new(run).length_penalty()?,
        None => ServeConfig::default().translation_length_penalty,
    };
    let config = ServeConfig {
        translation_length_penalty,
        max_batch: args.max_batch.max(1),
        max_waiting: args.max_waiting,
        max_tokens: args.max_tokens.max(1),
        request_timeout: Duration::from_secs(args.request_timeout.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        prefix_cache_bytes: args.prefix_cache_mib.saturating_mul(1 << 20),
        allowed_hosts: args.allowed_hosts.clone(),
        allowed_origins: args.allowed_origins.clone(),
        log_requests: !args.no_request_log,
        ..ServeConfig::default()
    };
    let device = Default::default();
    // A burst's memory goes back to the kernel once each thread is idle (issue 43).
    let mut server = Server::<B>::new(config).on_idle(xfmr_cli::alloc::release_memory);
    if let Some(llm) = &args.llm {
        let t = Instant::now();
        let path = gguf_path(llm)?;
        let name = if llm == "smollm2" {
            llm.clone()
        } else {
            served_name(&path)
        };
        // The library's error names the file.
        let lm = LanguageModel::<B>::from_file_with(&path, &device, WeightFormat::Quantized)?;
        eprintln!(
            "language model {name}: {} ({:.1} s)",
            path.display(),
            t.elapsed().as_secs_f64()
        );
        server = server.llm(&name, lm)?;
    }
    if let Some(embeddings) = &args.embeddings {
        let dir = match embeddings.as_str() {
            "minilm" => fetch::find_minilm().ok_or_else(|| {
                anyhow!("MiniLM is not in the cache: run `xfmr fetch-model minilm`")
            })?,
            dir => PathBuf::from(dir),
        };
        let name = match embeddings.as_str() {
            "minilm" => "minilm".to_string(),
            _ => served_name(&dir),
        };
        let mut encoder = SentenceEncoder::<B>::from_dir(&dir, &device)
            .with_context(|| dir.display().to_string())?;
        encoder.precision = precision_for::<B>(args.embeddings_precision, "--embeddings-precision");
        eprintln!("sentence encoder {name}: {}", dir.display());
        server = server.embeddings(&name, encoder)?;
    }
    if let Some(run) = &args.translation {
        let (model, tokenizer): (Transformer<B>, _) = RunDir::new(run)
            .load_model::<B, TransformerConfig>(&device)
            .with_context(|| format!("--translation {}", run.display()))?;
        let name = served_name(run);
        eprintln!("translation model {name}: {}", run.display());
        server = server.translation(&name, model, tokenizer)?;
    }
    // An IPv6 address goes in brackets before its port (`[::1]:8080`).
    let host = if args.host.contains(':') && !args.host.starts_with('[') {
        format!("[{}]", args.host)
    } else {
        args.host.clone()
    };
    let running = server.start(&format!("{host}:{}", args.port))?;
    println!(
        "xfmr serve: http://{}/ (OpenAI API under /v1)",
        running.addr()
    );
    running.wait();
    Ok(())
}
