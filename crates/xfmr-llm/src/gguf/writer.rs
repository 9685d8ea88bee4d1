//! Writing GGUF files (tests and fixtures).

use super::{GgmlType, Value, DEFAULT_ALIGNMENT, MAGIC};

/// Writes GGUF files (version 3): enough to build small test files and to re-save metadata
/// with `F32` tensors. Used by the loader's tests; documented so that a downstream crate can
/// make fixtures the same way.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata pair.
    pub fn metadata(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds an `F32` tensor of `shape` (outermost first, as
    /// [`TensorInfo::shape`](crate::gguf::TensorInfo::shape)).
    pub fn tensor_f32(self, name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, shape, GgmlType::F32, bytes)
    }

    /// Adds a tensor of any type from its raw blocks.
    pub fn tensor_raw(mut self, name: &str, shape: &[usize], ty: GgmlType, bytes: Vec<u8>) -> Self {
        let dims = shape.iter().rev().copied().collect();
        self.tensors.push((name.into(), dims, ty, bytes));
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        fn type_id(v: &Value) -> u32 {
            match v {
                Value::U64(_) => 10,
                Value::I64(_) => 11,
                Value::F64(_) => 12,
                Value::Bool(_) => 7,
                Value::String(_) => 8,
                Value::Array(_) => 9,
            }
        }
        fn value(out: &mut Vec<u8>, v: &Value) {
            match v {
                Value::U64(x) => out.extend(x.to_le_bytes()),
                Value::I64(x) => out.extend(x.to_le_bytes()),
                Value::F64(x) => out.extend(x.to_le_bytes()),
                Value::Bool(x) => out.push(*x as u8),
                Value::String(s) => string(out, s),
                Value::Array(items) => {
                    out.extend(items.first().map_or(8, type_id).to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|i| value(out, i));
                }
            }
        }
        let mut out = Vec::new();
        out.extend(MAGIC);
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, v) in &self.metadata {
            string(&mut out, key);
            out.extend(type_id(v).to_le_bytes());
            value(&mut out, v);
        }
        let mut offset = 0usize;
        for (name, dims, ty, bytes) in &self.tensors {
            string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter()
                .for_each(|d| out.extend((*d as u64).to_le_bytes()));
            out.extend(ty.id().to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += bytes.len().div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        for (_, _, _, bytes) in &self.tensors {
            out.resize(out.len().div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT, 0);
            out.extend(bytes);
        }
        out
    }
}
