//! # lowbit-train: the training library
//!
//! Config ([`config`]), the training loop ([`trainer`]), the optimizer glue
//! ([`optimizer`]), run-folder files ([`run_folder`], [`metrics`], [`stall_log`], [`summary`],
//! [`checkpoint`]) and data parallelism ([`distributed`]). The `train` binary (crate
//! `lowbit-cli`) puts the commands, the progress bar and the plots on top.
//!
//! ```no_run
//! use lowbit_train::{config::RunConfig, trainer};
//! let config = RunConfig::load("configs/tiny_cpu.toml".as_ref(), &["train.max_steps=10".into()]).unwrap();
//! let out = trainer::run(trainer::Launch::new(config)).unwrap();
//! println!("{}", out.summary.unwrap().render());
//! ```

pub mod checkpoint;
pub mod config;
pub mod distributed;
#[cfg(feature = "cuda")]
pub mod cuda_optimizer;
pub mod manifest;
pub mod metrics;
pub mod optimizer;
pub mod output;
pub mod run_folder;
pub mod schedule;
pub mod session;
pub mod stall_log;
pub mod step;
pub mod summary;
pub mod trainer;
