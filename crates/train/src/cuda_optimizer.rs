//! The fused CUDA optimizer behind the [`Optimizer`] trait (`cuda` feature).

use crate::optimizer::{Optimizer, ParamSet};
use anyhow::Result;
use candle_core::{Device, Tensor};
use lowbit_optim::cuda::{CudaAdamW, COUNTER_RING};
use lowbit_optim::{LowbitAdamW, StallCounts};

/// Steps by which the stall counts of a GPU optimizer are read late (half the kernel's ring of
/// counters, at most the adaptive reset rule's lag, which its decisions then never wait for):
/// the counters of step s are read at step s + lag, long written, so reading them adds no wait
/// to the step (whose one synchronisation is at its end, `step.rs`).
pub const COUNT_LAG: usize = {
    let lag = lowbit_optim::reset::ADAPTIVE_LAG as usize;
    if COUNTER_RING / 2 < lag { COUNTER_RING / 2 } else { lag }
};

/// States on the GPU; stall counters read back [`Optimizer::count_lag`] steps late so that
/// reading them never waits for the device.
pub struct DeviceAdamW {
    opt: CudaAdamW,
}

impl DeviceAdamW {
    pub fn new(host: LowbitAdamW, dev: &Device) -> Result<Self> {
        let Device::Cuda(d) = dev else { anyhow::bail!("DeviceAdamW needs a CUDA device") };
        Ok(DeviceAdamW { opt: CudaAdamW::new(host, d)? })
    }
}

impl Optimizer for DeviceAdamW {
    fn step(&mut self, step: u64, lr: f64, grad_scale: f32, params: &ParamSet, grads: &[Tensor]) -> Result<()> {
        let tensors: Vec<Tensor> = params.vars.iter().map(|v| v.as_tensor().clone()).collect();
        Ok(self.opt.step(step, lr, grad_scale, &tensors, grads)?)
    }

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>> {
        Ok(self.opt.read_counts(step)?)
    }

    fn count_lag(&self) -> usize {
        COUNT_LAG
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.opt.host.observe(step, total);
    }

    fn states(&mut self) -> Result<&LowbitAdamW> {
        Ok(self.opt.download()?)
    }
}
