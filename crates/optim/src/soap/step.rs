//! One SOAP update of one tensor ([`step_tensor`], the equations of [`crate::soap`]), written
//! once over [`SoapStore`]: the dense maths are candle operations on the tensor's device, the
//! rounded write-backs the store's (the host's [`super::host`], the GPU's kernels), the
//! eigenbasis refreshes the host's ([`super::basis`]), every tensor's at once ([`refresh_all`]).

use super::basis;
use super::config::SoapConfig;
use crate::error::OptimError;
use crate::format::Rounding;
use crate::step_plan::TensorPlan;
use candle_core::{DType, Tensor};
use rayon::prelude::*;

/// One state of a SOAP tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// First moment (original basis).
    M,
    /// Second moment (rotated basis).
    V,
    /// Left preconditioner EMA of G Gᵀ.
    L,
    /// Right preconditioner EMA of Gᵀ G.
    R,
}

/// Where one tensor's SOAP states live and how they are written back.
pub trait SoapStore {
    /// The basis of side 0 (left) or 1 (right), `n x n` FP32 on the tensor's device; `None`
    /// before the first update.
    fn basis(&self, side: usize) -> Option<Tensor>;
    /// Replace the basis of `side` (row-major `n x n`).
    ///
    /// # Errors
    /// The upload failing.
    fn set_basis(&mut self, side: usize, q: Vec<f32>) -> Result<(), OptimError>;
    /// `new = a * old + b * u` per element (FP32, no FMA), written back rounded
    /// ([`super::store::ema_write`]) and counted; returns `new` (u's shape, FP32).
    ///
    /// # Errors
    /// A tensor operation or copy failing.
    fn ema(&mut self, which: Which, u: &Tensor, a: f32, b: f32, rounding: Rounding, key: u64) -> Result<Tensor, OptimError>;
    /// Zero a state (a reset); a preconditioner the tensor does not have is left alone.
    ///
    /// # Errors
    /// A device write failing.
    fn zero(&mut self, which: Which) -> Result<(), OptimError>;
    /// `w = w * decay - lr * n` ([`super::store::weights_write`]).
    ///
    /// # Errors
    /// A tensor operation or copy failing.
    fn weights(&mut self, n: &Tensor, lr: f32, decay: f32, rounding: Rounding, key: u64) -> Result<(), OptimError>;
    /// Move v's rows and columns with a refreshed basis ([`super::store::permute`]).
    ///
    /// # Errors
    /// A copy failing.
    fn permute_v(&mut self, rows: Option<&[usize]>, cols: Option<&[usize]>) -> Result<(), OptimError>;
    /// Count the zero gradients and the updates with v = 0 and m' != 0 (U32 scalars).
    ///
    /// # Errors
    /// A copy failing.
    fn count(&mut self, zero_grad: Tensor, zero_v: Tensor) -> Result<(), OptimError>;
}

/// The shape and settings of one tensor's update.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub rows: usize,
    pub cols: usize,
    /// Whether each side (left, right) has a preconditioner.
    pub rotated: [bool; 2],
}

/// One SOAP update of one tensor with the gradient `grad` (any float dtype, `rows * cols`
/// elements) under `plan` (AdamW's plan of this update: scalars, roundings, m/v/w keys),
/// `precond_keys` the streams of L and R ([`super::precond_key`]). Returns the basis refreshes
/// this update asks for (none between refreshes): the caller runs them for every tensor at
/// once ([`refresh_all`]) and puts them in place ([`apply_refreshes`]) to complete the update.
///
/// # Errors
/// A tensor operation, a copy or an eigendecomposition failing.
pub fn step_tensor(
    s: &mut impl SoapStore,
    shape: Shape,
    grad: &Tensor,
    plan: &TensorPlan,
    precond_keys: [u64; 2],
    cfg: &SoapConfig,
    update: u64,
) -> Result<Vec<Refresh>, OptimError> {
    let (h, r) = (&plan.scalars, &plan.roundings);
    let g = grad.to_dtype(DType::F32)?.reshape((shape.rows, shape.cols))?.affine(f64::from(h.grad_scale), 0.0)?;
    if h.reset_m {
        s.zero(Which::M)?;
    }
    if h.reset_v {
        for w in [Which::V, Which::L, Which::R] {
            s.zero(w)?;
        }
    }
    let sides: Vec<usize> = (0..2).filter(|&k| shape.rotated[k]).collect();
    let dim = |k: usize| if k == 0 { shape.rows } else { shape.cols };
    let which = |k: usize| if k == 0 { Which::L } else { Which::R };
    let (bs, one_minus_bs) = (cfg.shampoo_beta as f32, (1.0 - cfg.shampoo_beta) as f32);
    // G Gᵀ (left) or Gᵀ G (right)
    let outer = |k: usize| -> Result<Tensor, OptimError> { Ok(if k == 0 { g.matmul(&g.t()?)? } else { g.t()?.matmul(&g)? }) };
    if sides.iter().any(|&k| s.basis(k).is_none()) {
        for &k in &sides {
            let new = s.ema(which(k), &outer(k)?, bs, one_minus_bs, r.m, precond_keys[k])?;
            s.set_basis(k, basis::eigenbasis(&new.flatten_all()?.to_vec1::<f32>()?, dim(k))?)?;
        }
        return Ok(vec![]);
    }
    let (ql, qr) = (s.basis(0), s.basis(1));
    let rotate = |x: &Tensor| -> Result<Tensor, OptimError> {
        let mut y = x.clone();
        if let Some(q) = &ql {
            y = q.t()?.matmul(&y)?;
        }
        if let Some(q) = &qr {
            y = y.matmul(q)?;
        }
        Ok(y)
    };
    let g_rot = rotate(&g)?;
    let m = s.ema(Which::M, &g, h.beta1, h.one_minus_beta1, r.m, plan.keys.m)?;
    let v = s.ema(Which::V, &g_rot.sqr()?, h.beta2, h.one_minus_beta2, r.v, plan.keys.v)?;
    let m_rot = rotate(&m)?;
    let denom = (v.affine(f64::from(h.inv_bias_correction2), 0.0)?.sqrt()? + f64::from(h.eps))?;
    let mut n = (m_rot.affine(f64::from(h.inv_bias_correction1), 0.0)? / denom)?;
    if let Some(q) = &ql {
        n = q.matmul(&n)?;
    }
    if let Some(q) = &qr {
        n = n.matmul(&q.t()?)?;
    }
    s.weights(&n, h.lr, h.decay, r.w, plan.keys.w)?;
    let zero_grad = g.eq(0f32)?.to_dtype(DType::U32)?.sum_all()?;
    let zero_v = (v.eq(0f32)?.to_dtype(DType::U32)? * m_rot.ne(0f32)?.to_dtype(DType::U32)?)?.sum_all()?;
    s.count(zero_grad, zero_v)?;
    let mut refreshes = vec![];
    for &k in &sides {
        let new = s.ema(which(k), &outer(k)?, bs, one_minus_bs, r.m, precond_keys[k])?;
        if update.is_multiple_of(cfg.precondition_frequency) {
            let q = s.basis(k).expect("a basis after the first update").flatten_all()?.to_vec1::<f32>()?;
            refreshes.push(Refresh { side: k, n: dim(k), a: new.flatten_all()?.to_vec1::<f32>()?, q });
        }
    }
    Ok(refreshes)
}

/// A basis refresh that an update asks for (every `precondition_frequency` updates, for each
/// side with a preconditioner): the preconditioner's new FP32 values and the current basis,
/// both `n x n` row-major on the host. [`refresh_all`] computes them, [`apply_refreshes`] puts
/// the results in place.
#[derive(Debug, Clone)]
pub struct Refresh {
    pub side: usize,
    pub n: usize,
    pub a: Vec<f32>,
    pub q: Vec<f32>,
}

/// A refreshed basis (`n x n` row-major) and its column order ([`basis::refresh`]).
pub type Refreshed = (Vec<f32>, Vec<usize>);

/// The new bases and column orders ([`basis::refresh`]) of every tensor's refreshes, in
/// parallel over all of them (rayon; faer single-threaded inside each, so the results do not
/// depend on the thread count).
pub fn refresh_all(requests: &[Vec<Refresh>]) -> Vec<Vec<Refreshed>> {
    let flat: Vec<(usize, &Refresh)> = requests.iter().enumerate().flat_map(|(i, rs)| rs.iter().map(move |r| (i, r))).collect();
    let done: Vec<(usize, Refreshed)> = flat.par_iter().map(|(i, r)| (*i, basis::refresh(&r.a, &r.q, r.n))).collect();
    let mut out: Vec<Vec<Refreshed>> = requests.iter().map(|_| vec![]).collect();
    for (i, d) in done {
        out[i].push(d);
    }
    out
}

/// Put one tensor's refreshed bases in place and move v's rows (left basis) and columns
/// (right basis) with their new column order.
///
/// # Errors
/// The store's upload or copy failing.
pub fn apply_refreshes(s: &mut impl SoapStore, requests: &[Refresh], results: Vec<Refreshed>) -> Result<(), OptimError> {
    let mut orders: [Option<Vec<usize>>; 2] = [None, None];
    for (r, (q, order)) in requests.iter().zip(results) {
        s.set_basis(r.side, q)?;
        orders[r.side] = Some(order);
    }
    if orders.iter().any(Option::is_some) {
        s.permute_v(orders[0].as_deref(), orders[1].as_deref())?;
    }
    Ok(())
}
