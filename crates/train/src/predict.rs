//! `train predict`: the closed-form stalled fraction of v (lowbit_optim::theory).

use anyhow::Result;
use lowbit_optim::{theory, Rounding, StateFormat};

/// Prediction for one format: (format name, fraction bits, nearest, stochastic).
pub fn predict(format: &str, beta2: f64) -> Result<(StateFormat, u32, f64, f64)> {
    anyhow::ensure!((0.0..1.0).contains(&beta2), "--beta2 must be in [0, 1), got {beta2}");
    let f = StateFormat::parse(format, true).map_err(anyhow::Error::msg)?;
    let bits = f.fraction_bits().ok_or_else(|| {
        anyhow::anyhow!("{}: the theory assumes a uniform relative grid; int8's dynamic map has none", f.name())
    })?;
    Ok((f, bits, theory::p_stall_nearest(bits, beta2), theory::p_stall_stochastic(bits, beta2)))
}

/// Print the prediction (text or JSON).
pub fn print(format: &str, beta2: f64, rounding: Option<Rounding>, json: bool) -> Result<()> {
    let (f, bits, pn, ps) = predict(format, beta2)?;
    if json {
        let mut o = serde_json::json!({
            "format": f.name(), "fraction_bits": bits, "beta2": beta2, "rho": theory::rho(bits, beta2),
        });
        if rounding != Some(Rounding::Stochastic) {
            o["nearest"] = pn.into();
        }
        if rounding != Some(Rounding::Nearest) {
            o["stochastic"] = ps.into();
        }
        crate::outln!("{o}");
        return Ok(());
    }
    match rounding {
        Some(Rounding::Nearest) => crate::outln!("{pn:.3}"),
        Some(Rounding::Stochastic) => crate::outln!("{ps:.3}"),
        None => crate::outln!(
            "{pn:.3}/{ps:.3}  (v stalled fraction, {} with {bits} fraction bits, b2 = {beta2}: nearest/stochastic, rho = {:.2})",
            f.name(),
            theory::rho(bits, beta2)
        ),
    }
    Ok(())
}
