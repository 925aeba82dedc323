//! Generic small binary floating-point formats (FP8, FP4) with subnormals.
//!
//! A format is described by its exponent bits `E`, fraction (mantissa) bits `M`, exponent
//! bias, signedness, largest finite value and special codes. Value of a code:
//! `e == 0`: `(-1)^s * f * 2^(1 - bias - M)` (subnormal);
//! `e > 0`:  `(-1)^s * (2^M + f) * 2^(e - bias - M)` (normal).
//!
//! Encoding rounds the FP32 input on its bits (see [`MiniFloat::encode`]); finite values beyond the
//! largest finite value saturate to it (OCP "saturating" conversion), a zero result is the
//! canonical `+0` code (the sign of a zero moment carries no information and keeping it would
//! make an unchanged zero look updated). The CUDA port is in `kernels/optim/minifloat.cuh` (same
//! results; the kernels round FP8 to nearest with the hardware converters, checked equal).

use super::rounding::{round_up, Rounding};

/// Inf/NaN encodings of a format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Specials {
    /// No Inf, no NaN: every code is finite (OCP FP4 E2M1, unsigned E2M2).
    None,
    /// One NaN code (sign aside), no Inf (OCP FP8 E4M3: `S.1111.111`).
    NanOnly(u8),
    /// IEEE-style: all-ones exponent is Inf (fraction 0) or NaN (OCP FP8 E5M2).
    Ieee,
}

/// Parameters of one small float format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MiniFloat {
    /// Exponent bits `E`.
    pub exp_bits: u32,
    /// Fraction bits `M` (the theory's `eps = 2^-M`).
    pub man_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// Whether the top bit is a sign bit.
    pub signed: bool,
    /// Largest finite magnitude.
    pub max_finite: f32,
    /// Which codes are Inf/NaN.
    pub specials: Specials,
    /// Code (without sign) of the largest finite magnitude.
    pub max_code: u8,
}

/// `2^k` as f32 for `k` in the normal range, built on the bits (exact).
#[inline(always)]
pub fn pow2(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

impl MiniFloat {
    /// Smallest normal exponent, `1 - bias`.
    #[inline(always)]
    pub fn emin(&self) -> i32 {
        1 - self.bias
    }

    /// Number of codes (`2^(E + M + signed)`).
    pub fn num_codes(&self) -> u32 {
        1 << (self.exp_bits + self.man_bits + self.signed as u32)
    }

    fn sign_bit(&self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }

    /// A code's magnitude (the code without its sign bit) and whether its sign bit is set.
    #[inline(always)]
    pub fn split(&self, code: u8) -> (u8, bool) {
        (code & (self.sign_bit() - 1), self.signed && code & self.sign_bit() != 0)
    }

    /// Decode a code to FP32 (exact).
    #[inline]
    pub fn decode(&self, code: u8) -> f32 {
        let neg = self.signed && code & self.sign_bit() != 0;
        let mag = code & (self.sign_bit() - 1);
        let e = (mag >> self.man_bits) as i32;
        let f = (mag & ((1 << self.man_bits) - 1)) as u32;
        let all_ones = (1 << self.exp_bits) - 1;
        let v = match self.specials {
            Specials::NanOnly(c) if mag == c => f32::NAN,
            Specials::Ieee if e == all_ones && f == 0 => f32::INFINITY,
            Specials::Ieee if e == all_ones => f32::NAN,
            _ => {
                if e == 0 {
                    f as f32 * pow2(self.emin() - self.man_bits as i32)
                } else {
                    ((1u32 << self.man_bits) + f) as f32 * pow2(e - self.bias - self.man_bits as i32)
                }
            }
        };
        if neg {
            -v
        } else {
            v
        }
    }

    /// Encode an FP32 value (already divided by the block scale) with the given rounding.
    ///
    /// `rand` supplies the random bits for stochastic rounding (ignored for nearest).
    /// NaN maps to the positive quiet NaN code (NaN signs and payloads differ between CPU and
    /// GPU arithmetic, so they are not kept), or to `+0` in formats without one (FP4; the training loop
    /// skips non-finite steps, so states never see NaN there). Inf maps to the Inf code, else
    /// saturates to the largest finite value. Negative input to an unsigned format encodes 0.
    #[inline]
    pub fn encode(&self, x: f32, rounding: Rounding, rand: u64) -> u8 {
        let sign = if self.signed && x.is_sign_negative() { self.sign_bit() } else { 0 };
        let all_ones = ((1u32 << self.exp_bits) - 1) as u8;
        if x.is_nan() {
            return match self.specials {
                Specials::None => 0,
                Specials::NanOnly(c) => c,
                Specials::Ieee => (all_ones << self.man_bits) | (1 << (self.man_bits - 1)),
            };
        }
        if !self.signed && x < 0.0 {
            return 0;
        }
        if x.is_infinite() {
            return match self.specials {
                Specials::Ieee => (all_ones << self.man_bits) | sign,
                _ => self.max_code | sign,
            };
        }
        let bits = x.to_bits() & 0x7FFF_FFFF;
        if bits == 0 {
            return 0;
        }
        // Significand and exponent of |x|: |x| = mant * 2^(exp - 23).
        let (exp, mant) = if bits >> 23 == 0 {
            (-126, (bits & 0x7F_FFFF) as u64)
        } else {
            ((bits >> 23) as i32 - 127, ((bits & 0x7F_FFFF) | 0x80_0000) as u64)
        };
        // Target exponent: the value's own, or the subnormal exponent below the normal range.
        let mut te = exp.max(self.emin());
        // |x| in units of the target ULP 2^(te - M) is mant >> dropped.
        let dropped = (23 - self.man_bits as i32 + te - exp) as u32;
        let (kept, rem) = if dropped >= 64 { (0, mant) } else { (mant >> dropped, mant & ((1u64 << dropped) - 1)) };
        let mut q = kept + round_up(kept, rem, dropped, rounding, rand) as u64;
        if q == 0 {
            return 0;
        }
        let one = 1u64 << self.man_bits;
        if q >= 2 * one {
            // Rounded up into the next binade.
            te += 1;
            q >>= 1;
        }
        let mag = if q >= one {
            let e = te + self.bias;
            let limit = (self.max_code >> self.man_bits) as i32;
            let code = ((e as u32) << self.man_bits) as u64 | (q - one);
            if e > limit || code > self.max_code as u64 {
                self.max_code
            } else {
                code as u8
            }
        } else {
            q as u8 // subnormal: te == emin, exponent field 0
        };
        mag | sign
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_is_exact() {
        assert_eq!(pow2(0), 1.0);
        assert_eq!(pow2(-9), 1.0 / 512.0);
        assert_eq!(pow2(8), 256.0);
    }
}
