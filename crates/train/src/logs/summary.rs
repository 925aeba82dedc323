//! `summary.json` and the one-screen summary printed at the end of a run, computed from the
//! run's own files (so a resumed run summarises the whole run).

use super::metrics::{read_rows, MetricsRow};
use super::stalls::StallRow;
use crate::output::fixed;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How a run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Reached `train.max_steps` with finite numbers.
    #[default]
    Finished,
    /// Stopped by Ctrl-C or SIGTERM after a checkpoint; `--resume` continues it.
    Interrupted,
    /// Ended with a non-finite loss, gradient norm or validation loss (the exit status is 1).
    NonFinite,
}

/// End-of-run numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How the run ended (summaries written before this was recorded read as `finished`).
    #[serde(default)]
    pub status: RunStatus,
    pub steps: u64,
    pub tokens: u64,
    pub params: usize,
    /// Optimizer state bytes (codes + scales) and per parameter.
    pub state_bytes: usize,
    pub state_bytes_per_param: f64,
    /// Optimizer state bytes that one GPU/process holds: rank 0's shard with `train.zero = 1`,
    /// else `state_bytes` (summaries written before this was recorded read 0).
    #[serde(default)]
    pub state_bytes_per_rank: usize,
    /// Validation loss at step 0 and at the end.
    pub initial_val_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
    /// Mean training loss of the last 10 steps.
    pub final_train_loss: Option<f64>,
    /// Mean stalled fractions over the second half of the run (docs/numerics.md: stalling grows
    /// with the age of the state), and the theory for v.
    pub mean_stall_m: Option<f64>,
    pub mean_stall_v: Option<f64>,
    pub mean_stall_w: Option<f64>,
    /// The same means under the paper's estimator (unchanged / all entries, Alg. 2; absent in
    /// summaries written before it was counted).
    #[serde(default)]
    pub mean_unchanged_m: Option<f64>,
    #[serde(default)]
    pub mean_unchanged_v: Option<f64>,
    #[serde(default)]
    pub mean_unchanged_w: Option<f64>,
    /// The same two means for SOAP's preconditioners L and R (`optim.kind = "soap"`); absent
    /// (and left out of `summary.json`) for AdamW runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_stall_precond: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_unchanged_precond: Option<f64>,
    pub theory_stall_v: Option<f64>,
    /// Mean per step, over the second half, of the updates made with v = 0 and m != 0 (each
    /// moved by lr * m^ / eps, `lowbit_optim::StallCounts::zero_v`); absent in summaries
    /// written before it was counted.
    #[serde(default)]
    pub mean_zero_v: Option<f64>,
    /// Steps whose update was skipped (non-finite loss or gradient norm).
    #[serde(default)]
    pub skipped_steps: u64,
    /// Training throughput of this invocation.
    pub tokens_per_s: f64,
    /// Peak resident memory of the process (CPU) or peak device memory in use (CUDA), bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Passes over the training text made by the run (epochs, fractional: its target tokens
    /// over `tokens_per_epoch`); absent in summaries written before it was recorded.
    #[serde(default)]
    pub epochs: Option<f64>,
    /// Target tokens of one pass over the training text, and whether the count is exact
    /// (in-memory mode and token shards) or estimated from the shards' size.
    #[serde(default)]
    pub tokens_per_epoch: Option<u64>,
    #[serde(default)]
    pub tokens_per_epoch_exact: Option<bool>,
    /// The order the training rows were read in ([`lowbit_data::RowOrder::describe`]).
    #[serde(default)]
    pub data_order: Option<String>,
    /// Which tensors got which states (`[optim.states.groups.*]`, `min_quantized_numel`):
    /// one entry per state setting, `[optim.states]`'s first; absent in summaries written
    /// before it was recorded.
    #[serde(default)]
    pub state_groups: Option<Vec<StateGroup>>,
}

/// The tensors of one state setting and what their states cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateGroup {
    /// The setting ([`lowbit_optim::StatesSpec::describe`]).
    pub states: String,
    /// The tensor groups (`embed`, `attn`, `mlp`, `norm`, `head`) with tensors in it.
    pub groups: Vec<String>,
    pub tensors: usize,
    pub params: usize,
    /// State bytes (codes + scales) of its tensors, and per parameter.
    pub state_bytes: usize,
    pub state_bytes_per_param: f64,
}

impl StateGroup {
    /// One entry per state setting of `states` ([`lowbit_optim::Moments::spec_groups`]).
    pub fn of(states: lowbit_optim::HostStates<'_>) -> Vec<StateGroup> {
        let opt = states.moments;
        opt.spec_groups()
            .into_iter()
            .map(|(spec, ids)| {
                let ts: Vec<_> = ids.iter().map(|&i| &opt.tensors[i]).collect();
                let mut groups: Vec<String> = ts.iter().map(|t| t.info.group.clone()).collect();
                groups.sort();
                groups.dedup();
                let params: usize = ts.iter().map(|t| t.info.len).sum();
                // with SOAP, each tensor's preconditioners and bases too
                let precond = |i: usize| states.precond.map_or(0, |s| s.tensors[i].bytes());
                let bytes: usize = ids.iter().map(|&i| opt.tensors[i].m.bytes() + opt.tensors[i].v.bytes() + precond(i)).sum();
                StateGroup {
                    states: spec.describe(),
                    groups,
                    tensors: ts.len(),
                    params,
                    state_bytes: bytes,
                    state_bytes_per_param: bytes as f64 / params.max(1) as f64,
                }
            })
            .collect()
    }

    /// The banner's line: `states for embed (2 tensors, 1.6M params, 8.000 bytes/param): ...`.
    pub fn line(&self) -> String {
        format!(
            "states for {} ({} tensors, {} params, {:.3} bytes/param): {}",
            self.groups.join(", "),
            self.tensors,
            self.params,
            self.state_bytes_per_param,
            self.states
        )
    }
}

/// Mean of the `Some` values.
pub fn mean(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = xs.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Summarise a run folder.
pub fn build(
    run_dir: &Path,
    params: usize,
    state_bytes: usize,
    tokens_per_s: f64,
    last_val: Option<f64>,
    device_peak: Option<u64>,
    status: RunStatus,
) -> Result<Summary> {
    let rows: Vec<MetricsRow> = read_rows(&run_dir.join("metrics.jsonl"))?;
    let stalls: Vec<StallRow> = read_rows(&run_dir.join("stalls.jsonl"))?;
    let train: Vec<(u64, u64, f64, bool)> = rows
        .iter()
        .filter_map(|r| match r {
            MetricsRow::Train { step, tokens, loss, skipped, .. } => Some((*step, *tokens, *loss, *skipped)),
            _ => None,
        })
        .collect();
    let evals: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| match r {
            MetricsRow::Eval { step, val_loss, .. } => Some((*step, *val_loss)),
            _ => None,
        })
        .collect();
    let half = &stalls[stalls.len() / 2..];
    Ok(Summary {
        status,
        steps: train.last().map_or(0, |t| t.0),
        tokens: train.last().map_or(0, |t| t.1),
        params,
        state_bytes,
        state_bytes_per_param: state_bytes as f64 / params.max(1) as f64,
        state_bytes_per_rank: state_bytes,
        initial_val_loss: evals.iter().find(|e| e.0 == 0).map(|e| e.1),
        final_val_loss: last_val.or(evals.last().map(|e| e.1)),
        final_train_loss: mean(train.iter().rev().take(10).map(|t| t.2.is_finite().then_some(t.2))),
        mean_stall_m: mean(half.iter().map(|r| r.frac.m)),
        mean_stall_v: mean(half.iter().map(|r| r.frac.v)),
        mean_stall_w: mean(half.iter().map(|r| r.frac.w)),
        mean_unchanged_m: mean(half.iter().map(|r| r.frac.m_unchanged)),
        mean_unchanged_v: mean(half.iter().map(|r| r.frac.v_unchanged)),
        mean_unchanged_w: mean(half.iter().map(|r| r.frac.w_unchanged)),
        mean_stall_precond: mean(half.iter().map(|r| r.frac.precond)),
        mean_unchanged_precond: mean(half.iter().map(|r| r.frac.precond_unchanged)),
        theory_stall_v: stalls.last().and_then(|r| r.theory.v),
        mean_zero_v: mean(half.iter().map(|r| r.frac.zero_v)),
        skipped_steps: train.iter().filter(|t| t.3).count() as u64,
        tokens_per_s,
        peak_memory_bytes: device_peak.or_else(process_peak_memory),
        epochs: None,
        tokens_per_epoch: None,
        tokens_per_epoch_exact: None,
        data_order: None,
        state_groups: None,
    })
}

/// Peak resident memory of this process (VmHWM), bytes.
fn process_peak_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Summary {
    /// The one-screen text summary (the preconditioners' stalled fractions only for a SOAP run).
    pub fn render(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let precond = |x: Option<f64>| x.map_or(String::new(), |p| format!(" | preconditioners {p:.3}"));
        format!(
            "\n── run summary ─────────────────────────────────────────────\n\
             steps {} | tokens {} | {:.0} tokens/s | peak memory {}\n\
             validation loss {} -> {} | train loss (mean of last 10 steps) {}\n\
             stalled fraction (2nd half): m {} | v {} (theory {}) | weights {}{}\n\
             unchanged entries (paper's estimator): m {} | v {} | weights {}{}\n\
             params {} | optimizer states {} bytes ({:.3} bytes/param)\n\
             data: {} passes over the training text ({} tokens each{}), {}{}\n",
            self.steps,
            self.tokens,
            self.tokens_per_s,
            self.peak_memory_bytes.map_or("-".into(), |b| format!("{:.2} GiB", gib(b))),
            fixed(self.initial_val_loss, 4),
            fixed(self.final_val_loss, 4),
            fixed(self.final_train_loss, 4),
            fixed(self.mean_stall_m, 3),
            fixed(self.mean_stall_v, 3),
            fixed(self.theory_stall_v, 3),
            fixed(self.mean_stall_w, 3),
            precond(self.mean_stall_precond),
            fixed(self.mean_unchanged_m, 3),
            fixed(self.mean_unchanged_v, 3),
            fixed(self.mean_unchanged_w, 3),
            precond(self.mean_unchanged_precond),
            self.params,
            self.state_bytes,
            self.state_bytes_per_param,
            fixed(self.epochs, 2),
            self.tokens_per_epoch.map_or("-".into(), |t| t.to_string()),
            if self.tokens_per_epoch_exact == Some(false) { ", estimated" } else { "" },
            self.data_order.as_deref().unwrap_or("-"),
            if self.skipped_steps > 0 {
                format!("\nskipped updates (non-finite loss or gradient norm): {}", self.skipped_steps)
            } else {
                String::new()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::stalls::Theory;
    use lowbit_optim::{Counter, StallCounts};

    /// A run folder of 4 steps whose rows count `precond(step)` for the preconditioners (none
    /// when `None`) beside fixed m and v counts.
    fn run(dir: &Path, precond: fn(u64) -> Option<Counter>) -> Summary {
        let mut metrics = String::new();
        let mut stalls = String::new();
        for step in 1..=4u64 {
            let train = MetricsRow::Train {
                step,
                tokens: 64 * step,
                lr: 1e-3,
                loss: 5.0,
                grad_norm: 1.0,
                step_time: 0.1,
                tokens_per_s: 640.0,
                skipped: false,
                mfu: None,
            };
            metrics += &format!("{}\n", serde_json::to_string(&train).unwrap());
            let m = Counter { updated: 10, stalled: 5, unchanged: 5, elements: 10 };
            let c = StallCounts { m, v: m, precond: precond(step).unwrap_or_default(), ..Default::default() };
            let row = StallRow::build(step, &["w".into()], &["mlp".into()], &[c], Theory { v: None }, false);
            stalls += &format!("{}\n", serde_json::to_string(&row).unwrap());
        }
        std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
        std::fs::write(dir.join("stalls.jsonl"), stalls).unwrap();
        build(dir, 100, 400, 640.0, Some(4.5), Some(1), RunStatus::Finished).unwrap()
    }

    /// SOAP: the preconditioners' means are over the second half (steps 3 and 4: 0.5 and 1.0
    /// stalled / updated, 0.25 and 0.75 unchanged / all) and printed; AdamW: neither in
    /// `summary.json` nor in the printed summary.
    #[test]
    fn the_summary_gives_the_preconditioners_second_half_means() {
        let dir = tempfile::tempdir().unwrap();
        let soap = run(dir.path(), |step| {
            let (stalled, unchanged) = if step < 4 { (4, 2) } else { (8, 6) };
            Some(Counter { updated: 8, stalled, unchanged, elements: 8 })
        });
        assert_eq!((soap.mean_stall_precond, soap.mean_unchanged_precond), (Some(0.75), Some(0.5)));
        let text = soap.render();
        assert!(text.contains("weights - | preconditioners 0.750\n"), "{text}");
        assert!(text.contains("| weights - | preconditioners 0.500\n"), "{text}");
        assert!(serde_json::to_string(&soap).unwrap().contains(r#""mean_stall_precond":0.75,"mean_unchanged_precond":0.5"#));
        let adamw = run(dir.path(), |_| None);
        assert_eq!((adamw.mean_stall_m, adamw.mean_stall_precond, adamw.mean_unchanged_precond), (Some(0.5), None, None));
        assert!(!serde_json::to_string(&adamw).unwrap().contains("precond"));
        assert!(!adamw.render().contains("preconditioners"));
    }
}
