//! Learning-rate schedule: linear warmup from 0 to the peak over `warmup` steps, then cosine
//! decay from the peak to `min_ratio * peak` at `total` steps (as in GaLore/ReLoRA's C4 runs
//! and nanoGPT).
//!
//! Edges, defined so that every run reaches the peak and a run of two steps or more ends at
//! the minimum:
//! * without warmup (`warmup = 0`) step 1 is at the peak;
//! * a run of one step runs at the peak;
//! * a warmup as long as the run or longer (`warmup >= total`) is cut to `total - 1` steps
//!   (the trainer warns), so the last step is still at the minimum instead of the run never
//!   decaying.

/// Learning rate at optimizer step `step` (1-based).
///
/// With `w = min(warmup, total - 1)` and the peak at step `p = max(w, 1)`: `step <= w`:
/// `peak * step / w`; afterwards `peak * (min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2)`
/// with `progress = (step - p) / (total - p)` clamped to [0, 1] (0 when `total = p`).
pub fn learning_rate(step: u64, peak: f64, warmup: u64, total: u64, min_ratio: f64) -> f64 {
    let warmup = warmup.min(total.saturating_sub(1));
    if step <= warmup {
        return peak * step as f64 / warmup as f64;
    }
    let at_peak = warmup.max(1);
    let span = total.saturating_sub(at_peak);
    let progress = if span == 0 { 0.0 } else { (step.saturating_sub(at_peak) as f64 / span as f64).clamp(0.0, 1.0) };
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
    }

    #[test]
    fn schedule_edges() {
        // warmup 0: step 1 at the peak, the last step at the minimum
        assert_eq!(learning_rate(1, 1.0, 0, 10, 0.1), 1.0);
        assert!((learning_rate(10, 1.0, 0, 10, 0.1) - 0.1).abs() < 1e-15);
        // warmup 0, one step: at the peak (not at the minimum)
        assert_eq!(learning_rate(1, 1.0, 0, 1, 0.1), 1.0);
        // warmup >= total: cut to total - 1 steps, then the last step at the minimum
        let lr = |s| learning_rate(s, 1.0, 100, 5, 0.1);
        assert_eq!([lr(1), lr(2), lr(4)], [0.25, 0.5, 1.0]);
        assert!((lr(5) - 0.1).abs() < 1e-15, "decays: {}", lr(5));
        assert_eq!(learning_rate(1, 1.0, 100, 1, 0.1), 1.0, "one step, long warmup: the peak");
        // two steps, warmup 0: peak, then minimum
        assert_eq!(learning_rate(1, 1.0, 0, 2, 0.1), 1.0);
        assert!((learning_rate(2, 1.0, 0, 2, 0.1) - 0.1).abs() < 1e-15);
    }
}
