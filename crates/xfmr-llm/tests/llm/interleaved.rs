//! The interleaved layout of the quantised model's matrices (`xfmr_kernels::quant::interleave`),
//! which [`QuantizedLlama::from_gguf_owned`] lays the file's `Q4_0`, `Q4_1` and `Q8_0` blocks out
//! in on CPUs with AVX-512 VNNI: the kernels are checked against the exact products on every
//! path in `quantized.rs`; here the whole model, on the tiny file (whose `Q8_0` embedding has
//! rows past its last group of sixteen, and whose `Q4_0`, `Q4_1` and `Q8_0` matrices have one
//! to four groups).

use xfmr_kernels::quant::{BlockFormat, Layout, Path};
use xfmr_llm::gguf::Gguf;
use xfmr_llm::{QuantizedLinear, QuantizedLlama};
use xfmr_models::generate::HostSteps;
use xfmr_testing::assert_close_slices;

/// The model taken with its file (interleaved on AVX-512 VNNI) gives the logits of the model
/// borrowing it (ggml's layout), prompt and decoding steps alike, within 1e-5 of their largest
/// magnitude (the same integer products; their `f32` scaling and sums in another order); a
/// file whose bytes another matrix still holds is left as stored.
#[test]
fn interleaved_model_equals_the_row_layout_model_on_the_tiny_file() {
    let pad = 2;
    let rows =
        QuantizedLlama::from_gguf(&Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap(), pad).unwrap();
    let owned =
        QuantizedLlama::from_gguf_owned(Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap(), pad)
            .unwrap();
    assert_eq!(rows.interleaved_bytes(), 0);
    let layout = Layout::fastest(Path::detect(), BlockFormat::Q4_1);
    eprintln!("the tiny model's Q4_0, Q4_1 and Q8_0 matrices in the {layout:?} layout");
    match layout {
        Layout::Interleaved => assert!(owned.interleaved_bytes() > 0),
        Layout::Rows => assert_eq!(owned.interleaved_bytes(), 0),
    }
    let vocab = rows.config.vocab_size;
    let prompt: Vec<u32> = (0..9).map(|i| (7 * i + 3) % vocab as u32).collect();
    let (mut a, mut b) = (rows.steps(1, 16), owned.steps(1, 16));
    let mut fed = prompt.clone();
    for step in 0..6 {
        let want = xfmr_testing::widen(a.step(&fed, fed.len(), false).unwrap());
        let got = xfmr_testing::widen(b.step(&fed, fed.len(), false).unwrap());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let shape = [want.len()];
        let what = format!("logits after step {step}");
        assert_close_slices(&got, &shape, &want, &shape, 1e-5 * scale, 0.0, &what);
        // The next token both are fed: the row layout's greedy choice.
        let next = (0..want.len())
            .max_by(|&i, &j| want[i].total_cmp(&want[j]))
            .unwrap();
        fed = vec![next as u32];
    }

    // Another matrix built from the file keeps its bytes shared: nothing is permuted.
    let g = Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap();
    let held = QuantizedLinear::from_gguf(&g, "token_embd.weight", None).unwrap();
    let kept = QuantizedLlama::from_gguf_owned(g, pad).unwrap();
    assert_eq!(kept.interleaved_bytes(), 0);
    assert_eq!(held.layout(), Some(Layout::Rows));
}
