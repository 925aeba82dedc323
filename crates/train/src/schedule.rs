//! Learning-rate schedule: linear warmup from 0 to the peak over `warmup` steps, then cosine
//! decay to `min_ratio * peak` at `total` steps (as in GaLore/ReLoRA's C4 runs and nanoGPT).

/// Learning rate at optimizer step `step` (1-based).
///
/// `step <= warmup`: `peak * step / warmup`; afterwards
/// `peak * (min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2)` with
/// `progress = (step - warmup) / (total - warmup)` clamped to [0, 1].
pub fn learning_rate(step: u64, peak: f64, warmup: u64, total: u64, min_ratio: f64) -> f64 {
    if warmup > 0 && step <= warmup {
        return peak * step as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).clamp(0.0, 1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    peak * (min_ratio + (1.0 - min_ratio) * cosine)
}

#[cfg(test)]
mod tests {
    use super::learning_rate;

    #[test]
    fn warmup_then_cosine_to_min_ratio() {
        let lr = |s| learning_rate(s, 1e-3, 10, 110, 0.1);
        assert!((lr(1) - 1e-4).abs() < 1e-15);
        assert!((lr(5) - 5e-4).abs() < 1e-15);
        assert!((lr(10) - 1e-3).abs() < 1e-15);
        // halfway through the decay: min + (1 - min) / 2 = 0.55 of peak
        assert!((lr(60) - 0.55e-3).abs() < 1e-12);
        assert!((lr(110) - 1e-4).abs() < 1e-15);
        assert!((lr(500) - 1e-4).abs() < 1e-15, "clamped after the end");
        assert!((learning_rate(1, 1.0, 0, 10, 0.0) - (0.5 * (1.0 + (0.1f64 * std::f64::consts::PI).cos()))).abs() < 1e-12);
    }
}
