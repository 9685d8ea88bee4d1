//! Corpus reading errors and the near-duplicate-aware split.

use std::path::Path;

use xfmr_translate::data::{near_duplicate_key, parse_tsv, read_tsv, split, DataError, Pair};

fn pair(src: &str, tgt: &str) -> Pair {
    Pair {
        src: src.into(),
        tgt: tgt.into(),
    }
}

#[test]
fn tsv_errors_name_the_file_and_line() {
    let path = Path::new("corpus.tsv");
    let ok = parse_tsv(b"hola\thello\r\n\nadios\tgoodbye", path).unwrap();
    assert_eq!(ok, vec![pair("hola", "hello"), pair("adios", "goodbye")]);

    let line_of = |bytes: &[u8]| match parse_tsv(bytes, path) {
        Err(DataError::Malformed {
            path,
            line,
            problem,
        }) => {
            assert_eq!(path, Path::new("corpus.tsv"));
            (line, problem)
        }
        other => panic!("expected Malformed, got {other:?}"),
    };
    assert_eq!(
        line_of(b"a\tb\nno tab here\n"),
        (2, "no tab between source and target".into())
    );
    assert_eq!(line_of(b"a\tb\tc\n"), (1, "more than one tab".into()));
    assert_eq!(line_of(b"a\tb\n\nc\t \n"), (3, "empty target".into()));
    let (line, problem) = line_of(b"a\tb\n\xff\xfe\tx\n");
    assert_eq!(line, 2);
    assert!(problem.starts_with("not UTF-8"), "{problem}");

    assert!(matches!(
        parse_tsv(b"\n\n", path),
        Err(DataError::Empty { .. })
    ));
    match read_tsv(Path::new("/nonexistent/corpus.tsv")) {
        Err(e @ DataError::Io { .. }) => {
            assert!(e.to_string().starts_with("/nonexistent/corpus.tsv"));
            // The OS message is in the text, and not also the `source()` that a reporter
            // (anyhow's `{:#}`, the CLI's) would print after it a second time.
            assert!(std::error::Error::source(&e).is_none(), "{e:?}");
            assert_eq!(e.to_string().matches("os error").count(), 1, "{e}");
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

/// Near-duplicates (same words up to case and punctuation, on either side) land in one split;
/// every pair lands in exactly one; the same seed gives the same split.
#[test]
fn split_keeps_near_duplicates_together() {
    let mut pairs = Vec::new();
    for i in 0..200 {
        pairs.push(pair(
            &format!("frase {i}"),
            &format!("sentence number {i}."),
        ));
    }
    // A refrain repeated with different punctuation, and a source repeated with another target.
    for i in 0..6 {
        let p = if i % 2 == 0 { "," } else { "" };
        pairs.push(pair(
            &format!("Y habló Jehová a Moisés{p} diciendo {i}"),
            &format!("And the LORD spake unto Moses{p} saying"),
        ));
    }
    pairs.push(pair("frase 7", "a different rendering of seven"));
    let total = pairs.len();
    let splits = split(pairs.clone(), 20, 30, 42).unwrap();
    assert_eq!(
        splits.train.len() + splits.valid.len() + splits.test.len(),
        total
    );
    assert!(splits.test.len() >= 30 && splits.valid.len() >= 20);

    let side_of = |p: &Pair| {
        [&splits.train, &splits.valid, &splits.test]
            .iter()
            .position(|s| s.contains(p))
            .unwrap()
    };
    let refrain: Vec<usize> = pairs
        .iter()
        .filter(|p| p.tgt.contains("Moses"))
        .map(side_of)
        .collect();
    assert!(
        refrain.windows(2).all(|w| w[0] == w[1]),
        "refrain split: {refrain:?}"
    );
    assert_eq!(
        side_of(&pairs[7]),
        side_of(&pairs[total - 1]),
        "shared source split"
    );

    let again = split(pairs, 20, 30, 42).unwrap();
    assert_eq!(again.test, splits.test);
    assert_eq!(
        near_duplicate_key("  And the LORD spake, unto Moses!"),
        "and the lord spake unto moses"
    );
    assert!(matches!(
        split(vec![pair("a", "b")], 1, 0, 0),
        Err(DataError::SplitTooLarge { .. })
    ));
}
