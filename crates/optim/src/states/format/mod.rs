//! State formats: what each moment is stored as, and how it is encoded and decoded.
//!
//! | format      | bits | fraction bits (eps)  | scaling                      | spec                 |
//! |-------------|------|----------------------|------------------------------|----------------------|
//! | `fp32`      | 32   | 23                   | none                         | IEEE 754 binary32    |
//! | `bf16`      | 16   | 7 (2^-7)             | none                         | bfloat16             |
//! | `fp8e4m3`   | 8    | 3 (2^-3)             | per block or tensor: pow2*   | OCP OFP8 E4M3        |
//! | `fp8e5m2`   | 8    | 2 (2^-2)             | per block or tensor: pow2*   | OCP OFP8 E5M2        |
//! | `fp4e2m1`   | 4    | 1 (2^-1), signed     | per block or tensor: amax*   | OCP MX FP4           |
//! | `fp4ue2m2`  | 4    | 2 (2^-2), unsigned   | per block or tensor: amax*   | E2M2 without sign    |
//! | `int8`      | 8    | non-uniform          | absmax per block             | 8-bit Adam dynamic   |
//! | `e8m1`..`e8m6` | 16 (container) | 1..6 (2^-K) | none: FP32's exponent range  | precision-only (docs/numerics.md) |
//!
//! \* the default scale kind ([`StateFormat::default_scale`]; `optim.states.scale` picks
//! `amax` or `pow2`, [`scale`]).
//!
//! Config aliases: `fp8` = `fp8e4m3`; `fp4` = `fp4e2m1` for m and `fp4ue2m2` for v;
//! `e8m7` = `bf16`. The paper's cells (arXiv:2603.16731v1, 6.1 and A.4) are FP8 E4M3 with one
//! `amax` scale per tensor, and FP4 E2M1 m / E2M2 v in 128-element `amax` blocks with zero
//! excluded from v's grid. The precision-only formats ([`precision`]) are the stall theory's
//! grids (no range limit), stored in 2 bytes per element.

pub mod bf16;
pub mod dither;
pub mod fp4;
pub mod fp8;
pub mod int8;
pub mod minifloat;
pub mod precision;
pub mod rounding;
pub use rounding::Rounding;
pub mod scale;

use crate::error::OptimError;
use minifloat::MiniFloat;
use scale::ScaleKind;
use serde::{Deserialize, Serialize};

/// Storage format of one optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateFormat {
    /// IEEE FP32 (the baseline: write-back is exact).
    Fp32,
    /// BF16 (top half of FP32).
    Bf16,
    /// OCP FP8 E4M3 with block (or tensor) scales.
    Fp8E4M3,
    /// OCP FP8 E5M2 with block (or tensor) scales.
    Fp8E5M2,
    /// OCP MX FP4 E2M1 (signed) with block (or tensor) scales.
    Fp4E2M1,
    /// Unsigned FP4 E2M2 with block (or tensor) scales (second moment only).
    Fp4UE2M2,
    /// 8-bit Adam block-wise dynamic quantization (absmax scales).
    Int8,
    /// Precision-only `e8mK`: FP32's exponent, the fraction rounded to K = 1..=6 bits, in a
    /// 16-bit container ([`precision`]). Build it with [`StateFormat::parse`] (`"e8m3"`), which
    /// checks K.
    E8m(u8),
}

impl StateFormat {
    /// All formats, for tests and tables.
    pub const ALL: [StateFormat; 13] = [
        StateFormat::Fp32,
        StateFormat::Bf16,
        StateFormat::Fp8E4M3,
        StateFormat::Fp8E5M2,
        StateFormat::Fp4E2M1,
        StateFormat::Fp4UE2M2,
        StateFormat::Int8,
        StateFormat::E8m(1),
        StateFormat::E8m(2),
        StateFormat::E8m(3),
        StateFormat::E8m(4),
        StateFormat::E8m(5),
        StateFormat::E8m(6),
    ];

    /// Parse a config name for the first (`for_v = false`) or second moment. `fp8` means
    /// E4M3; `fp4` means E2M1 for m and unsigned E2M2 for v; `e8m1`..`e8m6` are the
    /// precision-only formats and `e8m7` is `bf16`.
    pub fn parse(name: &str, for_v: bool) -> Result<Self, OptimError> {
        if let Some(k) = name.strip_prefix("e8m").and_then(|k| k.parse::<u32>().ok()) {
            return match k {
                7 => Ok(StateFormat::Bf16),
                k if precision::FRACTION_BITS.contains(&k) => Ok(StateFormat::E8m(k as u8)),
                _ => Err(OptimError::Config(format!("precision-only format `{name}`: fraction bits must be 1 to 7 (e8m7 = bf16)"))),
            };
        }
        let f = match name {
            "fp32" | "f32" => StateFormat::Fp32,
            "bf16" => StateFormat::Bf16,
            "fp8" | "fp8e4m3" | "e4m3" => StateFormat::Fp8E4M3,
            "fp8e5m2" | "e5m2" => StateFormat::Fp8E5M2,
            "fp4" if for_v => StateFormat::Fp4UE2M2,
            "fp4" | "fp4e2m1" | "e2m1" => StateFormat::Fp4E2M1,
            "fp4ue2m2" | "ue2m2" => StateFormat::Fp4UE2M2,
            "int8" => StateFormat::Int8,
            _ => {
                return Err(OptimError::Config(format!(
                    "unknown state format `{name}` (expected one of fp32, bf16, fp8, fp8e4m3, \
                     fp8e5m2, fp4, fp4e2m1, fp4ue2m2, int8, e8m1 .. e8m7)"
                )))
            }
        };
        if f == StateFormat::Fp4UE2M2 && !for_v {
            return Err(OptimError::Config("fp4ue2m2 is unsigned and can only hold the second moment v".into()));
        }
        Ok(f)
    }

    /// Canonical name (`fp8e4m3`, `e8m3`, ...).
    pub fn name(self) -> &'static str {
        const E8M: [&str; 6] = ["e8m1", "e8m2", "e8m3", "e8m4", "e8m5", "e8m6"];
        match self {
            StateFormat::E8m(k) => E8M[k as usize - 1],
            StateFormat::Fp32 => "fp32",
            StateFormat::Bf16 => "bf16",
            StateFormat::Fp8E4M3 => "fp8e4m3",
            StateFormat::Fp8E5M2 => "fp8e5m2",
            StateFormat::Fp4E2M1 => "fp4e2m1",
            StateFormat::Fp4UE2M2 => "fp4ue2m2",
            StateFormat::Int8 => "int8",
        }
    }

    /// The small-float description, for FP8/FP4 formats.
    pub fn minifloat(self) -> Option<&'static MiniFloat> {
        match self {
            StateFormat::Fp8E4M3 => Some(&fp8::E4M3),
            StateFormat::Fp8E5M2 => Some(&fp8::E5M2),
            StateFormat::Fp4E2M1 => Some(&fp4::E2M1),
            StateFormat::Fp4UE2M2 => Some(&fp4::UE2M2),
            _ => None,
        }
    }

    /// The scale kind of an fp8/fp4 state when `optim.states.scale` is `default`: `amax` for
    /// FP4, `pow2` for FP8 (others: `pow2`, which they ignore). Chosen by measurement
    /// (`bench/history/paper_formats_h200.md`: LLaMA-20M, FP32 model, 3000 steps, 2 seeds, final
    /// validation loss minus FP32 states'), in the default 128-element blocks:
    /// * FP4 (E2M1 m, unsigned E2M2 v): `amax` +0.061 / +0.023 with round-to-nearest, `pow2`
    ///   +1.35 / +1.82. Under `pow2`, E2M1's m cannot decay (0.9 x every grid point rounds back
    ///   to it while the block's scale stays in its octave: m stalled 97%); under `amax` the
    ///   scale shrinks with the block and every code decays with it (m stalled by code 87%,
    ///   yet correct). With SR both are within 0.02 of FP32 states.
    /// * FP8 E4M3: with SR, the recommended rounding, the two are level at that shape (within
    ///   0.005 of FP32 states), and on the 160-step CPU config (`configs/tiny_cpu.toml`, SR)
    ///   `pow2` ends at 6.895 where `amax` ends at 7.104: an amax scale moves a little at every
    ///   step, so SR re-rounds every element onto a shifted grid at every write-back, noise that
    ///   a power of two (which rarely moves) does not add. With round-to-nearest `amax` is ahead
    ///   (+0.029 / +0.016 against +0.070 / +0.075): `scale = "amax"` for nearest FP8.
    ///
    /// The optimizer step costs the same with either (`bench/optimizer_h200.md`: amax / pow2
    /// 0.986 - 1.005).
    pub fn default_scale(self) -> ScaleKind {
        match self {
            StateFormat::Fp4E2M1 | StateFormat::Fp4UE2M2 => ScaleKind::Amax,
            _ => ScaleKind::Pow2,
        }
    }

    /// Fraction bits of a uniform-relative grid (the theory's eps = 2^-bits); `None` for int8.
    pub fn fraction_bits(self) -> Option<u32> {
        match self {
            StateFormat::Fp32 => Some(23),
            StateFormat::Bf16 => Some(7),
            StateFormat::Int8 => None,
            StateFormat::E8m(k) => Some(k as u32),
            f => f.minifloat().map(|m| m.man_bits),
        }
    }

    /// Storage bits per element (excluding scales).
    pub fn bits(self) -> u32 {
        match self {
            StateFormat::Fp32 => 32,
            StateFormat::Bf16 | StateFormat::E8m(_) => 16,
            StateFormat::Fp8E4M3 | StateFormat::Fp8E5M2 | StateFormat::Int8 => 8,
            StateFormat::Fp4E2M1 | StateFormat::Fp4UE2M2 => 4,
        }
    }

    /// Whether the format carries one FP32 scale per block.
    pub fn is_scaled(self) -> bool {
        !matches!(self, StateFormat::Fp32 | StateFormat::Bf16 | StateFormat::E8m(_))
    }

    /// Whether negative values are representable (v-only formats are not).
    pub fn is_signed(self) -> bool {
        self != StateFormat::Fp4UE2M2
    }

    /// Bytes of storage for `len` elements with block size `block` (0 = one per-tensor
    /// scale): codes plus 4-byte scales.
    pub fn storage_bytes(self, len: usize, block: usize) -> usize {
        let codes = (len * self.bits() as usize).div_ceil(8);
        codes + 4 * num_scales(self, len, block)
    }
}

/// Number of scales a tensor of `len` elements needs (0 for unscaled formats).
pub fn num_scales(format: StateFormat, len: usize, block: usize) -> usize {
    if !format.is_scaled() {
        0
    } else if block == 0 {
        1
    } else {
        len.div_ceil(block)
    }
}
