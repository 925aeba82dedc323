//! FP4 state formats, packed two codes per byte (element `2i` in the low nibble of byte `i`,
//! element `2i + 1` in the high nibble).
//!
//! * E2M1 (signed, for the first moment m): OCP Microscaling (MX) spec v1.0 FP4,
//!   `S.EE.M`, bias 1, values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no Inf/NaN. eps = 2^-1.
//! * UE2M2 (unsigned, for the second moment v >= 0): `EE.MM`, bias 1, values
//!   {0, .25, .5, .75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7}, subnormals kept,
//!   no Inf/NaN. Spending the sign bit on a fraction bit gives eps = 2^-2 (the paper's FP4
//!   theory number 0.994 at b2 = 0.999 uses 2 fraction bits).
//!
//! Scaling as for FP8 (`super::scale`); the paper's FP4 uses 128-element blocks with `amax`
//! scales and excludes zero from v's grid (arXiv:2603.16731v1, 6.1).

use super::minifloat::{MiniFloat, Specials};

/// OCP MX FP4 E2M1 (signed).
pub const E2M1: MiniFloat =
    MiniFloat { exp_bits: 2, man_bits: 1, bias: 1, signed: true, max_finite: 6.0, specials: Specials::None, max_code: 0x7 };

/// Unsigned E2M2 (for v).
pub const UE2M2: MiniFloat =
    MiniFloat { exp_bits: 2, man_bits: 2, bias: 1, signed: false, max_finite: 7.0, specials: Specials::None, max_code: 0xF };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::format::rounding::Rounding;

    #[test]
    fn a_negative_value_below_half_the_smallest_step_is_plus_zero() {
        assert_eq!(E2M1.encode(-0.2, Rounding::Nearest, 0), 0, "-0 is canonical +0");
    }
}
