//! `train predict`: the closed-form stalled fraction of v and, with `--reset-period`, the
//! paper's reset period K* (lowbit_optim::states::theory).

use anyhow::Result;
use lowbit_optim::{theory, Rounding, StateFormat};

/// Prediction for one format: (format name, fraction bits, nearest, stochastic).
pub fn predict(format: &str, beta2: f64) -> Result<(StateFormat, u32, f64, f64)> {
    anyhow::ensure!((0.0..1.0).contains(&beta2), "--beta2 must be in [0, 1), got {beta2}");
    let f = StateFormat::parse(format, true).map_err(anyhow::Error::msg)?;
    let bits = f
        .fraction_bits()
        .ok_or_else(|| anyhow::anyhow!("{}: the theory assumes a uniform relative grid; int8's dynamic map has none", f.name()))?;
    Ok((f, bits, theory::p_stall_nearest(bits, beta2), theory::p_stall_stochastic(bits, beta2)))
}

/// The thresholds s0 `--reset-period` prints K* for: the paper's 0.6 first, then 0.5 and 0.7.
pub const RESET_S0: [f64; 3] = [0.6, 0.5, 0.7];

/// The paper's reset period K* (Prop. 5.2) of v's `fraction_bits` at `beta2` for each of
/// [`RESET_S0`] (`None`: beyond `theory::MAX_RESET_PERIOD`). FP4's v is E2M2 (2 bits), and m
/// takes v's period.
pub fn reset_periods(fraction_bits: u32, beta2: f64) -> [(f64, Option<u64>); 3] {
    RESET_S0.map(|s0| (s0, theory::reset_period(fraction_bits, beta2, s0)))
}

/// Print the prediction (text or JSON); `reset_period`: with the reset periods.
pub fn print(format: &str, beta2: f64, rounding: Option<Rounding>, reset_period: bool, json: bool) -> Result<()> {
    let (f, bits, pn, ps) = predict(format, beta2)?;
    let periods = reset_period.then(|| reset_periods(bits, beta2));
    let k = |p: Option<u64>| p.map_or("none".to_string(), |k| k.to_string());
    if json {
        let mut o = serde_json::json!({
            "format": f.name(), "fraction_bits": bits, "beta2": beta2, "rho": theory::rho(bits, beta2),
        });
        let wanted = |r| rounding.is_none() || rounding == Some(r);
        if wanted(Rounding::Nearest) {
            o["nearest"] = pn.into();
        }
        if wanted(Rounding::Stochastic) {
            o["stochastic"] = ps.into();
        }
        if wanted(Rounding::Dither) {
            o["dither"] = theory::p_stall_dither(bits, beta2).into();
        }
        if let Some(periods) = periods {
            o["reset_period"] = periods.iter().map(|&(s0, p)| (format!("{s0}"), serde_json::json!(p))).collect();
        }
        lowbit_train::outln!("{o}");
        return Ok(());
    }
    match rounding {
        Some(Rounding::Nearest) => lowbit_train::outln!("{pn:.3}"),
        Some(Rounding::Stochastic) => lowbit_train::outln!("{ps:.3}"),
        Some(Rounding::Dither) => lowbit_train::outln!("{:.3}", theory::p_stall_dither(bits, beta2)),
        None => lowbit_train::outln!(
            "{pn:.3}/{ps:.3}  (v stalled fraction, {} with {bits} fraction bits, b2 = {beta2}: nearest/stochastic, rho = {:.2})",
            f.name(),
            theory::rho(bits, beta2)
        ),
    }
    if let Some([(s0, p), (s1, p1), (s2, p2)]) = periods {
        lowbit_train::outln!(
            "{}  (reset period K*, Prop. 5.2, s0 = {s0}; {} at s0 = {s1}, {} at s0 = {s2}; optim.states.v_reset_every = \"auto\")",
            k(p),
            k(p1),
            k(p2)
        );
    }
    Ok(())
}
