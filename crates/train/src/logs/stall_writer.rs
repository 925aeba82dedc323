//! The stall rows of completed steps ([`StallWriter`]): which steps' rows are due (`lag` steps
//! behind the newest, so that reading the optimizer's counts never waits for the device) and
//! the rows themselves, written to `stalls.jsonl` ([`RunLogs`]) from the counts the trainer
//! read from the optimizer (which observes them itself for its adaptive reset rule).

use super::stalls::{StallRow, Theory};
use super::RunLogs;
use anyhow::Result;
use lowbit_optim::{Moments, StallCounts};
use std::collections::VecDeque;

/// Writes `stalls.jsonl` rows for completed steps, `lag` steps behind the newest.
pub struct StallWriter {
    pub names: Vec<String>,
    pub groups: Vec<String>,
    pub theory: Theory,
    pub detail_every: u64,
    /// The states' settings: v-only resets are logged with their zero gradients.
    pub spec: lowbit_optim::StatesSpec,
    /// Steps whose rows are not written yet, with their optimizer update number (`None`:
    /// skipped).
    pending: VecDeque<(u64, Option<u64>)>,
}

impl StallWriter {
    /// A writer of the rows of the tensors of `states` (in the optimizer's order), with
    /// `theory`'s predictions, per-tensor detail every `detail_every` steps.
    pub fn new(states: &Moments, theory: Theory, detail_every: u64) -> Self {
        let names = states.tensors.iter().map(|t| t.info.name.clone()).collect();
        let groups = states.tensors.iter().map(|t| t.info.group.clone()).collect();
        StallWriter { names, groups, theory, detail_every, spec: states.spec, pending: VecDeque::new() }
    }

    /// Queues the row of completed step `step`, whose optimizer update was `update` (`None`
    /// for a skipped step, which has zero counts).
    pub fn push(&mut self, step: u64, update: Option<u64>) {
        self.pending.push_back((step, update));
    }

    /// The oldest queued step (with its update) once more than `lag` steps are queued.
    pub fn next_due(&mut self, lag: usize) -> Option<(u64, Option<u64>)> {
        (self.pending.len() > lag).then(|| self.pending.pop_front()).flatten()
    }

    /// Writes (to `out`: `None` on ranks other than 0) the row of step `step` from its update
    /// number and each tensor's counts (`None` for a skipped step: zero counts). Returns the
    /// row's (m, v) stalled fractions.
    ///
    /// # Errors
    /// The row cannot be written.
    pub fn write(&self, step: u64, update: Option<(u64, &[StallCounts])>, out: Option<&mut RunLogs>) -> Result<(Option<f64>, Option<f64>)> {
        let zeros = vec![StallCounts::default(); self.names.len()];
        let detail = self.detail_every > 0 && step.is_multiple_of(self.detail_every);
        let counts = update.map_or(&zeros[..], |(_, c)| c);
        let row = StallRow::build(step, &self.names, &self.groups, counts, self.theory, detail);
        if let Some((u, _)) = update {
            if self.spec.v_only_reset_at(u) && out.is_some() {
                let what = match self.spec.v_reset_idle {
                    lowbit_optim::VResetIdle::Reset => "moved by lr * m / eps",
                    lowbit_optim::VResetIdle::Keep => "kept their v (optim.states.v_reset_idle = \"keep\")",
                };
                tracing::info!(
                    "step {step}: v reset without m: {} of {} elements had a zero gradient and {what}",
                    row.zero_grad,
                    row.v.elements
                );
            }
        }
        if let Some(out) = out {
            out.stall(&row)?;
        }
        Ok((row.frac.m, row.frac.v))
    }
}
