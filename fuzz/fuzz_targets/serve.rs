//! libFuzzer entry point of the `serve` target (`xfmr_fuzz::targets::serve`); `fuzz/run.sh 600 serve`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("serve"), |data: &[u8]| {
    xfmr_fuzz::run_one("serve", data)
});
