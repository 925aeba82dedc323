//! SOAP on a CUDA device ([`CudaSoap`]): the update of [`crate::rules::soap::step`] with the dense maths
//! as candle operations on the device (cuBLAS products, element-wise ops), the rounded
//! write-backs and the update direction by `kernels/optim/soap.cu` (bit for bit
//! [`crate::rules::soap::store`]'s and [`crate::rules::soap::step::direction`]'s given the same inputs:
//! [`SoapKernels::ema`], [`SoapKernels::weights`], [`SoapKernels::direction`]) and the new
//! eigenbases by [`crate::cuda::refresh`] (the QR power step on the device through cuSOLVER, every
//! `optim.soap.precondition_frequency` updates; a matrix's first basis on the host). A refresh
//! that reorders a basis moves v through the host. Stall counts are read once per update (it
//! synchronises). States: fp32, bf16, fp8 (E4M3, E5M2) and fp4; int8 and e8mK run on the CPU.

use crate::cuda::abi::{
    kernel_format, round_id, scale_id, SOAP_DIRECTION_ARGS_BYTES, SOAP_EMA_ARGS_BYTES, SOAP_THREADS, SOAP_WEIGHTS_ARGS_BYTES,
};
use crate::cuda::adamw::{element_address, err, launch_failed};
use crate::cuda::refresh::QrRefresh;
use crate::error::OptimError;
use crate::rules::clip::GradScale;
use crate::rules::optimizer::{check_sizes, Optimizer};
use crate::rules::soap::step::{apply_refreshes, step_tensor, Direction, Shape, SoapStore, Which};
use crate::rules::soap::store;
use crate::rules::soap::LowbitSoap;
use crate::states::format::{Rounding, StateFormat};
use crate::states::precond::precond_key;
use crate::states::quant::QuantState;
use crate::states::stalls::{Counter, StallCounts};
use crate::states::state_dict::HostStates;
use candle_core::cuda::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::{CudaDevice, DType, Device, Result, Tensor, Var};
use std::sync::Arc;

const SOAP_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/soap.fatbin"));
/// Threads per block of the SOAP kernels ([`SOAP_THREADS`]).
const THREADS: u32 = SOAP_THREADS;
/// Thread blocks per launch at most (grid-stride loops beyond).
const MAX_BLOCKS: u64 = 8192;

/// `struct EmaArgs` of soap.cu (same order).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EmaArgs {
    codes: u64,
    scales: u64,
    u: u64,
    out: u64,
    n: u64,
    key: u64,
    counts: u64,
    aux: u64,
    a: f32,
    b: f32,
    block: u32,
    rounding: i32,
    scale_kind: u32,
    zero_free: u32,
}
// SAFETY: plain `#[repr(C)]` integers and floats, passed by value as soap.cu's `EmaArgs`
unsafe impl DeviceRepr for EmaArgs {}
const _: () = assert!(std::mem::size_of::<EmaArgs>() == SOAP_EMA_ARGS_BYTES, "soap.cu SOAP_EMA_ARGS_BYTES");

/// `struct WeightsArgs` of soap.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WeightsArgs {
    p: u64,
    n: u64,
    len: u64,
    key: u64,
    counts: u64,
    lr: f32,
    decay: f32,
    rounding: i32,
    pad: u32,
}
// SAFETY: plain `#[repr(C)]` integers and floats, passed by value as soap.cu's `WeightsArgs`
unsafe impl DeviceRepr for WeightsArgs {}
const _: () = assert!(std::mem::size_of::<WeightsArgs>() == SOAP_WEIGHTS_ARGS_BYTES, "soap.cu SOAP_WEIGHTS_ARGS_BYTES");

/// `struct DirectionArgs` of soap.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DirectionArgs {
    g: u64,
    m: u64,
    v: u64,
    out: u64,
    n: u64,
    counts: u64,
    ibc1: f32,
    ibc2: f32,
    eps: f32,
    pad: u32,
}
// SAFETY: plain `#[repr(C)]` integers and floats, passed by value as soap.cu's `DirectionArgs`
unsafe impl DeviceRepr for DirectionArgs {}
const _: () = assert!(std::mem::size_of::<DirectionArgs>() == SOAP_DIRECTION_ARGS_BYTES, "soap.cu SOAP_DIRECTION_ARGS_BYTES");

/// The formats soap.cu has kernels for.
const FORMATS: [StateFormat; 6] =
    [StateFormat::Fp32, StateFormat::Bf16, StateFormat::Fp8E4M3, StateFormat::Fp8E5M2, StateFormat::Fp4E2M1, StateFormat::Fp4UE2M2];

/// One state on the device: its codes and scales (one dummy scale for unscaled formats), with
/// the host [`QuantState`] describing it (its codes current after [`DeviceState::download`]).
pub struct DeviceState {
    pub host: QuantState,
    codes: CudaSlice<u8>,
    scales: CudaSlice<f32>,
}

impl DeviceState {
    /// Upload `s` to `stream`'s device.
    ///
    /// # Errors
    /// A format without SOAP kernels (int8, e8mK), or the copy failing.
    pub fn upload(s: &QuantState, stream: &Arc<CudaStream>) -> Result<Self> {
        if !FORMATS.contains(&s.format) {
            candle_core::bail!("SOAP on the GPU keeps fp32, bf16, fp8 and fp4 states, not {} (run it on the CPU)", s.format.name());
        }
        let bytes = s.code_bytes();
        let codes = stream.clone_htod(if bytes.is_empty() { &[0u8][..] } else { &bytes }).map_err(err)?;
        let scales = stream.clone_htod(if s.scales.is_empty() { &[1.0f32][..] } else { &s.scales }).map_err(err)?;
        Ok(DeviceState { host: s.clone(), codes, scales })
    }

    /// Replace the device copy by `s` (same layout).
    fn set(&mut self, s: QuantState, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memcpy_htod(&s.code_bytes(), &mut self.codes).map_err(err)?;
        if !s.scales.is_empty() {
            stream.memcpy_htod(&s.scales, &mut self.scales).map_err(err)?;
        }
        self.host = s;
        Ok(())
    }

    /// Copy the device state into [`Self::host`] and return it.
    ///
    /// # Errors
    /// The copy failing.
    pub fn download(&mut self, stream: &Arc<CudaStream>) -> Result<&QuantState> {
        if self.host.len > 0 {
            self.host.set_code_bytes(&stream.clone_dtoh(&self.codes).map_err(err)?).map_err(err)?;
            if !self.host.scales.is_empty() {
                self.host.scales = stream.clone_dtoh(&self.scales).map_err(err)?;
            }
        }
        Ok(&self.host)
    }
}

/// A loaded kernel with its name (for the errors of its launches).
type Named = (CudaFunction, String);

/// SOAP's kernels, loaded once per device.
pub struct SoapKernels {
    stream: Arc<CudaStream>,
    /// Per format of [`FORMATS`]: blocks, amax, flat.
    ema: Vec<[Named; 3]>,
    /// FP32 and BF16 weights.
    weights: [Named; 2],
    direction: Named,
    /// Per-tensor amax and old scale (soap.cu `aux`).
    aux: CudaSlice<u32>,
}

fn grid(work: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (work.div_ceil(u64::from(THREADS)).clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device address of a contiguous F32 tensor's first element.
fn f32_address(t: &Tensor, stream: &CudaStream, what: &str) -> Result<u64> {
    if t.dtype() != DType::F32 {
        candle_core::bail!("{what}: F32 expected, got {:?}", t.dtype());
    }
    element_address(t, stream, what)
}

impl SoapKernels {
    /// Load the kernels on `dev`.
    ///
    /// # Errors
    /// The module or a function failing to load.
    pub fn load(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let module = stream.context().load_module(Ptx::from_binary(SOAP_BIN.to_vec())).map_err(err)?;
        let f = |n: String| -> Result<Named> { Ok((module.load_function(&n).map_err(err)?, n)) };
        let ema = FORMATS
            .iter()
            .map(|fmt| {
                let k = kernel_format(*fmt);
                Ok([f(format!("soap_ema_blocks_{k}"))?, f(format!("soap_ema_amax_{k}"))?, f(format!("soap_ema_flat_{k}"))?])
            })
            .collect::<Result<_>>()?;
        let weights = [f("soap_weights_f32".into())?, f("soap_weights_bf16".into())?];
        let direction = f("soap_direction".into())?;
        let aux = stream.alloc_zeros::<u32>(2).map_err(err)?;
        Ok(SoapKernels { stream, ema, weights, direction, aux })
    }

    /// `new = a * old + b * u` of every element of `s` (u: contiguous F32 of its length, on
    /// this device), written to `out` (F32, same length) and rounded into `s`
    /// ([`store::ema_write`]); updated / stalled / unchanged added to `counts[0..3]`.
    ///
    /// # Errors
    /// A tensor of another dtype, length or device, or a launch failing.
    pub fn ema(
        &mut self,
        s: &mut DeviceState,
        u: &Tensor,
        out: &Tensor,
        a: f32,
        b: f32,
        rounding: Rounding,
        key: u64,
        counts: u64,
    ) -> Result<()> {
        let n = s.host.len;
        if u.elem_count() != n || out.elem_count() != n {
            candle_core::bail!("SOAP write-back: {} and {} values for a state of {n}", u.elem_count(), out.elem_count());
        }
        let stream = self.stream.clone();
        let kernels = &self.ema[FORMATS.iter().position(|f| *f == s.host.format).expect("uploaded formats have kernels")];
        let args = EmaArgs {
            codes: s.codes.device_ptr(&stream).0,
            scales: s.scales.device_ptr(&stream).0,
            u: f32_address(u, &stream, "SOAP input")?,
            out: f32_address(out, &stream, "SOAP output")?,
            n: n as u64,
            key,
            counts,
            aux: self.aux.device_ptr(&stream).0,
            a,
            b,
            block: s.host.block as u32,
            rounding: round_id(rounding),
            scale_kind: scale_id(s.host.scale_kind),
            zero_free: u32::from(s.host.zero_free),
        };
        let launch = |(f, name): &Named, cfg: LaunchConfig| -> Result<()> {
            let mut b = stream.launch_builder(f);
            b.arg(&args);
            // SAFETY: `args` is `struct EmaArgs` of soap.cu (same layout, asserted above), its
            // addresses live device buffers of `n` elements (codes, scales, u, out) and the
            // counters and `aux` this kernel writes; the grid covers `n` with bounds checks
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_failed(name, cfg))
        };
        let pairs = (n as u64).div_ceil(2);
        match (s.host.format.is_scaled(), s.host.block) {
            (false, _) => launch(&kernels[2], grid(pairs)),
            (true, 0) => {
                stream.memset_zeros(&mut self.aux).map_err(err)?;
                launch(&kernels[1], grid(n as u64))?;
                launch(&kernels[2], grid(pairs))
            }
            (true, block) => launch(&kernels[0], grid(32 * (n as u64).div_ceil(block as u64))),
        }
    }

    /// `p = p * decay - lr * n` in place on `p`'s device buffer (F32, or BF16 rounded with
    /// `rounding` and stream `key` and counted into `counts[0..3]`; [`store::weights_write`]).
    ///
    /// # Errors
    /// A tensor of another dtype or length, or a launch failing.
    pub fn weights(&self, p: &Tensor, n: &Tensor, lr: f32, decay: f32, rounding: Rounding, key: u64, counts: u64) -> Result<()> {
        if p.elem_count() != n.elem_count() {
            candle_core::bail!("SOAP weights: {} weights, {} update values", p.elem_count(), n.elem_count());
        }
        let (f, name) = match p.dtype() {
            DType::F32 => &self.weights[0],
            DType::BF16 => &self.weights[1],
            d => candle_core::bail!("SOAP weights: unsupported dtype {d:?} (F32 or BF16)"),
        };
        let args = WeightsArgs {
            p: element_address(p, &self.stream, "SOAP weights")?,
            n: f32_address(n, &self.stream, "SOAP update")?,
            len: p.elem_count() as u64,
            key,
            counts,
            lr,
            decay,
            rounding: round_id(rounding),
            pad: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&args);
        let cfg = grid(args.len);
        // SAFETY: `args` is `struct WeightsArgs` of soap.cu (same layout, asserted above); `p`
        // and `n` are live device buffers of `len` elements of the kernel's dtypes
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_failed(name, cfg))
    }

    /// The update direction in the rotated basis ([`crate::rules::soap::step::direction`]) of the
    /// contiguous F32 tensors `g`, `m_rot`, `v` into `out` (all of one length); the zero entries
    /// of `g` added to `counts[0]`, the elements with v = 0 and m' != 0 to `counts[1]`.
    ///
    /// # Errors
    /// A tensor of another dtype or length, or a launch failing.
    pub fn direction(&self, g: &Tensor, m_rot: &Tensor, v: &Tensor, out: &Tensor, d: Direction, counts: u64) -> Result<()> {
        let n = out.elem_count();
        if [g, m_rot, v].iter().any(|t| t.elem_count() != n) {
            candle_core::bail!("SOAP direction: g, m', v and the output differ in length");
        }
        let s = &self.stream;
        let args = DirectionArgs {
            g: f32_address(g, s, "SOAP gradient")?,
            m: f32_address(m_rot, s, "SOAP rotated first moment")?,
            v: f32_address(v, s, "SOAP second moment")?,
            out: f32_address(out, s, "SOAP direction")?,
            n: n as u64,
            counts,
            ibc1: d.inv_bias_correction1,
            ibc2: d.inv_bias_correction2,
            eps: d.eps,
            pad: 0,
        };
        let (f, name) = &self.direction;
        let mut b = s.launch_builder(f);
        b.arg(&args);
        let cfg = grid(n as u64);
        // SAFETY: `args` is `struct DirectionArgs` of soap.cu (same layout, asserted above);
        // g, m', v and out are live contiguous F32 device buffers of `n` elements
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_failed(name, cfg))
    }
}

/// One tensor's SOAP states on the device.
struct TensorDevice {
    m: DeviceState,
    v: DeviceState,
    l: Option<DeviceState>,
    r: Option<DeviceState>,
    /// The bases (`n x n` F32 on the device), `None` until the first update.
    q: [Option<Tensor>; 2],
}

impl TensorDevice {
    /// The state `which` (`None`: a preconditioner this tensor does not have) and its counter
    /// group (m 0, v 1, L and R 2).
    fn state(&mut self, which: Which) -> (Option<&mut DeviceState>, usize) {
        match which {
            Which::M => (Some(&mut self.m), 0),
            Which::V => (Some(&mut self.v), 1),
            Which::L => (self.l.as_mut(), 2),
            Which::R => (self.r.as_mut(), 2),
        }
    }
}

/// Counter groups per tensor in [`CudaSoap::counts`]: m, v, L + R, BF16 weights (3 u64 each).
const GROUPS: usize = 4;
/// Counters per tensor: the groups', then zero gradients and zero v with m' != 0.
const SLOTS: usize = 3 * GROUPS + 2;

/// SOAP with states on a CUDA device: the [`Optimizer`] for `optim.kind = "soap"` there.
pub struct CudaSoap {
    /// Settings, tensor metadata, and the host copy of the states (current after
    /// [`CudaSoap::download`]).
    pub host: LowbitSoap,
    kernels: SoapKernels,
    refresh: QrRefresh,
    dev: CudaDevice,
    tensors: Vec<TensorDevice>,
    /// [`SLOTS`] counters per tensor, this update's.
    counts: CudaSlice<u64>,
    last: Option<(u64, Vec<StallCounts>)>,
}

/// The [`SoapStore`] of one tensor on the device.
struct DeviceStore<'a> {
    k: &'a mut SoapKernels,
    t: &'a mut TensorDevice,
    dev: Device,
    weights: Tensor,
    /// Device address of this tensor's counters.
    counts: u64,
    /// Elements written per group (host side: the kernels count the rest).
    elements: [u64; GROUPS],
    shape: (usize, usize),
}

impl<'a> DeviceStore<'a> {
    /// The store of tensor state `t` with weights `var`, counters at device address `at.0`,
    /// matrix shape `at.1`.
    fn new(k: &'a mut SoapKernels, t: &'a mut TensorDevice, dev: &Device, var: &Var, at: (u64, (usize, usize))) -> Self {
        DeviceStore { k, t, dev: dev.clone(), weights: var.as_tensor().clone(), counts: at.0, elements: [0; GROUPS], shape: at.1 }
    }
}

impl SoapStore for DeviceStore<'_> {
    fn basis(&self, side: usize) -> Option<Tensor> {
        self.t.q[side].clone()
    }

    fn set_basis(&mut self, side: usize, q: Tensor) -> std::result::Result<(), OptimError> {
        self.t.q[side] = Some(q.contiguous()?);
        Ok(())
    }

    fn ema(&mut self, which: Which, u: &Tensor, a: f32, b: f32, rounding: Rounding, key: u64) -> std::result::Result<Tensor, OptimError> {
        let (s, group) = self.t.state(which);
        let s = s.ok_or_else(|| OptimError::State(format!("no {which:?} preconditioner")))?;
        let u = u.contiguous()?;
        let out = Tensor::zeros(u.shape(), DType::F32, &self.dev)?;
        self.k.ema(s, &u, &out, a, b, rounding, key, self.counts + (24 * group) as u64)?;
        self.elements[group] += s.host.len as u64;
        Ok(out)
    }

    fn zero(&mut self, which: Which) -> std::result::Result<(), OptimError> {
        if let (Some(s), _) = self.t.state(which) {
            let mut z = s.host.clone();
            z.set_zero();
            s.set(z, &self.k.stream)?;
        }
        Ok(())
    }

    fn weights(&mut self, n: &Tensor, lr: f32, decay: f32, rounding: Rounding, key: u64) -> std::result::Result<(), OptimError> {
        let n = n.contiguous()?;
        self.k.weights(&self.weights, &n, lr, decay, rounding, key, self.counts + 72)?;
        if self.weights.dtype() == DType::BF16 {
            self.elements[3] += n.elem_count() as u64;
        }
        Ok(())
    }

    fn permute_v(&mut self, rows: Option<&[usize]>, cols: Option<&[usize]>) -> std::result::Result<(), OptimError> {
        let stream = self.k.stream.clone();
        let mut v = self.t.v.download(&stream)?.clone();
        store::permute(&mut v, self.shape.0, self.shape.1, rows, cols);
        self.t.v.set(v, &stream)?;
        Ok(())
    }

    fn direction(&mut self, g: &Tensor, m_rot: &Tensor, v: &Tensor, d: Direction) -> std::result::Result<Tensor, OptimError> {
        let (g, m_rot, v) = (g.contiguous()?, m_rot.contiguous()?, v.contiguous()?);
        let out = Tensor::zeros(m_rot.shape(), DType::F32, &self.dev)?;
        self.k.direction(&g, &m_rot, &v, &out, d, self.counts + (24 * GROUPS) as u64)?;
        Ok(out)
    }
}

impl CudaSoap {
    /// Upload the states of `host` to `dev`.
    ///
    /// # Errors
    /// A format without SOAP kernels, or an upload failing.
    pub fn new(host: LowbitSoap, dev: &CudaDevice) -> Result<Self> {
        let soap = &host.precond;
        let kernels = SoapKernels::load(dev)?;
        let refresh = QrRefresh::new(dev).map_err(err)?;
        let stream = dev.cuda_stream();
        let device = Device::Cuda(dev.clone());
        let up = |s: &QuantState| DeviceState::upload(s, &stream);
        let tensors = host
            .moments
            .tensors
            .iter()
            .zip(&soap.tensors)
            .map(|(t, p)| {
                let basis = |q: &Vec<f32>, n: usize| (!q.is_empty()).then(|| Tensor::from_slice(q, (n, n), &device)).transpose();
                Ok(TensorDevice {
                    m: up(&t.m)?,
                    v: up(&t.v)?,
                    l: p.l.as_ref().map(up).transpose()?,
                    r: p.r.as_ref().map(up).transpose()?,
                    q: [basis(&p.q_l, p.rows)?, basis(&p.q_r, p.cols)?],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let counts = stream.alloc_zeros::<u64>(host.moments.tensors.len().max(1) * SLOTS).map_err(err)?;
        Ok(CudaSoap { host, kernels, refresh, dev: dev.clone(), tensors, counts, last: None })
    }

    /// Copy the device states (moments, preconditioners, bases) into `self.host` and return it.
    ///
    /// # Errors
    /// A copy failing.
    pub fn download(&mut self) -> Result<&LowbitSoap> {
        let stream = self.dev.cuda_stream();
        let (moments, soap) = (&mut self.host.moments, &mut self.host.precond);
        for ((t, p), d) in moments.tensors.iter_mut().zip(&mut soap.tensors).zip(&mut self.tensors) {
            t.m = d.m.download(&stream)?.clone();
            t.v = d.v.download(&stream)?.clone();
            for (s, ds) in [(&mut p.l, &mut d.l), (&mut p.r, &mut d.r)] {
                if let (Some(s), Some(ds)) = (s, ds) {
                    *s = ds.download(&stream)?.clone();
                }
            }
            for (q, dq) in [(&mut p.q_l, &d.q[0]), (&mut p.q_r, &d.q[1])] {
                *q = dq.as_ref().map(|t| t.flatten_all()?.to_vec1::<f32>()).transpose()?.unwrap_or_default();
            }
        }
        Ok(&self.host)
    }

    /// One SOAP update of every tensor (see [`Optimizer::step`]); the counts of it are kept.
    fn step_all(
        &mut self,
        update: u64,
        lr: f64,
        scale: GradScale,
        params: &[Var],
        grads: &[Tensor],
    ) -> std::result::Result<(), OptimError> {
        check_sizes(&self.host.moments.tensors, params, grads)?;
        let Some(grad_scale) = crate::rules::clip::host_factor(scale)? else { return Ok(()) };
        let plan = self.host.moments.plan(update, lr, grad_scale)?;
        let stream = self.dev.cuda_stream();
        stream.memset_zeros(&mut self.counts).map_err(err)?;
        let base = self.counts.device_ptr(&stream).0;
        let (seed, soap, cfg) = (self.host.moments.seed, &self.host.precond, self.host.config);
        let mut elements = Vec::with_capacity(params.len());
        let mut refreshes = Vec::with_capacity(params.len());
        let dev = Device::Cuda(self.dev.clone());
        let at = |i: usize| (base + (i * SLOTS * 8) as u64, (soap.tensors[i].rows, soap.tensors[i].cols));
        for (i, (t, (var, grad))) in self.tensors.iter_mut().zip(params.iter().zip(grads)).enumerate() {
            let p = &soap.tensors[i];
            let shape = Shape { rows: p.rows, cols: p.cols, rotated: [p.l.is_some(), p.r.is_some()] };
            let keys = [precond_key(seed, update, i, 0), precond_key(seed, update, i, 1)];
            let mut s = DeviceStore::new(&mut self.kernels, t, &dev, var, at(i));
            refreshes.push(step_tensor(&mut s, shape, grad, &plan.tensors[i], keys, &cfg, update)?);
            elements.push(s.elements);
        }
        let done = self.refresh.refresh_all(&refreshes)?;
        for (i, ((t, req), res)) in self.tensors.iter_mut().zip(&refreshes).zip(done).enumerate() {
            if !req.is_empty() {
                apply_refreshes(&mut DeviceStore::new(&mut self.kernels, t, &dev, &params[i], at(i)), req, res)?;
            }
        }
        let raw = stream.clone_dtoh(&self.counts).map_err(err)?;
        let counts = raw
            .chunks_exact(SLOTS)
            .zip(&elements)
            .map(|(c, e)| {
                let kind = |g: usize| Counter { updated: c[3 * g], stalled: c[3 * g + 1], unchanged: c[3 * g + 2], elements: e[g] };
                let z = &c[3 * GROUPS..];
                StallCounts { m: kind(0), v: kind(1), w: kind(3), zero_grad: z[0], zero_v: z[1], precond: kind(2) }
            })
            .collect();
        self.last = Some((update, counts));
        Ok(())
    }
}

/// SOAP behind the trait: the parameters' own device buffers updated in place, the counts of
/// each update read at its end.
impl Optimizer for CudaSoap {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> std::result::Result<(), OptimError> {
        self.step_all(step, lr, scale, params, grads)
    }

    fn measured_counts(&mut self, step: u64) -> std::result::Result<Vec<StallCounts>, OptimError> {
        match self.last.take() {
            Some((s, c)) if s == step => Ok(c),
            _ => Err(OptimError::State(format!("stall counts of step {step} were not kept (SOAP keeps only the last step's)"))),
        }
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.host.moments.observe(step, total);
    }

    fn last_adaptive_reset(&self) -> Option<u64> {
        self.host.moments.last_adaptive_reset()
    }

    fn states(&mut self) -> std::result::Result<HostStates<'_>, OptimError> {
        let host = self.download()?;
        Ok(HostStates { moments: &host.moments, precond: Some(&host.precond) })
    }
}
