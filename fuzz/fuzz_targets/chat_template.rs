//! libFuzzer entry point of the `chat_template` target (`xfmr_fuzz::targets::chat_template`); `fuzz/run.sh 600 chat_template`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("chat_template"), |data: &[u8]| {
    xfmr_fuzz::run_one("chat_template", data)
});
