//! Per-block scales.
//!
//! FP8/FP4: power-of-two scale `2^k` with the smallest `k` such that
//! `amax <= max_finite * 2^k`, where `amax` is the largest finite magnitude of the block's
//! FP32 values after the update. `k` is clamped to [-126, 127] so the scale and its inverse
//! are normal FP32 numbers; an all-zero block gets scale 1. Stored as FP32 (4 bytes/block).
//! Computed on the exponent bits, with one exact comparison, so CPU and GPU agree exactly.
//!
//! Int8: `absmax` itself (8-bit Adam), 1 for an all-zero block.

use super::minifloat::pow2;

/// Largest finite magnitude of `xs` (0 if none).
#[inline]
pub fn amax(xs: impl Iterator<Item = f32>) -> f32 {
    xs.filter(|x| x.is_finite()).fold(0.0f32, |a, x| a.max(x.abs()))
}

/// Exponent of a positive normal-or-subnormal finite f32: floor(log2(x)).
#[inline(always)]
fn floor_log2(x: f32) -> i32 {
    let b = x.to_bits();
    let e = (b >> 23) as i32;
    if e == 0 {
        // subnormal: 2^-149 * mantissa
        -149 + (31 - (b & 0x7F_FFFF).leading_zeros() as i32)
    } else {
        e - 127
    }
}

/// Power-of-two exponent `k` of the block scale for a format with largest value `max_finite`.
#[inline]
pub fn pow2_scale_exp(amax: f32, max_finite: f32) -> i32 {
    if amax == 0.0 {
        return 0;
    }
    let mut k = floor_log2(amax) - floor_log2(max_finite);
    k = k.clamp(-126, 127);
    if k < 127 && amax > max_finite * pow2(k) {
        k += 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_the_smallest_fitting_power_of_two() {
        for &(amax, maxf, k) in &[
            (448.0f32, 448.0f32, 0),
            (449.0, 448.0, 1),
            (1.0, 448.0, -8),   // 448 * 2^-8 = 1.75 >= 1, 448 * 2^-9 < 1
            (1e-3, 6.0, -12),   // 6 * 2^-12 = 0.00146 >= 1e-3
            (7.0, 7.0, 0),
            (0.0, 6.0, 0),
        ] {
            assert_eq!(pow2_scale_exp(amax, maxf), k, "amax {amax}");
            if amax > 0.0 {
                assert!(amax <= maxf * pow2(k));
                assert!(amax > maxf * pow2(k - 1));
            }
        }
        // subnormal amax clamps to 2^-126 (still fits)
        assert_eq!(pow2_scale_exp(f32::from_bits(5), 6.0), -126);
    }
}
