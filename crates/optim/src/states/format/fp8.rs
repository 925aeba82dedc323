//! FP8 state formats, OCP "8-bit Floating Point Specification (OFP8)" rev. 1.0 (2023).
//!
//! * E4M3: `S.EEEE.MMM`, bias 7, max finite 448 (`S.1111.110`), NaN `S.1111.111`, no Inf,
//!   subnormals `0.MMM * 2^-6` (smallest 2^-9). Fraction bits 3, so eps = 2^-3.
//! * E5M2: `S.EEEEE.MM`, bias 15, max finite 57344, Inf `S.11111.00`, NaN `S.11111.{01,10,11}`,
//!   smallest subnormal 2^-16. Fraction bits 2, eps = 2^-2.
//!
//! Scaling: one FP32 scale per block of B elements or per tensor (`super::scale`: `amax`, the
//! block's largest magnitude mapped to the max finite value, or `pow2`, the smallest power of
//! two that fits); values are stored as `x * factor` and decoded as `code * scale`. The
//! paper's FP8 is E4M3 with one `amax` scale per tensor (arXiv:2603.16731v1, 6.1, A.4).

use super::minifloat::{MiniFloat, Specials};

/// OCP FP8 E4M3 (finite, max 448, subnormals kept).
pub const E4M3: MiniFloat =
    MiniFloat { exp_bits: 4, man_bits: 3, bias: 7, signed: true, max_finite: 448.0, specials: Specials::NanOnly(0x7F), max_code: 0x7E };

/// OCP FP8 E5M2 (IEEE-like, max 57344, Inf and NaN).
pub const E5M2: MiniFloat =
    MiniFloat { exp_bits: 5, man_bits: 2, bias: 15, signed: true, max_finite: 57344.0, specials: Specials::Ieee, max_code: 0x7B };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::format::rounding::Rounding;

    #[test]
    fn tiny_values_round_to_zero_or_min_subnormal() {
        let f = E4M3;
        let min_sub = 2f32.powi(-9);
        assert_eq!(f.encode(min_sub * 0.49, Rounding::Nearest, 0), 0);
        assert_eq!(f.encode(min_sub * 0.51, Rounding::Nearest, 0), 1);
        // exact half of the smallest subnormal: tie to even (0)
        assert_eq!(f.encode(min_sub * 0.5, Rounding::Nearest, 0), 0);
        // an f32 subnormal input still works
        assert_eq!(f.encode(f32::from_bits(1), Rounding::Nearest, 0), 0);
        assert_eq!(f.encode(f32::from_bits(1), Rounding::Stochastic, u64::MAX), 0);
    }
}
