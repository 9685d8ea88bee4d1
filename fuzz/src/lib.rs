//! Fuzz targets for every parser of outside bytes in xfmr.
//!
//! Each target (one file under `src/targets/`, one libFuzzer entry point under
//! `fuzz_targets/`) takes arbitrary bytes, feeds them to a loader the way a user's file or
//! request would reach it, and checks the properties every loader promises
//! (`docs/reliability.md`):
//!
//! - **no panic**: bad input is a typed error or a valid value;
//! - **no allocation beyond a bound proportional to the input**: [`bound`] bytes at most alive
//!   at once above what was alive before (the counting allocator of [`alloc`]);
//! - **no hang**: libFuzzer's `-timeout` per input, and the replayer's [`TIME_LIMIT`];
//! - the target's own invariants (a score in [0, 100], a round trip that gives back what was
//!   written, an HTTP status that is an answer and not a failure...), asserted in the target.
//!
//! Two ways to run them:
//! - `fuzz/run.sh [SECONDS] [TARGET...]`: coverage-guided (LLVM's libFuzzer, built on stable
//!   Rust with the `sancov` instrumentation), the new interesting inputs merged into
//!   `fuzz/corpus/<target>/`;
//! - `xfmr-fuzz [--seconds N] [TARGET...]` (this crate's binary, no instrumentation): every kept
//!   input of every target, then N seconds per target of random mutations of them. CI runs it
//!   after the tests and it prints `fuzz: N targets`.

pub mod alloc;
pub mod mutate;
pub mod targets;

/// The tiny Llama-family GGUF of xfmr-llm's tests (seeds, and the models of the server and
/// chat-template targets).
pub(crate) use xfmr_testing::tiny_gguf as tiny;

use std::time::Duration;

/// The counting allocator of [`alloc`], inside xfmr-llm's memory budget for chat templates
/// (as the `xfmr` binary installs it): a template that doubles a string is a typed error, not
/// a refused allocation.
#[global_allocator]
static ALLOCATOR: xfmr_llm::budget::BudgetAllocator<alloc::Bounded> =
    xfmr_llm::budget::BudgetAllocator::new(alloc::Bounded);

/// One fuzz target: its name (the directory of its corpus, the name of its libFuzzer binary
/// without `fuzz_`) and its body.
pub struct Target {
    /// The target's name.
    pub name: &'static str,
    /// What it feeds the bytes to.
    pub about: &'static str,
    /// The body: panics (an assertion) when a property fails.
    pub run: fn(&[u8]),
    /// The largest input libFuzzer generates for it (`-max_len`).
    pub max_len: usize,
    /// Inputs made from real files or requests, where the fuzzing starts (with the kept
    /// corpus).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "gguf",
        about: "Gguf::parse, then every tensor dequantised, LlamaConfig, the tokenizer and both model loaders",
        run: targets::gguf::run,
        max_len: 1 << 16,
        seeds: targets::gguf::seeds,
    },
    Target {
        name: "gguf_blocks",
        about: "one tensor of every GGML block type with arbitrary block bytes: dequantised, loaded as a QuantizedLinear and multiplied",
        run: targets::gguf_blocks::run,
        max_len: 1 << 12,
        seeds: targets::gguf_blocks::seeds,
    },
    Target {
        name: "gguf_tokenizer",
        about: "GgufTokenizer::from_gguf over arbitrary tokens, merges and special ids; encode, decode and stream arbitrary text",
        run: targets::gguf_tokenizer::run,
        max_len: 1 << 12,
        seeds: targets::gguf_tokenizer::seeds,
    },
    Target {
        name: "chat_template",
        about: "GgufTokenizer::render_chat and encode_chat with an arbitrary chat template and messages, under the template's memory and output limits",
        run: targets::chat_template::run,
        max_len: 1 << 12,
        seeds: targets::chat_template::seeds,
    },
    Target {
        name: "safetensors",
        about: "StateDict::from_bytes",
        run: targets::safetensors::run,
        max_len: 1 << 14,
        seeds: targets::safetensors::seeds,
    },
    Target {
        name: "manifest",
        about: "read_manifest and verify_manifest over an arbitrary manifest.json beside two files",
        run: targets::manifest::run,
        max_len: 1 << 12,
        seeds: targets::manifest::seeds,
    },
    Target {
        name: "checkpoint",
        about: "checkpoint::load of a Transformer from an arbitrary config.json and model.mpk under a valid manifest",
        run: targets::checkpoint::run,
        max_len: 1 << 15,
        seeds: targets::checkpoint::seeds,
    },
    Target {
        name: "model_config",
        about: "checkpoint::load of each model family from an arbitrary config.json over a fixed small checkpoint (size bounds, saved shapes against the configuration)",
        run: targets::model_config::run,
        max_len: 1 << 12,
        seeds: targets::model_config::seeds,
    },
    Target {
        name: "tokenizer_json",
        about: "SubwordTokenizer::load of an arbitrary tokenizer.json; encode and decode",
        run: targets::tokenizer_json::run,
        max_len: 1 << 13,
        seeds: targets::tokenizer_json::seeds,
    },
    Target {
        name: "tsv",
        about: "parse_tsv, and write_tsv → parse_tsv round trips",
        run: targets::tsv::run,
        max_len: 1 << 12,
        seeds: targets::tsv::seeds,
    },
    Target {
        name: "metrics",
        about: "corpus BLEU, sentence BLEU, chrF and the 13a tokenizer on arbitrary Unicode",
        run: targets::metrics::run,
        max_len: 1 << 12,
        seeds: targets::metrics::seeds,
    },
    Target {
        name: "metrics_log",
        about: "read_metrics of an arbitrary metrics.jsonl and metrics.csv",
        run: targets::metrics_log::run,
        max_len: 1 << 12,
        seeds: targets::metrics_log::seeds,
    },
    Target {
        name: "hf_config",
        about: "HfBertConfig::from_file and to_config of an arbitrary config.json",
        run: targets::hf_config::run,
        max_len: 1 << 12,
        seeds: targets::hf_config::seeds,
    },
    Target {
        name: "serve",
        about: "xfmr serve's endpoints (the tiny GGUF model loaded) with arbitrary request bodies over HTTP",
        run: targets::serve::run,
        max_len: 1 << 12,
        seeds: targets::serve::seeds,
    },
];

/// The most bytes a target may have alive at once for an input of `len` bytes, above what was
/// alive before: 64 bytes per input byte (the largest expansion a loader has: a 4.5-bit
/// quantised weight dequantised to f32 is 7.1×, kept next to its blocks, a copy in a tensor
/// and a `Vec` that may double while it grows) plus 64 MiB for what does not depend on the
/// input (a backend's first tensors, a server's buffers, the tokenizer library's tables).
pub fn bound(len: usize) -> usize {
    64usize.saturating_mul(len).saturating_add(64 << 20)
}

/// How long one input may take in the replayer (libFuzzer: `-timeout`).
pub const TIME_LIMIT: Duration = Duration::from_secs(10);

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Runs target `name` on `data` under its allocation [`bound`]; panics on a failed property
/// (libFuzzer reports the input then), or if there is no such target.
pub fn run_one(name: &str, data: &[u8]) {
    let target = target(name).unwrap_or_else(|| panic!("no fuzz target {name:?}"));
    alloc::within(bound(data.len()), || (target.run)(data));
}

/// Start-up of a libFuzzer binary of target `name`: with `$XFMR_FUZZ_SEEDS` set to a directory,
/// writes the target's seeds there (`seed-<i>`) and its largest input beside it (in
/// `<directory>.max_len`, outside the directory libFuzzer reads as a corpus), and with
/// `$XFMR_FUZZ_SEEDS_ONLY` set too, exits (`fuzz/run.sh` asks each binary so before fuzzing).
pub fn init(name: &str) {
    // libfuzzer-sys's hook aborts on every panic, also one a loader catches and turns into an
    // error (burn's and the tokenizers library's panics on bad bytes): back to the default
    // hook, which prints; a panic that escapes a target still aborts (libfuzzer-sys catches it
    // around each input and aborts then).
    drop(std::panic::take_hook());
    let Some(dir) = std::env::var_os("XFMR_FUZZ_SEEDS") else {
        return;
    };
    let target = target(name).unwrap_or_else(|| panic!("no fuzz target {name:?}"));
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (i, seed) in (target.seeds)().iter().enumerate() {
        let path = dir.join(format!("seed-{i}"));
        std::fs::write(&path, seed).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let path = dir.with_extension("max_len");
    std::fs::write(&path, target.max_len.to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if std::env::var_os("XFMR_FUZZ_SEEDS_ONLY").is_some() {
        std::process::exit(0);
    }
}

/// The bytes of `data` cut at the first `0xFF` byte, and the rest after it: how targets that
/// need several inputs (a template and a message, a hypothesis and a reference) split theirs.
pub fn split_field(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Lossy UTF-8 text of some bytes (text targets take any bytes; the loaders take `&str`).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
