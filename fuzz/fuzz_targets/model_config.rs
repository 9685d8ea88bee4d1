//! libFuzzer entry point of the `model_config` target (`xfmr_fuzz::targets::model_config`); `fuzz/run.sh 600 model_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("model_config"), |data: &[u8]| {
    xfmr_fuzz::run_one("model_config", data)
});
