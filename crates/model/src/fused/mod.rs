//! Fused CUDA forward and backward passes of the model's ops (`cuda` feature), each a pair of
//! plain functions over contiguous CUDA tensors, beside the composed reference it is tested
//! against (`crates/model/tests/fused_parity.rs`, on a GPU):
//!
//! | op | forward / backward | reference |
//! |---|---|---|
//! | [`embedding`] | lookup / grouped row sums (no atomics) | `index_select` |
//! | [`norm`] | RMSNorm (with the residual add) / both gradients | [`crate::norm::RmsNorm`] |
//! | [`linear`] | `x · wᵀ` / `dx` summed over layers, `dw` | [`crate::mlp::linear`] |
//! | [`rope`] | RoPE fused with the head transpose / its transpose | [`crate::rope::Rope::apply`] |
//! | [`attention`] | causal attention, no `[T, T]` kept / recomputing | [`crate::attention::Attention`] |
//! | [`mlp`] | gate and up as one product, SwiGLU / its gradients | [`crate::mlp::Mlp`] |
//! | [`lm_head`] | LM head + cross-entropy in row chunks, gradients in the same pass | [`crate::loss::masked_cross_entropy`] |
//!
//! `passes.rs` (its `explicit` module) runs them as the model's one fused path: the forward for evaluation and logits,
//! and for training the forward that keeps each op's saved inputs and the explicit backward
//! ([`crate::Llama::training_pass`]), which writes the weights' gradients as [`WeightGrad`]
//! says: new tensors, or added into FP32 sums over micro-batches by the products themselves.
//!
//! The kernels are `kernels/model/ops.cu` (which gathers one file per op family:
//! `rmsnorm.cuh`, `rope.cuh`, `heads.cuh`, `softmax.cuh`, `swiglu.cuh`, `cross_entropy.cuh`,
//! `embedding.cuh`, `copy_padded.cuh`, `ordered_sum.cuh`, over `common.cuh`),
//! `kernels/model/flash_attention.cu` (the BF16
//! attention on tensor cores, `flash`) and `kernels/model/flash_attention_f32.cu` (the FP32
//! attention on CUDA cores), compiled to fatbins at build time and launched on
//! candle's stream; the matrix products go through cuBLAS (`cublasGemmStridedBatchedEx`,
//! FP32 accumulation; TF32 for FP32 inputs when candle's `set_gemm_reduced_precision_f32`
//! is on). BF16 and FP32 tensors; every reduction runs in a fixed order, so two runs give
//! the same bits.

pub mod attention;
pub mod embedding;
mod flash;
pub mod linear;
pub mod lm_head;
pub mod mlp;
pub mod norm;
pub mod rope;

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::cublas::{result as cublas, sys as blas};
use candle_core::cuda::cudarc::driver::{CudaFunction, CudaModule, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDType, DeviceId};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};
use half::bf16;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const OPS_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ops.fatbin"));
const FLASH_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flash_attention.fatbin"));
const FLASH_F32_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flash_attention_f32.fatbin"));

/// Shared memory a block may use without opting in (bytes).
const DEFAULT_SMEM: u32 = 48 * 1024;

pub(crate) fn err(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Cuda(e.to_string().into())
}

/// A compiled kernel file of `kernels/model/`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    /// `ops.cu`: the row, elementwise and softmax kernels.
    Ops,
    /// `flash_attention.cu`: the tensor-core attention ([`flash`]).
    Flash,
    /// `flash_attention_f32.cu`: the FP32 attention on CUDA cores ([`flash`]).
    FlashF32,
}

/// Kernel `<name>_<bf16|f32>` of `module` on `dev` (each module is loaded once per device,
/// each function looked up once).
pub(crate) fn kernel(dev: &CudaDevice, module: Module, name: &str, dtype: DType) -> Result<CudaFunction> {
    type Cache = HashMap<(DeviceId, Module), (Arc<CudaModule>, HashMap<String, CudaFunction>)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let suffix = match dtype {
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        d => candle_core::bail!("fused {name}: {d:?} tensors are not supported (BF16 or F32)"),
    };
    let full = format!("{name}_{suffix}");
    let mut cache = CACHE.get_or_init(Default::default).lock().expect("kernel cache");
    let (loaded, functions) = match cache.entry((dev.id(), module)) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let bin = match module {
                Module::Ops => OPS_BIN,
                Module::Flash => FLASH_BIN,
                Module::FlashF32 => FLASH_F32_BIN,
            };
            let loaded = dev.cuda_stream().context().load_module(Ptx::from_binary(bin.to_vec())).map_err(err)?;
            e.insert((loaded, HashMap::new()))
        }
    };
    if let Some(f) = functions.get(&full) {
        return Ok(f.clone());
    }
    let f = loaded.load_function(&full).map_err(err)?;
    functions.insert(full, f.clone());
    Ok(f)
}

/// One kernel parameter: a device address or `size_t` (u64), an `int` (i32), a `float`.
pub(crate) enum Arg {
    U64(u64),
    I32(i32),
    F32(f32),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::U64(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}

/// The kernel parameters `[Arg; N]` of a [`launch`], in the kernel's order.
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::fused::Arg::from($a)),*] };
}
pub(crate) use args;

/// Launches `name` of `ops.cu` for `dtype` with `cfg` and the parameters `args` (see [`args!`]).
pub(crate) fn launch(dev: &CudaDevice, name: &str, dtype: DType, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    launch_in(dev, Module::Ops, name, dtype, cfg, args)
}

/// Launches `name` of `module` for `dtype` with `cfg` and `args`; a block that needs more
/// than 48 KiB of shared memory gets it (the function's opt-in attribute is set first).
pub(crate) fn launch_in(dev: &CudaDevice, module: Module, name: &str, dtype: DType, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    let f = kernel(dev, module, name, dtype)?;
    // a failed launch names the kernel and its geometry (the driver's error alone does not)
    let named = |e| {
        err(format!(
            "{name} ({dtype:?}), grid {:?}, block {:?}, {} B shared memory: {e}",
            cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes
        ))
    };
    if cfg.shared_mem_bytes > DEFAULT_SMEM {
        use candle_core::cuda::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
        f.set_attribute(MAX_SMEM, cfg.shared_mem_bytes as i32).map_err(named)?;
    }
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    for a in args {
        match a {
            Arg::U64(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::F32(v) => b.arg(v),
        };
    }
    // SAFETY: the caller's `args` are the kernel's parameters in order, addresses of live
    // device buffers of the sizes the kernel indexes under `cfg` (each op's launcher checks them)
    unsafe { b.launch(cfg) }.map_err(named)?;
    Ok(())
}

/// `blocks` blocks of [`BLOCK_THREADS`] threads, `smem` bytes of dynamic shared memory.
pub(crate) fn grid(blocks: usize, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK_THREADS, 1, 1), shared_mem_bytes: smem as u32 }
}

/// Whether every address in `ptrs` is 16-byte aligned: the kernels' vector accesses (8 BF16 or
/// 4 FP32 elements at a time) need it.
pub(crate) fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p % 16 == 0)
}

/// Device address of a contiguous buffer (its layout's start offset applied).
fn storage_ptr(s: &CudaStorage, l: &Layout, what: &str) -> Result<u64> {
    let Some((start, _)) = l.contiguous_offsets() else { candle_core::bail!("fused {what}: the tensor must be contiguous") };
    let stream = s.device().cuda_stream();
    let (base, size) = match s.dtype() {
        DType::BF16 => (s.as_cuda_slice::<bf16>()?.device_ptr(&stream).0, 2),
        DType::F32 => (s.as_cuda_slice::<f32>()?.device_ptr(&stream).0, 4),
        DType::U32 => (s.as_cuda_slice::<u32>()?.device_ptr(&stream).0, 4),
        d => candle_core::bail!("fused {what}: {d:?} tensors are not supported"),
    };
    Ok(base + (start * size) as u64)
}

/// Device address of a contiguous CUDA tensor.
pub(crate) fn tensor_ptr(t: &Tensor, what: &str) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cuda(s) => storage_ptr(s, layout, what),
        _ => candle_core::bail!("fused {what}: the tensor is not on a CUDA device"),
    }
}

/// Where a backward writes a weight's gradient (the fused training pass chooses:
/// [`crate::TrainingPass::backward`] or [`crate::TrainingPass::accumulate`]).
#[derive(Clone, Copy, Debug)]
pub enum WeightGrad<'a> {
    /// A new tensor in the weight's dtype.
    New,
    /// Added to an FP32 running sum (gradient accumulation over micro-batches): `None` for
    /// the first pass (a new FP32 tensor), `Some(sum)` for the next ones (the FP32 tensor an
    /// earlier `Sum` pass of the same op returned), added into in place where the op can
    /// (its matrix product accumulates into the sum: `C += A·B`), else out of place.
    Sum(Option<&'a Tensor>),
}

impl WeightGrad<'_> {
    /// The dtype the op writes the gradient in: the weight's, or F32 for a sum.
    pub(crate) fn dtype(&self, weight: DType) -> DType {
        match self {
            WeightGrad::New => weight,
            WeightGrad::Sum(_) => DType::F32,
        }
    }

    /// What the op returns for `grad`, the gradient it wrote in [`WeightGrad::dtype`] (not
    /// into the sum): itself, or the sum plus it.
    pub(crate) fn finish(&self, grad: Tensor) -> Result<Tensor> {
        match self {
            WeightGrad::Sum(Some(sum)) => *sum + grad,
            _ => Ok(grad),
        }
    }
}

/// The device address of `sum` where a product can accumulate its `n`-element output into
/// it in place: `sum` a contiguous F32 tensor of shape `dims` (the weight's: checked, so a
/// sum of another weight is never written) whose storage holds `n` elements from its start
/// (`n` may exceed the sum's own size: a view into a padded buffer an earlier pass
/// returned); `None` otherwise.
pub(crate) fn sum_buffer(sum: &Tensor, dims: &[usize], n: usize) -> Result<Option<u64>> {
    let (storage, layout) = sum.storage_and_layout();
    let (Storage::Cuda(s), Some((start, _))) = (&*storage, layout.contiguous_offsets()) else { return Ok(None) };
    if s.dtype() != DType::F32 || sum.dims() != dims || s.as_cuda_slice::<f32>()?.len() < start + n {
        return Ok(None);
    }
    Ok(Some(storage_ptr(s, layout, "gradient sum")?))
}

/// Columns `[first, first + width)` of a contiguous `[..., W]` buffer `buf`: where an op writes
/// its `[..., width]` output when several outputs share rows (the q, k and v projections'
/// gradients side by side, which one weight-gradient product then reads as one matrix).
#[derive(Clone, Copy, Debug)]
pub struct Columns<'a> {
    pub buf: &'a Tensor,
    pub first: usize,
}

impl Columns<'_> {
    /// The device address of the first column and the row stride W (elements), checked
    /// against an output of `dims` (same leading dims, the last one fitting from `first`)
    /// and `dtype`.
    pub(crate) fn target(&self, dims: &[usize], dtype: DType) -> Result<(u64, usize)> {
        let (bd, (&w, lead)) = (self.buf.dims(), self.buf.dims().split_last().unwrap_or((&0, &[])));
        let (&width, out_lead) = dims.split_last().unwrap_or((&0, &[]));
        if lead != out_lead || self.first + width > w || self.buf.dtype() != dtype {
            candle_core::bail!(
                "fused op: an output {dims:?} {dtype:?} does not fit columns {}.. of {bd:?} {:?}",
                self.first,
                self.buf.dtype()
            );
        }
        Ok((tensor_ptr(self.buf, "output columns")? + (self.first * dtype.size_in_bytes()) as u64, w))
    }
}

/// Whether two tensors are views of one storage.
pub(crate) fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    let (sa, sb) = (a.storage_and_layout().0, b.storage_and_layout().0);
    std::ptr::eq(&*sa, &*sb)
}

/// The CUDA device of a tensor.
pub(crate) fn cuda_device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        candle_core::Device::Cuda(d) => Ok(d.clone()),
        _ => candle_core::bail!("fused ops run on CUDA tensors only"),
    }
}

/// An uninitialised buffer of `n` elements (at least one) of `dtype` and its device address.
pub(crate) fn alloc(dev: &CudaDevice, dtype: DType, n: usize) -> Result<(CudaStorage, u64)> {
    fn typed<T: CudaDType + DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<(CudaStorage, u64)> {
        // SAFETY: uninitialised memory, returned to callers that write it before reading it
        let s = unsafe { dev.alloc::<T>(n)? };
        let p = s.device_ptr(&dev.cuda_stream()).0;
        Ok((CudaStorage::wrap_cuda_slice(s, dev.clone()), p))
    }
    let n = n.max(1);
    match dtype {
        DType::BF16 => typed::<bf16>(dev, n),
        DType::F32 => typed::<f32>(dev, n),
        d => candle_core::bail!("fused ops: cannot allocate {d:?}"),
    }
}

/// A tensor (no gradient tracking) over `storage` with `shape`.
pub(crate) fn wrap(storage: CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

pub(crate) use crate::gemm::Gemm;

fn cuda_type(d: DType) -> Result<blas::cudaDataType> {
    Ok(match d {
        DType::BF16 => blas::cudaDataType::CUDA_R_16BF,
        DType::F32 => blas::cudaDataType::CUDA_R_32F,
        d => candle_core::bail!("gemm: {d:?} is not supported"),
    })
}

impl Gemm {
    /// Runs the product on `dev`'s cuBLAS handle (candle's stream): A and B in `ab`, C in
    /// `c_dtype`, FP32 accumulation (TF32 for FP32 inputs when candle's reduced-precision
    /// FP32 gemm switch is on); `accumulate`: C += instead of C =.
    ///
    /// The workspace is this module's choice per product ([`Gemm::uses_workspace`]: none, or
    /// the device's 32 MiB buffer), whatever `CUBLAS_WORKSPACE_CONFIG` says; after a product
    /// without one the handle gets the buffer back, so candle's own products on the handle
    /// (the composed ops) always run with a workspace. Assumes one host thread issues the
    /// products of a device (the trainer's case): the handle and the buffer are shared.
    pub(crate) fn run(&self, dev: &CudaDevice, ab: DType, c_dtype: DType, a: u64, b: u64, c: u64, accumulate: bool) -> Result<()> {
        use blas::cublasOperation_t::{CUBLAS_OP_N as N, CUBLAS_OP_T as T};
        let compute = if ab == DType::F32 && candle_core::cuda::gemm_reduced_precision_f32() {
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        let call = self.column_major(); // slot X: B, slot Y: A
        let op = |t: bool| if t { T } else { N };
        let blas = dev.cublas_handle();
        let (buffer, bytes) = (workspace(dev)?, crate::gemm::WORKSPACE_BYTES);
        let with = self.uses_workspace(ab == DType::BF16);
        let set = |on: bool| {
            let (ptr, size) = if on { (buffer, bytes) } else { (0, 0) };
            // SAFETY: `buffer` is a live allocation of `bytes` on this handle's stream, kept for
            // the process; null with size 0 is "no workspace"
            unsafe { blas::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, size) }.result().map_err(err)
        };
        set(with)?;
        // SAFETY: a, b and c are live device buffers holding the strided batches that `call`'s
        // shapes, leading dimensions and strides describe (checked by its builder); alpha and
        // beta outlive the call
        unsafe {
            cublas::gemm_strided_batched_ex(
                *blas.handle(),
                op(call.trans_x),
                op(call.trans_y),
                call.m as i32,
                call.n as i32,
                call.k as i32,
                &alpha as *const f32 as *const _,
                b as *const _,
                cuda_type(ab)?,
                call.ld_x as i32,
                call.stride_x as i64,
                a as *const _,
                cuda_type(ab)?,
                call.ld_y as i32,
                call.stride_y as i64,
                &beta as *const f32 as *const _,
                c as *mut _,
                cuda_type(c_dtype)?,
                call.ldc as i32,
                call.stride_c as i64,
                call.batch as i32,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(err)?;
        if !with {
            set(true)?;
        }
        Ok(())
    }
}

/// The device's cuBLAS workspace for the products that use one
/// ([`crate::gemm::WORKSPACE_BYTES`], allocated once per device and kept).
fn workspace(dev: &CudaDevice) -> Result<u64> {
    static BUFFERS: OnceLock<Mutex<HashMap<DeviceId, (CudaStorage, u64)>>> = OnceLock::new();
    let mut buffers = BUFFERS.get_or_init(Default::default).lock().expect("workspace buffers");
    if let Some((_, p)) = buffers.get(&dev.id()) {
        return Ok(*p);
    }
    let (s, p) = alloc(dev, DType::F32, crate::gemm::WORKSPACE_BYTES / 4)?;
    buffers.insert(dev.id(), (s, p));
    Ok(p)
}

pub(crate) use crate::fused_sizes::{aligned, BLOCK_THREADS, ROW_WARPS};

/// Writes the `[rows_out, dst_ld]` matrix at `dst` from the `[rows, cols]` one at `src` (row
/// stride `src_ld`), zeros in the rows and columns past it (`rows <= rows_out`, `cols <=
/// dst_ld`): one launch, 16 bytes per thread where every width and both addresses allow it.
pub(crate) fn copy_padded(
    dev: &CudaDevice,
    dtype: DType,
    src: u64,
    dst: u64,
    (rows, cols, src_ld): (usize, usize, usize),
    (rows_out, dst_ld): (usize, usize),
) -> Result<()> {
    debug_assert!(
        rows <= rows_out && cols <= src_ld.min(dst_ld),
        "copy_padded: [{rows}, {cols}] (stride {src_ld}) into [{rows_out}, {dst_ld}]"
    );
    let per = 16 / dtype.size_in_bytes();
    let unit = if aligned16(&[src, dst]) && [cols, src_ld, dst_ld].iter().all(|w| w % per == 0) { per } else { 1 };
    let a = args![src, dst, rows as i32, (cols / unit) as i32, (src_ld / unit) as i32, rows_out as i32, (dst_ld / unit) as i32];
    launch(dev, &format!("copy_padded{unit}"), dtype, grid((rows_out * dst_ld / unit).div_ceil(BLOCK_THREADS as usize), 0), &a)
}

/// A `[rows, cols]` matrix copied into a `[rows_out, cols_out]` one (each at least as large)
/// whose other elements are 0: a weight padded with zero rows and columns.
pub(crate) fn zero_padded(
    dev: &CudaDevice,
    dtype: DType,
    src: u64,
    (rows, cols): (usize, usize),
    (rows_out, cols_out): (usize, usize),
) -> Result<(CudaStorage, u64)> {
    let out = alloc(dev, dtype, rows_out * cols_out)?;
    copy_padded(dev, dtype, src, out.1, (rows, cols, cols), (rows_out, cols_out))?;
    Ok(out)
}

/// The top-left `[rows, cols]` of a matrix with row stride `ld`, as a new dense tensor.
pub(crate) fn unpadded(dev: &CudaDevice, dtype: DType, src: u64, ld: usize, (rows, cols): (usize, usize)) -> Result<Tensor> {
    let (s, p) = alloc(dev, dtype, rows * cols)?;
    copy_padded(dev, dtype, src, p, (rows, cols, ld), (rows, cols))?;
    Ok(wrap(s, (rows, cols)))
}
