//! Muon on a CUDA device ([`CudaMuon`]): the fused kernel steps AdamW's tensors as
//! [`CudaAdamW`] does and Muon's matrices in its momentum-only mode (m alone, bit for bit the
//! CPU reference's [`crate::rules::muon::momentum`], the update u written into an FP32 buffer
//! per matrix); then the same candle operations as the CPU reference orthogonalise the updates
//! ([`crate::rules::muon::orthogonalize`], cuBLAS products, matrices of one shape batched) and
//! apply them ([`crate::rules::muon::apply`]). Nothing waits for the device: a device clip's
//! skip reaches the weight update as a mask, the BF16 weights' counts are read with the
//! kernel's, [`COUNT_LAG`] steps late.

use crate::cuda::adamw::{CudaAdamW, COUNTER_RING, COUNT_LAG};
use crate::error::OptimError;
use crate::rules::clip::GradScale;
use crate::rules::muon::{apply, orthogonalize, step_size, weight_counter, LowbitMuon, MuonConfig};
use crate::rules::optimizer::{check_sizes, Optimizer};
use crate::states::stalls::StallCounts;
use crate::states::state_dict::HostStates;
use candle_core::{CudaDevice, DType, Device, Tensor, Var};
use std::collections::VecDeque;

/// Muon with its states on a CUDA device.
pub struct CudaMuon {
    /// The fused kernels over every tensor (Muon's matrices in the momentum-only mode).
    adamw: CudaAdamW,
    /// `[optim.muon]`.
    config: MuonConfig,
    /// Per Muon matrix, in tensor order: its tensor index and its FP32 update buffer u
    /// `[rows, cols]` (written by the fused kernel, read by the orthogonalisation).
    updates: Vec<(usize, Tensor)>,
    /// The BF16 Muon matrices' weight counts of the steps not yet read: the step, and per
    /// matrix with BF16 weights its index and `[updated, stalled, unchanged]` (U32, on the device).
    weight_counts: VecDeque<(u64, Vec<(usize, Tensor)>)>,
}

impl CudaMuon {
    /// Upload Muon's states `host` to `dev`, with an update buffer per Muon matrix.
    ///
    /// # Errors
    /// [`CudaAdamW::new`]'s, or an allocation failing.
    pub fn new(host: LowbitMuon, dev: &CudaDevice) -> Result<Self, OptimError> {
        let device = Device::Cuda(dev.clone());
        let updates = host
            .moments
            .tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.momentum.map(|m| (i, m)))
            .map(|(i, m)| Ok((i, Tensor::zeros((m.rows, m.cols), DType::F32, &device)?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(CudaMuon { adamw: CudaAdamW::new(host.moments, dev)?, config: host.config, updates, weight_counts: VecDeque::new() })
    }
}

/// The fused step, then the orthogonalisation and the weight update of the Muon matrices.
impl Optimizer for CudaMuon {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.adamw.host.tensors, params, grads)?;
        // the fused launch: a Muon matrix's slot takes its update buffer and its FP32 gradient
        let mut weights: Vec<Tensor> = params.iter().map(|p| p.as_tensor().clone()).collect();
        let mut fp32_grads = grads.to_vec();
        for (i, u) in &self.updates {
            weights[*i] = u.clone();
            fp32_grads[*i] = grads[*i].to_dtype(DType::F32)?;
        }
        let plan = self.adamw.step(step, lr, scale, &weights, &fp32_grads)?;
        let keep = match scale {
            GradScale::Host(_) => None,
            GradScale::Device(gate) => Some(gate.get(1)?.eq(0f32)?),
        };
        let updates: Vec<Tensor> = self.updates.iter().map(|(_, u)| u.clone()).collect();
        let orthogonal = orthogonalize::orthogonalize_all(&updates, self.config.ns_steps)?;
        let mut counts = vec![];
        for ((i, _), o) in self.updates.iter().zip(orthogonal) {
            let (decay, size) = step_size(&self.adamw.host, &plan, &self.config, *i, lr);
            if let Some(c) = apply::apply_update(&params[*i], &o, decay, size, keep.as_ref())? {
                counts.push((*i, c));
            }
        }
        while self.weight_counts.len() >= COUNTER_RING {
            self.weight_counts.pop_front();
        }
        self.weight_counts.push_back((step, counts));
        Ok(())
    }

    fn measured_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
        let mut counts = self.adamw.read_counts(step)?;
        while self.weight_counts.front().is_some_and(|(s, _)| *s < step) {
            self.weight_counts.pop_front();
        }
        if let Some((_, w)) = self.weight_counts.pop_front().filter(|(s, _)| *s == step) {
            for (i, c) in w {
                counts[i].w = weight_counter(&c.to_vec1::<u32>()?, self.adamw.host.tensors[i].m.len);
            }
        }
        Ok(counts)
    }

    fn count_lag(&self) -> usize {
        COUNT_LAG
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.adamw.host.observe(step, total);
    }

    fn last_adaptive_reset(&self) -> Option<u64> {
        self.adamw.host.last_adaptive_reset()
    }

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        Ok(HostStates { moments: self.adamw.download()?, precond: None })
    }
}
