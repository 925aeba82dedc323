//! Exhaustive code tables of the FP8 and FP4 formats against their specs, round trips, and
//! ties-to-even.

use lowbit_optim::states::format::{bf16, fp4, fp8, minifloat::MiniFloat, Rounding};

/// Value of a code computed independently in f64 from the spec's formula.
fn spec_value(f: &MiniFloat, code: u8) -> f64 {
    let (e_bits, m_bits) = (f.exp_bits, f.man_bits);
    let sign = if f.signed && code >> (e_bits + m_bits) & 1 == 1 { -1.0 } else { 1.0 };
    let e = (code >> m_bits) as i32 & ((1 << e_bits) - 1);
    let m = (code & ((1 << m_bits) - 1)) as f64;
    let frac = m / (1u32 << m_bits) as f64;
    sign * if e == 0 { frac * 2f64.powi(1 - f.bias) } else { (1.0 + frac) * 2f64.powi(e - f.bias) }
}

fn check_table(f: &MiniFloat, is_nan: impl Fn(u8) -> bool, is_inf: impl Fn(u8) -> bool) {
    for code in 0..f.num_codes() as u8 {
        let d = f.decode(code);
        if is_nan(code) {
            assert!(d.is_nan(), "code {code:#x}");
            assert!(f.encode(d, Rounding::Nearest, 0) & 0x7F == code & 0x7F);
            continue;
        }
        if is_inf(code) {
            assert!(d.is_infinite(), "code {code:#x}");
            assert_eq!(f.encode(d, Rounding::Nearest, 0), code);
            continue;
        }
        assert_eq!(d as f64, spec_value(f, code), "code {code:#x}");
        let back = f.encode(d, Rounding::Nearest, 0);
        if d == 0.0 {
            assert_eq!(back, 0, "zeros encode to the canonical +0");
        } else {
            assert_eq!(back, code, "round trip of {d}");
            // exact values never move under stochastic rounding either
            assert_eq!(f.encode(d, Rounding::Stochastic, u64::MAX), code);
        }
    }
}

#[test]
fn e4m3_table() {
    let f = fp8::E4M3;
    check_table(&f, |c| c & 0x7F == 0x7F, |_| false);
    assert_eq!(f.decode(0x7E), 448.0);
    assert_eq!(f.decode(0x38), 1.0);
    assert_eq!(f.decode(0x08), 2f32.powi(-6));
    assert_eq!(f.decode(0x01), 2f32.powi(-9));
    assert_eq!(f.decode(0xFE), -448.0);
    // saturating conversion of finite overflow and of Inf (no Inf code)
    assert_eq!(f.encode(1e6, Rounding::Nearest, 0), 0x7E);
    assert_eq!(f.encode(f32::NEG_INFINITY, Rounding::Nearest, 0), 0xFE);
}

#[test]
fn e5m2_table() {
    let f = fp8::E5M2;
    check_table(&f, |c| c & 0x7C == 0x7C && c & 3 != 0, |c| c & 0x7F == 0x7C);
    assert_eq!(f.decode(0x7B), 57344.0);
    assert_eq!(f.decode(0x3C), 1.0);
    assert_eq!(f.decode(0x01), 2f32.powi(-16));
    assert_eq!(f.decode(0xFC), f32::NEG_INFINITY);
}

#[test]
fn fp4_tables() {
    let e2m1: Vec<f32> = (0..16).map(|c| fp4::E2M1.decode(c)).collect();
    assert_eq!(e2m1, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]);
    let ue2m2: Vec<f32> = (0..16).map(|c| fp4::UE2M2.decode(c)).collect();
    assert_eq!(ue2m2, [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0]);
    check_table(&fp4::E2M1, |_| false, |_| false);
    check_table(&fp4::UE2M2, |_| false, |_| false);
    assert_eq!(fp4::E2M1.encode(f32::INFINITY, Rounding::Nearest, 0), 0x7);
    assert_eq!(fp4::UE2M2.encode(-3.0, Rounding::Nearest, 0), 0);
}

/// Midpoints between neighbouring codes go to the code with the even mantissa.
#[test]
fn nearest_ties_to_even() {
    for f in [fp8::E4M3, fp8::E5M2, fp4::E2M1, fp4::UE2M2] {
        let mut vals: Vec<(f32, u8)> =
            (0..f.num_codes() as u8).map(|c| (f.decode(c), c)).filter(|(d, _)| d.is_finite() && *d >= 0.0).collect();
        vals.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        vals.dedup_by(|a, b| a.0 == b.0);
        for w in vals.windows(2) {
            let ((lo, lc), (hi, hc)) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0; // exact: both are short binary fractions
            let want = if lc & 1 == 0 { lc } else { hc };
            assert_eq!(f.encode(mid, Rounding::Nearest, 0), want, "{f:?} tie {lo}..{hi}");
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(f.encode(below, Rounding::Nearest, 0), if lo == 0.0 { 0 } else { lc });
            assert_eq!(f.encode(above, Rounding::Nearest, 0), hc);
        }
    }
}

#[test]
fn bf16_nearest_even_and_specials() {
    // 1 + 2^-8 is the midpoint of 1 and 1 + 2^-7: ties to even (1.0 = 0x3F80)
    assert_eq!(bf16::encode(1.0 + 2f32.powi(-8), Rounding::Nearest, 0), 0x3F80);
    // 1 + 3*2^-8 is the midpoint of 1+2^-7 (odd) and 1+2^-6 (even)
    assert_eq!(bf16::encode(1.0 + 3.0 * 2f32.powi(-8), Rounding::Nearest, 0), 0x3F82);
    assert!(bf16::decode(bf16::encode(f32::NAN, Rounding::Stochastic, 0)).is_nan());
    assert_eq!(bf16::encode(f32::INFINITY, Rounding::Stochastic, u64::MAX), 0x7F80);
    // f32 subnormals round to bf16 subnormals
    assert_eq!(bf16::encode(f32::from_bits(0x0001_8000), Rounding::Nearest, 0), 0x0002);
    assert_eq!(bf16::encode(-1e-45, Rounding::Nearest, 0), 0, "canonical zero");
}

/// Precision-only formats: the theory's fraction bits, 2 bytes per element and no scales
/// (state bytes reported honestly: a precision simulation, not a memory saving).
#[test]
fn precision_only_formats_report_bits_and_bytes() {
    use lowbit_optim::StateFormat;
    for k in 1..=6u8 {
        let f = StateFormat::parse(&format!("e8m{k}"), k > 1).unwrap();
        assert_eq!(f, StateFormat::E8m(k));
        assert_eq!(f.name(), format!("e8m{k}"));
        assert_eq!(f.fraction_bits(), Some(k as u32));
        assert_eq!(f.storage_bytes(1000, 128), 2000);
        assert!(!f.is_scaled() && f.is_signed());
    }
}
