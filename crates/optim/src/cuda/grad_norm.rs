//! The square of the global gradient norm on a CUDA device (`kernels/optim/grad_norm.cu`):
//! Σ g² over every gradient tensor, in FP64, in two kernel passes per step instead of
//! candle's five kernels and an FP32 copy per tensor; the same bits run to run. With the
//! step's clip ([`clip_on_device`]) the second pass also decides the clip factor and the skip
//! ([`crate::rules::clip`]), which the AdamW kernels read from device memory.

use crate::cuda::abi::{NORM_ARGS_BYTES, NORM_CHUNK, NORM_TENSORS, NORM_THREADS};
use crate::cuda::adamw::{err, launch_failed};
use crate::rules::clip::GradScale;
use candle_core::cuda::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::DeviceId;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Result, Storage, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const NORM_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/grad_norm.fatbin"));

/// `struct NormArgs` of `kernels/optim/grad_norm.cu`, passed by value (6.0 KiB).
#[repr(C)]
#[derive(Clone, Copy)]
struct NormArgs {
    ptr: [u64; NORM_TENSORS],
    len: [u64; NORM_TENSORS],
    first_chunk: [u64; NORM_TENSORS + 1],
    count: u64,
}
// SAFETY: plain `#[repr(C)]` u64 arrays, passed by value as grad_norm.cu's `NormArgs`
unsafe impl DeviceRepr for NormArgs {}
const _: () = assert!(std::mem::size_of::<NormArgs>() == NORM_ARGS_BYTES);

/// The kernels `sum_squares_f32`, `sum_squares_bf16`, `sum_partials` on `dev` (loaded once).
fn kernels(dev: &CudaDevice) -> Result<[CudaFunction; 3]> {
    static CACHE: OnceLock<Mutex<HashMap<DeviceId, [CudaFunction; 3]>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().expect("norm kernel cache");
    if let Some(k) = cache.get(&dev.id()) {
        return Ok(k.clone());
    }
    let module = dev.cuda_stream().context().load_module(Ptx::from_binary(NORM_BIN.to_vec())).map_err(err)?;
    let f = |name: &str| module.load_function(name).map_err(err);
    let k = [f("sum_squares_f32")?, f("sum_squares_bf16")?, f("sum_partials")?];
    cache.insert(dev.id(), k.clone());
    Ok(k)
}

/// Σ g² over `grads` (contiguous F32 or BF16 tensors on one CUDA device, any shapes), each
/// square and every sum in FP64, read to the host (the one wait of the call). The sum runs
/// in a fixed order: per dtype (F32 first), the tensors in order in chunks of 65,536
/// elements, one fixed-order tree per chunk and one over the chunks. Errors: a tensor on
/// another device kind, not contiguous, or of another dtype.
pub fn sum_of_squares(grads: &[Tensor]) -> Result<f64> {
    let (out, stream) = queue(grads, None)?;
    Ok(stream.clone_dtoh(&out).map_err(err)?[0])
}

/// A step's clip queued on the device ([`clip_on_device`]): the gate the optimizer reads
/// ([`DeviceClip::scale`]) and what the step reports ([`DeviceClip::read`]).
pub struct DeviceClip {
    /// `[Σ g², loss, skip]` (FP64; skip: a copy of the gate's flag).
    report: CudaSlice<f64>,
    /// `[factor, skip]` (F32 `[2]`).
    gate: Tensor,
    stream: Arc<CudaStream>,
}

impl DeviceClip {
    /// The gate for [`crate::Optimizer::step`]: it steps with the clip factor, or not at all.
    pub fn scale(&self) -> GradScale<'_> {
        GradScale::Device(&self.gate)
    }

    /// `(loss, Σ g², skipped)` on the host, `skipped` the device's own decision (what the
    /// optimizer's kernels did, a copy of the gate's flag): one device-to-host copy, which
    /// waits for everything queued on the stream before it (the optimizer's step included).
    pub fn read(&self) -> Result<(f32, f64, bool)> {
        let r = self.stream.clone_dtoh(&self.report).map_err(err)?;
        Ok((r[1] as f32, r[0], r[2] != 0.0))
    }
}

/// Queues Σ g² over `grads` (as [`sum_of_squares`]) and the step's clip on the device: the
/// rule of [`crate::rules::clip::clip_factor`] with [`crate::rules::clip::norm_of`] (the same IEEE
/// operations: FP64 square root rounded to FP32, FP32 division) for the loss `loss` (an F32
/// scalar on the same device) and the threshold `max_norm` (0: no clipping). Nothing is read
/// back: the optimizer's kernels read the gate when they run. Errors: those of
/// [`sum_of_squares`], a loss that is not one F32 element on the gradients' device.
pub fn clip_on_device(grads: &[Tensor], loss: &Tensor, max_norm: f32) -> Result<DeviceClip> {
    let Some(first) = grads.first() else { candle_core::bail!("clip_on_device: no gradients") };
    if loss.dtype() != DType::F32 || loss.elem_count() != 1 || !loss.device().same_device(first.device()) {
        candle_core::bail!(
            "clip_on_device: the loss must be one F32 element on the gradients' device, not {:?} {:?}",
            loss.dtype(),
            loss.shape()
        );
    }
    let candle_core::Device::Cuda(dev) = first.device() else { candle_core::bail!("clip_on_device: not on a CUDA device") };
    let stream = dev.cuda_stream();
    let loss_ptr = crate::cuda::adamw::element_address(loss, &stream, "clip_on_device: the loss")?;
    // SAFETY: two f32s that the last pass writes before the update reads them
    let gate = unsafe { stream.alloc::<f32>(2) }.map_err(err)?;
    let gate_ptr = gate.device_ptr(&stream).0;
    let (report, stream) = queue(grads, Some((loss_ptr, max_norm, gate_ptr)))?;
    let gate = Tensor::from_storage(Storage::Cuda(CudaStorage::wrap_cuda_slice(gate, dev.clone())), 2, BackpropOp::none(), false);
    Ok(DeviceClip { report, gate, stream })
}

/// Queues the two passes of Σ g² over `grads` into a new `[Σ g², loss, skip]` buffer; with
/// `clip` = (loss address, max_norm, gate address) the last pass also writes the loss, the
/// gate and the gate's skip flag (else only Σ g² is written). No buffer is zero-filled: every
/// partial sum is written by the first pass.
fn queue(grads: &[Tensor], clip: Option<(u64, f32, u64)>) -> Result<(CudaSlice<f64>, Arc<CudaStream>)> {
    let Some(first) = grads.first() else { candle_core::bail!("sum_of_squares: no gradients") };
    let candle_core::Device::Cuda(dev) = first.device() else { candle_core::bail!("sum_of_squares: not on a CUDA device") };
    let stream = dev.cuda_stream();
    let [f32_squares, bf16_squares, partials] = kernels(dev)?;
    // (address, length) per tensor, grouped by dtype
    let mut groups: [(DType, Vec<(u64, u64)>); 2] = [(DType::F32, vec![]), (DType::BF16, vec![])];
    for (i, g) in grads.iter().enumerate() {
        let what = format!("sum_of_squares: gradient {i}");
        let addr = crate::cuda::adamw::element_address(g, &stream, &what)?;
        let group = groups.iter_mut().find(|(d, _)| *d == g.dtype()).expect("element_address takes F32 or BF16 only");
        group.1.push((addr, g.elem_count() as u64));
    }
    let chunks: usize = grads.iter().map(|g| g.elem_count().div_ceil(NORM_CHUNK)).sum();
    // SAFETY: f64 buffers; the first pass writes partial[0..written), the last reads only that
    let partial = unsafe { stream.alloc::<f64>(chunks.max(1)) }.map_err(err)?;
    let partial_ptr = partial.device_ptr(&stream).0;
    let mut written = 0u64;
    for (dtype, tensors) in &groups {
        let f = if *dtype == DType::F32 { &f32_squares } else { &bf16_squares };
        for group in tensors.chunks(NORM_TENSORS) {
            let mut args =
                NormArgs { ptr: [0; NORM_TENSORS], len: [0; NORM_TENSORS], first_chunk: [0; NORM_TENSORS + 1], count: group.len() as u64 };
            let mut at = 0u64;
            for (i, &(p, n)) in group.iter().enumerate() {
                (args.ptr[i], args.len[i], args.first_chunk[i]) = (p, n, at);
                at += n.div_ceil(NORM_CHUNK as u64);
            }
            args.first_chunk[group.len()] = at;
            if at == 0 {
                continue;
            }
            let cfg = LaunchConfig { grid_dim: (at as u32, 1, 1), block_dim: (NORM_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = stream.launch_builder(f);
            b.arg(&args).arg(&partial_ptr).arg(&written);
            let name = if *dtype == DType::F32 { "sum_squares_f32" } else { "sum_squares_bf16" };
            // SAFETY: `args` is grad_norm.cu's `NormArgs` (size asserted above) over live gradient
            // buffers of their lengths; `partial` holds every chunk from `written` on
            unsafe { b.launch(cfg) }.map_err(launch_failed(name, cfg))?;
            written += at;
        }
    }
    // SAFETY: f64 buffer; the last pass writes out[0], and out[1..3] with a clip (read only then)
    let out = unsafe { stream.alloc::<f64>(3) }.map_err(err)?;
    let out_ptr = out.device_ptr(&stream).0;
    let (loss_ptr, max_norm, gate_ptr) = clip.unwrap_or((0, 0.0, 0));
    let mut b = stream.launch_builder(&partials);
    b.arg(&partial_ptr).arg(&written).arg(&out_ptr).arg(&loss_ptr).arg(&max_norm).arg(&gate_ptr);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (NORM_THREADS, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: `partial` holds `written` f64s, `out` 3, the loss and the gate (with a clip) are
    // live device buffers of this stream
    unsafe { b.launch(cfg) }.map_err(launch_failed("sum_partials", cfg))?;
    Ok((out, stream))
}
