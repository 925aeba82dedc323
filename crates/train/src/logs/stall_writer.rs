//! The stall rows of completed steps ([`StallWriter`]): the optimizer's counts read `lag`
//! steps late (so reading them never waits for the device), each update's total handed to the
//! optimizer's adaptive reset rule, and the rows written to `stalls.jsonl` ([`RunLogs`]).

use super::stalls::{StallRow, Theory};
use super::RunLogs;
use anyhow::Result;
use lowbit_optim::{Optimizer, StallCounts};
use std::collections::VecDeque;

/// Writes `stalls.jsonl` rows for completed steps, `lag` steps behind the newest, and hands
/// each update's total counts to the optimizer's adaptive reset rule.
pub struct StallWriter {
    pub names: Vec<String>,
    pub groups: Vec<String>,
    pub theory: Theory,
    pub detail_every: u64,
    /// The states' settings: v-only resets are logged with their zero gradients.
    pub spec: lowbit_optim::StatesSpec,
}

impl StallWriter {
    /// Write (to `out`: `None` on ranks other than 0) the rows of all but the newest `lag` pending steps (`(step, update)`, `update`
    /// the optimizer's step number or `None` for a skipped step, which has zero counts).
    /// Returns the last written (m, v) fractions.
    pub fn flush(
        &self,
        pending: &mut VecDeque<(u64, Option<u64>)>,
        lag: usize,
        opt: &mut dyn Optimizer,
        mut out: Option<&mut RunLogs>,
    ) -> Result<Option<(Option<f64>, Option<f64>)>> {
        let mut last = None;
        while pending.len() > lag {
            let (step, update) = pending.pop_front().expect("non-empty");
            let counts = match update {
                Some(u) => opt.stall_counts(u)?,
                None => vec![StallCounts::default(); self.names.len()],
            };
            let detail = self.detail_every > 0 && step % self.detail_every == 0;
            let row = StallRow::build(step, &self.names, &self.groups, &counts, self.theory, detail);
            if let Some(u) = update {
                let total: StallCounts = counts.iter().copied().sum();
                opt.observe(u, &total);
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
            if let Some(out) = out.as_deref_mut() {
                out.stall(&row)?;
            }
            last = Some((row.frac.m, row.frac.v));
        }
        Ok(last)
    }
}
