//! libFuzzer entry point of the `gguf_blocks` target (`xfmr_fuzz::targets::gguf_blocks`); `fuzz/run.sh 600 gguf_blocks`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("gguf_blocks"), |data: &[u8]| {
    xfmr_fuzz::run_one("gguf_blocks", data)
});
