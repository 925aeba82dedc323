//! BF16 state / weight format: the top 16 bits of an IEEE FP32 word (1 sign, 8 exponent,
//! 7 fraction bits, eps = 2^-7), subnormals, Inf and NaN as in FP32. No scaling.
//!
//! Rounding on the FP32 bits (docs/numerics.md, "Numerics"):
//! * nearest: `(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16` (ties to even);
//! * stochastic: add a uniform 16-bit integer (the top 16 of the 64 random bits) to the
//!   FP32 word and clear the low 16 bits.
//!
//! NaN becomes the canonical quiet NaN 0x7FC0 (CPU and GPU arithmetic produce different NaN
//! signs and payloads, so only NaN-ness is kept); a zero result is the canonical `+0` (see `minifloat`).

use super::rounding::Rounding;

/// Decode BF16 bits to FP32 (exact).
#[inline(always)]
pub fn decode(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Round an FP32 value to BF16 bits.
#[inline(always)]
pub fn encode(x: f32, rounding: Rounding, rand: u64) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return 0x7FC0;
    }
    let add = match rounding {
        Rounding::Nearest => 0x7FFF + ((bits >> 16) & 1),
        Rounding::Stochastic | Rounding::Dither => (rand >> 48) as u32,
    };
    let h = (bits.wrapping_add(add) >> 16) as u16;
    if h & 0x7FFF == 0 {
        0
    } else {
        h
    }
}
