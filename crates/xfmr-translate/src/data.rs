//! Parallel text: reading and writing `source<TAB>target` files, and splitting them without
//! leaking near-duplicates across splits (the trainer batches them by token count:
//! `xfmr_train::data`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// What can be wrong with a corpus.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DataError {
    /// The file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error: in the message, and not also the error's `source()` (which a reporter
        /// such as anyhow's `{:#}` would print a second time).
        error: std::io::Error,
    },
    /// A line that is not `source<TAB>target` with both sides non-empty.
    #[error("{}:{line}: {problem}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A file without a single pair.
    #[error("{}: no sentence pairs", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Split sizes that leave no training pairs.
    #[error("cannot hold out {valid} + {test} pairs from {total}")]
    SplitTooLarge {
        /// Requested validation pairs.
        valid: usize,
        /// Requested test pairs.
        test: usize,
        /// Pairs in the corpus.
        total: usize,
    },
}

/// One sentence pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// Source sentence.
    pub src: String,
    /// Target sentence (the reference translation).
    pub tgt: String,
}

/// Reads a UTF-8 TSV file of `source<TAB>target` lines (no header; a final newline optional;
/// `\r\n` accepted; a byte-order mark at the start, as some editors write, skipped).
///
/// # Errors
/// [`DataError::Io`], [`DataError::Malformed`] naming the line (not UTF-8, no tab, more than
/// one tab, an empty side), or [`DataError::Empty`].
pub fn read_tsv(path: &Path) -> Result<Vec<Pair>, DataError> {
    let bytes = std::fs::read(path).map_err(|error| DataError::Io {
        path: path.to_owned(),
        error,
    })?;
    parse_tsv(&bytes, path)
}

/// [`read_tsv`], with each pair's 1-based line number in the file (blank lines are skipped, so
/// the numbers need not be consecutive): what an error about one pair names.
///
/// # Errors
/// As [`read_tsv`].
pub fn read_tsv_numbered(path: &Path) -> Result<Vec<(usize, Pair)>, DataError> {
    let bytes = std::fs::read(path).map_err(|error| DataError::Io {
        path: path.to_owned(),
        error,
    })?;
    parse_tsv_numbered(&bytes, path)
}

/// Parses TSV bytes as [`read_tsv`] does; `path` names the source in errors.
///
/// # Errors
/// As [`read_tsv`], except I/O.
pub fn parse_tsv(bytes: &[u8], path: &Path) -> Result<Vec<Pair>, DataError> {
    Ok(parse_tsv_numbered(bytes, path)?
        .into_iter()
        .map(|(_, pair)| pair)
        .collect())
}

/// The UTF-8 byte-order mark, skipped at the start of a text file.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// [`parse_tsv`], with each pair's 1-based line number ([`read_tsv_numbered`]).
///
/// # Errors
/// As [`read_tsv`], except I/O.
pub fn parse_tsv_numbered(bytes: &[u8], path: &Path) -> Result<Vec<(usize, Pair)>, DataError> {
    let bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes);
    let malformed = |line: usize, problem: String| DataError::Malformed {
        path: path.to_owned(),
        line,
        problem,
    };
    let mut pairs = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.is_empty() {
            continue;
        }
        let line =
            std::str::from_utf8(raw).map_err(|e| malformed(line_no, format!("not UTF-8 ({e})")))?;
        let mut fields = line.split('\t');
        let (src, tgt) = match (fields.next(), fields.next(), fields.next()) {
            (Some(s), Some(t), None) => (s.trim(), t.trim()),
            (_, None, _) => {
                return Err(malformed(
                    line_no,
                    "no tab between source and target".into(),
                ))
            }
            _ => return Err(malformed(line_no, "more than one tab".into())),
        };
        if src.is_empty() || tgt.is_empty() {
            let side = if src.is_empty() { "source" } else { "target" };
            return Err(malformed(line_no, format!("empty {side}")));
        }
        pairs.push((
            line_no,
            Pair {
                src: src.to_owned(),
                tgt: tgt.to_owned(),
            },
        ));
    }
    if pairs.is_empty() {
        return Err(DataError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(pairs)
}

/// Writes pairs as TSV (atomically: a temporary file, then a rename). [`read_tsv`] reads the
/// file back as exactly these pairs: a pair it would read otherwise (a side that is empty,
/// holds a tab or a line break, or begins or ends with white space, which the reader trims) is
/// refused before anything is written.
///
/// # Errors
/// [`DataError::Malformed`] naming the line the pair would have been written on and the side;
/// [`DataError::Io`] naming the file.
pub fn write_tsv(path: &Path, pairs: &[Pair]) -> Result<(), DataError> {
    for (i, p) in pairs.iter().enumerate() {
        for (side, text) in [("source", &p.src), ("target", &p.tgt)] {
            let problem = if text.is_empty() {
                "is empty"
            } else if text.contains(['\t', '\n']) {
                "holds a tab or a line break"
            } else if text.trim() != text {
                "begins or ends with white space"
            } else {
                continue;
            };
            return Err(DataError::Malformed {
                path: path.to_owned(),
                line: i + 1,
                problem: format!("the {side} {problem}: TSV cannot hold it as it is"),
            });
        }
    }
    let mut text = String::new();
    for p in pairs {
        text.push_str(&p.src);
        text.push('\t');
        text.push_str(&p.tgt);
        text.push('\n');
    }
    xfmr_io::write_atomic(path, text.as_bytes()).map_err(|e| DataError::Io {
        path: e.path,
        error: std::io::Error::other(e.message),
    })
}

/// Training, validation and test pairs.
#[derive(Debug, Clone, Default)]
pub struct Splits {
    /// Pairs to train on.
    pub train: Vec<Pair>,
    /// Pairs for validation loss during training.
    pub valid: Vec<Pair>,
    /// Held-out pairs for the final BLEU.
    pub test: Vec<Pair>,
}

/// The key two sentences share when they are near-duplicates: letters and digits only,
/// lower-cased ("And the LORD spake unto Moses, saying," and "and the Lord spake unto Moses
/// saying" share it).
pub fn near_duplicate_key(sentence: &str) -> String {
    sentence
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Splits `pairs` into about `valid` validation and `test` test pairs and the rest for
/// training, deterministically for a `seed`. Pairs whose source *or* target are
/// near-duplicates ([`near_duplicate_key`]) are grouped (transitively) and a group goes to one
/// split only, so no test sentence was seen in training under another punctuation. The held-out
/// splits may exceed the asked sizes by less than one group.
///
/// # Errors
/// [`DataError::SplitTooLarge`] if nothing would be left for training.
pub fn split(pairs: Vec<Pair>, valid: usize, test: usize, seed: u64) -> Result<Splits, DataError> {
    let total = pairs.len();
    if valid + test >= total {
        return Err(DataError::SplitTooLarge { valid, test, total });
    }
    // Union-find over pairs sharing a source key or a target key.
    let mut parent: Vec<usize> = (0..total).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut seen: HashMap<(bool, String), usize> = HashMap::new();
    for (i, p) in pairs.iter().enumerate() {
        for key in [
            (false, near_duplicate_key(&p.src)),
            (true, near_duplicate_key(&p.tgt)),
        ] {
            match seen.get(&key) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    seen.insert(key, i);
                }
            }
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..total {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    // Groups in a seeded random order (sorted first so the order does not depend on hashing).
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    groups.sort_by_key(|g| g[0]);
    let mut rng = SplitMix64(seed);
    for i in (1..groups.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        groups.swap(i, j);
    }
    let mut target = vec![0u8; total];
    let (mut n_test, mut n_valid) = (0, 0);
    for g in &groups {
        let side = if n_test < test {
            n_test += g.len();
            2
        } else if n_valid < valid {
            n_valid += g.len();
            1
        } else {
            0
        };
        for &i in g {
            target[i] = side;
        }
    }
    let mut splits = Splits::default();
    for (p, side) in pairs.into_iter().zip(target) {
        match side {
            2 => splits.test.push(p),
            1 => splits.valid.push(p),
            _ => splits.train.push(p),
        }
    }
    Ok(splits)
}

/// splitmix64: a tiny generator specified bit for bit, for reproducible splits and shuffles
/// (the stream of [`xfmr_kernels::splitmix64`], the workspace's one copy, whose state is the
/// field).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        xfmr_kernels::splitmix64(&mut self.0)
    }
}
