//! The fused CUDA optimizer behind the [`Optimizer`] trait (`cuda` feature).

use crate::optimizer::{Optimizer, ParamSet};
use anyhow::Result;
use candle_core::{Device, Tensor};
use lowbit_optim::cuda::{CudaAdamW, COUNTER_RING};
use lowbit_optim::{LowbitAdamW, StallCounts};

/// States on the GPU; stall counters read back [`Optimizer::count_lag`] steps late so the
/// step itself never waits for the device.
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
        self.opt.begin_step(step)?;
        for (i, (var, g)) in params.vars.iter().zip(grads).enumerate() {
            self.opt.step_tensor(step, lr, grad_scale, i, var.as_tensor(), g)?;
        }
        Ok(())
    }

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>> {
        Ok(self.opt.read_counts(step)?)
    }

    fn count_lag(&self) -> usize {
        (COUNTER_RING / 2).min(8)
    }

    fn states(&mut self) -> Result<&LowbitAdamW> {
        Ok(self.opt.download()?)
    }
}

/// Device memory in use (total - free), bytes.
pub fn device_memory_used(dev: &Device) -> Option<u64> {
    let Device::Cuda(d) = dev else { return None };
    let ctx = d.cuda_stream().context().clone();
    ctx.bind_to_thread().ok()?;
    let (free, total) = candle_core::cuda::cudarc::driver::result::mem_get_info().ok()?;
    Some((total - free) as u64)
}
