//! The MoE layer: every backend against the CPU reference and each other, mutation checks that prove the
//! comparison bites, and the masked layer captured in a CUDA graph. Shared experts (DeepSeek-like, Qwen2-MoE-like
//! gated, split between expert-parallel ranks) against the full-width shared reference, with their mutations.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use moe_gemm::layer::reference::{moe_forward, moe_forward_with_shared, shared_gate_weights};
use moe_gemm::reference::{first_mismatch, Tolerance};
use moe_gemm::*;

use crate::common::*;

pub(crate) fn packed(
    e: usize,
    h: usize,
    i: usize,
    format: ExpertFormat,
    biases: bool,
    seed: u64,
) -> PackedExperts<bf16> {
    packed_t::<bf16>(e, h, i, format, biases, seed)
}

fn packed_t<T: Element>(
    e: usize,
    h: usize,
    i: usize,
    format: ExpertFormat,
    biases: bool,
    seed: u64,
) -> PackedExperts<T> {
    let r13 = if format.activation.gated() { 2 * i } else { i };
    let mut rng = Rng(seed);
    let bias = |n: usize, rng: &mut Rng| (0..n).map(|_| rng.unit() * 0.5).collect::<Vec<f32>>();
    let (b13, b2) = if biases { (Some(bias(e * r13, &mut rng)), Some(bias(e * h, &mut rng))) } else { (None, None) };
    PackedExperts::new(
        e,
        h,
        i,
        format,
        random_vec::<T>(e * r13 * h, seed + 1, 0.15),
        random_vec::<T>(e * h * i, seed + 2, 0.15),
        b13,
        b2,
    )
    .unwrap()
}

/// Normalised random router weights for given ids.
pub(crate) fn weights_for(tokens: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut w: Vec<f32> = (0..tokens * k).map(|_| rng.unit().abs() + 0.1).collect();
    for t in 0..tokens {
        let s: f32 = w[t * k..(t + 1) * k].iter().sum();
        w[t * k..(t + 1) * k].iter_mut().for_each(|x| *x /= s);
    }
    w
}

fn distinct_ids(tokens: usize, k: usize, e: usize, seed: u64) -> Vec<i32> {
    moe_gemm::random::topk_ids(tokens, k, e, seed)
}

pub(crate) struct Rig<T: Element> {
    pub stream: Arc<CudaStream>,
    pub layer: MoeLayer<T>,
    pub scratch: MoeScratch<T>,
}

impl<T: Element> Rig<T> {
    /// A layer with room for every backend, and its own scratch.
    pub fn new(p: &PackedExperts<T>, max_tokens: usize, k: usize) -> Rig<T> {
        let (_ctx, stream) = gpu();
        let weights = Arc::new(ExpertWeights::upload(&stream, p).unwrap());
        let layer =
            MoeLayer::new(&stream, weights, MoeLayerOptions::new(max_tokens, k).backends(Backends::ALL)).unwrap();
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        Rig { layer, scratch, stream }
    }

    pub fn forward(&mut self, backend: Backend, x: &[T], ids: &CudaSlice<i32>, w: &CudaSlice<f32>) -> Vec<T> {
        let h = self.layer.weights().hidden();
        let k = ids.len() / (x.len() / h);
        let xd = self.stream.clone_htod(x).unwrap();
        let mut y = self.stream.clone_htod(&vec![T::from_f32(f32::NAN); x.len()]).unwrap();
        self.layer.set_backend(backend).unwrap();
        let (xv, iv, wv) = views(&xd, h, ids, w, k);
        self.layer
            .forward(&self.stream, &mut self.scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap())
            .unwrap();
        self.scratch.check(&self.stream).unwrap();
        self.stream.clone_dtoh(&y).unwrap()
    }
}

/// x `[T, h]`, ids and weights `[T, k]` as whole-buffer views.
pub(crate) fn views<'a, T>(
    x: &'a CudaSlice<T>,
    h: usize,
    ids: &'a CudaSlice<i32>,
    w: &'a CudaSlice<f32>,
    k: usize,
) -> (MatrixView<'a, T>, MatrixView<'a, i32>, MatrixView<'a, f32>) {
    (
        MatrixView::of("x", x, h).unwrap(),
        MatrixView::of("topk_ids", ids, k).unwrap(),
        MatrixView::of("topk_weights", w, k).unwrap(),
    )
}

fn mismatch<T: Element>(got: &[T], want: &[T]) -> Option<String> {
    let w: Vec<f32> = want.iter().map(|x| x.to_f32()).collect();
    let g: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
    let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    // A few steps of the output type at the output's magnitude (MOE_SEMANTICS: summation order moves results by
    // one step); bf16 steps for f16 too, whose inputs were rounded the same way in the reference.
    let step = 2.0 * T::DTYPE.half_ulp();
    let tol = Tolerance { atol: 4.0 * max * step * 0.5, rtol: 2.0 * step };
    first_mismatch(&g, &w, tol).map(|(i, a, b)| format!("element {i}: got {a}, reference {b} ({tol:?})"))
}

fn check_all_backends<T: Element>(
    name: &str,
    p: &PackedExperts<T>,
    max_tokens: usize,
    k: usize,
    ids: &[i32],
    w: &[f32],
) {
    let mut rig = Rig::new(p, max_tokens, k);
    let tokens = ids.len() / k;
    let x = random_vec::<T>(tokens * p.hidden, 99, 1.0);
    let want = moe_forward(p, &x, ids, w, k);
    let ids_d = rig.stream.clone_htod(ids).unwrap();
    let w_d = rig.stream.clone_htod(w).unwrap();
    let mut first: Option<Vec<T>> = None;
    for backend in Backend::CONCRETE {
        let got = rig.forward(backend, &x, &ids_d, &w_d);
        if let Some(m) = mismatch(&got, &want) {
            panic!("{name} [{backend:?}]: {m}");
        }
        // Every backend computes the same function: at most a bf16 step apart from each other.
        if let Some(f) = &first {
            assert!(mismatch(&got, f).is_none(), "{name}: {backend:?} disagrees with {:?}", Backend::CONCRETE[0]);
        } else {
            first = Some(got);
        }
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn all_backends_match_the_reference_on_adversarial_routing() {
    let (e, h, i) = (8usize, 256usize, 128usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 1);
    let k = 2;
    check_all_backends("uniform E8 k2", &p, 160, k, &distinct_ids(64, k, e, 2), &weights_for(64, k, 3));
    let hot: Vec<i32> = distinct_ids(64, 1, 7, 4).iter().flat_map(|&x| [3, if x >= 3 { x + 1 } else { x }]).collect();
    check_all_backends("one hot expert", &p, 160, k, &hot, &weights_for(64, k, 5));
    let no_zero: Vec<i32> = distinct_ids(50, k, e - 1, 6).iter().map(|&x| x + 1).collect();
    check_all_backends("expert 0 gets no rows", &p, 160, k, &no_zero, &weights_for(50, k, 7));
    check_all_backends("T = 1", &p, 160, k, &[6, 1], &[0.7, 0.3]);
    // 160 rows per expert: Fused takes its 128-row tile (64-row tiles everywhere else here).
    check_all_backends(
        "T = 160, k = 8: every token on every expert",
        &p,
        160,
        8,
        &distinct_ids(160, 8, e, 9),
        &weights_for(160, 8, 10),
    );
    check_all_backends("T = 37, k = 1, one expert takes every token", &p, 160, 1, &[5; 37], &[1.0; 37]);
    for t in [127usize, 128, 129] {
        check_all_backends(
            &format!("{t} rows on one expert (BLOCK_M ± 1)"),
            &p,
            160,
            1,
            &vec![2; t],
            &weights_for(t, 1, 8),
        );
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_routing_e256_k8_all_backends() {
    let (e, k, h, i, t) = (256usize, 8usize, 128usize, 64usize, 48usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 11);
    let config = RouterConfig::deepseek_v3();
    let mut rng = Rng(12);
    let logits: Vec<f32> = (0..t * e).map(|_| rng.unit() * 3.0).collect();
    let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
    let (ids, w, st) = crate::routing::gpu_route(config, &logits, Some(&bias));
    st.unwrap();
    check_all_backends("deepseek-v3 routing", &p, 64, k, &ids, &w);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn gpt_oss_format_interleaved_transposed_biased_clamped() {
    let (e, k, h, i, t) = (8usize, 4usize, 128usize, 64usize, 40usize);
    let p = packed(e, h, i, ExpertFormat::GPT_OSS, true, 21);
    check_all_backends("gpt-oss", &p, 64, k, &distinct_ids(t, k, e, 22), &weights_for(t, k, 23));
    let silu = ExpertFormat { gate_up: GateUp::Concatenated, activation: Activation::Silu, storage: Storage::OutIn };
    check_all_backends(
        "non-gated silu",
        &packed(e, h, i, silu, true, 24),
        64,
        k,
        &distinct_ids(t, k, e, 25),
        &weights_for(t, k, 26),
    );
}

/// Mutations fed through the public API must make the comparison fail.
#[test]
#[ignore = "needs an SM90 GPU"]
fn mutations_are_caught() {
    let (e, k, h, i, t) = (8usize, 2usize, 128usize, 64usize, 32usize);
    // An interleaved checkpoint read as concatenated.
    let good = packed(e, h, i, ExpertFormat::GPT_OSS, true, 31);
    let mut misread = good.clone();
    misread.format.gate_up = GateUp::Concatenated;
    let ids = distinct_ids(t, k, e, 32);
    let w = weights_for(t, k, 33);
    let x = random_vec::<bf16>(t * h, 34, 1.0);
    let want = moe_forward(&good, &x, &ids, &w, k);
    let mut rig = Rig::new(&misread, t, k);
    let (ids_d, w_d) = (rig.stream.clone_htod(&ids).unwrap(), rig.stream.clone_htod(&w).unwrap());
    for backend in Backend::CONCRETE {
        assert!(
            mismatch(&rig.forward(backend, &x, &ids_d, &w_d), &want).is_some(),
            "{backend:?}: misread gate/up went unnoticed"
        );
    }
    // Gate weights taken from the biased scores (DeepSeek): the layer's output moves past the tolerance.
    let p = packed(256, 128, 64, ExpertFormat::SWIGLU, false, 35);
    let config = RouterConfig::deepseek_v3();
    let mut rng = Rng(36);
    let logits: Vec<f32> = (0..t * 256).map(|_| rng.unit() * 2.0).collect();
    let bias: Vec<f32> = (0..256).map(|_| rng.unit() * 0.5).collect();
    let (ids, w, _) = crate::routing::gpu_route(config, &logits, Some(&bias));
    let leaky: Vec<f32> = (0..t)
        .flat_map(|tt| {
            let c: Vec<f32> = (0..8)
                .map(|j| {
                    let e = ids[tt * 8 + j] as usize;
                    1.0 / (1.0 + (-logits[tt * 256 + e]).exp()) + bias[e]
                })
                .collect();
            let s: f32 = c.iter().sum();
            c.into_iter().map(move |v| v / s * 2.5)
        })
        .collect();
    let x = random_vec::<bf16>(t * 128, 37, 1.0);
    let want = moe_forward(&p, &x, &ids, &w, 8);
    let mut rig = Rig::new(&p, t, 8);
    let (ids_d, leak_d) = (rig.stream.clone_htod(&ids).unwrap(), rig.stream.clone_htod(&leaky).unwrap());
    assert!(
        mismatch(&rig.forward(Backend::Grouped, &x, &ids_d, &leak_d), &want).is_some(),
        "biased gate weights went unnoticed"
    );
}

/// Every backend Auto picks (Batched, Fused, Grouped) and Masked, each with its router, captured once and
/// replayed 10 times with new logits: each replay equals an uncaptured forward bit for bit and the reference
/// within tolerance.
#[test]
#[ignore = "needs an SM90 GPU"]
fn every_serving_backend_with_router_replays_in_a_graph() {
    for backend in [Backend::Batched, Backend::Grouped, Backend::Masked, Backend::Fused] {
        replay_in_a_graph(backend);
    }
}

fn replay_in_a_graph(backend: Backend) {
    replay_in_a_graph_with(backend, false)
}

/// As [`replay_in_a_graph`], with a shared expert of I_s = I (weight 1) when `shared`.
fn replay_in_a_graph_with(backend: Backend, shared: bool) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (e, k, h, i, t) = (32usize, 4usize, 128usize, 64usize, 16usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 41);
    let s = shared.then(|| shared_expert(h, i, false, 45));
    let (_ctx, stream) = gpu();
    let weights = match &s {
        Some(s) => ExpertWeights::upload_with_shared(&stream, &p, s).unwrap(),
        None => ExpertWeights::upload(&stream, &p).unwrap(),
    };
    let weights = Arc::new(weights);
    let layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(t, k).masked_max_m(t).backend(backend)).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    let router =
        Router::new(&stream, RouterConfig::new(e, k, RouterKind::Softmax { renormalize: true }).unwrap()).unwrap();
    let x_host = random_vec::<bf16>(t * h, 42, 1.0);
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
        router.launch(&stream, t, logits, None, ids, w, scratch.status_mut()).unwrap();
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
        let mut rng = Rng(500 + replay);
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
        let want = match &s {
            Some(s) => moe_forward_with_shared(&p, s, &x_host, &ids_h, &w_h, k, None),
            None => moe_forward(&p, &x_host, &ids_h, &w_h, k),
        };
        if let Some(m) = mismatch(&from_graph, &want) {
            panic!("{backend:?}: replay {replay}: {m}");
        }
    }
}

/// Batches larger than a pass run as several passes over the same scratch (chunked prefill): the masked layout
/// (256 rows per expert) takes 1000 tokens in four passes, Grouped 300 tokens in a plan of 128 tokens, and both
/// agree with the reference.
#[test]
#[ignore = "needs an SM90 GPU"]
fn batches_larger_than_a_pass_are_chunked_not_refused() {
    let p = packed(64, 128, 64, ExpertFormat::SWIGLU, false, 51);
    let mut rig = Rig::new(&p, 1024, 8);
    assert_eq!(rig.layer.backend_for(1), Backend::Batched);
    assert_eq!(rig.layer.backend_for(1024), Backend::Grouped);
    let k = 8;
    for (backend, t) in [(Backend::Masked, 1000usize), (Backend::Batched, 700)] {
        let ids = distinct_ids(t, k, 64, 52);
        let w = weights_for(t, k, 53);
        let x = random_vec::<bf16>(t * 128, 54, 1.0);
        let (idd, wd) = (rig.stream.clone_htod(&ids).unwrap(), rig.stream.clone_htod(&w).unwrap());
        let got = rig.forward(backend, &x, &idd, &wd);
        if let Some(m) = mismatch(&got, &moe_forward(&p, &x, &ids, &w, k)) {
            panic!("{backend:?} over {t} tokens: {m}");
        }
    }
    let mut small = Rig::new(&p, 128, 8);
    let t = 300;
    let ids = distinct_ids(t, k, 64, 55);
    let w = weights_for(t, k, 56);
    let x = random_vec::<bf16>(t * 128, 57, 1.0);
    let (idd, wd) = (small.stream.clone_htod(&ids).unwrap(), small.stream.clone_htod(&w).unwrap());
    let want = moe_forward(&p, &x, &ids, &w, k);
    for backend in [Backend::Grouped, Backend::Fused, Backend::Contiguous, Backend::Auto] {
        if let Some(m) = mismatch(&small.forward(backend, &x, &idd, &wd), &want) {
            panic!("{backend:?}, 300 tokens through a 128-token plan: {m}");
        }
    }
}

/// Expert parallelism: a slice holding the odd experts of 16 computes its share of every token's sum, and the
/// batched backend refuses the map.
#[test]
#[ignore = "needs an SM90 GPU"]
fn expert_parallel_slice_sums_its_local_experts() {
    let (e_global, k, h, i, t) = (16usize, 4usize, 128usize, 64usize, 40usize);
    let map: Vec<i32> = (0..e_global).map(|g| if g % 2 == 1 { (g / 2) as i32 } else { -1 }).collect();
    let local = packed(e_global / 2, h, i, ExpertFormat::SWIGLU, true, 71);
    let ids = distinct_ids(t, k, e_global, 72);
    let w = weights_for(t, k, 73);
    let x = random_vec::<bf16>(t * h, 74, 1.0);
    // Reference: remote rows weigh nothing (any local id will do for them).
    let (ids_ref, w_ref): (Vec<i32>, Vec<f32>) =
        ids.iter().zip(&w).map(|(&g, &wt)| if map[g as usize] >= 0 { (map[g as usize], wt) } else { (0, 0.0) }).unzip();
    let want = moe_forward(&local, &x, &ids_ref, &w_ref, k);
    let (_ctx, stream) = gpu();
    let weights = Arc::new(ExpertWeights::upload(&stream, &local).unwrap());
    let ep_backends = [Backend::Eager, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];
    let opts = MoeLayerOptions::new(t, k).backends(ep_backends.into_iter().collect());
    let mut layer = MoeLayer::with_expert_map(&stream, weights.clone(), opts, &map).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    assert_eq!(layer.backend_for(1), Backend::Grouped, "Auto never picks Batched with a map");
    let (xd, idd, wd) =
        (stream.clone_htod(&x).unwrap(), stream.clone_htod(&ids).unwrap(), stream.clone_htod(&w).unwrap());
    let mut y = stream.alloc_zeros::<bf16>(t * h).unwrap();
    for backend in ep_backends {
        layer.set_backend(backend).unwrap();
        let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
        layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
        scratch.check(&stream).unwrap();
        if let Some(m) = mismatch(&stream.clone_dtoh(&y).unwrap(), &want) {
            panic!("EP slice [{backend:?}]: {m}");
        }
    }
    assert!(layer.set_backend(Backend::Batched).unwrap_err().to_string().contains("no scratch room"));
    let with_batched = MoeLayerOptions::new(t, k).backends(Backends::ALL);
    assert!(MoeLayer::with_expert_map(&stream, weights.clone(), with_batched, &map)
        .unwrap_err()
        .to_string()
        .contains("expert map"));
    // A map that does not cover the local experts is refused.
    let bad: Vec<i32> = (0..e_global).map(|g| if g < 4 { g as i32 } else { -1 }).collect();
    assert!(MoeLayer::with_expert_map(&stream, weights, MoeLayerOptions::new(t, k), &bad).is_err());
}

/// `MoeLayer<f16>`: every backend against the CPU reference in f16.
#[test]
#[ignore = "needs an SM90 GPU"]
fn f16_layer_all_backends_match_the_reference() {
    let (e, k, h, i, t) = (16usize, 4usize, 256usize, 128usize, 48usize);
    let p = packed_t::<f16>(e, h, i, ExpertFormat::SWIGLU, true, 81);
    check_all_backends("f16 uniform", &p, 64, k, &distinct_ids(t, k, e, 82), &weights_for(t, k, 83));
    let g = packed_t::<f16>(e, h, i, ExpertFormat::GPT_OSS, true, 84);
    check_all_backends("f16 gpt-oss", &g, 64, k, &distinct_ids(t, k, e, 85), &weights_for(t, k, 86));
}

// ---- Shared experts (DeepSeek-V3 / Kimi-K2: weight 1; Qwen2-MoE: a per-token sigmoid gate) ----

/// A shared SwiGLU MLP `[I_s, H]`, `[H, I_s]` (and Qwen2-MoE's gate `[1, H]` when `gated`).
fn shared_expert(h: usize, is: usize, gated: bool, seed: u64) -> SharedExpert<bf16> {
    SharedExpert::new(
        h,
        is,
        random_vec(is * h, seed, 0.15),
        random_vec(is * h, seed + 1, 0.15),
        random_vec(h * is, seed + 2, 0.15),
        gated.then(|| random_vec(h, seed + 3, 0.3)),
    )
    .unwrap()
}

/// A layer over routed experts with `shared` appended (or none), room for `backends`, its scratch, an optional
/// expert map.
struct SharedRig {
    stream: Arc<CudaStream>,
    layer: MoeLayer<bf16>,
    scratch: MoeScratch<bf16>,
}

impl SharedRig {
    fn new(
        p: &PackedExperts<bf16>,
        shared: Option<&SharedExpert<bf16>>,
        max_tokens: usize,
        k: usize,
        backends: Backends,
        map: Option<&[i32]>,
    ) -> SharedRig {
        let (_ctx, stream) = gpu();
        let weights = match shared {
            Some(s) => ExpertWeights::upload_with_shared(&stream, p, s).unwrap(),
            None => ExpertWeights::upload(&stream, p).unwrap(),
        };
        assert_eq!(weights.experts(), p.experts);
        assert_eq!(weights.shared_groups(), shared.map_or(0, |s| s.groups(p.inter).unwrap()));
        let weights = Arc::new(weights);
        let opts = MoeLayerOptions::new(max_tokens, k).backends(backends);
        let layer = match map {
            Some(m) => MoeLayer::with_expert_map(&stream, weights, opts, m).unwrap(),
            None => MoeLayer::new(&stream, weights, opts).unwrap(),
        };
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        SharedRig { stream, layer, scratch }
    }

    /// `y` of `backend` for the routing (`[T, k]`) and, when given, the shared weights `s_t` (`[T]`).
    fn forward(&mut self, backend: Backend, x: &[bf16], ids: &[i32], w: &[f32], sw: Option<&[f32]>) -> Vec<bf16> {
        let h = self.layer.weights().hidden();
        let k = ids.len() / (x.len() / h);
        let s = &self.stream;
        let (xd, idd, wd) = (s.clone_htod(x).unwrap(), s.clone_htod(ids).unwrap(), s.clone_htod(w).unwrap());
        let swd = sw.map(|v| s.clone_htod(v).unwrap());
        let mut y = s.clone_htod(&vec![bf16::NAN; x.len()]).unwrap();
        self.layer.set_backend(backend).unwrap();
        let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
        let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
        match &swd {
            Some(d) => {
                let sv = MatrixView::of("shared_weights", d, 1).unwrap();
                self.layer.forward_with_shared_weights(s, &mut self.scratch, &xv, &iv, &wv, &sv, &mut yv).unwrap()
            }
            None => self.layer.forward(s, &mut self.scratch, &xv, &iv, &wv, &mut yv).unwrap(),
        }
        self.scratch.check(s).unwrap();
        s.clone_dtoh(&y).unwrap()
    }
}

/// Every backend of a layer with `shared` against the CPU reference, which computes the shared MLP at its full
/// width I_s (the device runs it as I_s / I groups); without `sw`, s_t = 1, and passing ones explicitly gives
/// the same output bit for bit.
#[allow(clippy::too_many_arguments)]
fn check_shared_all_backends(
    name: &str,
    p: &PackedExperts<bf16>,
    shared: &SharedExpert<bf16>,
    max_tokens: usize,
    k: usize,
    x: &[bf16],
    ids: &[i32],
    w: &[f32],
    sw: Option<&[f32]>,
) {
    let want = moe_forward_with_shared(p, shared, x, ids, w, k, sw);
    // The shared expert is visible to the comparison at all (so a layer that dropped it would fail).
    assert!(mismatch(&moe_forward(p, x, ids, w, k), &want).is_some(), "{name}: shared expert below the tolerance");
    let mut rig = SharedRig::new(p, Some(shared), max_tokens, k, Backends::ALL, None);
    for backend in Backend::CONCRETE {
        let got = rig.forward(backend, x, ids, w, sw);
        if let Some(m) = mismatch(&got, &want) {
            panic!("{name} [{backend:?}]: {m}");
        }
        if sw.is_none() {
            let ones = vec![1f32; x.len() / p.hidden];
            let explicit = rig.forward(backend, x, ids, w, Some(&ones));
            assert!(
                got.iter().zip(&explicit).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} [{backend:?}]: s_t = 1"
            );
        }
    }
}

/// DeepSeek-V3-like: E 64, k 8, the grouped sigmoid router (routed_scaling_factor 2.5 in the routed weights
/// only), one shared expert of I_s = I with weight 1; in one pass, in passes of 16 tokens, and T = 1.
#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_like_shared_expert_all_backends() {
    let (e, k, h, i, t) = (64usize, 8usize, 128usize, 64usize, 48usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 201);
    let s = shared_expert(h, i, false, 202);
    let config = RouterConfig::new(
        e,
        k,
        RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
    )
    .unwrap();
    let mut rng = Rng(203);
    let logits: Vec<f32> = (0..t * e).map(|_| rng.unit() * 3.0).collect();
    let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
    let (ids, w, st) = crate::routing::gpu_route(config, &logits, Some(&bias));
    st.unwrap();
    let x = random_vec::<bf16>(t * h, 204, 1.0);
    check_shared_all_backends("deepseek-like", &p, &s, 64, k, &x, &ids, &w, None);
    check_shared_all_backends("deepseek-like, passes of 16", &p, &s, 16, k, &x, &ids, &w, None);
    check_shared_all_backends("deepseek-like, T = 1", &p, &s, 64, k, &x[..h], &ids[..k], &w[..k], None);
}

/// Qwen2-MoE-like: I_s = 4·I (four groups), softmax routing without renormalisation, and the per-token weight
/// `sigmoid(x · shared_expert_gate)` passed to `forward_with_shared_weights`. The layer refuses shared weights
/// of the wrong shape, and a layer without a shared expert refuses them at all, before any kernel.
#[test]
#[ignore = "needs an SM90 GPU"]
fn qwen2_moe_like_gated_shared_expert_all_backends() {
    let (e, k, h, i, t) = (16usize, 4usize, 128usize, 64usize, 40usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 211);
    let s = shared_expert(h, 4 * i, true, 212);
    let x = random_vec::<bf16>(t * h, 213, 1.0);
    let ids = distinct_ids(t, k, e, 214);
    let w = weights_for(t, k, 215);
    let sw = shared_gate_weights(&s, &x).unwrap();
    assert!(sw.iter().any(|&v| v < 0.4) && sw.iter().any(|&v| v > 0.6), "the gate varies per token: {sw:?}");
    check_shared_all_backends("qwen2-moe-like", &p, &s, 64, k, &x, &ids, &w, Some(&sw));
    check_shared_all_backends("qwen2-moe-like, passes of 8", &p, &s, 8, k, &x, &ids, &w, Some(&sw));

    let mut rig = SharedRig::new(&p, Some(&s), t, k, Backends::of(Backend::Grouped), None);
    let st = rig.stream.clone();
    let (xd, idd, wd) = (st.clone_htod(&x).unwrap(), st.clone_htod(&ids).unwrap(), st.clone_htod(&w).unwrap());
    let short = st.clone_htod(&sw[..t - 1]).unwrap();
    let mut y = st.alloc_zeros::<bf16>(t * h).unwrap();
    let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
    let sv = MatrixView::of("shared_weights", &short, 1).unwrap();
    let err = rig
        .layer
        .forward_with_shared_weights(
            &st,
            &mut rig.scratch,
            &xv,
            &iv,
            &wv,
            &sv,
            &mut MatrixViewMut::of("y", &mut y, h).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("shared_weights") && err.to_string().contains("[40, 1]"), "{err}");
    let mut plain = SharedRig::new(&p, None, t, k, Backends::of(Backend::Grouped), None);
    let full = st.clone_htod(&sw).unwrap();
    let sv = MatrixView::of("shared_weights", &full, 1).unwrap();
    let err = plain
        .layer
        .forward_with_shared_weights(
            &st,
            &mut plain.scratch,
            &xv,
            &iv,
            &wv,
            &sv,
            &mut MatrixViewMut::of("y", &mut y, h).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no shared expert"), "{err}");
}

/// The experts `keep` of `p`, in that order (an expert-parallel rank's local experts).
fn select_experts(p: &PackedExperts<bf16>, keep: &[usize]) -> PackedExperts<bf16> {
    let (r13, h, i) = (p.w13_rows(), p.hidden, p.inter);
    let w13 = keep.iter().flat_map(|&e| p.w13[e * r13 * h..(e + 1) * r13 * h].iter().copied()).collect();
    let w2 = keep.iter().flat_map(|&e| p.w2[e * h * i..(e + 1) * h * i].iter().copied()).collect();
    PackedExperts::new(keep.len(), h, i, p.format, w13, w2, None, None).unwrap()
}

/// Expert parallelism over two ranks (odd and even experts of 16). The shared expert's groups are local to the
/// rank that holds them and each group must be added once, since the caller sums the ranks: (1) the whole
/// DeepSeek-like shared expert on rank 0, none on rank 1; (2) a Qwen2-MoE-like four-group shared expert split
/// one group / three groups between the ranks. Each rank matches its own reference (its local experts' share
/// plus its shared groups), and the sum of the two ranks the whole layer's reference.
#[test]
#[ignore = "needs an SM90 GPU"]
fn expert_parallel_ranks_add_their_shared_groups_once() {
    let (e_global, k, h, i, t) = (16usize, 4usize, 128usize, 64usize, 40usize);
    let full = packed(e_global, h, i, ExpertFormat::SWIGLU, false, 221);
    let ids = distinct_ids(t, k, e_global, 222);
    let w = weights_for(t, k, 223);
    let x = random_vec::<bf16>(t * h, 224, 1.0);
    let ranks: [Vec<usize>; 2] =
        [(0..e_global).filter(|g| g % 2 == 1).collect(), (0..e_global).filter(|g| g % 2 == 0).collect()];
    let whole = shared_expert(h, i, false, 225);
    let gated = shared_expert(h, 4 * i, true, 226);
    let sw = shared_gate_weights(&gated, &x).unwrap();
    // (name, the whole shared expert, each rank's groups, s_t)
    type Case<'a> = (&'a str, &'a SharedExpert<bf16>, [Option<SharedExpert<bf16>>; 2], Option<&'a [f32]>);
    let cases: [Case<'_>; 2] = [
        ("whole shared expert on rank 0", &whole, [Some(whole.clone()), None], None),
        (
            "shared groups split 1 + 3",
            &gated,
            [Some(gated.slice_groups(i, 0..1).unwrap()), Some(gated.slice_groups(i, 1..4).unwrap())],
            Some(&sw[..]),
        ),
    ];
    let ep_backends = [Backend::Eager, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];
    for (name, shared, parts, sw) in cases {
        let want_total = moe_forward_with_shared(&full, shared, &x, &ids, &w, k, sw);
        let mut sums: Vec<Vec<f32>> = vec![vec![0f32; t * h]; ep_backends.len()];
        for (rank, (keep, part)) in ranks.iter().zip(&parts).enumerate() {
            let map: Vec<i32> =
                (0..e_global).map(|g| keep.iter().position(|&l| l == g).map_or(-1, |l| l as i32)).collect();
            let local = select_experts(&full, keep);
            let (ids_ref, w_ref): (Vec<i32>, Vec<f32>) = ids
                .iter()
                .zip(&w)
                .map(|(&g, &wt)| if map[g as usize] >= 0 { (map[g as usize], wt) } else { (0, 0.0) })
                .unzip();
            let want = match part {
                Some(s) => moe_forward_with_shared(&local, s, &x, &ids_ref, &w_ref, k, sw),
                None => moe_forward(&local, &x, &ids_ref, &w_ref, k),
            };
            let mut rig = SharedRig::new(&local, part.as_ref(), t, k, ep_backends.into_iter().collect(), Some(&map));
            assert_eq!(rig.layer.backend_for(1), Backend::Grouped);
            for (b, backend) in ep_backends.into_iter().enumerate() {
                // A rank without shared groups takes no shared weights.
                let got = rig.forward(backend, &x, &ids, &w, part.as_ref().and(sw));
                if let Some(m) = mismatch(&got, &want) {
                    panic!("{name}, rank {rank} [{backend:?}]: {m}");
                }
                sums[b].iter_mut().zip(&got).for_each(|(a, g)| *a += g.to_f32());
            }
        }
        for (sum, backend) in sums.iter().zip(ep_backends) {
            let total: Vec<bf16> = sum.iter().map(|&v| bf16::from_f32(v)).collect();
            if let Some(m) = mismatch(&total, &want_total) {
                panic!("{name}: the sum of the ranks [{backend:?}]: {m}");
            }
        }
    }
}

/// A shared expert whose weight is forced to 0, whose last group is dropped, or that is missing altogether (a
/// plain upload), and a gated layer run with s_t = 1: each must fail the comparison on every backend. The
/// host references show first that each mutation moves the output past the tolerance.
#[test]
#[ignore = "needs an SM90 GPU"]
fn shared_expert_mutations_are_caught() {
    let (e, k, h, i, t) = (16usize, 4usize, 128usize, 64usize, 32usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 231);
    let s = shared_expert(h, 4 * i, true, 232);
    let x = random_vec::<bf16>(t * h, 233, 1.0);
    let ids = distinct_ids(t, k, e, 234);
    let w = weights_for(t, k, 235);
    let sw = shared_gate_weights(&s, &x).unwrap();
    let want = moe_forward_with_shared(&p, &s, &x, &ids, &w, k, Some(&sw));
    let zeros = vec![0f32; t];
    let ones = vec![1f32; t];
    let dropped = s.slice_groups(i, 0..3).unwrap();
    assert!(mismatch(&moe_forward_with_shared(&p, &s, &x, &ids, &w, k, Some(&zeros)), &want).is_some());
    assert!(mismatch(&moe_forward_with_shared(&p, &s, &x, &ids, &w, k, Some(&ones)), &want).is_some());
    assert!(mismatch(&moe_forward_with_shared(&p, &dropped, &x, &ids, &w, k, Some(&sw)), &want).is_some());
    assert!(mismatch(&moe_forward(&p, &x, &ids, &w, k), &want).is_some());

    let mut rig = SharedRig::new(&p, Some(&s), t, k, Backends::ALL, None);
    let mut cut = SharedRig::new(&p, Some(&dropped), t, k, Backends::ALL, None);
    let mut none = SharedRig::new(&p, None, t, k, Backends::ALL, None);
    for backend in Backend::CONCRETE {
        assert!(mismatch(&rig.forward(backend, &x, &ids, &w, Some(&sw)), &want).is_none(), "{backend:?}: the good run");
        for (what, got) in [
            ("shared weight 0", rig.forward(backend, &x, &ids, &w, Some(&zeros))),
            ("gate ignored (s_t = 1)", rig.forward(backend, &x, &ids, &w, None)),
            ("last shared group dropped", cut.forward(backend, &x, &ids, &w, Some(&sw))),
            ("no shared expert", none.forward(backend, &x, &ids, &w, None)),
        ] {
            assert!(mismatch(&got, &want).is_some(), "{backend:?}: {what} went unnoticed");
        }
    }
}

/// The serving backends with a shared expert, captured once with their router and replayed with new logits:
/// the extended routing is one more kernel in the graph.
#[test]
#[ignore = "needs an SM90 GPU"]
fn shared_expert_layer_replays_in_a_graph() {
    for backend in [Backend::Batched, Backend::Grouped, Backend::Masked, Backend::Fused] {
        replay_in_a_graph_with(backend, true);
    }
}
