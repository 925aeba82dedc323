//! Fused CUDA AdamW step (`kernels/adamw.cu`) and rounding cast (`kernels/sr_cast.cu`),
//! launched through cudarc on candle's own CUDA stream, reading and writing candle's
//! parameter and gradient buffers in place (candle `InplaceOp2`, no copies).
//!
//! Host side per step and tensor: the same [`StepScalars`] and [`StepKeys`] as the CPU
//! reference (so results are bit-identical), one kernel launch (three for per-tensor
//! scaling: amax, step, scales), stall counters added on the device into a ring of
//! [`COUNTER_RING`] step slots that the host reads when it wants (no synchronisation in
//! the step itself).

use crate::adamw::{Roundings, StepKeys, StepScalars};
use crate::format::{int8, Rounding, StateFormat};
use crate::optimizer::LowbitAdamW;
use crate::stalls::{Counter, StallCounts};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use std::sync::Arc;
use candle_core::{CudaDevice, CudaStorage, DType, InplaceOp2, Layout, Result, Tensor};

const ADAMW_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/adamw.fatbin"));
const CAST_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sr_cast.fatbin"));

/// Load `name` from a fatbin on `dev`'s context.
fn load(dev: &CudaDevice, image: &[u8], names: &[String]) -> Result<Vec<CudaFunction>> {
    let module = dev.cuda_stream().context().load_module(Ptx::from_binary(image.to_vec())).map_err(err)?;
    names.iter().map(|n| module.load_function(n).map_err(err)).collect()
}

/// The kernels of one (m format, v format) pair, loaded once.
struct Kernels {
    step_f32: CudaFunction,
    step_bf16: CudaFunction,
    amax: CudaFunction,
    set_scales: CudaFunction,
}

/// Steps of stall counters kept on the device before a slot is reused.
pub const COUNTER_RING: usize = 64;

/// Kernel arguments: `struct StepArgs` of `kernels/adamw.cu` (same field order).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepArgs {
    grad_scale: f32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    eps: f32,
    decay: f32,
    inv_bias_correction1: f32,
    inv_bias_correction2: f32,
    key_m: u64,
    key_v: u64,
    key_w: u64,
    n: u64,
    block: u32,
    reset_m: i32,
    reset_v: i32,
    round_m: i32,
    round_v: i32,
    round_w: i32,
    zero_m: u32,
    zero_v: u32,
}
unsafe impl DeviceRepr for StepArgs {}

fn round_id(r: Rounding) -> i32 {
    match r {
        Rounding::Nearest => 0,
        Rounding::Stochastic => 1,
    }
}

fn err(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Cuda(e.to_string().into())
}

/// One tensor's states on the device: codes as raw bytes (FP32/BF16 words included) and
/// scales (one dummy element for unscaled formats).
struct DeviceState {
    m_codes: CudaSlice<u8>,
    m_scales: CudaSlice<f32>,
    v_codes: CudaSlice<u8>,
    v_scales: CudaSlice<f32>,
}

/// The optimizer with states on a CUDA device.
pub struct CudaAdamW {
    /// Settings, tensor metadata, and the host copy of the states (current after
    /// [`CudaAdamW::download`]).
    pub host: LowbitAdamW,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    states: Vec<DeviceState>,
    counters: CudaSlice<u64>,
    amax: CudaSlice<u32>,
    maps: CudaSlice<f32>,
}

struct StepOp<'a> {
    stream: &'a Arc<CudaStream>,
    kernels: &'a Kernels,
    per_tensor: bool,
    scaled: bool,
    args: StepArgs,
    st: &'a DeviceState,
    amax: &'a CudaSlice<u32>,
    counters: candle_core::cuda::cudarc::driver::CudaView<'a, u64>,
    maps: &'a CudaSlice<f32>,
}

impl InplaceOp2 for StepOp<'_> {
    fn name(&self) -> &'static str {
        "lowbit-adamw"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout, _: &candle_core::CpuStorage, _: &Layout) -> Result<()> {
        candle_core::bail!("CudaAdamW got CPU tensors")
    }

    fn cuda_fwd(&self, p: &mut CudaStorage, lp: &Layout, g: &CudaStorage, lg: &Layout) -> Result<()> {
        // the kernel reads and writes 4 elements at a time with vector accesses
        if !lp.is_contiguous() || !lg.is_contiguous() || lp.start_offset() % 4 != 0 || lg.start_offset() % 4 != 0 {
            candle_core::bail!("lowbit-adamw: parameter and gradient must be contiguous, starting at a multiple of 4 elements");
        }
        let g = g.as_cuda_slice::<f32>()?.slice(lg.start_offset()..);
        let n = self.args.n as usize;
        let st = self.st;
        let stream = self.stream;
        if self.per_tensor {
            // per-tensor scaling: amax over the whole tensor first (amax buffer zeroed)
            let mut amax = self.amax.clone();
            stream.memset_zeros(&mut amax).map_err(err)?;
            let mut b = stream.launch_builder(&self.kernels.amax);
            b.arg(&self.args).arg(&g).arg(&st.m_codes).arg(&st.m_scales).arg(&st.v_codes).arg(&st.v_scales);
            b.arg(&amax).arg(self.maps);
            let cfg = LaunchConfig { grid_dim: (n.div_ceil(256).clamp(1, 1024) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            unsafe { b.launch(cfg) }.map_err(err)?;
            self.launch_step(p, lp, &g, &amax)?;
            let mut b = stream.launch_builder(&self.kernels.set_scales);
            b.arg(&amax).arg(&st.m_scales).arg(&st.v_scales);
            unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }.map_err(err)?;
            Ok(())
        } else {
            self.launch_step(p, lp, &g, self.amax)
        }
    }
}

impl StepOp<'_> {
    fn launch_step(
        &self,
        p: &mut CudaStorage,
        lp: &Layout,
        g: &candle_core::cuda::cudarc::driver::CudaView<'_, f32>,
        amax: &CudaSlice<u32>,
    ) -> Result<()> {
        let st = self.st;
        // segment per warp: as in adamw.cu (a scale block, or 128 elements)
        let seg = if self.per_tensor || self.args.block == 0 || !self.scaled { 128 } else { self.args.block as usize };
        let blocks = (self.args.n as usize).div_ceil(seg).div_ceil(8).clamp(1, 8192) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        macro_rules! go {
            ($t:ty, $f:expr) => {{
                let mut b = self.stream.launch_builder($f);
                b.arg(&self.args);
                let mut pv = p.as_cuda_slice_mut::<$t>()?.slice_mut(lp.start_offset()..);
                b.arg(&mut pv).arg(g).arg(&st.m_codes).arg(&st.m_scales).arg(&st.v_codes).arg(&st.v_scales);
                b.arg(amax).arg(&self.counters).arg(self.maps);
                unsafe { b.launch(cfg) }.map_err(err)?;
            }};
        }
        match p.dtype() {
            DType::F32 => go!(f32, &self.kernels.step_f32),
            DType::BF16 => go!(half::bf16, &self.kernels.step_bf16),
            d => candle_core::bail!("lowbit-adamw: unsupported weight dtype {d:?}"),
        }
        Ok(())
    }
}

impl CudaAdamW {
    /// Upload the states of `host` to `dev`.
    pub fn new(host: LowbitAdamW, dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let upload = |s: &crate::state::QuantState| -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
            let codes = stream.clone_htod(&s.code_bytes()).map_err(err)?;
            let scales = if s.scales.is_empty() { vec![1.0f32] } else { s.scales.clone() };
            Ok((codes, stream.clone_htod(&scales).map_err(err)?))
        };
        let mut states = Vec::with_capacity(host.tensors.len());
        for t in &host.tensors {
            let (m_codes, m_scales) = upload(&t.m)?;
            let (v_codes, v_scales) = upload(&t.v)?;
            states.push(DeviceState { m_codes, m_scales, v_codes, v_scales });
        }
        let counters = stream.alloc_zeros::<u64>(COUNTER_RING * host.tensors.len().max(1) * 6).map_err(err)?;
        let amax = stream.alloc_zeros::<u32>(2).map_err(err)?;
        let mut maps_host = int8::dynamic_map(true).to_vec();
        maps_host.extend_from_slice(int8::dynamic_map(false));
        let maps = stream.clone_htod(&maps_host).map_err(err)?;
        let (mf, vf) = (host.spec.m_format.name(), host.spec.v_format.name());
        let names = [
            format!("adamw_f32_{mf}_{vf}"),
            format!("adamw_bf16_{mf}_{vf}"),
            format!("adamw_amax_{mf}_{vf}"),
            format!("adamw_set_scales_{mf}_{vf}"),
        ];
        let mut f = load(dev, ADAMW_BIN, &names)?.into_iter();
        let kernels = Kernels {
            step_f32: f.next().unwrap(),
            step_bf16: f.next().unwrap(),
            amax: f.next().unwrap(),
            set_scales: f.next().unwrap(),
        };
        Ok(CudaAdamW { host, dev: dev.clone(), stream, kernels, states, counters, amax, maps })
    }

    fn slot(&self, step: u64) -> usize {
        (step as usize % COUNTER_RING) * self.host.tensors.len() * 6
    }

    /// Zero the counter slot of `step` (call once per step, before its tensors).
    pub fn begin_step(&mut self, step: u64) -> Result<()> {
        let (s, len) = (self.slot(step), self.host.tensors.len() * 6);
        let mut view = self.counters.slice_mut(s..s + len);
        self.stream.memset_zeros(&mut view).map_err(err)
    }

    /// Step tensor `idx`: `p` (F32 or BF16, contiguous, on this device) updated in place
    /// from the FP32 gradient `g`.
    pub fn step_tensor(&mut self, step: u64, lr: f64, grad_scale: f32, idx: usize, p: &Tensor, g: &Tensor) -> Result<()> {
        let info = &self.host.tensors[idx].info;
        let h: StepScalars = self.host.scalars(step, lr, grad_scale, info.weight_decay);
        let k: StepKeys = self.host.keys(step, idx);
        let r: Roundings = self.host.roundings();
        let spec = self.host.spec;
        let zero = |signed| int8::zero_index(int8::dynamic_map(signed)) as u32;
        let args = StepArgs {
            grad_scale: h.grad_scale,
            lr: h.lr,
            beta1: h.beta1,
            beta2: h.beta2,
            one_minus_beta1: h.one_minus_beta1,
            one_minus_beta2: h.one_minus_beta2,
            eps: h.eps,
            decay: h.decay,
            inv_bias_correction1: h.inv_bias_correction1,
            inv_bias_correction2: h.inv_bias_correction2,
            key_m: k.m,
            key_v: k.v,
            key_w: k.w,
            n: info.len as u64,
            block: spec.block_size as u32,
            reset_m: h.reset_m as i32,
            reset_v: h.reset_v as i32,
            round_m: round_id(r.m),
            round_v: round_id(r.v),
            round_w: round_id(r.w),
            zero_m: zero(true),
            zero_v: zero(false),
        };
        let scaled = spec.m_format.is_scaled() || spec.v_format.is_scaled();
        let s = self.slot(step) + idx * 6;
        let op = StepOp {
            stream: &self.stream,
            kernels: &self.kernels,
            per_tensor: scaled && spec.block_size == 0,
            scaled,
            args,
            st: &self.states[idx],
            amax: &self.amax,
            counters: self.counters.slice(s..s + 6),
            maps: &self.maps,
        };
        if g.dtype() != DType::F32 || g.elem_count() != info.len || p.elem_count() != info.len {
            candle_core::bail!("{}: gradient must be F32 with {} elements", info.name, info.len);
        }
        p.inplace_op2(g, &op)
    }

    /// Stall counts of every tensor at `step` (one device-to-host copy: synchronises).
    /// Valid for the last [`COUNTER_RING`] steps.
    pub fn read_counts(&self, step: u64) -> Result<Vec<StallCounts>> {
        let (s, len) = (self.slot(step), self.host.tensors.len() * 6);
        let raw = self.dev.cuda_stream().clone_dtoh(&self.counters.slice(s..s + len)).map_err(err)?;
        Ok(raw
            .chunks_exact(6)
            .map(|c| StallCounts {
                m: Counter { updated: c[0], stalled: c[1] },
                v: Counter { updated: c[2], stalled: c[3] },
                w: Counter { updated: c[4], stalled: c[5] },
            })
            .collect())
    }

    /// Copy the device states into `self.host` (checkpoints, tests) and return it.
    pub fn download(&mut self) -> Result<&LowbitAdamW> {
        let stream = self.dev.cuda_stream();
        for (t, d) in self.host.tensors.iter_mut().zip(&self.states) {
            for (s, codes, scales) in [(&mut t.m, &d.m_codes, &d.m_scales), (&mut t.v, &d.v_codes, &d.v_scales)] {
                let bytes = stream.clone_dtoh(codes).map_err(err)?;
                s.set_code_bytes(&bytes).map_err(err)?;
                if !s.scales.is_empty() {
                    s.scales = stream.clone_dtoh(scales).map_err(err)?;
                }
            }
        }
        Ok(&self.host)
    }
}

/// Rounding cast on the GPU: `x` (F32, contiguous) to `format`'s codes (as [`crate::cast::cast`]):
/// BF16 gives a BF16 tensor, FP8 a U8 tensor of codes, FP4 a U8 tensor of packed pairs.
pub fn cast(x: &Tensor, format: StateFormat, rounding: Rounding, key: u64) -> Result<Tensor> {
    let dev = match x.device() {
        candle_core::Device::Cuda(d) => d.clone(),
        _ => candle_core::bail!("cuda::cast needs a CUDA tensor"),
    };
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let n = x.elem_count();
    let (name, out_len, dtype) = match format {
        StateFormat::Bf16 => ("sr_cast_bf16", n, DType::BF16),
        StateFormat::Fp8E4M3 => ("sr_cast_fp8e4m3", n, DType::U8),
        StateFormat::Fp8E5M2 => ("sr_cast_fp8e5m2", n, DType::U8),
        StateFormat::Fp4E2M1 => ("sr_cast_fp4e2m1", n.div_ceil(2), DType::U8),
        f => candle_core::bail!("cast to {} is not supported", f.name()),
    };
    let (storage, layout) = x.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*storage else { candle_core::bail!("not a CUDA tensor") };
    let src = cs.as_cuda_slice::<f32>()?.slice(layout.start_offset()..);
    let stream = dev.cuda_stream();
    let f = load(&dev, CAST_BIN, &[name.to_string()])?.remove(0);
    let cfg = LaunchConfig { grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (n64, rid) = (n as u64, round_id(rounding));
    let out = if dtype == DType::BF16 {
        let mut out = stream.alloc_zeros::<half::bf16>(out_len).map_err(err)?;
        let mut b = stream.launch_builder(&f);
        b.arg(&src).arg(&mut out).arg(&n64).arg(&key).arg(&rid);
        unsafe { b.launch(cfg) }.map_err(err)?;
        CudaStorage::wrap_cuda_slice(out, dev.clone())
    } else {
        let mut out = stream.alloc_zeros::<u8>(out_len).map_err(err)?;
        let mut b = stream.launch_builder(&f);
        b.arg(&src).arg(&mut out).arg(&n64).arg(&key).arg(&rid);
        unsafe { b.launch(cfg) }.map_err(err)?;
        CudaStorage::wrap_cuda_slice(out, dev.clone())
    };
    drop(storage);
    Ok(Tensor::from_storage(candle_core::Storage::Cuda(out), out_len, candle_core::op::BackpropOp::none(), false))
}
