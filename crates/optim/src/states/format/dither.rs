//! Subtractive dither of a state's write-back (`m_rounding` / `v_rounding = "dither"`).
//!
//! Sources: BReD ("block replay dithering", OpenReview ATXhZIy5PM: one dither value per block,
//! regenerated from a seed instead of stored), after classical subtractive dither (Schuchman,
//! "Dither signals and their effect on quantization noise", IEEE Trans. Comm. Tech. 1964;
//! Lipshitz, Wannamaker & Vanderkooy, "Quantization and dither: a theoretical survey", JAES 1992).
//!
//! **Grid coordinate.** Number a format's grid points in value order, `q_k` at coordinate `k`
//! (the code's magnitude index, negative for negative values; the int8 map's index), and let
//! `T` be linear between neighbours. On the FP32 bits this is what stochastic rounding already
//! sees: the dropped bits are the position between two neighbours.
//!
//! **Write** of update `t`: every block `b` of the state draws `u` uniform in [0, 1) from the
//! counter RNG (`random_bits(key_t, b)`'s top 24 bits, [`block_bits`]; `key_t` is the state's
//! stream key of update `t`, as for stochastic rounding, with the block index in place of the
//! element's). Each element is then rounded as stochastic rounding rounds it with random number
//! `u`, which is round-to-nearest of `T(x) + u - 1/2` in the sign-magnitude formats'
//! magnitude; so that the coordinate is the signed one (continuous through zero, whose code is
//! the canonical +0), a negative element takes the complemented draw, `1 - u - 2^-24`
//! ([`signed_bits`]). int8's map is sorted by value and compares the other way: up when
//! `u < ` the position between the neighbours, round-to-nearest of `T(x) + 1/2 - u`.
//!
//! **Read** (every decode of the codes update `t` wrote, until the next write): the stored
//! grid point moves by the same draw, `T(read) = k + d` with `d = 1/2 - u` (int8: `u - 1/2`),
//! i.e. `read = q_k + d (q_{k+1} - q_k)` for `d > 0`, `q_k + d (q_k - q_{k-1})` for `d < 0`
//! ([`undither`]), then times the block's scale. Then `T(read) - T(x)` is uniform on
//! (-1/2, 1/2] whatever `x`: unbiased in the grid coordinate, exactly so between two
//! neighbours of equal spacing (within a binade); off-grid reads are what the stored codes
//! plus the replayed draw mean. Above the largest code the last spacing is extended; an
//! unsigned state's code 0 (v = 0: fresh, reset, or an all-zero block) reads exact 0, and so
//! does every state at an update whose plan reads no dither ([`crate::rules::step_plan`]:
//! update 1, and a state reset before the update).
//!
//! **Stalls.** The stored code changes from one write to the next when `round(delta + u_t -
//! u_{t-1})` is non-zero, `delta` the update in grid steps: the difference of two uniforms is
//! triangular on (-1, 1), so a zero update still changes the code with probability 1/4 and
//! the stalled fraction is at most 3/4 (the theory's prediction:
//! [`crate::states::theory::p_stall_dither`]).

use super::StateFormat;
use crate::states::rng::random_bits;

/// Bits of the block's draw kept: 24, so that the read offset `d` is exact in FP32.
const BITS: u32 = 24;

/// The draw of block `block` (global block index: whole-tensor element index / block length)
/// of stream `key`: the top 24 bits of `random_bits(key, block)`, the low 40 zero, in the
/// layout the encoders take their random bits in (`rand >> (64 - dropped)`).
#[inline(always)]
pub fn block_bits(key: u64, block: u64) -> u64 {
    random_bits(key, block) >> (64 - BITS) << (64 - BITS)
}

/// The random bits element `x` of a block with draw `bits` ([`block_bits`]) rounds with: the
/// draw itself, complemented on its 24 bits for a negative `x` of a sign-magnitude format
/// (every format but int8), so that all formats round in the signed grid coordinate.
#[inline(always)]
pub fn signed_bits(format: StateFormat, bits: u64, x: f32) -> u64 {
    if x < 0.0 && format != StateFormat::Int8 {
        !bits >> (64 - BITS) << (64 - BITS)
    } else {
        bits
    }
}

/// The read offset `d` in grid steps of a block whose draw is `bits` ([`block_bits`]):
/// `1/2 - u` (int8: `u - 1/2`), `u = bits / 2^64` on the 24-bit grid; exact in FP32.
#[inline(always)]
pub fn read_offset(format: StateFormat, bits: u64) -> f32 {
    let u = (bits >> (64 - BITS)) as f32 * (1.0 / (1u32 << BITS) as f32);
    if format == StateFormat::Int8 {
        u - 0.5
    } else {
        0.5 - u
    }
}

/// The read of grid point `q` moved by `d` grid steps (`|d| <= 1/2`) towards its upper
/// neighbour `up` (`d > 0`) or its lower neighbour `down` (`d < 0`): `q + d * (up - q)` or
/// `q + d * (q - down)`, each a single IEEE operation (no fused multiply-add: the CUDA kernels
/// do the same three operations).
#[inline(always)]
pub fn undither(q: f32, down: f32, up: f32, d: f32) -> f32 {
    let step = if d > 0.0 { up - q } else { q - down };
    q + d * step
}

/// The dithered read of a sign-magnitude grid (FP8, FP4, BF16, `e8mK`): the value of the
/// code whose magnitude index is `k` (in units of one grid step of the container) and sign
/// `negative`, moved by `d` grid steps. `mag(j)` decodes magnitude index `j` (>= 0, finite for
/// `j <= top`, `top` the largest finite magnitude index); `unit` is one grid step in index
/// units. The signed coordinate moves by `d`: the magnitude by `d` (positive values and zero)
/// or `-d` (negative), across zero onto the other sign's first step; above `top` the last
/// spacing is extended.
#[inline(always)]
pub fn undither_sign_magnitude(mag: impl Fn(u32) -> f32, k: u32, top: u32, unit: u32, negative: bool, d: f32) -> f32 {
    let e = if negative { -d } else { d };
    let a = mag(k);
    let up = if k >= top { a + (a - mag(k - unit)) } else { mag(k + unit) };
    let down = if k == 0 { -mag(unit) } else { mag(k - unit) };
    let r = undither(a, down, up, e);
    if negative {
        -r
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_exact_and_centred() {
        assert_eq!(read_offset(StateFormat::Fp8E4M3, 0), 0.5);
        assert_eq!(read_offset(StateFormat::Fp8E4M3, 1 << 63), 0.0);
        assert_eq!(read_offset(StateFormat::Int8, 1 << 63), 0.0);
        assert_eq!(read_offset(StateFormat::Int8, 0), -0.5);
        let top = block_bits(7, 3);
        assert_eq!(top & ((1 << 40) - 1), 0, "the low 40 bits are zero");
        assert_eq!(top >> 40, random_bits(7, 3) >> 40);
        assert_eq!(read_offset(StateFormat::Fp4E2M1, top) + read_offset(StateFormat::Int8, top), 0.0);
    }

    #[test]
    fn undither_moves_towards_the_neighbour_on_its_side() {
        // FP4 E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6
        let mag = |k: u32| [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][k as usize];
        let at = |k, neg, d| undither_sign_magnitude(mag, k, 7, 1, neg, d);
        assert_eq!(at(4, false, 0.5), 2.5);
        assert_eq!(at(4, false, -0.5), 1.75);
        assert_eq!(at(4, true, 0.5), -1.75, "a negative value moves up towards zero");
        assert_eq!(at(0, false, -0.25), -0.125, "zero moves onto the negative side's first step");
        assert_eq!(at(7, false, 0.5), 7.0, "above the largest code the last spacing (2) is extended");
        assert_eq!(at(3, false, 0.0), 1.5);
    }
}
