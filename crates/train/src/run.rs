//! The training loop, in torchtitan's shape: open the [`Session`], validate the initial model,
//! then per step: the step, its report, validation and a checkpoint on their intervals, a stop
//! on an interrupt or on too many non-finite steps; the summary at the end. Deterministic from
//! `train.seed`; resumes bit-identically from a checkpoint. What the user sees of it goes
//! through [`Progress`] (the `train` binary draws a progress bar;
//! [`crate::progress::Logs`] writes log lines).

use crate::logs::summary::{RunStatus, Summary};
use crate::progress::{Progress, Quiet};
use crate::session::{Launch, Session};
use crate::stop::{already_finished, stop_before_the_first_step};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What a finished (or stopped) run reports.
pub struct RunReport {
    pub run_dir: PathBuf,
    /// The summary written to `summary.json` (rank 0); `None` on other ranks and when nothing
    /// was run.
    pub summary: Option<Summary>,
    /// Stopped before `max_steps` (interrupt or `stop_after`).
    pub stopped_early: bool,
    /// A resumed run had already finished at this step: nothing was run or written.
    pub already_finished: Option<u64>,
}

/// Run (or resume) training as configured, reporting to `progress` on rank 0.
pub fn train(launch: Launch, progress: &mut dyn Progress) -> Result<RunReport> {
    if let Some(step) = already_finished(&launch)? {
        let run_dir = launch.config.run_dir();
        return Ok(RunReport { run_dir, summary: None, stopped_early: false, already_finished: Some(step) });
    }
    let mut s = Session::open(&launch)?;
    let leader = s.is_leader();
    let mut quiet = Quiet;
    let progress: &mut dyn Progress = if leader { progress } else { &mut quiet };
    progress.started(&s);
    let max_steps = s.cfg.train.max_steps;
    progress.begin(s.state.step, max_steps);
    if s.state.step == 0 {
        progress.message(&format!("step 0: validation loss of the initial model ({} batches of the validation set)", s.val_batches()));
        if let Some(vl) = s.validate_until(0, &launch.interrupt, &mut |done, total| progress.validating(0, done, total))? {
            progress.message(&format!("step 0: validation loss {vl:.4}"));
        }
    }
    // an interrupt during start-up or the first validation acts now, not after a step
    if s.any_rank(launch.interrupt.load(Ordering::SeqCst))? {
        progress.end(true);
        let run_dir = s.run_dir.clone();
        let summary = stop_before_the_first_step(s, &launch)?;
        return Ok(RunReport { run_dir, summary, stopped_early: true, already_finished: None });
    }
    let (started, tokens_at_start) = (Instant::now(), s.state.tokens);
    let mut last_val = None;
    let mut stop = None;
    while s.state.step < max_steps {
        let step = s.state.step + 1;
        let r = s.step(step)?;
        if let Some(epoch) = r.new_epoch {
            let reader = match s.stream.order() {
                lowbit_data::RowOrder::Buffered { .. } => " (the reader's: the shuffle buffer still holds rows of the last)",
                _ => "",
            };
            progress.message(&format!("step {step}: epoch {epoch} of the training text begins{reader}"));
        }
        progress.step(&r, max_steps);
        let last = step == max_steps;
        if s.cfg.train.validates_at(step) || last {
            let vl = s.validate(step, &mut |done, total| progress.validating(step, done, total))?;
            last_val = Some(vl);
            progress.message(&format!("step {step}: validation loss {vl:.4} (ppl {:.1})", vl.exp()));
        }
        let interrupted = s.any_rank(launch.interrupt.load(Ordering::SeqCst) || launch.stop_after == Some(step))?;
        stop = s.too_many_nonfinite(&r).or_else(|| (interrupted && !last).then(|| s.interrupted()));
        if s.cfg.train.checkpoints_at(step) || last || stop.is_some() || interrupted {
            s.checkpoint()?;
        }
        if stop.is_some() {
            break;
        }
    }
    s.flush_stalls()?;
    progress.end(stop.is_some());
    let stop = stop.or_else(|| s.ended_nonfinite(last_val));
    let status = stop.as_ref().map_or(RunStatus::Finished, |s| s.status);
    let error = stop.and_then(|s| s.error);
    let summary = match leader {
        true => Some(s.write_summary(
            (s.state.tokens - tokens_at_start) as f64 / started.elapsed().as_secs_f64().max(1e-9),
            last_val,
            status,
        )?),
        false => None,
    };
    if let Some(e) = error {
        bail!(e);
    }
    let stopped_early = status == RunStatus::Interrupted;
    Ok(RunReport { run_dir: s.run_dir.clone(), summary, stopped_early, already_finished: None })
}
