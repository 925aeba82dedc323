//! Int8 block-wise dynamic quantization, as in 8-bit Adam (Dettmers et al., "8-bit
//! Optimizers via Block-wise Quantization", ICLR 2022; bitsandbytes `create_dynamic_map`).
//!
//! Each block of B elements stores `absmax` (FP32) and one byte per element: the index of a
//! value of a fixed 256-entry *dynamic tree* map over [-1, 1] (signed, for m) or [0, 1]
//! (unsigned, for v) next to `n = x * (1 / absmax)` (the reciprocal once per block, then one
//! multiplication per element, as bitsandbytes' `kQuantizeBlockwise`; see [`normalizer`] for
//! blocks with absmax below 2^-100, whose reciprocal could overflow). `absmax * (1 / absmax)`
//! may be 1 - 2^-24, so stochastic rounding can store a block's largest element one map step
//! low (probability ~1e-5 per block). The map has 7 decades (10^-6 .. 1) with a growing
//! number of linear fraction steps per decade, plus 0 and 1. The grid is not relative to the
//! value, so the closed-form stall theory (which assumes a constant eps) does not apply.
//!
//! Rounding: the neighbours `t[i] <= n < t[i+1]` are found through a bucket table (below);
//! nearest picks the closer one (ties to the even index); stochastic picks `t[i+1]` when
//! `u * (t[i+1] - t[i]) < n - t[i]` for `u` uniform on the 24-bit grid of [0, 1) (probability
//! `(n - t[i]) / (t[i+1] - t[i])` up to FP32 rounding of the two sides, without a division).
//! A value on the map (`n = t[i]`) stays. All FP32 operations are single correctly-rounded
//! IEEE operations, so the CUDA port (which receives these same tables) is bit-identical.
//!
//! Bucket table: `|n|` in [2^-[`OCTAVES`], 1) is cut into [`BUCKETS`] buckets,
//! 2^[`SUB_BITS`] per octave, indexed by the FP32 bits of `|n|` (exponent and top fraction
//! bits; smaller `|n|` fall into bucket 0), one set for each sign. A bucket stores the
//! largest `i` with `t[i]` at or below every `n` of the bucket; the search then steps up
//! while `t[i + 1] <= n` (at most [`MAX_STEPS`] steps on these maps). The index found is the
//! unique `i` with `t[i] <= n < t[i+1]`, the one a binary search finds (tested).

use super::rounding::Rounding;
use std::sync::OnceLock;

/// Octaves of `|n|` that the bucket table resolves: [2^-26, 1) (the smallest non-zero map
/// magnitude is 3.25e-7, about 2^-21.6).
pub const OCTAVES: u32 = 26;
/// Buckets per octave: 2^SUB_BITS (the top fraction bits of `|n|`).
pub const SUB_BITS: u32 = 6;
/// Buckets per sign. `INT8_OCTAVES` / `INT8_SUB_BITS` of `kernels/optim/int8.cuh` must agree
/// (`cuda_parity` fails otherwise).
pub const BUCKETS: usize = (OCTAVES as usize) << SUB_BITS;
/// FP32 bits of 2^-OCTAVES: bucket i > 0 starts at these bits plus i bucket widths.
const LOWEST_BITS: u32 = (127 - OCTAVES) << 23;
/// Most upward steps the bucket search takes on either map (`bucket_search_matches_binary_search`).
pub const MAX_STEPS: usize = 2;

/// A 256-entry dynamic map: the sorted values and the bucket table of its search.
/// `map[i]` is the value of code `i`.
pub struct DynamicMap {
    values: [f32; 256],
    /// `starts[bucket(n)]`: BUCKETS entries for `n >= 0`, then BUCKETS for `n < 0`.
    starts: Vec<u8>,
    zero: u8,
}

impl std::ops::Index<usize> for DynamicMap {
    type Output = f32;
    fn index(&self, i: usize) -> &f32 {
        &self.values[i]
    }
}

/// The sorted 256-entry dynamic map (bitsandbytes `create_dynamic_map(signed, 7, 8)`).
pub fn dynamic_map(signed: bool) -> &'static DynamicMap {
    static SIGNED: OnceLock<DynamicMap> = OnceLock::new();
    static UNSIGNED: OnceLock<DynamicMap> = OnceLock::new();
    let cell = if signed { &SIGNED } else { &UNSIGNED };
    cell.get_or_init(|| DynamicMap::new(build_map(signed)))
}

/// Bucket of `n` (not NaN, `|n| < 1`): the index into [`DynamicMap::bucket_starts`].
#[inline(always)]
pub fn bucket(n: f32) -> usize {
    let i = ((n.abs().to_bits().saturating_sub(LOWEST_BITS)) >> (23 - SUB_BITS)) as usize;
    i.min(BUCKETS - 1) + if n < 0.0 { BUCKETS } else { 0 }
}

/// Multipliers `(pre, inv)` that normalize a block: `n = (x * pre) * inv` (two FP32
/// multiplications, left to right). `pre = 1`, `inv = 1 / absmax` (the bitsandbytes form),
/// except below `absmax = 2^-100`, where `1 / absmax` could overflow (from 2^-128 on):
/// there `pre = 2^64` (exact on any `|x| <= absmax`) and `inv = 1 / (absmax * 2^64)`.
/// `absmax` is positive and finite (1 for an all-zero block).
#[inline]
pub fn normalizer(absmax: f32) -> (f32, f32) {
    let pre = if absmax < TINY_ABSMAX { f32::from_bits((127 + 64) << 23) } else { 1.0 };
    (pre, 1.0 / (absmax * pre))
}

/// 2^-100: below this absmax, [`normalizer`] pre-scales by 2^64 (`int8_pre` in
/// kernels/optim/int8.cuh).
pub const TINY_ABSMAX: f32 = f32::from_bits((127 - 100) << 23);

/// Smallest `|n|` of bucket `i < BUCKETS` (0 for bucket 0, which also takes every smaller `|n|`).
fn bucket_floor(i: usize) -> f32 {
    if i == 0 {
        0.0
    } else {
        f32::from_bits(LOWEST_BITS + ((i as u32) << (23 - SUB_BITS)))
    }
}

impl DynamicMap {
    fn new(values: [f32; 256]) -> Self {
        // largest i with values[i] <= x (0 when none)
        let floor_index = |x: f32| values.iter().rposition(|&t| t <= x).unwrap_or(0) as u8;
        let positive = (0..BUCKETS).map(|i| floor_index(bucket_floor(i)));
        // n < 0 in bucket i: n > -(floor of bucket i + 1), or n > -1 for the last one
        let negative = (0..BUCKETS).map(|i| floor_index(if i + 1 < BUCKETS { -bucket_floor(i + 1) } else { -1.0 }));
        let starts = positive.chain(negative).collect();
        let zero = values.iter().position(|&t| t == 0.0).unwrap() as u8;
        DynamicMap { values, starts, zero }
    }

    /// The 256 sorted values.
    pub fn values(&self) -> &[f32; 256] {
        &self.values
    }

    /// The bucket table (2 x [`BUCKETS`] bytes, see the module docs), as the CUDA kernel
    /// receives it.
    pub fn bucket_starts(&self) -> &[u8] {
        &self.starts
    }

    /// Index of 0.0 in the map.
    pub fn zero_index(&self) -> u8 {
        self.zero
    }

    /// The `i` with `t[i] <= n < t[i+1]`, for `t[0] < n < t[255]`.
    #[inline(always)]
    fn lower_index(&self, n: f32) -> usize {
        let mut lo = self.starts[bucket(n)] as usize;
        while self.values[lo + 1] <= n {
            lo += 1;
        }
        lo
    }

    /// Encode `n`, an element normalized by its block ([`normalizer`]), to a map index:
    /// NaN -> the index of 0, at or beyond
    /// the ends -> 0 or 255, else `i` or `i + 1` for `t[i] <= n < t[i+1]` (see the module
    /// docs; the top 24 of `rand`'s 64 bits drive stochastic rounding).
    #[inline]
    pub fn encode(&self, n: f32, rounding: Rounding, rand: u64) -> u8 {
        let t = &self.values;
        if n.is_nan() {
            return self.zero;
        }
        if n <= t[0] {
            return 0;
        }
        if n >= t[255] {
            return 255;
        }
        let lo = self.lower_index(n);
        let hi = lo + 1;
        let (a, b) = (t[lo], t[hi]);
        // n == a: dl = 0 < du (nearest), n - a = 0 (stochastic): lo
        let up = match rounding {
            Rounding::Nearest => {
                let (dl, du) = (n - a, b - n);
                du < dl || (du == dl && hi.is_multiple_of(2))
            }
            Rounding::Stochastic | Rounding::Dither => ((rand >> 40) as f32) * (1.0 / 16_777_216.0) * (b - a) < n - a,
        };
        if up {
            hi as u8
        } else {
            lo as u8
        }
    }
}

fn build_map(signed: bool) -> [f32; 256] {
    let mut data: Vec<f64> = Vec::with_capacity(256);
    for i in 0..7i32 {
        let items = if signed { (1usize << i) + 1 } else { (1usize << (i + 1)) + 1 };
        let bound = |k: usize| 0.1 + 0.9 * k as f64 / (items - 1) as f64;
        for k in 0..items - 1 {
            let mean = (bound(k) + bound(k + 1)) / 2.0;
            let v = 10f64.powi(i - 6) * mean;
            data.push(v);
            if signed {
                data.push(-v);
            }
        }
    }
    data.push(0.0);
    data.push(1.0);
    assert_eq!(data.len(), 256);
    let mut out: Vec<f32> = data.into_iter().map(|v| v as f32).collect();
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out.try_into().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_have_the_bitsandbytes_shape() {
        let s = dynamic_map(true);
        let u = dynamic_map(false);
        assert_eq!(s[255], 1.0);
        assert_eq!(u[255], 1.0);
        assert_eq!(u[0], 0.0);
        assert!(s[0] < -0.99 && s[0] > -1.0, "{}", s[0]);
        // strictly increasing
        assert!(s.values().windows(2).all(|w| w[0] < w[1]));
        assert!(u.values().windows(2).all(|w| w[0] < w[1]));
        // smallest non-zero magnitude: 10^-6 * mean(0.1, 0.55) (first decade, two steps)
        assert!((u[1] as f64 - 1e-6 * 0.325).abs() < 1e-12, "{}", u[1]);
    }

    #[test]
    fn encode_is_nearest_and_exact_values_stay() {
        let u = dynamic_map(false);
        for (i, &t) in u.values().iter().enumerate() {
            assert_eq!(u.encode(t, Rounding::Nearest, 0) as usize, i);
            assert_eq!(u.encode(t, Rounding::Stochastic, u64::MAX) as usize, i);
        }
        let mid = (u[100] + u[101]) / 2.0 + 1e-7;
        assert_eq!(u.encode(mid, Rounding::Nearest, 0), 101);
    }

    /// The bucket search finds the binary search's index for every map value, its FP32
    /// neighbours, and every 61st FP32 bit pattern in (t[0], t[255]); it never takes more than
    /// MAX_STEPS steps, and takes that many somewhere.
    #[test]
    fn bucket_search_matches_binary_search() {
        let mut most = 0;
        for signed in [true, false] {
            let map = dynamic_map(signed);
            let t = map.values();
            let binary = |n: f32| {
                let (mut lo, mut hi) = (0usize, 255usize);
                while hi - lo > 1 {
                    let mid = (lo + hi) / 2;
                    if t[mid] <= n {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                lo
            };
            let mut check = |n: f32| {
                if n.is_nan() || n <= t[0] || n >= t[255] {
                    return;
                }
                let lo = map.lower_index(n);
                assert_eq!(lo, binary(n), "n = {n:e} (signed map: {signed})");
                most = most.max(lo - map.starts[bucket(n)] as usize);
            };
            for &x in t {
                for n in [x, x.next_up(), x.next_down(), -x] {
                    check(n);
                }
            }
            for bits in (0..u32::MAX).step_by(61) {
                check(f32::from_bits(bits));
            }
        }
        assert_eq!(most, MAX_STEPS);
    }
}
