//! How a run ends early: the stops the loop ([`crate::run::train`]) checks after each step (too
//! many non-finite steps in a row, an interrupt) and at its end (a non-finite last step or
//! validation loss), each with its status and the message that says how to go on; an
//! interrupt before the first step; a resumed run that had already finished; and the run's
//! `summary.json`.

use crate::logs::summary::{self, RunStatus, Summary};
use crate::session::{Launch, Session};
use crate::step::StepReport;
use anyhow::Result;

/// Why the loop ended early: a status and, for a failure, the error to return.
pub(crate) struct Stop {
    pub(crate) status: RunStatus,
    pub(crate) error: Option<String>,
}

/// An interrupt before the loop's first step: a new run removes what it wrote (nothing to
/// resume; the same command starts afresh), a resumed one stays at its checkpoint with a
/// summary saying "interrupted" (returned, on rank 0).
pub(crate) fn stop_before_the_first_step(s: Session, launch: &Launch) -> Result<Option<Summary>> {
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
    Ok(summary)
}

/// The step a resumed run had already finished at, when it is `train.max_steps` or beyond
/// (after the checkpoint's files are verified).
pub(crate) fn already_finished(launch: &Launch) -> Result<Option<u64>> {
    let Some(dir) = &launch.resume_from else { return Ok(None) };
    crate::checkpoint::verify_for_resume(dir, launch.trust_unverified)?;
    let done = crate::train_state::load_state(dir)?.step;
    Ok((done >= launch.config.train.max_steps).then_some(done))
}

impl Session {
    /// The stop after `train.max_nonfinite_steps` non-finite steps in a row, if this was one.
    pub(crate) fn too_many_nonfinite(&self, r: &StepReport) -> Option<Stop> {
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
    pub(crate) fn interrupted(&self) -> Stop {
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
    pub(crate) fn ended_nonfinite(&self, last_val: Option<f64>) -> Option<Stop> {
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
    pub(crate) fn write_summary(&self, tokens_per_s: f64, last_val: Option<f64>, status: RunStatus) -> Result<Summary> {
        let sizes = &self.sizes;
        let mut summary =
            summary::build(&self.run_dir, sizes.n_params, sizes.state_bytes, tokens_per_s, last_val, self.device_peak, status)?;
        summary.state_bytes_per_rank = sizes.rank_state_bytes;
        let pass = self.stream.pass_size();
        summary.epochs = Some(self.state.tokens as f64 / pass.tokens.max(1) as f64);
        (summary.tokens_per_epoch, summary.tokens_per_epoch_exact) = (Some(pass.tokens), Some(pass.exact));
        summary.data_order = Some(self.stream.order().describe());
        summary.state_groups = Some(sizes.state_groups.clone());
        crate::checkpoint::write_atomic(&self.run_dir.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
        Ok(summary)
    }
}
