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

/// Both precisions a cache can keep.
const PRECISIONS: [CachePrecision; 2] = [CachePrecision::F32, CachePrecision::F16];

/// A cache of `len` random positions, `d_k` wide, in `precision`.
fn random_cache(d_k: usize, len: usize, seed: u64, precision: CachePrecision) -> HeadCache {
    let (keys, vals) = (values(len * d_k, seed), values(len * d_k, seed + 1));
    let mut cache = HeadCache::with_capacity(d_k, len, precision);
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
/// probabilities [`attend_cached`] used, bit for bit; in both precisions (the formula over the
/// values as cached).
#[test]
fn attend_cached_matches_the_formula() {
    for precision in PRECISIONS {
        formula_cases(precision);
    }
}

fn formula_cases(precision: CachePrecision) {
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
        let cache = random_cache(d_k, len, 1, precision);
        let queries = values(group * d_k, 3);
        let scale = 1.0 / (d_k as f32).sqrt();
        let (mut scores, mut out) = (Vec::new(), vec![f32::NAN; group * d_k]);
        attend_cached(&queries, cache.view(seen), scale, &mut scores, &mut out);
        let (probs, outs) = reference(&queries, &cache, seen, scale);
        let case = format!("{precision:?}, group {group}, d_k {d_k}, len {len}, seen {seen}");
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
/// over a partial last block, in both precisions.
#[test]
fn attend_cached_is_the_same_on_every_path() {
    let (group, d_k, len) = (3, 64, 50);
    for precision in PRECISIONS {
        let cache = random_cache(d_k, len, 4, precision);
        let queries = values(group * d_k, 6);
        let view = cache.view(len);
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let (mut o1, mut o2) = (vec![0.0; group * d_k], vec![0.0; group * d_k]);
        attend_cached(&queries, view, 0.125, &mut s1, &mut o1);
        let portable = FloatLevel::Portable;
        attend_on(portable, &queries, view, 0.125, &mut s2, Some(&mut o2));
        assert_eq!(s1, s2, "{precision:?}");
        assert_eq!(o1, o2, "{precision:?}");
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("attend_cached: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let (mut s3, mut o3) = (Vec::new(), vec![0.0; group * d_k]);
            attend_on(level, &queries, view, 0.125, &mut s3, Some(&mut o3));
            assert_eq!(s3, s2, "{precision:?}, {level:?}");
            assert_eq!(o3, o2, "{precision:?}, {level:?}");
        }
    }
}

/// The levels agree bit for bit on every tile (1–4 heads, and 5 as a tile of 4 and one of 1),
/// odd widths (the last key row on the even chain) and widths past 64 columns of values, and
/// partial last blocks, in both precisions.
#[test]
fn attend_cached_is_the_same_on_every_path_for_every_tile_and_width() {
    let shapes = [(1, 3, 17), (2, 5, 9), (4, 65, 33), (5, 64, 20), (2, 88, 16)];
    for (precision, (group, d_k, len)) in
        PRECISIONS.into_iter().flat_map(|p| shapes.map(|s| (p, s)))
    {
        let cache = random_cache(d_k, len, 9, precision);
        let queries = values(group * d_k, 10);
        let view = cache.view(len);
        let (mut want_s, mut want_o) = (Vec::new(), vec![0.0; group * d_k]);
        let portable = FloatLevel::Portable;
        attend_on(
            portable,
            &queries,
            view,
            0.3,
            &mut want_s,
            Some(&mut want_o),
        );
        for level in FloatLevel::ALL.into_iter().filter(|l| l.available()) {
            let (mut s, mut o) = (Vec::new(), vec![0.0; group * d_k]);
            attend_on(level, &queries, view, 0.3, &mut s, Some(&mut o));
            let case = format!("{precision:?}, {level:?}, group {group}, d_k {d_k}, len {len}");
            assert_eq!(s, want_s, "{case}");
            assert_eq!(o, want_o, "{case}");
        }
    }
}

/// The lanes of the last block past `len` are never part of a result: NaN there changes
/// nothing (the view of the first 20 of 32 positions, the other 12 keys NaN, against the
/// first 20 alone), in both precisions.
#[test]
fn attend_cached_ignores_the_lanes_past_len() {
    let (group, d_k) = (3, 8);
    for precision in PRECISIONS {
        let clean = random_cache(d_k, 20, 11, precision);
        let mut poisoned = clean.clone();
        for _ in 20..32 {
            poisoned.push(&[f32::NAN; 8], &[f32::NAN; 8]);
        }
        let queries = values(group * d_k, 12);
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let (mut o1, mut o2) = (vec![0.0; group * d_k], vec![0.0; group * d_k]);
        attend_cached(&queries, clean.view(20), 0.5, &mut s1, &mut o1);
        attend_cached(&queries, poisoned.view(20), 0.5, &mut s2, &mut o2);
        assert_eq!(s1, s2, "{precision:?}");
        assert_eq!(o1, o2, "{precision:?}");
        assert!(o1.iter().all(|v| v.is_finite()), "{precision:?}");
    }
}

/// A cache shorter than the head claims is refused before anything is read.
#[test]
#[should_panic(expected = "positions need")]
fn attend_cached_checks_the_cache() {
    let keys = vec![half::f16::ZERO; 16 * 4];
    let cache = CachedHead {
        keys: &keys,
        values: &keys[..8],
        d_k: 4,
        len: 3,
    };
    attend_cached(&[0.0; 4], cache.into(), 1.0, &mut Vec::new(), &mut [0.0; 4]);
}

/// A prefix is copied only between caches of one precision.
#[test]
#[should_panic(expected = "a cache of F16 from one of F32")]
fn head_cache_copies_prefixes_of_its_own_precision() {
    let from = random_cache(4, 3, 1, CachePrecision::F32);
    HeadCache::with_capacity(4, 3, CachePrecision::F16).copy_prefix(&from, 3);
}

/// What goes in comes out: keys and values by position across blocks, a truncation and a
/// copied prefix that then grow again as a cache fed those positions would, a reserved copy;
/// in both precisions (`f32` exactly what was pushed, `f16` each element rounded).
#[test]
fn head_cache_keeps_positions_across_blocks() {
    for precision in PRECISIONS {
        keeps_positions(precision);
    }
}

fn keeps_positions(precision: CachePrecision) {
    let d_k = 5;
    let (keys, vals) = (values(40 * d_k, 7), values(40 * d_k, 8));
    let mut cache = HeadCache::with_capacity(d_k, 40, precision);
    let capacity = cache.capacity();
    assert!(capacity >= 40, "room for {capacity}");
    for t in 0..40 {
        cache.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(cache.capacity(), capacity, "grew within its room");
    assert_eq!(cache.len(), 40);
    assert_eq!(cache.precision(), precision);
    let size = precision.bytes();
    assert_eq!(
        cache.bytes(),
        (48 + 40) * d_k * size,
        "three blocks of keys, 40 values, {precision:?} each"
    );
    let rounded = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| match precision {
                CachePrecision::F32 => v,
                CachePrecision::F16 => half::f16::from_f32(v).to_f32(),
            })
            .collect()
    };
    for t in 0..40 {
        assert_eq!(cache.key(t), rounded(&keys[t * d_k..][..d_k]), "key {t}");
        assert_eq!(
            cache.value(t),
            rounded(&vals[t * d_k..][..d_k]),
            "value {t}"
        );
    }
    // A prefix copied, then the same positions fed again: the same cache.
    let mut prefix = HeadCache::with_capacity(d_k, 40, precision);
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
    let mut fresh = HeadCache::with_capacity(d_k, 40, precision);
    for t in 0..20 {
        fresh.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(short, fresh);
    let mut restored = HeadCache::with_capacity(d_k, 40, precision);
    restored.copy_prefix(&cache, 20);
    assert_eq!(restored, fresh);
    let mut cut = cache.copy_reserved();
    assert_eq!(cut.capacity(), capacity);
    cut.truncate(16);
    assert_eq!((cut.len(), cut.bytes()), (16, 32 * d_k * size));
    for t in 16..40 {
        cut.push(&keys[t * d_k..][..d_k], &vals[t * d_k..][..d_k]);
    }
    assert_eq!(cut, cache);
}

/// The cache keeps `f16`: each key and value element is the `f32` pushed rounded to the
/// nearest `f16` (a relative error of at most 2⁻¹¹ in the normal range; exact where the value
/// is an `f16`), and attention over it is the formula over those rounded values
/// (`attend_cached_matches_the_formula`), within 2⁻¹¹ of the formula over the unrounded ones
/// for values below 1 (here within 1e-3).
#[test]
fn head_cache_holds_keys_and_values_as_f16() {
    let d_k = 64;
    let (keys, vals) = (values(33 * d_k, 21), values(33 * d_k, 22));
    let mut cache = HeadCache::with_capacity(d_k, 33, CachePrecision::F16);
    for (k, v) in keys.chunks_exact(d_k).zip(vals.chunks_exact(d_k)) {
        cache.push(k, v);
    }
    for t in 0..33 {
        for (got, want) in cache.key(t).iter().zip(&keys[t * d_k..][..d_k]) {
            assert!((got - want).abs() <= want.abs() * 2f32.powi(-11) + 2f32.powi(-25));
            assert_eq!(*got, half::f16::from_f32(*want).to_f32());
        }
    }
    cache.push(&[0.5; 64], &[-3.0; 64]);
    assert_eq!(cache.key(33), vec![0.5; 64]);
    assert_eq!(cache.value(33), vec![-3.0; 64]);
    // Against the formula in f64 over the values as pushed (not rounded).
    let queries = values(3 * d_k, 23);
    let (mut scores, mut out) = (Vec::new(), vec![0.0; 3 * d_k]);
    attend_cached(&queries, cache.view(33), 0.125, &mut scores, &mut out);
    for (j, q) in queries.chunks_exact(d_k).enumerate() {
        let s: Vec<f64> = (0..33)
            .map(|t| {
                let k = &keys[t * d_k..][..d_k];
                q.iter()
                    .zip(k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    * 0.125
            })
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
        let total: f64 = e.iter().sum();
        for c in 0..d_k {
            let want: f64 = (0..33)
                .map(|t| e[t] / total * f64::from(vals[t * d_k + c]))
                .sum();
            let got = f64::from(out[j * d_k + c]);
            assert!(
                (got - want).abs() < 1e-3,
                "head {j}, column {c}: {got} vs {want}"
            );
        }
    }
}
