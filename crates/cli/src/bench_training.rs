//! `train bench training` (CUDA builds): speed of the real training step on one GPU: a
//! [`Session`] opened on a run config as a run opens it (data reader and tokenizer, model,
//! optimizer), without a run folder, stepped as the loop steps it.
//!
//! After `--warmup` steps: a window of `--steps` steps without any extra synchronisation
//! gives tokens/s; a second window with a device synchronisation at each phase boundary
//! gives the split into data, forward, backward and optimizer. Peak memory is the CUDA
//! pool's high-water mark over the whole run. MFU counts `6 N + 12 L H T` FLOPs per token
//! (nanoGPT's and PaLM's estimate; N = parameters without the embedding table, whose
//! lookup is no matrix product) against the card's dense peak ([`lowbit_train::flops`]; the
//! H200's and H100 SXM's: 989 TFLOP/s in BF16, 494 in TF32, 67 in FP32); NaN on a card not
//! in that table.
//!
//! `scripts/bench_training.sh` runs it beside `scripts/bench_hf_llama.py` (transformers eager
//! and `torch.compile`) in one device command and writes `bench/training_h200.{md,json}`.

use anyhow::{Context, Result};
use lowbit_train::config::{MatmulPrecision, RunConfig};
use lowbit_train::flops;
use lowbit_train::run_folder::FolderUse;
use lowbit_train::session::{Launch, Session};
use lowbit_train::step::Phases;
use std::time::Instant;

/// One measured configuration: the JSON row plus the split.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainingRow {
    pub system: String,
    /// `model.preset` (`custom` for explicit dimensions).
    pub preset: String,
    pub dtype: String,
    pub batch: usize,
    pub seq: usize,
    pub micro_batch: usize,
    pub kernels: String,
    pub matmul_precision: String,
    pub tokens_per_s: f64,
    pub peak_memory_gib: f64,
    pub mfu: f64,
    /// Milliseconds per step of each phase (synchronised window).
    pub phases_ms: Phases,
}

/// Runs the benchmark on `cfg` (its model, states, data and `train.micro_batch` /
/// `grad_accum`), built as a run is ([`Session::open`]) but without a run folder: `warmup`
/// untimed steps, then two windows of `steps` steps.
pub fn training(cfg: &RunConfig, warmup: u64, steps: u64) -> Result<TrainingRow> {
    anyhow::ensure!(steps > 0, "train bench training: --steps must be > 0");
    let mut cfg = cfg.clone();
    cfg.train.device = "cuda".into();
    cfg.train.max_steps = warmup + 2 * steps; // the learning-rate schedule's length
    cfg.data.val_tokens = 0; // no validation set: nothing to read or tokenize for it
    let mut session = Session::open(&Launch { folder: FolderUse::None, ..Launch::new(cfg.clone()) })?;
    let dev = session.dev.clone();
    let mut step = 0u64;
    let mut run = |s: &mut Session, phases: Option<&mut Phases>| -> Result<u64> {
        step += 1;
        let r = s.step_timed(step, phases)?;
        if step == 1 || step.is_multiple_of(10) {
            tracing::info!("step {step}: loss {:.4}", r.loss);
        }
        Ok(r.tokens)
    };
    for _ in 0..warmup {
        run(&mut session, None)?;
    }
    dev.synchronize()?;
    let t = Instant::now();
    let mut tokens = 0u64;
    for _ in 0..steps {
        tokens += run(&mut session, None)?;
    }
    dev.synchronize()?;
    let tokens_per_s = tokens as f64 / t.elapsed().as_secs_f64();
    let mut phases = Phases::default();
    for _ in 0..steps {
        run(&mut session, Some(&mut phases))?;
    }
    let per_step = |x: f64| 1e3 * x / steps as f64;
    let phases_ms = Phases {
        data: per_step(phases.data),
        forward: per_step(phases.forward),
        backward: per_step(phases.backward),
        optimizer: per_step(phases.optimizer),
    };
    let peak = lowbit_train::device::memory(&dev).map_or(0.0, |(_, p)| p as f64 / (1u64 << 30) as f64);
    // MFU against the peak of the products' dtype (BF16 for bf16-mixed)
    let (model, dtype) = (session.model(), session.compute_dtype());
    let mcfg = model.config();
    let n = session.sizes.n_params - mcfg.vocab_size * mcfg.hidden_size;
    let t_len = cfg.data.seq_len;
    let flops_per_token = flops::flops_per_token(n, mcfg.num_layers, mcfg.hidden_size, t_len);
    let tf32 = cfg.model.matmul_precision == MatmulPrecision::Tf32;
    let peak_flops = flops::card_name(&dev).and_then(|card| flops::peak_flops(&card, dtype, tf32)).unwrap_or(f64::NAN);
    Ok(TrainingRow {
        system: "lowbit".into(),
        preset: cfg.model.preset.clone().unwrap_or_else(|| "custom".into()),
        dtype: cfg.model.dtype.as_str().into(),
        batch: cfg.train.micro_batch * cfg.train.grad_accum,
        seq: t_len,
        micro_batch: cfg.train.micro_batch,
        kernels: format!("{:?}", model.kernels()).to_lowercase(),
        matmul_precision: if tf32 { "tf32" } else { "fp32" }.into(),
        tokens_per_s,
        peak_memory_gib: peak,
        mfu: flops::mfu(tokens_per_s, flops_per_token, peak_flops),
        phases_ms,
    })
}

/// One markdown table row (see [`render_header`]).
pub fn render_row(r: &TrainingRow) -> String {
    let p = &r.phases_ms;
    format!(
        "| {} | {} | {} | {} x {} (micro {}) | {:.0} | {:.1}% | {:.1} | {:.1} / {:.1} / {:.1} / {:.1} |",
        r.system,
        r.dtype,
        r.kernels,
        r.batch,
        r.seq,
        r.micro_batch,
        r.tokens_per_s,
        100.0 * r.mfu,
        r.peak_memory_gib,
        p.data,
        p.forward,
        p.backward,
        p.optimizer
    )
}

/// Header of the markdown table of [`render_row`].
pub fn render_header() -> String {
    "| system | dtype | kernels | batch x seq | tokens/s | MFU | peak GiB | data / fwd / bwd / optim (ms per step) |\n\
     |---|---|---|---|---|---|---|---|"
        .into()
}

/// The run config for the benchmark: `config` with `--set` overrides, the device forced to
/// CUDA and the batch given as `batch` sequences of `seq` tokens in micro-batches of
/// `micro_batch` (batch a multiple of it); `dtype`: `model.dtype` (`f32`, `bf16` or
/// `bf16-mixed`).
pub fn bench_config(
    config: &std::path::Path,
    sets: &[String],
    batch: usize,
    micro_batch: usize,
    seq: usize,
    dtype: &str,
) -> Result<RunConfig> {
    if micro_batch == 0 || !batch.is_multiple_of(micro_batch) {
        anyhow::bail!("--batch {batch} must be a multiple of --micro-batch {micro_batch}");
    }
    let mut all = vec![
        "train.device=cuda".to_string(),
        format!("train.micro_batch={micro_batch}"),
        format!("train.grad_accum={}", batch / micro_batch),
        format!("data.seq_len={seq}"),
        format!("model.dtype={dtype}"),
    ];
    all.extend(sets.iter().cloned());
    RunConfig::load(config, &all).with_context(|| format!("bench config {}", config.display()))
}
