//! libFuzzer entry point of the `hf_config` target (`xfmr_fuzz::targets::hf_config`); `fuzz/run.sh 600 hf_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("hf_config"), |data: &[u8]| {
    xfmr_fuzz::run_one("hf_config", data)
});
