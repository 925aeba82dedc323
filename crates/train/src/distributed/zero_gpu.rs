//! ZeRO stage 1 on GPUs (`cuda` feature, run with the NCCL backend): each rank keeps the
//! states of its element range of every tensor on its GPU and runs the fused kernel on views
//! of those ranges of the (all-reduced) gradients and of its weights, in place; then every
//! range is broadcast from its owner ([`Collective::broadcast_views`]), so all ranks hold the
//! whole updated model. The kernel draws the random bits of the whole tensor's elements, so
//! the update is bit-identical to `train.zero = 0` (`cuda_parity`'s
//! `sharded_step_matches_whole_tensor_step`). Stall counts are summed over ranks as integers;
//! a checkpoint gathers the whole states through the CPU backend, as the CPU ZeRO-1 does.

use super::collective::Collective;
use super::zero::{gather_states, sum_counts};
use crate::cuda_optimizer::COUNT_LAG;
use crate::optimizer::{Optimizer, ParamSet};
use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use lowbit_optim::cuda::CudaAdamW;
use lowbit_optim::{LowbitAdamW, StallCounts};
use std::ops::Range;
use std::sync::Arc;

/// AdamW over this rank's shard of every tensor, on its GPU ([`Optimizer`] for
/// `train.zero = 1` with `train.device = "cuda"`).
pub struct DeviceShardedAdamW {
    opt: CudaAdamW,
    /// `ranges[r][t]`: rank `r`'s elements of tensor `t` (starts multiples of 4: the kernel's
    /// vector accesses and random draws).
    ranges: Vec<Vec<Range<usize>>>,
    comm: Arc<dyn Collective>,
    /// The whole states, gathered for [`Optimizer::states`].
    gathered: Option<LowbitAdamW>,
}

impl DeviceShardedAdamW {
    /// Shards `whole` (fresh or loaded from a checkpoint) by `ranges`, uploads this rank's.
    ///
    /// # Errors
    /// Ranges that cut a scale block or do not match the tensors; a device that is not CUDA.
    pub fn new(whole: &LowbitAdamW, ranges: Vec<Vec<Range<usize>>>, comm: Arc<dyn Collective>, dev: &Device) -> Result<Self> {
        let Device::Cuda(d) = dev else { anyhow::bail!("DeviceShardedAdamW needs a CUDA device") };
        anyhow::ensure!(ranges.len() == comm.world_size(), "{} shard lists for {} ranks", ranges.len(), comm.world_size());
        let local = whole.shard(&ranges[comm.rank()]).map_err(anyhow::Error::msg).context("train.zero = 1")?;
        Ok(DeviceShardedAdamW { opt: CudaAdamW::new(local, d)?, ranges, comm, gathered: None })
    }

    /// Bytes of the states this rank holds (codes + scales).
    pub fn local_state_bytes(&self) -> usize {
        self.opt.host.state_bytes()
    }

    /// Views of rank `r`'s ranges of `tensors` (flattened).
    fn views(&self, r: usize, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        tensors.iter().zip(&self.ranges[r]).map(|(t, rg)| Ok(t.flatten_all()?.narrow(0, rg.start, rg.len())?)).collect()
    }
}

impl Optimizer for DeviceShardedAdamW {
    fn step(&mut self, step: u64, lr: f64, grad_scale: f32, params: &ParamSet, grads: &[Tensor]) -> Result<()> {
        self.gathered = None;
        let weights: Vec<Tensor> = params.vars.iter().map(|v| v.as_tensor().clone()).collect();
        let rank = self.comm.rank();
        self.opt.step(step, lr, grad_scale, &self.views(rank, &weights)?, &self.views(rank, grads)?)?;
        if self.comm.world_size() == 1 {
            return Ok(()); // `--set train.zero=1` on one GPU: the one shard is everything
        }
        let owned = (0..self.comm.world_size()).map(|r| self.views(r, &weights)).collect::<Result<Vec<_>>>()?;
        self.comm.broadcast_views(&owned)
    }

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>> {
        sum_counts(&self.opt.read_counts(step)?, self.comm.as_ref())
    }

    fn count_lag(&self) -> usize {
        COUNT_LAG
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.opt.host.observe(step, total);
    }

    fn states(&mut self) -> Result<&LowbitAdamW> {
        if self.gathered.is_none() {
            let local = self.opt.download()?.clone_states();
            self.gathered = Some(gather_states(&local, &self.ranges, self.comm.as_ref())?);
        }
        Ok(self.gathered.as_ref().expect("gathered"))
    }
}
