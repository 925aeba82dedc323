//! # lowbit-train: the training library
//!
//! The loop ([`run`], and how a run ends early: `stop.rs`) over a [`session`] (set-up from
//! its parts' builders, validation, checkpoints) and one [`step`], reporting through
//! [`progress`]; the parts: device policy ([`device`]), the [`model`], the [`optimizer`], the
//! [`data`], a resume from a checkpoint ([`resume_compat`]), the run folder ([`run_folder`],
//! [`checkpoint`] of [`components`] and the [`train_state`], [`manifest`], [`logs`]); what a run
//! says at start ([`banner`], the settings that run but not as one may expect:
//! [`setting_warnings`]), the validation loss ([`eval`]), the config ([`config`]), the
//! [`memory`] a run needs at the least, learning-rate [`schedule`] and data parallelism
//! ([`distributed`]). The `train` binary (crate `lowbit-cli`) puts the commands,
//! the progress bar and the plots on top.
//!
//! ```no_run
//! use lowbit_train::{config::RunConfig, progress, run, session::Launch};
//! let config = RunConfig::load("configs/tiny_cpu.toml".as_ref(), &["train.max_steps=10".into()]).unwrap();
//! let out = run::train(Launch::new(config), &mut progress::Logs).unwrap();
//! println!("{}", out.summary.unwrap().render());
//! ```

pub mod banner;
pub mod checkpoint;
pub mod components;
pub mod config;
pub mod data;
pub mod device;
pub mod distributed;
pub mod eval;
pub mod flops;
pub mod logs;
pub mod manifest;
pub mod memory;
pub mod model;
pub mod optimizer;
pub mod output;
pub mod progress;
pub mod resume_compat;
pub mod run;
pub mod run_folder;
pub mod schedule;
pub mod session;
pub mod setting_warnings;
pub mod step;
mod stop;
pub mod train_state;
