//! Int8 block-wise dynamic quantization, as in 8-bit Adam (Dettmers et al., "8-bit
//! Optimizers via Block-wise Quantization", ICLR 2022; bitsandbytes `create_dynamic_map`).
//!
//! Each block of B elements stores `absmax` (FP32) and one byte per element: the index of
//! the nearest value of a fixed 256-entry *dynamic tree* map over [-1, 1] (signed, for m) or
//! [0, 1] (unsigned, for v) to `x / absmax`. The map has 7 decades (10^-6 .. 1) with a growing
//! number of linear fraction steps per decade, plus 0 and 1. The grid is not relative to the
//! value, so the closed-form stall theory (which assumes a constant eps) does not apply.
//!
//! Rounding: the neighbours `t[i] <= n < t[i+1]` are found by binary search; nearest picks
//! the closer one (ties to the even index); stochastic picks `t[i+1]` with probability
//! `(n - t[i]) / (t[i+1] - t[i])` using 24 random bits. All FP32 operations are single
//! correctly-rounded IEEE operations, so the CUDA port (which receives this same table)
//! is bit-identical.

use super::rounding::Rounding;
use std::sync::OnceLock;

/// The sorted 256-entry dynamic map (bitsandbytes `create_dynamic_map(signed, 7, 8)`).
pub fn dynamic_map(signed: bool) -> &'static [f32; 256] {
    static SIGNED: OnceLock<[f32; 256]> = OnceLock::new();
    static UNSIGNED: OnceLock<[f32; 256]> = OnceLock::new();
    let cell = if signed { &SIGNED } else { &UNSIGNED };
    cell.get_or_init(|| build_map(signed))
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

/// Encode `n = x / absmax` (in the map's range) to a map index.
#[inline]
pub fn encode(table: &[f32; 256], n: f32, rounding: Rounding, rand: u64) -> u8 {
    if n.is_nan() {
        return zero_index(table);
    }
    if n <= table[0] {
        return 0;
    }
    if n >= table[255] {
        return 255;
    }
    // largest i with table[i] <= n
    let (mut lo, mut hi) = (0usize, 255usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if table[mid] <= n {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (a, b) = (table[lo], table[hi]);
    if n == a {
        return lo as u8;
    }
    let up = match rounding {
        Rounding::Nearest => {
            let (dl, du) = (n - a, b - n);
            du < dl || (du == dl && hi % 2 == 0)
        }
        Rounding::Stochastic => {
            let frac = (n - a) / (b - a);
            ((rand >> 40) as f32) * (1.0 / 16_777_216.0) < frac
        }
    };
    if up {
        hi as u8
    } else {
        lo as u8
    }
}

/// Index of 0.0 in the map.
pub fn zero_index(table: &[f32; 256]) -> u8 {
    table.iter().position(|&t| t == 0.0).unwrap() as u8
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
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert!(u.windows(2).all(|w| w[0] < w[1]));
        // smallest non-zero magnitude: 10^-6 * mean(0.1, 0.55) (first decade, two steps)
        assert!((u[1] as f64 - 1e-6 * 0.325).abs() < 1e-12, "{}", u[1]);
    }

    #[test]
    fn encode_is_nearest_and_exact_values_stay() {
        let u = dynamic_map(false);
        for (i, &t) in u.iter().enumerate() {
            assert_eq!(encode(u, t, Rounding::Nearest, 0) as usize, i);
            assert_eq!(encode(u, t, Rounding::Stochastic, u64::MAX) as usize, i);
        }
        let mid = (u[100] + u[101]) / 2.0 + 1e-7;
        assert_eq!(encode(u, mid, Rounding::Nearest, 0), 101);
    }
}
