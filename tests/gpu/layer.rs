//! The MoE layer: every backend against the CPU reference and each other, mutation checks that prove the
//! comparison bites, and the masked layer captured in a CUDA graph. Shared experts: `shared_layer.rs`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use moe_gemm::dtype::Element;
use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::layer::{GateUp, Storage};
use moe_gemm::reference::{first_mismatch, Tolerance};
use moe_gemm::reference::{moe_forward, moe_forward_with_shared};
use moe_gemm::*;

use crate::common::*;
use crate::shared_layer::shared_expert;

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

pub(crate) fn distinct_ids(tokens: usize, k: usize, e: usize, seed: u64) -> Vec<i32> {
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

pub(crate) fn mismatch<T: Element>(got: &[T], want: &[T]) -> Option<String> {
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

/// The Fused backend with the decode tiles Auto does not pick at this batch forced (2 rows per expert: Auto's
/// rule takes Decode16 on 32 experts), captured and replayed as above.
#[test]
#[ignore = "needs an SM90 GPU"]
fn forced_fused_decode_tiles_replay_in_a_graph() {
    for tile in [FusedTile::Decode32, FusedTile::DecodeMerged] {
        replay_in_a_graph_tiled(Backend::Fused, false, Some(tile));
    }
}

/// As [`replay_in_a_graph`], with a shared expert of I_s = I (weight 1) when `shared`.
pub(crate) fn replay_in_a_graph_with(backend: Backend, shared: bool) {
    replay_in_a_graph_tiled(backend, shared, None)
}

/// As [`replay_in_a_graph_with`], with the Fused tile forced when `tile` is given.
fn replay_in_a_graph_tiled(backend: Backend, shared: bool, tile: Option<FusedTile>) {
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
    let mut options = MoeLayerOptions::new(t, k).masked_max_m(t).backend(backend);
    if let Some(tile) = tile {
        options = options.fused_tile(tile);
    }
    let layer = MoeLayer::new(&stream, weights, options).unwrap();
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
            "{backend:?} {tile:?}: replay {replay} differs from eager"
        );
        let want = match &s {
            Some(s) => moe_forward_with_shared(&p, s, &x_host, &ids_h, &w_h, k, None),
            None => moe_forward(&p, &x_host, &ids_h, &w_h, k),
        };
        if let Some(m) = mismatch(&from_graph, &want) {
            panic!("{backend:?} {tile:?}: replay {replay}: {m}");
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
