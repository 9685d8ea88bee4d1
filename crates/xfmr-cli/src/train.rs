//! `xfmr train`: the paper's main job, training the encoder-decoder on a parallel corpus (the
//! embedded Spanish→English set by default), alone or as one rank of a data-parallel run, then
//! averaging the last checkpoints and scoring the test split.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use xfmr::burn::module::AutodiffModule;
use xfmr::burn::tensor::backend::AutodiffBackend;
use xfmr::models::checkpoint::write_atomic;
use xfmr::models::TransformerConfig;
use xfmr_train::data::{self, Pair};
use xfmr_train::trainer::{self, evaluate_loss, Example};
use xfmr_train::translate::encode_pairs;
use xfmr_train::{SubwordTokenizer, TrainConfig, Trainer};

use crate::metrics::{Metrics, MetricsFormat};
use crate::parallel::{fail_fast, join_run, local_devices};
use crate::plot;
use crate::translation::{attention_maps, evaluate_and_show, io_err, tokenizer_path};

/// The embedded Spanish→English set (see `data/es-en/README.md`).
const EMBEDDED: [(&str, &str); 3] = [
    ("train.tsv", include_str!("../data/es-en/train.tsv")),
    ("valid.tsv", include_str!("../data/es-en/valid.tsv")),
    ("test.tsv", include_str!("../data/es-en/test.tsv")),
];

/// Model sizes `train` knows.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Preset {
    /// d_model 64, 4 heads, d_ff 128, 2 + 2 layers (tests).
    Tiny,
    /// d_model 128, 4 heads, d_ff 512, 3 + 3 layers: the 2-core CPU default.
    Cpu,
    /// d_model 256, 4 heads, d_ff 1024, 3 + 3 layers.
    Small,
    /// The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 + 6 layers.
    Base,
    /// The paper's big model: d_model 1024, 16 heads, d_ff 4096, 6 + 6 layers, dropout 0.3.
    Big,
}

impl Preset {
    fn model(self, vocab: usize) -> TransformerConfig {
        match self {
            Self::Tiny => TransformerConfig::tiny(vocab),
            Self::Cpu => TransformerConfig::new(
                vocab,
                vocab,
                xfmr::blocks::LayerConfig::new(128, 4, 512),
                3,
                3,
            ),
            Self::Small => TransformerConfig::small(vocab),
            Self::Base => TransformerConfig::base(vocab),
            Self::Big => TransformerConfig::big(vocab),
        }
    }
}

/// Options of `xfmr train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Directory holding `train.tsv`, `valid.tsv` and `test.tsv` (source TAB target); default:
    /// the embedded Spanish→English set.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run directory (tokenizer, checkpoints, metrics, pictures). A run already there is
    /// resumed from its last checkpoint.
    #[arg(long, default_value = "runs/es-en")]
    pub out: PathBuf,
    /// Model size.
    #[arg(long, value_enum, default_value_t = Preset::Cpu)]
    pub preset: Preset,
    /// A training configuration (JSON, as the run's `train-config.json`) instead of the preset
    /// and the flags below; its vocabulary size is set from the tokenizer.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// BPE vocabulary size (shared by source and target).
    #[arg(long, default_value_t = 4000)]
    pub vocab_size: usize,
    /// Optimizer steps (on resume: the new total).
    #[arg(long, default_value_t = 300)]
    pub steps: usize,
    /// Padded tokens per micro-batch.
    #[arg(long, default_value_t = 2000)]
    pub max_tokens: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Warm-up steps (paper: 4000 over 100k steps).
    #[arg(long, default_value_t = 150)]
    pub warmup: usize,
    /// Multiplier of the warm-up / inverse-square-root schedule (paper: 1, with warm-up 4000
    /// and d_model 512). The default 0.3 peaks at 2.2e-3 with d_model 128 and warm-up 150;
    /// factor 1 (7.2e-3) diverged at the peak on the default run (docs/training.md).
    #[arg(long, default_value_t = 0.3)]
    pub lr_factor: f64,
    /// Dropout (paper: 0.1).
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Seed of initialisation, batch order and dropout.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: usize,
    /// Steps between validation losses.
    #[arg(long, default_value_t = 50)]
    pub eval_every: usize,
    /// Checkpoints averaged into the final model (paper: 5).
    #[arg(long, default_value_t = 5)]
    pub average: usize,
    /// Pairs longer than this many subword tokens on either side are left out of training.
    #[arg(long, default_value_t = 100)]
    pub max_len: usize,
    /// Test sentences translated at the end (0: skip the test evaluation).
    #[arg(long, default_value_t = 100)]
    pub test_sentences: usize,
    /// Beam size of the test evaluation's beam search (paper: 4).
    #[arg(long, default_value_t = 4)]
    pub beam: usize,
    /// Metrics file format.
    #[arg(long, value_enum, default_value_t = MetricsFormat::Jsonl)]
    pub metrics: MetricsFormat,
    /// Processes in a data-parallel run, one per machine or per process slot
    /// (docs/distributed.md); 1 trains alone.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// This process's rank in `0..nodes`. Rank 0 hosts the coordinator and alone writes
    /// checkpoints, metrics, pictures and the final model; the others read `--out` only to
    /// resume from its last checkpoint.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// The coordinator as every rank reaches it, `host:port` (rank 0 listens on the port).
    #[arg(long, default_value = "127.0.0.1:29500")]
    pub coordinator: String,
    /// This process's host name or address as the other ranks reach it.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port this rank serves its gradients on (default: 29501 + rank).
    #[arg(long)]
    pub data_port: Option<u16>,
    /// Seconds a rank waits for the others in a collective operation before it fails, naming
    /// the ranks it waited for.
    #[arg(long, default_value_t = 600)]
    pub peer_timeout: u64,
    /// Model replicas in this process, one per device (the GPUs of one machine), each on its
    /// own thread with its share of every batch (docs/distributed.md). Devices `0..N` of the
    /// backend's default kind, else of its discrete GPUs; a backend with fewer (the CPU
    /// backends have one) puts every replica on its default device: no faster, for testing.
    #[arg(long, default_value_t = 1)]
    pub devices: u32,
}

/// Reads a split from `--data` or the embedded set.
fn split(data: Option<&Path>, name: &str) -> Result<Vec<Pair>, String> {
    match data {
        Some(dir) => data::read_tsv(&dir.join(name)).map_err(|e| e.to_string()),
        None => {
            let text = EMBEDDED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| *t)
                .unwrap_or_default();
            data::parse_tsv(text.as_bytes(), &Path::new("<embedded es-en>").join(name))
                .map_err(|e| e.to_string())
        }
    }
}

/// `xfmr train`.
pub fn train<B: AutodiffBackend>(args: &TrainArgs) -> Result<(), String> {
    let device = B::Device::default();
    let started = Instant::now();
    let data_dir = args.data.as_deref();
    let (train_pairs, valid_pairs, test_pairs) = (
        split(data_dir, "train.tsv")?,
        split(data_dir, "valid.tsv")?,
        split(data_dir, "test.tsv")?,
    );
    // In a data-parallel run only rank 0 writes into the run directory.
    let leader = args.rank == 0;
    if leader {
        fs::create_dir_all(&args.out).map_err(io_err(&args.out))?;
    }
    let tok_path = tokenizer_path(&args.out);
    let tokenizer = if tok_path.exists() {
        SubwordTokenizer::load(&tok_path).map_err(|e| e.to_string())?
    } else {
        eprintln!(
            "learning a {}-token BPE vocabulary on {} training pairs",
            args.vocab_size,
            train_pairs.len()
        );
        let sentences = train_pairs
            .iter()
            .flat_map(|p| [p.src.as_str(), p.tgt.as_str()]);
        let tokenizer =
            SubwordTokenizer::train(sentences, args.vocab_size).map_err(|e| e.to_string())?;
        if leader {
            tokenizer.save(&tok_path).map_err(|e| e.to_string())?;
        }
        tokenizer
    };
    let vocab = tokenizer.vocab_size();
    let encode = |pairs: &[Pair]| encode_pairs(&tokenizer, pairs).map_err(|e| e.to_string());
    let examples: Vec<Example> = encode(&train_pairs)?
        .into_iter()
        .filter(|e| e.src.len() <= args.max_len && e.tgt.len() <= args.max_len)
        .collect();
    let valid = encode(&valid_pairs)?;

    let latest = trainer::latest_checkpoint(&args.out).map_err(|e| e.to_string())?;
    // One trainer per replica, made one after another: each draws its initial weights from the
    // backend's generator after seeding it, and concurrent draws would interleave.
    let devices = local_devices::<B>(args.devices)?;
    let mut trainers = Vec::with_capacity(devices.len());
    for (index, device) in devices.iter().enumerate() {
        let first = index == 0;
        let examples = examples.clone();
        trainers.push(open_trainer::<B>(
            args,
            latest.as_deref(),
            examples,
            vocab,
            device,
            first,
        )?);
    }
    let config = trainers[0].config().clone();
    let total = if args.config.is_some() && latest.is_none() {
        config.steps
    } else {
        args.steps
    };
    let start_step = trainers[0].progress().step;
    let mut metrics = match leader {
        true => Some(Metrics::open(&args.out, args.metrics, start_step)?),
        false => None,
    };
    eprintln!(
        "{} training pairs ({} micro-batches per epoch), {} validation, vocabulary {vocab}, \
         model d_model {} × {}+{} layers, steps {start_step}→{total}",
        trainers[0].num_examples(),
        trainers[0].batches_per_epoch(),
        valid.len(),
        config.model.layer.d_model,
        config.model.n_encoder_layers,
        config.model.n_decoder_layers,
    );

    let bar = ProgressBar::new(total as u64).with_position(start_step as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}  ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let vocabulary = tokenizer.fingerprint();
    let data_parallel = args.nodes > 1 || args.devices > 1;
    let several = trainers.len() > 1;
    // Each replica on its own thread: the first one here (with the progress bar and, on node 0,
    // the metrics), the others spawned. A replica that fails while the others may be waiting
    // for it in a collective operation ends the process at once, rather than after they time
    // out; what it leaves on disk is complete (checkpoints are written atomically).
    thread::scope(|scope| {
        let mut replicas = trainers.into_iter().zip(&devices).enumerate();
        let (_, (first, first_device)) = replicas.next().expect("at least one replica");
        let valid = &valid;
        let others: Vec<_> = replicas
            .map(|(index, (trainer, device))| {
                scope.spawn(move || {
                    let join = Some((index as u32, vocabulary, device));
                    let hidden = ProgressBar::hidden();
                    run_replica(trainer, args, join, total, valid, None, &hidden)
                        .map_err(fail_fast::<String>)
                })
            })
            .collect();
        let join = data_parallel.then_some((0, vocabulary, first_device));
        match run_replica(first, args, join, total, valid, metrics.as_mut(), &bar) {
            Err(e) if several => fail_fast(e),
            result => result,
        }?;
        for other in others {
            other
                .join()
                .map_err(|_| "a replica's thread panicked".to_string())??;
        }
        Ok::<(), String>(())
    })?;
    bar.finish();
    let Some(metrics) = metrics else {
        eprintln!(
            "rank {}: {total} steps done; rank 0 writes the run to {}",
            args.rank,
            args.out.display()
        );
        return Ok(());
    };

    let (train_curve, valid_curve) = metrics.curves()?;
    let curve = args.out.join("loss-curve.png");
    plot::loss_curve(
        &curve,
        "xfmr train: loss per step",
        &train_curve,
        &valid_curve,
    )?;
    eprintln!("loss curve: {}", curve.display());

    // The final model: the average of the last checkpoints (paper §6.1).
    let dirs: Vec<PathBuf> = trainer::checkpoints(&args.out)
        .map_err(|e| e.to_string())?
        .into_iter()
        .rev()
        .take(args.average.max(1))
        .map(|(_, d)| d)
        .collect();
    let (model_config, model) = trainer::average_checkpoints::<B::InnerBackend>(&dirs, &device)
        .map_err(|e| e.to_string())?;
    let final_dir = args.out.join("model");
    trainer::save_model(&model, &model_config, &final_dir).map_err(|e| e.to_string())?;
    eprintln!(
        "final model: the average of {} checkpoint(s) → {}",
        dirs.len(),
        final_dir.display()
    );

    if args.test_sentences > 0 {
        let test: Vec<Pair> = test_pairs.into_iter().take(args.test_sentences).collect();
        evaluate_and_show(&model, &tokenizer, &test, args.beam, &args.out)?;
        if let Some(sample) = test.iter().find(|p| p.src.split_whitespace().count() <= 10) {
            let dir = args.out.join("attention");
            let files = attention_maps(&model, &tokenizer, &sample.src, &dir)?;
            eprintln!(
                "attention maps ({files} PNGs) of \"{}\": {}",
                sample.src,
                dir.display()
            );
        }
    }
    eprintln!("done in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// The trainer of one replica on `device`: resumed from checkpoint `latest`, or new (from
/// `--config` or the preset). `first`: the process's first replica, which reports what it
/// does and, on node 0, writes the run's configuration.
fn open_trainer<B: AutodiffBackend>(
    args: &TrainArgs,
    latest: Option<&Path>,
    examples: Vec<Example>,
    vocab: usize,
    device: &B::Device,
    first: bool,
) -> Result<Trainer<B>, String> {
    if let Some(dir) = latest {
        let t = Trainer::<B>::resume(dir, examples, device).map_err(|e| e.to_string())?;
        if first {
            eprintln!(
                "resuming {} from step {} ({})",
                args.out.display(),
                t.progress().step,
                dir.display()
            );
        }
        return Ok(t);
    }
    let config = match &args.config {
        Some(path) => {
            let text = fs::read_to_string(path).map_err(io_err(path))?;
            let mut config: TrainConfig =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            config.model.src_vocab_size = vocab;
            config.model.tgt_vocab_size = vocab;
            config
        }
        None => TrainConfig::new(
            args.preset
                .model(vocab)
                .map_layer(|l| l.with_dropout(args.dropout)),
        )
        .with_steps(args.steps)
        .with_max_tokens(args.max_tokens)
        .with_accumulate(args.accumulate)
        .with_warmup(args.warmup)
        .with_lr_factor(args.lr_factor)
        .with_seed(args.seed)
        .with_checkpoint_every(args.checkpoint_every)
        .with_keep_checkpoints(args.average.max(1)),
    };
    if first && args.rank == 0 {
        let json = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
        write_atomic(&args.out.join("train-config.json"), &json).map_err(|e| e.to_string())?;
    }
    Trainer::<B>::new(config, examples, device).map_err(|e| e.to_string())
}

/// Trains one replica up to step `total` ([`train_steps`]) and leaves the data-parallel run.
/// `join`: the replica's index in this process, the vocabulary's fingerprint and its device,
/// when it is part of a data-parallel run ([`join_run`]); `None` trains alone.
fn run_replica<B: AutodiffBackend>(
    trainer: Trainer<B>,
    args: &TrainArgs,
    join: Option<(u32, u64, &B::Device)>,
    total: usize,
    valid: &[Example],
    metrics: Option<&mut Metrics>,
    bar: &ProgressBar,
) -> Result<(), String> {
    let mut trainer = match join {
        Some((index, vocabulary, device)) => {
            join_run::<B>(trainer, args, index, vocabulary, device)?
        }
        None => trainer,
    };
    train_steps(&mut trainer, args, total, valid, metrics, bar)?;
    trainer.finish().map_err(|e| e.to_string())
}

/// Trains `trainer` up to step `total`: the progress bar, the data-parallel fingerprint check
/// at every checkpoint, and with `metrics` (the leader) the metrics, the validation loss and
/// the checkpoints.
fn train_steps<B: AutodiffBackend>(
    trainer: &mut Trainer<B>,
    args: &TrainArgs,
    total: usize,
    valid: &[Example],
    mut metrics: Option<&mut Metrics>,
    bar: &ProgressBar,
) -> Result<(), String> {
    let config = trainer.config().clone();
    let train_start = Instant::now();
    let mut window = (Instant::now(), 0usize);
    while trainer.progress().step < total {
        let report = trainer.step().map_err(|e| e.to_string())?;
        window.1 += report.src_tokens + report.tgt_tokens;
        let seconds = window.0.elapsed().as_secs_f64().max(1e-9);
        let rate = window.1 as f64 / seconds;
        if seconds > 10.0 {
            window = (Instant::now(), 0);
        }
        bar.set_message(format!(
            "loss {:.3}  {:.0} tok/s  lr {:.2e}  epoch {}",
            report.loss, rate, report.lr, report.epoch
        ));
        bar.set_position(report.step as u64);
        let step = report.step;
        let checkpoint = step % config.checkpoint_every == 0 || step == total;
        if let Some(run) = trainer.data_parallel().filter(|_| checkpoint) {
            let fingerprint = trainer::parameter_fingerprint(trainer.model());
            // Not `bar.println`: a hidden bar (no terminal) prints nothing.
            bar.suspend(|| {
                eprintln!(
                    "rank {} device {}: parameters at step {step}: fingerprint {fingerprint:016x}",
                    run.rank(),
                    run.device_index()
                )
            });
            run.agree(fingerprint, &format!("the parameters at step {step}"))
                .map_err(|e| e.to_string())?;
        }
        let Some(metrics) = metrics.as_deref_mut() else {
            continue;
        };
        metrics.write(json!({
            "kind": "train", "step": report.step, "epoch": report.epoch, "loss": report.loss,
            "nll": report.nll, "lr": report.lr, "tokens": report.src_tokens + report.tgt_tokens,
            "tokens_per_s": rate.round(), "elapsed_s": train_start.elapsed().as_secs_f64(),
        }))?;
        if step % args.eval_every == 0 || step == total {
            let eval = evaluate_loss(&trainer.model().valid(), &config, valid)
                .map_err(|e| e.to_string())?;
            metrics.write(json!({
                "kind": "valid", "step": step, "epoch": report.epoch, "loss": eval.loss,
                "nll": eval.nll, "perplexity": eval.perplexity(),
                "elapsed_s": train_start.elapsed().as_secs_f64(),
            }))?;
            bar.suspend(|| {
                eprintln!(
                    "step {step}: validation loss {:.3}, perplexity {:.1}",
                    eval.loss,
                    eval.perplexity()
                )
            });
        }
        if checkpoint {
            trainer
                .save_checkpoint(&args.out)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
