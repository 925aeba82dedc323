//! Seeded random order: the permutation of a pass and the draws of the shuffle buffer.
//!
//! Both come from SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014; the seeding generator of Java's `SplittableRandom` and of
//! xoshiro): its n-th output is `mix(key + (n + 1) * GAMMA)`, a pure function of the key and
//! n, so a position in the stream is just a count and a resumed run draws the same numbers.
//! Written here rather than taken from `rand`, whose `shuffle` and `gen_range` algorithms
//! are not promised to stay the same across versions: the data order of a seed must not
//! change with a dependency update (the golden losses and every paired comparison rest on it).
//!
//! A draw below `n` is Lemire's multiply-shift (`(x * n) >> 64`, "Fast random integer
//! generation in an interval", TOMACS 2019) without the rejection step: its bias is at most
//! `n / 2^64` (below 1e-12 for any corpus), far under what any data order could show.

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (variant 13 of Stafford's mixers).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stream of random 64-bit words, `key` naming it: `word(key, n)` is its n-th word.
pub(crate) fn word(key: u64, n: u64) -> u64 {
    mix(key.wrapping_add(n.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A draw in `0..bound` from the n-th word of stream `key` (`bound > 0`).
pub(crate) fn below(key: u64, n: u64, bound: u64) -> u64 {
    ((word(key, n) as u128 * bound as u128) >> 64) as u64
}

/// What a stream of draws is for: each purpose gets its own key from the seed, so the row
/// order, the shard order and the buffer's draws are unrelated even under one seed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purpose {
    /// The permutation of a pass's rows (in-memory mode).
    Rows = 1,
    /// The permutation of a pass's shards (streaming mode).
    Shards = 2,
    /// The shuffle buffer's slot draws (streaming mode).
    Buffer = 3,
}

/// The key of `purpose`'s stream for `seed` and pass `epoch` (the buffer's draws use epoch 0:
/// one stream for the whole run).
pub(crate) fn key(seed: u64, purpose: Purpose, epoch: u64) -> u64 {
    word(word(seed, purpose as u64), epoch)
}

/// A permutation of `0..n` (Fisher-Yates, Knuth's Algorithm P, from the top), the same for
/// the same `key` on every machine.
pub(crate) fn permutation(n: usize, key: u64) -> Vec<u32> {
    assert!(n <= u32::MAX as usize, "a permutation of {n} items");
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = below(key, i as u64, i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_outputs() {
        // The first outputs of the reference SplitMix64 (Vigna's splitmix64.c) seeded with
        // 1234567: 6457827717110365317, 3203168211198807973, 9817491932198370423.
        assert_eq!(word(1234567, 0), 6457827717110365317);
        assert_eq!(word(1234567, 1), 3203168211198807973);
        assert_eq!(word(1234567, 2), 9817491932198370423);
    }

    #[test]
    fn permutations_hold_every_index_once_and_depend_on_the_key() {
        let a = permutation(1000, key(0, Purpose::Rows, 0));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
        assert_eq!(a, permutation(1000, key(0, Purpose::Rows, 0)), "same key, same order");
        assert_ne!(a, permutation(1000, key(0, Purpose::Rows, 1)), "another pass, another order");
        assert_ne!(a, permutation(1000, key(1, Purpose::Rows, 0)), "another seed, another order");
        assert_ne!(a, permutation(1000, key(0, Purpose::Shards, 0)), "another purpose, another order");
        // far from the identity: a uniform permutation fixes 1 point on average
        assert!(a.iter().enumerate().filter(|&(i, &x)| i as u32 == x).count() < 8);
        assert!(permutation(0, 5).is_empty() && permutation(1, 5) == vec![0]);
    }

    #[test]
    fn draws_below_a_bound_are_uniform() {
        // 64 bins, 64,000 draws: chi-square with 63 degrees of freedom; its 99.9% point is 103.4
        let (bins, n) = (64u64, 64_000u64);
        let mut count = vec![0f64; bins as usize];
        for i in 0..n {
            count[below(key(3, Purpose::Buffer, 0), i, bins) as usize] += 1.0;
        }
        let e = n as f64 / bins as f64;
        let chi2: f64 = count.iter().map(|c| (c - e) * (c - e) / e).sum();
        assert!(chi2 < 103.4, "chi-square {chi2}");
        // and every position of a permutation of 5 sees every value about equally often
        let mut at0 = [0u32; 5];
        for k in 0..5000 {
            at0[permutation(5, key(k, Purpose::Rows, 0))[0] as usize] += 1;
        }
        assert!(at0.iter().all(|&c| (900..1100).contains(&c)), "{at0:?}");
    }
}
