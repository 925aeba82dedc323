//! One SOAP update of one tensor ([`step_tensor`], the equations of [`crate::rules::soap`]), written
//! once over [`SoapStore`]: the dense maths are candle operations on the tensor's device, the
//! rounded write-backs and the update direction the store's (the host's [`super::host`], the
//! GPU's kernels), the eigenbases every tensor's at once after the update ([`Refresh`]: on the
//! host [`refresh_all`], on the GPU `crate::cuda::refresh`).

use super::config::SoapConfig;
use super::{basis, store};
use crate::error::OptimError;
use crate::rules::step_plan::TensorPlan;
use crate::states::format::Rounding;
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
    /// Replace the basis of `side` (`n x n` F32 on the tensor's device).
    ///
    /// # Errors
    /// A copy failing.
    fn set_basis(&mut self, side: usize, q: Tensor) -> Result<(), OptimError>;
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
    /// The update in the rotated basis, N' of [`crate::rules::soap`] ([`direction`], FP32, `m_rot`'s
    /// shape), counting the zero entries of `g` and the elements with v = 0 and m' != 0.
    ///
    /// # Errors
    /// A tensor operation or launch failing.
    fn direction(&mut self, g: &Tensor, m_rot: &Tensor, v: &Tensor, d: Direction) -> Result<Tensor, OptimError>;
}

/// The scalars of SOAP's update direction: AdamW's bias corrections (reciprocals) and eps.
#[derive(Debug, Clone, Copy)]
pub struct Direction {
    pub inv_bias_correction1: f32,
    pub inv_bias_correction2: f32,
    pub eps: f32,
}

/// The reference update direction in the rotated basis, per element `N' = m' * ibc1 /
/// (sqrt(v * ibc2) + eps)` (FP32, candle operations on the tensors' device), with the count of
/// zero entries of `g` and of elements with v = 0 and m' != 0 (each moves by lr * m'/eps, the
/// mechanism `stalls.jsonl`'s `zero_v` tracks).
///
/// # Errors
/// A tensor operation failing.
pub fn direction(g: &Tensor, m_rot: &Tensor, v: &Tensor, d: Direction) -> Result<(Tensor, u64, u64), OptimError> {
    let denom = (v.affine(f64::from(d.inv_bias_correction2), 0.0)?.sqrt()? + f64::from(d.eps))?;
    let n = (m_rot.affine(f64::from(d.inv_bias_correction1), 0.0)? / denom)?;
    let count = |t: Tensor| -> Result<u64, OptimError> { Ok(t.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()?.into()) };
    let zero_grad = count(g.eq(0f32)?)?;
    let zero_v = count((v.eq(0f32)?.to_dtype(DType::U32)? * m_rot.ne(0f32)?.to_dtype(DType::U32)?)?)?;
    Ok((n, zero_grad, zero_v))
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
/// `precond_keys` the streams of L and R ([`crate::states::precond::precond_key`]). Returns the new bases this
/// update asks for (the first bases at a matrix's first update, a refresh every
/// `precondition_frequency` updates, none between): the caller computes them for every tensor
/// at once ([`refresh_all`]) and puts them in place ([`apply_refreshes`]) to complete the update.
///
/// # Errors
/// A tensor operation or a write-back failing.
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
        let mut first = vec![];
        for &k in &sides {
            let a = s.ema(which(k), &outer(k)?, bs, one_minus_bs, r.m, precond_keys[k])?;
            first.push(Refresh { side: k, n: dim(k), a, q: None });
        }
        return Ok(first);
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
    let d = Direction { inv_bias_correction1: h.inv_bias_correction1, inv_bias_correction2: h.inv_bias_correction2, eps: h.eps };
    let mut n = s.direction(&g, &m_rot, &v, d)?;
    if let Some(q) = &ql {
        n = q.matmul(&n)?;
    }
    if let Some(q) = &qr {
        n = n.matmul(&q.t()?)?;
    }
    s.weights(&n, h.lr, h.decay, r.w, plan.keys.w)?;
    let mut refreshes = vec![];
    for &k in &sides {
        let a = s.ema(which(k), &outer(k)?, bs, one_minus_bs, r.m, precond_keys[k])?;
        if update.is_multiple_of(cfg.precondition_frequency) {
            refreshes.push(Refresh { side: k, n: dim(k), a, q: s.basis(k) });
        }
    }
    Ok(refreshes)
}

/// A new basis that an update asks for, of one side with a preconditioner: its full
/// eigendecomposition at the matrix's first update (`q` None), a QR power step from the current
/// basis `q` every `precondition_frequency` updates after ([`basis::update`]). `a` is the
/// preconditioner's new FP32 values, `n x n` (as `q`) on the tensor's device.
#[derive(Debug, Clone)]
pub struct Refresh {
    pub side: usize,
    pub n: usize,
    pub a: Tensor,
    pub q: Option<Tensor>,
}

/// A new basis (`n x n` F32 on the tensor's device) and its column order (`order[j]`: the old
/// column that became column `j`; the identity for a first basis).
pub type Refreshed = (Tensor, Vec<usize>);

/// The new bases of every tensor's requests on the host ([`basis::update`]), in parallel over all
/// of them (rayon; faer single-threaded inside each, so the results do not depend on the thread
/// count): each request's matrices copied to the host, its basis copied back to `a`'s device.
///
/// # Errors
/// A copy failing, or an eigendecomposition not converging.
pub fn refresh_all(requests: &[Vec<Refresh>]) -> Result<Vec<Vec<Refreshed>>, OptimError> {
    let host = |t: &Tensor| -> Result<Vec<f32>, OptimError> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
    let mut flat = vec![];
    for r in requests.iter().flatten() {
        flat.push((host(&r.a)?, r.q.as_ref().map(host).transpose()?, r.n));
    }
    let done: Vec<Result<basis::HostBasis, OptimError>> = flat.par_iter().map(|(a, q, n)| basis::update(a, q.as_deref(), *n)).collect();
    let mut done = done.into_iter();
    requests
        .iter()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    let (q, order) = done.next().expect("one result per request")?;
                    Ok((Tensor::from_vec(q, (r.n, r.n), r.a.device())?, order))
                })
                .collect()
        })
        .collect()
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
        orders[r.side] = (!store::is_identity(&order)).then_some(order);
    }
    if orders.iter().any(Option::is_some) {
        s.permute_v(orders[0].as_deref(), orders[1].as_deref())?;
    }
    Ok(())
}
