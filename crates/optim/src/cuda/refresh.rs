//! SOAP's new eigenbases on a CUDA device ([`QrRefresh`]): the QR power step of
//! [`crate::rules::soap::basis::refresh`] (SOAP's reference `get_orthogonal_matrix_QR`) with the products
//! as candle operations and the Householder QR by cuSOLVER (`cusolverDnSgeqrf` +
//! `cusolverDnSorgqr`, FP32), every request of an update queued on the device's stream; the
//! eigenvalue estimates of all requests come to the host in one copy (for the column order) and
//! cuSOLVER's status words in one more at the end. A matrix's first basis, a full
//! eigendecomposition, stays on the host ([`crate::rules::soap::step::refresh_all`]: faer, f64, once per
//! matrix). The products follow the run's matmul precision: under `model.matmul_precision =
//! "tf32"` L Q is a TF32 product, as the update's rotations are.
//!
//! Against the CPU reference (faer's QR in FP32, estimates summed in f64 there and here): the
//! products round differently, so bases agree within FP32 rounding up to each column's sign
//! (SOAP's update does not depend on the signs), and near-equal eigenvalue estimates may sort
//! in another order; `tests/cuda_parity/soap.rs` bounds the effect on the weights.

use crate::cuda::adamw::{element_address, err};
use crate::error::OptimError;
use crate::rules::soap::basis;
use crate::rules::soap::step::{refresh_all, Refresh, Refreshed};
use candle_core::cuda::cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use candle_core::{CudaDevice, DType, Tensor};
use cudarc::cusolver::safe::DnHandle;
use cudarc::cusolver::sys;
use std::sync::Arc;

/// cuSOLVER on one device's stream (the stream candle's operations use).
pub struct QrRefresh {
    solver: DnHandle,
    stream: Arc<CudaStream>,
}

fn solver_err(what: &str, e: impl std::fmt::Debug) -> OptimError {
    OptimError::Runtime(format!("SOAP basis refresh on the GPU: {what}: {e:?}"))
}

impl QrRefresh {
    /// A cuSOLVER handle on `dev`'s stream (a CUDA build links libcusolver.so.12: without it the
    /// binary does not start).
    ///
    /// # Errors
    /// cuSOLVER failing to create its handle.
    pub fn new(dev: &CudaDevice) -> Result<Self, OptimError> {
        let stream = dev.cuda_stream();
        let solver = DnHandle::new(stream.clone()).map_err(|e| solver_err("cusolverDnCreate", e))?;
        Ok(QrRefresh { solver, stream })
    }

    /// The new bases of every tensor's requests (as [`crate::rules::soap::step::refresh_all`] on the
    /// host): first bases on the host in parallel, power steps on the device.
    ///
    /// # Errors
    /// A tensor operation, a copy or a cuSOLVER call failing, or an eigendecomposition not
    /// converging.
    pub fn refresh_all(&self, requests: &[Vec<Refresh>]) -> Result<Vec<Vec<Refreshed>>, OptimError> {
        let flat: Vec<&Refresh> = requests.iter().flatten().collect();
        let mut done: Vec<Option<Refreshed>> = flat.iter().map(|_| None).collect();
        // first bases: on the host, as the CPU reference computes them
        let first: Vec<usize> = (0..flat.len()).filter(|&i| flat[i].q.is_none()).collect();
        let bases = refresh_all(&first.iter().map(|&i| vec![flat[i].clone()]).collect::<Vec<_>>())?;
        for (&i, mut b) in first.iter().zip(bases) {
            done[i] = b.pop();
        }
        // power steps: A Q and the estimates q_j . (A Q)_j queued for all, one copy down
        let mut steps = vec![];
        for (i, r) in flat.iter().enumerate() {
            if let Some(q) = &r.q {
                let a = ((&r.a + r.a.t()?)? * 0.5)?;
                let aq = a.matmul(q)?;
                let est = (q.to_dtype(DType::F64)? * aq.to_dtype(DType::F64)?)?.sum(0)?;
                steps.push((i, aq, est));
            }
        }
        if !steps.is_empty() {
            let est = Tensor::cat(&steps.iter().map(|s| s.2.clone()).collect::<Vec<_>>(), 0)?.to_vec1::<f64>()?;
            // the columns sorted; row-major Pᵀ is column-major P, the layout cuSOLVER takes and gives
            let mut at = 0;
            let mut sorted = vec![];
            for (i, aq, _) in steps {
                let n = flat[i].n;
                let order = basis::order(&est[at..at + n]);
                at += n;
                let idx = Tensor::from_vec(order.iter().map(|&j| j as u32).collect::<Vec<_>>(), n, aq.device())?;
                sorted.push((i, aq.index_select(&idx, 1)?.t()?.contiguous()?, order));
            }
            let mut ws = Workspace::new(self, &sorted.iter().map(|(i, p, _)| (flat[*i].n, p)).collect::<Vec<_>>())?;
            for (k, (i, p, order)) in sorted.into_iter().enumerate() {
                self.q_factor(&p, flat[i].n, &mut ws, k)?;
                done[i] = Some((p.t()?.contiguous()?, order));
            }
            ws.check()?;
        }
        let mut done = done.into_iter();
        Ok(requests.iter().map(|rs| rs.iter().map(|_| done.next().flatten().expect("every request done")).collect()).collect())
    }

    /// Overwrite the column-major `n x n` matrix `p` (a contiguous F32 tensor) with the Q factor
    /// of its QR decomposition; its two cuSOLVER status words go to `ws.info[2k..2k + 2]`.
    fn q_factor(&self, p: &Tensor, n: usize, ws: &mut Workspace, k: usize) -> Result<(), OptimError> {
        let s = &self.stream;
        let a = element_address(p, s, "SOAP power step")? as *mut f32;
        let (tau, _t) = ws.tau.device_ptr_mut(s);
        let (work, _w) = ws.work.device_ptr_mut(s);
        let (info, _i) = ws.info.device_ptr_mut(s);
        let (n, lwork) = (n as i32, ws.lwork);
        let info = info + (8 * k) as u64;
        // SAFETY: a is n x n F32 on this stream's device, tau holds >= n, lwork >= both calls'
        // queries for this n (Workspace::new), info two ints at 2k.
        unsafe {
            sys::cusolverDnSgeqrf(self.solver.cu(), n, n, a, n, tau as *mut f32, work as *mut f32, lwork, info as *mut i32)
                .result()
                .map_err(|e| solver_err("cusolverDnSgeqrf", e))?;
            sys::cusolverDnSorgqr(self.solver.cu(), n, n, n, a, n, tau as *const f32, work as *mut f32, lwork, (info + 4) as *mut i32)
                .result()
                .map_err(|e| solver_err("cusolverDnSorgqr", e))?;
        }
        Ok(())
    }
}

/// cuSOLVER's scratch for one refresh: the Householder scalars, the work area (the largest of
/// the two calls' queries over the refresh's matrix sizes) and a status word per call.
struct Workspace {
    tau: CudaSlice<f32>,
    work: CudaSlice<f32>,
    lwork: i32,
    info: CudaSlice<i32>,
    stream: Arc<CudaStream>,
}

impl Workspace {
    /// Scratch for the QR decompositions of `matrices` (`n` and the column-major `n x n` F32
    /// tensor), queried once per distinct size on a matrix of that size.
    fn new(r: &QrRefresh, matrices: &[(usize, &Tensor)]) -> Result<Self, OptimError> {
        let s = &r.stream;
        let largest = matrices.iter().map(|m| m.0).max().unwrap_or(1);
        let mut tau = s.alloc_zeros::<f32>(largest).map_err(err)?;
        let mut lwork = 1i32;
        let mut seen = std::collections::BTreeSet::new();
        for &(n, p) in matrices.iter().filter(|m| seen.insert(m.0)) {
            let a = element_address(p, s, "SOAP power step")?;
            let (t, _t) = tau.device_ptr_mut(s);
            let (ni, mut geqrf, mut orgqr) = (n as i32, 0i32, 0i32);
            // SAFETY: size queries on an n x n F32 matrix and n scalars of this device.
            unsafe {
                sys::cusolverDnSgeqrf_bufferSize(r.solver.cu(), ni, ni, a as *mut f32, ni, &mut geqrf)
                    .result()
                    .map_err(|e| solver_err("cusolverDnSgeqrf_bufferSize", e))?;
                sys::cusolverDnSorgqr_bufferSize(r.solver.cu(), ni, ni, ni, a as *const f32, ni, t as *const f32, &mut orgqr)
                    .result()
                    .map_err(|e| solver_err("cusolverDnSorgqr_bufferSize", e))?;
            }
            lwork = lwork.max(geqrf).max(orgqr);
        }
        let work = s.alloc_zeros::<f32>(lwork as usize).map_err(err)?;
        let info = s.alloc_zeros::<i32>(2 * matrices.len()).map_err(err)?;
        Ok(Workspace { tau, work, lwork, info, stream: s.clone() })
    }

    /// Every call's status word zero (a negative one names a wrong argument).
    fn check(&self) -> Result<(), OptimError> {
        let info = self.stream.clone_dtoh(&self.info).map_err(err)?;
        match info.iter().position(|&x| x != 0) {
            None => Ok(()),
            Some(k) => Err(solver_err(if k % 2 == 0 { "cusolverDnSgeqrf" } else { "cusolverDnSorgqr" }, format!("info {}", info[k]))),
        }
    }
}
