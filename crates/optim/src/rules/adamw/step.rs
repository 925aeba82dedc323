//! The CPU reference AdamW step on one parameter tensor: the oracle the CUDA kernel
//! (`kernels/optim/adamw.cu`) matches bit for bit. Same names, same step order:
//! decode -> m -> v -> bias correction -> decay -> update -> encode.

use crate::states::format::scale::ScaleKind;
use crate::states::format::{bf16, dither, int8, precision, scale, Rounding, StateFormat};
use crate::states::quant::{decode_code, read_code, read_code16, Codes, QuantState};
use crate::states::rng::{element_bits, random_bits};
use crate::states::stalls::{Counter, StallCounts};
use rayon::prelude::*;

/// Elements per parallel work item for unscaled formats and the moment pass.
const CHUNK: usize = 8192;

/// Per-step, per-tensor FP32 constants, computed once on the host in the update's plan
/// ([`crate::rules::step_plan::StepPlan`]), so CPU and GPU use the very same bits. See the crate
/// docs for the equations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepScalars {
    /// Factor applied to the raw gradient first (clipping by global norm and 1/accumulation
    /// steps folded into one number): g = grad * grad_scale.
    pub grad_scale: f32,
    /// Learning rate at this step.
    pub lr: f32,
    /// b1, b2.
    pub beta1: f32,
    pub beta2: f32,
    /// 1 - b1, 1 - b2 (computed in f64, rounded once).
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
    /// AdamW epsilon.
    pub eps: f32,
    /// Decoupled weight decay factor 1 - lr * wd (1 for tensors without decay).
    pub decay: f32,
    /// Inverse bias corrections 1 / (1 - b1^t_m) and 1 / (1 - b2^t_v), computed in f64 and
    /// rounded once (t counted since the state's last reset, or since step 1 with
    /// `bias_correction = "continue"`). Multiplying by them replaces two divisions per element.
    pub inv_bias_correction1: f32,
    pub inv_bias_correction2: f32,
    /// Zero the state before this step's update.
    pub reset_m: bool,
    pub reset_v: bool,
    /// With `reset_v` (and not `reset_m`): elements whose gradient is 0 keep their stored v
    /// (`optim.states.v_reset_idle = "keep"`).
    pub keep_idle_v: bool,
    /// Simulated stalling (the paper's section 3.3; [`crate::states::config::skip_threshold`]): element
    /// `i` keeps its stored m when the low 32 bits of draw `i` of the `skip` stream are below
    /// `skip_m`, its stored v when the high 32 bits are below `skip_v` (0 = never; 0 during the
    /// warmup).
    pub skip_m: u32,
    pub skip_v: u32,
}

/// Random stream keys of one tensor at one step (`rng::stream_key` per state kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepKeys {
    pub m: u64,
    pub v: u64,
    pub w: u64,
    /// Simulated stalling's stream ([`StepScalars::skip_m`]).
    pub skip: u64,
    /// With dither (`Rounding::Dither`): the stream key of the write the update reads m / v
    /// from (the previous update's `m` / `v` key), so that the read moves each stored value
    /// back by its block's draw ([`crate::states::format::dither`]); `None`: read as stored
    /// (no dither, the first update, or a state zeroed by a reset before this update).
    pub m_read: Option<u64>,
    pub v_read: Option<u64>,
}

/// Which write-backs of one state simulated stalling skips ([`StepScalars::skip_m`]): element
/// `i` (whole-tensor index) when bits `shift .. shift + 32` of draw `i` of stream `key` are
/// below `threshold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skip {
    pub key: u64,
    pub threshold: u32,
    /// 0 for m, 32 for v.
    pub shift: u32,
}

impl Skip {
    /// No element skips.
    pub const NEVER: Skip = Skip { key: 0, threshold: 0, shift: 0 };

    /// Whether element `i`'s write-back is skipped.
    #[inline(always)]
    pub fn skips(&self, i: u64) -> bool {
        self.threshold != 0 && ((random_bits(self.key, i) >> self.shift) as u32) < self.threshold
    }
}

/// Rounding of each write-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roundings {
    pub m: Rounding,
    pub v: Rounding,
    /// BF16 weights (ignored for FP32 weights).
    pub w: Rounding,
}

/// Parameter storage, updated in place.
pub enum Weights<'a> {
    /// FP32 weights: written back exactly.
    F32(&'a mut [f32]),
    /// BF16 weights (bit patterns): rounded with `Roundings::w`, stalls counted.
    Bf16(&'a mut [u16]),
}

/// New FP32 moments from the raw gradient and the decoded old moments.
/// g = grad*grad_scale ; m = b1*m + (1-b1)*g ; v = b2*v + (1-b2)*g^2 (no FMA).
#[inline(always)]
pub fn moments(grad: f32, m_old: f32, v_old: f32, h: &StepScalars) -> (f32, f32) {
    let g = grad * h.grad_scale;
    let m = h.beta1 * m_old + h.one_minus_beta1 * g;
    let v = h.beta2 * v_old + h.one_minus_beta2 * (g * g);
    (m, v)
}

/// New FP32 weight from the unrounded FP32 moments:
/// p = p*(1 - lr*wd) - lr * (m * (1/bc1)) / (sqrt(v * (1/bc2)) + eps).
#[inline(always)]
pub fn param_update(p: f32, m: f32, v: f32, h: &StepScalars) -> f32 {
    let m_hat = m * h.inv_bias_correction1;
    let v_hat = v * h.inv_bias_correction2;
    let denom = v_hat.sqrt() + h.eps;
    p * h.decay - h.lr * (m_hat / denom)
}

/// Reusable FP32 buffers for the new moments (grown to the largest tensor).
#[derive(Debug, Default)]
pub struct Scratch {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// One AdamW step on one tensor, or on a contiguous shard of one (ZeRO-1): updates `w`, `m`,
/// `v` in place, returns the stall counts.
///
/// `g` is the FP32 gradient (same length as the weights). `first` is the index, in the whole
/// tensor, of the slices' first element (0 for a whole tensor): the random bits of element
/// `j` of the slices are those of element `first + j` of the tensor, so a shard steps exactly
/// as the same elements of the whole tensor do. Panics if lengths differ, or if `first` is
/// not on a scale-block boundary of a block-scaled state.
pub fn step_tensor(
    w: Weights,
    g: &[f32],
    m: &mut QuantState,
    v: &mut QuantState,
    h: &StepScalars,
    r: &Roundings,
    keys: &StepKeys,
    first: usize,
    scratch: &mut Scratch,
) -> StallCounts {
    let n = g.len();
    assert!(m.len == n && v.len == n, "state length mismatch");
    if h.reset_m {
        m.set_zero();
    }
    if h.reset_v && h.keep_idle_v {
        v.zero_where(|i| g[i] * h.grad_scale != 0.0);
    } else if h.reset_v {
        v.set_zero();
    }
    scratch.m.resize(n, 0.0);
    scratch.v.resize(n, 0.0);
    let (mm, vm) = (m.reader(first, keys.m_read), v.reader(first, keys.v_read));
    let (mm, vm) = (&mm, &vm);
    // Pass 1: decode -> m -> v -> bias correction -> decay -> update (weights written here),
    // counting the zero gradients (g == 0 after grad_scale) and the updates with v = 0, m != 0.
    let chunks = g.par_chunks(CHUNK).zip(scratch.m.par_chunks_mut(CHUNK).zip(scratch.v.par_chunks_mut(CHUNK)));
    let pass1 = match w {
        Weights::F32(p) => p
            .par_chunks_mut(CHUNK)
            .zip(chunks)
            .enumerate()
            .map(|(c, (p, (g, (ms, vs))))| {
                let mut out = Pass1::default();
                for j in 0..p.len() {
                    let l = c * CHUNK + j;
                    let (m1, v1) = moments(g[j], mm.get(l), vm.get(l), h);
                    out.count(g[j] * h.grad_scale, m1, v1);
                    ms[j] = m1;
                    vs[j] = v1;
                    p[j] = param_update(p[j], m1, v1, h);
                }
                out
            })
            .reduce(Pass1::default, Pass1::add),
        Weights::Bf16(p) => p
            .par_chunks_mut(CHUNK)
            .zip(chunks)
            .enumerate()
            .map(|(c, (p, (g, (ms, vs))))| {
                let mut out = Pass1::default();
                for j in 0..p.len() {
                    let l = c * CHUNK + j; // index in the slices; `first + l` in the tensor
                    let (m1, v1) = moments(g[j], mm.get(l), vm.get(l), h);
                    out.count(g[j] * h.grad_scale, m1, v1);
                    ms[j] = m1;
                    vs[j] = v1;
                    let old = bf16::decode(p[j]);
                    let new = param_update(old, m1, v1, h);
                    let code = bf16::encode(new, r.w, element_bits(keys.w, (first + l) as u64, 16));
                    out.w.add(new != old, code == p[j]);
                    p[j] = code;
                }
                out
            })
            .reduce(Pass1::default, Pass1::add),
    };
    // Pass 2: encode (rounded write-back) with stall counting.
    let m_count = write_back(m, &scratch.m[..n], r.m, keys.m, keys.m_read, first, Skip { key: keys.skip, threshold: h.skip_m, shift: 0 });
    let v_count = write_back(v, &scratch.v[..n], r.v, keys.v, keys.v_read, first, Skip { key: keys.skip, threshold: h.skip_v, shift: 32 });
    StallCounts { m: m_count, v: v_count, w: pass1.w, zero_grad: pass1.zero_grad, zero_v: pass1.zero_v, ..Default::default() }
}

/// The counts of pass 1 over a chunk: BF16 weights, zero gradients, updates with v = 0 and
/// m != 0 ([`StallCounts`]).
#[derive(Default)]
struct Pass1 {
    w: Counter,
    zero_grad: u64,
    zero_v: u64,
}

impl Pass1 {
    /// Count one element's scaled gradient `g` and new FP32 moments `m`, `v`.
    #[inline(always)]
    fn count(&mut self, g: f32, m: f32, v: f32) {
        self.zero_grad += u64::from(g == 0.0);
        self.zero_v += u64::from(v == 0.0 && m != 0.0);
    }

    fn add(mut self, o: Pass1) -> Pass1 {
        self.w += o.w;
        self.zero_grad += o.zero_grad;
        self.zero_v += o.zero_v;
        self
    }
}

fn sum_counters(it: impl ParallelIterator<Item = Counter>) -> Counter {
    it.reduce(Counter::default, |mut a, b| {
        a += b;
        a
    })
}

/// Round the new FP32 values `new` into `state`, counting stalls against the old values
/// ([`crate::states::stalls`]: an element is updated when its new value differs from the decoded old
/// one, unchanged when its stored bits (unscaled formats) or code (scaled formats) are).
/// `first`: the whole-tensor index of `state`'s first element (see [`step_tensor`]). An element
/// that `skip` skips keeps its stored bits or code (a block-scaled zero-free v no lower than
/// code 1 in a non-zero block), counted as any unchanged element. With dither, `key`'s draw of
/// each block drives the rounding ([`dither::block_bits`], [`dither::signed_bits`]) and
/// `read_key` (the write the old values come from, [`StepKeys::m_read`]) how the old values
/// read, against which an element counts as updated.
pub fn write_back(
    state: &mut QuantState,
    new: &[f32],
    rounding: Rounding,
    key: u64,
    read_key: Option<u64>,
    first: usize,
    skip: Skip,
) -> Counter {
    let format = state.format;
    let signed = state.signed;
    let zero_free = state.zero_free;
    let kind = state.scale_kind;
    let block = state.block_len();
    // dither: the old values' read offsets per draw, and each element's rounding bits
    let db = state.dither_block();
    let offsets = read_key.map(|k| state.read_offsets(first, k));
    let old_offset = |j: usize| offsets.as_ref().map(|o| o.at(j));
    let bits = |i: u64, x: f32, width: u32| match rounding {
        Rounding::Dither => dither::signed_bits(format, dither::block_bits(key, i / db as u64), x),
        _ => element_bits(key, i, width),
    };
    match &mut state.codes {
        Codes::F32(c) => sum_counters(c.par_chunks_mut(CHUNK).zip(new.par_chunks(CHUNK)).enumerate().map(|(k, (c, x))| {
            let mut cnt = Counter::default();
            for (j, (c, &x)) in c.iter_mut().zip(x).enumerate() {
                // written back exactly: unchanged when the bits are (a NaN never is)
                let code = if skip.skips((first + k * CHUNK + j) as u64) { c.to_bits() } else { x.to_bits() };
                cnt.add(x != *c, code == c.to_bits() && !x.is_nan());
                *c = f32::from_bits(code);
            }
            cnt
        })),
        Codes::Bf16(c) => sum_counters(c.par_chunks_mut(CHUNK).zip(new.par_chunks(CHUNK)).enumerate().map(|(k, (c, x))| {
            let mut cnt = Counter::default();
            for (j, (c, &x)) in c.iter_mut().zip(x).enumerate() {
                let l = k * CHUNK + j;
                let i = (first + l) as u64;
                let code = match format {
                    _ if skip.skips(i) => *c,
                    StateFormat::E8m(b) => precision::encode(x, b as u32, rounding, bits(i, x, 32)),
                    _ => bf16::encode(x, rounding, bits(i, x, 16)),
                };
                let old = old_offset(l).map_or_else(|| bf16::decode(*c), |d| read_code16(format, signed, *c, d));
                cnt.add(x != old, code == *c);
                *c = code;
            }
            cnt
        })),
        Codes::Bytes(c) => {
            let bytes_per_block = if format.bits() == 4 { block.div_ceil(2) } else { block };
            assert!(format.bits() != 4 || block.is_multiple_of(2) || block >= new.len(), "fp4 block must be even");
            assert!(first.is_multiple_of(block), "a shard of a block-scaled state starts on a block boundary");
            sum_counters(c.par_chunks_mut(bytes_per_block).zip(state.scales.par_iter_mut()).zip(new.par_chunks(block)).enumerate().map(
                |(b, ((codes, scale), x))| {
                    let at = (first + b * block) as u64;
                    let dither = match rounding {
                        Rounding::Dither => Some(dither::block_bits(key, at / db as u64)),
                        _ => None,
                    };
                    let write = BlockWrite { rounding, key, dither, old_offset: old_offset(b * block) };
                    encode_block(format, signed, zero_free, kind, codes, scale, x, &write, at, skip)
                },
            ))
        }
    }
}

/// How [`encode_block`] rounds a block and reads its old codes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockWrite {
    /// The rounding of the write-back.
    pub rounding: Rounding,
    /// The stream key of the write (stochastic rounding's per-element draws).
    pub key: u64,
    /// Dither: the block's draw ([`dither::block_bits`]); `None` for the other roundings.
    pub dither: Option<u64>,
    /// The read offset of the old codes ([`dither::read_offset`]), `None`: read as stored.
    pub old_offset: Option<f32>,
}

impl BlockWrite {
    /// Round-to-nearest or stochastic rounding with stream `key`, old codes read as stored.
    pub fn plain(rounding: Rounding, key: u64) -> BlockWrite {
        BlockWrite { rounding, key, dither: None, old_offset: None }
    }
}

/// Encode one scaled block: compute the new scale (`kind`, [`scale::block_scale`]; int8:
/// absmax), round every element, count stalls by code. `first` is the tensor index of the
/// block's first element (the RNG counter). `zero_free` ([`QuantState::zero_free`]): when the
/// block's amax is non-zero, a code that would decode to 0 becomes code 1, the grid's smallest
/// positive value (v only: unsigned values, so zero is code 0 in every v map). An element that
/// `skip` skips keeps its old code (under the same floor).
#[inline]
pub fn encode_block(
    format: StateFormat,
    signed: bool,
    zero_free: bool,
    kind: ScaleKind,
    codes: &mut [u8],
    scale: &mut f32,
    x: &[f32],
    write: &BlockWrite,
    first: u64,
    skip: Skip,
) -> Counter {
    let BlockWrite { rounding, key, dither, old_offset } = *write;
    let bits = |i: u64, x: f32| match dither {
        Some(d) => dither::signed_bits(format, d, x),
        None => element_bits(key, i, 32),
    };
    let old_value = |code: u8, scale: f32| {
        old_offset.map_or_else(|| decode_code(format, code, scale, signed), |d| read_code(format, signed, code, scale, d))
    };
    let old_scale = *scale;
    let amax = scale::amax(x.iter().copied());
    let floor = u8::from(zero_free && amax > 0.0);
    let mut cnt = Counter::default();
    let packed = format.bits() == 4;
    let get = |codes: &[u8], j: usize| if packed { (codes[j / 2] >> (4 * (j % 2))) & 0xF } else { codes[j] };
    match format.minifloat() {
        Some(mf) => {
            let s = scale::block_scale(kind, amax, mf.max_finite);
            for (j, &xj) in x.iter().enumerate() {
                let old_code = get(codes, j);
                let old = old_value(old_code, old_scale);
                let i = first + j as u64;
                let y = xj * s.factor;
                let code = if skip.skips(i) { old_code } else { mf.encode(y, rounding, bits(i, y)) }.max(floor);
                cnt.add(xj != old, code == old_code);
                put(codes, j, code, packed);
            }
            *scale = s.scale;
        }
        None => {
            let table = int8::dynamic_map(signed);
            let absmax = if amax > 0.0 { amax } else { 1.0 };
            let (pre, inv) = int8::normalizer(absmax);
            for (j, &xj) in x.iter().enumerate() {
                let old_code = codes[j];
                let old = old_value(old_code, old_scale);
                let i = first + j as u64;
                let y = xj * pre * inv;
                let code = if skip.skips(i) { old_code } else { table.encode(y, rounding, bits(i, y)) }.max(floor);
                cnt.add(xj != old, code == old_code);
                codes[j] = code;
            }
            *scale = absmax;
        }
    }
    cnt
}

#[inline(always)]
fn put(codes: &mut [u8], j: usize, code: u8, packed: bool) {
    if packed {
        let sh = 4 * (j % 2);
        codes[j / 2] = (codes[j / 2] & !(0xF << sh)) | (code << sh);
    } else {
        codes[j] = code;
    }
}
