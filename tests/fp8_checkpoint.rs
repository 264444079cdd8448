//! FP8 checkpoints on the CPU: `config.json`'s `quantization_config` (DeepSeek-V3, V3.1, Qwen3-FP8), block-FP8
//! expert tensors with F32 / BF16 / F16 / UE8M0 scales packed, quantised and round-tripped, shared experts split
//! into routed-width groups, and every loud failure naming its tensor and block.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::*;
use half::{bf16, f16};
use moe_gemm::checkpoint::{ActivationScheme, Checkpoint, ExpertNaming, Fp8Config, PackedFp8Experts};
use moe_gemm::quant::*;
use moe_gemm::{Error, ExpertFormat, PackedExperts};
use safetensors::tensor::{Dtype, TensorView};

fn invalid<T: std::fmt::Debug>(r: moe_gemm::Result<T>) -> String {
    match r {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
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
    assert!(matches!(&err, Error::CheckpointFile { file, .. } if file == &path), "{err}");
}

/// The activation epsilon is part of the checkpoint's format: `from_config_json` picks the family's from
/// `model_type` / `architectures` (DeepSeek-V3 and V3.1, Kimi-K2: 1e-4; Qwen3-MoE FP8: vLLM's 1e-10), and a
/// builder overrides it (validated).
#[test]
fn each_fp8_family_declares_its_activation_eps() {
    let qc =
        r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}"#;
    let v31 = r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}"#;
    let of = |model_type: &str, arch: &str, qc: &str| {
        let text =
            format!(r#"{{"model_type": "{model_type}", "architectures": ["{arch}"], "quantization_config": {qc}}}"#);
        Fp8Config::from_config_json(&text).unwrap().unwrap()
    };
    let v3 = of("deepseek_v3", "DeepseekV3ForCausalLM", qc);
    assert_eq!((v3, v3.activation_eps()), (Fp8Config::DEEPSEEK_V3, DEEPSEEK_EPS));
    assert_eq!(of("deepseek_v3", "DeepseekV3ForCausalLM", v31), Fp8Config::DEEPSEEK_V3_1);
    assert_eq!(of("kimi_k2", "DeepseekV3ForCausalLM", qc).activation_eps(), DEEPSEEK_EPS);
    let qwen = of("qwen3_moe", "Qwen3MoeForCausalLM", qc);
    assert_eq!((qwen, qwen.activation_eps()), (Fp8Config::QWEN3, VLLM_EPS));
    assert_eq!(qwen.activation_quant(), GroupQuant::new(1e-10, ScaleRounding::Exact).unwrap());
    assert_eq!(v3.activation_quant().eps(), 1e-4);
    // Only the eps differs between the two families' formats.
    assert_eq!((qwen.block(), qwen.scale_format()), (v3.block(), v3.scale_format()));
    let custom = Fp8Config::DEEPSEEK_V3.with_activation_eps(1e-6).unwrap();
    assert_eq!((custom.activation_eps(), custom.scale_format()), (1e-6, ScaleFormat::F32));
    for bad in [0.0, f32::NAN, 1e-40] {
        assert!(invalid(Fp8Config::QWEN3.with_activation_eps(bad)).contains("eps"), "{bad}");
    }
}

/// A token whose 128-column group peaks below 1e-4 (amax 3e-5): under Qwen3-FP8's format the CPU reference
/// quantises it as vLLM does (scale = amax / 448, the peak at ±448), while DeepSeek's keeps the 1e-4 floor
/// (scale = 1e-4 / 448, the peak at 134.4, e4m3 128). Experts packed or quantised under a config
/// carry its eps into the layer's quantisation (`PackedFp8Experts::activation_quant`, what the upload and the
/// host layer use).
#[test]
fn a_tiny_group_quantises_as_its_family_serves_it() {
    let (rows, k) = (1usize, 256usize);
    let mut x = vec![0f32; rows * k];
    for (c, v) in x.iter_mut().enumerate() {
        *v = if c < 128 { 3e-5 * ((c % 7) as f32 - 3.0) / 3.0 } else { 0.5 * ((c % 5) as f32 - 2.0) };
    }
    let amax = x[..128].iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(amax < 1e-4 && amax > 0.0);
    let (q, s) = per_token_group_quant(&x, rows, k, &Fp8Config::QWEN3.activation_quant()).unwrap();
    assert_eq!(s[0], amax / 448.0, "Qwen3: scale = amax / 448");
    assert_eq!(q[..128].iter().map(|v| v.to_f32().abs()).fold(0f32, f32::max), 448.0);
    let (qd, sd) = per_token_group_quant(&x, rows, k, &Fp8Config::DEEPSEEK_V3.activation_quant()).unwrap();
    assert_eq!(sd[0], 1e-4 / 448.0, "DeepSeek: amax floored at 1e-4");
    assert_eq!(qd[..128].iter().map(|v| v.to_f32().abs()).fold(0f32, f32::max), 128.0);
    // The second group peaks at 1.0, above both floors: the same scale and values under either family.
    assert_eq!((s[1], &q[128..]), (sd[1], &qd[128..]));
    // The eps travels with the experts from the config to the layer's quantisation.
    let (e, h, i) = (2usize, 128usize, 128usize);
    let w13: Vec<bf16> = weight(e * 2 * i, h, 5).into_iter().map(bf16::from_f32).collect();
    let w2: Vec<bf16> = weight(e * h, i, 6).into_iter().map(bf16::from_f32).collect();
    let packed = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13, w2, None, None).unwrap();
    for (config, eps) in [(Fp8Config::QWEN3, VLLM_EPS), (Fp8Config::DEEPSEEK_V3, DEEPSEEK_EPS)] {
        let p = PackedFp8Experts::quantize(&packed, &config).unwrap();
        assert_eq!(p.activation_quant(), config.activation_quant());
        assert_eq!(p.activation_quant().eps(), eps);
        let host = moe_gemm::reference::Fp8HostLayer::new(&p, moe_gemm::Activation::SiluGated);
        assert_eq!(host.quant.eps(), eps);
    }
    let v31 = PackedFp8Experts::quantize(&packed, &Fp8Config::DEEPSEEK_V3_1).unwrap();
    assert_eq!(v31.activation_quant(), GroupQuant::DEEPSEEK_UE8M0);
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
        (r#"{"quant_method": "fp8"}"#, "declares per-tensor weight scales"),
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
        Err(Error::Checkpoint { tensor, problem, .. }) => (tensor, problem),
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
