//! FP8 on the CPU: e4m3 bit for bit on edge values, UE8M0 ceilings bit for bit against the device kernel's bit
//! formula, the per-token-group host reference (the device kernels' oracle), block-FP8 checkpoints (DeepSeek F32
//! scales, Qwen3 BF16 / F16 scales, V3.1 UE8M0), `config.json`s, and every loud failure.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::*;
use half::{bf16, f16};
use moe_gemm::checkpoint::{ActivationScheme, Checkpoint, ExpertNaming, Fp8Config, PackedFp8Experts};
use moe_gemm::quant::*;
use moe_gemm::{Error, ExpertFormat, PackedExperts};
use safetensors::tensor::{Dtype, TensorView};

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

/// The device kernel's rounding (`cpp/quant.cu` `group_scale`), in Rust: exponent + (mantissa != 0), capped at
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

// ---------------------------------------------------------------------------------------------------------------
// config.json

const DEEPSEEK_V3_QC: &str = r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128]}"#;

fn config(qc: &str) -> String {
    format!(r#"{{"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "quantization_config": {qc}}}"#)
}

#[test]
fn quantization_configs_of_deepseek_and_qwen_parse() {
    let v3 = Fp8Config::from_config_json(&config(DEEPSEEK_V3_QC)).unwrap().unwrap();
    assert_eq!(v3, Fp8Config::DEEPSEEK_V3);
    assert_eq!(
        (v3.block(), v3.activation(), v3.scale_format()),
        (BlockShape::DEEPSEEK, ActivationScheme::Dynamic, ScaleFormat::F32)
    );
    assert_eq!(v3.activation_quant(), GroupQuant::DEEPSEEK);
    let v31 = config(
        r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}"#,
    );
    let v31 = Fp8Config::from_config_json(&v31).unwrap().unwrap();
    assert_eq!(v31, Fp8Config::DEEPSEEK_V3_1);
    assert_eq!(v31.activation_quant(), GroupQuant::DEEPSEEK_UE8M0);
    // Qwen3-FP8 (keys in another order, an extra key), and a minimal one: fmt and scheme default.
    let qwen = config(
        r#"{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}"#,
    );
    assert_eq!(Fp8Config::from_config_json(&qwen).unwrap(), Some(Fp8Config::DEEPSEEK_V3));
    let other = config(r#"{"quant_method": "fp8", "weight_block_size": [64, 32], "scale_fmt": null}"#);
    let other = Fp8Config::from_config_json(&other).unwrap().unwrap();
    assert_eq!(other.block(), BlockShape { rows: 64, cols: 32 });
    // No quantization_config: an unquantised model.
    assert_eq!(Fp8Config::from_config_json(r#"{"hidden_size": 4096}"#).unwrap(), None);
    assert_eq!(Fp8Config::from_config_json(r#"{"quantization_config": null}"#).unwrap(), None);
    // From a file.
    let path = std::env::temp_dir().join(format!("moe-gemm-fp8-config-{}.json", std::process::id()));
    std::fs::write(&path, config(DEEPSEEK_V3_QC)).unwrap();
    assert_eq!(Fp8Config::from_config_file(&path).unwrap(), Some(Fp8Config::DEEPSEEK_V3));
    let _ = std::fs::remove_file(&path);
    let err = Fp8Config::from_config_file(&path).unwrap_err();
    assert!(matches!(&err, Error::Checkpoint { tensor, .. } if tensor.ends_with(".json")), "{err}");
}

#[test]
fn quantization_configs_we_cannot_honour_name_the_key() {
    let cases = [
        (r#"{"quant_method": "mxfp4"}"#, "quant_method: \"mxfp4\""),
        (r#"{"fmt": "e4m3", "weight_block_size": [128, 128]}"#, "quant_method: missing"),
        (r#"{"quant_method": 8}"#, "quant_method: 8 is not a string"),
        (r#"{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}"#, "fmt: \"e5m2\""),
        (
            r#"{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}"#,
            "activation_scheme: \"static\"",
        ),
        (r#"{"quant_method": "fp8"}"#, "weight_block_size: missing: per-tensor"),
        (r#"{"quant_method": "fp8", "weight_block_size": [128]}"#, "weight_block_size: [128]: not two"),
        (r#"{"quant_method": "fp8", "weight_block_size": [128, 0]}"#, "weight_block_size: [128,0]: not two"),
        (r#"{"quant_method": "fp8", "weight_block_size": [128, -1]}"#, "not two positive integers"),
        (r#"{"quant_method": "fp8", "weight_block_size": [128, 1.5]}"#, "not two positive integers"),
        (r#"{"quant_method": "fp8", "weight_block_size": "128x128"}"#, "weight_block_size: \"128x128\""),
        (r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue4m3"}"#, "scale_fmt: \"ue4m3\""),
        (r#"[1, 2]"#, "quantization_config = [1,2]: not an object"),
    ];
    for (qc, want) in cases {
        let m = invalid(Fp8Config::from_config_json(&config(qc)));
        assert!(m.contains(want) && m.contains("quantization_config"), "{qc}: {m}");
    }
    assert!(invalid(Fp8Config::from_config_json("{not json")).contains("not valid JSON"));
    assert!(invalid(Fp8Config::new(BlockShape { rows: 0, cols: 128 }, ActivationScheme::Dynamic, ScaleFormat::F32))
        .contains("positive"));
}

// ---------------------------------------------------------------------------------------------------------------
// Block-FP8 checkpoints

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moe-gemm-fp8-{}-{name}.safetensors", std::process::id()))
}

/// A tensor to write: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);
type Store = Vec<Tensor>;

fn write(path: &std::path::Path, store: &Store) {
    let views: HashMap<String, TensorView<'_>> =
        store.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn weight(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * cols).map(|i| rng.unit() * if (i / cols) % 200 < 100 { 0.02 } else { 3.0 }).collect()
}

/// Scales in a checkpoint's dtype: F32 as is; BF16 / F16 rounded (the block matrices returned hold the rounded
/// values, as a Qwen3-FP8 checkpoint would).
fn scale_bytes(s: &Scales, dtype: Dtype) -> (Vec<u8>, Scales) {
    let v: Vec<f32> = (0..s.len()).map(|i| s.get(i).unwrap()).collect();
    match dtype {
        Dtype::F32 => (v.iter().flat_map(|x| x.to_le_bytes()).collect(), s.clone()),
        Dtype::BF16 => {
            let r: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            let back = match s {
                Scales::Ue8m0(u) => Scales::Ue8m0(u.clone()),
                _ => Scales::F32(r.iter().map(|x| x.to_f32()).collect()),
            };
            (r.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(), back)
        }
        Dtype::F16 => {
            let r: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            let back = match s {
                Scales::Ue8m0(u) => Scales::Ue8m0(u.clone()),
                _ => Scales::F32(r.iter().map(|x| x.to_f32()).collect()),
            };
            (r.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(), back)
        }
        d => panic!("{d:?}"),
    }
}

/// Per-expert DeepSeek-named FP8 tensors with their scales in `sdtype`; returns the store and the block matrices
/// the loader must return.
fn fp8_experts(
    prefix: &str,
    e: usize,
    i: usize,
    h: usize,
    format: ScaleFormat,
    sdtype: Dtype,
) -> (Store, HashMap<String, BlockFp8>) {
    let mut store = Store::new();
    let mut originals = HashMap::new();
    for x in 0..e {
        for (name, (rows, cols)) in ExpertNaming::GateUpDown.names(prefix, x).into_iter().zip([(i, h), (i, h), (h, i)])
        {
            let q =
                BlockFp8::quantize(&weight(rows, cols, store.len() as u64), rows, cols, BlockShape::DEEPSEEK, format)
                    .unwrap();
            let (gr, gc) = BlockShape::DEEPSEEK.grid(rows, cols).unwrap();
            let (bytes, scales) = scale_bytes(q.scales(), sdtype);
            store.push((name.clone(), Dtype::F8_E4M3, vec![rows, cols], q.q().iter().map(|v| v.to_bits()).collect()));
            store.push((format!("{name}_scale_inv"), sdtype, vec![gr, gc], bytes));
            let q = BlockFp8::from_parts(rows, cols, BlockShape::DEEPSEEK, q.q().to_vec(), scales).unwrap();
            originals.insert(name, q);
        }
    }
    (store, originals)
}

fn checkpoint_error(r: moe_gemm::Result<impl std::fmt::Debug>) -> (String, String) {
    match r {
        Err(Error::Checkpoint { tensor, problem }) => (tensor, problem),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

/// DeepSeek (F32 scales), Qwen3-FP8 (BF16 and F16 scales) and DeepSeek-V3.1 (UE8M0) experts pack into one value
/// whose experts are the per-expert tensors; the edge blocks of H = 320 and the partial w2 K-blocks included.
#[test]
fn fp8_experts_pack_with_f32_bf16_f16_and_ue8m0_scales() {
    let (e, i, h) = (3usize, 256usize, 320usize);
    let prefix = "model.layers.3.mlp";
    let cases = [
        (ScaleFormat::F32, Dtype::F32, Fp8Config::DEEPSEEK_V3),
        (ScaleFormat::F32, Dtype::BF16, Fp8Config::DEEPSEEK_V3),
        (ScaleFormat::F32, Dtype::F16, Fp8Config::DEEPSEEK_V3),
        (ScaleFormat::Ue8m0, Dtype::F32, Fp8Config::DEEPSEEK_V3_1),
        (ScaleFormat::Ue8m0, Dtype::BF16, Fp8Config::DEEPSEEK_V3_1),
    ];
    for (format, sdtype, config) in cases {
        let (store, originals) = fp8_experts(prefix, e, i, h, format, sdtype);
        let path = tmp(&format!("pack-{format:?}-{sdtype:?}"));
        write(&path, &store);
        let ckpt = Checkpoint::open(&path).unwrap();
        let p = ckpt.pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config).unwrap();
        assert_eq!((p.experts(), p.hidden(), p.inter(), p.block()), (e, h, i, BlockShape::DEEPSEEK));
        assert_eq!(p.scale_format(), format);
        assert_eq!(p.grids(), ((4, 3), (3, 2)));
        assert_eq!(
            (p.w13().len(), p.w13_scales().len(), p.w2().len(), p.w2_scales().len()),
            (e * 2 * i * h, e * 12, e * h * i, e * 6)
        );
        for x in 0..e {
            let [g, u, d] = ExpertNaming::GateUpDown.names(prefix, x);
            let (w13, w2) = p.expert(x).unwrap();
            assert_eq!(w13, originals[&g].stack_rows(&originals[&u]).unwrap(), "{format:?} {sdtype:?} expert {x}");
            assert_eq!(w2, originals[&d]);
            assert_eq!(ckpt.fp8_block_weight(&d, &config).unwrap(), originals[&d]);
        }
        // Expert 1's up scales start 2 block rows into its w13 grid, after expert 0's 12.
        assert_eq!(
            p.w13_scales().get(12 + 2 * 3),
            originals[&ExpertNaming::GateUpDown.names(prefix, 1)[1]].scales().get(0)
        );
        assert!(invalid(p.expert(e)).contains("expert 3 of 3"));
        let _ = std::fs::remove_file(path);
    }
}

/// A bf16 checkpoint converted on the host, saved as a DeepSeek FP8 checkpoint and read back: the same value.
#[test]
fn bf16_experts_quantise_on_the_host_and_round_trip_through_a_checkpoint() {
    let (e, i, h) = (2usize, 128usize, 200usize);
    let w13: Vec<bf16> = random_vec(e * 2 * i * h, 1, 2.0);
    let w2: Vec<bf16> = random_vec(e * h * i, 2, 0.5);
    let packed = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13.clone(), w2, None, None).unwrap();
    for config in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1] {
        let p = PackedFp8Experts::quantize(&packed, &config).unwrap();
        let (w13_0, _) = p.expert(0).unwrap();
        let gate: Vec<f32> = w13[..i * h].iter().map(|x| x.to_f32()).collect();
        let gate_q = BlockFp8::quantize(&gate, i, h, BlockShape::DEEPSEEK, config.scale_format()).unwrap();
        assert_eq!(&w13_0.q()[..i * h], gate_q.q());
        let dq = w13_0.dequantize();
        for (a, b) in dq.iter().zip(&w13[..2 * i * h]) {
            assert!((a - b.to_f32()).abs() <= b.to_f32().abs() / 16.0 + 2.0 / 448.0 * 2f32.powi(-9) * 2.0);
        }
        let prefix = "model.layers.0.mlp";
        let mut store = Store::new();
        for x in 0..e {
            let (w13x, w2x) = p.expert(x).unwrap();
            let [g, u, d] = ExpertNaming::GateUpDown.names(prefix, x);
            let (gr, gc) = BlockShape::DEEPSEEK.grid(i, h).unwrap();
            let s13: Vec<f32> = (0..w13x.scales().len()).map(|j| w13x.scales().get(j).unwrap()).collect();
            let s2: Vec<f32> = (0..w2x.scales().len()).map(|j| w2x.scales().get(j).unwrap()).collect();
            let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let q_bytes = |v: &[F8E4M3]| v.iter().map(|x| x.to_bits()).collect::<Vec<u8>>();
            store.push((g.clone(), Dtype::F8_E4M3, vec![i, h], q_bytes(&w13x.q()[..i * h])));
            store.push((format!("{g}_scale_inv"), Dtype::F32, vec![gr, gc], f32_bytes(&s13[..gr * gc])));
            store.push((u.clone(), Dtype::F8_E4M3, vec![i, h], q_bytes(&w13x.q()[i * h..])));
            store.push((format!("{u}_scale_inv"), Dtype::F32, vec![gr, gc], f32_bytes(&s13[gr * gc..])));
            store.push((d.clone(), Dtype::F8_E4M3, vec![h, i], q_bytes(w2x.q())));
            store.push((format!("{d}_scale_inv"), Dtype::F32, vec![gc, gr], f32_bytes(&s2)));
        }
        let path = tmp(&format!("roundtrip-{:?}", config.scale_format()));
        write(&path, &store);
        let back =
            Checkpoint::open(&path).unwrap().pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config).unwrap();
        assert_eq!(back, p);
        let _ = std::fs::remove_file(path);
    }
    // I not a multiple of 128: gate and up cannot share w13's blocks.
    let odd = PackedExperts::<bf16>::new(
        1,
        128,
        200,
        ExpertFormat::SWIGLU,
        random_vec(2 * 200 * 128, 3, 1.0),
        random_vec(128 * 200, 4, 1.0),
        None,
        None,
    )
    .unwrap();
    let m = invalid(PackedFp8Experts::quantize(&odd, &Fp8Config::DEEPSEEK_V3));
    assert!(m.contains("expert 0 gate") && m.contains("expert 0 up") && m.contains("200 rows"), "{m}");
    let gpt = PackedExperts::<bf16> { format: ExpertFormat::GPT_OSS, ..packed.clone() };
    assert!(invalid(PackedFp8Experts::quantize(&gpt, &Fp8Config::DEEPSEEK_V3)).contains("SwiGLU"));
    let mut short = packed;
    short.w2.pop();
    assert!(invalid(PackedFp8Experts::quantize(&short, &Fp8Config::DEEPSEEK_V3)).contains("need E x 2I x H"));
    assert!(invalid(PackedFp8Experts::from_experts(vec![])).contains("experts = 0"));
}

/// Every checkpoint error names the tensor (both, where two disagree) and, for a bad scale, the block.
#[test]
fn bad_fp8_checkpoints_name_the_tensor_and_the_block() {
    let prefix = "model.layers.5.mlp";
    let (e, i, h) = (2usize, 256usize, 384usize);
    let names = |x: usize| ExpertNaming::GateUpDown.names(prefix, x);
    let open = |store: &Store, tag: &str| {
        let path = tmp(tag);
        write(&path, store);
        let c = Checkpoint::open(&path).unwrap();
        let _ = std::fs::remove_file(path);
        c
    };
    let pack = |c: &Checkpoint, config: &Fp8Config| c.pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, config);
    let (good, _) = fp8_experts(prefix, e, i, h, ScaleFormat::F32, Dtype::F32);
    let edit = |name: &str, f: &dyn Fn(&mut Tensor)| {
        let mut s = good.clone();
        f(s.iter_mut().find(|t| t.0 == name).unwrap());
        s
    };

    // A scale grid of the wrong shape: both tensors named.
    let down = names(1)[2].clone();
    let s = edit(&format!("{down}_scale_inv"), &|t| t.2 = vec![2, 3]);
    let (tensor, problem) = checkpoint_error(pack(&open(&s, "grid"), &Fp8Config::DEEPSEEK_V3));
    assert_eq!(tensor, format!("{down}_scale_inv"));
    assert!(
        problem.contains(&format!("`{down}`")) && problem.contains("[3, 2]") && problem.contains("[2, 3]"),
        "{problem}"
    );

    // Weights not F8_E4M3, scales of an unknown dtype, a missing scale, a 3-D weight.
    let gate = names(0)[0].clone();
    let s = edit(&gate, &|t| t.1 = Dtype::U8);
    let (tensor, problem) = checkpoint_error(pack(&open(&s, "wdtype"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == gate && problem.contains("expected F8_E4M3"), "{tensor}: {problem}");
    let s = edit(&format!("{gate}_scale_inv"), &|t| {
        t.1 = Dtype::I32;
    });
    let (tensor, problem) = checkpoint_error(pack(&open(&s, "sdtype"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == format!("{gate}_scale_inv") && problem.contains("F32, BF16 or F16"), "{tensor}: {problem}");
    let mut s = good.clone();
    s.retain(|t| t.0 != format!("{gate}_scale_inv"));
    let (tensor, problem) = checkpoint_error(pack(&open(&s, "missing"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == format!("{gate}_scale_inv") && problem.contains("missing"), "{tensor}: {problem}");
    let s = edit(&gate, &|t| t.2 = vec![2, 128, 384]);
    let (tensor, problem) = checkpoint_error(pack(&open(&s, "3d"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == gate && problem.contains("[out, in]"), "{tensor}: {problem}");

    // Negative and NaN f32 scales: the block named.
    for (v, tag) in [(-0.5f32, "neg"), (f32::NAN, "nan")] {
        let up = names(1)[1].clone();
        let s = edit(&format!("{up}_scale_inv"), &|t| t.3[4 * 4..4 * 5].copy_from_slice(&v.to_le_bytes()));
        let (tensor, problem) = checkpoint_error(pack(&open(&s, tag), &Fp8Config::DEEPSEEK_V3));
        assert!(tensor == format!("{up}_scale_inv") && problem.contains("block [1, 1]"), "{tensor}: {problem}");
    }

    // UE8M0 declared: f32 scales that are not powers of two are refused, never rounded; the first block named.
    let (tensor, problem) = checkpoint_error(pack(&open(&good, "ue8m0-f32"), &Fp8Config::DEEPSEEK_V3_1));
    assert_eq!(tensor, format!("{gate}_scale_inv"));
    assert!(
        problem.contains("block [0, 0]") && problem.contains("not a power of two") && problem.contains("ue8m0"),
        "{problem}"
    );
    let (pow2, _) = fp8_experts(prefix, e, i, h, ScaleFormat::Ue8m0, Dtype::F32);
    assert!(pack(&open(&pow2, "ue8m0-ok"), &Fp8Config::DEEPSEEK_V3_1).is_ok());
    let mut one_off = pow2.clone();
    let t = one_off.iter_mut().find(|t| t.0 == format!("{}_scale_inv", names(1)[2])).unwrap();
    let third = f32::from_le_bytes(t.3[8..12].try_into().unwrap());
    t.3[8..12].copy_from_slice(&(third * 1.5).to_le_bytes());
    let (tensor, problem) = checkpoint_error(pack(&open(&one_off, "ue8m0-one"), &Fp8Config::DEEPSEEK_V3_1));
    assert_eq!(tensor, format!("{}_scale_inv", names(1)[2]));
    assert!(problem.contains("block [1, 0]"), "{problem}"); // grid [3, 2]: the third scale is block [1, 0]

    // Partial blocks where gate stacks on up: I = 200 (gate and up named).
    let (partial, _) = fp8_experts(prefix, e, 200, h, ScaleFormat::F32, Dtype::F32);
    let (tensor, problem) = checkpoint_error(pack(&open(&partial, "partial"), &Fp8Config::DEEPSEEK_V3));
    assert_eq!(tensor, gate);
    assert!(
        problem.contains(&format!("`{}`", names(0)[1])) && problem.contains("200 rows") && problem.contains("128-row"),
        "{problem}"
    );

    // Shapes that disagree: up vs gate, down vs gate, expert 1 vs expert 0.
    let (small, _) = fp8_experts(prefix, 1, 128, h, ScaleFormat::F32, Dtype::F32);
    let mut mixed = good.clone();
    mixed.retain(|t| !t.0.starts_with(&format!("{prefix}.experts.0.up_proj")));
    mixed.extend(small.iter().filter(|t| t.0.starts_with(&format!("{prefix}.experts.0.up_proj"))).cloned());
    let (tensor, problem) = checkpoint_error(pack(&open(&mixed, "upshape"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == names(0)[1] && problem.contains("like"), "{tensor}: {problem}");
    let mut mixed = good.clone();
    mixed.retain(|t| !t.0.starts_with(&format!("{prefix}.experts.1.")));
    let (other, _) = fp8_experts(prefix, 2, 128, h, ScaleFormat::F32, Dtype::F32);
    mixed.extend(other.iter().filter(|t| t.0.starts_with(&format!("{prefix}.experts.1."))).cloned());
    let (tensor, problem) = checkpoint_error(pack(&open(&mixed, "expert1"), &Fp8Config::DEEPSEEK_V3));
    assert!(tensor == names(1)[0] && problem.contains("expert 0 has [256, 384]"), "{tensor}: {problem}");
    let (tensor, problem) = checkpoint_error(open(&good, "zero").pack_fp8_experts(
        prefix,
        0,
        ExpertNaming::GateUpDown,
        &Fp8Config::DEEPSEEK_V3,
    ));
    assert!(tensor == prefix && problem.contains("experts = 0"), "{tensor}: {problem}");
}

/// DeepSeek-V3's FP8 shared expert (`mlp.shared_experts.{gate,up,down}_proj.weight` with `weight_scale_inv`)
/// reads into one value whose groups are slices of the checkpoint's matrices with their own scale blocks, and
/// appends to the routed experts as experts `E .. E + m`; a shared expert of the wrong shape is refused naming
/// its gate tensor.
#[test]
fn fp8_shared_experts_read_and_split_into_routed_width_groups() {
    use moe_gemm::checkpoint::{SharedFp8Expert, SharedNaming};
    let (e, i, h, is) = (2usize, 128usize, 256usize, 384usize);
    let prefix = "model.layers.3.mlp";
    let (mut store, routed) = fp8_experts(prefix, e, i, h, ScaleFormat::F32, Dtype::F32);
    let mut shared = HashMap::new();
    for (name, (rows, cols)) in SharedNaming::SharedExperts.names(prefix).into_iter().zip([(is, h), (is, h), (h, is)]) {
        let q = BlockFp8::quantize(
            &weight(rows, cols, 77 + store.len() as u64),
            rows,
            cols,
            BlockShape::DEEPSEEK,
            ScaleFormat::F32,
        )
        .unwrap();
        let (gr, gc) = BlockShape::DEEPSEEK.grid(rows, cols).unwrap();
        let (bytes, _) = scale_bytes(q.scales(), Dtype::F32);
        store.push((name.clone(), Dtype::F8_E4M3, vec![rows, cols], q.q().iter().map(|v| v.to_bits()).collect()));
        store.push((format!("{name}_scale_inv"), Dtype::F32, vec![gr, gc], bytes));
        shared.insert(name, q);
    }
    let path = tmp("shared");
    write(&path, &store);
    let ckpt = Checkpoint::open(&path).unwrap();
    let config = Fp8Config::DEEPSEEK_V3;
    let s = ckpt.pack_fp8_shared_expert(prefix, SharedNaming::SharedExperts, &config).unwrap();
    let [g, u, d] = SharedNaming::SharedExperts.names(prefix);
    assert_eq!(s, SharedFp8Expert::new(shared[&g].clone(), shared[&u].clone(), shared[&d].clone()).unwrap());
    assert_eq!((s.hidden(), s.inter(), s.groups(i).unwrap()), (h, is, 3));
    let p = ckpt.pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config).unwrap();
    let (all, m) = p.with_shared_groups(&s).unwrap();
    assert_eq!((m, all.experts()), (3, e + 3));
    let [rg, ru, rd] = ExpertNaming::GateUpDown.names(prefix, 1);
    assert_eq!(all.expert(1).unwrap(), (routed[&rg].stack_rows(&routed[&ru]).unwrap(), routed[&rd].clone()));
    // Group 2: gate and up rows 256..384 with their third block row; down columns 256..384, its third block column.
    let (w13, w2) = all.expert(e + 2).unwrap();
    let (gd, ud, dd) = (shared[&g].dequantize(), shared[&u].dequantize(), shared[&d].dequantize());
    let (a, b) = (w13.dequantize(), w2.dequantize());
    for r in 0..i {
        assert_eq!(&a[r * h..(r + 1) * h], &gd[(256 + r) * h..(257 + r) * h], "gate row {r}");
        assert_eq!(&a[(i + r) * h..(i + r + 1) * h], &ud[(256 + r) * h..(257 + r) * h], "up row {r}");
    }
    for c in 0..h {
        assert_eq!(&b[c * i..(c + 1) * i], &dd[c * is + 256..c * is + 384], "down row {c}");
    }
    assert_eq!(w2.scales().get(0), shared[&d].scales().get(2), "down's third block column");
    // A down projection of the gate's shape: refused, naming the gate tensor.
    let mut bad = store.clone();
    for t in bad.iter_mut().filter(|t| t.0.starts_with(&d)) {
        t.2.reverse();
    }
    let bad_path = tmp("shared-bad");
    write(&bad_path, &bad);
    let (tensor, problem) = checkpoint_error(Checkpoint::open(&bad_path).unwrap().pack_fp8_shared_expert(
        prefix,
        SharedNaming::SharedExperts,
        &config,
    ));
    assert!(tensor == g && problem.contains("down [H, I_s]"), "{tensor}: {problem}");
    let _ = (std::fs::remove_file(path), std::fs::remove_file(bad_path));
}
