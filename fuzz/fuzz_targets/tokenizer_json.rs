//! libFuzzer entry point of the `tokenizer_json` target (`xfmr_fuzz::targets::tokenizer_json`); `fuzz/run.sh 600 tokenizer_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("tokenizer_json"), |data: &[u8]| {
    xfmr_fuzz::run_one("tokenizer_json", data)
});
