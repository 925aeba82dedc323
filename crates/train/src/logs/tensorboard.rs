//! The run's curves as TensorBoard scalars, in `<run>/tensorboard/` beside `metrics.jsonl` and
//! `stalls.jsonl` and from the same rows (`run.tensorboard`, on by default: one small record
//! per step and per stall row, a few MB over 20000 steps; `tensorboard --logdir runs` shows
//! every run). Tags:
//!
//! | tag | from |
//! |---|---|
//! | `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s` | each step's `metrics.jsonl` row |
//! | `val/loss`, `val/ppl` | each validation row (step 0: the initial model) |
//! | `stall_m/all`, `stall_m/<group>` | stalled fraction of m (stalled / updated), over all tensors and per group (`embed`, `attn`, `mlp`, `norm`, `head`) |
//! | `stall_v/all`, `stall_v/<group>`, `stall_v/theory` | the same for v, and the closed-form prediction for the run's format, b2 and rounding |
//! | `stall_w/all`, `stall_w/<group>` | the same for BF16 weights (absent with FP32 weights) |
//! | `stall_precond/all`, `stall_precond/<group>` | the same for SOAP's preconditioners L and R together (`optim.kind = "soap"`; absent under AdamW, and for a group without a preconditioner) |
//! | `zero_v/all`, `zero_v/<group>` | a count: elements updated with v = 0 and m != 0, each moved by lr * m^ / eps (a v rounded or reset to 0 with a zero gradient) |
//!
//! A fraction with nothing updated is left out, not written as 0. A resumed run opens a new
//! event file that starts with a restart marker at the step after its checkpoint, so
//! TensorBoard drops what the previous process logged past the checkpoint (as
//! `metrics.jsonl` is cut there).

use super::event_file::EventWriter;
use super::metrics::MetricsRow;
use super::stalls::{Fractions, StallRow};
use anyhow::Result;
use std::path::Path;

/// The folder inside a run folder that holds the event files.
pub const DIR: &str = "tensorboard";

/// Writes a run's scalars.
pub struct Scalars {
    events: EventWriter,
}

impl Scalars {
    /// A new event file in `<run_dir>/tensorboard/`; `resumed_at`: the checkpoint's step of a
    /// resumed run (a restart marker at the next step).
    ///
    /// # Errors
    /// The folder or file cannot be created or written.
    pub fn open(run_dir: &Path, resumed_at: Option<u64>) -> Result<Scalars> {
        let mut events = EventWriter::create(&run_dir.join(DIR))?;
        if let Some(step) = resumed_at {
            events.start_at(step + 1)?;
        }
        Ok(Scalars { events })
    }

    /// The scalars of a `metrics.jsonl` row.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn metrics(&mut self, row: &MetricsRow) -> Result<()> {
        let (step, values) = metric_scalars(row);
        self.events.scalars(step, values)
    }

    /// The scalars of a `stalls.jsonl` row.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn stalls(&mut self, row: &StallRow) -> Result<()> {
        self.events.scalars(row.step, stall_scalars(row))
    }
}

/// The step and tagged values of a metrics row.
pub fn metric_scalars(row: &MetricsRow) -> (u64, Vec<(String, f32)>) {
    let tagged = |pairs: &[(&str, f64)]| pairs.iter().map(|(t, v)| (t.to_string(), *v as f32)).collect();
    match row {
        MetricsRow::Train { step, lr, loss, grad_norm, tokens_per_s, mfu, .. } => {
            let mut scalars: Vec<(String, f32)> =
                tagged(&[("train/loss", *loss), ("train/lr", *lr), ("train/grad_norm", *grad_norm), ("train/tokens_per_s", *tokens_per_s)]);
            scalars.extend(mfu.map(|x| ("train/mfu".to_string(), x as f32)));
            (*step, scalars)
        }
        MetricsRow::Eval { step, val_loss, val_ppl, .. } => (*step, tagged(&[("val/loss", *val_loss), ("val/ppl", *val_ppl)])),
    }
}

/// The tagged stalled fractions of a stall row: m, v, w and SOAP's preconditioners over all
/// tensors and per group, v's theory, and the count of updates with v = 0 and m != 0 (`zero_v/`, all and per group).
pub fn stall_scalars(row: &StallRow) -> Vec<(String, f32)> {
    type Pick = fn(&Fractions) -> Option<f64>;
    let states: [(&str, Pick); 5] =
        [("stall_m", |f| f.m), ("stall_v", |f| f.v), ("stall_w", |f| f.w), ("stall_precond", |f| f.precond), ("zero_v", |f| f.zero_v)];
    let mut out = Vec::new();
    for (tag, of) in states {
        let groups = std::iter::once(("all", &row.frac)).chain(row.groups.iter().map(|(g, f)| (g.as_str(), f)));
        out.extend(groups.filter_map(|(g, f)| of(f).map(|x| (format!("{tag}/{g}"), x as f32))));
    }
    out.extend(row.theory.v.map(|p| ("stall_v/theory".to_string(), p as f32)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::stalls::Theory;
    use lowbit_optim::Counter;

    #[test]
    fn a_stall_row_gives_every_fraction_it_has() {
        let f = |m, v| Fractions { m: Some(m), v: Some(v), ..Fractions::default() };
        let row = StallRow {
            step: 3,
            m: Counter::default(),
            v: Counter::default(),
            w: Counter::default(),
            zero_grad: 0,
            zero_v: 7,
            precond: Counter::default(),
            frac: Fractions { zero_v: Some(7.0), ..f(0.25, 0.5) },
            groups: [("attn".to_string(), f(0.125, 0.75)), ("embed".to_string(), Fractions { zero_v: Some(7.0), ..Fractions::default() })]
                .into(),
            theory: Theory { v: Some(0.989) },
            tensors: None,
        };
        let tags: Vec<(String, f32)> = stall_scalars(&row);
        let expect = [
            ("stall_m/all", 0.25),
            ("stall_m/attn", 0.125),
            ("stall_v/all", 0.5),
            ("stall_v/attn", 0.75),
            ("zero_v/all", 7.0),
            ("zero_v/embed", 7.0),
            ("stall_v/theory", 0.989),
        ];
        assert_eq!(tags, expect.map(|(t, v)| (t.to_string(), v as f32)));
    }

    /// A SOAP row: `stall_precond/` over all tensors and for the group that has preconditioners,
    /// none for the group without (norms are vectors).
    #[test]
    fn a_soap_row_gives_the_preconditioners_fraction() {
        let row = StallRow {
            step: 4,
            m: Counter::default(),
            v: Counter::default(),
            w: Counter::default(),
            zero_grad: 0,
            zero_v: 0,
            precond: Counter { updated: 8, stalled: 6, unchanged: 6, elements: 8 },
            frac: Fractions { m: Some(0.5), precond: Some(0.75), ..Fractions::default() },
            groups: [
                ("mlp".to_string(), Fractions { precond: Some(0.75), ..Fractions::default() }),
                ("norm".to_string(), Fractions { m: Some(0.5), ..Fractions::default() }),
            ]
            .into(),
            theory: Theory { v: None },
            tensors: None,
        };
        let expect = [("stall_m/all", 0.5), ("stall_m/norm", 0.5), ("stall_precond/all", 0.75), ("stall_precond/mlp", 0.75)];
        assert_eq!(stall_scalars(&row), expect.map(|(t, v)| (t.to_string(), v as f32)));
    }

    #[test]
    fn metrics_rows_map_to_train_and_val_tags() {
        let (step, v) = metric_scalars(&MetricsRow::Eval { step: 0, tokens: 0, val_loss: 10.5, val_ppl: 36315.5 });
        assert_eq!((step, v[0].clone(), v[1].0.as_str()), (0, ("val/loss".to_string(), 10.5), "val/ppl"));
        let row = MetricsRow::Train {
            step: 2,
            tokens: 9,
            lr: 1e-3,
            loss: 7.0,
            grad_norm: 1.5,
            step_time: 0.1,
            tokens_per_s: 90.0,
            skipped: false,
            mfu: None,
        };
        let tags: Vec<String> = metric_scalars(&row).1.into_iter().map(|t| t.0).collect();
        assert_eq!(tags, ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"]);
        // with MFU (a GPU of known peak), one more scalar
        let row = match row {
            MetricsRow::Train { step, tokens, lr, loss, grad_norm, step_time, tokens_per_s, skipped, .. } => {
                MetricsRow::Train { step, tokens, lr, loss, grad_norm, step_time, tokens_per_s, skipped, mfu: Some(0.25) }
            }
            eval => eval,
        };
        assert_eq!(metric_scalars(&row).1.last(), Some(&("train/mfu".to_string(), 0.25)));
    }
}
