//! # lowbit-cli: the `train` binary
//!
//! The commands over the training library (`lowbit-train`) and the reproduction runner
//! (`lowbit-reproduce`): `train` itself ([`train`]; [`launcher`] for `--gpus N`, [`signals`] for Ctrl-C
//! and SIGTERM, [`config_path`] for bare config names, [`progress`] for the bar), `predict` ([`predict`]), `stalls`
//! ([`stalls_table`]), `plot` ([`plot`]; [`reset_period_plot`] and [`stall_probe_plot`] from reproduce results), `data fetch c4` / `fineweb-edu` ([`fetch`]), `data tokenize` ([`tokenize`]), `bench ...` ([`bench_cmd`]): `bench data` ([`bench_data`]) and, in CUDA builds,
//! `bench optimizer` (`bench`), `bench training` (`bench_training`) and `bench lm-head`
//! (`bench_lm_head`).

#[cfg(feature = "cuda")]
pub mod bench;
pub mod bench_cmd;
pub mod bench_data;
#[cfg(feature = "cuda")]
pub mod bench_lm_head;
#[cfg(feature = "cuda")]
pub mod bench_soap;
#[cfg(feature = "cuda")]
pub mod bench_training;
pub mod config_path;
pub mod fetch;
pub mod launcher;
pub mod plot;
pub mod predict;
pub mod progress;
pub mod reset_period_plot;
pub mod signals;
pub mod stall_probe_plot;
pub mod stalls_table;
pub mod text_backend;
pub mod tokenize;
pub mod train;
