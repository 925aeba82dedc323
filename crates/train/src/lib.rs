//! # lowbit-train: the `train` binary's library
//!
//! Config ([`config`]), the training loop ([`trainer`]), the optimizer glue
//! ([`optimizer`]), run-folder files ([`run_folder`], [`metrics`], [`stall_log`], [`summary`],
//! [`checkpoint`]), and the inspection commands ([`predict`], [`stalls_table`], [`plot`]).
//!
//! ```no_run
//! use lowbit_train::{config::RunConfig, trainer};
//! let config = RunConfig::load("configs/tiny_cpu.toml".as_ref(), &["train.max_steps=10".into()]).unwrap();
//! let out = trainer::run(trainer::Launch::new(config)).unwrap();
//! println!("{}", out.summary.unwrap().render());
//! ```

#[cfg(feature = "cuda")]
pub mod bench;
pub mod bench_data;
#[cfg(feature = "cuda")]
pub mod bench_training;
pub mod checkpoint;
pub mod config;
pub mod config_path;
pub mod distributed;
#[cfg(feature = "cuda")]
pub mod cuda_optimizer;
pub mod manifest;
pub mod metrics;
pub mod optimizer;
pub mod output;
pub mod plot;
pub mod predict;
pub mod reproduce;
pub mod run_folder;
pub mod schedule;
pub mod session;
pub mod signals;
pub mod stall_log;
pub mod stalls_table;
pub mod step;
pub mod summary;
pub mod trainer;
