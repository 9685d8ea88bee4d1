//! Reading GGUF files (llama.cpp's format): metadata, tensor directory, and dequantisation of
//! the tensors to `f32`.
//!
//! Layout (version 2 and 3, little-endian): the magic `GGUF`, a version, the tensor and
//! metadata counts, the metadata key/value pairs, one directory entry per tensor (name, dims
//! innermost first, type, offset into the data section), then the data section at the next
//! multiple of `general.alignment` (default 32).
//!
//! The reader trusts nothing in the header: every count and length is checked against the
//! bytes that remain before anything is allocated for it, dimensions against overflow, and
//! each tensor's byte range against the file, so a truncated or corrupt file gives a
//! [`GgufError`] naming the offset (and the tensor or key) instead of a panic, a hang or a
//! huge allocation.
//!
//! Dequantisation (as llama.cpp's `ggml-quants.c` and the `gguf` Python package compute it):
//!
//! | type | block | bytes | value |
//! |---|---|---|---|
//! | `F32` | 1 | 4 | as stored |
//! | `F16`, `BF16` | 1 | 2 | widened |
//! | `Q4_0` | 32 | 18 | `d·(q − 8)`, `q` a nibble |
//! | `Q4_1` | 32 | 20 | `d·q + m` |
//! | `Q8_0` | 32 | 34 | `d·q`, `q` an `i8` |
//! | `Q5_0`, `Q5_1` | 32 | 22, 24 | as `Q4_*` with a fifth bit per element |
//! | `Q2_K` … `Q6_K` | 256 | 84 … 210 | groups of 16 or 32 with their own quantised scales (and minimums) under `f16` super-scales |
//! | `Q8_K` | 256 | 292 | `d·q`, `d` an `f32` |
//!
//! In `Q4_*` blocks element `j < 16` is the low nibble of byte `j`, element `16 + j` its high
//! nibble; `d` and `m` are `f16`. The block layouts are ggml's; [`xfmr_kernels::quant`]
//! documents and unpacks each (the same code serves dequantisation and the quantised
//! products). A block whose floating-point scales are not finite is refused
//! ([`GgufError::BadTensor`] naming the tensor and the block's offset). Other ggml types
//! (I-quants, integers...) are named in a [`GgufError::UnsupportedType`].

mod error;
mod quant;
mod reader;
mod writer;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub use error::GgufError;
pub use quant::GgmlType;
pub use writer::GgufWriter;

use reader::Reader;

/// The file's magic number, `GGUF` in ASCII.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Deepest nesting of metadata arrays accepted (real files use 1).
const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: usize = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// `f32` or `f64`.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array (of one element type).
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U64(v) => Some(v),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F64(v) => Some(v),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// llama.cpp's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost (contiguous) first, as the file stores them.
    pub dims: Vec<usize>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute offset of the data in the file.
    pub offset: usize,
    /// Bytes of data.
    pub size: usize,
}

impl TensorInfo {
    /// The shape in PyTorch's order (outermost first): `dims` reversed, so a linear weight is
    /// `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A GGUF file held in memory: its metadata, its tensor directory, and its bytes.
pub struct Gguf {
    /// The whole file, shared with the quantised matrices built from it (no copy).
    bytes: Arc<Vec<u8>>,
    /// Format version.
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor directory, in file order.
    pub tensors: Vec<TensorInfo>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("bytes", &self.bytes.len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Reads and parses a file.
    ///
    /// # Errors
    /// [`GgufError::Io`] naming the file, or any parse error.
    pub fn read(path: &Path) -> Result<Self, GgufError> {
        let bytes = std::fs::read(path).map_err(|e| GgufError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::parse(bytes)
    }

    /// Parses a whole file held in memory: header, metadata and tensor directory. Tensor data
    /// is checked to lie inside the file but dequantised only on demand.
    ///
    /// # Errors
    /// Any [`GgufError`] but `Io`.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let mut r = Reader {
            bytes: &bytes,
            pos: 0,
        };
        let magic = r
            .take(4, &|| "magic".into())
            .map_err(|_| GgufError::BadMagic {
                found: bytes[..bytes.len().min(4)].to_vec(),
            })?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = r.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64(&|| "tensor count".into())?;
        let n_metadata = r.u64(&|| "metadata count".into())?;
        // A key/value pair takes at least 8 + 4 + 1 bytes, a directory entry 8 + 4 + 4 + 8.
        for (count, min, what) in [(n_metadata, 13, "metadata"), (n_tensors, 24, "tensors")] {
            if count.saturating_mul(min) > r.remaining() as u64 {
                return Err(GgufError::Truncated {
                    what: format!("{count} {what} entries"),
                    offset: r.pos as u64,
                    needed: count.saturating_mul(min),
                    available: r.remaining() as u64,
                });
            }
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_metadata {
            let key = r.string(&|| format!("metadata key {i}"))?;
            let ty = r.u32(&|| format!("type of {key:?}"))?;
            let value = r.value(ty, 0, &key)?;
            metadata.insert(key, value);
        }
        let mut entries = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let entry = r.pos as u64;
            let name = r.string(&|| format!("tensor name {i}"))?;
            let what = || format!("directory entry of {name:?}");
            let n_dims = r.u32(&what)? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.malformed(
                    &format!("tensor {name:?}"),
                    entry,
                    &format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                let d = r.u64(&what)?;
                dims.push(usize::try_from(d).unwrap_or(usize::MAX));
            }
            let type_id = r.u32(&what)?;
            let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownType {
                tensor: name.clone(),
                offset: entry,
                type_id,
            })?;
            let relative = r.u64(&what)?;
            entries.push((entry, name, dims, ty, relative));
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(GgufError::metadata(
                        "general.alignment",
                        format!("{v:?} is not a power of two up to 2^20"),
                    ))
                }
            },
        };
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(entries.len());
        for (entry, name, dims, ty, relative) in entries {
            let count = dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    r.malformed(
                        &format!("tensor {name:?}"),
                        entry,
                        &format!("dimensions {dims:?} overflow"),
                    )
                })?;
            let size = match ty.block() {
                Some((per_block, bytes_per_block)) => {
                    if dims[0] % per_block != 0 {
                        return Err(r.malformed(
                            &format!("tensor {name:?}"),
                            entry,
                            &format!("{ty} rows of {} elements are not whole blocks", dims[0]),
                        ));
                    }
                    (count / per_block).saturating_mul(bytes_per_block)
                }
                // Unsupported types: no size known here; checked when dequantised (refused).
                None => 0,
            };
            // llama.cpp refuses it too (`gguf_init_from_file`): a tensor's data starts at a
            // multiple of the alignment; one that does not was written wrongly or lies.
            if relative % alignment as u64 != 0 {
                return Err(GgufError::BadTensor {
                    tensor: name,
                    offset: relative.saturating_add(data_start as u64),
                    reason: format!(
                        "its offset {relative} in the data section is not a multiple of \
                         general.alignment ({alignment})"
                    ),
                });
            }
            let offset = usize::try_from(relative)
                .ok()
                .and_then(|o| o.checked_add(data_start))
                .unwrap_or(usize::MAX);
            let fits = offset
                .checked_add(size)
                .is_some_and(|end| end <= bytes.len());
            if !fits {
                return Err(GgufError::BadTensor {
                    tensor: name,
                    offset: relative.saturating_add(data_start as u64),
                    reason: format!(
                        "{size} bytes do not fit in the file ({} bytes)",
                        bytes.len()
                    ),
                });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                size,
            });
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            bytes: Arc::new(bytes),
        })
    }

    /// The directory entry of `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A metadata value, or an error naming the key.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when absent.
    pub fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata
            .get(key)
            .ok_or_else(|| GgufError::metadata(key, "absent"))
    }

    /// An unsigned integer value.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when absent or not a non-negative integer.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.get(key)?;
        v.as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| GgufError::metadata(key, format!("{v:?} is not an unsigned integer")))
    }

    /// An unsigned integer value if the key is present.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when present but not a non-negative integer.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        match self.metadata.contains_key(key) {
            true => self.get_usize(key).map(Some),
            false => Ok(None),
        }
    }

    /// A float value if the key is present.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when present but not a number.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.metadata.contains_key(key) {
            true => self.get_f64(key).map(Some),
            false => Ok(None),
        }
    }

    /// A float value.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when absent or not a number.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.get(key)?;
        v.as_f64()
            .ok_or_else(|| GgufError::metadata(key, format!("{v:?} is not a number")))
    }

    /// A string value.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when absent or not a string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.get(key)?;
        v.as_str()
            .ok_or_else(|| GgufError::metadata(key, "not a string"))
    }

    /// An array of strings.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] when absent or not an array of strings.
    pub fn get_strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let bad = |reason: &str| GgufError::metadata(key, reason);
        match self.get(key)? {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .ok_or_else(|| bad(&format!("element {i} is not a string")))
                })
                .collect(),
            _ => Err(bad("not an array")),
        }
    }

    /// The tensor `name` dequantised to `f32`, in the file's element order (row-major over
    /// [`TensorInfo::shape`]).
    ///
    /// # Errors
    /// [`GgufError::NoTensor`], [`GgufError::UnsupportedType`].
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::NoTensor(name.into()))?;
        self.dequantize_info(info)
    }

    /// As [`dequantize`](Self::dequantize), for a directory entry of this file.
    ///
    /// # Errors
    /// [`GgufError::UnsupportedType`].
    pub fn dequantize_info(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        if info.ty.block().is_none() {
            return Err(GgufError::UnsupportedType {
                tensor: info.name.clone(),
                ty: info.ty,
            });
        }
        let data = &self.bytes[info.offset..info.offset + info.size];
        check_blocks(info, data)?;
        Ok(quant::dequantize(info.ty, data, info.len()))
    }

    /// The file's bytes and the range of `info`'s data in them, for readers that keep the
    /// blocks as they are (no copy), with every block's scales checked.
    ///
    /// # Errors
    /// [`GgufError::UnsupportedType`]; [`GgufError::BadTensor`] for a block whose scales are
    /// not finite.
    pub fn tensor_data(
        &self,
        info: &TensorInfo,
    ) -> Result<(Arc<Vec<u8>>, Range<usize>), GgufError> {
        if info.ty.block().is_none() {
            return Err(GgufError::UnsupportedType {
                tensor: info.name.clone(),
                ty: info.ty,
            });
        }
        let range = info.offset..info.offset + info.size;
        check_blocks(info, &self.bytes[range.clone()])?;
        Ok((Arc::clone(&self.bytes), range))
    }

    /// The file's bytes and the range of `info`'s data, unchecked: for a reader that checked
    /// them through [`tensor_data`](Self::tensor_data) before permuting them in place.
    pub(crate) fn tensor_bytes(&self, info: &TensorInfo) -> (Arc<Vec<u8>>, Range<usize>) {
        (
            Arc::clone(&self.bytes),
            info.offset..info.offset + info.size,
        )
    }

    /// The file's bytes to change in place, when nothing else holds them (no matrix built from
    /// this file is alive).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut Vec<u8>> {
        Arc::get_mut(&mut self.bytes)
    }
}

/// Refuses quantised blocks whose scales are not finite, naming the tensor and the block.
fn check_blocks(info: &TensorInfo, data: &[u8]) -> Result<(), GgufError> {
    let GgmlType::Quant(format) = info.ty else {
        return Ok(());
    };
    match data
        .chunks_exact(format.block_bytes())
        .position(|block| !format.scales_finite(block))
    {
        None => Ok(()),
        Some(i) => Err(GgufError::BadTensor {
            tensor: info.name.clone(),
            offset: (info.offset + i * format.block_bytes()) as u64,
            reason: format!("{} block {i} has a scale that is not finite", format.name()),
        }),
    }
}
