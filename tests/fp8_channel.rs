//! Per-tensor and per-channel FP8 checkpoints on the CPU, in both `quantization_config` forms: experts written as
//! the releases write them (Mixtral naming, `weight_scale`, `input_scale`) are read back into per-row experts
//! that dequantise to the checkpoint's values, every broken tensor is an error naming it, and the layer's CPU
//! reference over them agrees with an independent dequantised computation and catches two experts' scales
//! swapped.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::Rng;
use half::bf16;
use moe_gemm::checkpoint::{Checkpoint, ExpertNaming, Fp8ChannelExperts, Fp8Scheme};
use moe_gemm::experts::Activation;
use moe_gemm::quant::{ActivationScales, BlockFp8, BlockShape, Scales, WeightScales, F8E4M3};
use moe_gemm::reference::moe_forward_fp8_channel;
use moe_gemm::Error;
use safetensors::tensor::{Dtype, TensorView};

const PREFIX: &str = "model.layers.0.block_sparse_moe";
const CT_CHANNEL_TOKEN: &str = r#"{"quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true, "dynamic": true}}}}"#;
const FP8_STATIC: &str = r#"{"quant_method": "fp8", "activation_scheme": "static"}"#;

fn scheme(qc: &str) -> Fp8Scheme {
    let text = format!(r#"{{"architectures": ["MixtralForCausalLM"], "quantization_config": {qc}}}"#);
    Fp8Scheme::from_config_json(&text).unwrap().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moe-gemm-fp8-channel-{}-{name}.safetensors", std::process::id()))
}

/// A tensor to write: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn write(path: &std::path::Path, store: &[Tensor]) {
    let views: HashMap<String, TensorView<'_>> =
        store.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One weight `[rows, cols]` quantised per tensor or per row as llm-compressor does (`scale = amax / 448`,
/// dequantisation multiplier), rows of very different magnitudes so that a scale read from the wrong row shows.
/// `mag` scales the whole weight (experts of different magnitudes: a scale read from the wrong expert shows too).
fn quantised(rows: usize, cols: usize, per_row: bool, seed: u64, mag: f32) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed);
    let w: Vec<f32> = (0..rows * cols).map(|i| rng.unit() * (1 << ((i / cols) % 6)) as f32 * 0.005 * mag).collect();
    let amax = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scales: Vec<f32> =
        if per_row { w.chunks(cols).map(|r| amax(r) / 448.0).collect() } else { vec![amax(&w) / 448.0] };
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &x)| F8E4M3::from_f32(x / scales[if per_row { i / cols } else { 0 }]).to_bits())
        .collect();
    (q, scales)
}

struct Written {
    /// Per expert, (gate, up, down): e4m3 bytes and scales as written.
    experts: Vec<[(Vec<u8>, Vec<f32>); 3]>,
    /// Per expert, (gate, up, down) input scales, where written.
    input: Vec<[f32; 3]>,
}

/// `e` Mixtral-named experts with `weight_scale` per channel (`[N, 1]`) or per tensor (`[]`), and where `input`
/// gives (GEMM1's, GEMM2's) calibrated scale, input scales near it (a few percent apart per expert and weight).
fn checkpoint(
    path: &std::path::Path,
    e: usize,
    h: usize,
    i: usize,
    per_row: bool,
    input: Option<(f32, f32)>,
) -> Written {
    let mut store = Vec::new();
    let mut written = Written { experts: vec![], input: vec![] };
    for x in 0..e {
        let names = ExpertNaming::Mixtral.names(PREFIX, x);
        let shapes = [(i, h), (i, h), (h, i)];
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..3)
            .map(|m| quantised(shapes[m].0, shapes[m].1, per_row, (x * 3 + m) as u64 + 11, 1.0 + 0.5 * x as f32))
            .collect();
        let mut ins = [0f32; 3];
        for m in 0..3 {
            let (rows, cols) = shapes[m];
            store.push((names[m].clone(), Dtype::F8_E4M3, vec![rows, cols], mats[m].0.clone()));
            let sshape = if per_row { vec![rows, 1] } else { vec![] };
            store.push((format!("{}_scale", names[m]), Dtype::F32, sshape, f32_bytes(&mats[m].1)));
            let base = input.map_or(0.01, |(a, b)| if m < 2 { a } else { b });
            ins[m] = base * (1.0 + 0.05 * (x + m) as f32);
            if input.is_some() {
                let n = format!("{}.input_scale", names[m].strip_suffix(".weight").unwrap());
                store.push((n, Dtype::F32, vec![1], f32_bytes(&[ins[m]])));
            }
        }
        written.experts.push([mats[0].clone(), mats[1].clone(), mats[2].clone()]);
        written.input.push(ins);
    }
    write(path, &store);
    written
}

fn row_scales(m: &BlockFp8) -> Vec<f32> {
    match m.scales() {
        Scales::F32(s) => s.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn per_channel_experts_read_back_as_written() {
    let (e, h, i) = (3, 64, 32);
    let path = tmp("channel");
    let w = checkpoint(&path, e, h, i, true, None);
    let c = Checkpoint::open(&path).unwrap();
    let s = scheme(CT_CHANNEL_TOKEN);
    // One weight as stored: a 1 x K block per row, the written scales.
    let gate0 = c.fp8_scaled_weight(&ExpertNaming::Mixtral.names(PREFIX, 0)[0], s.weights()).unwrap();
    assert_eq!((gate0.block(), row_scales(&gate0)), (BlockShape { rows: 1, cols: h }, w.experts[0][0].1.clone()));
    let p = c.pack_fp8_channel_experts(PREFIX, e, ExpertNaming::Mixtral, &s).unwrap();
    assert_eq!((p.experts(), p.hidden(), p.inter()), (e, h, i));
    assert_eq!(p.activations(), ActivationScales::DynamicToken);
    assert!(p.static_scales().is_none());
    for x in 0..e {
        let [g, u, d] = &w.experts[x];
        // w13 = [gate; up] row by row, each row with its own scale; w2 as written.
        let w13 = &p.w13()[x];
        assert_eq!(w13.q().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), [g.0.clone(), u.0.clone()].concat());
        assert_eq!(row_scales(w13), [g.1.clone(), u.1.clone()].concat());
        assert_eq!(row_scales(&p.w2()[x]), d.1);
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn per_tensor_experts_with_static_input_scales_read_back_per_row() {
    let (e, h, i) = (2, 32, 16);
    let path = tmp("tensor");
    let w = checkpoint(&path, e, h, i, false, Some((0.01, 0.02)));
    let c = Checkpoint::open(&path).unwrap();
    let s = scheme(FP8_STATIC);
    assert_eq!((s.weights(), s.activations()), (WeightScales::Tensor, ActivationScales::StaticTensor));
    let p = c.pack_fp8_channel_experts(PREFIX, e, ExpertNaming::Mixtral, &s).unwrap();
    for x in 0..e {
        let [g, u, d] = &w.experts[x];
        // Gate's and up's tensor scales, each repeated over its rows: exact, no requantisation.
        let want: Vec<f32> = std::iter::repeat_n(g.1[0], i).chain(std::iter::repeat_n(u.1[0], i)).collect();
        assert_eq!(row_scales(&p.w13()[x]), want);
        assert_eq!(row_scales(&p.w2()[x]), vec![d.1[0]; h]);
    }
    let st = p.static_scales().unwrap();
    // GEMM1's input scale per expert: the larger of gate's and up's; the layer's: the largest over the experts.
    let want13: Vec<f32> = w.input.iter().map(|s| s[0].max(s[1])).collect();
    let want2: Vec<f32> = w.input.iter().map(|s| s[2]).collect();
    assert_eq!((st.w13(), st.w2()), (want13.as_slice(), want2.as_slice()));
    assert_eq!(
        st.layer_scales(),
        (want13.iter().cloned().fold(0.0, f32::max), want2.iter().cloned().fold(0.0, f32::max))
    );
    std::fs::remove_file(&path).ok();
}

fn checkpoint_error(r: moe_gemm::Result<impl std::fmt::Debug>) -> (String, String) {
    match r {
        Err(Error::Checkpoint { tensor, problem, .. }) => (tensor, problem),
        other => panic!("expected Error::Checkpoint, got {other:?}"),
    }
}

#[test]
fn broken_scales_name_their_tensor() {
    let (h, i) = (32, 16);
    let gate = ExpertNaming::Mixtral.names(PREFIX, 0)[0].clone();
    let scale = format!("{gate}_scale");
    let (q, s) = quantised(i, h, true, 1, 1.0);
    let case = |name: &str, scale_t: Option<Tensor>| {
        let path = tmp(name);
        let mut store = vec![(gate.clone(), Dtype::F8_E4M3, vec![i, h], q.clone())];
        store.extend(scale_t);
        write(&path, &store);
        let c = Checkpoint::open(&path).unwrap();
        std::fs::remove_file(&path).ok();
        c
    };
    let cases: Vec<(&str, Option<Tensor>, WeightScales, &str, &str)> = vec![
        ("missing", None, WeightScales::Channel, &scale, "missing"),
        (
            "short",
            Some((scale.clone(), Dtype::F32, vec![i - 1, 1], f32_bytes(&s[1..]))),
            WeightScales::Channel,
            &scale,
            "expected [16] or [16, 1]",
        ),
        (
            "tensor-shape",
            Some((scale.clone(), Dtype::F32, vec![i], f32_bytes(&s))),
            WeightScales::Tensor,
            &scale,
            "expected [] or [1]",
        ),
        ("int", Some((scale.clone(), Dtype::I32, vec![i], f32_bytes(&s))), WeightScales::Channel, &scale, "dtype I32"),
        (
            "negative",
            Some((
                scale.clone(),
                Dtype::F32,
                vec![i],
                f32_bytes(&[s[..3].to_vec(), vec![-1.0], s[4..].to_vec()].concat()),
            )),
            WeightScales::Channel,
            &scale,
            "row 3's scale",
        ),
        (
            "block",
            Some((scale.clone(), Dtype::F32, vec![i], f32_bytes(&s))),
            WeightScales::Block(BlockShape { rows: 128, cols: 128 }),
            &gate,
            "fp8_block_weight",
        ),
    ];
    for (name, t, ws, want_tensor, want) in cases {
        let c = case(name, t);
        let (tensor, problem) = checkpoint_error(c.fp8_scaled_weight(&gate, ws));
        assert!(tensor == want_tensor && problem.contains(want), "{name}: {tensor}: {problem}");
    }
    // A static scheme without input scales names the missing one; a non-positive input scale is refused.
    let path = tmp("no-input");
    checkpoint(&path, 1, h, i, false, None);
    let c = Checkpoint::open(&path).unwrap();
    let (tensor, problem) =
        checkpoint_error(c.pack_fp8_channel_experts(PREFIX, 1, ExpertNaming::Mixtral, &scheme(FP8_STATIC)));
    assert!(tensor.ends_with("experts.0.w1.input_scale") && problem.contains("missing"), "{tensor}: {problem}");
    // A block scheme is not read here.
    let block = scheme(r#"{"quant_method": "fp8", "weight_block_size": [128, 128]}"#);
    let (tensor, problem) = checkpoint_error(c.pack_fp8_channel_experts(PREFIX, 1, ExpertNaming::Mixtral, &block));
    assert!(tensor == PREFIX && problem.contains("pack_fp8_experts"), "{tensor}: {problem}");
    std::fs::remove_file(&path).ok();
    let path = tmp("zero-input");
    let mut store = vec![(gate.clone(), Dtype::F8_E4M3, vec![i, h], q.clone())];
    let iname = format!("{}.input_scale", gate.strip_suffix(".weight").unwrap());
    store.push((iname.clone(), Dtype::F32, vec![], f32_bytes(&[0.0])));
    write(&path, &store);
    let c = Checkpoint::open(&path).unwrap();
    let (tensor, problem) = checkpoint_error(c.fp8_input_scale(&gate));
    assert!(tensor == iname && problem.contains("not a finite, positive scale"), "{tensor}: {problem}");
    std::fs::remove_file(&path).ok();
}

/// The per-row experts of `w` dequantised: (w13 `[2I, H]`, w2 `[H, I]`) per expert, f32.
fn dequantised(p: &Fp8ChannelExperts) -> Vec<(Vec<f32>, Vec<f32>)> {
    (0..p.experts()).map(|x| (p.w13()[x].dequantize(), p.w2()[x].dequantize())).collect()
}

/// The layer in f32 over dequantised weights and unquantised activations: SwiGLU, no rounding but bf16 at the end.
/// Also returns the largest activation `h` (GEMM2's input), to calibrate static scales.
fn independent(
    w: &[(Vec<f32>, Vec<f32>)],
    h: usize,
    i: usize,
    x: &[bf16],
    ids: &[i32],
    wt: &[f32],
    k: usize,
) -> (Vec<f32>, f32) {
    let t = x.len() / h;
    let mut y = vec![0f32; t * h];
    let mut h_amax = 0f32;
    for tok in 0..t {
        let xr: Vec<f32> = x[tok * h..(tok + 1) * h].iter().map(|v| v.to_f32()).collect();
        for j in 0..k {
            let (w13, w2) = &w[ids[tok * k + j] as usize];
            let d1: Vec<f32> = (0..2 * i).map(|n| (0..h).map(|c| w13[n * h + c] * xr[c]).sum()).collect();
            let a: Vec<f32> = (0..i).map(|n| d1[n] / (1.0 + (-d1[n]).exp()) * d1[i + n]).collect();
            h_amax = a.iter().fold(h_amax, |m, v| m.max(v.abs()));
            for o in 0..h {
                y[tok * h + o] += wt[tok * k + j] * (0..i).map(|n| w2[o * i + n] * a[n]).sum::<f32>();
            }
        }
    }
    (y, h_amax)
}

#[test]
fn the_channel_reference_agrees_with_a_dequantised_layer_and_catches_swapped_scales() {
    let (e, h, i, k, t) = (4, 64, 32, 2, 9);
    let mut rng = Rng(5);
    let x: Vec<bf16> = (0..t * h).map(|_| bf16::from_f32(rng.unit() * 2.0)).collect();
    let ids: Vec<i32> = (0..t * k).map(|n| ((n * 3 + n / k) % e) as i32).collect();
    let wt: Vec<f32> = (0..t * k).map(|n| 0.25 + 0.5 * (n % 2) as f32).collect();
    for (name, per_row, qc) in [("ref-channel", true, CT_CHANNEL_TOKEN), ("ref-tensor", false, FP8_STATIC)] {
        let path = tmp(name);
        // Static scales calibrated as a quantiser would: from the activations' amax.
        checkpoint(&path, e, h, i, per_row, None);
        let dynamic = scheme(r#"{"quant_method": "fp8", "activation_scheme": "dynamic"}"#);
        let h_amax = {
            let c = Checkpoint::open(&path).unwrap();
            let s = if per_row { scheme(CT_CHANNEL_TOKEN) } else { dynamic };
            let p = c.pack_fp8_channel_experts(PREFIX, e, ExpertNaming::Mixtral, &s).unwrap();
            independent(&dequantised(&p), h, i, &x, &ids, &wt, k).1
        };
        let path = tmp(&format!("{name}-static"));
        let x_amax = x.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        checkpoint(&path, e, h, i, per_row, Some((x_amax / 448.0, h_amax / 448.0)));
        let c = Checkpoint::open(&path).unwrap();
        let mut variants = vec![];
        if !per_row {
            // Per-tensor weights with dynamic per-tensor activations, from the same tensors.
            variants.push(dynamic);
        }
        variants.push(scheme(qc));
        for s in variants {
            let p = c.pack_fp8_channel_experts(PREFIX, e, ExpertNaming::Mixtral, &s).unwrap();
            let got = moe_forward_fp8_channel(&p, Activation::SiluGated, &x, &ids, &wt, k);
            let (want, _) = independent(&dequantised(&p), h, i, &x, &ids, &wt, k);
            // Per token, the largest error relative to the token's largest output (the experts' magnitudes differ
            // by 2.5x and more in the output, so one norm over the batch would hide the small ones).
            let err = |g: &[bf16]| {
                g.chunks(h).zip(want.chunks(h)).fold(0f32, |m, (gr, wr)| {
                    let max = wr.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
                    m.max(gr.iter().zip(wr).fold(0f32, |m, (a, b)| m.max((a.to_f32() - b).abs())) / max)
                })
            };
            // The activations rounded to e4m3 twice (up to 2^-4 relative per element) through sums of 64 and 32
            // terms of mixed signs: 0.09 to 0.12 of a token's largest output here; scales read from the wrong
            // expert or row move tokens by 0.7.
            let e0 = err(&got);
            assert!(e0 < 0.2, "{s}: largest per-token error {e0}");
            // Two experts' w13 scales swapped: the same e4m3 values under the other expert's channel scales.
            let mut per: Vec<(BlockFp8, BlockFp8, BlockFp8)> = (0..e)
                .map(|x| {
                    let w13 = &p.w13()[x];
                    (w13.slice_rows(0, i).unwrap(), w13.slice_rows(i, 2 * i).unwrap(), p.w2()[x].clone())
                })
                .collect();
            let (a, b) = (row_scales(&per[0].0), row_scales(&per[1].0));
            let swap = |m: &BlockFp8, s: Vec<f32>| {
                BlockFp8::from_parts(m.rows(), m.cols(), m.block(), m.q().to_vec(), Scales::F32(s)).unwrap()
            };
            per[0].0 = swap(&per[0].0, b);
            per[1].0 = swap(&per[1].0, a);
            let swapped = Fp8ChannelExperts::new(per, p.activations(), p.static_scales().cloned()).unwrap();
            let e1 = err(&moe_forward_fp8_channel(&swapped, Activation::SiluGated, &x, &ids, &wt, k));
            assert!(e1 > 3.0 * e0, "{s}: swapped scales give {e1} against {e0}");
        }
        std::fs::remove_file(&path).ok();
    }
}

/// Per-channel and per-tensor FP8 experts with interleaved gate/up rows (gpt-oss's order) on the CPU: reordered
/// into `[gate; up]` exactly (every row's e4m3 bytes and scale bits those of the concatenated experts), so the
/// layer's reference over them is bit-equal; read as concatenated instead, the output moves (a missing reorder
/// is seen); scale blocks of several rows (block FP8) stay refused by name.
mod interleaved {
    use crate::common::{interleave_w13, Rng};
    use half::bf16;
    use moe_gemm::experts::{Activation, Fp8ChannelExperts, GateUp, StaticInputScales};
    use moe_gemm::quant::{per_row_block, ActivationScales, BlockFp8, BlockShape, ScaleFormat, Scales};
    use moe_gemm::reference::moe_forward_fp8_channel;

    /// `[rows, cols]` random weights, every row of its own magnitude (so per-row scales differ), quantised per row or
    /// per tensor.
    fn matrix(rows: usize, cols: usize, block: BlockShape, seed: u64) -> BlockFp8 {
        let mut rng = Rng(seed);
        let w: Vec<f32> = (0..rows * cols).map(|n| rng.unit() * (1 + (n / cols) % 7) as f32 * 0.02).collect();
        BlockFp8::quantize(&w, rows, cols, block, ScaleFormat::F32).unwrap()
    }

    /// Per expert, a fused concatenated `w13 [2I, H]` and `w2 [H, I]`, per row or per tensor.
    fn fused(e: usize, h: usize, i: usize, per_row: bool) -> Vec<(BlockFp8, BlockFp8)> {
        let block = |r, c| if per_row { per_row_block(c) } else { BlockShape { rows: r, cols: c } };
        (0..e as u64)
            .map(|x| (matrix(2 * i, h, block(2 * i, h), 10 * x), matrix(h, i, block(h, i), 10 * x + 1)))
            .collect()
    }

    /// The scales of `m`'s rows as bits: its own per row, or the tensor's repeated.
    fn row_scale_bits(m: &BlockFp8) -> Vec<u32> {
        let Scales::F32(s) = m.scales() else { panic!("F32 scales") };
        (0..m.rows()).map(|r| s[if m.block().rows == 1 { r } else { 0 }].to_bits()).collect()
    }

    fn bytes(m: &BlockFp8) -> Vec<u8> {
        m.q().iter().map(|q| q.to_bits()).collect()
    }

    fn schemes(e: usize) -> [(ActivationScales, Option<StaticInputScales>); 2] {
        let statics = StaticInputScales::new((0..e).map(|x| 0.004 + 0.001 * x as f32).collect(), vec![0.01; e]);
        [(ActivationScales::DynamicToken, None), (ActivationScales::StaticTensor, Some(statics.unwrap()))]
    }

    #[test]
    fn interleaved_w13_reorders_exactly_into_gate_then_up() {
        let (e, h, i) = (3, 32, 16);
        for per_row in [true, false] {
            let concat = fused(e, h, i, per_row);
            let inter: Vec<(BlockFp8, BlockFp8)> =
                concat.iter().map(|(w13, w2)| (interleave_w13(w13), w2.clone())).collect();
            assert_ne!(bytes(&inter[0].0), bytes(&concat[0].0), "the fixture must actually move rows");
            for (acts, statics) in schemes(e) {
                let want = Fp8ChannelExperts::from_gate_up(concat.clone(), GateUp::Concatenated, acts, statics.clone());
                let got = Fp8ChannelExperts::from_gate_up(inter.clone(), GateUp::Interleaved, acts, statics).unwrap();
                for (x, (w13, w2)) in concat.iter().enumerate() {
                    let what = format!("per_row {per_row}, {acts:?}, expert {x}");
                    assert_eq!(bytes(&got.w13()[x]), bytes(w13), "{what}: w13 rows");
                    assert_eq!(row_scale_bits(&got.w13()[x]), row_scale_bits(w13), "{what}: w13 scales");
                    assert_eq!(bytes(&got.w2()[x]), bytes(w2), "{what}: w2 untouched");
                    assert_eq!(row_scale_bits(&got.w2()[x]), row_scale_bits(w2), "{what}: w2 scales");
                }
                assert_eq!(got, want.unwrap(), "per_row {per_row}, {acts:?}");
            }
            if per_row {
                // Concatenated fused experts equal the same matrices given as gate, up, down.
                let split = concat
                    .iter()
                    .map(|(w13, w2)| (w13.slice_rows(0, i).unwrap(), w13.slice_rows(i, 2 * i).unwrap(), w2.clone()));
                let sep = Fp8ChannelExperts::new(split.collect(), ActivationScales::DynamicToken, None).unwrap();
                let via =
                    Fp8ChannelExperts::from_gate_up(inter, GateUp::Interleaved, ActivationScales::DynamicToken, None);
                assert_eq!(via.unwrap(), sep);
            }
        }
    }

    #[test]
    fn the_reference_over_interleaved_experts_is_bit_equal_and_a_missing_reorder_is_seen() {
        let (e, h, i, k, t) = (4, 64, 32, 2, 7);
        let mut rng = Rng(3);
        let x: Vec<bf16> = (0..t * h).map(|_| bf16::from_f32(rng.unit())).collect();
        let ids: Vec<i32> = (0..t * k).map(|n| ((n * 3 + n / k) % e) as i32).collect();
        let wts: Vec<f32> = (0..t * k).map(|n| 0.25 + 0.5 * (n % 2) as f32).collect();
        let bits = |y: Vec<bf16>| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for per_row in [true, false] {
            let concat = fused(e, h, i, per_row);
            let inter: Vec<(BlockFp8, BlockFp8)> =
                concat.iter().map(|(w13, w2)| (interleave_w13(w13), w2.clone())).collect();
            for (acts, statics) in schemes(e) {
                let make = |w: &[(BlockFp8, BlockFp8)], order| {
                    Fp8ChannelExperts::from_gate_up(w.to_vec(), order, acts, statics.clone()).unwrap()
                };
                let (want_p, got_p) = (make(&concat, GateUp::Concatenated), make(&inter, GateUp::Interleaved));
                let unordered = make(&inter, GateUp::Concatenated);
                for act in [Activation::SiluGated, Activation::GptOssSwiglu] {
                    let run = |p: &Fp8ChannelExperts| bits(moe_forward_fp8_channel(p, act, &x, &ids, &wts, k));
                    let want = run(&want_p);
                    let what = format!("per_row {per_row}, {acts:?}, {act:?}");
                    assert_eq!(run(&got_p), want, "{what}: interleaved vs concatenated");
                    assert_ne!(run(&unordered), want, "{what}: interleaved rows read as concatenated went unseen");
                }
            }
        }
    }

    #[test]
    fn interleaved_gate_up_refusals_name_their_constraint() {
        let (h, i) = (256, 128);
        let dyn_token = ActivationScales::DynamicToken;
        let err = |w13: BlockFp8, w2: BlockFp8, order| {
            Fp8ChannelExperts::from_gate_up(vec![(w13, w2)], order, dyn_token, None).unwrap_err().to_string()
        };
        // DeepSeek's 128 x 128 blocks: interleaved rows would share one 128-row block's scale.
        let block = |r, c, s| matrix(r, c, BlockShape::DEEPSEEK, s);
        let m = err(block(2 * i, h, 1), block(h, i, 2), GateUp::Interleaved);
        assert!(m.contains("expert 0") && m.contains("Interleaved") && m.contains("128-row"), "{m}");
        assert!(m.contains("one scale per row or per tensor"), "{m}");
        // Concatenated, block scales are still not per-channel experts (block FP8 has its own type).
        let m = err(block(2 * i, h, 1), block(h, i, 2), GateUp::Concatenated);
        assert!(m.contains("expert 0 w13") && m.contains("128 x 128") && m.contains("one scale per row"), "{m}");
        let row = |r, c, s| matrix(r, c, per_row_block(c), s);
        let m = err(row(2 * i + 1, h, 3), row(h, i, 4), GateUp::Interleaved);
        assert!(m.contains("expert 0") && m.contains("257 rows") && m.contains("even"), "{m}");
        // Down's shape is still checked against gate's and up's.
        let m = err(row(2 * i, h, 5), row(h, i + 16, 6), GateUp::Interleaved);
        assert!(m.contains("expert 0: down") && m.contains("[256, 144]"), "{m}");
    }
}
