//! `metrics_log`: an arbitrary `metrics.jsonl` or `metrics.csv` (the first byte picks which)
//! read back by [`read_metrics`], as `xfmr train` does on resume and the plots do: records, or
//! an error naming the file and line. Seed: lines in the format the trainer writes.

use std::fs;

use xfmr_train::trainer::{read_metrics, MetricsFormat};

use super::scratch_dir;

/// The target's body.
pub fn run(data: &[u8]) {
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let format = if pick & 1 == 0 {
        MetricsFormat::Jsonl
    } else {
        MetricsFormat::Csv
    };
    let path = format.path(scratch_dir());
    fs::write(&path, text).expect("write");
    if let Err(e) = read_metrics(&path, format) {
        let message = e.to_string();
        assert!(
            message.contains(&*path.to_string_lossy()),
            "the error does not name the file: {message}"
        );
    }
}

/// A JSONL and a CSV log as the trainer writes them.
pub fn seeds() -> Vec<Vec<u8>> {
    let jsonl = concat!(
        "{\"kind\":\"train\",\"step\":1,\"epoch\":0,\"loss\":9.2,\"nll\":9.1,\"lr\":5e-6,",
        "\"tokens\":1830,\"tokens_per_s\":5210.5,\"perplexity\":null,\"elapsed_s\":0.35}\n",
        "{\"kind\":\"valid\",\"step\":100,\"epoch\":0,\"loss\":null,\"nll\":5.4,\"lr\":null,",
        "\"tokens\":null,\"tokens_per_s\":null,\"perplexity\":221.4,\"elapsed_s\":31.0}\n"
    );
    let csv = concat!(
        "kind,step,epoch,loss,nll,lr,tokens,tokens_per_s,elapsed_s,perplexity\n",
        "train,1,0,9.2,9.1,0.000005,1830,5210.5,0.35,\n",
        "valid,100,0,NaN,5.4,,,,31.0,221.4\n"
    );
    vec![
        [&[0u8][..], jsonl.as_bytes()].concat(),
        [&[1u8][..], csv.as_bytes()].concat(),
    ]
}
