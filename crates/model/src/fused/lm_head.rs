//! The LM head and the cross-entropy as one op, in chunks of rows (reference:
//! [`crate::loss::masked_cross_entropy`] of [`crate::mlp::linear`]'s logits): the logits
//! exist only for [`LM_HEAD_CHUNK_ROWS`] rows at a time, in the model's dtype, with the vocabulary
//! padded to a multiple of 8 with zero rows of the head (see `fused::aligned`). For
//! training the gradients come from each chunk's logits while they exist (as Liger-Kernel's
//! fused linear cross-entropy and llm.c do): three matrix products per chunk in all.

use super::{aligned, alloc, args, cuda_device, launch, tensor_ptr, wrap, zero_padded, Gemm, BLOCK_THREADS};
use crate::fused_sizes::{ce_stage_limit, ce_staged_bytes, row_chunks};
use crate::kernels::LM_HEAD_CHUNK_ROWS;
use candle_core::cuda::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as SMEM_OPTIN;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CudaDevice, CudaStorage, DType, Result, Tensor};

/// Checks the shapes and dtypes of `hidden` `[N, H]`, the head `w` `[V, H]` (`V >= 1`),
/// `target` u32 `[N]` and `weight` F32 `[N]`.
fn check(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor) -> Result<()> {
    let (n, h) = hidden.dims2()?;
    let (wv, wh) = w.dims2()?;
    if wv == 0
        || wh != h
        || w.dtype() != hidden.dtype()
        || target.dims1()? != n
        || weight.dims1()? != n
        || target.dtype() != DType::U32
        || weight.dtype() != DType::F32
    {
        candle_core::bail!(
            "fused lm_head: hidden {:?}, w {:?}, target {:?} {:?}, weight {:?} {:?}",
            hidden.shape(),
            w.shape(),
            target.shape(),
            target.dtype(),
            weight.shape(),
            weight.dtype()
        );
    }
    Ok(())
}

/// Launches `cross_entropy_fwd`, `cross_entropy_bwd` or `cross_entropy_bwd_staged` (`name`),
/// one block per row of `rows` rows of row stride `ld` elements, with `smem` bytes of dynamic
/// shared memory: 8 elements per access where the rows and the buffers `ptrs` are 16-byte
/// aligned, else one.
fn launch_rows(
    dev: &CudaDevice,
    name: &str,
    dtype: DType,
    (rows, ld, smem): (usize, usize, usize),
    ptrs: &[u64],
    a: &[super::Arg],
) -> Result<()> {
    let per_access = if (ld * dtype.size_in_bytes()).is_multiple_of(16) && super::aligned16(ptrs) { 8 } else { 1 };
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (BLOCK_THREADS, 1, 1), shared_mem_bytes: smem as u32 };
    launch(dev, &format!("{name}{per_access}"), dtype, cfg, a)
}

/// Weighted negative log-likelihood of `hidden · wᵀ`, summed over rows:
/// `Σ_r weight_r · (logsumexp(l_r) − l_r[target_r])` with `l_r = hidden_r · wᵀ` (rows with
/// `weight_r = 0` add 0), as `crate::loss::masked_cross_entropy` of `linear(hidden, w)` with
/// `weight = mask / Σ mask`, but without the logits of the whole batch.
///
/// `hidden`: `[N, H]` BF16 or F32, contiguous; `w`: `[V, H]` (nn.Linear layout), same dtype;
/// `target`: u32 `[N]` (`< V`, not checked on the device); `weight`: F32 `[N]` → F32
/// scalar, summed in a fixed order. Logits are rounded to the model's dtype (as the
/// unfused head's output), the softmax is FP32.
pub fn loss(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Tensor> {
    check(hidden, w, target, weight)?;
    let (dev, dtype) = (cuda_device(hidden)?, hidden.dtype());
    let ((n, h), (v, _)) = (hidden.dims2()?, w.dims2()?);
    let (hp, wp) = (tensor_ptr(hidden, "hidden")?, tensor_ptr(w, "lm_head")?);
    let chunks = Chunks::new(&dev, dtype, hp, wp, tensor_ptr(target, "target")?, tensor_ptr(weight, "weight")?, (n, h, v))?;
    let (_nll, nll) = alloc(&dev, DType::F32, n)?;
    chunks.run(nll, None, None)?;
    Ok(wrap(ordered_sum(&dev, nll, n)?, ()))
}

/// [`loss`] times `scale` (F32 scalar) and its gradients with respect to `hidden` (in its
/// dtype) and `w` (F32, summed over the chunks: the training pass rounds it to the weight's
/// dtype or adds it to a running sum), for the training pass (`crate::passes`). `scale`
/// enters the rows' loss coefficients, so the gradients come out of the chunks' products
/// scaled. The loss gradient keeps each row of logits in shared memory where it fits
/// ([`loss_and_grads_staging`] with `stage_rows = true`).
pub fn loss_and_grads(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor, scale: f64) -> Result<(Tensor, Tensor, Tensor)> {
    loss_and_grads_staging(hidden, w, target, weight, scale, true)
}

/// [`loss_and_grads`], choosing how the loss gradient reads the logits: with `stage_rows` each
/// row that fits the device's shared memory (up to 112 KiB, `fused_sizes::ce_staged_bytes`) is
/// read from global memory once and kept in shared memory for the gradient pass; without it
/// every row is read twice. Both give the same bits (the same elements in the same order per
/// thread); `stage_rows = false` is for that check and for timing the two kernels.
pub fn loss_and_grads_staging(
    hidden: &Tensor,
    w: &Tensor,
    target: &Tensor,
    weight: &Tensor,
    scale: f64,
    stage_rows: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    check(hidden, w, target, weight)?;
    let (dev, dtype) = (cuda_device(hidden)?, hidden.dtype());
    let ((n, h), (v, _)) = (hidden.dims2()?, w.dims2()?);
    let coef = weight.affine(scale, 0.0)?.contiguous()?;
    let (hp, wp) = (tensor_ptr(hidden, "hidden")?, tensor_ptr(w, "lm_head")?);
    let chunks = Chunks::new(&dev, dtype, hp, wp, tensor_ptr(target, "target")?, tensor_ptr(&coef, "coef")?, (n, h, v))?;
    let (_nll, nll) = alloc(&dev, DType::F32, n)?;
    let ((dh_s, dh), (dw_s, dw)) = (alloc(&dev, dtype, n * h)?, alloc(&dev, DType::F32, chunks.av * h)?);
    let staged = if stage_rows { staged_row_bytes(&dev, v, dtype)? } else { None };
    chunks.run(nll, Some((dh, dw)), staged)?;
    let dw = wrap(dw_s, (chunks.av, h)).narrow(0, 0, v)?;
    Ok((wrap(ordered_sum(&dev, nll, n)?, ()), wrap(dh_s, (n, h)), dw))
}

/// The shared memory (bytes) in which [`loss_and_grads`] keeps each row of `v` logits of
/// `dtype` on `dev`, or `None` where a row does not fit (every row is then read twice): the
/// row's size up to 112 KiB, less where the device's blocks may opt in to less
/// (`fused_sizes::ce_stage_limit`).
///
/// # Errors
/// The driver's, reading the device's shared memory per block.
pub fn staged_row_bytes(dev: &CudaDevice, v: usize, dtype: DType) -> Result<Option<usize>> {
    let optin = dev.cuda_stream().context().attribute(SMEM_OPTIN).map_err(|e| super::err(format!("fused lm_head: {e}")))?;
    Ok(ce_staged_bytes(v, dtype.size_in_bytes(), ce_stage_limit(optin as usize)))
}

/// The padded head and the chunk loop of both passes.
struct Chunks {
    dev: CudaDevice,
    dtype: DType,
    /// The zero-padded head's buffer (kept alive while the chunks run).
    _w_buf: CudaStorage,
    /// `hidden`, the zero-padded head `[av, h]`, targets, per-row coefficients (device addresses).
    hidden: u64,
    w_pad: u64,
    target: u64,
    coef: u64,
    n: usize,
    h: usize,
    v: usize,
    av: usize,
}

impl Chunks {
    /// The chunks of `hidden` `[n, h]` against the head `w` `[v, h]` (device addresses,
    /// `dtype`), zero-padded here to `aligned(v)` rows, with the rows' targets and loss
    /// coefficients (F32) at `target` and `coef`.
    fn new(
        dev: &CudaDevice,
        dtype: DType,
        hidden: u64,
        w: u64,
        target: u64,
        coef: u64,
        (n, h, v): (usize, usize, usize),
    ) -> Result<Chunks> {
        let av = aligned(v);
        let (_w_buf, w_pad) = zero_padded(dev, dtype, w, (v, h), (av, h))?;
        Ok(Chunks { dev: dev.clone(), dtype, _w_buf, hidden, w_pad, target, coef, n, h, v, av })
    }

    /// For each chunk of rows: the logits, then the rows' weighted NLL into `nll` (F32
    /// `[N]`), and with `grads` the logits' gradient (`coef_r · (softmax − onehot)`, in place,
    /// from a copy of the row in shared memory of `staged` bytes where that is given: the same bits)
    /// and from it `dh[rows] = dlogits · w_pad` and `dw += dlogitsᵀ · hidden[rows]`
    /// (`dh` in the model's dtype, `dw` F32 `[av, h]`).
    fn run(&self, nll: u64, grads: Option<(u64, u64)>, staged: Option<usize>) -> Result<()> {
        let (dev, dtype, (n, h, av)) = (&self.dev, self.dtype, (self.n, self.h, self.av));
        let (_buf, logits) = alloc(dev, dtype, LM_HEAD_CHUNK_ROWS.min(n) * av)?;
        let (vi, ld, elt) = (self.v as i32, av as i32, dtype.size_in_bytes());
        for (r0, rows) in row_chunks(n, LM_HEAD_CHUNK_ROWS) {
            let hid = self.hidden + (r0 * h * elt) as u64;
            Gemm { m: rows, n: av, k: h, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
                .run(dev, dtype, dtype, hid, self.w_pad, logits, false)?;
            let (off, nll_r) = ((r0 * 4) as u64, nll + (r0 * 4) as u64);
            let Some((dh, dw)) = grads else {
                launch_rows(
                    dev,
                    "cross_entropy_fwd",
                    dtype,
                    (rows, av, 0),
                    &[logits],
                    &args![logits, self.target + off, self.coef + off, nll_r, vi, ld],
                )?;
                continue;
            };
            // the padding columns of dlogits become 0
            let (name, smem) = match staged {
                Some(bytes) => ("cross_entropy_bwd_staged", bytes),
                None => ("cross_entropy_bwd", 0),
            };
            launch_rows(
                dev,
                name,
                dtype,
                (rows, av, smem),
                &[logits],
                &args![logits, self.target + off, self.coef + off, logits, nll_r, vi, ld],
            )?;
            Gemm { m: rows, n: h, k: av, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }.run(
                dev,
                dtype,
                dtype,
                logits,
                self.w_pad,
                dh + (r0 * h * elt) as u64,
                false,
            )?;
            Gemm { m: av, n: h, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }.run(
                dev,
                dtype,
                DType::F32,
                logits,
                hid,
                dw,
                r0 > 0,
            )?;
        }
        Ok(())
    }
}

/// The sum of `n` F32 values at `x` in a fixed order (one block), as a new F32 scalar buffer.
fn ordered_sum(dev: &CudaDevice, x: u64, n: usize) -> Result<CudaStorage> {
    let (out, sum) = alloc(dev, DType::F32, 1)?;
    launch(dev, "ordered_sum", DType::F32, super::grid(1, 0), &args![x, sum, n as i32])?;
    Ok(out)
}
