//! Statistics over seeds: per-cell means and sample spreads of the final validation loss,
//! seed-paired deltas between cells, stalled fractions, and the verdict on each of the
//! paper's orderings seed by seed. Pure functions of [`Results`].

use super::paper::{Cell, Claim};
use std::collections::BTreeMap;

/// The numbers of one finished run, as a report uses them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunResult {
    /// Final validation loss (nats/token).
    pub val_loss: Option<f64>,
    /// Mean stalled fractions over the second half of the run.
    pub stall_m: Option<f64>,
    pub stall_v: Option<f64>,
    /// BF16 weights (model.dtype = "bf16").
    pub stall_w: Option<f64>,
    /// The same for m and v under the paper's estimator (Alg. 2: unchanged entries / all
    /// entries, zero-gradient entries included).
    pub unchanged_m: Option<f64>,
    pub unchanged_v: Option<f64>,
    /// SOAP's preconditioners L and R (lowbit's estimator; `None` for AdamW runs).
    pub stall_precond: Option<f64>,
    /// The theory's stalled fraction of v for the run's format, b2 and rounding
    /// (`lowbit_optim::theory`, recorded by the run).
    pub theory_v: Option<f64>,
    /// The run diverged: its final validation loss is not finite or above the initial one.
    pub diverged: bool,
}

/// Per cell, per seed (index = seed), the run's numbers (`None`: missing or failed).
pub type Results = BTreeMap<Cell, Vec<Option<RunResult>>>;

/// Mean over seeds, sample standard deviation (n > 1) and the number of seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub mean: f64,
    /// Sample standard deviation, `None` for one value.
    pub sd: Option<f64>,
    /// Number of values.
    pub n: usize,
}

impl Stat {
    /// Mean and sample standard deviation (n - 1 in the denominator) of `xs`; `None` if empty.
    pub fn of(xs: &[f64]) -> Option<Stat> {
        if xs.is_empty() {
            return None;
        }
        let n = xs.len();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let sd = (n > 1).then(|| (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt());
        Some(Stat { mean, sd, n })
    }
    /// `3.2100`, `3.2100 ± 0.0040`, signed with `sign` (no `-0.0000`).
    pub fn fmt(&self, sign: bool) -> String {
        let mean = if self.mean.abs() < 5e-5 { 0.0 } else { self.mean };
        let m = if sign { format!("{mean:+.4}") } else { format!("{mean:.4}") };
        match self.sd {
            Some(sd) => format!("{m} ± {sd:.4}"),
            None => m,
        }
    }
}

fn losses(r: &Results, c: Cell) -> Vec<Option<f64>> {
    r.get(&c).map_or(vec![], |v| v.iter().map(|x| x.and_then(|x| x.val_loss)).collect())
}

/// Final validation loss of a cell over its seeds.
pub fn loss_stat(r: &Results, c: Cell) -> Option<Stat> {
    Stat::of(&losses(r, c).into_iter().flatten().collect::<Vec<_>>())
}

/// Per-seed differences `a - b`, as `(seed, difference)`, over the seeds where both cells
/// have a loss.
pub fn paired_diffs(r: &Results, a: Cell, b: Cell) -> Vec<(usize, f64)> {
    losses(r, a).into_iter().zip(losses(r, b)).enumerate().filter_map(|(seed, (x, y))| Some((seed, x? - y?))).collect()
}

/// Seed-paired `a - b`: mean and spread over the paired seeds.
pub fn delta(r: &Results, a: Cell, b: Cell) -> Option<Stat> {
    Stat::of(&paired_diffs(r, a, b).into_iter().map(|d| d.1).collect::<Vec<_>>())
}

/// One number of a cell's runs (`pick`) over its seeds.
pub fn run_stat(r: &Results, c: Cell, pick: fn(&RunResult) -> Option<f64>) -> Option<Stat> {
    let xs: Vec<f64> = r.get(&c).map_or(vec![], |runs| runs.iter().flatten().filter_map(pick).collect());
    Stat::of(&xs)
}

/// Whether any run of a cell diverged.
pub fn any_diverged(r: &Results, c: Cell) -> bool {
    r.get(&c).is_some_and(|v| v.iter().flatten().any(|x| x.diverged))
}

/// How a claim fares over the paired seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The relation holds in every paired seed.
    HoldsInAll,
    /// It holds in some paired seeds and not in others.
    Mixed,
    /// It holds in none.
    DoesNotHold,
    /// A run of either cell diverged: the comparison means nothing.
    Diverged,
    /// No seed has both cells.
    Missing,
}

impl Outcome {
    /// The report's word for the outcome.
    pub fn word(self) -> &'static str {
        match self {
            Outcome::HoldsInAll => "holds in all seeds",
            Outcome::Mixed => "mixed",
            Outcome::DoesNotHold => "does not hold",
            Outcome::Diverged => "n/a (a run diverged)",
            Outcome::Missing => "n/a (missing runs)",
        }
    }
}

/// Verdict on a claim from the seed-paired deltas.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Holds in all seeds, mixed, does not hold, or not judged.
    pub outcome: Outcome,
    /// lhs - rhs per paired seed, `(seed, difference)`.
    pub per_seed: Vec<(usize, f64)>,
    /// lhs - rhs over the paired seeds.
    pub delta: Option<Stat>,
    /// Seeds in which the relation holds, of the paired seeds.
    pub seeds_holding: usize,
}

/// Check a claim seed by seed: it holds in all seeds, some (mixed) or none; no verdict when
/// no seed has both cells or a run of either cell diverged.
pub fn evaluate_claim(r: &Results, c: &Claim) -> Verdict {
    let per_seed = paired_diffs(r, c.lhs, c.rhs);
    let seeds_holding = per_seed.iter().filter(|d| c.relation.holds(d.1)).count();
    let outcome = if any_diverged(r, c.lhs) || any_diverged(r, c.rhs) {
        Outcome::Diverged
    } else if per_seed.is_empty() {
        Outcome::Missing
    } else if seeds_holding == per_seed.len() {
        Outcome::HoldsInAll
    } else if seeds_holding == 0 {
        Outcome::DoesNotHold
    } else {
        Outcome::Mixed
    };
    Verdict { outcome, delta: Stat::of(&per_seed.iter().map(|d| d.1).collect::<Vec<_>>()), per_seed, seeds_holding }
}
