//! Rounding modes for the write-back of a state (or BF16 weight).
//!
//! * `Nearest`: IEEE 754 round-to-nearest, ties to even.
//! * `Stochastic`: between the two neighbours `q- < x < q+` of the target grid, pick `q+`
//!   with probability `(x - q-) / (q+ - q-)`, so `E[round(x)] = x` (unbiased). Implemented on
//!   the bits the target drops: add that many uniform random bits to the dropped bits and
//!   truncate (for BF16 exactly "add a uniform 16-bit integer to the FP32 word and clear the
//!   low 16 bits"). Values already on the grid never move; Inf/NaN are preserved.
//! * `Dither`: subtractive dither with one value per block ([`super::dither`]): the write-back
//!   is stochastic rounding whose random number is shared by the block's elements, and every
//!   read moves the stored value back by the same draw (so nothing extra is stored).

use crate::error::OptimError;
use serde::{Deserialize, Serialize};

/// How a FP32 value is rounded onto a coarser grid. One vocabulary for configs
/// (`optim.states.*_rounding`) and the command line (`train predict --rounding`): `nearest`
/// (or `rne`), `stochastic` (or `sr`) and `dither` (states only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rounding {
    /// Round to nearest, ties to even.
    #[serde(alias = "rne")]
    Nearest,
    /// Unbiased stochastic rounding driven by the counter RNG (`crate::states::rng`).
    #[serde(alias = "sr")]
    Stochastic,
    /// Subtractive dither, one draw per block of the state ([`super::dither`]; BReD, "block
    /// replay dithering", OpenReview ATXhZIy5PM): states only, not BF16 weights.
    Dither,
}

impl Rounding {
    /// Short name used in configs and logs (`nearest` / `stochastic`).
    pub fn as_str(self) -> &'static str {
        match self {
            Rounding::Nearest => "nearest",
            Rounding::Stochastic => "stochastic",
            Rounding::Dither => "dither",
        }
    }
}

impl std::str::FromStr for Rounding {
    type Err = OptimError;
    fn from_str(s: &str) -> Result<Self, OptimError> {
        match s {
            "nearest" | "rne" => Ok(Rounding::Nearest),
            "stochastic" | "sr" => Ok(Rounding::Stochastic),
            "dither" => Ok(Rounding::Dither),
            _ => Err(OptimError::Config(format!(
                "unknown rounding `{s}` (expected `nearest` (or `rne`), `stochastic` (or `sr`) or `dither`)"
            ))),
        }
    }
}

/// Decide whether to round the kept integer up, given the `dropped` low bits of a
/// magnitude (`rem`, strictly below `2^dropped`) and the kept integer `kept`.
///
/// Nearest: up when `rem > half`, or `rem == half` and `kept` is odd (ties to even).
/// Stochastic: up when `rem + top_bits(rand, dropped) >= 2^dropped`, i.e. with probability
/// `rem / 2^dropped` quantised to the random bits supplied: exact with 64 random bits; the
/// optimizer supplies 32 (`rng::element_bits`), so a remainder below `2^-32` of a grid step
/// (subnormal results only) rounds down. For `dropped >= 64` it always rounds down. Dither
/// rounds as stochastic with its block's draw ([`super::dither::block_bits`]).
#[inline(always)]
pub fn round_up(kept: u64, rem: u64, dropped: u32, rounding: Rounding, rand: u64) -> bool {
    if dropped == 0 || rem == 0 {
        return false;
    }
    if dropped >= 64 {
        return false;
    }
    match rounding {
        Rounding::Nearest => {
            let half = 1u64 << (dropped - 1);
            rem > half || (rem == half && kept & 1 == 1)
        }
        Rounding::Stochastic | Rounding::Dither => rem + (rand >> (64 - dropped)) >= (1u64 << dropped),
    }
}
