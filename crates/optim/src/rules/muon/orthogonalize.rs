//! Muon's orthogonalisation: the quintic Newton-Schulz iteration of the reference code
//! (Jordan et al. 2024, github.com/KellerJordan/Muon, `zeropower_via_newtonschulz5`), over
//! candle tensors, so that the CPU reference and the CUDA path run the same operations (on the
//! CPU, and as cuBLAS products on the GPU).
//!
//! For a matrix G (`rows x cols`), with X = G / (‖G‖_F + 1e-7) (transposed first when
//! `rows > cols`, so that X Xᵀ is the smaller Gram matrix), each step is
//! ```text
//! A = X Xᵀ ;  B = b A + c A A ;  X = a X + B X        (a, b, c) = (3.4445, -4.7750, 2.0315)
//! ```
//! which drives every singular value of X towards ~1 (to within [0.7, 1.2] after 5 steps for
//! the spectra of gradients; the reference's coefficients trade exactness for speed), i.e. X ~
//! U Vᵀ of G = U S Vᵀ. lowbit computes in FP32 (the reference in BF16, for speed: a departure
//! that can only make the polar factor more exact).

use candle_core::{DType, Result, Tensor};

/// The reference's quintic coefficients (a, b, c).
pub const NS_COEFFICIENTS: (f64, f64, f64) = (3.4445, -4.7750, 2.0315);

/// The Frobenius norm's guard against an all-zero matrix (the reference's 1e-7).
pub const NS_EPS: f64 = 1e-7;

/// The Newton-Schulz orthogonalisation of each matrix of `x` (F32 `[batch, rows, cols]`):
/// `steps` iterations, returned with `x`'s shape (F32, contiguous).
///
/// # Errors
/// `x` not F32 of rank 3, or a tensor operation failing.
pub fn newton_schulz(x: &Tensor, steps: usize) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        candle_core::bail!("newton_schulz: F32 matrices, got {:?}", x.dtype());
    }
    let (_, rows, cols) = x.dims3()?;
    let tall = rows > cols;
    let x = if tall { x.transpose(1, 2)?.contiguous()? } else { x.contiguous()? };
    let norm = (x.sqr()?.sum_keepdim((1, 2))?.sqrt()? + NS_EPS)?;
    let mut x = x.broadcast_div(&norm)?;
    let (a, b, c) = NS_COEFFICIENTS;
    for _ in 0..steps {
        let gram = x.matmul(&x.transpose(1, 2)?.contiguous()?)?;
        let poly = ((&gram * b)? + (gram.matmul(&gram)? * c)?)?;
        x = ((&x * a)? + poly.matmul(&x)?)?;
    }
    if tall {
        x.transpose(1, 2)?.contiguous()
    } else {
        Ok(x)
    }
}

/// The orthogonalised updates of several matrices (`updates[i]`: F32 `[rows_i, cols_i]`), those
/// of one shape stacked into one batch ([`newton_schulz`] of `steps`), in the order given.
///
/// # Errors
/// An update not F32 of rank 2, or a tensor operation failing.
pub fn orthogonalize_all(updates: &[Tensor], steps: usize) -> Result<Vec<Tensor>> {
    let mut shapes: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for (i, u) in updates.iter().enumerate() {
        let shape = u.dims2()?;
        match shapes.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, ids)) => ids.push(i),
            None => shapes.push((shape, vec![i])),
        }
    }
    let mut out: Vec<Option<Tensor>> = vec![None; updates.len()];
    for (_, ids) in shapes {
        let batch = Tensor::stack(&ids.iter().map(|&i| &updates[i]).collect::<Vec<_>>(), 0)?;
        let o = newton_schulz(&batch, steps)?;
        for (k, &i) in ids.iter().enumerate() {
            out[i] = Some(o.get(k)?);
        }
    }
    Ok(out.into_iter().map(|o| o.expect("every update is in one shape's batch")).collect())
}
