//! libFuzzer entry point of the `manifest` target (`xfmr_fuzz::targets::manifest`); `fuzz/run.sh 600 manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("manifest"), |data: &[u8]| {
    xfmr_fuzz::run_one("manifest", data)
});
