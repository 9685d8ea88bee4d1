//! Token-count batches and the seeded order of each epoch's batches.

use xfmr_train::data::{shuffled, token_batches};

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
