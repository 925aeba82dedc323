//! The training loop, in torchtitan's shape: open the [`Session`], validate the initial model,
//! then per step: the step, its report, validation and a checkpoint on their intervals, a stop
//! on an interrupt or on too many non-finite steps; the summary at the end. Deterministic from
//! `train.seed`; resumes bit-identically from a checkpoint. What the user sees of it goes
//! through [`Progress`] (the `train` binary draws a progress bar; [`Logs`] writes log lines).

use crate::logs::summary::{self, RunStatus, Summary};
use crate::session::{Launch, Session};
use crate::step::StepReport;
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

/// What the user sees of a run, called on rank 0 only.
pub trait Progress {
    /// The session is open (its folder claimed): [`Session::banner`] says what runs.
    fn started(&mut self, session: &Session);
    /// The loop begins at `step` (0, or the resumed step) of `max_steps`.
    fn begin(&mut self, step: u64, max_steps: u64);
    /// Step `report.step` is done.
    fn step(&mut self, report: &StepReport, max_steps: u64);
    /// A line for the user beside the progress (validation loss, a new epoch).
    fn message(&mut self, text: &str);
    /// The validation at `step` has done `done` of its `total` batches.
    fn validating(&mut self, step: u64, done: usize, total: usize);
    /// The loop ended (`stopped`: before `max_steps`).
    fn end(&mut self, stopped: bool);
}

/// [`Progress`] as log lines: the banner, every message, and a step line 20 times per run.
pub struct Logs;

impl Progress for Logs {
    fn started(&mut self, session: &Session) {
        tracing::info!("{}", session.banner());
    }
    fn begin(&mut self, _step: u64, _max_steps: u64) {}
    fn step(&mut self, r: &StepReport, max_steps: u64) {
        if r.step.is_multiple_of(max_steps.div_ceil(20)) || r.step == max_steps {
            tracing::info!("step {}/{max_steps}: {}", r.step, r.line());
        }
    }
    fn message(&mut self, text: &str) {
        tracing::info!("{text}");
    }
    /// A line at each quarter of the batches (the step-0 validation of a large validation set
    /// takes a while).
    fn validating(&mut self, step: u64, done: usize, total: usize) {
        let quarter = total.div_ceil(4).max(1);
        if done < total && done.is_multiple_of(quarter) {
            tracing::info!("step {step}: validation {done}/{total} batches");
        }
    }
    fn end(&mut self, _stopped: bool) {}
}

/// Why the loop ended early: a status and, for a failure, the error to return.
struct Stop {
    status: RunStatus,
    error: Option<String>,
}

/// Run (or resume) training as configured, reporting to `progress` on rank 0.
pub fn run(launch: Launch, progress: &mut dyn Progress) -> Result<RunReport> {
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
        return stop_before_the_first_step(s, &launch);
    }
    let (started, tokens_at_start) = (Instant::now(), s.state.tokens);
    let mut last_val = None;
    let mut stop = None;
    while s.state.step < max_steps {
        let step = s.state.step + 1;
        let r = s.step(step)?;
        if let Some(epoch) = r.new_epoch {
            progress.message(&format!("step {step}: the train shards are used up; epoch {epoch} begins"));
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
        true => Some(s.write_summary((s.state.tokens - tokens_at_start) as f64 / started.elapsed().as_secs_f64().max(1e-9), last_val, status)?),
        false => None,
    };
    if let Some(e) = error {
        bail!(e);
    }
    let stopped_early = status == RunStatus::Interrupted;
    Ok(RunReport { run_dir: s.run_dir.clone(), summary, stopped_early, already_finished: None })
}

/// An interrupt before the loop's first step: a new run removes what it wrote (nothing to
/// resume; the same command starts afresh), a resumed one stays at its checkpoint with a
/// summary saying "interrupted".
fn stop_before_the_first_step(s: Session, launch: &Launch) -> Result<RunReport> {
    let run_dir = s.run_dir.clone();
    let leader = s.is_leader();
    let summary = if launch.folder != crate::run_folder::FolderUse::Resume {
        s.discard()?;
        if leader {
            tracing::warn!(
                "interrupted before the first step: nothing to resume, {} was removed; start again with the same command",
                run_dir.display()
            );
        }
        None
    } else {
        if leader {
            tracing::warn!(
                "interrupted before the first step: the run stays at step {}; resume with: train --resume {}",
                s.state.step,
                run_dir.display()
            );
        }
        match leader {
            true => Some(s.write_summary(0.0, None, RunStatus::Interrupted)?),
            false => None,
        }
    };
    Ok(RunReport { run_dir, summary, stopped_early: true, already_finished: None })
}

/// The step a resumed run had already finished at, when it is `train.max_steps` or beyond
/// (after the checkpoint's files are verified).
fn already_finished(launch: &Launch) -> Result<Option<u64>> {
    let Some(dir) = &launch.resume_from else { return Ok(None) };
    crate::checkpoint::verify_for_resume(dir, launch.trust_unverified)?;
    let done = crate::checkpoint::load_state(dir)?.step;
    Ok((done >= launch.config.train.max_steps).then_some(done))
}

/// No output (ranks other than 0).
struct Quiet;

impl Progress for Quiet {
    fn started(&mut self, _: &Session) {}
    fn begin(&mut self, _: u64, _: u64) {}
    fn step(&mut self, _: &StepReport, _: u64) {}
    fn message(&mut self, _: &str) {}
    fn validating(&mut self, _: u64, _: usize, _: usize) {}
    fn end(&mut self, _: bool) {}
}

impl Session {
    /// The stop after `train.max_nonfinite_steps` non-finite steps in a row, if this was one.
    fn too_many_nonfinite(&self, r: &StepReport) -> Option<Stop> {
        let (n, limit) = (self.state.nonfinite_in_row, self.cfg.train.max_nonfinite_steps.max(1));
        (n > 0 && n >= limit).then(|| Stop {
            status: RunStatus::NonFinite,
            error: Some(format!(
                "stopping at step {}: {n} consecutive steps with a non-finite loss or gradient norm (limit \
                 train.max_nonfinite_steps = {}; last loss {}, gradient norm {}); checkpoint written to {}; try a \
                 lower optim.lr or optim.grad_clip",
                r.step,
                self.cfg.train.max_nonfinite_steps,
                r.loss,
                r.grad_norm,
                self.checkpoint_dir_of(r.step).display()
            )),
        })
    }

    /// The stop on an interrupt (Ctrl-C, SIGTERM or `stop_after` on any rank), with the
    /// command that resumes it.
    fn interrupted(&self) -> Stop {
        let gpus = match self.ranks() {
            1 => String::new(),
            n => format!(" --gpus {n} (or any rank count that divides train.grad_accum)"),
        };
        tracing::warn!(
            "stopped at step {} of {}; resume with: train --resume {}{gpus}",
            self.state.step,
            self.cfg.train.max_steps,
            self.run_dir.display()
        );
        Stop { status: RunStatus::Interrupted, error: None }
    }

    /// A run that reached `max_steps` with its last step skipped or a non-finite validation
    /// loss ended non-finite.
    fn ended_nonfinite(&self, last_val: Option<f64>) -> Option<Stop> {
        (self.state.nonfinite_in_row > 0 || last_val.is_some_and(|v| !v.is_finite())).then(|| Stop {
            status: RunStatus::NonFinite,
            error: Some(format!(
                "the run ended non-finite at step {} (last step skipped: {}, final validation loss {}); the \
                 checkpoint {} holds what the run ended with; resume from an earlier checkpoint with a lower \
                 optim.lr or optim.grad_clip",
                self.state.step,
                self.state.nonfinite_in_row > 0,
                last_val.map_or("-".into(), |v| v.to_string()),
                self.last_checkpoint.as_deref().unwrap_or(&self.run_dir).display()
            )),
        })
    }

    /// `summary.json` of the run (rank 0), from its files and this invocation's throughput.
    fn write_summary(&self, tokens_per_s: f64, last_val: Option<f64>, status: RunStatus) -> Result<Summary> {
        let mut summary =
            summary::build(&self.run_dir, self.n_params, self.state_bytes, tokens_per_s, last_val, self.device_peak, status)?;
        summary.state_bytes_per_rank = self.rank_state_bytes;
        crate::checkpoint::write_atomic(&self.run_dir.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
        Ok(summary)
    }
}
