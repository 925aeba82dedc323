//! One training step, as nanoGPT's loop reads it: micro-batches → forward → backward →
//! token-weighted gradient sum → global norm → clip → optimizer; then the run's state, its
//! metrics row and the stall rows that are due ([`Session::step`], what the loop calls).
//!
//! The step waits for the device once, at its end: on one CUDA device the clip factor and
//! the skip decision are made by the device and read there by the optimizer, and the loss
//! and the norm are read after the update is queued (`clip_and_update`); before that wait
//! the host builds the next step's batches (`prefetch_next_step`). Also here: the global
//! gradient norm ([`global_norm`]).

use crate::distributed::collective::Collective;
use crate::distributed::shard::{rank_rows, take_rows};
use crate::eval::batch_tensors;
use crate::logs::metrics::MetricsRow;
use crate::model::ParamSet;
use crate::schedule::learning_rate;
use crate::session::Session;
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use lowbit_data::{Batch, DataPosition, TrainStream};
use lowbit_model::{GradSum, Llama};
use lowbit_optim::rules::clip::{clip_factor, norm_of};
use lowbit_optim::{GradScale, Optimizer};
use std::time::Instant;

/// What a step needs besides its number and learning rate.
pub struct StepContext<'a> {
    pub model: &'a Llama,
    pub params: &'a ParamSet,
    pub opt: &'a mut dyn Optimizer,
    pub stream: &'a mut TrainStream,
    pub device: &'a Device,
    pub micro_batch: usize,
    /// Micro-batches this rank accumulates per step (`train.grad_accum / ranks`).
    pub grad_accum: usize,
    /// Clip the global gradient norm to this (0 = no clipping).
    pub grad_clip: f64,
    /// The other ranks of a data-parallel job ([`crate::distributed::collective::Solo`] alone).
    pub comm: &'a dyn Collective,
}

/// What a step did: [`train_step`]'s result, to which [`Session::step`] adds
/// the stall fractions and the epoch; the progress line and the stop conditions read it.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The trainer's step number.
    pub step: u64,
    /// Mean loss over all of the step's target tokens (nats per target token).
    pub loss: f64,
    /// Global L2 norm of the token-weighted mean gradient, before clipping.
    pub grad_norm: f32,
    /// Target tokens of the step (all ranks).
    pub tokens: u64,
    /// Data position after the step's last micro-batch.
    pub position: DataPosition,
    /// False when the loss or norm was non-finite and the update was skipped.
    pub updated: bool,
    /// Seconds the step took.
    pub seconds: f64,
    /// Stalled fractions (m, v) of the newest stall row written, if one was.
    pub stalls: Option<(Option<f64>, Option<f64>)>,
    /// Model FLOPs utilisation of this rank's step ([`crate::flops`]); `None` on the CPU or
    /// a card without a known peak.
    pub mfu: Option<f64>,
    /// The epoch the step's data reached, when it began a new one.
    pub new_epoch: Option<u64>,
}

impl StepReport {
    /// The progress line: loss, the newest stalled fractions of m and v, tokens/s, and MFU
    /// where it is known.
    pub fn line(&self) -> String {
        let frac = |f: Option<f64>| crate::output::fixed(f, 3);
        let (m, v) = self.stalls.unwrap_or((None, None));
        let mfu = self.mfu.map_or(String::new(), |x| format!(" | MFU {:.1}%", 100.0 * x));
        format!("loss {:.3} | m-stall {} v-stall {} | {:.0} tok/s{mfu}", self.loss, frac(m), frac(v), self.tokens as f64 / self.seconds)
    }
}

impl Session {
    /// Training step `step` (= `state.step + 1`): the step itself ([`train_step`]), then the
    /// run's state, the metrics row and the stall rows that are due.
    pub fn step(&mut self, step: u64) -> Result<StepReport> {
        self.step_timed(step, None)
    }

    /// [`Session::step`], adding the seconds of each phase to `phases` (with a device
    /// synchronisation at each phase boundary: for benchmarks, not for training).
    pub fn step_timed(&mut self, step: u64, phases: Option<&mut Phases>) -> Result<StepReport> {
        let (cfg, max_steps) = (&self.cfg, self.cfg.train.max_steps);
        let lr = learning_rate(step, cfg.optim.lr, cfg.optim.warmup_steps, max_steps, cfg.optim.min_lr_ratio);
        let mut ctx = StepContext {
            model: &self.model.llama,
            params: &self.model.params,
            opt: self.opt.as_mut(),
            stream: &mut self.stream,
            device: &self.dev,
            micro_batch: cfg.train.micro_batch,
            grad_accum: self.accum_per_rank,
            grad_clip: cfg.optim.grad_clip,
            comm: self.comm.as_ref(),
        };
        let update = self.state.updates + 1;
        let mut out = train_step(&mut ctx, step, update, lr, phases)?;
        if out.updated {
            self.state.nonfinite_in_row = 0;
            self.state.updates = update;
            if self.opt.last_adaptive_reset() == Some(update) && self.logs.is_some() {
                let cycle = self.last_adaptive_reset.map_or(String::new(), |at| format!(", {} updates after the last", update - at));
                tracing::info!("step {step}: adaptive reset of m and v (Alg. 2) before update {update}{cycle}");
                self.last_adaptive_reset = Some(update);
            }
        } else {
            self.state.nonfinite_in_row += 1;
            tracing::warn!("step {step}: non-finite loss {} or gradient norm {}: update skipped", out.loss, out.grad_norm);
        }
        if let Some((used, peak)) = crate::device::memory(&self.dev) {
            self.device_peak = Some(peak);
            tracing::debug!(
                step,
                used_gib = used as f64 / (1u64 << 30) as f64,
                peak_gib = peak as f64 / (1u64 << 30) as f64,
                "device memory"
            );
        }
        out.new_epoch = (out.position.epoch > self.state.data.epoch).then_some(out.position.epoch);
        out.mfu = self.peak_step_seconds.map(|s| s / out.seconds);
        self.state.step = step;
        self.state.tokens += out.tokens;
        self.state.data = out.position.clone();
        if let Some(logs) = &mut self.logs {
            logs.metric(&MetricsRow::Train {
                step,
                tokens: self.state.tokens,
                lr,
                loss: out.loss,
                grad_norm: out.grad_norm as f64,
                step_time: out.seconds,
                tokens_per_s: out.tokens as f64 / out.seconds,
                skipped: !out.updated,
                mfu: out.mfu,
            })?;
        }
        self.stall_log.push(step, out.updated.then_some(update));
        out.stalls = self.write_stalls(self.opt.count_lag())?;
        Ok(out)
    }
}

/// Seconds spent per phase, summed over steps; measured only when asked
/// (`train bench training`), with a device synchronisation at each phase boundary.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Phases {
    /// Reading and tokenizing the micro-batches, copying them to the device.
    pub data: f64,
    pub forward: f64,
    pub backward: f64,
    /// Gradient sum, global norm, optimizer step and the end-of-step synchronisation.
    pub optimizer: f64,
}

/// Adds the time since the previous lap to one field of [`Phases`] (device synchronised).
struct Clock<'a> {
    phases: Option<&'a mut Phases>,
    dev: &'a Device,
    last: Instant,
}

impl Clock<'_> {
    fn lap(&mut self, field: fn(&mut Phases) -> &mut f64) -> Result<()> {
        if let Some(p) = self.phases.as_deref_mut() {
            self.dev.synchronize()?;
            let now = Instant::now();
            *field(p) += (now - self.last).as_secs_f64();
            self.last = now;
        }
        Ok(())
    }
}

/// Runs training step `step` at learning rate `lr`; `update` is the optimizer's step number
/// for its update. `phases`: add this step's phase times to it. The report's `stalls` and
/// `new_epoch` are left empty (the session knows them).
///
/// A skipped step (non-finite loss or gradient norm) does not exist for the optimizer, as
/// when PyTorch's `GradScaler` skips `optimizer.step()`: `update` counts applied updates only
/// (`TrainState::updates + 1`), and the optimizer's resets and bias correction are functions
/// of it. So a reset due at a skipped step happens at the next applied update, whose bias
/// correction starts again at t = 1: the two always agree. (Keying resets to the trainer's
/// step instead lost such a reset while the bias-correction count restarted anyway: with a
/// constant gradient the first update after it was 1.543 * lr instead of lr.) The learning
/// rate follows the trainer's step.
///
/// The step's loss and gradient are the mean over all of its target tokens, whatever the
/// split into micro-batches: the micro-batches are read first (host data) to count the
/// step's targets `N`, then micro-batch `i`'s mean loss is weighted by `n_i / N` before its
/// backward, so the summed gradients are the token-weighted mean.
///
/// With several ranks every rank reads the whole global micro-batches (`micro_batch *
/// world_size` rows, one global data order) and counts `N` over all of them, then runs its own
/// rows ([`rank_rows`]); the gradients and the loss are summed over ranks (one all-reduce),
/// so the norm, the clip and the update see the global token-weighted mean on every rank.
pub fn train_step(ctx: &mut StepContext, step: u64, update: u64, lr: f64, phases: Option<&mut Phases>) -> Result<StepReport> {
    let t0 = Instant::now();
    let dev = ctx.device;
    if phases.is_some() {
        dev.synchronize()?;
    }
    let mut clock = Clock { phases, dev, last: Instant::now() };
    let (rank, world) = (ctx.comm.rank(), ctx.comm.world_size());
    let global = (0..ctx.grad_accum)
        .map(|_| ctx.stream.next_batch(ctx.micro_batch * world).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<Result<Vec<Batch>>>()?;
    let position = global.last().context("grad_accum is 0")?.position.clone();
    // (the mask is 0 or 1: the sum of a batch's mask is its count of targets, exactly)
    let counts: Vec<f64> = global.iter().map(|b| b.target_tokens() as f64).collect();
    let total: f64 = counts.iter().sum();
    let tokens = total as u64;
    let (batches, targets) = match world {
        1 => (global, counts),
        _ => {
            let own: Vec<Batch> = global.iter().map(|b| take_rows(b, rank_rows(rank, ctx.micro_batch))).collect();
            let targets = own.iter().map(|b| b.target_tokens() as f64).collect();
            (own, targets)
        }
    };
    // One micro-batch's gradients go to the optimizer in their own dtype (BF16 for a BF16
    // model: the optimizer widens them exactly, so the step is the same, with 2 bytes per
    // parameter less for it to read); several are summed in FP32 (`TrainingPass::accumulate`).
    let mut sum = GradSum::new();
    let mut single = None;
    let mut loss_sum: Option<Tensor> = None;
    for (b, n) in batches.iter().zip(&targets) {
        let (x, y, m) = batch_tensors(b, dev)?;
        clock.lap(|p| &mut p.data)?;
        // A step without targets has loss 0 in every micro-batch: any weight keeps it 0.
        let weight = if total > 0.0 { n / total } else { 1.0 };
        let pass = ctx.model.training_pass(&x, &y, &m, Some(&b.input), weight)?;
        let loss = pass.loss().detach();
        clock.lap(|p| &mut p.forward)?;
        match ctx.grad_accum {
            1 => single = Some(pass.backward()?),
            _ => pass.accumulate(&mut sum)?,
        }
        loss_sum = Some(match loss_sum.take() {
            None => loss,
            Some(s) => (s + loss)?,
        });
        clock.lap(|p| &mut p.backward)?;
    }
    let grad_of = |w: &Tensor| match &single {
        Some(store) => store.get(w).cloned(),
        None => sum.get(w).cloned(),
    };
    let grads = (ctx.params.vars.iter())
        .map(|var| grad_of(var.as_tensor()).context("a parameter received no gradient"))
        .collect::<Result<Vec<Tensor>>>()?;
    drop((single, sum));
    let loss_sum = loss_sum.context("grad_accum is 0")?;
    let (loss, grad_norm, updated) = clip_and_update(ctx, update, lr, grads, &loss_sum)?;
    clock.lap(|p| &mut p.optimizer)?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(StepReport { step, loss, grad_norm, tokens, position, updated, seconds, stalls: None, new_epoch: None, mfu: None })
}

/// The step's end: the global gradient norm, the clip ([`clip_factor`]) and the update of
/// `ctx.params` from `grads` with the summed loss `loss_sum` (this rank's); returns the
/// step's (loss, norm, updated). It waits for the device once, after the update is queued:
/// on one CUDA device the clip is decided by the device
/// ([`lowbit_optim::cuda::grad_norm::clip_on_device`]) and the update reads it there, then the loss
/// and the norm are read; elsewhere (the CPU; several ranks, where the all-reduce reads the
/// loss) the clip is decided on the host before the update, then the device is synchronised.
/// Both decide by the same rule; the report's `updated` is what the update did (on the
/// device, its own skip flag, read back).
fn clip_and_update(ctx: &mut StepContext, update: u64, lr: f64, mut grads: Vec<Tensor>, loss_sum: &Tensor) -> Result<(f64, f32, bool)> {
    let max_norm = ctx.grad_clip as f32;
    #[cfg(feature = "cuda")]
    if ctx.comm.world_size() == 1 && ctx.device.is_cuda() {
        let clip = lowbit_optim::cuda::grad_norm::clip_on_device(&grads, loss_sum, max_norm)?;
        ctx.opt.step(update, lr, clip.scale(), &ctx.params.vars, &grads)?;
        drop(grads);
        prefetch_next_step(ctx);
        // `updated` is what the kernels did; the host's rule must agree (cuda_parity checks it)
        let (loss, sum, skipped) = clip.read()?;
        let norm = norm_of(sum);
        debug_assert_eq!(skipped, clip_factor(loss, norm, max_norm).is_none(), "the device's clip rule left the host's");
        return Ok((loss as f64, norm, !skipped));
    }
    let loss = match ctx.comm.world_size() {
        1 => loss_sum.to_scalar::<f32>()?,
        _ => all_reduce(ctx.comm, &mut grads, loss_sum)?,
    };
    let norm = global_norm(&grads)?;
    let factor = clip_factor(loss, norm, max_norm);
    if let Some(f) = factor {
        ctx.opt.step(update, lr, GradScale::Host(f), &ctx.params.vars, &grads)?;
    }
    drop(grads);
    prefetch_next_step(ctx);
    // one synchronisation per step bounds how far the host runs ahead of the device (and
    // with it the memory of queued steps)
    ctx.device.synchronize()?;
    Ok((loss as f64, norm, factor.is_some()))
}

/// Builds the next step's micro-batches ([`TrainStream::prefetch`]) while the device runs
/// this step's update, before the step waits for it: the host's part of the next step's data
/// (0.2-0.3 ms of row copies at 128 x 256) leaves the step boundary, where the device idles.
/// The batches and their order are those `train_step` would read anyway.
fn prefetch_next_step(ctx: &mut StepContext) {
    for _ in 0..ctx.grad_accum {
        ctx.stream.prefetch(ctx.micro_batch * ctx.comm.world_size());
    }
}

/// Sums `grads` (replaced by FP32 sums) and the scalar `loss` over all ranks in one
/// all-reduce of a flat FP32 buffer on the device ([`Collective::all_reduce_tensor`]); returns
/// the summed loss. The summed gradients are views into that buffer (no copy), except where a
/// tensor's offset is not a multiple of 4 elements, which the fused optimizer needs (copied
/// into storage of its own).
fn all_reduce(comm: &dyn Collective, grads: &mut [Tensor], loss: &Tensor) -> Result<f32> {
    let mut parts = Vec::with_capacity(grads.len() + 1);
    for g in grads.iter() {
        parts.push(g.to_dtype(DType::F32)?.flatten_all()?);
    }
    parts.push(loss.to_dtype(DType::F32)?.reshape(1)?);
    let flat = comm.all_reduce_tensor(&Tensor::cat(&parts, 0)?)?;
    let mut at = 0;
    for g in grads.iter_mut() {
        let n = g.elem_count();
        let view = flat.narrow(0, at, n)?.reshape(g.shape())?;
        *g = if at % 4 == 0 { view } else { view.force_contiguous()? };
        at += n;
    }
    // (to_vec1 of a view copies its whole storage to the host: copy out the one element first)
    Ok(flat.narrow(0, at, 1)?.force_contiguous()?.to_vec1::<f32>()?[0])
}

/// Global L2 norm of all gradients (any float dtype), so that finite gradients give a
/// finite norm (four elements of 1e19: 2e19) and tiny ones keep their precision: squares
/// summed in FP32, and again in F64 only when that sum overflowed or is below 1e-20 (where
/// FP32 squares may have underflowed); F64 every step costs two more copies of every
/// gradient. One host sync per pass. Matrices are summed by rows first: candle reduces a
/// whole tensor in one thread block. A norm beyond `f32::MAX` is returned as `inf`.
///
/// On a CUDA device (the `cuda` feature) the sum is one fused pass in FP64
/// (`lowbit_optim::cuda::grad_norm::sum_of_squares`, `cuda` feature: squares of F32 and BF16 gradients, a fixed
/// summation order).
pub fn global_norm(grads: &[Tensor]) -> Result<f32> {
    #[cfg(feature = "cuda")]
    if grads.first().is_some_and(|g| g.device().is_cuda()) {
        return Ok(norm_of(lowbit_optim::cuda::grad_norm::sum_of_squares(grads)?));
    }
    let sq = sum_of_squares(grads, DType::F32)?;
    if sq.is_nan() || (sq.is_finite() && sq >= 1e-20) {
        return Ok(norm_of(sq));
    }
    Ok(norm_of(sum_of_squares(grads, DType::F64)?))
}

/// Σ g² over all gradients, each squared and summed in `dtype`, read to the host.
fn sum_of_squares(grads: &[Tensor], dtype: DType) -> Result<f64> {
    let mut total: Option<Tensor> = None;
    for g in grads {
        let sq = g.to_dtype(dtype)?.sqr()?;
        let s = if g.rank() >= 2 { sq.sum(candle_core::D::Minus1)?.sum_all()? } else { sq.sum_all()? };
        total = Some(match total {
            None => s,
            Some(t) => (t + s)?,
        });
    }
    Ok(total.context("no gradients")?.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Squares of 1e19 overflow FP32 (1e38 each, 4e38 in all); the norm does not: 2e19.
    #[test]
    fn global_norm_of_huge_finite_gradients_is_finite() -> Result<()> {
        let dev = Device::Cpu;
        let matrix = Tensor::new(&[[1e19f32, 1e19], [0.0, 0.0]], &dev)?;
        let vector = Tensor::new(&[1e19f32, -1e19], &dev)?;
        let norm = global_norm(&[matrix, vector.to_dtype(DType::BF16)?])?;
        assert!((norm - 2e19).abs() < 2e19 * 1e-2, "{norm}"); // BF16 holds 1e19 to 3 digits
        let norm = global_norm(&[Tensor::new(&[[1e19f32, 1e19, 1e19, 1e19]], &dev)?])?;
        assert_eq!(norm, 2e19);
        // Tiny gradients keep their precision too (squares below FP32's smallest normal).
        let norm = global_norm(&[Tensor::new(&[3e-23f32, 4e-23], &dev)?])?;
        assert!((norm - 5e-23).abs() < 5e-23 * 1e-6, "{norm}");
        Ok(())
    }
}
