//! What the user sees of a run ([`Progress`], called by the loop on rank 0): as log lines
//! ([`Logs`]), or nothing ([`Quiet`], the other ranks). The `train` binary draws a progress
//! bar instead.

use crate::session::Session;
use crate::step::StepReport;

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

/// No output (ranks other than 0).
pub struct Quiet;

impl Progress for Quiet {
    fn started(&mut self, _: &Session) {}
    fn begin(&mut self, _: u64, _: u64) {}
    fn step(&mut self, _: &StepReport, _: u64) {}
    fn message(&mut self, _: &str) {}
    fn validating(&mut self, _: u64, _: usize, _: usize) {}
    fn end(&mut self, _: bool) {}
}
