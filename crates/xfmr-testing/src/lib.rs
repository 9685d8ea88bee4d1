//! Test support shared by the xfmr crates (never a dependency of library code).
//!
//! - [`Fixture`]: golden outputs written by PyTorch / HF transformers as safetensors files whose
//!   `__metadata__` carries a JSON `config`. Tests read every dimension from that metadata, so the
//!   same test runs on any fixture set made by the same procedure.
//! - [`fixtures_dir`]: `$XFMR_FIXTURES_DIR` when set (a directory laid out like the repository's
//!   `fixtures/`: `torch/`, `minilm/`), else the repository's own copies. A missing or unreadable
//!   fixture is a test failure, never a skip.
//! - [`assert_close`]: element-wise comparison with a stated absolute and relative tolerance, that
//!   names the worst element when it fails.
//!
//! Behind features, the helpers that several crates' tests, the fuzz targets and the benchmarks
//! share (so that none includes another crate's file by `#[path]`):
//! - `gguf`: module `tiny_gguf`, a tiny Llama-family GGUF file with every tensor
//!   type, written in memory.
//! - `http`: module `http`, a small HTTP/1.1 client with server-sent events.
//! - `workloads`: module `workloads`, the benchmark workloads' models and inputs.

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "gguf")]
pub mod tiny_gguf;
#[cfg(feature = "workloads")]
pub mod workloads;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use burn::tensor::{backend::Backend, Bool, Element, Int, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

/// Name of the environment variable that points the parity tests at another fixture set.
pub const FIXTURES_ENV: &str = "XFMR_FIXTURES_DIR";

/// The directory fixtures are read from: `$XFMR_FIXTURES_DIR` if set, else `<repo>/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os(FIXTURES_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
    }
}

/// One tensor of a fixture, decoded to host memory.
#[derive(Debug, Clone)]
pub struct HostTensor {
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// Values widened to `f64` (exact for the f32, u8 and small integer data fixtures hold).
    pub values: Vec<f64>,
    /// Storage dtype name as written in the file (`F32`, `I64`, `U8`, ...).
    pub dtype: String,
}

/// A golden-output file: named tensors plus its JSON `config` and free-text `notes`.
pub struct Fixture {
    path: PathBuf,
    config: serde_json::Value,
    metadata: HashMap<String, String>,
    tensors: HashMap<String, HostTensor>,
}

impl fmt::Debug for Fixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("path", &self.path)
            .field("config", &self.config)
            .field("tensors", &self.tensors.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Fixture {
    /// Loads `<fixtures_dir>/<name>.safetensors` (e.g. `name = "torch/mha_causal"`).
    ///
    /// # Panics
    /// If the file is missing, unreadable or malformed: a parity test must fail, not skip.
    pub fn load(name: &str) -> Self {
        let path = fixtures_dir().join(format!("{name}.safetensors"));
        Self::load_path(&path).unwrap_or_else(|e| {
            panic!(
                "fixture `{name}` could not be loaded from {}: {e} \
                 (set {FIXTURES_ENV} to a directory laid out like the repo's fixtures/)",
                path.display()
            )
        })
    }

    /// Loads a fixture from an explicit path.
    pub fn load_path(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("read error: {e}"))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format!("{e:?}"))?;
        let metadata: HashMap<String, String> = meta.metadata().clone().unwrap_or_default();
        let config = match metadata.get("config") {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| format!("metadata `config` is not JSON: {e}"))?,
            None => serde_json::Value::Null,
        };
        let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{e:?}"))?;
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f64> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::F64 => data
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::I32 => data
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::U8 | Dtype::BOOL => data.iter().map(|&b| b as f64).collect(),
                other => return Err(format!("tensor `{name}` has unsupported dtype {other:?}")),
            };
            tensors.insert(
                name.clone(),
                HostTensor {
                    shape: view.shape().to_vec(),
                    values,
                    dtype: format!("{:?}", view.dtype()),
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            config,
            metadata,
            tensors,
        })
    }

    /// The parsed `config` metadata (JSON).
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// A string metadata entry (e.g. `notes`, `sentences`).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// A metadata entry holding a JSON list of strings (`prompts`, `sentences`).
    ///
    /// # Panics
    /// If the entry is absent or not such a list, naming the file and the key.
    pub fn metadata_strings(&self, key: &str) -> Vec<String> {
        let text = self
            .metadata(key)
            .unwrap_or_else(|| panic!("{}: no metadata `{key}`", self.path.display()));
        serde_json::from_str(text).unwrap_or_else(|e| {
            panic!(
                "{}: metadata `{key}` is not a JSON list of strings: {e}",
                self.path.display()
            )
        })
    }

    /// Tensor `name` (token ids, stored as integers) as `u32`s.
    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.host(name).values.iter().map(|&v| v as u32).collect()
    }

    /// A non-negative integer from `config`.
    ///
    /// # Panics
    /// If the key is absent or not an unsigned integer.
    pub fn config_usize(&self, key: &str) -> usize {
        self.config
            .get(key)
            .and_then(|v| v.as_u64())
            .unwrap_or_else(|| panic!("{}: config has no integer `{key}`", self.path.display()))
            as usize
    }

    /// Whether the fixture holds tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The raw host tensor `name`.
    ///
    /// # Panics
    /// If the fixture does not contain it.
    pub fn host(&self, name: &str) -> &HostTensor {
        self.tensors.get(name).unwrap_or_else(|| {
            panic!(
                "{}: no tensor `{name}` (has: {:?})",
                self.path.display(),
                self.names()
            )
        })
    }

    /// Shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.host(name).shape.clone()
    }

    /// Tensor `name` as a float tensor of rank `D` on `device`.
    pub fn float<B: Backend, const D: usize>(
        &self,
        name: &str,
        device: &B::Device,
    ) -> Tensor<B, D> {
        let t = self.host(name);
        self.check_rank::<D>(name, t);
        float_tensor(t.values.clone(), t.shape.clone(), device)
    }

    /// Tensor `name` as an integer tensor of rank `D` on `device`.
    pub fn int<B: Backend, const D: usize>(
        &self,
        name: &str,
        device: &B::Device,
    ) -> Tensor<B, D, Int> {
        let t = self.host(name);
        self.check_rank::<D>(name, t);
        let values: Vec<i64> = t.values.iter().map(|&v| v as i64).collect();
        Tensor::from_data(TensorData::new(values, t.shape.clone()), device)
    }

    /// Tensor `name` (stored as 0/1) as a bool tensor of rank `D`: nonzero → `true`.
    pub fn bool<B: Backend, const D: usize>(
        &self,
        name: &str,
        device: &B::Device,
    ) -> Tensor<B, D, Bool> {
        let t = self.host(name);
        self.check_rank::<D>(name, t);
        let values: Vec<bool> = t.values.iter().map(|&v| v != 0.0).collect();
        Tensor::from_data(TensorData::new(values, t.shape.clone()), device)
    }

    fn check_rank<const D: usize>(&self, name: &str, t: &HostTensor) {
        assert_eq!(
            t.shape.len(),
            D,
            "{}: tensor `{name}` has shape {:?}, expected rank {D}",
            self.path.display(),
            t.shape
        );
    }
}

/// A float tensor of the backend's own float element type (`B::FloatElem`).
///
/// burn 0.21 keeps a default float dtype *per device*, and `NdArray<f32>` and `NdArray<f64>`
/// share one CPU device: whichever test touches it first would otherwise decide the precision
/// of every tensor created later. The dtype is therefore always given explicitly.
pub fn float_tensor<B: Backend, const D: usize>(
    values: Vec<f64>,
    shape: Vec<usize>,
    device: &B::Device,
) -> Tensor<B, D> {
    let dtype = <B::FloatElem as Element>::dtype();
    Tensor::from_data(
        TensorData::new(values, shape).convert_dtype(dtype),
        (device, dtype),
    )
}

/// Host copy of any float tensor as `f64`s.
pub fn to_vec<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Vec<f64> {
    t.to_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .expect("float tensor data")
}

/// `f32` host values (a model's logits lent by `HostSteps::step`) as the `f64` the
/// comparisons take.
pub fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// Host copies of a linear layer's weight (row-major) and bias (empty without one): what the
/// initialisation tests read.
pub fn linear_values<B: Backend>(linear: &burn::nn::Linear<B>) -> (Vec<f64>, Vec<f64>) {
    let weight = to_vec(&linear.weight.val());
    let bias = linear
        .bias
        .as_ref()
        .map_or_else(Vec::new, |b| to_vec(&b.val()));
    (weight, bias)
}

/// Asserts that `values` look like uniform draws in `±bound`: none outside (a `1e-6` relative
/// margin for `f32` rounding), the largest magnitude at least `0.95·bound`, and the root mean
/// square `bound/√3` within 4%. The square of a `U(−b, b)` draw has relative standard
/// deviation `2/√5`, so the root mean square of `n` draws has relative standard error about
/// `1/√(5n)`: 4% is 4.5 standard errors at the 2,500 draws asked for at least, 11 at 16,384.
/// The largest magnitude falls below `0.95·bound` with probability `0.95ⁿ` (nothing at these
/// sizes).
///
/// # Panics
/// Naming `name`, when a condition fails or `values` has fewer than 2,500 draws.
pub fn assert_uniform(name: &str, values: &[f64], bound: f64) {
    assert!(
        values.len() >= 2_500,
        "{name}: {} draws are too few for the 4% bound",
        values.len()
    );
    let n = values.len() as f64;
    let largest = values.iter().fold(0.0_f64, |m, &v| m.max(v.abs()));
    let rms = (values.iter().map(|&v| v * v).sum::<f64>() / n).sqrt();
    assert!(
        largest <= bound * (1.0 + 1e-6),
        "{name}: |w| {largest} > {bound}"
    );
    assert!(
        largest >= 0.95 * bound,
        "{name}: largest |w| {largest}, bound {bound}"
    );
    let expected = bound / 3f64.sqrt();
    assert!(
        (rms / expected - 1.0).abs() < 0.04,
        "{name}: root mean square {rms}, expected {expected}"
    );
}

/// An error and its sources joined by `: `, as `anyhow` prints them with `{:#}` (what the CLI
/// shows): the tests that check a message is said once read this.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Asserts `|actual - expected| <= atol + rtol * |expected|` element-wise, and that the shapes
/// agree. On failure names `what`, the worst element's index and both values.
pub fn assert_close_slices(
    actual: &[f64],
    actual_shape: &[usize],
    expected: &[f64],
    expected_shape: &[usize],
    atol: f64,
    rtol: f64,
    what: &str,
) {
    assert_eq!(
        actual_shape, expected_shape,
        "{what}: shape {actual_shape:?} differs from expected {expected_shape:?}"
    );
    assert_eq!(
        (actual.len(), expected.len()),
        (
            expected_shape.iter().product(),
            expected_shape.iter().product()
        ),
        "{what}: the values do not fill shape {expected_shape:?}"
    );
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let excess = (a - e).abs() - (atol + rtol * e.abs());
        if excess.is_nan() || excess > 0.0 {
            let score = if excess.is_nan() {
                f64::INFINITY
            } else {
                excess
            };
            if worst.is_none_or(|(_, s)| score > s) {
                worst = Some((i, score));
            }
        }
    }
    if let Some((i, _)) = worst {
        let max_abs = actual
            .iter()
            .zip(expected)
            .map(|(a, e)| (a - e).abs())
            .fold(0.0f64, f64::max);
        panic!(
            "{what}: element {i} (of shape {expected_shape:?}) is {} but expected {} \
             (atol {atol:e}, rtol {rtol:e}; max |diff| over all elements {max_abs:e})",
            actual[i], expected[i]
        );
    }
}

/// [`assert_close_slices`] for a burn tensor against a host tensor from a fixture.
pub fn assert_close<B: Backend, const D: usize>(
    actual: &Tensor<B, D>,
    expected: &HostTensor,
    atol: f64,
    rtol: f64,
    what: &str,
) {
    assert_close_slices(
        &to_vec(actual),
        &actual.dims(),
        &expected.values,
        &expected.shape,
        atol,
        rtol,
        what,
    );
}

/// [`assert_close_slices`] for two burn tensors.
pub fn assert_tensors_close<B: Backend, const D: usize>(
    actual: &Tensor<B, D>,
    expected: &Tensor<B, D>,
    atol: f64,
    rtol: f64,
    what: &str,
) {
    assert_close_slices(
        &to_vec(actual),
        &actual.dims(),
        &to_vec(expected),
        &expected.dims(),
        atol,
        rtol,
        what,
    );
}

/// Largest absolute element-wise difference between two tensors of equal shape.
pub fn max_abs_diff<B: Backend, const D: usize>(a: &Tensor<B, D>, b: &Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims(), "max_abs_diff: shapes differ");
    to_vec(a)
        .iter()
        .zip(to_vec(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A small deterministic pseudo-random generator (SplitMix64) for test inputs, so tests do not
/// depend on a backend's RNG.
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next raw 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A float tensor of `shape` with entries uniform in `[-scale, scale)`.
    pub fn tensor<B: Backend, const D: usize>(
        &mut self,
        shape: [usize; D],
        scale: f64,
        device: &B::Device,
    ) -> Tensor<B, D> {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|_| self.uniform(-scale, scale) as f32 as f64)
            .collect();
        float_tensor(values, shape.to_vec(), device)
    }
}
