//! Storage of one optimizer state tensor (m or v) in its low-precision format.
//!
//! Codes are kept exactly as the format stores them (FP32 words, BF16 halves, one byte per
//! FP8/int8 element, two FP4 codes per byte), plus one FP32 scale per block for scaled
//! formats. Checkpoints save these bytes as they are (never dequantized), and the CUDA
//! kernels read and write the same layout.

use crate::error::OptimError;
use crate::states::format::scale::ScaleKind;
use crate::states::format::{bf16, dither, int8, num_scales, StateFormat};

/// Encoded element storage.
#[derive(Debug, Clone, PartialEq)]
pub enum Codes {
    /// FP32 words (format `fp32`).
    F32(Vec<f32>),
    /// BF16 bit patterns (format `bf16`, and the 16-bit containers of `e8m1`..`e8m6`).
    Bf16(Vec<u16>),
    /// One byte per element (FP8, int8) or two FP4 codes per byte (low nibble first).
    Bytes(Vec<u8>),
}

/// One state tensor of `len` elements: codes plus per-block scales.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantState {
    /// Storage format.
    pub format: StateFormat,
    /// Elements per scale block; 0 = one scale for the whole tensor.
    pub block: usize,
    /// Number of elements.
    pub len: usize,
    /// Encoded elements.
    pub codes: Codes,
    /// FP32 scales, one per block (empty for fp32/bf16). FP8/FP4: per [`Self::scale_kind`];
    /// int8: absmax.
    pub scales: Vec<f32>,
    /// How FP8/FP4 block scales follow the block's largest value (`amax` or `pow2`,
    /// [`crate::states::format::scale`]); int8 and unscaled formats ignore it.
    pub scale_kind: ScaleKind,
    /// Whether the state may be negative (m: true, v: false); selects int8's map.
    pub signed: bool,
    /// Second moment without zero (`optim.states.v_zero = "exclude"`, docs/numerics.md): in a block
    /// whose new amax is non-zero, no element encodes to 0; values below the grid's smallest
    /// positive value (code 1: FP8/FP4 smallest subnormal, int8 unsigned map entry 1) encode to
    /// it, under either rounding. An all-zero block still stores exact 0. Only ever true for
    /// unsigned (v) states of block-scaled formats.
    pub zero_free: bool,
}

impl QuantState {
    /// A zero-initialised state (every element decodes to +0, `pow2` scales, all 1). `signed`
    /// is true for the first moment, false for the second.
    pub fn zeros(format: StateFormat, len: usize, block: usize, signed: bool) -> Self {
        let codes = match format {
            StateFormat::Fp32 => Codes::F32(vec![0.0; len]),
            StateFormat::Bf16 | StateFormat::E8m(_) => Codes::Bf16(vec![0; len]),
            f => Codes::Bytes(vec![0; (len * f.bits() as usize).div_ceil(8)]),
        };
        let mut s = QuantState {
            format,
            block,
            len,
            codes,
            scales: vec![1.0; num_scales(format, len, block)],
            scale_kind: ScaleKind::Pow2,
            signed,
            zero_free: false,
        };
        s.set_zero();
        s
    }

    /// The same state with the second-moment floor on or off ([`Self::zero_free`]); it is
    /// only switched on for unsigned states of block-scaled formats.
    pub fn with_zero_free(mut self, on: bool) -> Self {
        self.zero_free = on && !self.signed && self.format.is_scaled();
        self
    }

    /// The same fresh state with FP8/FP4 scales of kind `kind` (an `amax` state's zero scales
    /// are 0: [`Self::set_zero`]).
    pub fn with_scale_kind(mut self, kind: ScaleKind) -> Self {
        self.scale_kind = kind;
        let zero = self.zero_scale();
        self.scales.fill(zero);
        self
    }

    /// A zero state of `len` elements with this one's settings (format, block, scale kind,
    /// signedness, floor): e.g. the layout of a peer's ZeRO-1 shard.
    pub fn zeros_like(&self, len: usize) -> Self {
        QuantState::zeros(self.format, len, self.block, self.signed).with_scale_kind(self.scale_kind).with_zero_free(self.zero_free)
    }

    /// The scale of an all-zero block: 0 for `amax` FP8/FP4 states, else 1.
    fn zero_scale(&self) -> f32 {
        if self.scale_kind == ScaleKind::Amax && self.format.minifloat().is_some() {
            0.0
        } else {
            1.0
        }
    }

    /// Elements per block as used for indexing (the whole tensor when `block == 0`).
    pub fn block_len(&self) -> usize {
        if self.block == 0 {
            self.len.max(1)
        } else {
            self.block
        }
    }

    /// Elements per dither draw ([`dither`]): the block size, or for one scale per tensor
    /// (`block == 0`) the whole tensor, whatever shard of it this state holds (`usize::MAX`:
    /// every element index falls in draw 0).
    pub fn dither_block(&self) -> usize {
        if self.block == 0 {
            usize::MAX
        } else {
            self.block
        }
    }

    /// Reset every element to +0 (a state reset). Scales go back to those of an all-zero block
    /// (1; 0 for an `amax` FP8/FP4 state).
    pub fn set_zero(&mut self) {
        match &mut self.codes {
            Codes::F32(c) => c.fill(0.0),
            Codes::Bf16(c) => c.fill(0),
            Codes::Bytes(c) if self.format == StateFormat::Int8 => c.fill(int8::dynamic_map(self.signed).zero_index()),
            Codes::Bytes(c) => c.fill(0),
        }
        let zero = self.zero_scale();
        self.scales.fill(zero);
    }

    /// Reset the elements `i` with `which(i)` to +0, keeping the others and every scale (a
    /// reset that spares some elements: `optim.states.v_reset_idle = "keep"`).
    pub fn zero_where(&mut self, which: impl Fn(usize) -> bool) {
        let zero = if self.format == StateFormat::Int8 { int8::dynamic_map(self.signed).zero_index() } else { 0 };
        let nibbles = self.format.bits() == 4;
        match &mut self.codes {
            Codes::F32(c) => c.iter_mut().enumerate().filter(|(i, _)| which(*i)).for_each(|(_, x)| *x = 0.0),
            Codes::Bf16(c) => c.iter_mut().enumerate().filter(|(i, _)| which(*i)).for_each(|(_, x)| *x = 0),
            Codes::Bytes(c) if nibbles => (0..self.len).filter(|&i| which(i)).for_each(|i| c[i / 2] &= !(0xF << (4 * (i % 2)))),
            Codes::Bytes(c) => c.iter_mut().enumerate().filter(|(i, _)| which(*i)).for_each(|(_, x)| *x = zero),
        }
    }

    /// The raw code of element `i` (FP8/FP4/int8 only).
    #[inline]
    pub fn code(&self, i: usize) -> u8 {
        match &self.codes {
            Codes::Bytes(c) if self.format.bits() == 4 => (c[i / 2] >> (4 * (i % 2))) & 0xF,
            Codes::Bytes(c) => c[i],
            _ => panic!("code() on an unscaled format"),
        }
    }

    /// Decoded FP32 value of element `i` (code times its block scale).
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match &self.codes {
            Codes::F32(c) => c[i],
            Codes::Bf16(c) => bf16::decode(c[i]),
            Codes::Bytes(_) => {
                let scale = self.scales[i / self.block_len()];
                decode_code(self.format, self.code(i), scale, self.signed)
            }
        }
    }

    /// Element `i` read with the dither of the write that stored it moved back by `d` grid
    /// steps ([`dither::read_offset`] of its block; docs in [`dither`]): FP32 states are exact
    /// (read as stored).
    #[inline]
    pub fn get_dithered(&self, i: usize, d: f32) -> f32 {
        match &self.codes {
            Codes::F32(c) => c[i],
            Codes::Bf16(c) => read_code16(self.format, self.signed, c[i], d),
            Codes::Bytes(_) => read_code(self.format, self.signed, self.code(i), self.scales[i / self.block_len()], d),
        }
    }

    /// How an update reads this state, the state of elements `first ..` of its tensor: with
    /// `dither_key` (the stream key of the write being read, [`dither`]) each element moved
    /// back by its block's draw, else as stored ([`Self::get`]).
    pub fn reader(&self, first: usize, dither_key: Option<u64>) -> Reader<'_> {
        Reader { state: self, offsets: dither_key.map(|key| self.read_offsets(first, key)) }
    }

    /// The dither read offsets ([`dither::read_offset`]) of this state, the state of elements
    /// `first ..` of its tensor, for the write of stream `key`: one per draw its elements touch.
    pub fn read_offsets(&self, first: usize, key: u64) -> ReadOffsets {
        let bl = self.dither_block();
        let offsets = (first / bl..(first + self.len).div_ceil(bl))
            .map(|b| dither::read_offset(self.format, dither::block_bits(key, b as u64)))
            .collect();
        ReadOffsets { skew: first % bl, bl, offsets }
    }

    /// All decoded values.
    pub fn decode_all(&self) -> Vec<f32> {
        (0..self.len).map(|i| self.get(i)).collect()
    }

    /// Bytes of storage (codes + scales).
    pub fn bytes(&self) -> usize {
        self.format.storage_bytes(self.len, self.block)
    }

    /// The codes as little-endian bytes (checkpoint layout).
    pub fn code_bytes(&self) -> Vec<u8> {
        match &self.codes {
            Codes::F32(c) => c.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Codes::Bf16(c) => c.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Codes::Bytes(c) => c.clone(),
        }
    }

    /// Restore codes from [`Self::code_bytes`] output; errors on a length mismatch.
    pub fn set_code_bytes(&mut self, bytes: &[u8]) -> Result<(), OptimError> {
        let want = (self.len * self.format.bits() as usize).div_ceil(8);
        if bytes.len() != want {
            return Err(OptimError::State(format!(
                "{} state of {} elements needs {want} code bytes, got {}",
                self.format.name(),
                self.len,
                bytes.len()
            )));
        }
        self.codes = match self.format {
            StateFormat::Fp32 => Codes::F32(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()),
            StateFormat::Bf16 | StateFormat::E8m(_) => {
                Codes::Bf16(bytes.chunks_exact(2).map(|b| u16::from_le_bytes(b.try_into().unwrap())).collect())
            }
            _ => Codes::Bytes(bytes.to_vec()),
        };
        Ok(())
    }
}

impl QuantState {
    /// Elements `range` of this state as a state of their own (a ZeRO-1 shard), codes and
    /// scales copied as stored. A block-scaled state is cut on block boundaries only (the
    /// range starts on one and ends on one or at the end), so every scale stays whole; with
    /// one scale for the whole tensor (`block == 0`) only the whole range or an empty one.
    ///
    /// # Errors
    /// A range out of bounds or cut inside a block, naming both.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Result<QuantState, OptimError> {
        let (a, b) = (range.start, range.end);
        if a > b || b > self.len {
            return Err(OptimError::State(format!("element range {a}..{b} is outside the state's {} elements", self.len)));
        }
        if a == b {
            let scales = vec![self.zero_scale(); num_scales(self.format, 0, self.block)];
            return Ok(QuantState { codes: self.empty_codes(), scales, ..self.clone_settings() });
        }
        let scales = if self.format.is_scaled() {
            let bl = self.block_len();
            if !a.is_multiple_of(bl) || !(b.is_multiple_of(bl) || b == self.len) {
                return Err(OptimError::State(format!(
                    "element range {a}..{b} cuts a scale block of {bl} elements ({} state of {} elements)",
                    self.format.name(),
                    self.len
                )));
            }
            self.scales[a / bl..b.div_ceil(bl)].to_vec()
        } else {
            Vec::new()
        };
        let codes = match &self.codes {
            Codes::F32(c) => Codes::F32(c[a..b].to_vec()),
            Codes::Bf16(c) => Codes::Bf16(c[a..b].to_vec()),
            Codes::Bytes(c) if self.format.bits() == 4 => Codes::Bytes(c[a / 2..b.div_ceil(2)].to_vec()),
            Codes::Bytes(c) => Codes::Bytes(c[a..b].to_vec()),
        };
        Ok(QuantState { len: b - a, codes, scales, ..self.clone_settings() })
    }

    /// The state made of `parts` in order (the inverse of [`Self::slice`] over consecutive
    /// ranges); empty parts are skipped.
    ///
    /// # Errors
    /// No non-empty part, parts of different formats or block sizes, or an FP4 part of odd
    /// length before the last (its codes would not start on a byte).
    pub fn concat(parts: &[&QuantState]) -> Result<QuantState, OptimError> {
        let parts: Vec<&QuantState> = parts.iter().copied().filter(|p| p.len > 0).collect();
        let head = *parts.first().ok_or_else(|| OptimError::State("no non-empty state to concatenate".into()))?;
        let mut out = QuantState { codes: head.empty_codes(), ..head.clone_settings() };
        for (k, p) in parts.iter().enumerate() {
            if (p.format, p.block, p.signed, p.scale_kind) != (head.format, head.block, head.signed, head.scale_kind) {
                return Err(OptimError::State(format!(
                    "cannot concatenate a {} state with a {} state",
                    p.format.name(),
                    head.format.name()
                )));
            }
            if head.format.bits() == 4 && k + 1 < parts.len() && p.len % 2 == 1 {
                return Err(OptimError::State(format!(
                    "fp4 part {k} has an odd length {}: its successor would not start on a byte",
                    p.len
                )));
            }
            match (&mut out.codes, &p.codes) {
                (Codes::F32(o), Codes::F32(c)) => o.extend_from_slice(c),
                (Codes::Bf16(o), Codes::Bf16(c)) => o.extend_from_slice(c),
                (Codes::Bytes(o), Codes::Bytes(c)) => o.extend_from_slice(c),
                _ => unreachable!("same format, same code storage"),
            }
            out.scales.extend_from_slice(&p.scales);
            out.len += p.len;
        }
        Ok(out)
    }

    /// A zero-length state with this one's settings (format, block, scale kind, signedness,
    /// floor) and placeholder codes.
    fn clone_settings(&self) -> QuantState {
        QuantState {
            format: self.format,
            block: self.block,
            len: 0,
            codes: Codes::F32(Vec::new()),
            scales: Vec::new(),
            scale_kind: self.scale_kind,
            signed: self.signed,
            zero_free: self.zero_free,
        }
    }

    /// No codes, in this state's code storage.
    fn empty_codes(&self) -> Codes {
        match &self.codes {
            Codes::F32(_) => Codes::F32(Vec::new()),
            Codes::Bf16(_) => Codes::Bf16(Vec::new()),
            Codes::Bytes(_) => Codes::Bytes(Vec::new()),
        }
    }
}

/// The dither read offsets of a state's elements ([`QuantState::read_offsets`]).
pub struct ReadOffsets {
    /// The state's first element's position in its draw's block, and the block length.
    skew: usize,
    bl: usize,
    /// One per draw the state's elements touch, in order.
    offsets: Vec<f32>,
}

impl ReadOffsets {
    /// The read offset of the state's element `i`.
    #[inline(always)]
    pub fn at(&self, i: usize) -> f32 {
        self.offsets[(self.skew + i) / self.bl]
    }
}

/// A state as one update reads it ([`QuantState::reader`]).
pub struct Reader<'a> {
    state: &'a QuantState,
    /// Read offsets (dither), or `None` (read as stored).
    offsets: Option<ReadOffsets>,
}

impl Reader<'_> {
    /// Element `i` of the slice as the update reads it.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        match &self.offsets {
            None => self.state.get(i),
            Some(o) => self.state.get_dithered(i, o.at(i)),
        }
    }
}

/// A BF16 / `e8mK` container `h` read with dither offset `d` ([`QuantState::get_dithered`]):
/// NaN and Inf read as stored, and so does an unsigned (v) state's zero.
#[inline]
pub fn read_code16(format: StateFormat, signed: bool, h: u16, d: f32) -> f32 {
    let unit = match format {
        StateFormat::E8m(k) => 1u32 << (7 - k as u32),
        _ => 1,
    };
    let (k, negative) = ((h & 0x7FFF) as u32, h & 0x8000 != 0);
    if k >= 0x7F80 || (k == 0 && !signed) {
        return bf16::decode(h);
    }
    dither::undither_sign_magnitude(|j| bf16::decode(j as u16), k, 0x7F80 - unit, unit, negative, d)
}

/// An FP8/FP4/int8 code read with its block scale and dither offset `d`
/// ([`QuantState::get_dithered`]): NaN and Inf (E5M2) read as stored, and so does an unsigned
/// (v) state's zero; beyond the grid's ends the last spacing is extended.
#[inline]
pub fn read_code(format: StateFormat, signed: bool, code: u8, scale: f32, d: f32) -> f32 {
    match format.minifloat() {
        Some(mf) => {
            let (k, negative) = mf.split(code);
            if !mf.decode(code).is_finite() || (k == 0 && !signed) {
                return mf.decode(code) * scale;
            }
            dither::undither_sign_magnitude(|j| mf.decode(j as u8), k as u32, mf.max_code as u32, 1, negative, d) * scale
        }
        None => {
            let t = int8::dynamic_map(signed);
            let c = code as usize;
            if !signed && c == t.zero_index() as usize {
                return 0.0;
            }
            let q = t[c];
            let down = if c == 0 { q - (t[1] - q) } else { t[c - 1] };
            let up = if c == 255 { q + (q - t[254]) } else { t[c + 1] };
            dither::undither(q, down, up, d) * scale
        }
    }
}

/// Decode one FP8/FP4/int8 code with its block scale.
#[inline(always)]
pub fn decode_code(format: StateFormat, code: u8, scale: f32, signed_map: bool) -> f32 {
    match format.minifloat() {
        Some(mf) => mf.decode(code) * scale,
        None => int8::dynamic_map(signed_map)[code as usize] * scale,
    }
}
