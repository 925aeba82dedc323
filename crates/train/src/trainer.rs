//! The training loop: set-up, then per step: micro-batches -> backward -> accumulate ->
//! global norm -> optimizer (with stall counts) -> logs; evaluation and checkpoints on their
//! intervals. Deterministic from `train.seed`; resumes bit-identically from a checkpoint.

use crate::checkpoint::{self, TrainState};
use crate::config::{KernelChoice, MatmulPrecision, RunConfig, WeightDtype};
use crate::metrics::{JsonlWriter, MetricsRow};
use crate::optimizer::{HostAdamW, Optimizer, ParamSet};
use crate::step::{batch_tensors, train_step, StepContext};
use crate::schedule::learning_rate;
use crate::stall_log::{StallRow, Theory};
use crate::summary::{self, Summary};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use indicatif::{ProgressBar, ProgressStyle};
use lowbit_data::{load_tokenizer, shared_documents, validation_batches, Batch, DataPosition, TrainStream, OVERLAP_SAMPLE};
use lowbit_model::{init_params, param_group, Kernels, Llama, LlamaConfig};
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, StallCounts};
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
    /// Set by Ctrl-C: write a checkpoint and stop after the current step.
    pub interrupt: Arc<AtomicBool>,
    /// Stop (with a checkpoint) after this step, as if interrupted (tests of resume).
    pub stop_after: Option<u64>,
}

/// What a finished (or stopped) run reports.
pub struct Outcome {
    pub run_dir: PathBuf,
    pub summary: Summary,
    /// Stopped before `max_steps` (interrupt or `stop_after`).
    pub stopped_early: bool,
}

/// Pick the device named in the config.
pub fn device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::Cuda(lowbit_optim::cuda::open_device(0).context("cannot open CUDA device 0")?)),
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("train.device = \"cuda\" needs a build with `--features cuda`"),
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
        let loss = model.loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
        nll += loss * n;
        count += n;
    }
    if count == 0.0 {
        bail!("validation set is empty: check data.validation and data.val_tokens");
    }
    Ok(nll / count)
}

/// Run (or resume) training as configured.
pub fn run(launch: Launch) -> Result<Outcome> {
    let cfg = launch.config;
    let run_dir = cfg.run_dir();
    let config_toml = cfg.to_toml();
    let dev = device(&cfg.train.device)?;
    let spec = cfg.optim.states.resolve().map_err(anyhow::Error::msg)?;

    // Data and model.
    let tok = load_tokenizer(&cfg.data.tokenizer, cfg.data.allow_download).map_err(data_err)?;
    let mcfg: LlamaConfig = cfg
        .model_config(tok.vocab_size())
        .with_context(|| format!("model config with tokenizer {}", tok.source.display()))?;
    let dtype = match cfg.model.dtype {
        WeightDtype::F32 => DType::F32,
        WeightDtype::Bf16 => DType::BF16,
    };
    // The exported config.json: the model, and the tokenizer's special ids for `generate`.
    let mut hf_config = mcfg.hf_config_json_with_dtype(dtype);
    hf_config.as_object_mut().context("config.json is a JSON object")?.extend(tok.hf_token_ids());
    let mut varmap = init_params(&mcfg, cfg.train.seed, dtype, &dev)?;
    let model = build_model(&cfg, &mcfg, &varmap, dtype, &dev)?;
    let params = ParamSet::from_varmap(&varmap);
    let infos = param_infos(&params);
    let groups: Vec<String> = infos.iter().map(|i| i.group.clone()).collect();
    let hyper = Hyper {
        beta1: cfg.optim.beta1,
        beta2: cfg.optim.beta2,
        eps: cfg.optim.eps,
        weight_decay: cfg.optim.weight_decay,
    };
    let mut host = LowbitAdamW::new(hyper, spec, cfg.train.seed, infos.clone());

    // Resume.
    let mut state = TrainState {
        step: 0,
        tokens: 0,
        data: DataPosition::default(),
        nonfinite_in_row: 0,
        m_format: spec.m_format.name().into(),
        v_format: spec.v_format.name().into(),
        block_size: spec.block_size,
        params: infos.iter().map(|i| (i.name.clone(), i.len)).collect(),
        rng: lowbit_optim::rng::SCHEME.into(),
    };
    if let Some(dir) = &launch.resume_from {
        let saved = checkpoint::load_state(dir)?;
        check_compatible(dir, &saved, &state)?;
        checkpoint::load_tensors(dir, &mut varmap, &mut host)?;
        state = TrainState { rng: lowbit_optim::rng::SCHEME.into(), ..saved };
        tracing::info!("resumed from {} at step {}", dir.display(), state.step);
    }
    // Only now, with the checkpoint accepted, touch the run folder (a refused resume must
    // not overwrite the run's config).
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
    // a summary marks a finished run (`train stalls --follow` stops on it)
    let _ = std::fs::remove_file(run_dir.join("summary.json"));
    checkpoint::write_atomic(&run_dir.join("config.toml"), config_toml.as_bytes())?;
    let mut opt: Box<dyn Optimizer> = make_optimizer(host, &dev)?;

    let n_params = params.num_params();
    let state_bytes = opt.states()?.state_bytes();
    let theory = Theory::for_spec(&spec, cfg.optim.beta2);
    let global_batch = cfg.train.micro_batch * cfg.train.grad_accum;
    println!(
        "model {} params ({} layers, hidden {}, {:?} weights) | states m={} v={} ({} / {}): {} bytes = {:.3} bytes/param | batch {} x {} tokens | device {}",
        n_params,
        mcfg.num_layers,
        mcfg.hidden_size,
        dtype,
        spec.m_format.name(),
        spec.v_format.name(),
        spec.m_rounding.as_str(),
        spec.v_rounding.as_str(),
        state_bytes,
        state_bytes as f64 / n_params as f64,
        global_batch,
        cfg.data.seq_len,
        cfg.train.device,
    );
    if let Some(p) = theory.v {
        println!("theory: v stalled fraction {p:.3} for {} at b2 = {}", spec.v_format.name(), cfg.optim.beta2);
    }

    let val = validation_batches(&cfg.data, &tok, cfg.train.micro_batch).map_err(data_err)?;
    let shared = shared_documents(&cfg.data, OVERLAP_SAMPLE).map_err(data_err)?;
    if shared > 0 {
        tracing::warn!(
            shared,
            sample = OVERLAP_SAMPLE,
            "the validation shards share documents with the training shards ({shared} of the first \
             {OVERLAP_SAMPLE} documents of each training shard): the validation loss measures \
             memorisation; check data.validation"
        );
    }
    let mut stream = TrainStream::new(&cfg.data, &tok, state.data.clone()).map_err(data_err)?;
    let resumed = launch.resume_from.is_some();
    let keep = resumed.then_some(state.step);
    let mut metrics = JsonlWriter::open(&run_dir.join("metrics.jsonl"), keep)?;
    let mut stalls = JsonlWriter::open(&run_dir.join("stalls.jsonl"), keep)?;

    let max_steps = cfg.train.max_steps;
    if state.step == 0 {
        let vl = evaluate(&model, &val, &dev)?;
        metrics.write(&MetricsRow::Eval { step: 0, tokens: 0, val_loss: vl, val_ppl: vl.exp() })?;
        tracing::info!("step 0: validation loss {vl:.4}");
    }
    let bar = ProgressBar::new(max_steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("valid template"),
    );
    bar.set_position(state.step);
    let started = Instant::now();
    let tokens_at_start = state.tokens;
    let mut stopped_early = false;
    let mut last_val = None;
    // steps whose stall rows are not written yet (counts are read `count_lag` steps late)
    let mut pending: VecDeque<(u64, bool)> = VecDeque::new();
    let stall_log = StallWriter { names: &params.names, groups: &groups, theory, detail_every: cfg.run.stall_detail_every };
    let mut device_peak: Option<u64> = None;
    let mut last_checkpoint: Option<PathBuf> = None;

    while state.step < max_steps {
        let step = state.step + 1;
        let t0 = Instant::now();
        let lr = learning_rate(step, cfg.optim.lr, cfg.optim.warmup_steps, max_steps, cfg.optim.min_lr_ratio);
        // Forward/backward over the micro-batches, gradients summed in FP32; one micro-batch's
        // gradients go to the optimizer in their own dtype (BF16 for a BF16 model: the
        // optimizer widens them exactly, so the step is the same: 2 bytes per parameter less
        // for it to read, and no FP32 copy of the gradients kept through the step).
        let mut ctx = StepContext {
            model: &model,
            params: &params,
            opt: opt.as_mut(),
            stream: &mut stream,
            device: &dev,
            micro_batch: cfg.train.micro_batch,
            grad_accum: cfg.train.grad_accum,
            grad_clip: cfg.optim.grad_clip,
        };
        let out = train_step(&mut ctx, step, lr, None)?;
        let (loss, norm, finite, step_tokens, position) = (out.loss, out.grad_norm, out.updated, out.tokens, out.position);
        if finite {
            state.nonfinite_in_row = 0;
        } else {
            state.nonfinite_in_row += 1;
            tracing::warn!("step {step}: non-finite loss {loss} or gradient norm {norm}: update skipped");
        }
        if let Some((used, peak)) = device_memory(&dev) {
            device_peak = Some(peak);
            tracing::debug!(step, used_gib = used as f64 / (1u64 << 30) as f64, peak_gib = peak as f64 / (1u64 << 30) as f64, "device memory");
        }
        if position.epoch > state.data.epoch {
            bar.suspend(|| tracing::info!("step {step}: the train shards are used up; epoch {} begins", position.epoch));
        }
        state.step = step;
        state.tokens += step_tokens;
        state.data = position;
        let dt = t0.elapsed().as_secs_f64();
        metrics.write(&MetricsRow::Train {
            step,
            tokens: state.tokens,
            lr,
            loss,
            grad_norm: norm as f64,
            step_time: dt,
            tokens_per_s: step_tokens as f64 / dt,
            skipped: !finite,
        })?;
        pending.push_back((step, finite));
        let lag = opt.count_lag();
        let last_row = stall_log.flush(&mut pending, lag, opt.as_mut(), &mut stalls)?;
        bar.set_position(step);
        if let Some((m, v)) = last_row {
            bar.set_message(format!(
                "loss {loss:.3} | m-stall {} v-stall {} | {:.0} tok/s",
                fmt_frac(m),
                fmt_frac(v),
                step_tokens as f64 / dt
            ));
        }
        let last = step == max_steps;
        // Without a terminal (output to a file or pipe) the bar is hidden: its line goes to
        // the log 20 times per run instead.
        if bar.is_hidden() && (step.is_multiple_of(max_steps.div_ceil(20)) || last) {
            tracing::info!("step {step}/{max_steps}: {}", bar.message());
        }
        if (cfg.train.eval_every > 0 && step.is_multiple_of(cfg.train.eval_every)) || last {
            let vl = evaluate(&model, &val, &dev)?;
            last_val = Some(vl);
            metrics.write(&MetricsRow::Eval { step, tokens: state.tokens, val_loss: vl, val_ppl: vl.exp() })?;
            bar.suspend(|| tracing::info!("step {step}: validation loss {vl:.4} (ppl {:.1})", vl.exp()));
        }
        let too_many = state.nonfinite_in_row > 0 && state.nonfinite_in_row >= cfg.train.max_nonfinite_steps.max(1);
        let interrupted = launch.interrupt.load(Ordering::SeqCst) || launch.stop_after == Some(step);
        let periodic = cfg.train.checkpoint_every > 0 && step.is_multiple_of(cfg.train.checkpoint_every);
        if periodic || last || too_many || interrupted {
            stall_log.flush(&mut pending, 0, opt.as_mut(), &mut stalls)?;
            let check = export_check(&model, &val, &dev, dtype)?;
            let dir = checkpoint::save(
                &run_dir,
                &varmap,
                &hf_config,
                opt.states()?,
                &state,
                &config_toml,
                cfg.train.keep_checkpoints,
                &[(checkpoint::EXPORT_CHECK, serde_json::to_vec(&check)?)],
            )?;
            tracing::info!("checkpoint {}", dir.display());
            last_checkpoint = Some(dir);
        }
        if too_many {
            bar.abandon();
            bail!(
                "stopping at step {step}: {} consecutive steps with a non-finite loss or gradient norm \
                 (limit train.max_nonfinite_steps = {}; last loss {loss}, gradient norm {norm}); \
                 checkpoint written to {}; try a lower optim.lr or optim.grad_clip",
                state.nonfinite_in_row,
                cfg.train.max_nonfinite_steps,
                last_checkpoint.as_deref().unwrap_or(&run_dir).display()
            );
        }
        if interrupted && !last {
            bar.abandon_with_message(format!("stopped at step {step}; resume with --resume {}", run_dir.display()));
            stopped_early = true;
            break;
        }
    }
    stall_log.flush(&mut pending, 0, opt.as_mut(), &mut stalls)?;
    bar.finish();
    let elapsed = started.elapsed().as_secs_f64();
    let summary = summary::build(
        &run_dir,
        n_params,
        state_bytes,
        (state.tokens - tokens_at_start) as f64 / elapsed.max(1e-9),
        last_val,
        device_peak,
    )?;
    checkpoint::write_atomic(&run_dir.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    if !stopped_early {
        println!("{}", summary.render());
        if cfg.run.plots {
            if let Err(e) = crate::plot::plot_run(&run_dir) {
                tracing::warn!("plots not written: {e:#}");
            }
        }
    }
    Ok(Outcome { run_dir, summary, stopped_early })
}

/// A data error as one line: its message already includes its source, so `{:#}` must not
/// append the source a second time.
fn data_err(e: lowbit_data::DataError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Writes `stalls.jsonl` rows for completed steps, `lag` steps behind the newest.
struct StallWriter<'a> {
    names: &'a [String],
    groups: &'a [String],
    theory: Theory,
    detail_every: u64,
}

impl StallWriter<'_> {
    /// Write the rows of all but the newest `lag` pending steps (`(step, updated)`; a
    /// skipped step has zero counts). Returns the last written (m, v) fractions.
    fn flush(
        &self,
        pending: &mut VecDeque<(u64, bool)>,
        lag: usize,
        opt: &mut dyn Optimizer,
        out: &mut JsonlWriter,
    ) -> Result<Option<(Option<f64>, Option<f64>)>> {
        let mut last = None;
        while pending.len() > lag {
            let (step, updated) = pending.pop_front().expect("non-empty");
            let counts = if updated {
                opt.stall_counts(step)?
            } else {
                vec![StallCounts::default(); self.names.len()]
            };
            let detail = self.detail_every > 0 && step % self.detail_every == 0;
            let row = StallRow::build(step, self.names, self.groups, &counts, self.theory, detail);
            out.write(&row)?;
            last = Some((row.frac.m, row.frac.v));
        }
        Ok(last)
    }
}

/// Device memory `(in use, peak)` of the CUDA pool, bytes; logged per step at debug level.
fn device_memory(dev: &Device) -> Option<(u64, u64)> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda_optimizer::device_pool_memory(dev),
        _ => None,
    }
}

fn fmt_frac(f: Option<f64>) -> String {
    f.map_or("-".into(), |x| format!("{x:.3}"))
}

fn check_compatible(dir: &Path, saved: &TrainState, now: &TrainState) -> Result<()> {
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
    if (saved.m_format.as_str(), saved.v_format.as_str(), saved.block_size)
        != (now.m_format.as_str(), now.v_format.as_str(), now.block_size)
    {
        bail!(
            "{}: checkpoint states are m={} v={} block {}, the config asks for m={} v={} block {} \
             (optim.states.m_format / v_format / block_size must match to resume)",
            dir.join("state.json").display(),
            saved.m_format,
            saved.v_format,
            saved.block_size,
            now.m_format,
            now.v_format,
            now.block_size
        );
    }
    Ok(())
}

/// The loss of the model on the first validation micro-batch, with the batch itself, for
/// checking an exported checkpoint in `transformers` (`scripts/check_hf_export.py`).
pub fn export_check(model: &Llama, val: &[Batch], dev: &Device, dtype: DType) -> Result<checkpoint::ExportCheck> {
    let b = val.first().context("validation set is empty: no batch for export_check.json")?;
    let (x, y, m) = batch_tensors(b, dev)?;
    let loss = model.loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
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
fn make_optimizer(host: LowbitAdamW, dev: &Device) -> Result<Box<dyn Optimizer>> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Ok(Box::new(crate::cuda_optimizer::DeviceAdamW::new(host, dev)?)),
        _ => Ok(Box::new(HostAdamW::new(host))),
    }
}
