//! The training loop ([`run`]): set-up ([`Session::open`]), then per step the step itself
//! ([`Session::step`]: micro-batches -> backward -> token-weighted gradient sum -> global
//! norm -> optimizer with stall counts -> logs), evaluation and checkpoints on their
//! intervals. Deterministic from `train.seed`; resumes bit-identically from a checkpoint.

use crate::checkpoint::{self, TrainState};
use crate::config::{KernelChoice, MatmulPrecision, RunConfig};
use crate::distributed::collective::{Collective, Solo};
use crate::metrics::JsonlWriter;
use crate::optimizer::{HostAdamW, Optimizer, ParamSet};
use crate::session::Session;
use crate::stall_log::{StallRow, Theory};
use crate::step::batch_tensors;
use crate::run_folder::FolderUse;
use crate::summary::{self, RunStatus, Summary};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use indicatif::{ProgressBar, ProgressStyle};
use lowbit_data::Batch;
use lowbit_model::{param_group, Kernels, Llama, LlamaConfig};
use lowbit_optim::{LowbitAdamW, ParamInfo, StallCounts};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How a run starts.
pub struct Launch {
    pub config: RunConfig,
    /// Resume from this checkpoint folder.
    pub resume_from: Option<PathBuf>,
    /// New run, new run over an old one moved aside, or resume ([`FolderUse`]).
    pub folder: FolderUse,
    /// Set by Ctrl-C or SIGTERM: write a checkpoint and stop after the current step.
    pub interrupt: Arc<AtomicBool>,
    /// Stop (with a checkpoint) after this step, as if interrupted (tests of resume).
    pub stop_after: Option<u64>,
    /// The other ranks of a data-parallel job ([`Solo`] for one process).
    pub comm: Arc<dyn Collective>,
    /// This process's rank on its host (`LOCAL_RANK`): the GPU it trains on when
    /// `train.device = "cuda"`.
    pub local_rank: usize,
}

impl Launch {
    /// A new run of `config` (its folder must not hold a run yet), not interrupted.
    pub fn new(config: RunConfig) -> Launch {
        Launch {
            config,
            resume_from: None,
            folder: FolderUse::New,
            interrupt: Default::default(),
            stop_after: None,
            comm: Arc::new(Solo),
            local_rank: 0,
        }
    }

    /// Resume `config`'s run from the checkpoint folder `from`.
    pub fn resume(config: RunConfig, from: PathBuf) -> Launch {
        Launch { resume_from: Some(from), folder: FolderUse::Resume, ..Launch::new(config) }
    }
}

/// What a finished (or stopped) run reports.
pub struct Outcome {
    pub run_dir: PathBuf,
    /// The summary written to `summary.json`; `None` when the resumed run had already
    /// finished (nothing was run and nothing written).
    pub summary: Option<Summary>,
    /// Stopped before `max_steps` (interrupt or `stop_after`).
    pub stopped_early: bool,
}

/// Pick the device named in the config: `"cpu"`, or `"cuda"` = GPU `ordinal` (a data-parallel
/// worker's `LOCAL_RANK`, else 0).
///
/// # Errors
/// An unknown name, `"cuda"` in a build without the `cuda` feature, or a GPU that cannot be
/// opened (named by its ordinal).
pub fn device(name: &str, ordinal: usize) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::Cuda(
            lowbit_optim::cuda::open_device(ordinal).with_context(|| format!("cannot open CUDA device {ordinal}"))?,
        )),
        #[cfg(not(feature = "cuda"))]
        "cuda" => {
            let _ = ordinal;
            bail!("train.device = \"cuda\" needs a build with `--features cuda`")
        }
        d => bail!("train.device: unknown device {d:?}"),
    }
}

/// Model parameters' optimizer metadata, sorted by name.
pub fn param_infos(params: &ParamSet) -> Vec<ParamInfo> {
    params
        .names
        .iter()
        .zip(&params.vars)
        .map(|(n, v)| ParamInfo {
            name: n.clone(),
            group: param_group(n).as_str().to_string(),
            len: v.elem_count(),
            weight_decay: v.rank() >= 2,
        })
        .collect()
}

/// The model on `dev` with the configured kernels and FP32 matmul precision.
pub fn build_model(cfg: &RunConfig, mcfg: &LlamaConfig, varmap: &candle_nn::VarMap, dtype: DType, dev: &Device) -> Result<Llama> {
    let model = Llama::new(mcfg, candle_nn::VarBuilder::from_varmap(varmap, dtype, dev))?;
    let kernels = match cfg.model.kernels {
        KernelChoice::Auto => Kernels::for_device(dev),
        KernelChoice::Fused => Kernels::Fused,
        KernelChoice::Composed => Kernels::Composed,
    };
    let tf32 = cfg.model.matmul_precision == MatmulPrecision::Tf32;
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
    #[cfg(not(feature = "cuda"))]
    let _ = tf32; // CPU matrix products are FP32
    model.with_kernels(kernels).context("model.kernels")
}

/// Mean validation loss (nats per target token) over the fixed validation batches.
pub fn evaluate(model: &Llama, batches: &[Batch], dev: &Device) -> Result<f64> {
    let (mut nll, mut count) = (0f64, 0f64);
    for b in batches {
        let (x, y, m) = batch_tensors(b, dev)?;
        let n: f64 = b.mask.iter().map(|&v| v as f64).sum();
        let loss = model.eval_loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
        nll += loss * n;
        count += n;
    }
    if count == 0.0 {
        bail!("validation set is empty: check data.validation and data.val_tokens");
    }
    Ok(nll / count)
}

/// Run (or resume) training as configured: [`Session::open`], a validation at step 0, then
/// per step [`Session::step`], the progress line, [`Session::validate`] and
/// [`Session::checkpoint`] on their intervals, and the summary at the end.
pub fn run(launch: Launch) -> Result<Outcome> {
    if let Some(dir) = &launch.resume_from {
        crate::manifest::verify_for_resume(dir)?;
        let (done, max_steps) = (checkpoint::load_state(dir)?.step, launch.config.train.max_steps);
        if done >= max_steps {
            if launch.comm.rank() == 0 {
                crate::outln!(
                    "{}: already finished at step {done} (train.max_steps = {max_steps}); nothing to do \
                     (raise train.max_steps, e.g. --set train.max_steps={}, to continue it)",
                    launch.config.run_dir().display(),
                    done * 2
                );
            }
            return Ok(Outcome { run_dir: launch.config.run_dir(), summary: None, stopped_early: false });
        }
    }
    let mut s = Session::open(&launch)?;
    let max_steps = s.cfg.train.max_steps;
    if s.cfg.optim.warmup_steps >= max_steps && s.is_leader() {
        tracing::warn!(
            "optim.warmup_steps = {} is not shorter than train.max_steps = {max_steps}: the warmup is cut to {} \
             steps so that the learning rate still decays",
            s.cfg.optim.warmup_steps,
            max_steps - 1
        );
    }
    if s.state.step == 0 {
        tracing::info!("step 0: validation loss of the initial model ({} batches of the validation set)", s.val_batches());
        let vl = s.validate(0)?;
        tracing::info!("step 0: validation loss {vl:.4}");
    }
    let leader = s.is_leader();
    let bar = if leader { ProgressBar::new(max_steps) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("valid template"),
    );
    bar.set_position(s.state.step);
    let started = Instant::now();
    let tokens_at_start = s.state.tokens;
    let mut status = RunStatus::Finished;
    let mut last_val = None;
    let mut stop_error = None;

    while s.state.step < max_steps {
        let step = s.state.step + 1;
        let r = s.step(step)?;
        let (loss, norm) = (r.out.loss, r.out.grad_norm);
        if let Some(epoch) = r.new_epoch {
            bar.suspend(|| tracing::info!("step {step}: the train shards are used up; epoch {epoch} begins"));
        }
        bar.set_position(step);
        if let Some((m, v)) = r.stalls {
            bar.set_message(format!(
                "loss {loss:.3} | m-stall {} v-stall {} | {:.0} tok/s",
                fmt_frac(m),
                fmt_frac(v),
                r.out.tokens as f64 / r.seconds
            ));
        }
        let last = step == max_steps;
        // Without a terminal (output to a file or pipe) the bar is hidden: its line goes to
        // the log 20 times per run instead.
        if leader && bar.is_hidden() && (step.is_multiple_of(max_steps.div_ceil(20)) || last) {
            tracing::info!("step {step}/{max_steps}: {}", bar.message());
        }
        let train = &s.cfg.train;
        if (train.eval_every > 0 && step.is_multiple_of(train.eval_every)) || last {
            let vl = s.validate(step)?;
            last_val = Some(vl);
            bar.suspend(|| tracing::info!("step {step}: validation loss {vl:.4} (ppl {:.1})", vl.exp()));
        }
        let train = &s.cfg.train;
        let too_many = s.state.nonfinite_in_row > 0 && s.state.nonfinite_in_row >= train.max_nonfinite_steps.max(1);
        let interrupted = s.any_rank(launch.interrupt.load(Ordering::SeqCst) || launch.stop_after == Some(step))?;
        let periodic = train.checkpoint_every > 0 && step.is_multiple_of(train.checkpoint_every);
        if periodic || last || too_many || interrupted {
            s.checkpoint()?;
        }
        if too_many {
            bar.abandon();
            status = RunStatus::NonFinite;
            stop_error = Some(format!(
                "stopping at step {step}: {} consecutive steps with a non-finite loss or gradient norm \
                 (limit train.max_nonfinite_steps = {}; last loss {loss}, gradient norm {norm}); \
                 checkpoint written to {}; try a lower optim.lr or optim.grad_clip",
                s.state.nonfinite_in_row,
                s.cfg.train.max_nonfinite_steps,
                s.last_checkpoint.as_deref().unwrap_or(&s.run_dir).display()
            ));
            break;
        }
        if interrupted && !last {
            bar.abandon();
            let gpus = match s.ranks() {
                1 => String::new(),
                n => format!(" --gpus {n} (as many ranks keep the global batch)"),
            };
            tracing::warn!("stopped at step {step} of {max_steps}; resume with: train --resume {}{gpus}", s.run_dir.display());
            status = RunStatus::Interrupted;
            break;
        }
    }
    s.flush_stalls()?;
    bar.finish();
    if status == RunStatus::Finished && (s.state.nonfinite_in_row > 0 || last_val.is_some_and(|v| !v.is_finite())) {
        status = RunStatus::NonFinite;
        stop_error = Some(format!(
            "the run ended non-finite at step {} (last step skipped: {}, final validation loss {}); the \
             checkpoint {} holds what the run ended with; resume from an earlier checkpoint with a lower \
             optim.lr or optim.grad_clip",
            s.state.step,
            s.state.nonfinite_in_row > 0,
            last_val.map_or("-".into(), |v| v.to_string()),
            s.last_checkpoint.as_deref().unwrap_or(&s.run_dir).display()
        ));
    }
    if !leader {
        if let Some(e) = stop_error {
            bail!(e);
        }
        return Ok(Outcome { run_dir: s.run_dir.clone(), summary: None, stopped_early: status == RunStatus::Interrupted });
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut summary = summary::build(
        &s.run_dir,
        s.n_params,
        s.state_bytes,
        (s.state.tokens - tokens_at_start) as f64 / elapsed.max(1e-9),
        last_val,
        s.device_peak,
        status,
    )?;
    summary.state_bytes_per_rank = s.rank_state_bytes;
    checkpoint::write_atomic(&s.run_dir.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    if let Some(e) = stop_error {
        bail!(e);
    }
    let stopped_early = status == RunStatus::Interrupted;
    if !stopped_early {
        crate::outln!("{}", summary.render());
    }
    Ok(Outcome { run_dir: s.run_dir.clone(), summary: Some(summary), stopped_early })
}

/// A data error as one line: its message already includes its source, so `{:#}` must not
/// append the source a second time.
pub(crate) fn data_err(e: lowbit_data::DataError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Writes `stalls.jsonl` rows for completed steps, `lag` steps behind the newest, and hands
/// each update's total counts to the optimizer's adaptive reset rule.
pub(crate) struct StallWriter {
    pub names: Vec<String>,
    pub groups: Vec<String>,
    pub theory: Theory,
    pub detail_every: u64,
    /// The states' settings: v-only resets are logged with their zero gradients.
    pub spec: lowbit_optim::StatesSpec,
}

impl StallWriter {
    /// Write (to `out`: `None` on ranks other than 0) the rows of all but the newest `lag` pending steps (`(step, update)`, `update`
    /// the optimizer's step number or `None` for a skipped step, which has zero counts).
    /// Returns the last written (m, v) fractions.
    pub(crate) fn flush(
        &self,
        pending: &mut VecDeque<(u64, Option<u64>)>,
        lag: usize,
        opt: &mut dyn Optimizer,
        mut out: Option<&mut JsonlWriter>,
    ) -> Result<Option<(Option<f64>, Option<f64>)>> {
        let mut last = None;
        while pending.len() > lag {
            let (step, update) = pending.pop_front().expect("non-empty");
            let counts = match update {
                Some(u) => opt.stall_counts(u)?,
                None => vec![StallCounts::default(); self.names.len()],
            };
            let detail = self.detail_every > 0 && step % self.detail_every == 0;
            let row = StallRow::build(step, &self.names, &self.groups, &counts, self.theory, detail);
            if let Some(u) = update {
                let total: StallCounts = counts.iter().copied().sum();
                opt.observe(u, &total);
                if self.spec.v_only_reset_at(u) && out.is_some() {
                    let what = match self.spec.v_reset_idle {
                        lowbit_optim::VResetIdle::Reset => "moved by lr * m / eps",
                        lowbit_optim::VResetIdle::Keep => "kept their v (optim.states.v_reset_idle = \"keep\")",
                    };
                    tracing::info!(
                        "step {step}: v reset without m: {} of {} elements had a zero gradient and {what}",
                        row.zero_grad,
                        row.v.elements
                    );
                }
            }
            if let Some(out) = out.as_deref_mut() {
                out.write(&row)?;
            }
            last = Some((row.frac.m, row.frac.v));
        }
        Ok(last)
    }
}

/// Device memory `(in use, peak)` of the CUDA pool, bytes; logged per step at debug level.
pub(crate) fn device_memory(dev: &Device) -> Option<(u64, u64)> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda_optimizer::device_pool_memory(dev),
        _ => None,
    }
}

fn fmt_frac(f: Option<f64>) -> String {
    f.map_or("-".into(), |x| format!("{x:.3}"))
}

pub(crate) fn check_compatible(dir: &Path, saved: &TrainState, now: &TrainState) -> Result<()> {
    if saved.rng != now.rng {
        tracing::warn!(
            "{}: written with random-bit scheme {:?}, this build uses {:?}: the run continues, but its \
             stochastic-rounding draws differ from an uninterrupted run of the older build",
            dir.join("state.json").display(),
            saved.rng,
            now.rng
        );
    }
    if saved.params != now.params {
        let first = saved.params.iter().zip(&now.params).find(|(a, b)| a != b);
        let what = match first {
            _ if saved.params.len() != now.params.len() => format!(
                "the checkpoint has {} parameter tensors, the config {} (model.num_layers?)",
                saved.params.len(),
                now.params.len()
            ),
            Some(((sn, sl), (nn, nl))) if sn == nn => {
                format!("{sn} has {sl} elements in the checkpoint, {nl} in the config")
            }
            Some(((sn, _), (nn, _))) => format!("the checkpoint has {sn} where the config has {nn}"),
            None => "parameter lists differ".into(),
        };
        bail!(
            "{}: checkpoint of another model: {what} (resume with the [model] settings it was trained with)",
            dir.join("state.json").display()
        );
    }
    // (v_zero: a checkpoint without the field was written as "keep"; scale kinds: as pow2)
    let saved_v_zero = if saved.v_zero.is_empty() { "keep" } else { saved.v_zero.as_str() };
    for (key, format, saved_kind, kind) in [
        ("m", &saved.m_format, &saved.m_scale, &now.m_scale),
        ("v", &saved.v_format, &saved.v_scale, &now.v_scale),
    ] {
        let saved_kind = if saved_kind.is_empty() && !kind.is_empty() { "pow2" } else { saved_kind.as_str() };
        if saved_kind != kind.as_str() && format == if key == "m" { &now.m_format } else { &now.v_format } {
            bail!(
                "{}: checkpoint {key} states ({format}) have {saved_kind} scales, the config asks for {kind} \
                 (resume with --set optim.states.scale=\"{saved_kind}\")",
                dir.join("state.json").display()
            );
        }
    }
    if saved.adaptive_reset.is_some() != now.adaptive_reset.is_some() {
        let rule = |adaptive: bool| if adaptive { "adaptive" } else { "periodic" };
        bail!(
            "{}: the checkpoint's states reset by the {} rule, the config asks for the {} one (optim.states.reset \
             must match to resume: the bias correction counts from the last reset)",
            dir.join("state.json").display(),
            rule(saved.adaptive_reset.is_some()),
            rule(now.adaptive_reset.is_some())
        );
    }
    if (saved.m_format.as_str(), saved.v_format.as_str(), saved.block_size, saved_v_zero)
        != (now.m_format.as_str(), now.v_format.as_str(), now.block_size, now.v_zero.as_str())
    {
        bail!(
            "{}: checkpoint states are m={} v={} block {} v_zero {}, the config asks for m={} v={} block {} \
             v_zero {} (optim.states.m_format / v_format / block_size / v_zero must match to resume)",
            dir.join("state.json").display(),
            saved.m_format,
            saved.v_format,
            saved.block_size,
            saved_v_zero,
            now.m_format,
            now.v_format,
            now.block_size,
            now.v_zero
        );
    }
    Ok(())
}

/// The loss of the model on the first validation micro-batch, with the batch itself, for
/// checking an exported checkpoint in `transformers` (`scripts/check_hf_export.py`).
pub fn export_check(model: &Llama, val: &[Batch], dev: &Device, dtype: DType) -> Result<checkpoint::ExportCheck> {
    let b = val.first().context("validation set is empty: no batch for export_check.json")?;
    let (x, y, m) = batch_tensors(b, dev)?;
    let loss = model.eval_loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
    let rows = |v: &[u32]| v.chunks(b.seq_len).map(|r| r.to_vec()).collect::<Vec<_>>();
    Ok(checkpoint::ExportCheck {
        input_ids: rows(&b.input),
        targets: rows(&b.target),
        mask: b.mask.chunks(b.seq_len).map(|r| r.to_vec()).collect(),
        loss,
        dtype: if dtype == DType::BF16 { "bfloat16" } else { "float32" }.into(),
    })
}

/// The optimizer for a device: CPU reference on the CPU, fused kernels on CUDA.
pub(crate) fn make_optimizer(host: LowbitAdamW, dev: &Device) -> Result<Box<dyn Optimizer>> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Ok(Box::new(crate::cuda_optimizer::DeviceAdamW::new(host, dev)?)),
        _ => Ok(Box::new(HostAdamW::new(host))),
    }
}
