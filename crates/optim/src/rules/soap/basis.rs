//! SOAP's eigenbases (Vyas et al. 2024, arXiv:2409.11321, Alg. 3 and its reference code
//! `get_orthogonal_matrix` / `get_orthogonal_matrix_QR`), on the host through faer: the first
//! basis of a preconditioner is its full eigendecomposition (eigenvectors by descending
//! eigenvalue), every later one a single power step with a QR decomposition. Matrices are
//! square, `n x n`, FP32, row-major. faer runs single-threaded here (its global setting): its results
//! then do not depend on the machine's thread count (a run resumes exactly on another machine);
//! the refreshes of different preconditioners run in parallel instead
//! ([`super::step::refresh_all`]). On the GPU the refresh's QR runs there (`crate::cuda::refresh`,
//! cuSOLVER), its column order from [`order`].

use crate::error::OptimError;
use faer::{Mat, Par, Side};

/// faer single-threaded (its global setting; lowbit uses faer only here).
fn sequential() {
    faer::set_global_parallelism(Par::Seq);
}

/// The eigenvectors of the `n x n` matrix `a` (row-major) made symmetric, (a + aᵀ) / 2 (a
/// preconditioner rounded with block scales is not quite symmetric), one per column, ordered by
/// descending eigenvalue (the reference's `torch.linalg.eigh` then `flip`); computed in f64,
/// rounded once to FP32. Column signs are faer's (SOAP's update does not depend on them).
///
/// # Errors
/// [`OptimError::Runtime`] when the decomposition does not converge (a NaN or infinite entry).
pub fn eigenbasis(a: &[f32], n: usize) -> Result<Vec<f32>, OptimError> {
    assert_eq!(a.len(), n * n, "an n x n matrix");
    sequential();
    let m = Mat::<f64>::from_fn(n, n, |i, j| 0.5 * (f64::from(a[i * n + j]) + f64::from(a[j * n + i])));
    let evd = m
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| OptimError::Runtime(format!("SOAP eigenbasis of an {n} x {n} preconditioner: {e:?}")))?;
    let u = evd.U();
    // faer gives ascending eigenvalues: column j of the result is column n - 1 - j
    Ok((0..n * n).map(|k| u[(k / n, n - 1 - k % n)] as f32).collect())
}

/// A basis on the host (`n x n` row-major FP32) and its column order (`order[j]`: the old column
/// that became column `j`).
pub type HostBasis = (Vec<f32>, Vec<usize>);

/// The new basis of the `n x n` preconditioner `a` (row-major FP32): its [`eigenbasis`] when
/// there is no basis yet (`q` None; the order is the identity), else a [`refresh`] of `q`.
///
/// # Errors
/// An eigendecomposition not converging.
pub fn update(a: &[f32], q: Option<&[f32]>, n: usize) -> Result<HostBasis, OptimError> {
    match q {
        None => Ok((eigenbasis(a, n)?, (0..n).collect())),
        Some(q) => Ok(refresh(a, q, n)),
    }
}

/// The columns' order by descending eigenvalue estimate `est` (stable: ties keep their order):
/// `order[j]` is the column that goes to position `j`.
pub fn order(est: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..est.len()).collect();
    order.sort_by(|&x, &y| est[y].total_cmp(&est[x]));
    order
}

/// One refresh of the basis `q` of the preconditioner `a` (both `n x n`, row-major; `a` made
/// symmetric as in [`eigenbasis`]), as the reference's `get_orthogonal_matrix_QR`: `aq = a q`; each column's eigenvalue estimate
/// `q_j . aq_j`; the columns of `aq` sorted by it, descending (stable: ties keep their order);
/// the new basis the Q factor of that matrix's QR decomposition (Householder, FP32).
/// Returns the new basis and the order (`order[j]` = the old column that became column `j`):
/// the second moment's entries along this side move with their eigenvectors
/// ([`super::store::permute`]).
pub fn refresh(a: &[f32], q: &[f32], n: usize) -> HostBasis {
    assert!(a.len() == n * n && q.len() == n * n, "n x n matrices");
    sequential();
    let a = Mat::<f32>::from_fn(n, n, |i, j| 0.5 * (a[i * n + j] + a[j * n + i]));
    let q = Mat::<f32>::from_fn(n, n, |i, j| q[i * n + j]);
    let aq = &a * &q;
    let est: Vec<f64> = (0..n).map(|j| (0..n).map(|i| f64::from(q[(i, j)]) * f64::from(aq[(i, j)])).sum()).collect();
    let order = order(&est);
    let power = Mat::<f32>::from_fn(n, n, |i, j| aq[(i, order[j])]);
    let qn = power.qr().compute_Q();
    ((0..n * n).map(|k| qn[(k / n, k % n)]).collect(), order)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3 x 3 symmetric matrix with eigenvalues 6, 3, 1 (Q diag(6, 3, 1) Qᵀ for an orthogonal
    /// Q written down): the basis's columns are Q's, in that order, up to sign; a refresh of
    /// the exact basis keeps it (up to sign) and the order.
    #[test]
    fn eigenbasis_orders_by_descending_eigenvalue_and_a_refresh_keeps_an_exact_basis() {
        let s = 1.0 / 2f64.sqrt();
        // columns: (1,1,0)/sqrt2, (0,0,1), (1,-1,0)/sqrt2
        let q = [[s, 0.0, s], [s, 0.0, -s], [0.0, 1.0, 0.0]];
        let lam = [6.0, 3.0, 1.0];
        let a: Vec<f32> = (0..9).map(|k| (0..3).map(|c| q[k / 3][c] * lam[c] * q[k % 3][c]).sum::<f64>() as f32).collect();
        let b = eigenbasis(&a, 3).unwrap();
        for c in 0..3 {
            let dot: f64 = (0..3).map(|i| f64::from(b[i * 3 + c]) * q[i][c]).sum();
            assert!((dot.abs() - 1.0).abs() < 1e-6, "column {c}: |dot| = {}", dot.abs());
        }
        let (r, order) = refresh(&a, &b, 3);
        assert_eq!(order, vec![0, 1, 2]);
        for c in 0..3 {
            let dot: f64 = (0..3).map(|i| f64::from(r[i * 3 + c]) * q[i][c]).sum();
            assert!((dot.abs() - 1.0).abs() < 1e-5, "refreshed column {c}: |dot| = {}", dot.abs());
        }
    }

    /// A basis whose columns are out of eigenvalue order comes back sorted, and the order says
    /// which old column went where.
    #[test]
    fn refresh_sorts_columns_by_estimated_eigenvalue() {
        // diag(1, 5, 3): the identity basis has estimates 1, 5, 3 -> order 1, 2, 0
        let a = [1.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 3.0];
        let id = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        let (r, order) = refresh(&a, &id, 3);
        assert_eq!(order, vec![1, 2, 0]);
        // the new columns are e1, e2, e0 up to sign
        for (c, want) in [1usize, 2, 0].into_iter().enumerate() {
            assert!((r[want * 3 + c].abs() - 1.0).abs() < 1e-6, "{r:?}");
        }
    }
}
