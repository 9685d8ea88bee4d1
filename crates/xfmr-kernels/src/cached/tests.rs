use super::*;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A cache of `len` random positions, `d_k` wide.
fn random_cache(d_k: usize, len: usize, seed: u64) -> HeadCache {
    let (keys, vals) = (values(len * d_k, seed), values(len * d_k, seed + 1));
    let mut cache = HeadCache::with_capacity(d_k, len);
    for (k, v) in keys.chunks_exact(d_k).zip(vals.chunks_exact(d_k)) {
        cache.push(k, v);
    }
    cache
}

/// The formula in f64, one head at a time, over the first `len` positions of `cache`.
fn reference(queries: &[f32], cache: &HeadCache, len: usize, scale: f32) -> (Vec<f64>, Vec<f64>) {
    let d_k = cache.d_k();
    let (mut probs, mut outs) = (Vec::new(), Vec::new());
    for q in queries.chunks_exact(d_k) {
        let s: Vec<f64> = (0..len)
            .map(|t| {
                let k = cache.key(t);
                q.iter()
                    .zip(&k)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
        let total: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|v| v / total).collect();
        for c in 0..d_k {
            outs.push(
                (0..len)
                    .map(|t| p[t] * cache.value(t)[c] as f64)
                    .sum::<f64>(),
            );
        }
        probs.extend(p);
    }
    (probs, outs)
}

/// Every group size a tile split meets (1–9 heads), widths with and without a tail of
/// columns (88: one block of 64, one of 16 and a tail of 8; odd widths, whose last key row
/// joins the even chain), one and many positions, whole and partial key blocks, a query that
/// sees fewer positions than the cache holds (the last block's other lanes hold real keys):
/// within 1e-5 of the f64 formula (f32 sums of at most 88 products of values below 1 in
/// magnitude, then probabilities below 1), and [`cached_probabilities`] equal to the
/// probabilities [`attend_cached`] used, bit for bit.
#[test]
fn attend_cached_matches_the_formula() {
    for (group, d_k, len, seen) in [
        (1, 8, 1, 1),
        (3, 64, 37, 37),
        (3, 64, 37, 20),
        (4, 16, 5, 5),
        (5, 12, 9, 9),
        (9, 64, 70, 64),
        (2, 3, 4, 4),
        (2, 88, 7, 7),
        (3, 64, 48, 33),
    ] {
        let cache = random_cache(d_k, len, 1);
        let queries = values(group * d_k, 3);
        let scale = 1.0 / (d_k as f32).sqrt();
        let (mut scores, mut out) = (Vec::new(), vec![f32::NAN; group * d_k]);
        attend_cached(&queries, cache.view(seen), scale, &mut scores, &mut out);
        let (probs, outs) = reference(&queries, &cache, seen, scale);
        let case = format!("group {group}, d_k {d_k}, len {len}, seen {seen}");
        assert_eq!(scores.len(), probs.len(), "{case}");
        for (got, want) in scores.iter().zip(&probs).chain(out.iter().zip(&outs)) {
            assert!((*got as f64 - want).abs() < 1e-5, "{case}: {got} vs {want}");
        }
        let mut alone = Vec::new();
        cached_probabilities(&queries, cache.view(seen), scale, &mut alone);
        assert_eq!(alone, scores, "{case}");
    }
}

/// The AVX-512 and AVX2 paths equal the portable one bit for bit (where the CPU has them),
/// over a partial last block.
#[test]
fn attend_cached_is_the_same_on_every_path() {
    let (group, d_k, len) = (3, 64, 50);
    let cache = random_cache(d_k, len, 4);
    let queries = values(group * d_k, 6);
    let view = cache.view(len);
    let (mut s1, mut s2) = (Vec::new(), Vec::new());
    let (mut o1, mut o2) = (vec![0.0; group * d_k], vec![0.0; group * d_k]);
    attend_cached(&queries, view, 0.125, &mut s1, &mut o1);
    attend_with(
        FloatLevel::Portable,
        &queries,
        view,
        0.125,
        &mut s2,
        Some(&mut o2),
    );
    assert_eq!(s1, s2);
    assert_eq!(o1, o2);
    for level in FloatLevel::ALL {
        if !level.available() {
            eprintln!("attend_cached: this CPU has no {level:?}, its path is not compared");
            continue;
        }
        let (mut s3, mut o3) = (Vec::new(), vec![0.0; group * d_k]);
        attend_on(level, &queries, view, 0.125, &mut s3, Some(&mut o3));
        assert_eq!(s3, s2, "{level:?}");
        assert_eq!(o3, o2, "{level:?}");
    }
}

/// The levels agree bit for bit on every tile (1–4 heads, and 5 as a tile of 4 and one of 1),
/// odd widths (the last key row on the even chain) and widths past 64 columns of values, and
/// partial last blocks.
#[test]
fn attend_cached_is_the_same_on_every_path_for_every_tile_and_width() {
    for (group, d_k, len) in [(1, 3, 17), (2, 5, 9), (4, 65, 33), (5, 64, 20), (2, 88, 16)] {
        let cache = random_cache(d_k, len, 9);
        let queries = values(group * d_k, 10);
        let view = cache.view(len);
        let (mut want_s, mut want_o) = (Vec::new(), vec![0.0; group * d_k]);
        attend_with(
            FloatLevel::Portable,
            &queries,
            view,
            0.3,
            &mut want_s,
            Some(&mut want_o),
        );
        for level in FloatLevel::ALL.into_iter().filter(|l| l.available()) {
            let (mut s, mut o) = (Vec::new(), vec![0.0; group * d_k]);
            attend_on(level, &queries, view, 0.3, &mut s, Some(&mut o));
            let case = format!("{level:?}, group {group}, d_k {d_k}, len {len}");
            assert_eq!(s, want_s, "{case}");
            assert_eq!(o, want_o, "{case}");
        }
    }
}

/// The lanes of the last block past `len` are never part of a result: NaN there changes
/// nothing (the view of the first 20 of 32 positions, the other 12 keys NaN, against the
/// first 20 alone).
#[test]
fn attend_cached_ignores_the_lanes_past_len() {
    let (group, d_k) = (3, 8);
    let clean = random_cache(d_k, 20, 11);
    let mut poisoned = clean.clone();
    for _ in 20..32 {
        poisoned.push(&[f32::NAN; 8], &[f32::NAN; 8]);
    }
    let queries = values(group * d_k, 12);
    let (mut s1, mut s2) = (Vec::new(), Vec::new());
    let (mut o1, mut o2) = (vec![0.0; group * d_k], vec![0.0; group * d_k]);
    attend_cached(&queries, clean.view(20), 0.5, &mut s1, &mut o1);
    attend_cached(&queries, poisoned.view(20), 0.5, &mut s2, &mut o2);
    assert_eq!(s1, s2);
    assert_eq!(o1, o2);
    assert!(o1.iter().all(|v| v.is_finite()));
}

/// A cache shorter than the head claims is refused before anything is read.
#[test]
#[should_panic(expected = "positions need")]
fn attend_cached_checks_the_cache() {
    let keys = vec![0.0; 16 * 4];
    let cache = CachedHead {
        keys: &keys,
        values: &keys[..8],
        d_k: 4,
        len: 3,
    };
    attend_cached(&[0.0; 4], cache, 1.0, &mut Vec::new(), &mut [0.0; 4]);
}

/// What goes in comes out: keys and values by position across blocks, a truncation and a
/// copied prefix that then grow again as a cache fed those positions would, a reserved copy.
#[test]
fn head_cache_keeps_positions_across_blocks() {
    let d_k = 5;
    let (keys, vals) = (values(40 * d_k, 7), values(40 * d_k, 8));
    let mut cache = HeadCache::with_capacity(d_k, 40);
    let capacity = cache.capacity();
    assert!(capacity >= 40, "room for {capacity}");
    for t in 0..40 {
        cache.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(cache.capacity(), capacity, "grew within its room");
    assert_eq!(cache.len(), 40);
    assert_eq!(
        cache.bytes(),
        (48 + 40) * d_k * 4,
        "three blocks of keys, 40 values"
    );
    for t in 0..40 {
        assert_eq!(cache.key(t), &keys[t * d_k..][..d_k], "key {t}");
        assert_eq!(cache.value(t), &vals[t * d_k..][..d_k], "value {t}");
    }
    // A prefix copied, then the same positions fed again: the same cache.
    let mut prefix = HeadCache::with_capacity(d_k, 40);
    prefix.copy_prefix(&cache, 21);
    assert_eq!(prefix.len(), 21);
    for t in 21..40 {
        prefix.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(prefix, cache);
    // Truncated inside a block (its dropped lanes zeroed), then fed again: equal to a cache
    // fed those positions alone.
    let mut short = cache.clone();
    short.truncate(20);
    let mut fresh = HeadCache::with_capacity(d_k, 40);
    for t in 0..20 {
        fresh.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(short, fresh);
    let mut restored = HeadCache::with_capacity(d_k, 40);
    restored.copy_prefix(&cache, 20);
    assert_eq!(restored, fresh);
    let mut cut = cache.copy_reserved();
    assert_eq!(cut.capacity(), capacity);
    cut.truncate(16);
    assert_eq!((cut.len(), cut.bytes()), (16, 32 * d_k * 4));
    for t in 16..40 {
        cut.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(cut, cache);
}
