//! SOAP on the host: the CPU reference's store ([`HostStore`]: the states as [`QuantState`]s,
//! the write-backs [`super::store`]'s) and the CPU step over every tensor ([`step_all`]).

use super::config::SoapConfig;
use super::step::{apply_refreshes, direction, refresh_all, step_tensor, Direction, Shape, SoapStore, Which};
use super::store;
use crate::error::OptimError;
use crate::rules::adamw::step::Weights;
use crate::rules::step_plan::StepPlan;
use crate::states::format::Rounding;
use crate::states::moments::{Moments, TensorState};
use crate::states::precond::{precond_key, Precond, SoapStates};
use crate::states::quant::QuantState;
use crate::states::stalls::StallCounts;
use candle_core::{DType, Device, Tensor, Var};
use half::bf16;

/// A tensor's weights on the host while its update runs.
pub enum HostWeights {
    F32(Vec<f32>),
    /// BF16 bit patterns.
    Bf16(Vec<u16>),
}

/// One tensor's SOAP states on the host, its weights, and the counts of its update.
pub struct HostStore<'a> {
    pub t: &'a mut TensorState,
    pub p: &'a mut Precond,
    pub w: HostWeights,
    pub counts: StallCounts,
}

impl HostStore<'_> {
    fn state(&mut self, which: Which) -> Option<&mut QuantState> {
        match which {
            Which::M => Some(&mut self.t.m),
            Which::V => Some(&mut self.t.v),
            Which::L => self.p.l.as_mut(),
            Which::R => self.p.r.as_mut(),
        }
    }
}

impl SoapStore for HostStore<'_> {
    fn basis(&self, side: usize) -> Option<Tensor> {
        let (q, n) = if side == 0 { (&self.p.q_l, self.p.rows) } else { (&self.p.q_r, self.p.cols) };
        (!q.is_empty()).then(|| Tensor::from_slice(q, (n, n), &Device::Cpu).expect("n x n basis"))
    }

    fn set_basis(&mut self, side: usize, q: Tensor) -> Result<(), OptimError> {
        *(if side == 0 { &mut self.p.q_l } else { &mut self.p.q_r }) = q.flatten_all()?.to_vec1::<f32>()?;
        Ok(())
    }

    fn ema(&mut self, which: Which, u: &Tensor, a: f32, b: f32, rounding: Rounding, key: u64) -> Result<Tensor, OptimError> {
        let host = u.flatten_all()?.to_vec1::<f32>()?;
        let state = self.state(which).ok_or_else(|| OptimError::State(format!("no {which:?} preconditioner")))?;
        let (new, c) = store::ema_write(state, &host, a, b, rounding, key);
        match which {
            Which::M => self.counts.m += c,
            Which::V => self.counts.v += c,
            Which::L | Which::R => self.counts.precond += c,
        }
        Ok(Tensor::from_vec(new, u.shape(), u.device())?)
    }

    fn zero(&mut self, which: Which) -> Result<(), OptimError> {
        if let Some(s) = self.state(which) {
            s.set_zero();
        }
        Ok(())
    }

    fn weights(&mut self, n: &Tensor, lr: f32, decay: f32, rounding: Rounding, key: u64) -> Result<(), OptimError> {
        let n = n.flatten_all()?.to_vec1::<f32>()?;
        let w = match &mut self.w {
            HostWeights::F32(p) => Weights::F32(p),
            HostWeights::Bf16(p) => Weights::Bf16(p),
        };
        self.counts.w += store::weights_write(w, &n, lr, decay, rounding, key);
        Ok(())
    }

    fn permute_v(&mut self, rows: Option<&[usize]>, cols: Option<&[usize]>) -> Result<(), OptimError> {
        store::permute(&mut self.t.v, self.p.rows, self.p.cols, rows, cols);
        Ok(())
    }

    fn direction(&mut self, g: &Tensor, m_rot: &Tensor, v: &Tensor, d: Direction) -> Result<Tensor, OptimError> {
        let (n, zero_grad, zero_v) = direction(g, m_rot, v, d)?;
        self.counts.zero_grad += zero_grad;
        self.counts.zero_v += zero_v;
        Ok(n)
    }
}

/// The CPU reference's SOAP update of every tensor (the moments `moments`, the
/// preconditioners `soap`, settings `cfg`) under `plan`: each parameter copied to the host,
/// stepped ([`step_tensor`]) and written back; then the bases due for a refresh, all at once
/// ([`refresh_all`]). Returns each tensor's counts.
///
/// # Errors
/// A parameter of another dtype than F32 or BF16, or a failing tensor operation.
pub fn step_all(
    moments: &mut Moments,
    soap: &mut SoapStates,
    cfg: &SoapConfig,
    plan: &StepPlan,
    params: &[Var],
    grads: &[Tensor],
) -> Result<Vec<StallCounts>, OptimError> {
    let seed = moments.seed;
    let (mut out, mut refreshes) = (Vec::with_capacity(params.len()), Vec::with_capacity(params.len()));
    for (i, ((t, p), (var, grad))) in moments.tensors.iter_mut().zip(&mut soap.tensors).zip(params.iter().zip(grads)).enumerate() {
        let v = var.as_tensor();
        let w = match v.dtype() {
            DType::F32 => HostWeights::F32(v.flatten_all()?.to_vec1::<f32>()?),
            DType::BF16 => HostWeights::Bf16(v.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect()),
            d => return Err(OptimError::State(format!("parameter {} has unsupported dtype {d:?} (F32 or BF16)", t.info.name))),
        };
        let shape = Shape { rows: p.rows, cols: p.cols, rotated: [p.l.is_some(), p.r.is_some()] };
        let keys = [precond_key(seed, plan.update, i, 0), precond_key(seed, plan.update, i, 1)];
        let mut s = HostStore { t, p, w, counts: StallCounts::default() };
        refreshes.push(step_tensor(&mut s, shape, grad, &plan.tensors[i], keys, cfg, plan.update)?);
        let new = match s.w {
            HostWeights::F32(w) => Tensor::from_vec(w, v.shape(), v.device())?,
            HostWeights::Bf16(w) => Tensor::from_vec(w.into_iter().map(bf16::from_bits).collect::<Vec<_>>(), v.shape(), v.device())?,
        };
        var.set(&new)?;
        out.push(s.counts);
    }
    let done = refresh_all(&refreshes)?;
    for (((t, p), req), res) in moments.tensors.iter_mut().zip(&mut soap.tensors).zip(&refreshes).zip(done) {
        if !req.is_empty() {
            apply_refreshes(&mut HostStore { t, p, w: HostWeights::F32(vec![]), counts: StallCounts::default() }, req, res)?;
        }
    }
    Ok(out)
}
