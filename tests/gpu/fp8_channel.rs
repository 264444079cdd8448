//! The MoE layer over per-channel and per-tensor FP8 expert weights (`MoeLayer<bf16, Fp8ChannelExpertWeights>`)
//! on its backends (Batched: the FP8 decode kernels; Fused: the FP8 fused GEMMs; Grouped, Contiguous, Masked: the
//! FP8 rowwise grouped GEMM), against
//!
//! * the CPU reference (`moe_forward_fp8_channel`: the same e4m3 operands, one scale per token and per channel)
//!   under the FP8 layer bound (`fp8_layer_mismatch`), and
//! * the bf16 layer over the dequantised weights under `fp8_vs_dense_tolerance(Dequantised)`,
//!
//! with per-token (dynamic), dynamic per-tensor and static per-tensor activation scales, per-channel and per-tensor weight scales,
//! the FP8 layer tests' adversarial routing (groups of 0, 1, 5 and 129 rows), passes, a scale swap caught and
//! CUDA-graph replays bit-equal to eager, and interleaved gate/up experts bit-equal to concatenated ones. Weights
//! are random with every row scaled by its own factor in 1/4 .. 4, so channel scales differ between rows and
//! experts and a scale read from the wrong row or expert is seen.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::experts::CHANNEL_ACT_EPS;
use moe_gemm::experts::{Fp8ChannelExperts, StaticInputScales};
use moe_gemm::layer::{AutoSource, Fp8ChannelExpertWeights};
use moe_gemm::quant::{
    per_row_block, quantize_element, ActivationScales, BlockFp8, BlockShape, Fp8TokenRows, GroupQuant, ScaleFormat,
    ScaleRounding, TokenScale,
};
use moe_gemm::reference::{fp8_layer_mismatch, fp8_vs_dense_mismatch, moe_forward_fp8_channel, DenseWeights};
use moe_gemm::*;

use crate::common::*;
use crate::layer::{views, weights_for, Rig};

const BACKENDS: [Backend; 5] =
    [Backend::Batched, Backend::Fused, Backend::Grouped, Backend::Contiguous, Backend::Masked];

/// `[rows, cols]` random weights, each row scaled by its own factor in 1/4 .. 4, quantised per row (or per
/// tensor).
fn matrix(rows: usize, cols: usize, per_row: bool, seed: u64) -> BlockFp8 {
    let mut rng = Rng(seed);
    let w: Vec<f32> = (0..rows)
        .flat_map(|_| {
            let f = 4f32.powf(rng.unit()) * 0.15;
            (0..cols).map(|_| rng.unit() * f).collect::<Vec<_>>()
        })
        .collect();
    let block = if per_row { per_row_block(cols) } else { BlockShape { rows, cols } };
    BlockFp8::quantize(&w, rows, cols, block, ScaleFormat::F32).unwrap()
}

fn host_experts(e: usize, h: usize, i: usize, per_row: bool, acts: ActivationScales, seed: u64) -> Fp8ChannelExperts {
    let per: Vec<(BlockFp8, BlockFp8, BlockFp8)> = (0..e as u64)
        .map(|x| {
            let s = seed + 10 * x;
            (matrix(i, h, per_row, s), matrix(i, h, per_row, s + 1), matrix(h, i, per_row, s + 2))
        })
        .collect();
    // Static scales as a calibration sets them, so that nothing saturates: x is uniform in [-1, 1) (the tests'
    // inputs), h's largest magnitude is measured over a calibration batch through every expert, with a margin of
    // 1.5 for the test batches; each expert's scales differ a little (the layer takes the largest).
    let statics = (acts == ActivationScales::StaticTensor).then(|| {
        let h_amax = calibrated_h_amax(&per, h, i);
        let w13 = (0..e).map(|x| (1.0 + 0.1 * x as f32) / 448.0).collect();
        let w2 = (0..e).map(|x| 1.5 * h_amax * (1.0 + 0.05 * x as f32) / 448.0).collect();
        StaticInputScales::new(w13, w2).unwrap()
    });
    Fp8ChannelExperts::new(per, acts, statics).unwrap()
}

/// The largest |SiLU(gate) · up| of 64 calibration tokens (uniform in [-1, 1), as the tests' inputs) through every
/// expert's dequantised weights, in f32.
fn calibrated_h_amax(per: &[(BlockFp8, BlockFp8, BlockFp8)], h: usize, i: usize) -> f32 {
    let x: Vec<f32> = random_vec::<bf16>(64 * h, 77, 1.0).iter().map(|v| v.to_f32()).collect();
    let mut amax = 0f32;
    for (gate, up, _) in per {
        let (g, u) = (gate.dequantize(), up.dequantize());
        for xr in x.chunks(h) {
            for n in 0..i {
                let dot = |w: &[f32]| w[n * h..(n + 1) * h].iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
                let (gv, uv) = (dot(&g), dot(&u));
                amax = amax.max((gv / (1.0 + (-gv).exp()) * uv).abs());
            }
        }
    }
    amax
}

struct ChannelRig {
    stream: Arc<CudaStream>,
    layer: MoeLayer<bf16, Fp8ChannelExpertWeights>,
    scratch: MoeScratch<bf16>,
}

impl ChannelRig {
    fn new(p: &Fp8ChannelExperts, max_tokens: usize, k: usize) -> ChannelRig {
        let (_ctx, stream) = gpu();
        let w = Fp8ChannelExpertWeights::upload(&stream, p, Activation::SiluGated).unwrap();
        ChannelRig::of(stream, w, max_tokens, k)
    }

    fn of(stream: Arc<CudaStream>, w: Fp8ChannelExpertWeights, max_tokens: usize, k: usize) -> ChannelRig {
        let opts = MoeLayerOptions::new(max_tokens, k).backends(Backends::FP8_CHANNEL);
        let layer = MoeLayer::new(&stream, Arc::new(w), opts).unwrap();
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        ChannelRig { stream, layer, scratch }
    }

    fn forward(&mut self, backend: Backend, x: &[bf16], ids: &[i32], wts: &[f32]) -> Vec<bf16> {
        let (y, checked) = self.forward_unchecked(backend, x, ids, wts);
        checked.unwrap();
        y
    }

    /// The output and what the scratch's status check said of the pass.
    fn forward_unchecked(&mut self, backend: Backend, x: &[bf16], ids: &[i32], wts: &[f32]) -> (Vec<bf16>, Result<()>) {
        let h = self.layer.weights().hidden();
        let k = ids.len() / (x.len() / h);
        let (xd, idd, wd) = (
            self.stream.clone_htod(x).unwrap(),
            self.stream.clone_htod(ids).unwrap(),
            self.stream.clone_htod(wts).unwrap(),
        );
        let mut y = self.stream.clone_htod(&vec![bf16::NAN; x.len()]).unwrap();
        self.layer.set_backend(backend).unwrap();
        let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
        let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
        self.layer.forward(&self.stream, &mut self.scratch, &xv, &iv, &wv, &mut yv).unwrap();
        let checked = self.scratch.check(&self.stream);
        (self.stream.clone_dtoh(&y).unwrap(), checked)
    }
}

/// The bf16 layer over the experts' dequantised weights (rounded to bf16).
fn dequantised(p: &Fp8ChannelExperts) -> PackedExperts<bf16> {
    let (e, h, i) = (p.experts(), p.hidden(), p.inter());
    let w13: Vec<bf16> = p.w13().iter().flat_map(|m| m.dequantize()).map(bf16::from_f32).collect();
    let w2: Vec<bf16> = p.w2().iter().flat_map(|m| m.dequantize()).map(bf16::from_f32).collect();
    PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13, w2, None, None).unwrap()
}

/// Every backend against the CPU reference and the dequantised bf16 layer.
fn check(what: &str, p: &Fp8ChannelExperts, max_tokens: usize, k: usize, ids: &[i32], wts: &[f32]) {
    let h = p.hidden();
    let t = ids.len() / k;
    let x = random_vec::<bf16>(t * h, 1000 + t as u64, 1.0);
    let want = moe_forward_fp8_channel(p, Activation::SiluGated, &x, ids, wts, k);
    let mut dense = Rig::new(&dequantised(p), max_tokens, k);
    let (idd, wd): (CudaSlice<i32>, CudaSlice<f32>) =
        (dense.stream.clone_htod(ids).unwrap(), dense.stream.clone_htod(wts).unwrap());
    let bf16_out = dense.forward(Backend::Grouped, &x, &idd, &wd);
    let mut rig = ChannelRig::new(p, max_tokens, k);
    for backend in BACKENDS {
        let got = rig.forward(backend, &x, ids, wts);
        if let Some(m) = fp8_layer_mismatch(&got, &want, h) {
            panic!("{what} [{backend:?}] vs the CPU reference: {m}");
        }
        if let Some(m) = fp8_vs_dense_mismatch(&got, &bf16_out, DenseWeights::Dequantised) {
            panic!("{what} [{backend:?}] vs the dequantised bf16 layer: {m}");
        }
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_layer_matches_its_references_on_adversarial_routing() {
    let (e, h, i, k) = (8usize, 512usize, 256usize, 2usize);
    for (name, per_row, acts) in [
        ("channel weights, per-token activations", true, ActivationScales::DynamicToken),
        ("tensor weights, static activations", false, ActivationScales::StaticTensor),
        ("channel weights, static activations", true, ActivationScales::StaticTensor),
        ("tensor weights, dynamic per-tensor activations", false, ActivationScales::DynamicTensor),
        ("channel weights, dynamic per-tensor activations", true, ActivationScales::DynamicTensor),
    ] {
        let p = host_experts(e, h, i, per_row, acts, 1);
        let ids = |t: usize, k: usize, seed: u64| moe_gemm::random::topk_ids(t, k, e, seed);
        check(&format!("{name}: uniform E8 k2"), &p, 160, k, &ids(64, k, 2), &weights_for(64, k, 3));
        let hot: Vec<i32> =
            moe_gemm::random::topk_ids(64, 1, 7, 4).iter().flat_map(|&x| [3, if x >= 3 { x + 1 } else { x }]).collect();
        check(&format!("{name}: one hot expert"), &p, 160, k, &hot, &weights_for(64, k, 5));
        let no_zero: Vec<i32> = moe_gemm::random::topk_ids(50, k, e - 1, 6).iter().map(|&x| x + 1).collect();
        check(&format!("{name}: expert 0 gets no rows"), &p, 160, k, &no_zero, &weights_for(50, k, 7));
        check(&format!("{name}: T = 1"), &p, 160, k, &[6, 1], &[0.7, 0.3]);
        check(&format!("{name}: 5 rows on one expert"), &p, 160, 1, &[4; 5], &[1.0; 5]);
        check(&format!("{name}: 129 rows on one expert"), &p, 160, 1, &[2; 129], &weights_for(129, 1, 8));
        // A per-tensor scale is one pass's (the reference takes the whole batch's): passes only per token/static.
        if acts != ActivationScales::DynamicTensor {
            check(
                &format!("{name}: 300 tokens in passes of 128"),
                &p,
                128,
                k,
                &ids(300, k, 12),
                &weights_for(300, k, 13),
            );
        }
    }
}

/// Two experts' w13 channel scales swapped (the same e4m3 values under the other expert's scales): the layer's
/// output leaves the bound of the original's reference, so a scale read from the wrong expert is caught.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_swapped_scales_are_caught() {
    let (e, h, i, k, t) = (8usize, 512usize, 256usize, 2usize, 64usize);
    let p = host_experts(e, h, i, true, ActivationScales::DynamicToken, 31);
    let ids = moe_gemm::random::topk_ids(t, k, e, 32);
    let wts = weights_for(t, k, 33);
    let x = random_vec::<bf16>(t * h, 34, 1.0);
    let want = moe_forward_fp8_channel(&p, Activation::SiluGated, &x, &ids, &wts, k);
    let per: Vec<(BlockFp8, BlockFp8, BlockFp8)> = (0..e)
        .map(|x| {
            // Expert 0's and 1's gate and up matrices keep their e4m3 values and take each other's scales.
            let o = match x {
                0 => 1,
                1 => 0,
                x => x,
            };
            let with_scales = |m: &BlockFp8, s: &BlockFp8| {
                BlockFp8::from_parts(m.rows(), m.cols(), m.block(), m.q().to_vec(), s.scales().clone()).unwrap()
            };
            let (w13, w13o) = (&p.w13()[x], &p.w13()[o]);
            let gate = |m: &BlockFp8| m.slice_rows(0, i).unwrap();
            let up = |m: &BlockFp8| m.slice_rows(i, 2 * i).unwrap();
            (with_scales(&gate(w13), &gate(w13o)), with_scales(&up(w13), &up(w13o)), p.w2()[x].clone())
        })
        .collect();
    let swapped = Fp8ChannelExperts::new(per, ActivationScales::DynamicToken, None).unwrap();
    let mut rig = ChannelRig::new(&swapped, t, k);
    for backend in BACKENDS {
        let got = rig.forward(backend, &x, &ids, &wts);
        assert!(fp8_layer_mismatch(&got, &want, h).is_some(), "[{backend:?}] swapped scales not caught");
    }
}

/// Static activation scales are device data (`Fp8ChannelExpertWeights::static_input_scales_mut`): one that is not
/// finite and positive, GEMM1's (x) or GEMM2's (h), is replaced by 1 and flagged `BAD_STATIC_SCALE` on every
/// backend, its output finite; the calibrated pair flags nothing.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_corrupted_static_scales_are_flagged() {
    let (e, h, i, k, t) = (8usize, 512usize, 256usize, 2usize, 16usize);
    let p = host_experts(e, h, i, false, ActivationScales::StaticTensor, 41);
    let ids = moe_gemm::random::topk_ids(t, k, e, 42);
    let wts = weights_for(t, k, 43);
    let x = random_vec::<bf16>(t * h, 44, 1.0);
    // (which scale, the value written there): None keeps the calibrated pair.
    let cases =
        [(None, 0.0f32), (Some("x"), 0.0), (Some("x"), f32::NAN), (Some("h"), -0.5), (Some("h"), f32::INFINITY)];
    for (which, bad) in cases {
        let (_ctx, stream) = gpu();
        let mut w = Fp8ChannelExpertWeights::upload(&stream, &p, Activation::SiluGated).unwrap();
        let (sx, sh) = w.static_input_scales_mut().expect("static scales on the device");
        match which {
            Some("x") => stream.memcpy_htod(&[bad], sx).unwrap(),
            Some(_) => stream.memcpy_htod(&[bad], sh).unwrap(),
            None => {}
        }
        let mut rig = ChannelRig::of(stream, w, t, k);
        for backend in BACKENDS {
            let (out, checked) = rig.forward_unchecked(backend, &x, &ids, &wts);
            let what = format!("[{backend:?}] {} scale {bad}", which.unwrap_or("no"));
            let word = crate::quant::status_word(checked);
            assert_eq!(word, if which.is_some() { status::bits::BAD_STATIC_SCALE } else { 0 }, "{what}: status");
            assert!(out.iter().all(|v| v.is_finite()), "{what}: a non-finite output");
        }
    }
}

/// Interleaved gate/up (gpt-oss's row order, `Fp8ChannelExperts::from_gate_up`): the layer over them is bit-equal
/// to the layer over the same experts concatenated on every backend; the interleaved rows read as concatenated
/// (a missing reorder) change the output on every backend.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_interleaved_experts_equal_concatenated_ones() {
    let (e, h, i, k, t) = (8usize, 256usize, 128usize, 2usize, 40usize);
    let ids = moe_gemm::random::topk_ids(t, k, e, 82);
    let wts = weights_for(t, k, 83);
    let x = random_vec::<bf16>(t * h, 84, 1.0);
    for (per_row, acts) in [(true, ActivationScales::DynamicToken), (false, ActivationScales::StaticTensor)] {
        let p = host_experts(e, h, i, per_row, acts, 81);
        let inter: Vec<(BlockFp8, BlockFp8)> =
            p.w13().iter().zip(p.w2()).map(|(w13, w2)| (interleave_w13(w13), w2.clone())).collect();
        let make = |order| Fp8ChannelExperts::from_gate_up(inter.clone(), order, acts, p.static_scales().cloned());
        let (mut concat, mut interleaved) =
            (ChannelRig::new(&p, t, k), ChannelRig::new(&make(GateUp::Interleaved).unwrap(), t, k));
        let mut unordered = ChannelRig::new(&make(GateUp::Concatenated).unwrap(), t, k);
        for backend in BACKENDS {
            let want = concat.forward(backend, &x, &ids, &wts);
            let got = interleaved.forward(backend, &x, &ids, &wts);
            let same = |a: &[bf16]| a.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&got), "{acts:?} [{backend:?}]: interleaved experts differ from concatenated ones");
            let moved = unordered.forward(backend, &x, &ids, &wts);
            assert!(!same(&moved), "{acts:?} [{backend:?}]: interleaved rows read as concatenated went unseen");
        }
    }
}

/// Captured once, replayed with new routing: bit-equal to eager runs of the same inputs, on every backend.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_layer_replays_in_a_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (e, h, i, k, t) = (8usize, 256usize, 128usize, 2usize, 48usize);
    let p = host_experts(e, h, i, true, ActivationScales::DynamicToken, 41);
    let mut rig = ChannelRig::new(&p, t, k);
    let s = rig.stream.clone();
    for backend in BACKENDS {
        rig.layer.set_backend(backend).unwrap();
        let x = s.clone_htod(&random_vec::<bf16>(t * h, 42, 1.0)).unwrap();
        let mut ids = s.clone_htod(&moe_gemm::random::topk_ids(t, k, e, 43)).unwrap();
        let mut wts = s.clone_htod(&weights_for(t, k, 44)).unwrap();
        let mut y = s.alloc_zeros::<bf16>(t * h).unwrap();
        let run = |rig: &mut ChannelRig, ids: &CudaSlice<i32>, wts: &CudaSlice<f32>, y: &mut CudaSlice<bf16>| {
            let (xv, iv, wv) = views(&x, h, ids, wts, k);
            let mut yv = MatrixViewMut::of("y", y, h).unwrap();
            rig.layer.forward(&s, &mut rig.scratch, &xv, &iv, &wv, &mut yv).unwrap();
        };
        run(&mut rig, &ids, &wts, &mut y);
        s.synchronize().unwrap();
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        run(&mut rig, &ids, &wts, &mut y);
        let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
        for r in 0..10u64 {
            s.memcpy_htod(&moe_gemm::random::topk_ids(t, k, e, 100 + r), &mut ids).unwrap();
            s.memcpy_htod(&weights_for(t, k, 200 + r), &mut wts).unwrap();
            graph.launch().unwrap();
            let replayed = s.clone_dtoh(&y).unwrap();
            let mut eager = s.alloc_zeros::<bf16>(t * h).unwrap();
            run(&mut rig, &ids, &wts, &mut eager);
            let eager = s.clone_dtoh(&eager).unwrap();
            assert!(
                replayed.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                "[{backend:?}] replay {r}: the graph's output differs from eager"
            );
        }
        rig.scratch.check(&s).unwrap();
    }
}

/// What the layer refuses of these weights, by name, before anything runs: Eager (no FP8 form), and Batched and
/// Fused where H is not whole 128-column blocks (Auto then runs Grouped alone). Where the decode kernels take the
/// shape, Auto runs Batched at T = 1 (the FP8 cost model).
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_refusals_name_the_constraint() {
    let (_ctx, stream) = gpu();
    let p = host_experts(4, 256, 128, true, ActivationScales::DynamicToken, 51);
    let w = Arc::new(Fp8ChannelExpertWeights::upload(&stream, &p, Activation::SiluGated).unwrap());
    let e = MoeLayer::new(&stream, w.clone(), MoeLayerOptions::new(16, 2).backend(Backend::Eager)).unwrap_err();
    assert!(e.to_string().contains("per-channel FP8") && e.to_string().contains("eager"), "{e}");
    let auto = MoeLayer::new(&stream, w, MoeLayerOptions::new(16, 2)).unwrap();
    assert_eq!((auto.backend_for(1), auto.auto_source()), (Backend::Batched, AutoSource::CostModel));
    let odd = host_experts(4, 144, 128, true, ActivationScales::DynamicToken, 52);
    let w = Arc::new(Fp8ChannelExpertWeights::upload(&stream, &odd, Activation::SiluGated).unwrap());
    for b in [Backend::Batched, Backend::Fused] {
        let e = MoeLayer::new(&stream, w.clone(), MoeLayerOptions::new(16, 2).backend(b)).unwrap_err().to_string();
        assert!(e.contains("H = 144") && e.contains("multiples of 128") && e.contains(b.name()), "{b}: {e}");
    }
    let auto = MoeLayer::new(&stream, w, MoeLayerOptions::new(16, 2)).unwrap();
    assert_eq!(auto.backend_for(1), Backend::Grouped);
}

/// Dynamic per-tensor scales on the device: every row takes `max(amax, 1/512) / 448` of all the rows quantised,
/// bit for bit the host's scale, and every element the host's e4m3; a second call on a smaller tensor takes its own
/// amax (the word is reset per call, not kept); rows that hold no amax word are refused by name. A scale taken per
/// row, or an amax kept from the call before, fails the first two checks.
#[test]
#[ignore = "needs an SM90 GPU"]
fn dynamic_per_tensor_scales_are_one_amax_over_every_row() {
    let (_ctx, stream) = gpu();
    let (rows, k) = (37usize, 384usize);
    let quant = GroupQuant::new(CHANNEL_ACT_EPS, ScaleRounding::Exact).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let mut q = Fp8TokenRows::zeros(&stream, rows, k).unwrap();
    for (round, peak) in [(0u64, -9.5f32), (1, 2.25)] {
        let mut x: Vec<bf16> = random_vec::<bf16>(rows * k, 61 + round, 1.0);
        x[5 * k + 17] = bf16::from_f32(peak); // the tensor's amax, in one row only
        let xd = stream.clone_htod(&x).unwrap();
        let xv = MatrixView::of("x", &xd, k).unwrap();
        q.quantize(&stream, &xv, &TokenScale::DynamicTensor(quant), &mut st).unwrap();
        let want = quant.scale(peak.abs());
        let scales = stream.clone_dtoh(&q.scales()).unwrap();
        assert!(scales.iter().all(|s| s.to_bits() == want.to_bits()), "round {round}: {:?} != {want}", &scales[..4]);
        let got = stream.clone_dtoh(&q.q()).unwrap();
        for (n, v) in x.iter().enumerate() {
            let e = quantize_element(v.to_f32(), want);
            assert_eq!(got[n].to_bits(), e.to_bits(), "round {round}, element {n}: {v}");
        }
    }
    st.check(&stream).unwrap();
    let mut bare =
        Fp8TokenRows::new(stream.alloc_zeros(rows * k).unwrap(), stream.alloc_zeros(rows).unwrap(), rows, k).unwrap();
    let xd = stream.clone_htod(&vec![bf16::ONE; rows * k]).unwrap();
    let xv = MatrixView::of("x", &xd, k).unwrap();
    let e = bare.quantize(&stream, &xv, &TokenScale::DynamicTensor(quant), &mut st).unwrap_err().to_string();
    assert!(e.contains("amax word"), "{e}");
}

/// Experts built on the device (`Fp8ChannelExpertWeights::from_device`, what a server with its own loader or the
/// bench uses) run the same function as uploaded ones: outputs bit-equal, per-token and per-tensor scales; shapes
/// that do not chain and static scales are refused by name.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_channel_experts_from_the_device_equal_uploaded_ones() {
    let (e, h, i, k, t) = (8usize, 256usize, 128usize, 2usize, 40usize);
    let x = random_vec::<bf16>(t * h, 71, 1.0);
    let ids = moe_gemm::random::topk_ids(t, k, e, 72);
    let wts = weights_for(t, k, 73);
    for acts in [ActivationScales::DynamicToken, ActivationScales::DynamicTensor] {
        let p = host_experts(e, h, i, true, acts, 74);
        let mut uploaded = ChannelRig::new(&p, t, k);
        let want = uploaded.forward(Backend::Grouped, &x, &ids, &wts);
        let s = &uploaded.stream;
        let (w13, w2) = (
            moe_gemm::quant::Fp8ChannelWeights::from_host(s, p.w13()).unwrap(),
            moe_gemm::quant::Fp8ChannelWeights::from_host(s, p.w2()).unwrap(),
        );
        let w = Arc::new(Fp8ChannelExpertWeights::from_device(w13, w2, Activation::SiluGated, acts).unwrap());
        let layer = MoeLayer::new(s, w, MoeLayerOptions::new(t, k).backends(Backends::FP8_CHANNEL)).unwrap();
        let scratch = MoeScratch::for_layers(s, [&layer]).unwrap();
        let mut rig = ChannelRig { stream: s.clone(), layer, scratch };
        let got = rig.forward(Backend::Grouped, &x, &ids, &wts);
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{acts:?}: outputs differ");
    }
    let (_ctx, stream) = gpu();
    let p = host_experts(e, h, i, true, ActivationScales::DynamicToken, 75);
    let w = |m| moe_gemm::quant::Fp8ChannelWeights::from_host(&stream, m).unwrap();
    let e1 = Fp8ChannelExpertWeights::from_device(
        w(p.w2()),
        w(p.w2()),
        Activation::SiluGated,
        ActivationScales::DynamicToken,
    )
    .unwrap_err()
    .to_string();
    assert!(e1.contains("do not chain"), "{e1}");
    let e2 = Fp8ChannelExpertWeights::from_device(
        w(p.w13()),
        w(p.w2()),
        Activation::SiluGated,
        ActivationScales::StaticTensor,
    )
    .unwrap_err()
    .to_string();
    assert!(e2.contains("StaticTensor") && e2.contains("upload"), "{e2}");
}
