//! State resets (docs/numerics.md, "Resets"; the paper's Alg. 1 and 2, arXiv:2603.16731v1).
//!
//! Periodic ([`reset_at`]): a pure function of the update number, so a resumed run resets at
//! the same updates. With period K > 0, the state is zeroed before the updates K+1, 2K+1, ...:
//! updates 1..=K use the first state, update K+1 starts a fresh one. The bias-correction
//! counter of that state is `t - last_reset` (restart) or `t` (continue).
//!
//! Adaptive ([`AdaptiveReset`], Alg. 2): m and v reset together when the stalling measured in
//! the current cycle says the cycle has aged enough.

use crate::error::OptimError;
use crate::states::theory::reset_threshold;
use serde::{Deserialize, Serialize};

/// When the bias-correction counter starts again after a reset (`optim.states.bias_correction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BiasCorrection {
    /// `t` counts steps since the state's last reset (default; a reset state is a fresh Adam).
    Restart,
    /// `t` counts steps since the start of training, ignoring resets.
    Continue,
}

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

/// Updates by which an adaptive decision lags the measurement it uses: the decision before
/// update `u` sees the stalled fractions of updates up to `u - 1 - ADAPTIVE_LAG`. The GPU's
/// stall counters are read that many steps late (the step never waits for the device), and the
/// CPU uses the same lag so that both decide identically.
pub const ADAPTIVE_LAG: u64 = 8;

/// The adaptive reset rule (the paper's Alg. 2) and its state, which checkpoints carry.
///
/// Within a cycle (the updates since the last reset, ages `j = 1, 2, ...`), each measured
/// stalled fraction `P(j)` of v (the paper's estimator: unchanged entries / all entries, as
/// `Counter::unchanged_fraction` gives it) adds `max(0, (P(j) - s0) / (1 - s0))` to `A`; once
/// `A / j - E(j) > 0` (`E(j) = 2 b2^j / (1 + b2^j)`, [`reset_threshold`]) m and v reset
/// before the next update this rule decides, and a new cycle begins with `A = 0`. Decisions
/// use measurements [`ADAPTIVE_LAG`] updates old, so a reset comes `ADAPTIVE_LAG` updates
/// after the measurement that calls for it, and the first `ADAPTIVE_LAG + 1` updates of a cycle
/// cannot end it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveReset {
    /// First update of the current cycle (1 at the start of training).
    pub cycle_start: u64,
    /// `A`: the cycle's accumulated excess stalling.
    pub acc: f64,
    /// The next update whose measurement the rule consumes.
    pub next: u64,
    /// The last update decided ([`Self::reset_before`] is idempotent for it), 0 before any.
    pub decided: u64,
    /// Measurements observed but not consumed yet: (update, stalled fraction of v).
    pub pending: Vec<(u64, f64)>,
}

impl Default for AdaptiveReset {
    fn default() -> Self {
        AdaptiveReset { cycle_start: 1, acc: 0.0, next: 1, decided: 0, pending: Vec::new() }
    }
}

impl AdaptiveReset {
    /// Record the stalled fraction of v measured at `update` (measurements of an older cycle,
    /// or already consumed, are dropped).
    pub fn observe(&mut self, update: u64, fraction: f64) {
        if update >= self.next && !self.pending.iter().any(|&(u, _)| u == update) {
            self.pending.push((update, fraction));
        }
    }

    /// Whether m and v reset before `update` (updates in increasing order; asking again for
    /// the last one decided gives the same answer). Consumes the measurements of the current
    /// cycle up to `update - 1 - ADAPTIVE_LAG`.
    ///
    /// # Errors
    /// A measurement the rule needs was never observed (the trainer must observe every
    /// update's stall counts), or `update` goes back before the last one decided.
    pub fn reset_before(&mut self, update: u64, beta2: f64, s0: f64) -> Result<bool, OptimError> {
        if update == self.decided {
            return Ok(update == self.cycle_start && update > 1);
        }
        if update < self.decided {
            return Err(OptimError::Reset(format!("adaptive reset: update {update} after update {} was decided", self.decided)));
        }
        self.decided = update;
        let last = update.saturating_sub(1 + ADAPTIVE_LAG);
        while self.next <= last {
            let t = self.next;
            let at = self.pending.iter().position(|&(u, _)| u == t).ok_or_else(|| {
                OptimError::Reset(format!(
                    "adaptive reset: the stalled fraction of v at update {t} was not observed (needed before update {update})"
                ))
            })?;
            let (_, p) = self.pending.swap_remove(at);
            self.next += 1;
            let age = t + 1 - self.cycle_start;
            self.acc += ((p - s0) / (1.0 - s0)).max(0.0);
            if self.acc / age as f64 - reset_threshold(beta2, age) > 0.0 {
                self.cycle_start = update;
                self.acc = 0.0;
                self.next = update;
                self.pending.retain(|&(u, _)| u >= update);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The update before which the rule last reset m and v; `None` before any reset.
    pub fn last_reset(&self) -> Option<u64> {
        (self.cycle_start > 1).then_some(self.cycle_start)
    }

    /// The bias-correction counter of `update` (after [`Self::reset_before`] decided it).
    pub fn bias_t(&self, update: u64, mode: BiasCorrection) -> u64 {
        match mode {
            BiasCorrection::Restart => update + 1 - self.cycle_start.min(update),
            BiasCorrection::Continue => update,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alg. 2 by hand: with every measured fraction 1 the excess is 1 per update and A / j = 1
    /// exceeds E(j) < 1 at once, so the first decision that sees a measurement (update
    /// ADAPTIVE_LAG + 2) resets; with fractions below s0 it never does.
    #[test]
    fn adaptive_rule_resets_when_the_cycle_has_aged() {
        let mut a = AdaptiveReset::default();
        let first = ADAPTIVE_LAG + 2;
        for u in 1..first {
            assert!(!a.reset_before(u, 0.999, 0.6).unwrap(), "update {u}");
            a.observe(u, 1.0);
        }
        assert!(a.reset_before(first, 0.999, 0.6).unwrap());
        assert!(a.reset_before(first, 0.999, 0.6).unwrap(), "idempotent");
        assert_eq!((a.cycle_start, a.bias_t(first, BiasCorrection::Restart), a.bias_t(first + 3, BiasCorrection::Restart)), (first, 1, 4));
        assert!(a.pending.is_empty(), "the old cycle's measurements are dropped");
        // below s0: A stays 0
        let mut b = AdaptiveReset::default();
        for u in 1..200 {
            assert!(!b.reset_before(u, 0.999, 0.6).unwrap());
            b.observe(u, 0.5);
        }
        // a missing measurement is an error, not a silent default
        let mut c = AdaptiveReset::default();
        let e = c.reset_before(first, 0.999, 0.6).unwrap_err().to_string();
        assert!(e.contains("update 1 was not observed"), "{e}");
    }

    /// The rule's bound: with v stalled in every element from the first update (FP4
    /// v starts near 0.97), it resets as often as it can and no more often: every
    /// `ADAPTIVE_LAG + 1` updates, since a cycle's first `ADAPTIVE_LAG + 1` updates cannot end it.
    #[test]
    fn adaptive_rule_fires_at_most_every_lag_plus_one_updates() {
        let mut a = AdaptiveReset::default();
        let mut resets = vec![];
        for u in 1..=1000 {
            if a.reset_before(u, 0.999, 0.6).unwrap() {
                resets.push(u);
            }
            a.observe(u, 1.0);
        }
        assert_eq!(resets[0], ADAPTIVE_LAG + 2);
        assert!(resets.windows(2).all(|w| w[1] - w[0] == ADAPTIVE_LAG + 1), "{resets:?}");
        assert_eq!(resets.len() as u64, (1000 - 1) / (ADAPTIVE_LAG + 1));
    }

    /// With a fraction just above s0 the excess is small: the reset comes when A/j passes
    /// E(j), which falls with b2^j. Cross-checked against a direct evaluation of the rule.
    #[test]
    fn adaptive_rule_matches_a_direct_evaluation() {
        let (b2, s0, p) = (0.99, 0.6, 0.8);
        // direct: first age j with (j * (p - s0)/(1 - s0)) / j - E(j) > 0
        let excess = (p - s0) / (1.0 - s0);
        let j = (1..).find(|&j| excess - reset_threshold(b2, j) > 0.0).unwrap();
        let mut a = AdaptiveReset::default();
        let mut reset_at = None;
        for u in 1..1000 {
            if a.reset_before(u, b2, s0).unwrap() {
                reset_at = Some(u);
                break;
            }
            a.observe(u, p);
        }
        assert_eq!(reset_at, Some(j + 1 + ADAPTIVE_LAG), "measured at age {j}, applied {ADAPTIVE_LAG} updates later");
    }

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
