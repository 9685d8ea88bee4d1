//! libFuzzer entry point of the `gguf_tokenizer` target (`xfmr_fuzz::targets::gguf_tokenizer`); `fuzz/run.sh 600 gguf_tokenizer`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("gguf_tokenizer"), |data: &[u8]| {
    xfmr_fuzz::run_one("gguf_tokenizer", data)
});
