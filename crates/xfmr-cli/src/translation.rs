//! The paper's main job from the command line: `train`, `translate`, `eval`, `attention`, and
//! `prepare-data` (which rebuilds the embedded Spanish→English set).

use std::fs::{self, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use xfmr::burn::module::AutodiffModule;
use xfmr::burn::tensor::backend::{AutodiffBackend, Backend};
use xfmr::burn::tensor::{Int, Tensor, TensorData};
use xfmr::models::checkpoint::write_atomic;
use xfmr::models::{BeamOptions, GenerationOptions, Strategy, Transformer, TransformerConfig};
use xfmr_train::data::{self, Pair};
use xfmr_train::trainer::{self, evaluate_loss, Example};
use xfmr_train::translate::{encode_pairs, score, translate};
use xfmr_train::{SubwordTokenizer, TrainConfig, Trainer};

use crate::plot;

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

/// Metrics file format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum MetricsFormat {
    /// One JSON object per line (`metrics.jsonl`).
    Jsonl,
    /// Comma-separated values with a header (`metrics.csv`).
    Csv,
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

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

fn tokenizer_path(run: &Path) -> PathBuf {
    run.join("tokenizer.json")
}

fn metrics_path(run: &Path, format: MetricsFormat) -> PathBuf {
    run.join(match format {
        MetricsFormat::Jsonl => "metrics.jsonl",
        MetricsFormat::Csv => "metrics.csv",
    })
}

const CSV_COLUMNS: [&str; 10] = [
    "kind",
    "step",
    "epoch",
    "loss",
    "nll",
    "lr",
    "tokens",
    "tokens_per_s",
    "elapsed_s",
    "perplexity",
];

/// (step, loss) points.
type Curve = Vec<(f64, f64)>;

/// An append-only metrics log. Each record is one `write` of one line, flushed; on resume the
/// records after the checkpoint (and a torn last line, if the process died mid-write) are
/// dropped by rewriting the file atomically.
struct Metrics {
    path: PathBuf,
    format: MetricsFormat,
    file: fs::File,
}

impl Metrics {
    fn open(run: &Path, format: MetricsFormat, keep_through: usize) -> Result<Self, String> {
        let path = metrics_path(run, format);
        let mut kept = Vec::new();
        if let Ok(file) = fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(io_err(&path))?;
                if let Some((_, step, _)) = Self::parse(&line, format) {
                    if step <= keep_through {
                        kept.push(line);
                    }
                }
            }
        }
        let mut text = String::new();
        if format == MetricsFormat::Csv {
            text += &CSV_COLUMNS.join(",");
            text.push('\n');
        }
        for line in kept {
            text += &line;
            text.push('\n');
        }
        write_atomic(&path, text.as_bytes()).map_err(|e| e.to_string())?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(Self { path, format, file })
    }

    /// (kind, step, loss) of one record; `None` for the CSV header or a torn line.
    fn parse(line: &str, format: MetricsFormat) -> Option<(String, usize, Option<f64>)> {
        match format {
            MetricsFormat::Jsonl => {
                let v = serde_json::from_str::<Value>(line).ok()?;
                let kind = v["kind"].as_str().unwrap_or_default().to_string();
                Some((kind, v["step"].as_u64()? as usize, v["loss"].as_f64()))
            }
            MetricsFormat::Csv => {
                let cells: Vec<&str> = line.split(',').collect();
                if cells.len() != CSV_COLUMNS.len() {
                    return None;
                }
                let step = cells[1].parse().ok()?;
                Some((cells[0].to_string(), step, cells[3].parse().ok()))
            }
        }
    }

    fn write(&mut self, record: Value) -> Result<(), String> {
        let line = match self.format {
            MetricsFormat::Jsonl => record.to_string(),
            MetricsFormat::Csv => CSV_COLUMNS
                .iter()
                .map(|c| match &record[*c] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        self.file
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(io_err(&self.path))
    }

    /// (step, loss) of the training and validation records in the file.
    fn curves(&self) -> Result<(Curve, Curve), String> {
        let text = fs::read_to_string(&self.path).map_err(io_err(&self.path))?;
        let (mut train, mut valid) = (Vec::new(), Vec::new());
        for line in text.lines() {
            if let Some((kind, step, Some(loss))) = Self::parse(line, self.format) {
                match kind.as_str() {
                    "train" => train.push((step as f64, loss)),
                    "valid" => valid.push((step as f64, loss)),
                    _ => {}
                }
            }
        }
        Ok((train, valid))
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
    fs::create_dir_all(&args.out).map_err(io_err(&args.out))?;
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
        tokenizer.save(&tok_path).map_err(|e| e.to_string())?;
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
    let mut trainer = match &latest {
        Some(dir) => {
            let t = Trainer::<B>::resume(dir, examples, &device).map_err(|e| e.to_string())?;
            eprintln!(
                "resuming {} from step {} ({})",
                args.out.display(),
                t.progress().step,
                dir.display()
            );
            t
        }
        None => {
            let config = match &args.config {
                Some(path) => {
                    let text = fs::read_to_string(path).map_err(io_err(path))?;
                    let mut config: TrainConfig = serde_json::from_str(&text)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
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
            let json = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
            write_atomic(&args.out.join("train-config.json"), &json).map_err(|e| e.to_string())?;
            Trainer::<B>::new(config, examples, &device).map_err(|e| e.to_string())?
        }
    };
    let config = trainer.config().clone();
    let total = if args.config.is_some() && latest.is_none() {
        config.steps
    } else {
        args.steps
    };
    let start_step = trainer.progress().step;
    let mut metrics = Metrics::open(&args.out, args.metrics, start_step)?;
    eprintln!(
        "{} training pairs ({} micro-batches per epoch), {} validation, vocabulary {vocab}, \
         model d_model {} × {}+{} layers, steps {start_step}→{total}",
        trainer.num_examples(),
        trainer.batches_per_epoch(),
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
        metrics.write(json!({
            "kind": "train", "step": report.step, "epoch": report.epoch, "loss": report.loss,
            "nll": report.nll, "lr": report.lr, "tokens": report.src_tokens + report.tgt_tokens,
            "tokens_per_s": rate.round(), "elapsed_s": train_start.elapsed().as_secs_f64(),
        }))?;
        let step = report.step;
        if step % args.eval_every == 0 || step == total {
            let eval = evaluate_loss(&trainer.model().valid(), &config, &valid)
                .map_err(|e| e.to_string())?;
            metrics.write(json!({
                "kind": "valid", "step": step, "epoch": report.epoch, "loss": eval.loss,
                "nll": eval.nll, "perplexity": eval.perplexity(),
                "elapsed_s": train_start.elapsed().as_secs_f64(),
            }))?;
            bar.println(format!(
                "step {step}: validation loss {:.3}, perplexity {:.1}",
                eval.loss,
                eval.perplexity()
            ));
        }
        if step % config.checkpoint_every == 0 || step == total {
            trainer
                .save_checkpoint(&args.out)
                .map_err(|e| e.to_string())?;
        }
    }
    bar.finish();

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

/// Greedy and beam BLEU/chrF on `test`, hypotheses written under `out`, a few samples printed.
fn evaluate_and_show<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
    beam: usize,
    out: &Path,
) -> Result<(), String> {
    let sources: Vec<&str> = test.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = test.iter().map(|p| p.tgt.clone()).collect();
    let mut results = serde_json::Map::new();
    let mut outputs = Vec::new();
    for (name, strategy) in [
        ("greedy", Strategy::Greedy),
        (
            "beam",
            Strategy::Beam(BeamOptions {
                beam_size: beam.max(1),
                ..BeamOptions::default()
            }),
        ),
    ] {
        let t = Instant::now();
        let hyps = translate_texts(model, tokenizer, &sources, strategy)?;
        let scores = score(&hyps, &refs).map_err(|e| e.to_string())?;
        let seconds = t.elapsed().as_secs_f64();
        println!(
            "test ({} sentences, {name}): BLEU {:.2}  chrF {:.2}  ({:.1} s)",
            test.len(),
            scores.bleu.score,
            scores.chrf,
            seconds
        );
        let path = out.join(format!("test.{name}.txt"));
        write_atomic(&path, (hyps.join("\n") + "\n").as_bytes()).map_err(|e| e.to_string())?;
        results.insert(
            name.into(),
            json!({"bleu": scores.bleu.score, "chrf": scores.chrf, "sentences": test.len(),
                   "bleu_detail": format!("{:?}", scores.bleu), "seconds": seconds}),
        );
        outputs.push(hyps);
    }
    let json = serde_json::to_vec_pretty(&Value::Object(results)).map_err(|e| e.to_string())?;
    write_atomic(&out.join("results.json"), &json).map_err(|e| e.to_string())?;
    for i in 0..test.len().min(5) {
        println!("\nsource:    {}", test[i].src);
        println!("reference: {}", test[i].tgt);
        println!("greedy:    {}", outputs[0][i]);
        println!("beam:      {}", outputs[1][i]);
    }
    Ok(())
}

/// Greedy for `beam ≤ 1`, else beam search (α = 0.6) returning `n_best` hypotheses.
fn strategy(beam: usize, n_best: usize) -> Strategy {
    if beam > 1 {
        Strategy::Beam(BeamOptions {
            beam_size: beam,
            n_best: n_best.clamp(1, beam),
            ..BeamOptions::default()
        })
    } else {
        Strategy::Greedy
    }
}

fn options(strategy: Strategy, tokenizer: &SubwordTokenizer, max_len: usize) -> GenerationOptions {
    GenerationOptions::greedy(
        max_len,
        tokenizer.eos_id() as u32,
        tokenizer.pad_id() as u32,
    )
    .with_strategy(strategy)
}

fn translate_texts<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sources: &[&str],
    strategy: Strategy,
) -> Result<Vec<String>, String> {
    let out = translate(
        model,
        tokenizer,
        sources,
        &options(strategy, tokenizer, 128),
        32,
    )
    .map_err(|e| e.to_string())?;
    Ok(out
        .into_iter()
        .map(|c| c.into_iter().next().map(|c| c.text).unwrap_or_default())
        .collect())
}

/// The model a run directory holds: its averaged final model, else its last checkpoint.
fn load_run<B: Backend>(run: &Path) -> Result<(Transformer<B>, SubwordTokenizer), String> {
    let device = B::Device::default();
    let tokenizer = SubwordTokenizer::load(&tokenizer_path(run)).map_err(|e| e.to_string())?;
    let final_dir = run.join("model");
    let dir = if final_dir.is_dir() {
        final_dir
    } else {
        trainer::latest_checkpoint(run)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "{}: no model/ and no checkpoint (train one with `xfmr train --out {}`)",
                    run.display(),
                    run.display()
                )
            })?
    };
    let (_, model) = trainer::load_model::<B>(&dir, &device).map_err(|e| e.to_string())?;
    Ok((model, tokenizer))
}

/// `xfmr translate`.
pub fn translate_cmd<B: Backend>(
    run: &Path,
    sentences: &[String],
    beam: usize,
    n_best: usize,
) -> Result<(), String> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let lines: Vec<String> = if sentences.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("stdin: {e}"))?
    } else {
        sentences.to_vec()
    };
    let sources: Vec<&str> = lines.iter().map(String::as_str).collect();
    let out = translate(
        &model,
        &tokenizer,
        &sources,
        &options(strategy(beam, n_best), &tokenizer, 128),
        32,
    )
    .map_err(|e| e.to_string())?;
    for candidates in out {
        if n_best <= 1 {
            println!(
                "{}",
                candidates.first().map(|c| c.text.as_str()).unwrap_or("")
            );
        } else {
            for c in candidates {
                println!("{:.3}\t{}", c.score, c.text);
            }
            println!();
        }
    }
    Ok(())
}

/// `xfmr eval`.
pub fn eval_cmd<B: Backend>(
    run: &Path,
    tsv: &Path,
    beam: usize,
    limit: Option<usize>,
    hypotheses: Option<&Path>,
) -> Result<(), String> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let pairs = data::read_tsv(tsv).map_err(|e| e.to_string())?;
    let pairs: Vec<Pair> = pairs
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = pairs.iter().map(|p| p.tgt.clone()).collect();
    let hyps = translate_texts(&model, &tokenizer, &sources, strategy(beam, 1))?;
    let scores = score(&hyps, &refs).map_err(|e| e.to_string())?;
    println!(
        "{}: {} sentences, {}: BLEU {:.2}  chrF {:.2}",
        tsv.display(),
        pairs.len(),
        if beam > 1 { "beam" } else { "greedy" },
        scores.bleu.score,
        scores.chrf
    );
    println!("{:?}", scores.bleu);
    if let Some(path) = hypotheses {
        write_atomic(path, (hyps.join("\n") + "\n").as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `xfmr attention`: translates `sentence` greedily, then draws every layer's and head's encoder
/// self-attention and decoder cross-attention over that translation into `out`. Returns the
/// number of files written.
pub fn attention_maps<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sentence: &str,
    out: &Path,
) -> Result<usize, String> {
    let device = model.src_embedding.weight.device();
    let translation = translate(
        model,
        tokenizer,
        &[sentence],
        &options(Strategy::Greedy, tokenizer, 64),
        1,
    )
    .map_err(|e| e.to_string())?;
    let target = translation[0]
        .first()
        .map(|c| c.tokens.clone())
        .unwrap_or_default();
    let mut src: Vec<i64> = tokenizer
        .encode(sentence)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|t| t as i64)
        .collect();
    src.push(tokenizer.eos_id() as i64);
    let tgt_in: Vec<i64> = std::iter::once(tokenizer.bos_id() as i64)
        .chain(target.iter().map(|&t| t as i64))
        .collect();
    let piece = |id: i64| {
        tokenizer
            .piece(id as usize)
            .unwrap_or_else(|| format!("#{id}"))
    };
    let src_labels: Vec<String> = src.iter().map(|&t| piece(t)).collect();
    let tgt_labels: Vec<String> = target
        .iter()
        .map(|&t| t as i64)
        .chain([tokenizer.eos_id() as i64])
        .map(piece)
        .collect();
    let (s, t) = (src.len(), tgt_in.len());
    let maps = model
        .forward_with_attention(
            Tensor::<B, 2, Int>::from_data(TensorData::new(src, [1, s]), &device),
            Tensor::<B, 2, Int>::from_data(TensorData::new(tgt_in, [1, t]), &device),
        )
        .map_err(|e| e.to_string())?;
    fs::create_dir_all(out).map_err(io_err(out))?;
    let mut files = 0;
    for (kind, layers, rows) in [
        ("encoder self-attention", &maps.encoder, &src_labels),
        ("cross-attention", &maps.cross, &tgt_labels),
    ] {
        for (l, w) in layers.iter().enumerate() {
            let [_, heads, n_rows, n_cols] = w.dims();
            let values: Vec<f32> = w
                .to_data()
                .convert::<f32>()
                .to_vec()
                .map_err(|e| format!("{e:?}"))?;
            for h in 0..heads {
                let grid: Vec<Vec<f32>> = (0..n_rows)
                    .map(|r| {
                        let at = (h * n_rows + r) * n_cols;
                        values[at..at + n_cols].to_vec()
                    })
                    .collect();
                let stem = if kind.starts_with("encoder") {
                    "encoder"
                } else {
                    "cross"
                };
                let path = out.join(format!("{stem}-layer{}-head{}.png", l + 1, h + 1));
                let title = format!("{kind}, layer {}, head {}", l + 1, h + 1);
                plot::heatmap(&path, &title, rows, &src_labels, &grid)?;
                files += 1;
            }
        }
    }
    Ok(files)
}

/// `xfmr attention` from a run directory.
pub fn attention_cmd<B: Backend>(run: &Path, sentence: &str, out: &Path) -> Result<(), String> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let files = attention_maps(&model, &tokenizer, sentence, out)?;
    println!("{files} attention maps written to {}", out.display());
    Ok(())
}

/// `xfmr prepare-data`: the embedded set from the full corpus — pairs whose both sides have at
/// most `max_chars` characters, split with near-duplicates kept on one side.
pub fn prepare_data(
    input: &Path,
    out: &Path,
    max_chars: usize,
    valid: usize,
    test: usize,
    seed: u64,
) -> Result<(), String> {
    let pairs = data::read_tsv(input).map_err(|e| e.to_string())?;
    let total = pairs.len();
    let short: Vec<Pair> = pairs
        .into_iter()
        .filter(|p| p.src.chars().count() <= max_chars && p.tgt.chars().count() <= max_chars)
        .collect();
    let kept = short.len();
    let splits = data::split(short, valid, test, seed).map_err(|e| e.to_string())?;
    fs::create_dir_all(out).map_err(io_err(out))?;
    for (name, pairs) in [
        ("train.tsv", &splits.train),
        ("valid.tsv", &splits.valid),
        ("test.tsv", &splits.test),
    ] {
        data::write_tsv(&out.join(name), pairs).map_err(|e| e.to_string())?;
    }
    println!(
        "{}: {total} pairs, {kept} with both sides ≤ {max_chars} characters → train {}, valid {}, \
         test {} in {}",
        input.display(),
        splits.train.len(),
        splits.valid.len(),
        splits.test.len(),
        out.display()
    );
    Ok(())
}
