//! The run's progress on the terminal: the banner, a progress bar with the newest loss,
//! stalled fractions and throughput, and the loop's messages printed above it. Without a
//! terminal (output into a file or a pipe) the bar is hidden and its line goes to the log 20
//! times per run instead ([`lowbit_train::progress::Logs`]).

use indicatif::{ProgressBar, ProgressStyle};
use lowbit_train::progress::{Logs, Progress};
use lowbit_train::session::Session;
use lowbit_train::step::StepReport;

/// A progress bar on stderr, or log lines when stderr is not a terminal.
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    pub fn new() -> Bar {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}").expect("valid template"),
        );
        Bar { bar }
    }
}

impl Default for Bar {
    fn default() -> Self {
        Bar::new()
    }
}

impl Progress for Bar {
    fn started(&mut self, session: &Session) {
        lowbit_train::outln!("{}", session.banner());
    }
    fn begin(&mut self, step: u64, max_steps: u64) {
        self.bar.set_length(max_steps);
        self.bar.set_position(step);
    }
    fn step(&mut self, r: &StepReport, max_steps: u64) {
        self.bar.set_position(r.step);
        if r.stalls.is_some() {
            self.bar.set_message(r.line());
        }
        if self.bar.is_hidden() {
            Logs.step(r, max_steps);
        }
    }
    fn message(&mut self, text: &str) {
        self.bar.suspend(|| tracing::info!("{text}"));
    }
    fn validating(&mut self, step: u64, done: usize, total: usize) {
        if self.bar.is_hidden() {
            Logs.validating(step, done, total);
        } else if done < total {
            self.bar.set_message(format!("validation {done}/{total} batches"));
        } else {
            self.bar.set_message("");
        }
    }
    fn end(&mut self, stopped: bool) {
        if stopped {
            self.bar.abandon();
        } else {
            self.bar.finish();
        }
    }
}
