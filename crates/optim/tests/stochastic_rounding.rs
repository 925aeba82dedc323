//! Stochastic rounding is unbiased for every format (subnormals included) and never moves
//! values that are already on the grid.

use lowbit_optim::states::format::{bf16, fp4, fp8, int8, minifloat::MiniFloat, precision, Rounding};
use lowbit_optim::states::rng::{element_bits, random_bits, stream_key, StateKind};

const DRAWS: u64 = 100_000;

/// Mean of DRAWS stochastic roundings of `x` with the random bits the optimizer gives a
/// format consuming `width` bits (`element_bits`), and the standard error for a two-point
/// distribution on `lo`/`hi` with mean `x`.
fn check_unbiased(x: f64, lo: f64, hi: f64, width: u32, round: impl Fn(u64) -> f64, what: &str) {
    let key = stream_key(42, 1, x.to_bits(), StateKind::V);
    let mut sum = 0.0;
    for i in 0..DRAWS {
        let r = round(element_bits(key, i, width));
        assert!(r == lo || r == hi, "{what}: {x} rounded to {r}, outside [{lo}, {hi}]");
        sum += r;
    }
    let mean = sum / DRAWS as f64;
    let p = (x - lo) / (hi - lo);
    let se = (hi - lo) * (p * (1.0 - p) / DRAWS as f64).sqrt();
    assert!((mean - x).abs() <= 4.0 * se + 1e-300, "{what}: mean {mean} vs x {x} (4 SE = {})", 4.0 * se);
}

/// Points strictly between neighbours lo < hi of a grid, at several fractions.
fn between(lo: f32, hi: f32) -> impl Iterator<Item = f32> {
    [0.1f64, 0.37, 0.5, 0.83].into_iter().map(move |t| (lo as f64 + t * (hi as f64 - lo as f64)) as f32).filter(move |&x| x > lo && x < hi)
}

/// Every point `between` grid neighbours `lo < hi` rounds to one of them without bias, where
/// `round(x, bits)` rounds with 32 random bits.
fn grid_case(lo: f32, hi: f32, round: impl Fn(f32, u64) -> f32, what: &str) {
    for x in between(lo, hi) {
        check_unbiased(x as f64, lo as f64, hi as f64, 32, |r| round(x, r) as f64, what);
    }
}

fn minifloat_case(f: &MiniFloat, lo_code: u8, hi_code: u8) {
    let round = |x, r| f.decode(f.encode(x, Rounding::Stochastic, r));
    grid_case(f.decode(lo_code), f.decode(hi_code), round, &format!("{f:?}"));
}

#[test]
fn minifloats_are_unbiased_including_subnormals() {
    // (subnormal, subnormal->normal boundary, normal, top of range)
    minifloat_case(&fp8::E4M3, 0x00, 0x01);
    minifloat_case(&fp8::E4M3, 0x07, 0x08);
    minifloat_case(&fp8::E4M3, 0x3A, 0x3B);
    minifloat_case(&fp8::E4M3, 0x7D, 0x7E);
    minifloat_case(&fp8::E4M3, 0x80 | 0x3A, 0x80 | 0x3B);
    minifloat_case(&fp8::E5M2, 0x01, 0x02);
    minifloat_case(&fp8::E5M2, 0x3D, 0x3E);
    minifloat_case(&fp4::E2M1, 0x0, 0x1);
    minifloat_case(&fp4::E2M1, 0x6, 0x7);
    minifloat_case(&fp4::E2M1, 0x9, 0xA);
    minifloat_case(&fp4::UE2M2, 0x0, 0x1);
    minifloat_case(&fp4::UE2M2, 0x3, 0x4);
    minifloat_case(&fp4::UE2M2, 0xE, 0xF);
}

#[test]
fn bf16_is_unbiased_including_subnormals() {
    for (lo, hi) in [(0x3F80u16, 0x3F81u16), (0x0001, 0x0002), (0x007F, 0x0080), (0xC2F0, 0xC2F1)] {
        let (l, h) = (bf16::decode(lo), bf16::decode(hi));
        for x in between(l.min(h), l.max(h)) {
            check_unbiased(
                x as f64,
                l.min(h) as f64,
                l.max(h) as f64,
                16,
                |r| bf16::decode(bf16::encode(x, Rounding::Stochastic, r)) as f64,
                "bf16",
            );
        }
    }
}

/// e8mK: between neighbours of a normal binade (1 + j 2^-K), of a tiny binade (no range
/// limit) and of FP32 subnormals (the exponent field 0, fraction rounded to K bits).
#[test]
fn precision_only_formats_are_unbiased() {
    for k in precision::FRACTION_BITS {
        let step = 2f32.powi(-(k as i32));
        for (lo, hi) in [(1.0f32, 1.0 + step), (-2.0 * (1.0 + step), -2.0), (1.5e-40, 1.5e-40 + 2f32.powi(-126) * step)] {
            let (lo, hi) = (
                precision::decode(precision::encode(lo, k, Rounding::Nearest, 0)),
                precision::decode(precision::encode(hi, k, Rounding::Nearest, 0)),
            );
            assert!(lo < hi, "e8m{k}: {lo} {hi}");
            let round = |x, r| precision::decode(precision::encode(x, k, Rounding::Stochastic, r));
            grid_case(lo, hi, round, &format!("e8m{k}"));
        }
    }
}

/// e8m7 would be BF16: with 7 fraction bits the precision-only rounding is BF16's, which is
/// why the config name `e8m7` resolves to `bf16`.
#[test]
fn seven_fraction_bits_is_bf16() {
    use lowbit_optim::StateFormat;
    assert_eq!(StateFormat::parse("e8m7", true), Ok(StateFormat::Bf16));
    assert_eq!(StateFormat::parse("e8m3", false), Ok(StateFormat::E8m(3)));
    assert!(StateFormat::parse("e8m0", false).unwrap_err().to_string().contains("1 to 7"));
    assert!(StateFormat::parse("e8m8", false).is_err());
    for i in 0..20_000u32 {
        let x = f32::from_bits(i.wrapping_mul(2_654_435_761));
        if x.is_nan() {
            continue;
        }
        // the nearest-even rule on 16 dropped bits, written out for K = 7
        let bits = x.to_bits();
        let want = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
        let want = if want & 0x7FFF == 0 { 0 } else { want };
        assert_eq!(bf16::encode(x, Rounding::Nearest, 0), want);
        // K = 6 keeps one fraction bit less: its result is BF16-representable with an even
        // last BF16 fraction bit
        assert_eq!(precision::encode(x, 6, Rounding::Nearest, 0) & 1, 0);
    }
}

#[test]
fn int8_is_unbiased() {
    for signed in [true, false] {
        let t = int8::dynamic_map(signed);
        for i in [1usize, 40, 128, 200, 254] {
            for x in between(t[i], t[i + 1]) {
                check_unbiased(
                    x as f64,
                    t[i] as f64,
                    t[i + 1] as f64,
                    32,
                    |r| t[t.encode(x, Rounding::Stochastic, r) as usize] as f64,
                    "int8",
                );
            }
        }
    }
}

#[test]
fn exact_values_never_move() {
    let key = stream_key(7, 3, 1, StateKind::M);
    for i in 0..10_000u64 {
        let r = random_bits(key, i);
        for f in [fp8::E4M3, fp8::E5M2, fp4::E2M1, fp4::UE2M2] {
            let c = (i % f.num_codes() as u64) as u8;
            let d = f.decode(c);
            if d.is_finite() && d != 0.0 {
                assert_eq!(f.encode(d, Rounding::Stochastic, r), c);
            }
        }
        let h = (i as u16).wrapping_mul(7919) & 0x7F7F;
        if h & 0x7FFF != 0 {
            assert_eq!(bf16::encode(bf16::decode(h), Rounding::Stochastic, r), h);
            for k in precision::FRACTION_BITS {
                let on_grid = h & !((1u16 << (7 - k)) - 1);
                if on_grid & 0x7FFF != 0 {
                    assert_eq!(precision::encode(precision::decode(on_grid), k, Rounding::Stochastic, r), on_grid);
                }
            }
        }
    }
}
