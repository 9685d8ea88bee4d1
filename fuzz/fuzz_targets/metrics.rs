//! libFuzzer entry point of the `metrics` target (`xfmr_fuzz::targets::metrics`); `fuzz/run.sh 600 metrics`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("metrics"), |data: &[u8]| {
    xfmr_fuzz::run_one("metrics", data)
});
