//! The MoE layer over block-FP8 expert weights (`MoeLayer<bf16, Fp8ExpertWeights>`) on the Batched, Grouped,
//! Contiguous and Masked backends, against
//!
//! * the CPU FP8 reference (`moe_forward_fp8`; `moe_forward_fp8_with_shared` with a shared expert: the same
//!   quantised operands bit for bit, GEMMs in f64) under `Fp8LayerBound` (every element within `3 · 2^-6 · max`,
//!   every token row within `2^-7 · max + 2^-7 · |ref|` but `2 + T / 8` of them; derived in `reference`),
//!   and
//! * the bf16 layer on the dequantised weights under `fp8_vs_dense_tolerance` (`2^-3 · max`; the original bf16
//!   weights of a quantised checkpoint: `3 · 2^-4 · max`),
//!
//! on the layer tests' adversarial routing, DeepSeek-like routing, a mutation, graph replays and a checkpoint
//! round trip. Weights are random with every 128 x 128 block scaled by its own factor in 1/4 .. 4, so block
//! scales differ between blocks and experts and a scale read from the wrong block or expert is seen.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::checkpoint::{Checkpoint, ExpertNaming, Fp8Config, PackedFp8Experts};
use moe_gemm::dtype::DType;
use moe_gemm::layer::{auto_backend_fp8, GateUp, LayerGemm, LayerShape, Storage, WeightFormat};
use moe_gemm::quant::{BlockFp8, BlockShape, Fp8BlockWeights, Scales, F8E4M3};
use moe_gemm::reference::{
    fp8_layer_mismatch, fp8_vs_dense_mismatch, moe_forward, moe_forward_fp8, DenseWeights, Fp8HostLayer,
};
use moe_gemm::*;
use safetensors::tensor::{Dtype, TensorView};

use crate::common::*;
use crate::layer::{views, weights_for, Rig};

const FP8_BACKENDS: [Backend; 5] =
    [Backend::Batched, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];

/// `w` (experts of `[n, k]`) with every 128 x 128 block scaled by its own factor in 1/4 .. 4.
fn blocky(mut w: Vec<bf16>, n: usize, k: usize, seed: u64) -> Vec<bf16> {
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    let mut rng = Rng(seed);
    let f: Vec<f32> = (0..w.len() / (n * k) * gn * gk).map(|_| 4f32.powf(rng.unit())).collect();
    for (idx, v) in w.iter_mut().enumerate() {
        let (e, r, c) = (idx / (n * k), idx / k % n, idx % k);
        *v = bf16::from_f32(v.to_f32() * f[(e * gn + r / 128) * gk + c / 128]);
    }
    w
}

/// Random bf16 SwiGLU experts (block-scaled as above) and their FP8 quantisation under `config`.
fn experts(e: usize, h: usize, i: usize, config: &Fp8Config, seed: u64) -> (PackedExperts<bf16>, PackedFp8Experts) {
    let dense = PackedExperts::new(
        e,
        h,
        i,
        ExpertFormat::SWIGLU,
        blocky(random_vec(e * 2 * i * h, seed, 0.15), 2 * i, h, seed + 1),
        blocky(random_vec(e * h * i, seed + 2, 0.15), h, i, seed + 3),
        None,
        None,
    )
    .unwrap();
    let fp8 = PackedFp8Experts::quantize(&dense, config).unwrap();
    (dense, fp8)
}

/// The dense experts the FP8 ones stand for: dequantised, rounded to bf16.
fn dequantised(p: &PackedFp8Experts) -> PackedExperts<bf16> {
    let (mut w13, mut w2) = (Vec::new(), Vec::new());
    for e in 0..p.experts() {
        let (a, b) = p.expert(e).unwrap();
        w13.extend(a.dequantize().into_iter().map(bf16::from_f32));
        w2.extend(b.dequantize().into_iter().map(bf16::from_f32));
    }
    PackedExperts::new(p.experts(), p.hidden(), p.inter(), ExpertFormat::SWIGLU, w13, w2, None, None).unwrap()
}

/// An FP8 layer with room for Batched, Grouped, Contiguous and Masked, and its own scratch.
struct Fp8Rig {
    stream: Arc<CudaStream>,
    layer: MoeLayer<bf16, Fp8ExpertWeights>,
    scratch: MoeScratch<bf16>,
}

impl Fp8Rig {
    fn new(weights: Fp8ExpertWeights, stream: Arc<CudaStream>, max_tokens: usize, k: usize) -> Fp8Rig {
        let opts = MoeLayerOptions::new(max_tokens, k).backends(Backends::FP8);
        let layer = MoeLayer::new(&stream, Arc::new(weights), opts).unwrap();
        assert_eq!(layer.weight_format(), WeightFormat::Fp8Block);
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        Fp8Rig { stream, layer, scratch }
    }

    fn upload(p: &PackedFp8Experts, max_tokens: usize, k: usize) -> Fp8Rig {
        let (_ctx, stream) = gpu();
        let w = Fp8ExpertWeights::upload(&stream, p, ExpertFormat::SWIGLU).unwrap();
        Fp8Rig::new(w, stream, max_tokens, k)
    }

    fn forward(&mut self, backend: Backend, x: &[bf16], ids: &[i32], w: &[f32]) -> Vec<bf16> {
        self.run(backend, x, ids, w, None)
    }

    /// As [`Self::forward`], with the shared expert's per-token weights `s_t`.
    fn forward_shared(&mut self, backend: Backend, x: &[bf16], ids: &[i32], w: &[f32], s_t: &[f32]) -> Vec<bf16> {
        self.run(backend, x, ids, w, Some(s_t))
    }

    fn run(&mut self, backend: Backend, x: &[bf16], ids: &[i32], w: &[f32], s_t: Option<&[f32]>) -> Vec<bf16> {
        let h = self.layer.weights().hidden();
        let k = ids.len() / (x.len() / h);
        let s = &self.stream;
        let (xd, idd, wd) = (s.clone_htod(x).unwrap(), s.clone_htod(ids).unwrap(), s.clone_htod(w).unwrap());
        let mut y = s.clone_htod(&vec![bf16::NAN; x.len()]).unwrap();
        self.layer.set_backend(backend).unwrap();
        let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
        let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
        match s_t {
            None => self.layer.forward(s, &mut self.scratch, &xv, &iv, &wv, &mut yv).unwrap(),
            Some(s_t) => {
                let sd = s.clone_htod(s_t).unwrap();
                let sv = MatrixView::of("shared_weights", &sd, 1).unwrap();
                self.layer.forward_with_shared_weights(s, &mut self.scratch, &xv, &iv, &wv, &sv, &mut yv).unwrap()
            }
        }
        self.scratch.check(s).unwrap();
        s.clone_dtoh(&y).unwrap()
    }
}

/// Every FP8 backend against the FP8 reference (not against each other: each has its own accumulation error, so
/// two of them may differ by twice what either differs from the reference), and Grouped against the bf16 layer
/// on the dequantised weights.
fn check_fp8_backends(name: &str, p: &PackedFp8Experts, max_tokens: usize, k: usize, ids: &[i32], w: &[f32]) {
    let tokens = ids.len() / k;
    let x = random_vec::<bf16>(tokens * p.hidden(), 99, 1.0);
    let want = moe_forward_fp8(&Fp8HostLayer::new(p, Activation::SiluGated), &x, ids, w, k);
    let mut rig = Fp8Rig::upload(p, max_tokens, k);
    let mut grouped: Option<Vec<bf16>> = None;
    for backend in FP8_BACKENDS {
        let got = rig.forward(backend, &x, ids, w);
        if let Some(m) = fp8_layer_mismatch(&got, &want, p.hidden()) {
            panic!("{name} [{backend:?}] vs the FP8 reference: {m}");
        }
        if backend == Backend::Grouped {
            grouped = Some(got);
        }
    }
    let dense = dequantised(p);
    let mut bf16_rig = Rig::new(&dense, max_tokens, k);
    let (idd, wd) = (bf16_rig.stream.clone_htod(ids).unwrap(), bf16_rig.stream.clone_htod(w).unwrap());
    let bf16_out = bf16_rig.forward(Backend::Grouped, &x, &idd, &wd);
    if let Some(m) = fp8_vs_dense_mismatch(grouped.as_ref().unwrap(), &bf16_out, DenseWeights::Dequantised) {
        panic!("{name}: FP8 Grouped vs the bf16 layer on the dequantised weights: {m}");
    }
    // The comparison with the FP8 reference is tighter than FP8 vs bf16 activations: it would see the difference
    // (checked where there are enough outputs for the fraction of outliers to mean something).
    if tokens >= 16 {
        assert!(
            fp8_layer_mismatch(&moe_forward(&dense, &x, ids, w, k), &want, p.hidden()).is_some(),
            "{name}: the FP8 bound does not tell FP8 from bf16 activations at this size"
        );
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_layer_matches_its_reference_on_adversarial_routing() {
    let (e, h, i) = (8usize, 512usize, 256usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 1);
    let k = 2;
    let ids = |t: usize, k: usize, seed: u64| moe_gemm::random::topk_ids(t, k, e, seed);
    check_fp8_backends("uniform E8 k2", &p, 160, k, &ids(64, k, 2), &weights_for(64, k, 3));
    let hot: Vec<i32> =
        moe_gemm::random::topk_ids(64, 1, 7, 4).iter().flat_map(|&x| [3, if x >= 3 { x + 1 } else { x }]).collect();
    check_fp8_backends("one hot expert", &p, 160, k, &hot, &weights_for(64, k, 5));
    let no_zero: Vec<i32> = moe_gemm::random::topk_ids(50, k, e - 1, 6).iter().map(|&x| x + 1).collect();
    check_fp8_backends("expert 0 gets no rows", &p, 160, k, &no_zero, &weights_for(50, k, 7));
    check_fp8_backends("T = 1", &p, 160, k, &[6, 1], &[0.7, 0.3]);
    check_fp8_backends("T = 37, k = 1, one expert takes every token", &p, 160, 1, &[5; 37], &[1.0; 37]);
    for t in [127usize, 128, 129] {
        check_fp8_backends(&format!("{t} rows on one expert"), &p, 160, 1, &vec![2; t], &weights_for(t, 1, 8));
    }
    // UE8M0 scales (DeepSeek-V3.1): power-of-two weight and activation scales.
    let (_, p1) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3_1, 9);
    check_fp8_backends("UE8M0 scales, uniform", &p1, 160, k, &ids(64, k, 10), &weights_for(64, k, 11));
    // 300 tokens through a plan of 128: passes.
    check_fp8_backends("300 tokens in passes of 128", &p, 128, k, &ids(300, k, 12), &weights_for(300, k, 13));
}

/// Biases on both GEMMs (`from_device`): `b13` in the activation, `b2` in the combine, as the reference adds them.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_layer_with_biases_from_device_buffers() {
    let (e, h, i, k, t) = (8usize, 256usize, 128usize, 2usize, 40usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 21);
    let mut rng = Rng(22);
    let b13: Vec<f32> = (0..e * 2 * i).map(|_| rng.unit() * 0.5).collect();
    let b2: Vec<f32> = (0..e * h).map(|_| rng.unit() * 0.5).collect();
    let (_ctx, stream) = gpu();
    let per: Vec<(BlockFp8, BlockFp8)> = (0..e).map(|x| p.expert(x).unwrap()).collect();
    let w13 = Fp8BlockWeights::from_host(&stream, &per.iter().map(|x| x.0.clone()).collect::<Vec<_>>()).unwrap();
    let w2 = Fp8BlockWeights::from_host(&stream, &per.iter().map(|x| x.1.clone()).collect::<Vec<_>>()).unwrap();
    let w = Fp8ExpertWeights::from_device(
        Activation::SiluGated,
        GateUp::Concatenated,
        w13,
        w2,
        Some(stream.clone_htod(&b13).unwrap()),
        Some(stream.clone_htod(&b2).unwrap()),
    )
    .unwrap();
    let mut rig = Fp8Rig::new(w, stream, t, k);
    let ids = moe_gemm::random::topk_ids(t, k, e, 23);
    let wts = weights_for(t, k, 24);
    let x = random_vec::<bf16>(t * h, 25, 1.0);
    let layer = Fp8HostLayer { b13: Some(&b13), b2: Some(&b2), ..Fp8HostLayer::new(&p, Activation::SiluGated) };
    let want = moe_forward_fp8(&layer, &x, &ids, &wts, k);
    let unbiased = moe_forward_fp8(&Fp8HostLayer::new(&p, Activation::SiluGated), &x, &ids, &wts, k);
    assert!(fp8_layer_mismatch(&unbiased, &want, h).is_some(), "the biases are visible to the comparison");
    for backend in FP8_BACKENDS {
        if let Some(m) = fp8_layer_mismatch(&rig.forward(backend, &x, &ids, &wts), &want, h) {
            panic!("biased [{backend:?}]: {m}");
        }
    }
}

/// The FP8 decode kernels (Batched) at the widths of real models, where their K loops run long and their
/// blocks split K: DeepSeek-V3's H 7168 x I 2048 with k 8, and a Mixtral-like k 2 (four warps share each slot's
/// K). Every backend runs the same data, so the decode kernels are held to the layout path's reference.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_decode_at_model_widths() {
    let (_, p) = experts(12, 7168, 2048, &Fp8Config::DEEPSEEK_V3, 81);
    for t in [1usize, 3] {
        let ids = moe_gemm::random::topk_ids(t, 8, 12, 82 + t as u64);
        check_fp8_backends(&format!("H 7168 I 2048 k 8, T = {t}"), &p, 8, 8, &ids, &weights_for(t, 8, 83));
    }
    let (_, p) = experts(4, 1024, 1536, &Fp8Config::DEEPSEEK_V3_1, 84);
    let ids = moe_gemm::random::topk_ids(5, 2, 4, 85);
    check_fp8_backends("H 1024 I 1536 k 2, UE8M0, T = 5", &p, 8, 2, &ids, &weights_for(5, 2, 86));
}

/// An expert id outside the layer's range in the FP8 decode path: its row is skipped and the step's status
/// word reports it; the other tokens are computed.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_decode_reports_an_out_of_range_expert() {
    let (e, h, i, k, t) = (8usize, 256usize, 128usize, 2usize, 4usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 91);
    let mut rig = Fp8Rig::upload(&p, t, k);
    let mut ids = moe_gemm::random::topk_ids(t, k, e, 92);
    let w = weights_for(t, k, 93);
    let x = random_vec::<bf16>(t * h, 94, 1.0);
    let want = moe_forward_fp8(&Fp8HostLayer::new(&p, Activation::SiluGated), &x, &ids, &w, k);
    ids[5] = 99; // token 2, slot 1
    let s = rig.stream.clone();
    let (xd, idd, wd) = (s.clone_htod(&x).unwrap(), s.clone_htod(&ids).unwrap(), s.clone_htod(&w).unwrap());
    let mut y = s.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
    rig.layer.set_backend(Backend::Batched).unwrap();
    let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
    rig.layer.forward(&s, &mut rig.scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
    let err = rig.scratch.check(&s).unwrap_err().to_string();
    assert!(err.to_lowercase().contains("expert"), "{err}");
    let got = s.clone_dtoh(&y).unwrap();
    for tok in [0usize, 1, 3] {
        let r = tok * h..(tok + 1) * h;
        if let Some(m) = fp8_layer_mismatch(&got[r.clone()], &want[r], h) {
            panic!("token {tok}, untouched by the bad id: {m}");
        }
    }
    assert!(got[2 * h..3 * h].iter().all(|v| v.is_finite()), "token 2 keeps its valid slot");
}

/// The FP8 decode kernels quantise h once per launch, the last of each group's expand blocks counting itself in
/// the scratch's arrival counters: one scratch serves two layers of different I, forwards alternate between
/// them with fresh inputs (a stale or half-written group of h would carry the previous forward's values), and a
/// forward with an out-of-range expert id (whose row counts nothing) sits between; every valid forward must
/// match its reference.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_decode_quantises_h_once_per_launch_across_layers_sharing_a_scratch() {
    let (e, h, k, t) = (8usize, 512usize, 2usize, 6usize);
    let (_ctx, stream) = gpu();
    let inters = [256usize, 640];
    let packs: Vec<PackedFp8Experts> =
        inters.iter().zip(101..).map(|(&i, seed)| experts(e, h, i, &Fp8Config::DEEPSEEK_V3, seed).1).collect();
    let layers: Vec<MoeLayer<bf16, Fp8ExpertWeights>> = packs
        .iter()
        .map(|p| {
            let w = Fp8ExpertWeights::upload(&stream, p, ExpertFormat::SWIGLU).unwrap();
            let opts = MoeLayerOptions::new(t, k).backends(Backends::FP8);
            let mut l = MoeLayer::new(&stream, Arc::new(w), opts).unwrap();
            l.set_backend(Backend::Batched).unwrap();
            l
        })
        .collect();
    let mut scratch = MoeScratch::for_layers(&stream, layers.iter()).unwrap();
    let s = &stream;
    for step in 0..6u64 {
        let which = (step % 2) as usize;
        let mut ids = moe_gemm::random::topk_ids(t, k, e, 110 + step);
        let w = weights_for(t, k, 120 + step);
        let x = random_vec::<bf16>(t * h, 130 + step, 1.0 + step as f32);
        let want = moe_forward_fp8(&Fp8HostLayer::new(&packs[which], Activation::SiluGated), &x, &ids, &w, k);
        let bad = step == 3;
        if bad {
            ids[1] = -1; // token 0, slot 1
        }
        let (xd, idd, wd) = (s.clone_htod(&x).unwrap(), s.clone_htod(&ids).unwrap(), s.clone_htod(&w).unwrap());
        let mut y = s.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
        let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
        let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
        layers[which].forward(s, &mut scratch, &xv, &iv, &wv, &mut yv).unwrap();
        let checked = scratch.check(s);
        let got = s.clone_dtoh(&y).unwrap();
        let first = if bad {
            assert!(checked.unwrap_err().to_string().to_lowercase().contains("expert"));
            h // token 0 lost a slot; the others are whole
        } else {
            checked.unwrap();
            0
        };
        if let Some(m) = fp8_layer_mismatch(&got[first..], &want[first..], h) {
            panic!("step {step} (layer {which}, I {}): {m}", inters[which]);
        }
    }
}

/// DeepSeek-V3-like: E 64, k 8, the grouped sigmoid router (8 groups keep 4, routed_scaling_factor 2.5); in one
/// pass and in passes of 16 tokens.
#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_like_e64_k8_with_the_deepseek_router() {
    let (e, k, h, i, t) = (64usize, 8usize, 512usize, 256usize, 48usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 31);
    let config = RouterConfig::new(
        e,
        k,
        RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
    )
    .unwrap();
    let mut rng = Rng(32);
    let logits: Vec<f32> = (0..t * e).map(|_| rng.unit() * 3.0).collect();
    let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
    let (ids, w, st) = crate::routing::gpu_route(config, &logits, Some(&bias));
    st.unwrap();
    check_fp8_backends("deepseek-like E64 k8", &p, 64, k, &ids, &w);
    check_fp8_backends("deepseek-like E64 k8, passes of 16", &p, 16, k, &ids, &w);
}

/// The scale grids of w13 of the two busiest experts swapped (elements in place): every backend fails the
/// comparison; the unmutated weights pass it.
#[test]
#[ignore = "needs an SM90 GPU"]
fn swapped_w13_scales_of_two_experts_are_caught() {
    let (e, k, h, i, t) = (8usize, 2usize, 512usize, 256usize, 64usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 41);
    let ids = moe_gemm::random::topk_ids(t, k, e, 42);
    let w = weights_for(t, k, 43);
    let x = random_vec::<bf16>(t * h, 44, 1.0);
    let want = moe_forward_fp8(&Fp8HostLayer::new(&p, Activation::SiluGated), &x, &ids, &w, k);
    let mut rows = vec![0usize; e];
    ids.iter().for_each(|&id| rows[id as usize] += 1);
    let mut order: Vec<usize> = (0..e).collect();
    order.sort_by_key(|&x| std::cmp::Reverse(rows[x]));
    let (a, b) = (order[0], order[1]);
    let mut per: Vec<(BlockFp8, BlockFp8)> = (0..e).map(|x| p.expert(x).unwrap()).collect();
    let (qa, sa) = per[a].0.clone().into_parts();
    let (qb, sb) = per[b].0.clone().into_parts();
    assert_ne!(sa, sb, "the experts' scales differ, so swapping them changes something");
    per[a].0 = BlockFp8::from_parts(2 * i, h, BlockShape::DEEPSEEK, qa, sb).unwrap();
    per[b].0 = BlockFp8::from_parts(2 * i, h, BlockShape::DEEPSEEK, qb, sa).unwrap();
    let swapped = PackedFp8Experts::from_experts(per).unwrap();
    let mut good = Fp8Rig::upload(&p, t, k);
    let mut bad = Fp8Rig::upload(&swapped, t, k);
    for backend in FP8_BACKENDS {
        assert!(fp8_layer_mismatch(&good.forward(backend, &x, &ids, &w), &want, h).is_none(), "{backend:?}: good run");
        assert!(
            fp8_layer_mismatch(&bad.forward(backend, &x, &ids, &w), &want, h).is_some(),
            "{backend:?}: w13 scales of experts {a} and {b} swapped went unnoticed"
        );
    }
}

/// Router and FP8 layer captured once and replayed 10 times with new logits, per backend: each replay equals an
/// uncaptured forward bit for bit and the FP8 reference within its bound.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_layer_replays_in_a_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (e, k, h, i, t) = (32usize, 4usize, 256usize, 128usize, 16usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 51);
    let host = Fp8HostLayer::new(&p, Activation::SiluGated);
    for backend in FP8_BACKENDS {
        let (_ctx, stream) = gpu();
        let weights = Arc::new(Fp8ExpertWeights::upload(&stream, &p, ExpertFormat::SWIGLU).unwrap());
        let opts = MoeLayerOptions::new(t, k).masked_max_m(t).backend(backend);
        let layer = MoeLayer::new(&stream, weights, opts).unwrap();
        let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        let router =
            Router::new(&stream, RouterConfig::new(e, k, RouterKind::Softmax { renormalize: true }).unwrap()).unwrap();
        let x_host = random_vec::<bf16>(t * h, 52, 1.0);
        let x = stream.clone_htod(&x_host).unwrap();
        let mut logits = stream.alloc_zeros::<f32>(t * e).unwrap();
        let mut ids = stream.alloc_zeros::<i32>(t * k).unwrap();
        let mut w = stream.alloc_zeros::<f32>(t * k).unwrap();
        let mut y = stream.alloc_zeros::<bf16>(t * h).unwrap();
        let step = |scratch: &mut MoeScratch<bf16>,
                    ids: &mut CudaSlice<i32>,
                    w: &mut CudaSlice<f32>,
                    y: &mut CudaSlice<bf16>,
                    logits: &CudaSlice<f32>| {
            let (mut iv, mut wv) =
                (MatrixViewMut::of("topk_ids", ids, k).unwrap(), MatrixViewMut::of("topk_weights", w, k).unwrap());
            router
                .launch(
                    &stream,
                    &MatrixView::of("logits", logits, e).unwrap(),
                    None,
                    &mut iv,
                    &mut wv,
                    scratch.status_mut(),
                )
                .unwrap();
            let (xv, iv, wv) = views(&x, h, ids, w, k);
            layer.forward(&stream, scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", y, h).unwrap()).unwrap();
        };
        step(&mut scratch, &mut ids, &mut w, &mut y, &logits);
        stream.synchronize().unwrap();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        step(&mut scratch, &mut ids, &mut w, &mut y, &logits);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
        assert_eq!(layer.backend_for(t), backend);
        for replay in 0..10u64 {
            let mut rng = Rng(600 + replay);
            let l: Vec<f32> = (0..t * e).map(|_| rng.unit() * 3.0).collect();
            stream.memcpy_htod(&l, &mut logits).unwrap();
            graph.launch().unwrap();
            let from_graph = stream.clone_dtoh(&y).unwrap();
            let (ids_h, w_h) = (stream.clone_dtoh(&ids).unwrap(), stream.clone_dtoh(&w).unwrap());
            step(&mut scratch, &mut ids, &mut w, &mut y, &logits);
            let eager = stream.clone_dtoh(&y).unwrap();
            scratch.check(&stream).unwrap();
            assert!(
                from_graph.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{backend:?}: replay {replay} differs from eager"
            );
            if let Some(m) = fp8_layer_mismatch(&from_graph, &moe_forward_fp8(&host, &x_host, &ids_h, &w_h, k), h) {
                panic!("{backend:?}: replay {replay}: {m}");
            }
        }
    }
}

/// The DeepSeek-named tensors of `p` (gate, up, down and their `_scale_inv`, F32) under `prefix`.
fn checkpoint_tensors(p: &PackedFp8Experts, prefix: &str) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let (h, i) = (p.hidden(), p.inter());
    let (gr, gc) = BlockShape::DEEPSEEK.grid(i, h).unwrap();
    let f32_bytes = |s: &Scales, r: std::ops::Range<usize>| -> Vec<u8> {
        r.flat_map(|j| s.get(j).unwrap().to_le_bytes()).collect()
    };
    let q_bytes = |v: &[F8E4M3]| -> Vec<u8> { v.iter().map(|x| x.to_bits()).collect() };
    let mut out = Vec::new();
    for x in 0..p.experts() {
        let (w13, w2) = p.expert(x).unwrap();
        let [g, u, d] = ExpertNaming::GateUpDown.names(prefix, x);
        out.push((g.clone(), Dtype::F8_E4M3, vec![i, h], q_bytes(&w13.q()[..i * h])));
        out.push((format!("{g}_scale_inv"), Dtype::F32, vec![gr, gc], f32_bytes(w13.scales(), 0..gr * gc)));
        out.push((u.clone(), Dtype::F8_E4M3, vec![i, h], q_bytes(&w13.q()[i * h..])));
        out.push((format!("{u}_scale_inv"), Dtype::F32, vec![gr, gc], f32_bytes(w13.scales(), gr * gc..2 * gr * gc)));
        out.push((d.clone(), Dtype::F8_E4M3, vec![h, i], q_bytes(w2.q())));
        out.push((format!("{d}_scale_inv"), Dtype::F32, vec![gc, gr], f32_bytes(w2.scales(), 0..gc * gr)));
    }
    out
}

/// bf16 experts quantised on the host (DeepSeek-V3 f32 scales and V3.1 UE8M0), written as a DeepSeek FP8
/// checkpoint (safetensors written here: the crate has no FP8 writer), read back (the same value bit for bit),
/// uploaded: the FP8 layer is within `fp8_vs_dense_tolerance(Original)` of the bf16 layer on the original
/// weights, on every FP8 backend.
#[test]
#[ignore = "needs an SM90 GPU"]
fn bf16_checkpoint_quantised_saved_loaded_runs_near_the_bf16_layer() {
    let (e, k, h, i, t) = (16usize, 4usize, 512usize, 256usize, 48usize);
    let prefix = "model.layers.7.mlp";
    for (n, config) in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1].into_iter().enumerate() {
        let (dense, p) = experts(e, h, i, &config, 61 + n as u64);
        let store = checkpoint_tensors(&p, prefix);
        let path = std::env::temp_dir().join(format!("moe-gemm-fp8-layer-{}-{n}.safetensors", std::process::id()));
        let views: HashMap<String, TensorView<'_>> =
            store.iter().map(|(name, d, s, b)| (name.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let loaded = Checkpoint::open(&path).unwrap().pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config);
        let _ = std::fs::remove_file(&path);
        let loaded = loaded.unwrap();
        assert_eq!(loaded, p, "{config:?}: the checkpoint round trip is exact");
        let ids = moe_gemm::random::topk_ids(t, k, e, 62);
        let w = weights_for(t, k, 63);
        let x = random_vec::<bf16>(t * h, 64, 1.0);
        let mut bf16_rig = Rig::new(&dense, t, k);
        let (idd, wd) = (bf16_rig.stream.clone_htod(&ids).unwrap(), bf16_rig.stream.clone_htod(&w).unwrap());
        let want = bf16_rig.forward(Backend::Grouped, &x, &idd, &wd);
        assert!(
            fp8_vs_dense_mismatch(&moe_forward(&dense, &x, &ids, &w, k), &want, DenseWeights::Original).is_none(),
            "the bf16 layer is its own reference"
        );
        let mut rig = Fp8Rig::upload(&loaded, t, k);
        let fp8_ref = moe_forward_fp8(&Fp8HostLayer::new(&loaded, Activation::SiluGated), &x, &ids, &w, k);
        for backend in FP8_BACKENDS {
            let got = rig.forward(backend, &x, &ids, &w);
            if let Some(m) = fp8_vs_dense_mismatch(&got, &want, DenseWeights::Original) {
                panic!("{:?} [{backend:?}]: FP8 from the checkpoint vs the bf16 layer: {m}", config.scale_format());
            }
            if let Some(m) = fp8_layer_mismatch(&got, &fp8_ref, h) {
                panic!("{:?} [{backend:?}]: vs the FP8 reference: {m}", config.scale_format());
            }
        }
    }
}

/// What the FP8 layer refuses, naming FP8: the backends it does not run (at planning and on a live layer),
/// formats FP8 experts do not take; Auto runs Grouped; the scratch allocates its footprint and the plan's
/// needs are the host sizing's.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_layer_refusals_auto_and_the_scratch_footprint() {
    let (e, k, h, i) = (16usize, 4usize, 256usize, 128usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 71);
    let (_ctx, stream) = gpu();
    let info = DeviceInfo::query(stream.context()).unwrap();
    let weights = Arc::new(Fp8ExpertWeights::upload(&stream, &p, ExpertFormat::SWIGLU).unwrap());
    assert_eq!(weights.bytes(), e * ((2 * i + i) * h + 4 * (2 * 2 + 2)));
    let expect_fp8 = |r: Result<()>, what: &str| match r {
        Err(Error::InvalidProblem(m)) => {
            assert!(m.contains("FP8") && m.contains("Batched, Grouped, Contiguous, Masked and Fused"), "{what}: {m}")
        }
        other => panic!("{what}: expected InvalidProblem, got {other:?}"),
    };
    let eager = MoeLayerOptions::new(8, k).backend(Backend::Eager);
    expect_fp8(MoeLayer::new(&stream, weights.clone(), eager).map(|_| ()), "plan");
    let mut layer = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(64, k)).unwrap();
    // Auto over FP8 follows auto_backend_fp8 (Batched while its rows fit, at this small size).
    for t in [1usize, 64, 4096] {
        assert_eq!(layer.backend_for(t), auto_backend_fp8(e, k, h, i, t), "T = {t}");
    }
    assert_eq!((layer.backend_for(1), layer.backend_for(4096)), (Backend::Batched, Backend::Grouped));
    expect_fp8(layer.set_backend(Backend::Eager), "set_backend(Eager)");
    layer.set_backend(Backend::Auto).unwrap();
    let mut all = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(64, k).backends(Backends::FP8)).unwrap();
    all.set_backend(Backend::Batched).unwrap();
    let gpt = ExpertFormat { storage: Storage::OutIn, ..ExpertFormat::GPT_OSS };
    match Fp8ExpertWeights::upload(&stream, &p, gpt) {
        Err(Error::InvalidProblem(m)) => assert!(m.contains("Interleaved"), "{m}"),
        other => panic!("interleaved FP8 experts: {other:?}"),
    }
    for (t, backends) in [(1usize, None), (64, None), (4096, None), (256, Some(Backends::FP8))] {
        let mut opts = MoeLayerOptions::new(t, k);
        if let Some(b) = backends {
            opts = opts.backends(b);
        }
        let layer = MoeLayer::new(&stream, weights.clone(), opts).unwrap();
        let shape =
            LayerShape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true };
        let host =
            LayerSizing::new_fp8(shape, t, Backend::Auto, backends, None, false, info.sm_count as usize).unwrap();
        assert_eq!(layer.needs(), host.needs(), "T = {t}: device plan vs host sizing");
        // The H200 picks the SM90 FP8 plan; sized for this device, the sizing is the layer's own.
        assert_eq!(layer.sizing().gemm(), LayerGemm::Sm90Fp8Blockwise, "T = {t}");
        let fmt = WeightFormat::Fp8Block;
        let on = LayerSizing::for_device(
            &info,
            shape,
            DType::BF16,
            fmt,
            t,
            Backend::Auto,
            backends,
            None,
            None,
            false,
            None,
        );
        assert_eq!(layer.sizing(), &on.unwrap(), "T = {t}: the layer's sizing vs LayerSizing::for_device");
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        assert_eq!(scratch.bytes(), layer.needs().footprint().total(), "T = {t}: allocated vs footprint");
        assert_eq!(layer.plan_bytes(), host.plan_bytes(false), "T = {t}: plan bytes");
    }
}

/// A block-FP8 shared expert (DeepSeek-V3: `shared_experts` in e4m3 with 128 x 128 scales), `I_s = 2I`: every
/// backend against the FP8 reference with the shared expert (`moe_forward_fp8_with_shared`, computed from the
/// full-width shared matrices, so a group reading the wrong rows, columns or scale blocks is seen) under
/// `Fp8LayerBound`, and against the bf16 layer's reference with the full-width shared MLP on the dequantised
/// weights. With weight 1 and with per-token weights; without the shared expert the outputs differ.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_shared_expert_on_every_backend() {
    use moe_gemm::checkpoint::SharedFp8Expert;
    use moe_gemm::quant::ScaleFormat;
    use moe_gemm::reference::{moe_forward_fp8_with_shared, moe_forward_with_shared};
    let (e, k, h, i, is, t) = (8usize, 2usize, 512usize, 256usize, 512usize, 24usize);
    let (_, p) = experts(e, h, i, &Fp8Config::DEEPSEEK_V3, 101);
    let quant = |rows: usize, cols: usize, seed: u64| {
        let w: Vec<f32> =
            blocky(random_vec(rows * cols, seed, 0.15), rows, cols, seed + 1).iter().map(|v| v.to_f32()).collect();
        BlockFp8::quantize(&w, rows, cols, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap()
    };
    let shared = SharedFp8Expert::new(quant(is, h, 102), quant(is, h, 104), quant(h, is, 106)).unwrap();
    let m = shared.groups(i).unwrap();
    assert_eq!(m, 2);
    let (_ctx, stream) = gpu();
    let w = Fp8ExpertWeights::upload_with_shared(&stream, &p, &shared, ExpertFormat::SWIGLU).unwrap();
    assert_eq!((w.experts(), w.shared_groups(), w.groups()), (e, m, e + m));
    let mut rig = Fp8Rig::new(w, stream, t, k);
    let ids = moe_gemm::random::topk_ids(t, k, e, 107);
    let wts = weights_for(t, k, 108);
    let x = random_vec::<bf16>(t * h, 109, 1.0);
    let s_t: Vec<f32> = {
        let mut r = Rng(110);
        (0..t).map(|_| 0.25 + r.unit().abs()).collect()
    };
    let dense_shared = {
        let deq = |b: &BlockFp8| b.dequantize().into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let (g, u, d) = (quant(is, h, 102), quant(is, h, 104), quant(h, is, 106));
        moe_gemm::SharedExpert::new(h, is, deq(&g), deq(&u), deq(&d), None).unwrap()
    };
    let layer = Fp8HostLayer::new(&p, Activation::SiluGated);
    let routed_only = moe_forward_fp8(&layer, &x, &ids, &wts, k);
    for s in [None, Some(&s_t[..])] {
        let want = moe_forward_fp8_with_shared(&layer, &shared, &x, &ids, &wts, k, s);
        let full = moe_forward_with_shared(&dequantised(&p), &dense_shared, &x, &ids, &wts, k, s);
        assert!(fp8_layer_mismatch(&routed_only, &want, h).is_some(), "the shared expert is visible");
        for backend in FP8_BACKENDS {
            let got = match s {
                None => rig.forward(backend, &x, &ids, &wts),
                Some(s) => rig.forward_shared(backend, &x, &ids, &wts, s),
            };
            if let Some(msg) = fp8_layer_mismatch(&got, &want, h) {
                panic!("shared {} [{backend:?}] vs the FP8 reference: {msg}", if s.is_some() { "s_t" } else { "1" });
            }
            if let Some(msg) = fp8_vs_dense_mismatch(&got, &full, DenseWeights::Dequantised) {
                panic!("shared [{backend:?}] vs the full-width bf16 shared MLP: {msg}");
            }
        }
    }
}
