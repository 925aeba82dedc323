//! SOAP's writes on the host (the CPU reference the CUDA kernels of `kernels/optim/soap.cu`
//! match bit for bit given the same inputs): a quantized EMA write-back of any state (m, v, L,
//! R: [`ema_write`]), the weights' update ([`weights_write`]) and the second moment's
//! permutation when a refresh reorders an eigenbasis ([`permute`]).

use crate::rules::adamw::step::{write_back, Skip, Weights};
use crate::states::format::{bf16, Rounding};
use crate::states::quant::{Codes, QuantState};
use crate::states::rng::element_bits;
use crate::states::stalls::Counter;
use rayon::prelude::*;

/// The new FP32 value of every element, `a * old + b * u[i]` (`old` decoded from `state`; two
/// products and a sum, no FMA, as AdamW's moments), rounded into `state` with `rounding` and
/// the random stream `key` ([`write_back`]: the stall counts). Returns the unrounded new values
/// (the update uses them, as AdamW's does) and the counts.
pub fn ema_write(state: &mut QuantState, u: &[f32], a: f32, b: f32, rounding: Rounding, key: u64) -> (Vec<f32>, Counter) {
    assert_eq!(u.len(), state.len, "state length mismatch");
    let s = &*state;
    let new: Vec<f32> = u.par_iter().enumerate().map(|(i, &x)| a * s.get(i) + b * x).collect();
    let counts = write_back(state, &new, rounding, key, None, 0, Skip::NEVER);
    (new, counts)
}

/// The weights' update `p = p * decay - lr * n[i]` (AdamW's order: decay, then the step):
/// FP32 weights written exactly, BF16 weights rounded with `rounding` and the stream `key`
/// (16 bits per element) and counted as AdamW's are.
pub fn weights_write(w: Weights, n: &[f32], lr: f32, decay: f32, rounding: Rounding, key: u64) -> Counter {
    let mut c = Counter::default();
    match w {
        Weights::F32(p) => p.iter_mut().zip(n).for_each(|(p, &n)| *p = *p * decay - lr * n),
        Weights::Bf16(p) => {
            for (i, (p, &n)) in p.iter_mut().zip(n).enumerate() {
                let old = bf16::decode(*p);
                let new = old * decay - lr * n;
                let code = bf16::encode(new, rounding, element_bits(key, i as u64, 16));
                c.add(new != old, code == *p);
                *p = code;
            }
        }
    }
    c
}

/// Whether a column order leaves every column in place.
pub fn is_identity(order: &[usize]) -> bool {
    order.iter().enumerate().all(|(i, &j)| i == j)
}

/// Reorders the second moment of a `rows x cols` matrix (row-major) after a refresh:
/// `rows_order[i]` is the old row that becomes row `i` (a refreshed left basis), `cols_order`
/// likewise for columns. Exact (codes moved) for unscaled states and one scale per tensor; a
/// block-scaled state is decoded, moved and encoded again with round-to-nearest (its blocks
/// take new members), which moves values by at most half a step of the new block's grid.
pub fn permute(state: &mut QuantState, rows: usize, cols: usize, rows_order: Option<&[usize]>, cols_order: Option<&[usize]>) {
    let identity = |o: Option<&[usize]>| o.is_none_or(is_identity);
    if identity(rows_order) && identity(cols_order) {
        return;
    }
    let from = |k: usize| {
        let (i, j) = (k / cols, k % cols);
        rows_order.map_or(i, |o| o[i]) * cols + cols_order.map_or(j, |o| o[j])
    };
    let n = rows * cols;
    if !state.format.is_scaled() || state.block == 0 {
        match &mut state.codes {
            Codes::F32(c) => *c = (0..n).map(|k| c[from(k)]).collect(),
            Codes::Bf16(c) => *c = (0..n).map(|k| c[from(k)]).collect(),
            Codes::Bytes(_) => {
                let codes: Vec<u8> = (0..n).map(|k| state.code(from(k))).collect();
                let packed = state.format.bits() == 4;
                let bytes = match packed {
                    true => codes.chunks(2).map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4)).collect(),
                    false => codes,
                };
                state.codes = Codes::Bytes(bytes);
            }
        }
        return;
    }
    let values: Vec<f32> = (0..n).map(|k| state.get(from(k))).collect();
    write_back(state, &values, Rounding::Nearest, 0, None, 0, Skip::NEVER);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::format::StateFormat;

    fn state(format: StateFormat, block: usize, values: &[f32]) -> QuantState {
        let mut s = QuantState::zeros(format, values.len(), block, false);
        write_back(&mut s, values, Rounding::Nearest, 0, None, 0, Skip::NEVER);
        s
    }

    /// The EMA: new = a * old + b * u exactly (FP32 state), counted: an element whose new value
    /// equals its old one is neither updated nor stalled.
    #[test]
    fn ema_write_is_the_ema_and_counts() {
        let mut s = state(StateFormat::Fp32, 0, &[1.0, 2.0, 0.0]);
        let (new, c) = ema_write(&mut s, &[3.0, 2.0, 0.0], 0.5, 0.5, Rounding::Nearest, 7);
        assert_eq!(new, vec![2.0, 2.0, 0.0]);
        assert_eq!(s.decode_all(), new);
        assert_eq!((c.updated, c.stalled, c.unchanged, c.elements), (1, 0, 2, 3));
    }

    /// Permutations of rows and columns move every element with its eigenvector: exactly for
    /// FP32, BF16, per-tensor FP8 and FP4 (codes moved); a 2 x 4 matrix with reversed rows and
    /// columns 1 and 3 swapped.
    #[test]
    fn permute_moves_rows_and_columns() {
        let v: Vec<f32> = (1..=8).map(|x| x as f32 * 0.25).collect();
        let (ro, co) = ([1usize, 0], [0usize, 3, 2, 1]);
        let want_at = |k: usize| (1 - k / 4) * 4 + co[k % 4];
        for (f, block) in [(StateFormat::Fp32, 0), (StateFormat::Bf16, 0), (StateFormat::Fp8E4M3, 0), (StateFormat::Fp4E2M1, 0)] {
            let mut s = state(f, block, &v);
            let before = s.decode_all();
            permute(&mut s, 2, 4, Some(&ro), Some(&co));
            let after = s.decode_all();
            for k in 0..8 {
                assert_eq!(after[k].to_bits(), before[want_at(k)].to_bits(), "{f:?} element {k}");
            }
        }
        // a 3-cycle (not its own inverse): row i of the result is old row order[i]
        let v3: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        let mut s = state(StateFormat::Fp32, 0, &v3);
        permute(&mut s, 3, 2, Some(&[2, 0, 1]), None);
        assert_eq!(s.decode_all(), vec![5.0, 6.0, 1.0, 2.0, 3.0, 4.0]);
        let mut s = state(StateFormat::Fp32, 0, &v3);
        permute(&mut s, 2, 3, None, Some(&[1, 2, 0]));
        assert_eq!(s.decode_all(), vec![2.0, 3.0, 1.0, 5.0, 6.0, 4.0]);
        // identity orders leave the state alone
        let mut s = state(StateFormat::Fp8E4M3, 4, &v);
        let before = s.clone();
        permute(&mut s, 2, 4, Some(&[0, 1]), None);
        assert_eq!(s, before);
    }
}
