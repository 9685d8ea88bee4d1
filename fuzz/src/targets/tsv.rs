//! `tsv`: arbitrary bytes as a parallel corpus ([`parse_tsv`], the reader of every `xfmr
//! train --data` file), and the writer's round trip.
//!
//! Pairs that parse are non-empty and trimmed, without tabs or line breaks, and
//! [`write_tsv`] → [`read_tsv`] gives them back as they were. Pairs made directly from the
//! bytes (split at `0xFF`, so that they may hold tabs, line breaks and surrounding spaces) are
//! either refused by [`write_tsv`], naming the line, or read back exactly: the writer never
//! writes a file that reads as other pairs. Seed: the first lines of the embedded corpus.

use std::path::Path;

use xfmr_translate::data::{parse_tsv, read_tsv, write_tsv, Pair};

use super::scratch_dir;
use crate::split_field;

/// The embedded Spanish–English training split (the CLI's default data).
pub const EMBEDDED: &str = include_str!("../../../crates/xfmr-cli/data/es-en/train.tsv");

/// The target's body.
pub fn run(data: &[u8]) {
    let path = scratch_dir().join("corpus.tsv");
    if let Ok(pairs) = parse_tsv(data, Path::new("fuzz.tsv")) {
        assert!(!pairs.is_empty(), "parse_tsv gave Ok with no pair");
        for p in &pairs {
            for side in [&p.src, &p.tgt] {
                assert!(
                    !side.is_empty() && side.trim() == side && !side.contains(['\t', '\n']),
                    "parse_tsv gave the side {side:?}"
                );
            }
        }
        write_tsv(&path, &pairs).expect("pairs that were read can be written");
        assert_eq!(read_tsv(&path).expect("read back"), pairs, "round trip");
    }
    // Pairs from the raw bytes: sides alternate between 0xFF bytes.
    let mut pairs = Vec::new();
    let mut rest = data;
    while !rest.is_empty() && pairs.len() < 64 {
        let (src, after) = split_field(rest);
        let (tgt, after) = split_field(after);
        pairs.push(Pair {
            src: String::from_utf8_lossy(src).into_owned(),
            tgt: String::from_utf8_lossy(tgt).into_owned(),
        });
        rest = after;
    }
    if !pairs.is_empty() && write_tsv(&path, &pairs).is_ok() {
        assert_eq!(
            read_tsv(&path).expect("a file write_tsv wrote reads"),
            pairs,
            "write_tsv wrote a file that reads as other pairs"
        );
    }
}

/// The first 20 lines of the embedded corpus.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![seed()]
}

fn seed() -> Vec<u8> {
    EMBEDDED
        .lines()
        .take(20)
        .flat_map(|l| l.bytes().chain([b'\n']))
        .collect()
}
