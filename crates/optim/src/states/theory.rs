//! Closed-form stalled fraction of the second moment (Topollai & Choromanska 2026,
//! arXiv:2603.16731, docs/numerics.md "Theory").
//!
//! With squared gradients `g^2 = sigma^2 z`, `z ~ chi^2_1`, and a relative grid of spacing
//! `eps = 2^-(fraction bits)`, the update of a settled v is rounded away when
//! `|z - 1| < rho` (nearest) with `rho = eps * ln 2 / (2 (1 - b2))`:
//!
//! * `P_nearest = F(1 + rho) - F(max(0, 1 - rho))`, `F(x) = erf(sqrt(x / 2))` (chi^2_1 CDF);
//! * `P_sr = E_{z ~ chi^2_1}[max(0, 1 - |z - 1| / (2 rho))]`;
//! * beyond the paper, subtractive dither ([`p_stall_dither`], derived here).
//!
//! At b2 = 0.999: bf16 0.946 / 0.825, fp8 (3 fraction bits) 1.000 / 0.989, fp4 (2) 1.000 / 0.994.
//!
//! Reset period (Prop. 5.2, eqs. 21-24): a state reset at step 0 stalls at age j with
//! probability `S(j) = F((1 + rho)(1 - b2^j)) / F(1 + rho)`; with the threshold `s0`,
//! `Sbar(K) = (1/K) sum_{j<=K} max(0, (S(j) - s0) / (1 - s0))` is the stalling a cycle of K
//! updates accumulates and `E(K) = 2 b2^K / (1 + b2^K)` what a reset throws away; the period is
//! `K* = min{K >= 1 : Sbar(K) >= E(K)}`. At b2 = 0.999, s0 = 0.6: bf16 1116, fp8 320, fp4 224.

use crate::states::format::Rounding;

/// rho = eps * ln2 / (2 (1 - b2)), eps = 2^-fraction_bits.
pub fn rho(fraction_bits: u32, beta2: f64) -> f64 {
    let eps = (-(fraction_bits as f64)).exp2();
    eps * std::f64::consts::LN_2 / (2.0 * (1.0 - beta2))
}

/// chi^2_1 CDF.
fn chi2_1_cdf(x: f64) -> f64 {
    libm::erf((x / 2.0).sqrt())
}

/// Predicted stalled fraction with round-to-nearest.
pub fn p_stall_nearest(fraction_bits: u32, beta2: f64) -> f64 {
    let r = rho(fraction_bits, beta2);
    chi2_1_cdf(1.0 + r) - chi2_1_cdf((1.0 - r).max(0.0))
}

/// Predicted stalled fraction with stochastic rounding: `E_z[max(0, 1 - delta)]`, `delta =
/// |z - 1| / (2 rho)` the update in grid steps (by `expect_over_z`: Simpson over z).
pub fn p_stall_stochastic(fraction_bits: u32, beta2: f64) -> f64 {
    expect_over_z(rho(fraction_bits, beta2), |delta| (1.0 - delta).max(0.0))
}

/// Predicted stalled fraction (code unchanged) with subtractive dither, derived here
/// (`crate::states::format::dither`): the new code is `round(delta + u_t - u_(t-1))` steps from
/// the old, two independent uniform draws whose difference is triangular on (-1, 1), so the
/// code stays with probability `h(delta) = 3/4 - delta^2` (`delta <= 1/2`), `(3/2 - delta)^2 / 2`
/// (`1/2 <= delta <= 3/2`), 0 beyond; the prediction is `E_z[h(delta)]` (by the same integration).
/// At most 3/4 (a zero update changes the code 1 time in 4); at b2 = 0.999: bf16 0.699,
/// fp8 0.750, fp4 0.750. A stalled code no longer means a lost update: the read moves with the draw.
pub fn p_stall_dither(fraction_bits: u32, beta2: f64) -> f64 {
    expect_over_z(rho(fraction_bits, beta2), dither_stall_given_update)
}

/// `h(delta)` of [`p_stall_dither`]: the probability that the dithered code does not change
/// when the value moves by `delta >= 0` grid steps.
pub fn dither_stall_given_update(delta: f64) -> f64 {
    if delta <= 0.5 {
        0.75 - delta * delta
    } else if delta <= 1.5 {
        (1.5 - delta) * (1.5 - delta) / 2.0
    } else {
        0.0
    }
}

/// `E_{z ~ chi^2_1}[g(|z - 1| / (2 rho))]` (the update of a settled v in grid steps, the
/// paper's model), by Simpson's rule on `z = u^2` (density `2 phi(u)` on u >= 0, which removes
/// the z^-1/2 singularity), 20k intervals.
fn expect_over_z(r: f64, g: impl Fn(f64) -> f64) -> f64 {
    let f = |u: f64| {
        let z = u * u;
        g((z - 1.0).abs() / (2.0 * r)) * 2.0 * (-z / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt()
    };
    let (a, b, n) = (0.0, 40.0f64.min((1.0 + 2.0 * r).sqrt() + 12.0), 20_000usize);
    let h = (b - a) / n as f64;
    let mut s = f(a) + f(b);
    for i in 1..n {
        s += f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0
}

/// `E(K) = 2 b2^K / (1 + b2^K)`: the reset rules' threshold at cycle age `k` (Prop. 5.2, Alg. 2).
pub fn reset_threshold(beta2: f64, k: u64) -> f64 {
    let b = beta2.powf(k as f64);
    2.0 * b / (1.0 + b)
}

/// Longest reset period searched by [`reset_period`] (100x the paper's BF16 K*).
pub const MAX_RESET_PERIOD: u64 = 1_000_000;

/// The paper's reset period `K*` (Prop. 5.2) for a grid of `fraction_bits` (v's format), `beta2`
/// and threshold `s0` in (0, 1); `None` when no `K <= MAX_RESET_PERIOD` qualifies (b2 very
/// close to 1).
pub fn reset_period(fraction_bits: u32, beta2: f64, s0: f64) -> Option<u64> {
    let r = rho(fraction_bits, beta2);
    let f1 = chi2_1_cdf(1.0 + r);
    let mut acc = 0.0;
    let mut b = 1.0f64; // b2^K
    for k in 1..=MAX_RESET_PERIOD {
        b *= beta2;
        let s = chi2_1_cdf((1.0 + r) * (1.0 - b)) / f1;
        acc += ((s - s0) / (1.0 - s0)).max(0.0);
        if acc / k as f64 >= 2.0 * b / (1.0 + b) {
            return Some(k);
        }
    }
    None
}

/// The paper's threshold s0 of the reset rules (Prop. 5.2, Alg. 2).
pub const DEFAULT_RESET_S0: f64 = 0.6;

/// The reset period the paper ran for a v grid of `fraction_bits`: K* ([`reset_period`]) at
/// its b2 = 0.999 and s0 = 0.6, rounded down to one significant digit: BF16 1116 -> 1000, FP8
/// E4M3 320 -> 300, FP4 (v's E2M2) 224 -> 200 (arXiv:2603.16731v1 runs 1000 / 300 / 200),
/// FP32 1454 -> 1000. The one source of the paper cells' periods: `train reproduce` derives
/// them from it and a test checks the configs against it.
pub fn paper_run_period(fraction_bits: u32) -> u64 {
    let k = reset_period(fraction_bits, 0.999, DEFAULT_RESET_S0).expect("K* exists at b2 = 0.999");
    let unit = 10u64.pow(k.ilog10());
    k / unit * unit
}

/// Prediction for a rounding mode.
pub fn p_stall(fraction_bits: u32, beta2: f64, rounding: Rounding) -> f64 {
    match rounding {
        Rounding::Nearest => p_stall_nearest(fraction_bits, beta2),
        Rounding::Stochastic => p_stall_stochastic(fraction_bits, beta2),
        Rounding::Dither => p_stall_dither(fraction_bits, beta2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_numbers_at_b2_0999() {
        let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
        assert_eq!(r3(p_stall_nearest(7, 0.999)), 0.946);
        assert_eq!(r3(p_stall_stochastic(7, 0.999)), 0.825);
        assert_eq!(r3(p_stall_nearest(3, 0.999)), 1.000);
        assert_eq!(r3(p_stall_stochastic(3, 0.999)), 0.989);
        assert_eq!(r3(p_stall_nearest(2, 0.999)), 1.000);
        assert_eq!(r3(p_stall_stochastic(2, 0.999)), 0.994);
    }

    /// The paper's K* (Prop. 5.2) at b2 = 0.999 for BF16 / FP8 / FP4 (v's E2M2: 2 bits), s0 =
    /// 0.5, 0.6, 0.7 (the numbers `train predict --reset-period` prints too).
    #[test]
    fn paper_reset_periods_at_b2_0999() {
        let k = |bits, s0| reset_period(bits, 0.999, s0).unwrap();
        assert_eq!([k(7, 0.6), k(3, 0.6), k(2, 0.6)], [1116, 320, 224]);
        assert_eq!([k(7, 0.5), k(3, 0.5), k(2, 0.5)], [1004, 295, 206]);
        assert_eq!([k(7, 0.7), k(3, 0.7), k(2, 0.7)], [1262, 351, 246]);
        // the formula's S(j) tends to F(1 - b2^j) / F(1) as the grid gets finer: FP32 still has one
        assert_eq!(reset_period(23, 0.999, 0.6), Some(1454));
        // what the paper ran: one significant digit
        assert_eq!([7, 3, 2, 23].map(paper_run_period), [1000, 300, 200, 1000]);
        assert!((reset_threshold(0.999, 0) - 1.0).abs() < 1e-15);
        assert!((reset_threshold(0.999, 1000) - 2.0 * 0.999f64.powi(1000) / (1.0 + 0.999f64.powi(1000))).abs() < 1e-15);
    }

    #[test]
    fn stalling_falls_with_smaller_beta2_and_more_bits() {
        assert!(p_stall_nearest(7, 0.95) < p_stall_nearest(7, 0.999));
        assert!(p_stall_stochastic(23, 0.999) < 1e-3);
        // at the b2 of LLM pre-training, SR stalls less than nearest
        for b2 in [0.999, 0.9999] {
            assert!(p_stall_stochastic(7, b2) <= p_stall_nearest(7, b2) + 1e-9);
        }
    }
}
