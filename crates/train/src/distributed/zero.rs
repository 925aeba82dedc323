//! ZeRO stage 1, on the CPU and on GPUs: each rank keeps the states of its element range of
//! every tensor ([`shard::zero_ranges`]) in the device's own optimizer
//! ([`lowbit_optim::for_device`]: the CPU reference or the fused kernels), which steps only
//! those elements of the whole weights; then every range goes from its owner to every rank,
//! so all ranks hold the whole updated model: on the CPU one all-gather of the ranges' bytes
//! ([`Collective::all_gather`]), on GPUs an in-place broadcast of each range from its owner
//! ([`Collective::broadcast_views`], the NCCL backend). The random bits are those of the whole
//! tensor's elements, so the update is bit-identical to `train.zero = 0` (`cuda_parity`'s
//! `sharded_step_matches_whole_tensor_step` on the GPU, `data_parallel` on the CPU). Stall
//! counts are summed over ranks as integers; the whole states are gathered for a checkpoint
//! (same single-process layout, so a run resumes with any number of ranks or `zero` setting).
//!
//! One wrapper over either device's optimizer, not a sharded type per device: the shard is a
//! property of the states ([`lowbit_optim::Moments::shard`]), which both adapters already step, and what
//! ZeRO-1 adds (the weight exchange, the summed counts, the gathered states) is the same on
//! both devices but for the one exchange call.

use super::collective::Collective;
use super::shard;
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use half::bf16;
use lowbit_optim::{
    GradScale, HostStates, LowbitAdamW, LowbitOptimizer, Moments, OptimError, Optimizer, QuantState, StallCounts, TensorState,
};
use std::ops::Range;
use std::sync::Arc;

/// AdamW over this rank's shard of every tensor ([`Optimizer`] for `train.zero = 1`).
pub struct Zero1 {
    /// The device's optimizer over this rank's ranges (`TensorState::first` = the range's start).
    local: Box<dyn Optimizer>,
    /// `ranges[r][t]`: rank `r`'s elements of tensor `t`.
    ranges: Vec<Vec<Range<usize>>>,
    comm: Arc<dyn Collective>,
    /// The whole states, gathered for [`Optimizer::states`].
    gathered: Option<Moments>,
    /// Bytes of the states this rank holds (codes + scales).
    local_bytes: usize,
}

impl Zero1 {
    /// Shards `whole` (fresh or loaded from a checkpoint) over the ranks of `comm` and keeps
    /// this rank's on `dev`. Ranges are cut on scale blocks ([`shard::granule`]); on a GPU they
    /// also start at multiples of 4 elements (the fused kernel's vector width).
    ///
    /// # Errors
    /// SOAP's states (not sharded); ranges that cut a scale block; the device's optimizer
    /// refusing the states.
    pub fn new(whole: &LowbitOptimizer, comm: Arc<dyn Collective>, dev: &Device) -> Result<Zero1> {
        let LowbitOptimizer::AdamW(whole) = whole else {
            anyhow::bail!("SOAP's states are not sharded: optim.kind = \"soap\" needs train.zero = 0");
        };
        let whole = &whole.moments;
        let lens: Vec<usize> = whole.tensors.iter().map(|t| t.info.len).collect();
        let specs: Vec<_> = whole.spec_groups().into_iter().map(|(s, _)| s).collect();
        let granule = match dev {
            // block sizes are multiples of 4 (StatesConfig::resolve); unscaled states cut anywhere
            Device::Cuda(_) => shard::common_granule(&specs).map(|g| g.max(4)),
            _ => shard::common_granule(&specs),
        };
        let ranges = shard::zero_ranges(&lens, granule, comm.world_size());
        let local = whole.shard(&ranges[comm.rank()]).context("train.zero = 1")?;
        let local_bytes = local.state_bytes();
        let local = lowbit_optim::for_device(LowbitOptimizer::AdamW(LowbitAdamW::from_moments(local)), dev)?;
        Ok(Zero1 { local, ranges, comm, gathered: None, local_bytes })
    }

    /// Bytes of the states this rank holds (codes + scales).
    pub fn local_state_bytes(&self) -> usize {
        self.local_bytes
    }

    /// Every rank's updated ranges into every rank's weights.
    fn exchange(&self, params: &[Var]) -> Result<()> {
        if self.comm.world_size() == 1 {
            return Ok(()); // `--set train.zero=1` alone: the one shard is everything
        }
        if params.first().is_some_and(|p| p.device().is_cuda()) {
            let views = |rs: &[Range<usize>]| -> Result<Vec<Tensor>> {
                params.iter().zip(rs).map(|(p, r)| Ok(p.as_tensor().flatten_all()?.narrow(0, r.start, r.len())?)).collect()
            };
            let owned = self.ranges.iter().map(|rs| views(rs)).collect::<Result<Vec<_>>>()?;
            return self.comm.broadcast_views(&owned);
        }
        // One all-gather for the updated ranges of all tensors, then each tensor reassembled.
        let rank = self.comm.rank();
        let width = |i: usize| params[i].dtype().size_in_bytes();
        let mut full = params.iter().map(|p| host_bytes(p.as_tensor())).collect::<Result<Vec<_>>>()?;
        let mine: Vec<u8> =
            self.ranges[rank].iter().enumerate().flat_map(|(i, r)| full[i][r.start * width(i)..r.end * width(i)].to_vec()).collect();
        let per_rank: Vec<usize> = self.ranges.iter().map(|rs| rs.iter().enumerate().map(|(i, r)| r.len() * width(i)).sum()).collect();
        let all = self.comm.all_gather(&mine, &per_rank)?;
        let mut at = 0;
        for rs in &self.ranges {
            for (i, r) in rs.iter().enumerate() {
                let n = r.len() * width(i);
                full[i][r.start * width(i)..r.end * width(i)].copy_from_slice(&all[at..at + n]);
                at += n;
            }
        }
        for (var, bytes) in params.iter().zip(full) {
            let t = var.as_tensor();
            let new = match t.dtype() {
                DType::F32 => Tensor::from_vec(
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect::<Vec<_>>(),
                    t.shape(),
                    t.device(),
                )?,
                _ => Tensor::from_vec(
                    bytes.chunks_exact(2).map(|b| bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap()))).collect::<Vec<_>>(),
                    t.shape(),
                    t.device(),
                )?,
            };
            var.set(&new)?;
        }
        Ok(())
    }
}

/// The little-endian bytes of an F32 or BF16 tensor, on the host.
fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => t.flatten_all()?.to_vec1::<f32>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => t.flatten_all()?.to_vec1::<bf16>()?.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        d => anyhow::bail!("ZeRO-1 weights are F32 or BF16, not {d:?}"),
    })
}

/// A failure of the exchange between ranks, as the optimizer's error.
fn collective(e: anyhow::Error) -> OptimError {
    OptimError::Runtime(format!("train.zero = 1: {e:#}"))
}

impl Optimizer for Zero1 {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        self.gathered = None;
        self.local.step(step, lr, scale, params, grads)?;
        self.exchange(params).map_err(collective)
    }

    /// This rank's counts summed over the ranks (so the adaptive rule observes the whole
    /// model's).
    fn measured_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
        let counts = self.local.measured_counts(step)?;
        sum_counts(&counts, self.comm.as_ref()).map_err(collective)
    }

    fn count_lag(&self) -> usize {
        self.local.count_lag()
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.local.observe(step, total);
    }

    fn last_adaptive_reset(&self) -> Option<u64> {
        self.local.last_adaptive_reset()
    }

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        if self.gathered.is_none() {
            let local = self.local.states()?.moments;
            self.gathered = Some(gather_states(local, &self.ranges, self.comm.as_ref()).map_err(collective)?);
        }
        Ok(HostStates { moments: self.gathered.as_ref().expect("gathered"), precond: None })
    }
}

/// Every rank's stall counts of a step summed exactly (integers) over the ranks.
fn sum_counts(counts: &[StallCounts], comm: &dyn Collective) -> Result<Vec<StallCounts>> {
    let mut flat: Vec<u64> = counts.iter().flat_map(|c| c.to_words()).collect();
    comm.sum_u64(&mut flat)?;
    Ok(flat.chunks_exact(StallCounts::WORDS).map(|c| StallCounts::from_words(c.try_into().expect("one tensor"))).collect())
}

/// The whole optimizer states on every rank, from each rank's shard `local` (cut by
/// `ranges[rank]`): one all-gather of codes and scales, then [`Moments::unshard`].
fn gather_states(local: &Moments, ranges: &[Vec<Range<usize>>], comm: &dyn Collective) -> Result<Moments> {
    let mine: Vec<u8> = local.tensors.iter().flat_map(|t| [state_bytes(&t.m), state_bytes(&t.v)]).flatten().collect();
    let shapes: Vec<Vec<(QuantState, QuantState)>> = ranges
        .iter()
        .map(|rs| rs.iter().zip(&local.tensors).map(|(r, t)| (t.m.zeros_like(r.len()), t.v.zeros_like(r.len()))).collect())
        .collect();
    let counts: Vec<usize> = shapes.iter().map(|s| s.iter().map(|(m, v)| state_bytes(m).len() + state_bytes(v).len()).sum()).collect();
    let all = comm.all_gather(&mine, &counts)?;
    let mut at = 0;
    let mut shards = Vec::with_capacity(shapes.len());
    for (rs, states) in ranges.iter().zip(shapes) {
        let mut shard = local.clone();
        for ((t, r), (mut m, mut v)) in shard.tensors.iter_mut().zip(rs).zip(states) {
            at = fill(&mut m, &all, at)?;
            at = fill(&mut v, &all, at)?;
            *t = TensorState { info: t.info.clone(), first: r.start, spec: t.spec, m, v, momentum: t.momentum };
        }
        shards.push(shard);
    }
    Ok(Moments::unshard(&shards)?)
}

/// Codes then scales, as stored.
fn state_bytes(s: &QuantState) -> Vec<u8> {
    let mut b = s.code_bytes();
    b.extend(s.scales.iter().flat_map(|x| x.to_le_bytes()));
    b
}

/// Reads [`state_bytes`] of `s`'s layout from `all[at..]` into `s`; returns the next offset.
fn fill(s: &mut QuantState, all: &[u8], at: usize) -> Result<usize> {
    let codes = s.code_bytes().len();
    let end = at + codes + 4 * s.scales.len();
    anyhow::ensure!(end <= all.len(), "gathered optimizer states are {} bytes, expected at least {end}", all.len());
    s.set_code_bytes(&all[at..at + codes])?;
    for (x, b) in s.scales.iter_mut().zip(all[at + codes..end].chunks_exact(4)) {
        *x = f32::from_le_bytes(b.try_into().unwrap());
    }
    Ok(end)
}
