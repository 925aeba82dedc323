//! Precision-only formats `e8mK` (K = 1..6 fraction bits): FP32's sign and 8-bit exponent,
//! the fraction rounded to K bits, stored in a 16-bit container with BF16's layout (the low
//! 7 - K fraction bits of the container are zero), so 2 bytes per element: a simulation of a
//! K-bit fraction without any range limit, not a memory saving. `e8m7` is BF16 itself (the
//! config name `e8m7` resolves to `bf16`).
//!
//! These are the stall theory's grids exactly (eps = 2^-K at every magnitude; the companion
//! post's model, "3 fraction bits and no limit on the exponent, as with per-tensor scaling"),
//! which is how docs/numerics.md reproduces the paper's FP8 (`e8m3`) and FP4 (`e8m2` for v; `e8m2` for
//! m as measured, `reproduce::PAPER_FP4_M`) cells.
//!
//! Rounding on the FP32 bits, the BF16 bit trick on the D = 23 - K dropped bits:
//! * nearest: add `2^(D-1) - 1 + (kept LSB)` and clear the low D bits (ties to even);
//! * stochastic: add the top D of 32 uniform random bits (`rng::element_bits(.., 32)`) and
//!   clear the low D bits, so the value moves up with probability (dropped bits) / 2^D.
//!
//! A carry moves into the exponent (up to Inf, as in BF16); Inf stays Inf; NaN becomes the
//! canonical quiet NaN 0x7FC0; a zero result is the canonical `+0` (see `minifloat`).

use super::rounding::Rounding;

/// Smallest and largest fraction bits of a precision-only format (`e8m7` is BF16).
pub const FRACTION_BITS: std::ops::RangeInclusive<u32> = 1..=6;

/// Decode a 16-bit container to FP32 (exact): the container is BF16's layout, so this is
/// [`super::bf16::decode`].
pub use super::bf16::decode;

/// Round `x` to `frac_bits` fraction bits (1..=6) and return the 16-bit container.
/// `rand`: 64 random bits whose top 32 drive stochastic rounding (ignored for nearest).
#[inline(always)]
pub fn encode(x: f32, frac_bits: u32, rounding: Rounding, rand: u64) -> u16 {
    debug_assert!(FRACTION_BITS.contains(&frac_bits));
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let dropped = 23 - frac_bits;
    let add = match rounding {
        Rounding::Nearest => (1u32 << (dropped - 1)) - 1 + ((bits >> dropped) & 1),
        Rounding::Stochastic | Rounding::Dither => ((rand >> 32) as u32) >> (32 - dropped),
    };
    let h = ((bits.wrapping_add(add) >> dropped) << dropped >> 16) as u16;
    if h & 0x7FFF == 0 {
        0
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rounds_the_fraction_to_k_bits() {
        // 1 + 2^-3 + 2^-5 with 3 fraction bits: 1.125 (the 2^-5 is below half a step)
        assert_eq!(decode(encode(1.15625, 3, Rounding::Nearest, 0)), 1.125);
        // exactly half a step above 1.125 (1.1875): ties to even, 1.25 (fraction 010)
        assert_eq!(decode(encode(1.1875, 3, Rounding::Nearest, 0)), 1.25);
        // half a step above 1.0 with 1 fraction bit (1.25): ties to even, 1.0
        assert_eq!(decode(encode(1.25, 1, Rounding::Nearest, 0)), 1.0);
        assert_eq!(decode(encode(1.75, 1, Rounding::Nearest, 0)), 2.0);
        // no range limit: the exponent is FP32's
        let tiny = 1.75 * 2f32.powi(-120);
        assert_eq!(decode(encode(tiny, 2, Rounding::Nearest, 0)), tiny);
        assert_eq!(decode(encode(tiny * 1.01, 2, Rounding::Nearest, 0)), tiny);
        assert_eq!(decode(encode(-6.5e30, 6, Rounding::Nearest, 0)).to_bits() & 0x1_FFFF, 0);
        assert_eq!(encode(-1e-45, 3, Rounding::Nearest, 0), 0, "-0 is canonical +0");
        assert_eq!(encode(f32::INFINITY, 2, Rounding::Stochastic, u64::MAX), 0x7F80);
        assert_eq!(encode(f32::NAN, 2, Rounding::Nearest, 0), 0x7FC0);
    }

    #[test]
    fn stochastic_moves_up_with_the_dropped_fraction() {
        // 1 + 0.25 * step with 2 fraction bits (step 0.25): up iff the top 21 random bits
        // reach 2^21 - (dropped bits)
        let x = 1.0 + 0.25 * 0.25;
        let dropped = 1u64 << 19; // 0.25 of 2^21
        let at = |r: u64| decode(encode(x, 2, Rounding::Stochastic, r << 43));
        assert_eq!(at((1 << 21) - dropped - 1), 1.0);
        assert_eq!(at((1 << 21) - dropped), 1.25);
        // values on the grid never move
        assert_eq!(decode(encode(1.5, 2, Rounding::Stochastic, u64::MAX)), 1.5);
    }
}
