//! Standalone rounding cast FP32 -> BF16 / FP8 / FP4 (no scaling): the CPU reference of the
//! `sr_cast_*` CUDA kernels (`kernels/sr_cast.cu`). Element `i` uses `element_bits(key, i, width)`
//! (16 random bits for BF16, 32 for FP8/FP4).

use crate::format::{bf16, fp4, fp8, Rounding, StateFormat};
use crate::rng::element_bits;

/// Cast `x` to `format`'s codes: BF16 as little-endian u16 pairs, FP8 one byte each,
/// FP4 E2M1 packed two per byte (low nibble first). Errors for other formats.
pub fn cast(x: &[f32], format: StateFormat, rounding: Rounding, key: u64) -> Result<Vec<u8>, String> {
    let width = if format == StateFormat::Bf16 { 16 } else { 32 };
    let r = |i: usize| element_bits(key, i as u64, width);
    Ok(match format {
        StateFormat::Bf16 => x
            .iter()
            .enumerate()
            .flat_map(|(i, &v)| bf16::encode(v, rounding, r(i)).to_le_bytes())
            .collect(),
        StateFormat::Fp8E4M3 => x.iter().enumerate().map(|(i, &v)| fp8::E4M3.encode(v, rounding, r(i))).collect(),
        StateFormat::Fp8E5M2 => x.iter().enumerate().map(|(i, &v)| fp8::E5M2.encode(v, rounding, r(i))).collect(),
        StateFormat::Fp4E2M1 => x
            .chunks(2)
            .enumerate()
            .map(|(b, pair)| {
                let lo = fp4::E2M1.encode(pair[0], rounding, r(2 * b));
                let hi = pair.get(1).map_or(0, |&v| fp4::E2M1.encode(v, rounding, r(2 * b + 1)));
                lo | (hi << 4)
            })
            .collect(),
        f => return Err(format!("cast to {} is not supported (bf16, fp8e4m3, fp8e5m2, fp4e2m1)", f.name())),
    })
}
