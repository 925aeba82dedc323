//! Fused CUDA AdamW step (`kernels/optim/adamw.cu`), launched through cudarc on candle's own
//! CUDA stream, reading and writing candle's parameter and gradient buffers in place (their
//! device addresses, no copies).
//!
//! Host side per step: the update's [`StepPlan`], the same as the CPU reference steps from (so
//! results are bit-identical), packed into the parameters of one kernel
//! launch per [`MAX_TENSORS`] tensors of a weight dtype x gradient dtype (multi-tensor
//! apply: one launch per dtype pair for every LLaMA preset; three for per-tensor scaling:
//! amax, step, scales); the gradient factor from the host, or read by the kernels from the
//! device's clip decision ([`GradScale::Device`]: a skip makes every launch a no-op);
//! step counters (stalls and zero gradients, `DeviceCounters`) added on the device into a
//! ring of [`COUNTER_RING`] step slots that the host reads when it wants (no synchronisation
//! in the step itself), [`COUNT_LAG`] steps late. [`CudaAdamW`] is the [`Optimizer`] on a CUDA
//! device.

use crate::cuda::abi::{
    kernel_format, momentum_id, round_id, scale_id, segment_len, COUNTERS, MAX_TENSORS, MOMENTUM_NONE, ROUND_ELEMENTS, STEP_ARGS_BYTES,
    STEP_THREADS, TENSOR_ARGS_BYTES,
};
use crate::error::OptimError;
use crate::rules::adamw::step::Roundings;
use crate::rules::clip::GradScale;
use crate::rules::optimizer::{check_sizes, Optimizer};
use crate::rules::step_plan::{StepPlan, TensorPlan};
use crate::states::format::{int8, Rounding, StateFormat};
use crate::states::moments::{Moments, TensorState};
use crate::states::stalls::{Counter, StallCounts};
use crate::states::state_dict::HostStates;
use candle_core::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::{CudaDevice, DType, Device, Result, Tensor, Var};
use std::sync::Arc;

const ADAMW_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/adamw.fatbin"));

/// Load `name` from a fatbin on `dev`'s context.
fn load(dev: &CudaDevice, image: &[u8], names: &[String]) -> Result<Vec<CudaFunction>> {
    let module = dev.cuda_stream().context().load_module(Ptx::from_binary(image.to_vec())).map_err(err)?;
    names.iter().map(|n| module.load_function(n).map_err(err)).collect()
}

/// The kernels of one (m format, v format) pair, loaded once.
struct Kernels {
    /// Step kernels indexed by [`Kernels::step_index`]: weights x stochastic rounding code
    /// (any write-back stochastic) x scale blocks other than 128 elements.
    step: Vec<CudaFunction>,
    /// Per-tensor amax kernels for FP32 and for BF16 gradients.
    amax: [CudaFunction; 2],
    set_scales: CudaFunction,
    /// The kernels' names, in load order (the two amax kernels, set_scales, the step
    /// kernels): a failed launch names its kernel.
    names: Vec<String>,
}

/// The kernels' weight variants (`adamw_<weights>_...` in kernels/optim/adamw.cu): FP32 weights
/// (with FP32 gradients), BF16 weights with FP32 gradients, BF16 weights with BF16 gradients.
const WEIGHT_VARIANTS: [(DType, DType, &str); 3] =
    [(DType::F32, DType::F32, "f32"), (DType::BF16, DType::F32, "bf16"), (DType::BF16, DType::BF16, "bf16g")];

impl Kernels {
    /// Load the kernels of the `(m, v)` kernel-name formats `pair` ([`kernel_pair`]).
    fn load(dev: &CudaDevice, (mf, vf): (&str, &str)) -> Result<Self> {
        let mut names = vec![format!("adamw_amax_{mf}_{vf}"), format!("adamw_amax_bf16g_{mf}_{vf}"), format!("adamw_set_scales_{mf}_{vf}")];
        for (_, _, w) in WEIGHT_VARIANTS {
            for sr in ["", "_sr"] {
                for blocks in ["", "_blocks"] {
                    names.push(format!("adamw_{w}_{mf}_{vf}{sr}{blocks}"));
                }
            }
        }
        let mut f = load(dev, ADAMW_BIN, &names)?.into_iter();
        let amax = [f.next().unwrap(), f.next().unwrap()];
        Ok(Kernels { amax, set_scales: f.next().unwrap(), step: f.collect(), names })
    }

    /// The error of a failed launch of kernel `index` (load order) with `cfg`, naming the
    /// kernel, its grid and its block ([`launch_failed`]).
    fn launch_error(&self, index: usize, cfg: LaunchConfig) -> impl Fn(DriverError) -> candle_core::Error + '_ {
        launch_failed(&self.names[index], cfg)
    }

    /// `variant` indexes [`WEIGHT_VARIANTS`].
    fn step_index(variant: usize, sr: bool, blocks: bool) -> usize {
        4 * variant + 2 * sr as usize + blocks as usize
    }
}

/// Steps of stall counters kept on the device before a slot is reused.
pub const COUNTER_RING: usize = 64;

/// Steps by which the stall counts are read late (half the ring of counters, at most the
/// adaptive reset rule's lag, which its decisions then never wait for): the counters of step
/// s are read at step s + lag, long written, so reading them adds no wait to the step (whose
/// one synchronisation is at its end, in the trainer's step).
pub const COUNT_LAG: usize = {
    let lag = crate::states::reset::ADAPTIVE_LAG as usize;
    if COUNTER_RING / 2 < lag {
        COUNTER_RING / 2
    } else {
        lag
    }
};

/// Launch-wide kernel arguments: `struct StepArgs` of `kernels/optim/args.cuh` (same field
/// order and size, asserted on both sides).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepArgs {
    segments: u64,
    grad_scale: f32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    eps: f32,
    inv_bias_correction1: f32,
    inv_bias_correction2: f32,
    block: u32,
    reset_m: i32,
    reset_v: i32,
    round_m: i32,
    round_v: i32,
    round_w: i32,
    zero_m: u32,
    zero_v: u32,
    count: u32,
    frac_m: u32,
    frac_v: u32,
    zero_free: u32,
    scale_m: u32,
    scale_v: u32,
    keep_idle_v: u32,
    skip_m: u32,
    skip_v: u32,
    dither_m: u32,
    dither_v: u32,
    momentum_only: u32,
    pad: u32,
}

/// One tensor of a launch: `struct TensorArgs` of `kernels/optim/args.cuh` (device addresses).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct TensorArgs {
    p: u64,
    g: u64,
    mc: u64,
    ms: u64,
    vc: u64,
    vs: u64,
    n: u64,
    key_m: u64,
    key_v: u64,
    key_w: u64,
    key_skip: u64,
    key_m_read: u64,
    key_v_read: u64,
    first_segment: u64,
    offset: u64,
    decay: f32,
    index: u32,
}

/// `struct LaunchArgs` of `kernels/optim/args.cuh`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LaunchArgs {
    s: StepArgs,
    t: [TensorArgs; MAX_TENSORS],
}
// SAFETY: plain `#[repr(C)]` integers and floats, passed by value as args.cuh's `LaunchArgs`
unsafe impl DeviceRepr for LaunchArgs {}
// the kernel's static_asserts (args.cuh) state the same sizes
const _: () = assert!(std::mem::size_of::<StepArgs>() == STEP_ARGS_BYTES);
const _: () = assert!(std::mem::size_of::<TensorArgs>() == TENSOR_ARGS_BYTES);
const _: () = assert!(std::mem::size_of::<LaunchArgs>() == STEP_ARGS_BYTES + TENSOR_ARGS_BYTES * MAX_TENSORS);

/// One tensor's slot of the device's step counters (`kernels/optim/counters.cuh`, same order):
/// updated / stalled / unchanged of m, v and BF16 weights, the zero gradients and the updates
/// with v = 0, m != 0.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DeviceCounters {
    m_updated: u64,
    m_stalled: u64,
    m_unchanged: u64,
    v_updated: u64,
    v_stalled: u64,
    v_unchanged: u64,
    w_updated: u64,
    w_stalled: u64,
    w_unchanged: u64,
    zero_grad: u64,
    zero_v: u64,
}

const _: () = assert!(std::mem::size_of::<DeviceCounters>() == 8 * COUNTERS);

impl DeviceCounters {
    fn from_slot(c: &[u64]) -> Self {
        let [m_updated, m_stalled, m_unchanged, v_updated, v_stalled, v_unchanged, w_updated, w_stalled, w_unchanged, zero_grad, zero_v] =
            c.try_into().expect("one slot");
        DeviceCounters {
            m_updated,
            m_stalled,
            m_unchanged,
            v_updated,
            v_stalled,
            v_unchanged,
            w_updated,
            w_stalled,
            w_unchanged,
            zero_grad,
            zero_v,
        }
    }

    /// The counts of a tensor of `len` elements (m and v write every element back; BF16
    /// weights, `bf16_weights`, too).
    fn counts(&self, len: u64, bf16_weights: bool) -> StallCounts {
        let kind = |updated, stalled, unchanged, elements| Counter { updated, stalled, unchanged, elements };
        StallCounts {
            m: kind(self.m_updated, self.m_stalled, self.m_unchanged, len),
            v: kind(self.v_updated, self.v_stalled, self.v_unchanged, len),
            w: kind(self.w_updated, self.w_stalled, self.w_unchanged, if bf16_weights { len } else { 0 }),
            zero_grad: self.zero_grad,
            zero_v: self.zero_v,
            precond: Counter::default(),
        }
    }
}

/// The error of a failed launch of `kernel` with `cfg`: the kernel's name, its grid and its
/// block, then the driver's error (every launcher of the crate reports launches so).
pub(crate) fn launch_failed(kernel: &str, cfg: LaunchConfig) -> impl Fn(DriverError) -> candle_core::Error + '_ {
    move |e| err(format!("launch of {kernel} (grid {:?}, block {:?}): {e}", cfg.grid_dim, cfg.block_dim))
}

/// A CUDA driver's (or the optimizer's) error as candle's.
pub(crate) fn err(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Cuda(e.to_string().into())
}

/// The launch-wide arguments of the setting of tensor `t` (every tensor's of that setting but
/// its weight decay, which is per tensor) from the tensor's part `p` of the update's plan. A
/// Muon matrix's ([`TensorState::momentum`]) step m alone: v, which it does not have, reads as
/// reset and is not written (`momentum_only`, an FP32 v kernel: [`SpecGroup::v_format`]).
fn step_args(t: &TensorState, p: &TensorPlan) -> StepArgs {
    let (spec, h, r) = (&t.spec, &p.scalars, &p.roundings);
    let zero = |signed| int8::dynamic_map(signed).zero_index() as u32;
    let momentum_only = momentum_id(t.momentum);
    let adamw = momentum_only == MOMENTUM_NONE;
    StepArgs {
        segments: 0,
        grad_scale: h.grad_scale,
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        one_minus_beta1: h.one_minus_beta1,
        one_minus_beta2: h.one_minus_beta2,
        eps: h.eps,
        inv_bias_correction1: h.inv_bias_correction1,
        inv_bias_correction2: h.inv_bias_correction2,
        block: spec.block_size as u32,
        reset_m: h.reset_m as i32,
        reset_v: (h.reset_v || !adamw) as i32,
        round_m: round_id(r.m),
        round_v: if adamw { round_id(r.v) } else { round_id(Rounding::Nearest) },
        round_w: round_id(r.w),
        zero_m: zero(true),
        zero_v: zero(false),
        count: 0,
        frac_m: spec.m_format.fraction_bits().unwrap_or(0),
        frac_v: if adamw { spec.v_format.fraction_bits().unwrap_or(0) } else { 0 },
        zero_free: (adamw && t.v.zero_free) as u32,
        scale_m: scale_id(spec.m_scale),
        scale_v: scale_id(spec.v_scale),
        keep_idle_v: h.keep_idle_v as u32,
        skip_m: h.skip_m,
        skip_v: h.skip_v,
        dither_m: p.keys.m_read.is_some() as u32,
        dither_v: p.keys.v_read.is_some() as u32,
        momentum_only,
        pad: 0,
    }
}

/// The `(m, v)` kernel names' formats. Errors for pairs without kernels: precision-only
/// states pair only with fp32, bf16 or precision-only states (kernels/optim/adamw.cu).
fn kernel_pair(m: StateFormat, v: StateFormat) -> Result<(&'static str, &'static str)> {
    let precision = |f| matches!(f, StateFormat::E8m(_));
    let plain = |f| matches!(f, StateFormat::Fp32 | StateFormat::Bf16 | StateFormat::E8m(_));
    if (precision(m) || precision(v)) && !(plain(m) && plain(v)) {
        candle_core::bail!(
            "optim.states: the CUDA optimizer pairs a precision-only format (e8m1..e8m6) only with fp32, bf16 or \
             another precision-only format, got m = {} and v = {}",
            m.name(),
            v.name()
        );
    }
    Ok((kernel_format(m), kernel_format(v)))
}

/// Thread blocks of [`STEP_THREADS`] for a launch over `elements`: at least 2048 elements per
/// warp, at most `max` (the blocks that fit on the GPU at once).
fn warp_blocks(elements: u64, max: u32) -> u32 {
    (elements.div_ceil(u64::from(STEP_THREADS / 32) * 2048) as u32).clamp(1, max)
}

/// Thread blocks of 256 threads that fit on the GPU at once: per weight variant for the step
/// kernels (from its SR kernel: the launch bounds differ by weight dtype; the fewest over the
/// format pairs `kernels`), and for the amax kernels of FP32 and BF16 gradients.
fn resident_blocks(stream: &CudaStream, kernels: &[Kernels]) -> Result<([u32; WEIGHT_VARIANTS.len()], [u32; 2])> {
    let sms = stream
        .context()
        .attribute(candle_core::cuda::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(err)? as u32;
    let full = |f: &CudaFunction| -> Result<u32> {
        Ok(sms * f.occupancy_max_active_blocks_per_multiprocessor(STEP_THREADS, 0, None).map_err(err)?.max(1))
    };
    let mut max_blocks = [u32::MAX; WEIGHT_VARIANTS.len()];
    let mut amax_blocks = [u32::MAX; 2];
    for k in kernels {
        for (v, m) in max_blocks.iter_mut().enumerate() {
            *m = (*m).min(full(&k.step[Kernels::step_index(v, true, false)])?);
        }
        // the amax pass fills the GPU on its own terms (32 registers: 8 blocks per SM; faster
        // than the step's 3 per SM: bench/training_h200.md, "Measurements behind choices in the code")
        for (g, m) in amax_blocks.iter_mut().enumerate() {
            *m = (*m).min(full(&k.amax[g])?);
        }
    }
    Ok((max_blocks, amax_blocks))
}

/// Device address of the first element of `t` (contiguous, on a CUDA device, start offset
/// a multiple of 4 elements: the kernel moves 4 elements per vector access, 8 or 16 bytes).
fn address(t: &Tensor, stream: &CudaStream, what: &str) -> Result<u64> {
    if !t.is_contiguous() || !t.layout().start_offset().is_multiple_of(4) {
        candle_core::bail!("{what}: must be contiguous, starting at a multiple of 4 elements");
    }
    element_address(t, stream, what)
}

/// Device address of the first element of `t`: a contiguous F32 or BF16 tensor on a CUDA
/// device, any start offset. Errors name `what`.
pub(crate) fn element_address(t: &Tensor, stream: &CudaStream, what: &str) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*storage else { candle_core::bail!("{what}: not on a CUDA device") };
    if !layout.is_contiguous() {
        candle_core::bail!("{what}: must be contiguous");
    }
    let (base, size) = match t.dtype() {
        DType::F32 => (cs.as_cuda_slice::<f32>()?.device_ptr(stream).0, 4),
        DType::BF16 => (cs.as_cuda_slice::<half::bf16>()?.device_ptr(stream).0, 2),
        d => candle_core::bail!("{what}: unsupported dtype {d:?} (F32 or BF16)"),
    };
    Ok(base + (layout.start_offset() * size) as u64)
}

/// One tensor's states on the device: codes as raw bytes (FP32/BF16 words included) and
/// scales (one dummy element for unscaled formats), with their device addresses.
struct DeviceState {
    m_codes: CudaSlice<u8>,
    m_scales: CudaSlice<f32>,
    v_codes: CudaSlice<u8>,
    v_scales: CudaSlice<f32>,
    /// Addresses of the four buffers above (fixed for their lifetime).
    addr: [u64; 4],
}

/// The tensors of one state setting (per-group formats: [`Moments::spec_groups`]) and one rule
/// (AdamW's tensors, or Muon's matrices: [`TensorState::momentum`]): they share the launch-wide
/// arguments, so they are stepped by launches of their own.
struct SpecGroup {
    spec: crate::states::config::StatesSpec,
    /// The v format of its kernels: the spec's, FP32 for Muon's matrices (no v: never read or
    /// written, `StepArgs::momentum_only`).
    v_format: StateFormat,
    /// Tensor indices, in tensor order.
    tensors: Vec<usize>,
    /// Index in [`CudaAdamW::kernels`] of its (m, v) format pair's kernels.
    kernels: usize,
}

impl SpecGroup {
    /// Whether a state of its kernels is scaled.
    fn scaled(&self) -> bool {
        self.spec.m_format.is_scaled() || self.v_format.is_scaled()
    }

    /// Whether its scaled states have one scale per tensor (the amax and scale launches).
    fn per_tensor_scales(&self) -> bool {
        self.scaled() && self.spec.block_size == 0
    }
}

/// The optimizer with states on a CUDA device.
pub struct CudaAdamW {
    /// Settings, tensor metadata, and the host copy of the states (current after
    /// [`CudaAdamW::download`]).
    pub host: Moments,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    /// The kernels of each (m, v) format pair some tensor has.
    kernels: Vec<Kernels>,
    groups: Vec<SpecGroup>,
    states: Vec<DeviceState>,
    counters: CudaSlice<u64>,
    /// Per-tensor scaling: amax of m and v per tensor (ordered FP32 bits).
    amax: CudaSlice<u32>,
    /// int8: the signed and the unsigned dynamic map's values, and their bucket tables.
    maps: CudaSlice<f32>,
    buckets: CudaSlice<u8>,
    /// Thread blocks that fit on the GPU at once, per weight variant (step kernels).
    max_blocks: [u32; WEIGHT_VARIANTS.len()],
    /// The same for the amax kernels (FP32 and BF16 gradients).
    amax_blocks: [u32; 2],
    /// Per tensor: whether its weights are BF16 (as the last step gave them), for the weight
    /// counters' element count.
    bf16_weights: Vec<bool>,
}

impl CudaAdamW {
    /// Upload the moments `host` (AdamW's, [`crate::rules::adamw::LowbitAdamW::moments`]) to
    /// `dev`.
    pub fn new(host: Moments, dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        // (an empty state, e.g. a ZeRO-1 shard that owns none of a tensor, gets one byte: the
        // driver refuses allocations of 0 bytes)
        let upload = |s: &crate::states::quant::QuantState| -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
            let bytes = s.code_bytes();
            let codes = stream.clone_htod(if bytes.is_empty() { &[0u8][..] } else { &bytes }).map_err(err)?;
            let scales = if s.scales.is_empty() { vec![1.0f32] } else { s.scales.clone() };
            Ok((codes, stream.clone_htod(&scales).map_err(err)?))
        };
        let mut states = Vec::with_capacity(host.tensors.len());
        for t in &host.tensors {
            let (m_codes, m_scales) = upload(&t.m)?;
            let (v_codes, v_scales) = upload(&t.v)?;
            let addr = [
                m_codes.device_ptr(&stream).0,
                m_scales.device_ptr(&stream).0,
                v_codes.device_ptr(&stream).0,
                v_scales.device_ptr(&stream).0,
            ];
            states.push(DeviceState { m_codes, m_scales, v_codes, v_scales, addr });
        }
        let counters = stream.alloc_zeros::<u64>(COUNTER_RING * host.tensors.len().max(1) * COUNTERS).map_err(err)?;
        let amax = stream.alloc_zeros::<u32>(2 * host.tensors.len().max(1)).map_err(err)?;
        let (signed, unsigned) = (int8::dynamic_map(true), int8::dynamic_map(false));
        // the kernel's int8_encode takes MAX_STEPS = 2 steps and tests n >= 1 for the top code
        const _: () = assert!(int8::MAX_STEPS == 2);
        assert!(signed[255] == 1.0 && unsigned[255] == 1.0, "int8 maps must end at 1");
        let maps = stream.clone_htod(&[&signed.values()[..], unsigned.values()].concat()).map_err(err)?;
        let buckets = stream.clone_htod(&[signed.bucket_starts(), unsigned.bucket_starts()].concat()).map_err(err)?;
        let (mut pairs, mut kernels, mut groups) = (vec![], vec![], vec![]);
        for (spec, all) in host.spec_groups() {
            let (muon, adamw): (Vec<usize>, Vec<usize>) = all.into_iter().partition(|&i| host.tensors[i].momentum.is_some());
            for (tensors, v_format) in [(adamw, spec.v_format), (muon, StateFormat::Fp32)] {
                if tensors.is_empty() {
                    continue;
                }
                let pair = kernel_pair(spec.m_format, v_format)?;
                let k = match pairs.iter().position(|p| *p == pair) {
                    Some(k) => k,
                    None => {
                        kernels.push(Kernels::load(dev, pair)?);
                        pairs.push(pair);
                        pairs.len() - 1
                    }
                };
                groups.push(SpecGroup { spec, v_format, tensors, kernels: k });
            }
        }
        let (max_blocks, amax_blocks) = resident_blocks(&stream, &kernels)?;
        let bf16_weights = vec![false; host.tensors.len()];
        Ok(CudaAdamW {
            host,
            dev: dev.clone(),
            stream,
            kernels,
            groups,
            states,
            counters,
            amax,
            maps,
            buckets,
            max_blocks,
            amax_blocks,
            bf16_weights,
        })
    }

    fn device(&self) -> Device {
        Device::Cuda(self.dev.clone())
    }

    fn slot(&self, step: u64) -> usize {
        (step as usize % COUNTER_RING) * self.host.tensors.len() * COUNTERS
    }

    /// One optimizer step on every tensor: `params[i]` (F32 or BF16, contiguous, on this
    /// device) updated in place from the gradient `grads[i]` (F32; for BF16 weights also BF16,
    /// widened exactly to FP32 in the kernel, so both give the same step; multiplied by the
    /// factor of `scale`), states updated, stall counts of `step` accumulated on the device.
    /// With [`GradScale::Device`] every kernel reads the factor and the skip flag when it
    /// runs; a skip leaves weights, states and scales as they were, and the stall counts of
    /// `step` read zero.
    /// Asynchronous: a few kernel launches on candle's stream (one per weight dtype x
    /// gradient dtype and [`MAX_TENSORS`] tensors; per-tensor scaling adds an amax and a scale
    /// launch each). An optimizer made from a ZeRO-1 shard ([`Moments::shard`]) takes the
    /// shard's weights and gradients (`TensorState::first ..` + its length, e.g. views of the
    /// whole tensors) and draws the random bits of those elements of the whole tensor, so it
    /// rounds exactly as the whole-tensor step does on them. For a Muon matrix
    /// ([`TensorState::momentum`]) `params[i]` is an F32 buffer of its elements that receives
    /// the update u to orthogonalise (`cuda::muon::CudaMuon`). Returns the update's plan.
    ///
    /// Errors: the wrong number of tensors, a size that does not match the optimizer's
    /// tensor (or shard), a shard that does not start at a multiple of 4 elements, a (weight,
    /// gradient) dtype pair other than F32/F32, BF16/F32 and BF16/BF16, a tensor not on a CUDA
    /// device or not contiguous; a device gate that is not F32 `[2]` on this device; the
    /// adaptive reset rule missing a measurement ([`Moments::plan`]).
    pub fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Tensor], grads: &[Tensor]) -> Result<StepPlan> {
        let count = self.host.tensors.len();
        if params.len() != count || grads.len() != count {
            candle_core::bail!("lowbit-adamw: {} parameters and {} gradients for {count} tensors", params.len(), grads.len());
        }
        // the device's clip (its factor replaces grad_scale in the kernels), or none (0)
        let (grad_scale, gate) = match scale {
            GradScale::Host(f) => (f, 0u64),
            GradScale::Device(g) => {
                crate::rules::clip::check_gate(g).map_err(err)?;
                if !g.device().same_device(&self.device()) {
                    candle_core::bail!(
                        "lowbit-adamw: the device clip gate is on {:?}, not on the parameters' device",
                        g.device().location()
                    );
                }
                (1.0, element_address(g, &self.stream, "the device clip gate")?)
            }
        };
        let plan = self.host.plan(step, lr, grad_scale).map_err(err)?;
        let (s, len) = (self.slot(step), count * COUNTERS);
        let mut view = self.counters.slice_mut(s..s + len);
        self.stream.memset_zeros(&mut view).map_err(err)?;
        let tensors = self.tensor_args(&plan, params, grads)?;
        self.launch_groups(&plan, &tensors, gate, s)?;
        Ok(plan)
    }

    /// Each tensor's launch arguments under `plan`, with its weight variant (`None`: a shard
    /// that owns none of the tensor), in optimizer order, checked before anything is launched.
    fn tensor_args(&mut self, plan: &StepPlan, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Option<(usize, TensorArgs)>>> {
        let mut tensors = Vec::with_capacity(params.len());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let info = &self.host.tensors[i].info;
            let Some(variant) = WEIGHT_VARIANTS.iter().position(|&(w, d, _)| (w, d) == (p.dtype(), g.dtype())) else {
                candle_core::bail!(
                    "{}: {:?} weights with {:?} gradients (F32 weights take F32 gradients, BF16 weights F32 or BF16)",
                    info.name,
                    p.dtype(),
                    g.dtype()
                );
            };
            self.bf16_weights[i] = p.dtype() == DType::BF16;
            // a ZeRO-1 shard: its elements first..first + len of the whole tensor
            let (first, len) = (self.host.tensors[i].first, self.host.tensors[i].m.len);
            if g.elem_count() != len || p.elem_count() != len {
                candle_core::bail!("{}: parameter and gradient must have {len} elements", info.name);
            }
            if len == 0 {
                tensors.push(None); // a shard that owns none of this tensor
                continue;
            }
            if first % 4 != 0 {
                candle_core::bail!("{}: a shard must start at a multiple of 4 elements, not {first}", info.name);
            }
            let (k, a) = (&plan.tensors[i].keys, &self.states[i].addr);
            tensors.push(Some((
                variant,
                TensorArgs {
                    p: address(p, &self.stream, &info.name)?,
                    g: address(g, &self.stream, &info.name)?,
                    mc: a[0],
                    ms: a[1],
                    vc: a[2],
                    vs: a[3],
                    n: len as u64,
                    key_m: k.m,
                    key_v: k.v,
                    key_w: k.w,
                    key_skip: k.skip,
                    key_m_read: k.m_read.unwrap_or(0),
                    key_v_read: k.v_read.unwrap_or(0),
                    first_segment: 0,
                    offset: first as u64,
                    decay: plan.tensors[i].scalars.decay,
                    index: i as u32,
                },
            )));
        }
        Ok(tensors)
    }

    /// Per state setting, one group of launches per weight variant, [`MAX_TENSORS`] tensors
    /// each, of the tensors' arguments `tensors` ([`CudaAdamW::tensor_args`]), counting into
    /// the counters at `counters` ([`CudaAdamW::slot`]).
    fn launch_groups(&mut self, plan: &StepPlan, tensors: &[Option<(usize, TensorArgs)>], gate: u64, counters: usize) -> Result<()> {
        if self.groups.iter().any(SpecGroup::per_tensor_scales) {
            self.stream.memset_zeros(&mut self.amax).map_err(err)?;
        }
        for group in &self.groups {
            let Some(&first) = group.tensors.first() else { continue };
            let seg = segment_len(group.scaled(), group.spec.block_size);
            let launch_args = step_args(&self.host.tensors[first], &plan.tensors[first]);
            for variant in 0..WEIGHT_VARIANTS.len() {
                let of_variant: Vec<TensorArgs> =
                    group.tensors.iter().filter_map(|&i| tensors[i]).filter(|(v, _)| *v == variant).map(|(_, t)| t).collect();
                for chunk in of_variant.chunks(MAX_TENSORS) {
                    let mut args = LaunchArgs { s: launch_args, t: [TensorArgs::default(); MAX_TENSORS] };
                    let mut segments = 0u64;
                    for (slot, t) in args.t.iter_mut().zip(chunk) {
                        *slot = TensorArgs { first_segment: segments, ..*t };
                        segments += t.n.div_ceil(seg as u64);
                    }
                    args.s.segments = segments;
                    args.s.count = chunk.len() as u32;
                    self.launch(group, variant, &args, &plan.tensors[first].roundings, gate, counters)?;
                }
            }
        }
        Ok(())
    }

    /// The step launch of one chunk of `group`'s tensors, whose write-backs round as `r` (with
    /// the amax and scale launches of per-tensor scaling).
    fn launch(&self, group: &SpecGroup, variant: usize, args: &LaunchArgs, r: &Roundings, gate: u64, slot: usize) -> Result<()> {
        let elements: u64 = args.t[..args.s.count as usize].iter().map(|t| t.n).sum();
        let cfg = LaunchConfig {
            grid_dim: (warp_blocks(elements, self.max_blocks[variant]), 1, 1),
            block_dim: (STEP_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (stream, kernels, spec) = (&self.stream, &self.kernels[group.kernels], &group.spec);
        let per_tensor = group.per_tensor_scales();
        if per_tensor {
            let g = (WEIGHT_VARIANTS[variant].1 == DType::BF16) as usize;
            let amax_cfg = LaunchConfig { grid_dim: (warp_blocks(elements, self.amax_blocks[g]), 1, 1), ..cfg };
            let mut b = stream.launch_builder(&kernels.amax[g]);
            b.arg(args).arg(&gate).arg(&self.amax).arg(&self.maps);
            // SAFETY: `args` is args.cuh's `LaunchArgs` (sizes asserted) over live device
            // buffers of the group's tensors; the amax and map buffers are this optimizer's
            unsafe { b.launch(amax_cfg) }.map_err(kernels.launch_error(g, amax_cfg))?;
        }
        // (dither draws its random bits in the kernels with stochastic rounding's code)
        let sr = |r: Rounding| r != Rounding::Nearest;
        let bf16 = WEIGHT_VARIANTS[variant].0 == DType::BF16;
        let other_blocks = group.scaled() && !matches!(spec.block_size, 0 | ROUND_ELEMENTS);
        let index = Kernels::step_index(variant, sr(r.m) || sr(r.v) || (bf16 && sr(r.w)), other_blocks);
        let f = &kernels.step[index];
        let counters = self.counters.slice(slot..);
        let mut b = stream.launch_builder(f);
        b.arg(args).arg(&gate).arg(&self.amax).arg(&counters).arg(&self.maps).arg(&self.buckets);
        // SAFETY: as the amax launch's; the counters slice holds this step's slot
        unsafe { b.launch(cfg) }.map_err(kernels.launch_error(3 + index, cfg))?;
        if per_tensor {
            let mut b = stream.launch_builder(&kernels.set_scales);
            b.arg(args).arg(&gate).arg(&self.amax);
            let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (MAX_TENSORS as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: as the amax launch's; one thread per tensor of the launch
            unsafe { b.launch(one) }.map_err(kernels.launch_error(2, one))?;
        }
        Ok(())
    }

    /// Stall counts of every tensor at `step` (one device-to-host copy: synchronises).
    /// Valid for the last [`COUNTER_RING`] steps.
    pub fn read_counts(&self, step: u64) -> Result<Vec<StallCounts>> {
        let (s, len) = (self.slot(step), self.host.tensors.len() * COUNTERS);
        let raw = self.dev.cuda_stream().clone_dtoh(&self.counters.slice(s..s + len)).map_err(err)?;
        Ok(raw
            .chunks_exact(COUNTERS)
            .zip(self.host.tensors.iter().zip(&self.bf16_weights))
            .map(|(c, (t, &bf16))| {
                let mut counts = DeviceCounters::from_slot(c).counts(t.m.len as u64, bf16);
                if t.momentum.is_some() {
                    counts.v = Counter::default(); // (a Muon matrix has no v)
                }
                counts
            })
            .collect())
    }

    /// Copy the device states into `self.host` (checkpoints, tests) and return it.
    pub fn download(&mut self) -> Result<&Moments> {
        let stream = self.dev.cuda_stream();
        for (t, d) in self.host.tensors.iter_mut().zip(&self.states) {
            for (s, codes, scales) in [(&mut t.m, &d.m_codes, &d.m_scales), (&mut t.v, &d.v_codes, &d.v_scales)] {
                if s.len == 0 {
                    continue;
                }
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

/// The fused kernels behind the trait: the parameters' own device buffers updated in place
/// (a ZeRO-1 shard's elements through views of them), stall counters read [`COUNT_LAG`] steps
/// late so that reading them never waits for the device.
impl Optimizer for CudaAdamW {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> std::result::Result<(), OptimError> {
        check_sizes(&self.host.tensors, params, grads)?;
        // the elements the states cover: whole tensors, or views of a shard's range
        let held = |i: usize, t: &Tensor| -> Result<Tensor> {
            let s = &self.host.tensors[i];
            match s.first == 0 && s.m.len == t.elem_count() {
                true => Ok(t.clone()),
                false => t.flatten_all()?.narrow(0, s.first, s.m.len),
            }
        };
        let weights = params.iter().enumerate().map(|(i, p)| held(i, p.as_tensor())).collect::<Result<Vec<_>>>()?;
        let grads = grads.iter().enumerate().map(|(i, g)| held(i, g)).collect::<Result<Vec<_>>>()?;
        CudaAdamW::step(self, step, lr, scale, &weights, &grads)?;
        Ok(())
    }

    fn measured_counts(&mut self, step: u64) -> std::result::Result<Vec<StallCounts>, OptimError> {
        Ok(self.read_counts(step)?)
    }

    fn count_lag(&self) -> usize {
        COUNT_LAG
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.host.observe(step, total);
    }

    fn last_adaptive_reset(&self) -> Option<u64> {
        self.host.last_adaptive_reset()
    }

    fn states(&mut self) -> std::result::Result<HostStates<'_>, OptimError> {
        Ok(HostStates { moments: self.download()?, precond: None })
    }
}
