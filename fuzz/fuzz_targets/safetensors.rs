//! libFuzzer entry point of the `safetensors` target (`xfmr_fuzz::targets::safetensors`); `fuzz/run.sh 600 safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("safetensors"), |data: &[u8]| {
    xfmr_fuzz::run_one("safetensors", data)
});
