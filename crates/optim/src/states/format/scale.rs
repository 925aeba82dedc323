//! Block scales: one FP32 number per block of B elements (or per tensor), which a scaled
//! state's codes are multiplied by when decoded. `amax` below is the largest finite magnitude
//! of the block's new FP32 values (after the update, before the write-back).
//!
//! FP8/FP4 ([`ScaleKind`], `optim.states.scale`):
//! * `amax` (the paper's, arXiv:2603.16731v1 A.4: "the maximum proposal magnitude in the group
//!   is mapped to the format maximum x_max"): `scale = a / x_max`, and elements are encoded as
//!   `x * (x_max / a)`, with `a = max(amax, 2^-100)` ([`AMAX_FLOOR`]: keeps both quotients
//!   normal and finite; a block whose largest value is below 1e-30 is stored on that floor's
//!   grid). Two IEEE FP32 divisions per block, none per element: CPU and GPU compute exactly
//!   [`amax_scale`], so they agree bit for bit. An all-zero block gets scale 0 (and factor 0):
//!   every element encodes and decodes to 0. The block's largest element lands on `x_max`, and
//!   the scale shrinks with the block, so every code decays with it.
//! * `pow2`: `2^k` with the smallest `k` such that `amax <= x_max * 2^k`, computed on the
//!   exponent bits with one exact comparison; `k` is clamped to [-126, 127] so the scale and
//!   its inverse are normal FP32 numbers; an all-zero block gets scale 1. Encoding multiplies
//!   by `2^-k` (exact). The grid stays relative to the value, but a block whose largest value
//!   sits in one octave keeps its scale, and under round-to-nearest E2M1's m cannot decay
//!   there (`0.9 g` rounds back to `g` for every grid point `g`).
//!
//! Int8: `absmax` itself (8-bit Adam), 1 for an all-zero block ([`super::int8`]).

use super::minifloat::pow2;
use crate::error::OptimError;
use serde::{Deserialize, Serialize};

/// How the scale of an FP8/FP4 block follows its largest value (`optim.states.scale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleKind {
    /// `scale = amax / x_max`: the block's largest element maps to the format's largest value
    /// (the paper's, A.4).
    Amax,
    /// The smallest power of two with `amax <= x_max * scale`.
    Pow2,
}

impl ScaleKind {
    /// Config name (`amax` / `pow2`).
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleKind::Amax => "amax",
            ScaleKind::Pow2 => "pow2",
        }
    }
}

impl std::str::FromStr for ScaleKind {
    type Err = OptimError;
    fn from_str(s: &str) -> Result<Self, OptimError> {
        match s {
            "amax" => Ok(ScaleKind::Amax),
            "pow2" => Ok(ScaleKind::Pow2),
            _ => Err(OptimError::Config(format!("unknown scale kind `{s}` (expected `amax` or `pow2`)"))),
        }
    }
}

/// Smallest `amax` an `amax` scale is computed from: 2^-100 (below it, `x_max / amax` could
/// overflow FP32).
pub const AMAX_FLOOR: f32 = 7.888_609e-31; // 2^-100

/// A block's scale and the factor its new values are multiplied by before encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockScale {
    /// Decoded value = code value * `scale`.
    pub scale: f32,
    /// Encoded = encode(x * `factor`): `1 / scale` (exact for `pow2`), `x_max / a` for `amax`.
    pub factor: f32,
}

/// Largest finite magnitude of `xs` (0 if none).
#[inline]
pub fn amax(xs: impl Iterator<Item = f32>) -> f32 {
    xs.filter(|x| x.is_finite()).fold(0.0f32, |a, x| a.max(x.abs()))
}

/// The scale of a block of largest finite magnitude `amax` for a format whose largest finite
/// value is `max_finite`.
#[inline]
pub fn block_scale(kind: ScaleKind, amax: f32, max_finite: f32) -> BlockScale {
    match kind {
        ScaleKind::Amax => amax_scale(amax, max_finite),
        ScaleKind::Pow2 => {
            let k = pow2_scale_exp(amax, max_finite);
            BlockScale { scale: pow2(k), factor: pow2(-k) }
        }
    }
}

/// The `amax` scale, as written once for CPU and GPU (`kernels/optim/scale.cuh`
/// `amax_scale`): `a = max(amax, 2^-100)`, `scale = a / x_max`, `factor = x_max / a`, both
/// IEEE FP32 divisions; 0 and 0 for an all-zero block.
#[inline]
pub fn amax_scale(amax: f32, max_finite: f32) -> BlockScale {
    if amax == 0.0 {
        return BlockScale { scale: 0.0, factor: 0.0 };
    }
    let a = amax.max(AMAX_FLOOR);
    BlockScale { scale: a / max_finite, factor: max_finite / a }
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

/// Power-of-two exponent `k` of the `pow2` scale for a format with largest value `max_finite`.
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
    fn pow2_scale_is_the_smallest_fitting_power_of_two() {
        for &(amax, maxf, k) in &[
            (448.0f32, 448.0f32, 0),
            (449.0, 448.0, 1),
            (1.0, 448.0, -8), // 448 * 2^-8 = 1.75 >= 1, 448 * 2^-9 < 1
            (1e-3, 6.0, -12), // 6 * 2^-12 = 0.00146 >= 1e-3
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

    #[test]
    fn amax_scale_maps_the_block_maximum_to_the_format_maximum() {
        assert_eq!(AMAX_FLOOR, 2f32.powi(-100));
        let s = amax_scale(3.0, 6.0);
        assert_eq!((s.scale, s.factor), (0.5, 2.0));
        let s = amax_scale(1e-3, 448.0);
        assert_eq!(s.scale, 1e-3f32 / 448.0);
        assert_eq!(s.factor, 448.0f32 / 1e-3);
        // the largest element lands on (or within one FP32 rounding of) x_max
        for amax in [1e-3f32, 0.37, 12345.0, 3.3e-20] {
            let x = amax * amax_scale(amax, 7.0).factor;
            assert!((x - 7.0).abs() <= 7.0 * f32::EPSILON, "{amax}: {x}");
        }
        // all-zero block: scale 0; tiny blocks use the floor (finite factor)
        assert_eq!(amax_scale(0.0, 6.0), BlockScale { scale: 0.0, factor: 0.0 });
        let s = amax_scale(1e-38, 448.0);
        assert_eq!((s.scale, s.factor), (AMAX_FLOOR / 448.0, 448.0 / AMAX_FLOOR));
        assert!(amax_scale(f32::MAX, 6.0).factor > 0.0);
        assert_eq!(block_scale(ScaleKind::Pow2, 3.0, 6.0), BlockScale { scale: 0.5, factor: 2.0 });
        assert_eq!(block_scale(ScaleKind::Pow2, 3.5, 6.0), BlockScale { scale: 1.0, factor: 1.0 });
    }
}
