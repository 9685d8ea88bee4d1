//! libFuzzer entry point of the `checkpoint` target (`xfmr_fuzz::targets::checkpoint`); `fuzz/run.sh 600 checkpoint`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("checkpoint"), |data: &[u8]| {
    xfmr_fuzz::run_one("checkpoint", data)
});
