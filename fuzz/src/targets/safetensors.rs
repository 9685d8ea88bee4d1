//! `safetensors`: arbitrary bytes as a `.safetensors` file ([`StateDict::from_bytes`], the
//! reader of PyTorch and Hugging Face weights). A dictionary that loads must hold, for every
//! name, as many values as its shape says.

use xfmr_blocks::StateDict;

/// The target's body.
pub fn run(data: &[u8]) {
    let Ok(dict) = StateDict::from_bytes(data) else {
        return;
    };
    let names: Vec<String> = dict.names().map(str::to_string).collect();
    for name in names {
        let (shape, values) = dict.get(&name).expect("a listed name is there");
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "{name}: shape {shape:?} and {} values",
            values.len()
        );
    }
}

/// A file of F32, F16, BF16 and I64 tensors, written by the `safetensors` crate.
pub fn seeds() -> Vec<Vec<u8>> {
    use safetensors::tensor::{Dtype, TensorView};
    let f32s: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..6)
        .flat_map(|i| half::f16::from_f32(i as f32 - 2.5).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = (0..4)
        .flat_map(|i| half::bf16::from_f32(i as f32 * 3.0).to_le_bytes())
        .collect();
    let i64s: Vec<u8> = (0..3i64).flat_map(|i| (i - 1).to_le_bytes()).collect();
    let views = [
        (
            "encoder.weight",
            TensorView::new(Dtype::F32, vec![3, 4], &f32s),
        ),
        ("encoder.bias", TensorView::new(Dtype::F16, vec![6], &f16s)),
        (
            "norm.gamma",
            TensorView::new(Dtype::BF16, vec![2, 2], &bf16s),
        ),
        (
            "position_ids",
            TensorView::new(Dtype::I64, vec![1, 3], &i64s),
        ),
    ];
    let views: Vec<(&str, TensorView<'_>)> = views
        .into_iter()
        .map(|(n, v)| (n, v.expect("a valid view")))
        .collect();
    vec![safetensors::serialize(views, None).expect("serialise")]
}
