//! The tensors a saved record holds and the tensors a module needs, by record path, compared
//! before a record is loaded: burn's loader panics on a record of another layer count ("vec
//! record does not the same length as the module") and takes a tensor of another shape without
//! a word (the model then panics at inference), so [`crate::checkpoint`] checks the shapes
//! first, on the record's own metadata, without decoding a tensor or allocating a parameter.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Bool, Int, Tensor};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// One tensor of a saved record (burn's named MessagePack), as its metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedTensor {
    /// Its record path, dotted (`encoder.layers.3.ffn.linear1.weight`): the module's field
    /// names and `Vec` indices, as [`module_shapes`] names the module's parameters.
    pub path: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// The tensors of a record written as [`crate::checkpoint::save`] writes them, in record order,
/// read from the MessagePack structure alone (the tensors' bytes are skipped, not copied). A
/// tensor whose byte count contradicts its shape and element type is refused here, so that
/// burn's backends never see one.
///
/// # Errors
/// Why the bytes are not such a record (not MessagePack, no `item`, a tensor without a shape,
/// a byte count that contradicts the shape), as text for the caller to name the file.
pub fn saved_tensors(bytes: &[u8]) -> Result<Vec<SavedTensor>, String> {
    let root: Node = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
    let item = root
        .field("item")
        .ok_or("no `item` at the top of the record")?;
    let mut out = Vec::new();
    let mut path = Vec::new();
    collect(item, &mut path, &mut out)?;
    Ok(out)
}

/// A tensor whose shapes differ: (record path, the shape the module needs or `None`, the saved
/// shape or `None`).
pub type Mismatch = (String, Option<Vec<usize>>, Option<Vec<usize>>);

/// Every parameter of `module` as (record path, shape), in visiting order, without
/// initialising a lazy parameter (its shape is read from its initialiser): a module built with
/// fresh, lazily initialised weights costs nothing here.
pub fn module_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    struct Shapes {
        path: Vec<String>,
        out: Vec<(String, Vec<usize>)>,
    }
    impl Shapes {
        fn push(&mut self, shape: burn::tensor::Shape) {
            self.out
                .push((self.path.join("."), shape.as_slice().to_vec()));
        }
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.push(param.lazy_shape());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.push(param.lazy_shape());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.push(param.lazy_shape());
        }
    }
    let mut shapes = Shapes {
        path: Vec::new(),
        out: Vec::new(),
    };
    module.visit(&mut shapes);
    shapes.out
}

/// The first difference between the tensors a module needs (`expected`, [`module_shapes`])
/// and those a record holds (`saved`, [`saved_tensors`]): a tensor of another shape, one the
/// record lacks, or one the module has no place for.
pub fn first_mismatch(
    expected: &[(String, Vec<usize>)],
    saved: &[SavedTensor],
) -> Option<Mismatch> {
    use std::collections::HashMap;
    let by_path: HashMap<&str, &[usize]> = saved
        .iter()
        .map(|t| (t.path.as_str(), t.shape.as_slice()))
        .collect();
    for (path, shape) in expected {
        match by_path.get(path.as_str()) {
            Some(found) if *found == shape.as_slice() => {}
            Some(found) => return Some((path.clone(), Some(shape.clone()), Some(found.to_vec()))),
            None => return Some((path.clone(), Some(shape.clone()), None)),
        }
    }
    let wanted: std::collections::HashSet<&str> =
        expected.iter().map(|(p, _)| p.as_str()).collect();
    saved
        .iter()
        .find(|t| !wanted.contains(t.path.as_str()))
        .map(|t| (t.path.clone(), None, Some(t.shape.clone())))
}

/// Walks a record item, collecting its tensors (`ParamSerde { id, param: TensorData }`).
fn collect(node: &Node, path: &mut Vec<String>, out: &mut Vec<SavedTensor>) -> Result<(), String> {
    match node {
        Node::Map(entries) => {
            if let (Some(_), Some(param)) = (node.field("id"), node.field("param")) {
                out.push(tensor(param, &path.join("."))?);
                return Ok(());
            }
            for (key, value) in entries {
                path.push(key.clone());
                collect(value, path, out)?;
                path.pop();
            }
        }
        Node::Seq(items) => {
            for (i, value) in items.iter().enumerate() {
                path.push(i.to_string());
                collect(value, path, out)?;
                path.pop();
            }
        }
        Node::Ints(_) | Node::Int(_) | Node::Bytes(_) | Node::Str(_) | Node::Leaf => {}
    }
    Ok(())
}

/// The tensor of a `TensorData { bytes, shape, dtype }` at `path`.
fn tensor(param: &Node, path: &str) -> Result<SavedTensor, String> {
    let shape = match param.field("shape") {
        Some(Node::Ints(dims)) => dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("tensor `{path}`: dimension {d}")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Node::Seq(items)) if items.is_empty() => Vec::new(),
        _ => return Err(format!("tensor `{path}` has no shape")),
    };
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("tensor `{path}`: shape {shape:?} overflows"))?;
    let bytes = match param.field("bytes") {
        Some(Node::Bytes(n)) => Some(*n),
        Some(Node::Ints(values)) => Some(values.len()),
        Some(Node::Seq(values)) => Some(values.len()),
        _ => None,
    };
    let width = match param.field("dtype") {
        Some(Node::Str(name)) => element_bytes(name),
        _ => None,
    };
    if let (Some(bytes), Some(width)) = (bytes, width) {
        if count.checked_mul(width) != Some(bytes) {
            return Err(format!(
                "tensor `{path}` of shape {shape:?} holds {bytes} bytes, not {count} × {width}"
            ));
        }
    }
    Ok(SavedTensor {
        path: path.to_string(),
        shape,
    })
}

/// Bytes per element of a plain burn `DType` (by its serialised name); `None` for the others
/// (quantised, booleans), whose byte counts burn checks itself.
fn element_bytes(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "Flex32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" => 1,
        _ => return None,
    })
}

/// The structure of a MessagePack document, without the contents of its byte strings (their
/// lengths only) and with lists of integers kept compact: what [`saved_tensors`] reads.
#[derive(Debug)]
enum Node {
    /// A map, in document order (keys as text).
    Map(Vec<(String, Node)>),
    /// A list of anything but only integers.
    Seq(Vec<Node>),
    /// A list of unsigned integers (a shape; bytes written as a list).
    Ints(Vec<u64>),
    /// An unsigned integer.
    Int(u64),
    /// A byte string, by its length.
    Bytes(usize),
    /// A string (a `DType`'s name, a key).
    Str(String),
    /// Anything else (nil, a boolean, a float, a negative integer).
    Leaf,
}

impl Node {
    /// The value under `key` of a map.
    fn field(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a MessagePack value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(u64::try_from(v).map_or(Node::Leaf, Node::Int))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Node, E> {
        Ok(Node::Bytes(v.len()))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        // No capacity from the document's own count: a lying count costs nothing.
        let mut ints = Vec::new();
        let mut nodes: Option<Vec<Node>> = None;
        while let Some(node) = seq.next_element::<Node>()? {
            match (&mut nodes, node) {
                (None, Node::Int(v)) => ints.push(v),
                (None, node) => {
                    let mut all: Vec<Node> = ints.drain(..).map(Node::Int).collect();
                    all.push(node);
                    nodes = Some(all);
                }
                (Some(all), node) => all.push(node),
            }
        }
        Ok(match nodes {
            Some(all) => Node::Seq(all),
            None if ints.is_empty() => Node::Seq(Vec::new()),
            None => Node::Ints(ints),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<Node, Node>()? {
            let key = match key {
                Node::Str(s) => s,
                Node::Int(i) => i.to_string(),
                _ => "?".to_string(),
            };
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}
