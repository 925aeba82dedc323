//! Counter-based random bits for stochastic rounding.
//!
//! Every random draw is a pure function of `(seed, step, tensor id, state kind, element
//! index)`: no generator state is carried between steps, so the CPU reference, the CUDA kernel
//! (`kernels/rng.cuh`, same constants, same order) and a resumed run all see the same bits
//! whatever the launch shape or thread count.
//!
//! Construction: SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014). A per-(seed, step, tensor, kind) *stream key* is derived by
//! chaining the SplitMix64 finaliser over the four fields; draw `c` of the stream is the
//! finaliser applied to `key + (c + 1) * GOLDEN` (the SplitMix64 Weyl sequence). All counters
//! are 64-bit: no wrap-around in any run.
//!
//! Stochastic rounding needs 16 random bits per BF16 element (the DESIGN's "uniform 16-bit
//! integer") and 32 suffice for FP8/FP4/int8 (at most 22 dropped bits for normal results,
//! 24 for int8; subnormal results below 2^-32 of a grid step then round down: a bias of at
//! most 2^-32 of a step), so one 64-bit draw serves several consecutive elements:
//! [`element_bits`] gives element `i` the slice `i % (64 / width)` of draw `i / (64 / width)`. This makes the
//! random numbers 4x (BF16) or 2x (the others) cheaper, which is what lets the fused GPU
//! step round stochastically at the speed of round-to-nearest.

/// Name of the random-bit scheme (draws and their slicing), recorded in checkpoints: a
/// resume under another scheme continues with different stochastic-rounding draws.
pub const SCHEME: &str = "splitmix64-sliced";

/// The 64-bit golden-ratio increment of SplitMix64's Weyl sequence.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Which state an element belongs to; part of the random stream key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// First moment `m`.
    M = 0,
    /// Second moment `v`.
    V = 1,
    /// The weights themselves (BF16 weights with stochastic rounding).
    W = 2,
    /// Simulated stalling's draws (`optim.states.m_skip_prob` / `v_skip_prob`): element `i`
    /// takes draw `i` whole, its low 32 bits deciding m's skip and its high 32 bits v's.
    Skip = 3,
}

/// SplitMix64 finaliser (a bijection of u64 with full avalanche).
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key of the random stream for one state of one tensor at one optimizer step.
///
/// `step` is the global optimizer step (1-based), `tensor` the parameter's index in the
/// optimizer's sorted parameter list.
#[inline]
pub fn stream_key(seed: u64, step: u64, tensor: u64, kind: StateKind) -> u64 {
    let k = mix64(seed ^ GOLDEN);
    let k = mix64(k ^ step);
    mix64(k ^ ((tensor << 2) | kind as u64))
}

/// Draw `index` of the stream `key`: 64 random bits (sliced per element by [`element_bits`]).
#[inline(always)]
pub fn random_bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// Random bits of element `index` of stream `key` for a format that consumes `width` bits
/// (16 for BF16, 32 for FP8/FP4/int8; 64 gives [`random_bits`]): the `width`-bit slice
/// `index % (64 / width)` (from the least significant end) of draw `index / (64 / width)`,
/// returned in the *top* `width` bits of the u64 (low bits zero), so the encoders take their
/// random integers as `rand >> (64 - k)` whatever the width. Mirrored by
/// `element_bits` in `kernels/rng.cuh`.
#[inline(always)]
pub fn element_bits(key: u64, index: u64, width: u32) -> u64 {
    debug_assert!(matches!(width, 16 | 32 | 64));
    let per = 64 / width as u64;
    let draw = random_bits(key, index / per);
    if width == 64 {
        return draw;
    }
    (draw >> (width as u64 * (index % per))) << (64 - width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_values_are_fixed() {
        // Pinned outputs: the CUDA port is checked against these same numbers.
        assert_eq!(mix64(0), 0);
        assert_eq!(random_bits(0, 0), 0xE220_A839_7B1D_CDAF);
        // slices of that draw, left-aligned
        assert_eq!(element_bits(0, 0, 16), 0xCDAF << 48);
        assert_eq!(element_bits(0, 3, 16), 0xE220 << 48);
        assert_eq!(element_bits(0, 1, 32), 0xE220_A839 << 32);
        assert_eq!(element_bits(0, 0, 64), 0xE220_A839_7B1D_CDAF);
        assert_eq!(element_bits(0, 4, 16), (random_bits(0, 1) & 0xFFFF) << 48);
        let k = stream_key(1234, 7, 3, StateKind::V);
        assert_ne!(k, stream_key(1234, 7, 3, StateKind::M));
        assert_ne!(k, stream_key(1234, 8, 3, StateKind::V));
        assert_ne!(k, stream_key(1235, 7, 3, StateKind::V));
    }

    #[test]
    fn element_slices_are_uniform_and_distinct() {
        // Each slice position of a draw is uniform (mean within 5 SE of the middle) and
        // neighbours sharing a draw are not equal more often than chance.
        let key = stream_key(3, 9, 1, StateKind::V);
        for width in [16u32, 32] {
            let n = 40_000u64;
            let top = |i| (element_bits(key, i, width) >> (64 - width)) as f64 / 2f64.powi(width as i32);
            let mean = (0..n).map(top).sum::<f64>() / n as f64;
            let se = (1.0 / 12.0 / n as f64).sqrt();
            assert!((mean - 0.5).abs() < 5.0 * se, "width {width}: mean {mean}");
            let same = (0..n).filter(|&i| element_bits(key, 2 * i, width) == element_bits(key, 2 * i + 1, width)).count();
            assert!(same <= 2, "width {width}: {same} equal neighbours");
        }
    }

    #[test]
    fn bits_are_balanced() {
        // Each of the 64 output bits is set in half the draws, within 5 standard errors.
        let n = 100_000u64;
        let key = stream_key(1, 1, 0, StateKind::M);
        let mut ones = [0u64; 64];
        for i in 0..n {
            let r = random_bits(key, i);
            for (b, c) in ones.iter_mut().enumerate() {
                *c += (r >> b) & 1;
            }
        }
        let se = (n as f64 * 0.25).sqrt();
        for c in ones {
            assert!((c as f64 - n as f64 / 2.0).abs() < 5.0 * se, "bit count {c}");
        }
    }
}
