//! The fused ops' matrix products as cuBLAS calls: a row-major product is a column-major one
//! with the operands swapped (Cᵀ = op(B)ᵀ · op(A)ᵀ), and this module says which operand goes
//! in which slot, transposed or not, with which leading dimensions and batch strides. Host
//! logic only, compiled in every build, so CPU tests check it against a column-major
//! reference product (the semantics of `cublasGemmStridedBatchedEx`, cuBLAS Library User
//! Guide, "cublasGemmStridedBatchedEx"); `fused::Gemm::run` hands it to cuBLAS.

/// One row-major strided-batched matrix product `C[m, n] = op(A)[m, k] · op(B)[k, n]` per
/// batch entry, with `op(A) = Aᵀ` when `a_t` (A stored `[k, m]`) and likewise for B
/// (stored `[n, k]` when `b_t`); dense rows; strides between batch entries in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a_t: bool,
    pub(crate) b_t: bool,
    pub(crate) batch: usize,
    pub(crate) stride_a: usize,
    pub(crate) stride_b: usize,
    pub(crate) stride_c: usize,
}

/// The arguments of one column-major strided-batched call `C = op(X) · op(Y)`, `C`
/// `[m, n]` column-major with leading dimension `ldc`: slot X holds the row-major product's
/// B and slot Y its A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColumnMajor {
    pub(crate) trans_x: bool,
    pub(crate) trans_y: bool,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) ld_x: usize,
    pub(crate) stride_x: usize,
    pub(crate) ld_y: usize,
    pub(crate) stride_y: usize,
    pub(crate) ldc: usize,
    pub(crate) stride_c: usize,
    pub(crate) batch: usize,
}

/// Outputs (`m · n · batch` elements) below which a BF16 product may use cuBLAS's
/// workspace, so split-K kernels, which need it: their tiles alone would leave SMs idle
/// (LLaMA-100M's weight gradients, `[640, 640]` over K = 32,768 tokens). Larger BF16
/// products run without a workspace: cuBLAS then takes statically scheduled tensor-core
/// kernels of the same speed (`..._ssched_...`) instead of the ones that need a zeroed
/// semaphore, each of which costs a 4-byte memset and two launch gaps. FP32 products keep
/// the workspace (their SGEMM kernels need it). The measurements:
/// bench/training_h200.md, "Measurements behind choices in the code".
pub(crate) const WORKSPACE_MAX_OUTPUT: usize = 1 << 19;

/// Bytes of the cuBLAS workspace the products that may use one get (32 MiB: the cuBLAS
/// Library User Guide's recommendation for Hopper, `cublasSetWorkspace`).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

impl Gemm {
    /// Whether this product, of `bf16` (else FP32) operands, gets cuBLAS's workspace
    /// ([`WORKSPACE_MAX_OUTPUT`]).
    pub(crate) fn uses_workspace(&self, bf16: bool) -> bool {
        !bf16 || self.m * self.n * self.batch < WORKSPACE_MAX_OUTPUT
    }

    /// The column-major call that computes this row-major product.
    pub(crate) fn column_major(&self) -> ColumnMajor {
        ColumnMajor {
            trans_x: self.b_t,
            trans_y: self.a_t,
            m: self.n,
            n: self.m,
            k: self.k,
            ld_x: if self.b_t { self.k } else { self.n },
            stride_x: self.stride_b,
            ld_y: if self.a_t { self.m } else { self.k },
            stride_y: self.stride_a,
            ldc: self.n,
            stride_c: self.stride_c,
            batch: self.batch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cublasGemmStridedBatchedEx`'s product in FP64 on the host: for each batch entry,
    /// `C[i, j] (+)= Σ_p op(X)[i, p] op(Y)[p, j]`, every matrix column-major.
    fn column_major_reference(call: &ColumnMajor, x: &[f64], y: &[f64], c: &mut [f64], accumulate: bool) {
        for e in 0..call.batch {
            let (ox, oy, oc) = (e * call.stride_x, e * call.stride_y, e * call.stride_c);
            for j in 0..call.n {
                for i in 0..call.m {
                    let mut s = 0.0;
                    for p in 0..call.k {
                        let xv = if call.trans_x { x[ox + p + i * call.ld_x] } else { x[ox + i + p * call.ld_x] };
                        let yv = if call.trans_y { y[oy + j + p * call.ld_y] } else { y[oy + p + j * call.ld_y] };
                        s += xv * yv;
                    }
                    let dst = &mut c[oc + i + j * call.ldc];
                    *dst = if accumulate { *dst + s } else { s };
                }
            }
        }
    }

    /// Distinct values for every element, so a wrong index cannot go unnoticed.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        (0..n).map(|i| ((i as u64 * 2654435761 + seed * 97) % 1009) as f64 / 101.0 - 5.0).collect()
    }

    #[test]
    fn column_major_call_computes_the_row_major_product() {
        let (m, n, k, batch) = (3, 5, 4, 3);
        for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
            // Batch strides larger than a matrix: the gaps must not be read.
            let (stride_a, stride_b, stride_c) = (m * k + 7, k * n + 3, m * n + 5);
            let a = values(batch * stride_a, 1);
            let b = values(batch * stride_b, 2);
            let g = Gemm { m, n, k, a_t, b_t, batch, stride_a, stride_b, stride_c };
            for accumulate in [false, true] {
                let c0 = values(batch * stride_c, 3);
                let mut c = c0.clone();
                column_major_reference(&g.column_major(), &b, &a, &mut c, accumulate);
                for e in 0..batch {
                    for i in 0..m {
                        for j in 0..n {
                            let mut want = if accumulate { c0[e * stride_c + i * n + j] } else { 0.0 };
                            for p in 0..k {
                                let av = if a_t { a[e * stride_a + p * m + i] } else { a[e * stride_a + i * k + p] };
                                let bv = if b_t { b[e * stride_b + j * k + p] } else { b[e * stride_b + p * n + j] };
                                want += av * bv;
                            }
                            let got = c[e * stride_c + i * n + j];
                            assert!((got - want).abs() < 1e-9, "a_t {a_t} b_t {b_t} entry {e} C[{i},{j}]: {got} vs {want}");
                        }
                    }
                    // The gap after each C is untouched.
                    for g in m * n..stride_c {
                        assert_eq!(c[e * stride_c + g], c0[e * stride_c + g]);
                    }
                }
            }
        }
    }

    /// BF16: small outputs keep split-K (LLaMA-100M's `[640, 640]` weight gradients); the
    /// model-sized products (LLaMA-350M's `[1024, 1024]` gradients, every activation) do
    /// not. FP32 products always keep it.
    #[test]
    fn workspace_only_for_small_bf16_outputs_and_fp32() {
        let product = |m, n, k, batch| Gemm { m, n, k, a_t: true, b_t: false, batch, stride_a: 0, stride_b: 0, stride_c: 0 };
        assert!(product(640, 640, 32768, 1).uses_workspace(true));
        assert!(product(256, 256, 32768, 1).uses_workspace(true));
        assert!(!product(1024, 1024, 16384, 1).uses_workspace(true));
        assert!(!product(32768, 1920, 640, 1).uses_workspace(true));
        assert!(!product(256, 256, 64, 1280).uses_workspace(true)); // attention scores, batched
        assert!(product(32768, 1920, 640, 1).uses_workspace(false));
        // the bound: 2^19 outputs and more run without
        assert!(product(512, 1023, 64, 1).uses_workspace(true)); // 2^19 - 512
        assert!(!product(512, 1024, 64, 1).uses_workspace(true)); // 2^19
        assert!(!product(512, 512, 64, 2).uses_workspace(true));
    }

    #[test]
    fn column_major_arguments_of_a_linear_layer() {
        // y[rows, out] = x[rows, in] · wᵀ, w stored [out, in]: cuBLAS gets w transposed in
        // slot X with leading dimension `in`, x untransposed in slot Y.
        let g = Gemm { m: 32768, n: 1920, k: 640, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 };
        let c = g.column_major();
        assert_eq!((c.trans_x, c.trans_y, c.m, c.n, c.k), (true, false, 1920, 32768, 640));
        assert_eq!((c.ld_x, c.ld_y, c.ldc), (640, 640, 1920));
    }
}
