//! Corpus reading errors, the near-duplicate-aware split and token-count batches.

use std::path::Path;

use xfmr_train::data::{
    near_duplicate_key, parse_tsv, read_tsv, shuffled, split, token_batches, DataError, Pair,
};

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

/// Every pair is in exactly one batch; no batch's padded size exceeds the budget unless it is a
/// single over-long pair; batches hold pairs of similar length.
#[test]
fn token_batches_respect_the_budget() {
    let lengths: Vec<(usize, usize)> = (0..500)
        .map(|i| (3 + (i * 7) % 40, 2 + (i * 13) % 50))
        .collect();
    let mut with_long = lengths.clone();
    with_long.push((300, 10));
    let budget = 400;
    let batches = token_batches(&with_long, budget);
    let mut seen = vec![0; with_long.len()];
    for b in &batches {
        let widest = b
            .iter()
            .map(|&i| with_long[i].0.max(with_long[i].1))
            .max()
            .unwrap();
        assert!(
            b.len() * widest <= budget || b.len() == 1,
            "batch of {} × {widest}",
            b.len()
        );
        for &i in b {
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1));
    // Sorted by length, the batches are far fuller than a random grouping would be.
    let padded: usize = batches
        .iter()
        .map(|b| {
            b.len()
                * b.iter()
                    .map(|&i| with_long[i].0.max(with_long[i].1))
                    .max()
                    .unwrap()
        })
        .sum();
    let real: usize = with_long.iter().map(|l| l.0.max(l.1)).sum();
    assert!(real as f64 / padded as f64 > 0.8, "fill {real}/{padded}");

    let a = shuffled(batches.len(), 1, 3);
    assert_eq!(a, shuffled(batches.len(), 1, 3));
    assert_ne!(a, shuffled(batches.len(), 1, 4));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..batches.len()).collect::<Vec<_>>());
}
