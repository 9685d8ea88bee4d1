//! libFuzzer entry point of the `tsv` target (`xfmr_fuzz::targets::tsv`); `fuzz/run.sh 600 tsv`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: xfmr_fuzz::init("tsv"), |data: &[u8]| {
    xfmr_fuzz::run_one("tsv", data)
});
