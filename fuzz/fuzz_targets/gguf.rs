//! libFuzzer entry point of the `gguf` target (`xfmr_fuzz::targets::gguf`); `fuzz/run.sh 600 gguf`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("gguf"), |data: &[u8]| {
    xfmr_fuzz::run_one("gguf", data)
});
