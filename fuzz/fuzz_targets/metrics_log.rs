//! libFuzzer entry point of the `metrics_log` target (`xfmr_fuzz::targets::metrics_log`); `fuzz/run.sh 600 metrics_log`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("metrics_log"), |data: &[u8]| {
    xfmr_fuzz::run_one("metrics_log", data)
});
