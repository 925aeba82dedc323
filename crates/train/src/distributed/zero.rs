//! ZeRO stage 1 on the CPU reference optimizer: each rank keeps and updates the states of its
//! element range of every tensor ([`super::shard::zero_ranges`]), then the updated weight
//! ranges are all-gathered so every rank holds the whole model again. Stall counts are
//! summed over ranks as integers; the whole states are gathered for a checkpoint (same
//! single-process layout, so a run resumes with any number of ranks or `zero` setting).

use super::collective::Collective;
use crate::optimizer::{Optimizer, ParamSet};
use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use half::bf16;
use lowbit_optim::adamw::Weights;
use lowbit_optim::{LowbitAdamW, QuantState, StallCounts, TensorState};
use std::ops::Range;
use std::sync::Arc;

/// AdamW over this rank's shard of every tensor ([`Optimizer`] for `train.zero = 1`).
pub struct ShardedAdamW {
    /// The states of this rank's ranges (`TensorState::first` = the range's start).
    local: LowbitAdamW,
    /// `ranges[r][t]`: rank `r`'s elements of tensor `t`.
    ranges: Vec<Vec<Range<usize>>>,
    comm: Arc<dyn Collective>,
    /// Counts of the last step, summed over ranks when read.
    last: Option<(u64, Vec<StallCounts>)>,
    /// The whole states, gathered for [`Optimizer::states`].
    gathered: Option<LowbitAdamW>,
}

impl ShardedAdamW {
    /// Shards `whole` (fresh or loaded from a checkpoint) by `ranges` and keeps this rank's.
    ///
    /// # Errors
    /// Ranges that cut a scale block or do not match the tensors.
    pub fn new(whole: &LowbitAdamW, ranges: Vec<Vec<Range<usize>>>, comm: Arc<dyn Collective>) -> Result<ShardedAdamW> {
        anyhow::ensure!(ranges.len() == comm.world_size(), "{} shard lists for {} ranks", ranges.len(), comm.world_size());
        let local = whole.shard(&ranges[comm.rank()]).map_err(anyhow::Error::msg).context("train.zero = 1")?;
        Ok(ShardedAdamW { local, ranges, comm, last: None, gathered: None })
    }

    /// Bytes of the states this rank holds (codes + scales).
    pub fn local_state_bytes(&self) -> usize {
        self.local.state_bytes()
    }
}

impl Optimizer for ShardedAdamW {
    fn step(&mut self, step: u64, lr: f64, grad_scale: f32, params: &ParamSet, grads: &[Tensor]) -> Result<()> {
        self.gathered = None;
        self.local.begin_update(step).map_err(anyhow::Error::msg)?;
        let rank = self.comm.rank();
        let mut counts = Vec::with_capacity(params.vars.len());
        let mut full: Vec<Vec<u8>> = Vec::with_capacity(params.vars.len());
        let mut mine = Vec::new();
        for (i, (var, grad)) in params.vars.iter().zip(grads).enumerate() {
            let r = self.ranges[rank][i].clone();
            let g = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let t = var.as_tensor();
            let (c, bytes, width) = match t.dtype() {
                DType::F32 => {
                    let mut p = t.flatten_all()?.to_vec1::<f32>()?;
                    let c = self.local.step_cpu(step, lr, grad_scale, i, Weights::F32(&mut p[r.clone()]), &g[r.clone()]);
                    (c, p.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(), 4)
                }
                DType::BF16 => {
                    let mut p: Vec<u16> = t.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect();
                    let c = self.local.step_cpu(step, lr, grad_scale, i, Weights::Bf16(&mut p[r.clone()]), &g[r.clone()]);
                    (c, p.iter().flat_map(|x| x.to_le_bytes()).collect(), 2)
                }
                d => anyhow::bail!("parameter {} has unsupported dtype {d:?}", params.names[i]),
            };
            mine.extend_from_slice(&bytes[r.start * width..r.end * width]);
            full.push(bytes);
            counts.push(c);
        }
        // One all-gather for the updated ranges of all tensors, then each tensor reassembled.
        let width = |i: usize| params.vars[i].dtype().size_in_bytes();
        let per_rank: Vec<usize> =
            self.ranges.iter().map(|rs| rs.iter().enumerate().map(|(i, r)| r.len() * width(i)).sum()).collect();
        let all = self.comm.all_gather(&mine, &per_rank)?;
        let mut at = 0;
        for rs in &self.ranges {
            for (i, r) in rs.iter().enumerate() {
                let n = r.len() * width(i);
                full[i][r.start * width(i)..r.end * width(i)].copy_from_slice(&all[at..at + n]);
                at += n;
            }
        }
        for (var, bytes) in params.vars.iter().zip(full) {
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
        self.last = Some((step, counts));
        Ok(())
    }

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>> {
        match self.last.take() {
            Some((s, c)) if s == step => sum_counts(&c, self.comm.as_ref()),
            _ => anyhow::bail!("stall counts of step {step} were not kept (the CPU optimizer keeps only the last step)"),
        }
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.local.observe(step, total);
    }

    fn states(&mut self) -> Result<&LowbitAdamW> {
        if self.gathered.is_none() {
            self.gathered = Some(gather_states(&self.local, &self.ranges, self.comm.as_ref())?);
        }
        Ok(self.gathered.as_ref().expect("gathered"))
    }
}

/// Every rank's stall counts of a step summed exactly (integers) over the ranks.
pub(crate) fn sum_counts(counts: &[StallCounts], comm: &dyn Collective) -> Result<Vec<StallCounts>> {
    let mut flat: Vec<u64> = counts.iter().flat_map(|c| c.to_words()).collect();
    comm.sum_u64(&mut flat)?;
    Ok(flat.chunks_exact(StallCounts::WORDS).map(|c| StallCounts::from_words(c.try_into().expect("one tensor"))).collect())
}

/// The whole optimizer states on every rank, from each rank's shard `local` (cut by
/// `ranges[rank]`): one all-gather of codes and scales, then [`LowbitAdamW::unshard`].
pub(crate) fn gather_states(local: &LowbitAdamW, ranges: &[Vec<Range<usize>>], comm: &dyn Collective) -> Result<LowbitAdamW> {
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
        let mut shard = local.clone_states();
        for ((t, r), (mut m, mut v)) in shard.tensors.iter_mut().zip(rs).zip(states) {
            at = fill(&mut m, &all, at)?;
            at = fill(&mut v, &all, at)?;
            *t = TensorState { info: t.info.clone(), first: r.start, m, v };
        }
        shards.push(shard);
    }
    LowbitAdamW::unshard(&shards).map_err(anyhow::Error::msg)
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
    s.set_code_bytes(&all[at..at + codes]).map_err(anyhow::Error::msg)?;
    for (x, b) in s.scales.iter_mut().zip(all[at + codes..end].chunks_exact(4)) {
        *x = f32::from_le_bytes(b.try_into().unwrap());
    }
    Ok(end)
}
