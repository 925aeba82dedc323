//! Counter-based random bits for stochastic rounding.
//!
//! Every random draw is a pure function of `(seed, step, tensor id, state kind, element
//! index)`: no generator state is carried between steps, so the CPU reference, the CUDA kernel
//! (`kernels/rng.cuh`, same constants, same order) and a resumed run all see the same bits
//! whatever the launch shape or thread count.
//!
//! Construction: SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014). A per-(seed, step, tensor, kind) *stream key* is derived by
//! chaining the SplitMix64 finaliser over the four fields; element `i` of the stream is the
//! finaliser applied to `key + (i + 1) * GOLDEN` (the SplitMix64 Weyl sequence), so each
//! element costs one 64-bit finaliser. All counters are 64-bit: no wrap-around in any run.

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

/// 64 random bits for element `index` of the stream `key`.
#[inline(always)]
pub fn random_bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_values_are_fixed() {
        // Pinned outputs: the CUDA port is checked against these same numbers.
        assert_eq!(mix64(0), 0);
        assert_eq!(random_bits(0, 0), 0xE220_A839_7B1D_CDAF);
        let k = stream_key(1234, 7, 3, StateKind::V);
        assert_ne!(k, stream_key(1234, 7, 3, StateKind::M));
        assert_ne!(k, stream_key(1234, 8, 3, StateKind::V));
        assert_ne!(k, stream_key(1235, 7, 3, StateKind::V));
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
