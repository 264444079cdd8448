//! FP8 on the CPU: e4m3 bit for bit on edge values, UE8M0 ceilings bit for bit against the device kernel's bit
//! formula, the per-token-group host reference (the device kernels' oracle), and every loud failure. The FP8
//! checkpoints and `config.json`s are in `fp8_checkpoint.rs`.

mod common;

use common::*;
use half::bf16;
use moe_gemm::quant::*;
use moe_gemm::Error;

// ---------------------------------------------------------------------------------------------------------------
// e4m3

/// (value, E4M3FN bits): encode(value) == bits, and, where `exact`, decode(bits) == value.
const E4M3_TABLE: &[(f32, u8, bool, &str)] = &[
    (448.0, 0x7E, true, "largest finite"),
    (-448.0, 0xFE, true, "-largest finite"),
    (416.0, 0x7D, true, "largest below 448"),
    (432.0, 0x7E, false, "halfway 416..448: tie to even (448, mantissa 110)"),
    (424.0, 0x7D, false, "below the halfway point: 416"),
    (464.0, 0x7E, false, "halfway to the (NaN) 480: saturates to 448"),
    (465.0, 0x7E, false, "past 464: saturates"),
    (1e6, 0x7E, false, "far past: saturates"),
    (-1e30, 0xFE, false, "far past, negative: saturates"),
    (f32::MAX, 0x7E, false, "f32::MAX saturates"),
    (1.0, 0x38, true, "one"),
    (0.015625, 0x08, true, "min normal 2^-6"),
    (0.013671875, 0x07, true, "largest subnormal 7 * 2^-9"),
    (0.00390625, 0x02, true, "subnormal 2^-8"),
    (0.001953125, 0x01, true, "min subnormal 2^-9"),
    (-0.001953125, 0x81, true, "-min subnormal"),
    (0.0009765625, 0x00, false, "2^-10: halfway to 2^-9, tie to even (0)"),
    (0.0009766, 0x01, false, "just above 2^-10: rounds up to 2^-9"),
    (0.0029296875, 0x02, false, "3 * 2^-10: halfway 2^-9..2^-8, tie to even (2^-8)"),
    (0.0048828125, 0x02, false, "5 * 2^-10: halfway 2^-8..3 * 2^-9, tie to even (2^-8)"),
    (1e-30, 0x00, false, "far below: +0"),
    (-1e-30, 0x80, false, "far below, negative: -0"),
    (0.0, 0x00, true, "+0"),
    (-0.0, 0x80, true, "-0"),
    (1.0625, 0x38, false, "tie 1.0..1.125: even (1.0)"),
    (1.1875, 0x3A, false, "tie 1.125..1.25: even (1.25)"),
    (1.1876, 0x3A, false, "just past the tie: up"),
    (240.0, 0x77, true, "240 = 1.875 * 2^7"),
    (-3.5, 0xC6, true, "-3.5"),
];

#[test]
fn e4m3_encodes_and_decodes_edge_values_bit_for_bit() {
    for &(v, bits, exact, what) in E4M3_TABLE {
        let q = F8E4M3::from_f32(v);
        assert_eq!(q.to_bits(), bits, "{what}: encode({v:e}) = {:#04x}, expected {bits:#04x}", q.to_bits());
        if exact {
            let back = F8E4M3::from_bits(bits).to_f32();
            assert_eq!(back.to_bits(), v.to_bits(), "{what}: decode({bits:#04x}) = {back:e}, expected {v:e}");
        }
    }
    // NaN in, NaN out: 0x7F / 0xFF are E4M3FN's only NaNs (no infinities).
    assert_eq!(F8E4M3::from_f32(f32::NAN).to_bits(), 0x7F);
    assert_eq!(F8E4M3::from_f32(-f32::NAN).to_bits(), 0xFF);
    assert!(F8E4M3::from_bits(0x7F).to_f32().is_nan() && F8E4M3::from_bits(0xFF).to_f32().is_nan());
    // The conversion alone saturates infinities; the quantisation rule makes them NaN instead (below).
    assert_eq!(F8E4M3::from_f32(f32::INFINITY).to_bits(), 0x7E);
}

/// Every one of the 256 codes: decodes to a value that encodes back to the same code (NaNs to NaN), and the
/// decoded values are strictly increasing over the positive codes.
#[test]
fn every_e4m3_code_round_trips() {
    let mut last = -1f32;
    for b in 0..=255u8 {
        let v = F8E4M3::from_bits(b).to_f32();
        if b & 0x7F == 0x7F {
            assert!(v.is_nan(), "{b:#04x}");
            continue;
        }
        assert_eq!(F8E4M3::from_f32(v).to_bits(), b, "{b:#04x} = {v:e}");
        if b < 0x80 {
            assert!(v > last || b == 0, "{b:#04x}: {v:e} after {last:e}");
            last = v;
        } else {
            assert_eq!((-v).to_bits(), F8E4M3::from_bits(b & 0x7F).to_f32().to_bits(), "{b:#04x} mirrors");
        }
    }
    assert_eq!(last, E4M3_MAX);
}

#[test]
fn quantised_elements_keep_nan_and_turn_infinities_into_nan() {
    assert_eq!(quantize_element(f32::NAN, 1.0).to_bits(), 0x7F);
    assert_eq!(quantize_element(-f32::NAN, 1.0).to_bits(), 0xFF);
    assert_eq!(quantize_element(f32::INFINITY, 1.0).to_bits(), 0x7F);
    assert_eq!(quantize_element(f32::NEG_INFINITY, 1.0).to_bits(), 0xFF);
    assert_eq!(quantize_element(900.0, 2.0).to_bits(), 0x7E, "450 saturates to 448");
    assert_eq!(quantize_element(-0.0, 0.5).to_bits(), 0x80);
    assert_eq!(quantize_element(3.0, 0.5).to_f32(), 6.0);
}

// ---------------------------------------------------------------------------------------------------------------
// UE8M0

/// The device kernel's rounding (`cpp/moe_ops/quant.cu` `group_scale`), in Rust: exponent + (mantissa != 0), capped at
/// 254, for normal f32.
fn ceil_ue8m0_bits(s: f32) -> f32 {
    let b = s.to_bits();
    let e = (((b >> 23) & 0xFF) + u32::from(b & 0x7F_FFFF != 0)).min(254);
    f32::from_bits(e << 23)
}

/// The device formula is bit for bit `Ue8m0::from_f32_ceil` over every exponent of a normal f32 that a scale can
/// have, with the mantissas at the edges (0, 1 ulp, half, all ones) and random ones.
#[test]
fn ue8m0_ceiling_is_bit_exact_with_the_device_formula() {
    let mut rng = Rng(7);
    let mut checked = 0;
    for e in 1u32..=253 {
        let mut mantissas = vec![0u32, 1, 2, 0x40_0000, 0x40_0001, 0x7F_FFFE, 0x7F_FFFF];
        mantissas.extend((0..16).map(|_| (rng.next_u64() as u32) & 0x7F_FFFF));
        for m in mantissas {
            let s = f32::from_bits((e << 23) | m);
            let host = Ue8m0::from_f32_ceil(s).unwrap().to_f32();
            assert_eq!(host.to_bits(), ceil_ue8m0_bits(s).to_bits(), "s = {s:e} (exp {e}, mantissa {m:#x})");
            assert!(host >= s && (m == 0 || host < 2.0 * s), "s = {s:e}: ceiling {host:e}");
            checked += 1;
        }
    }
    assert!(checked > 5000);
    // The DeepGEMM formula on sample values: ceil(log2).
    for (s, want) in [(1.0f32, 1.0f32), (1.0000001, 2.0), (0.75, 1.0), (3.0, 4.0), (2f32.powi(-100), 2f32.powi(-100))] {
        assert_eq!(Ue8m0::from_f32_ceil(s).unwrap().to_f32(), want, "{s:e}");
    }
    // Out of range and non-positive: errors, never a wrapped byte.
    for bad in [0.0, -1.0, f32::INFINITY, f32::NAN, f32::MAX] {
        assert!(Ue8m0::from_f32_ceil(bad).is_err(), "{bad:e}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// GroupQuant and the host reference

fn invalid<T: std::fmt::Debug>(r: moe_gemm::Result<T>) -> String {
    match r {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

#[test]
fn group_quant_options_name_their_eps_and_refuse_bad_ones() {
    assert_eq!(GroupQuant::default(), GroupQuant::DEEPSEEK);
    assert_eq!((GroupQuant::DEEPSEEK.eps(), GroupQuant::DEEPSEEK.rounding()), (1e-4, ScaleRounding::Exact));
    assert_eq!(GroupQuant::DEEPSEEK_UE8M0.rounding(), ScaleRounding::Ue8m0Ceil);
    assert_eq!(DEEPSEEK_EPS, 1e-4);
    assert_eq!(VLLM_EPS, 1e-10);
    let vllm = GroupQuant::new(VLLM_EPS, ScaleRounding::Exact).unwrap();
    assert_eq!(vllm.scale(0.0), 1e-10 / 448.0);
    for bad in [0.0f32, -1e-4, f32::NAN, f32::INFINITY, 1e-36] {
        let m = invalid(GroupQuant::new(bad, ScaleRounding::Exact));
        assert!(m.contains("eps") && m.contains("normal"), "{bad:e}: {m}");
    }
    // The floor and the rounding.
    let q = GroupQuant::DEEPSEEK;
    assert_eq!(q.scale(0.0), 1e-4 / 448.0);
    assert_eq!(q.scale(448.0), 1.0);
    assert_eq!(q.scale(1e-5), 1e-4 / 448.0, "amax below eps: eps");
    let u = GroupQuant::DEEPSEEK_UE8M0;
    assert_eq!(u.scale(448.0), 1.0);
    assert_eq!(u.scale(449.0), 2.0);
    assert_eq!(u.scale(0.0), 2f32.powi(-22), "1e-4 / 448 = 2.2e-7 rounds up to 2^-22");
    assert_eq!(q.with_rounding(ScaleRounding::Ue8m0Ceil), u);
}

/// DeepSeek's `per_token_cast_to_fp8` as written (torch, f32): `x · (448 / amax)` with amax clamped at 1e-4;
/// with ue8m0, `x · (1 / ceil_to_ue8m0(amax / 448))`.
fn deepseek_cast(x: &[f32], k: usize, ue8m0: bool) -> (Vec<F8E4M3>, Vec<f32>) {
    let mut q = Vec::new();
    let mut s = Vec::new();
    for row in x.chunks(k) {
        for g in row.chunks(ACT_GROUP) {
            let amax = g.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
            if ue8m0 {
                let sf = Ue8m0::from_f32_ceil(amax / 448.0).unwrap().to_f32();
                q.extend(g.iter().map(|v| F8E4M3::from_f32(v * (1.0 / sf))));
                s.push(sf);
            } else {
                q.extend(g.iter().map(|v| F8E4M3::from_f32(v * (448.0 / amax))));
                s.push(amax / 448.0);
            }
        }
    }
    (q, s)
}

fn activations(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    // Rows and groups of very different magnitudes, rounded to bf16 (what the device reads).
    (0..rows * k)
        .map(|i| {
            let mag = [0.01f32, 1.0, 30.0, 3000.0][(i / k + i % k / ACT_GROUP) % 4];
            bf16::from_f32(rng.unit() * mag).to_f32()
        })
        .collect()
}

/// The host reference on finite data: DeepSeek's cast bit for bit with UE8M0 scales (whose reciprocal is exact);
/// with f32 scales the same scales and elements at most one e4m3 step apart (division vs multiplication by
/// 448 / amax), nearly all identical.
#[test]
fn host_reference_matches_deepseeks_cast() {
    let (rows, k) = (37, 7168 + 72);
    let x = activations(rows, k, 3);
    let (q, s) = per_token_group_quant(&x, rows, k, &GroupQuant::DEEPSEEK_UE8M0).unwrap();
    let (dq, ds) = deepseek_cast(&x, k, true);
    assert_eq!(s, ds);
    assert!(q.iter().zip(&dq).all(|(a, b)| a.to_bits() == b.to_bits()));

    let (q, s) = per_token_group_quant(&x, rows, k, &GroupQuant::DEEPSEEK).unwrap();
    let (dq, ds) = deepseek_cast(&x, k, false);
    assert_eq!(s, ds);
    let mut differ = 0;
    for (a, b) in q.iter().zip(&dq) {
        if a.to_bits() != b.to_bits() {
            differ += 1;
            assert_eq!((a.to_bits() as i32 - b.to_bits() as i32).abs(), 1, "{a:?} vs {b:?}");
        }
    }
    assert!(differ * 1000 < q.len(), "{differ} of {} differ", q.len());
}

/// The rules on a hand-made row: partial last group, the eps floor, NaN and infinities left out of amax, K-major
/// scales, |q| <= 448 everywhere and the top of each group at (F32) or above half (UE8M0) the range.
#[test]
fn host_reference_follows_the_rules() {
    let k = 300; // groups of 128, 128 and 44
    let mut x = vec![0f32; 2 * k];
    for c in 0..k {
        x[c] = (c as f32 - 150.0) / 8.0; // row 0
        x[k + c] = 1e-6 * (c % 3) as f32; // row 1: below eps everywhere
    }
    x[5] = f32::NAN;
    x[130] = f32::INFINITY;
    x[131] = -f32::INFINITY;
    x[299] = 1e4; // alone in the partial group's amax
    for opts in [GroupQuant::DEEPSEEK, GroupQuant::DEEPSEEK_UE8M0] {
        let (q, s) = per_token_group_quant(&x, 2, k, &opts).unwrap();
        assert_eq!((q.len(), s.len()), (600, 6));
        // row 0: group 0 amax 150/8 (NaN ignored), group 1 (255-150)/8 (infinities ignored), group 2 1e4
        let want = [150.0 / 8.0, 105.0 / 8.0, 1e4, 0.0, 0.0, 0.0].map(|a: f32| opts.scale(a));
        assert_eq!(s, want, "{opts:?}");
        assert_eq!(s[3], opts.scale(1e-4), "row 1 is below eps: the floor");
        assert_eq!((q[5].to_bits(), q[130].to_bits(), q[131].to_bits()), (0x7F, 0x7F, 0xFF));
        for (i, v) in q.iter().enumerate().filter(|(i, _)| ![5, 130, 131].contains(i)) {
            let expect = F8E4M3::from_f32(x[i] / s[(i / k) * 3 + (i % k) / 128]);
            assert_eq!(v.to_bits(), expect.to_bits(), "element {i}");
            assert!(v.to_f32().abs() <= 448.0);
        }
        let top = q[256..300].iter().map(|v| v.to_f32().abs()).fold(0f32, f32::max);
        assert!(top >= if opts.rounding() == ScaleRounding::Exact { 448.0 } else { 224.0 }, "{top}");
    }
}

/// Dequantising with the scales read MN-major (`[groups][rows]`, DeepGEMM's SM90 layout) instead of K-major
/// (`[rows][groups]`) is far off: the comparison the GPU tests make catches a kernel that writes that layout.
#[test]
fn a_wrong_scale_layout_is_caught() {
    let (rows, k) = (9, 1000);
    let x = activations(rows, k, 5);
    let (q, s) = per_token_group_quant(&x, rows, k, &GroupQuant::DEEPSEEK).unwrap();
    let groups = k.div_ceil(ACT_GROUP);
    // e4m3: half an ulp is 1/16 of the value (normal) or 2^-10 of the scale (subnormal).
    let within = |d: &[f32]| {
        let tol = |i: usize| x[i].abs() / 16.0 + s[(i / k) * groups + (i % k) / ACT_GROUP] * 2f32.powi(-10);
        x.iter().zip(d).enumerate().all(|(i, (a, b))| (a - b).abs() <= tol(i))
    };
    assert!(within(&dequantize_groups(&q, &s, rows, k).unwrap()));
    let mn_major: Vec<f32> = (0..rows * groups).map(|i| s[(i % rows) * groups + i / rows]).collect();
    assert_ne!(mn_major, s);
    assert!(!within(&dequantize_groups(&q, &mn_major, rows, k).unwrap()), "the transposed scales must not pass");
}

#[test]
fn host_reference_refuses_shapes_that_do_not_fit() {
    let opts = GroupQuant::DEEPSEEK;
    assert!(invalid(per_token_group_quant(&[1.0; 10], 2, 4, &opts)).contains("10 elements for [2, 4]"));
    assert!(invalid(per_token_group_quant(&[], 0, 0, &opts)).contains("k positive"));
    assert!(invalid(per_token_group_quant(&[1.0], usize::MAX, 2, &opts)).contains("overflows"));
    let (q, s) = per_token_group_quant(&[], 0, 7, &opts).unwrap();
    assert!(q.is_empty() && s.is_empty());
    let q = vec![F8E4M3::from_f32(1.0); 8];
    assert!(invalid(dequantize_groups(&q, &[1.0], 2, 4)).contains("1 scales"));
    assert!(dequantize_groups(&q, &[1.0, 2.0], 2, 4).unwrap()[4..] == [2.0; 4]);
}
