//! State resets (DESIGN.md, "Resets"): a pure function of the step, so a resumed run
//! resets at the same steps.
//!
//! With period K > 0, the state is zeroed before the update of steps K+1, 2K+1, ...: steps
//! 1..=K use the first state, step K+1 starts a fresh one. The bias-correction counter
//! of that state is `t - last_reset` (restart) or `t` (continue).

use crate::config::BiasCorrection;

/// Whether to reset before step `step` (1-based) and the bias-correction counter to use.
///
/// Returns `(reset, t)` with `t >= 1`.
pub fn reset_at(step: u64, every: u64, mode: BiasCorrection) -> (bool, u64) {
    assert!(step >= 1, "steps are 1-based");
    if every == 0 {
        return (false, step);
    }
    let last = (step - 1) / every * every; // step index just before the current state started
    let reset = step > 1 && (step - 1).is_multiple_of(every);
    let t = match mode {
        BiasCorrection::Restart => step - last,
        BiasCorrection::Continue => step,
    };
    (reset, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_schedule() {
        let r = |s| reset_at(s, 3, BiasCorrection::Restart);
        assert_eq!(r(1), (false, 1));
        assert_eq!(r(3), (false, 3));
        assert_eq!(r(4), (true, 1));
        assert_eq!(r(6), (false, 3));
        assert_eq!(r(7), (true, 1));
        assert_eq!(reset_at(7, 3, BiasCorrection::Continue), (true, 7));
        assert_eq!(reset_at(7, 0, BiasCorrection::Restart), (false, 7));
    }
}
