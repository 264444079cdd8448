//! The serving core: many layers over one shared scratch in one captured graph, the scratch's bytes, launches
//! from a fresh thread, and validation that refuses bad input before anything is queued.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::dtype::DType;
use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::layer::{GateUp, LayerShape, WeightFormat};
use moe_gemm::random::{fill_device, topk_ids};
use moe_gemm::reference::moe_forward;
use moe_gemm::tuning::TunedBackends;
use moe_gemm::*;

use crate::common::*;
use crate::layer::{packed, views, weights_for};

/// 58 DeepSeek-V3-shaped layers (E 256, k 8; H 256, I 128 to keep 58 layers' weights small) share one scratch;
/// the whole stack is captured in one CUDA graph and replayed, and each layer's output equals that layer run on
/// its own with a scratch of its own, bit for bit (a layer reading another's leftovers would differ). Layer 0
/// also matches the CPU reference. One test per backend: Auto (Batched at these sizes), Fused and Grouped (apart,
/// so that a sanitizer holds one backend's launches at a time).
#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_shaped_58_layers_share_one_scratch_in_one_graph_auto() {
    fifty_eight_layers_in_one_graph(Backend::Auto);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_shaped_58_layers_share_one_scratch_in_one_graph_fused() {
    fifty_eight_layers_in_one_graph(Backend::Fused);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_shaped_58_layers_share_one_scratch_in_one_graph_grouped() {
    fifty_eight_layers_in_one_graph(Backend::Grouped);
}

fn fifty_eight_layers_in_one_graph(backend: Backend) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (layers, e, k, h, i, t) = (58usize, 256usize, 8usize, 256usize, 128usize, 64usize);
    let (_ctx, stream) = gpu();
    let p0 = packed(e, h, i, ExpertFormat::SWIGLU, false, 1);
    let mut weights = vec![Arc::new(ExpertWeights::upload(&stream, &p0).unwrap())];
    for l in 1..layers {
        let mut w13 = stream.alloc_zeros::<bf16>(e * 2 * i * h).unwrap();
        let mut w2 = stream.alloc_zeros::<bf16>(e * h * i).unwrap();
        fill_device(&stream, &mut w13, 10 + 2 * l as u64, 0.1).unwrap();
        fill_device(&stream, &mut w2, 11 + 2 * l as u64, 0.1).unwrap();
        let w = ExpertWeights::from_device(e, h, i, GateUp::Concatenated, Activation::SiluGated, w13, w2, None, None);
        weights.push(Arc::new(w.unwrap()));
    }
    let x_host = random_vec::<bf16>(t * h, 3, 1.0);
    let x = stream.clone_htod(&x_host).unwrap();
    let ids_h: Vec<Vec<i32>> = (0..layers).map(|l| topk_ids(t, k, e, 100 + l as u64)).collect();
    let w_h: Vec<Vec<f32>> = (0..layers).map(|l| weights_for(t, k, 200 + l as u64)).collect();
    let ids: Vec<CudaSlice<i32>> = ids_h.iter().map(|v| stream.clone_htod(v).unwrap()).collect();
    let ws: Vec<CudaSlice<f32>> = w_h.iter().map(|v| stream.clone_htod(v).unwrap()).collect();
    let plans: Vec<MoeLayer<bf16>> = weights
        .iter()
        .map(|w| MoeLayer::new(&stream, w.clone(), MoeLayerOptions::new(t, k).backend(backend)).unwrap())
        .collect();
    let mut scratch = MoeScratch::for_layers(&stream, &plans).unwrap();
    assert_eq!(scratch.needs(), plans[0].needs(), "{backend:?}: identical layers, one layer's scratch");
    let mut ys: Vec<CudaSlice<bf16>> = (0..layers).map(|_| stream.alloc_zeros::<bf16>(t * h).unwrap()).collect();
    let run_all = |scratch: &mut MoeScratch<bf16>, ys: &mut [CudaSlice<bf16>]| {
        for (l, layer) in plans.iter().enumerate() {
            let (xv, iv, wv) = views(&x, h, &ids[l], &ws[l], k);
            let mut yv = MatrixViewMut::of("y", &mut ys[l], h).unwrap();
            layer.forward(&stream, scratch, &xv, &iv, &wv, &mut yv).unwrap();
        }
    };
    run_all(&mut scratch, &mut ys);
    stream.synchronize().unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    run_all(&mut scratch, &mut ys);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
    for y in ys.iter_mut() {
        stream.memcpy_htod(&vec![bf16::NAN; t * h], y).unwrap();
    }
    graph.launch().unwrap();
    graph.launch().unwrap();
    scratch.check(&stream).unwrap();
    let from_graph: Vec<Vec<bf16>> = ys.iter().map(|y| stream.clone_dtoh(y).unwrap()).collect();
    drop(graph);
    for (l, layer) in plans.iter().enumerate() {
        let mut own = MoeScratch::for_layers(&stream, [layer]).unwrap();
        let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
        let (xv, iv, wv) = views(&x, h, &ids[l], &ws[l], k);
        layer.forward(&stream, &mut own, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
        own.check(&stream).unwrap();
        let alone = stream.clone_dtoh(&y).unwrap();
        assert!(alone.iter().all(|v| v.is_finite()), "{backend:?} layer {l}: non-finite output");
        assert!(
            alone.iter().zip(&from_graph[l]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{backend:?} layer {l}: the 58-layer graph over one scratch differs from the layer alone"
        );
    }
    if let Some(m) = bf16_layer_mismatch(&from_graph[0], &moe_forward(&p0, &x_host, &ids_h[0], &w_h[0], k)) {
        panic!("{backend:?} layer 0 vs the CPU reference: {m}");
    }
}

/// The scratch allocates exactly what its footprint says, and the plan's needs are what the host-only sizing
/// (the code behind `moe-gemm plan`) computes for the device's SM count.
#[test]
#[ignore = "needs an SM90 GPU"]
fn scratch_allocates_its_footprint_and_the_sizing_needs_no_gpu() {
    let (_ctx, stream) = gpu();
    let info = DeviceInfo::query(stream.context()).unwrap();
    let (e, k, h, i) = (64usize, 8usize, 512usize, 256usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 1);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    for (t, backends) in [
        (1usize, None),
        (64, None),
        (4096, None),
        (256, Some(Backends::ALL)),
        (32, Some(Backends::of(Backend::Batched))),
    ] {
        let mut opts = MoeLayerOptions::new(t, k);
        if let Some(b) = backends {
            opts = opts.backends(b);
        }
        let layer = MoeLayer::new(&stream, weights.clone(), opts).unwrap();
        let shape =
            LayerShape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true };
        let host =
            LayerSizing::new(shape, DType::BF16, t, Backend::Auto, backends, None, None, false, info.sm_count as usize)
                .unwrap();
        assert_eq!(layer.needs(), host.needs(), "T = {t}, {backends:?}: device plan vs host sizing");
        let scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        assert_eq!(scratch.bytes(), layer.needs().footprint().total(), "T = {t}, {backends:?}: allocated vs footprint");
        let plan = layer.plan_bytes();
        assert_eq!(plan, host.plan_bytes(false), "T = {t}: plan bytes");
        assert!(plan.device + plan.host < 1 << 20);
    }
}

/// A layer and scratch made on one thread run from a fresh thread (no context bound there by the caller) and
/// give the same bits.
#[test]
#[ignore = "needs an SM90 GPU"]
fn layer_planned_on_one_thread_runs_from_a_fresh_thread() {
    let ctx = moe_gemm::device::open(0).unwrap();
    let stream: Arc<CudaStream> = ctx.new_stream().unwrap();
    let (e, k, h, i, t) = (16usize, 4usize, 256usize, 128usize, 40usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 5);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    let (idh, wh) = (topk_ids(t, k, e, 7), weights_for(t, k, 8));
    let x_host = random_vec::<bf16>(t * h, 9, 1.0);
    let want = moe_forward(&p, &x_host, &idh, &wh, k);
    for backend in [Backend::Batched, Backend::Grouped, Backend::Fused] {
        let layer = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(t, k).backend(backend)).unwrap();
        let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
        let (x, ids, w) =
            (stream.clone_htod(&x_host).unwrap(), stream.clone_htod(&idh).unwrap(), stream.clone_htod(&wh).unwrap());
        let mut y = stream.alloc_zeros::<bf16>(t * h).unwrap();
        stream.synchronize().unwrap();
        let s = stream.clone();
        let got = std::thread::spawn(move || {
            let (xv, iv, wv) = views(&x, h, &ids, &w, k);
            layer.forward(&s, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
            scratch.check(&s).unwrap();
            s.clone_dtoh(&y).unwrap()
        })
        .join()
        .unwrap();
        if let Some(m) = bf16_layer_mismatch(&got, &want) {
            panic!("{backend:?} from a fresh thread: {m}");
        }
    }
}

/// Bad views, a short scratch or a backend without room are refused before any kernel runs: the routing holds an
/// out-of-range id, which the layout build would report, and the status word stays clean; y stays untouched.
#[test]
#[ignore = "needs an SM90 GPU"]
fn forward_refuses_bad_input_before_queueing_anything() {
    let (_ctx, stream) = gpu();
    let (e, k, h, i, t) = (8usize, 2usize, 512usize, 128usize, 64usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 1);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    let layer = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(t, k).backend(Backend::Grouped)).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    let mut ids_h = topk_ids(t, k, e, 3);
    ids_h[5] = 9999;
    let ids = stream.clone_htod(&ids_h).unwrap();
    let w = stream.clone_htod(&weights_for(t, k, 4)).unwrap();
    let big = stream.alloc_zeros::<bf16>(t * 1024).unwrap();
    let mut y = stream.clone_htod(&vec![bf16::NAN; t * 1024]).unwrap();
    let wrong_hidden = MatrixView::of("x", &big, 1024).unwrap();
    let (iv, wv) = (MatrixView::of("topk_ids", &ids, k).unwrap(), MatrixView::of("topk_weights", &w, k).unwrap());
    let mut errors = Vec::new();
    // A layer for H = 512 fed [64, 1024] (the new user's mistake): refused, naming x's columns.
    let mut yv = MatrixViewMut::of("y", &mut y, 1024).unwrap();
    errors.push(layer.forward(&stream, &mut scratch, &wrong_hidden, &iv, &wv, &mut yv).unwrap_err().to_string());
    // x of the right width but y of 63 rows; ids of the wrong width; a strided x.
    let xv = MatrixView::new("x", big.slice(..t * h), t, h).unwrap();
    let mut short_y = MatrixViewMut::new("y", y.slice_mut(..(t - 1) * h), t - 1, h).unwrap();
    errors.push(layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut short_y).unwrap_err().to_string());
    let ids_1 = MatrixView::new("topk_ids", ids.slice(..t), t, 1).unwrap();
    let mut yv = MatrixViewMut::new("y", y.slice_mut(..t * h), t, h).unwrap();
    errors.push(layer.forward(&stream, &mut scratch, &xv, &ids_1, &wv, &mut yv).unwrap_err().to_string());
    let strided = MatrixView::with_stride("x", big.slice(..), t, h, 1024).unwrap();
    errors.push(layer.forward(&stream, &mut scratch, &strided, &iv, &wv, &mut yv).unwrap_err().to_string());
    // A scratch sized for 8 tokens serving a 64-token plan; a backend the plan made no room for.
    let small = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(8, k).backend(Backend::Grouped)).unwrap();
    let mut small_scratch = MoeScratch::for_layers(&stream, [&small]).unwrap();
    errors.push(layer.forward(&stream, &mut small_scratch, &xv, &iv, &wv, &mut yv).unwrap_err().to_string());
    let mut grouped_only =
        MoeLayer::new(&stream, weights, MoeLayerOptions::new(t, k).backend(Backend::Grouped)).unwrap();
    errors.push(grouped_only.set_backend(Backend::Fused).unwrap_err().to_string());
    for (e, want) in errors.iter().zip([
        "hidden size is 512",
        "is [63, 512], the layer needs [64, 512]",
        "is [64, 1], the layer needs [64, 2]",
        "row stride 1024",
        "scratch capacity",
        "no scratch room",
    ]) {
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
    stream.synchronize().unwrap();
    scratch.check(&stream).expect("no kernel ran: the out-of-range id was never seen");
    small_scratch.check(&stream).expect("no kernel ran on the small scratch either");
    assert!(stream.clone_dtoh(&y).unwrap().iter().all(|v| v.is_nan()), "y was written");
    // The same routing through a valid call does reach the device and is reported there.
    let mut yv = MatrixViewMut::new("y", y.slice_mut(..t * h), t, h).unwrap();
    layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut yv).unwrap();
    assert!(scratch.check(&stream).unwrap_err().to_string().contains("expert id"));
}

/// A layer planned for Auto (room for Batched, Fused and Grouped, each for the batches Auto sends it) switched
/// to each of them by hand runs every batch up to its plan: at T = 1..8 Auto sends Grouped one token, so its
/// `a` holds a few rows while Fused's padded layout holds hundreds. The GEMM plans used to be sized by the
/// largest pass and refused Grouped's `a` ("buffer `a` ... rows of A x K"). `set_backend` refuses a backend
/// with less than full passes; `set_backend_with_passes` accepts it, and the batch runs in `passes(T)` passes.
#[test]
#[ignore = "needs an SM90 GPU"]
fn auto_planned_layer_runs_each_of_its_backends_by_hand() {
    let (_ctx, stream) = gpu();
    let (e, k, h, i, t) = (64usize, 8usize, 512usize, 256usize, 8usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 11);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    let mut layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(t, k)).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    let (idh, wh) = (topk_ids(t, k, e, 12), weights_for(t, k, 13));
    let x_host = random_vec::<bf16>(t * h, 14, 1.0);
    let want = moe_forward(&p, &x_host, &idh, &wh, k);
    let (x, ids, w) =
        (stream.clone_htod(&x_host).unwrap(), stream.clone_htod(&idh).unwrap(), stream.clone_htod(&wh).unwrap());
    for backend in [Backend::Grouped, Backend::Fused, Backend::Batched] {
        let room = layer.sizing().tokens_per_pass(backend);
        if room < t {
            let err = layer.set_backend(backend).unwrap_err().to_string();
            assert!(err.contains(&format!("room for {room} token")), "{backend}: {err}");
        }
        layer.set_backend_with_passes(backend).unwrap();
        assert_eq!(layer.passes(t).unwrap(), t.div_ceil(room), "{backend}");
        let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
        let (xv, iv, wv) = views(&x, h, &ids, &w, k);
        layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
        scratch.check(&stream).unwrap();
        if let Some(m) = bf16_layer_mismatch(&stream.clone_dtoh(&y).unwrap(), &want) {
            panic!("{backend:?} in an Auto plan: {m}");
        }
    }
}

/// A layer planned from a tuned table runs, at each batch, the backend of the nearest bucket (the smaller on a
/// tie), with room for all of them in one plan, and every batch matches the CPU reference. The table sends
/// four batch sizes to four different backends, so a plan that ignored it (or sized only the cost model's
/// backends) would pick differently or refuse; its Fused bucket names a tile the rule would not take there.
#[test]
#[ignore = "needs an SM90 GPU"]
fn layer_planned_from_a_tuned_table_runs_its_buckets_backends() {
    use Backend::{Contiguous, Fused, Grouped, Masked};
    let (_ctx, stream) = gpu();
    let (e, k, h, i, max_t) = (64usize, 4usize, 512usize, 256usize, 64usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 21);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    // Bucket 16 names Decode32 (the rule takes Decode16 at 1 row per expert, the merged tile at 40 tokens).
    let table = TunedBackends::new(e, i, &[(1, Masked), (4, Contiguous), (16, Fused), (64, Grouped)]).unwrap();
    let table = table.with_fused_tiles(&[(16, FusedTile::Decode32)]).unwrap();
    let layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(max_t, k).tuned(table)).unwrap();
    assert_eq!(layer.tuned(), Some(&table));
    assert_eq!(
        (FusedTile::for_rows(16 * k, e), FusedTile::for_rows(40 * k, e)),
        (FusedTile::Decode16, FusedTile::DecodeMerged)
    );
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    for (t, want_backend) in [(1, Masked), (3, Contiguous), (16, Fused), (40, Fused), (41, Grouped), (64, Grouped)] {
        assert_eq!(layer.backend_for(t), want_backend, "T = {t}");
        if want_backend == Fused {
            assert_eq!(layer.fused_tile_for(t), FusedTile::Decode32, "T = {t}: the table's tile");
        }
        let (idh, wh) = (topk_ids(t, k, e, 30 + t as u64), weights_for(t, k, 31 + t as u64));
        let x_host = random_vec::<bf16>(t * h, 32 + t as u64, 1.0);
        let want = moe_forward(&p, &x_host, &idh, &wh, k);
        let (x, ids, w) =
            (stream.clone_htod(&x_host).unwrap(), stream.clone_htod(&idh).unwrap(), stream.clone_htod(&wh).unwrap());
        let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
        let (xv, iv, wv) = views(&x, h, &ids, &w, k);
        layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
        scratch.check(&stream).unwrap();
        if let Some(m) = bf16_layer_mismatch(&stream.clone_dtoh(&y).unwrap(), &want) {
            panic!("T = {t} ({want_backend:?} from the table): {m}");
        }
    }
    // A table of another shape is refused by name.
    let other = TunedBackends::new(e, 2 * i, &[(1, Masked)]).unwrap();
    let w2 = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    let err = MoeLayer::new(&stream, w2, MoeLayerOptions::new(max_t, k).tuned(other)).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("tuned backends for E = 64, N = 512"), "{err}");
}

/// On an H200 a Qwen3-30B-A3B-shaped layer (E 128, H 2048, I 768) takes the shipped table by default, and its
/// Auto output at each batch is bit-equal to the table's backend run by hand; `cost_model_only` has no table.
/// On another GPU the shipped lookup finds nothing and the test says so.
#[test]
#[ignore = "needs an SM90 GPU"]
fn shipped_table_drives_auto_on_h200() {
    let (ctx, stream) = gpu();
    let (e, k, h, i, max_t) = (128usize, 8usize, 2048usize, 768usize, 256usize);
    let name = DeviceInfo::query(&ctx).unwrap().name;
    let Some(table) = TunedBackends::shipped(&name, WeightFormat::Dense, e, i) else {
        println!("SKIP: no shipped table for {name}");
        return;
    };
    let mut w13 = stream.alloc_zeros::<bf16>(e * 2 * i * h).unwrap();
    let mut w2 = stream.alloc_zeros::<bf16>(e * h * i).unwrap();
    fill_device(&stream, &mut w13, 41, 0.05).unwrap();
    fill_device(&stream, &mut w2, 42, 0.05).unwrap();
    let w = ExpertWeights::from_device(e, h, i, GateUp::Concatenated, Activation::SiluGated, w13, w2, None, None);
    let weights = Arc::new(w.unwrap());
    let plain = MoeLayer::new(&stream, weights.clone(), MoeLayerOptions::new(max_t, k).cost_model_only()).unwrap();
    assert!(plain.tuned().is_none());
    let mut layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(max_t, k)).unwrap();
    assert_eq!(layer.tuned(), Some(&table), "the shipped table for E = {e}, N = {i} on {name}");
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    for t in [1usize, 8, 16, 256] {
        let backend = table.pick(t);
        assert_eq!(layer.backend_for(t), backend, "T = {t}");
        let x = stream.clone_htod(&random_vec::<bf16>(t * h, 43 + t as u64, 1.0)).unwrap();
        let ids = stream.clone_htod(&topk_ids(t, k, e, 44 + t as u64)).unwrap();
        let w = stream.clone_htod(&weights_for(t, k, 45 + t as u64)).unwrap();
        let mut run = |layer: &MoeLayer<bf16>| {
            let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
            let (xv, iv, wv) = views(&x, h, &ids, &w, k);
            let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
            layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut yv).unwrap();
            scratch.check(&stream).unwrap();
            stream.clone_dtoh(&y).unwrap()
        };
        let auto = run(&layer);
        // The table's backend has the room Auto gives it (batches up to its buckets), not a full pass.
        layer.set_backend_with_passes(backend).unwrap();
        let by_hand = run(&layer);
        layer.set_backend(Backend::Auto).unwrap();
        assert!(auto.iter().all(|v| v.is_finite()), "T = {t}: non-finite output");
        assert_eq!(
            auto.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            by_hand.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "T = {t}: Auto and {backend:?} by hand"
        );
    }
}

/// One scratch on two streams: a forward and `check` on a stream other than the scratch's are refused naming
/// both streams, before anything is queued (y stays NaN, the status word clean); after `hand_over` (the first
/// stream's work ordered before the second's by `join`, which `hand_over` does not do itself) the second
/// stream runs and matches the CPU reference, and the first is refused in turn.
#[test]
#[ignore = "needs an SM90 GPU"]
fn a_scratch_used_on_another_stream_is_refused_until_handed_over() {
    let (ctx, stream) = gpu();
    let other = ctx.new_stream().unwrap();
    let (e, k, h, i, t) = (16usize, 4usize, 256usize, 128usize, 8usize);
    let p = packed(e, h, i, ExpertFormat::SWIGLU, false, 21);
    let weights = Arc::new(ExpertWeights::upload(&stream, &p).unwrap());
    let layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(t, k).backend(Backend::Grouped)).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    assert_eq!(scratch.cu_stream(), stream.cu_stream() as u64);
    let (idh, wh) = (topk_ids(t, k, e, 22), weights_for(t, k, 23));
    let x_host = random_vec::<bf16>(t * h, 24, 1.0);
    let want = moe_forward(&p, &x_host, &idh, &wh, k);
    let (x, ids, w) =
        (stream.clone_htod(&x_host).unwrap(), stream.clone_htod(&idh).unwrap(), stream.clone_htod(&wh).unwrap());
    let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
    stream.synchronize().unwrap();
    let name = |s: &Arc<CudaStream>| format!("stream {:#x}", s.cu_stream() as u64);
    let (xv, iv, wv) = views(&x, h, &ids, &w, k);
    let err = layer
        .forward(&other, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&name(&stream)) && err.contains(&name(&other)), "{err}");
    let err = scratch.check(&other).unwrap_err().to_string();
    assert!(err.contains(&name(&stream)) && err.contains(&name(&other)), "{err}");
    assert!(stream.clone_dtoh(&y).unwrap().iter().all(|v| v.is_nan()), "a refused forward queued work");
    scratch.check(&stream).unwrap();
    other.join(&stream).unwrap();
    scratch.hand_over(&other).unwrap();
    assert_eq!(scratch.cu_stream(), other.cu_stream() as u64);
    layer.forward(&other, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap()).unwrap();
    scratch.check(&other).unwrap();
    if let Some(m) = bf16_layer_mismatch(&other.clone_dtoh(&y).unwrap(), &want) {
        panic!("after hand_over: {m}");
    }
    let err = layer
        .forward(&stream, &mut scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", &mut y, h).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("hand_over"), "{err}");
}

/// A Qwen3-30B-A3B-shaped layer over block-FP8 experts (E 128, H 2048, I 768) takes the FP8 table shipped for
/// this GPU by default (`dtype=fp8_w8a8,block_shape=[128, 128]`), says so (`auto_source`), and its Auto output at
/// each batch is bit-equal to the table's backend run by hand; the 16-bit table of the same shape is not taken.
/// On a GPU with no FP8 table the test says so.
#[test]
#[ignore = "needs an SM90 GPU"]
fn shipped_fp8_table_drives_auto() {
    use moe_gemm::layer::{AutoSource, Fp8ExpertWeights};
    use moe_gemm::quant::{Fp8BlockWeights, ScaleFormat};
    let (ctx, stream) = gpu();
    let (e, k, h, i, max_t) = (128usize, 8usize, 2048usize, 768usize, 256usize);
    let name = DeviceInfo::query(&ctx).unwrap().name;
    let Some(table) = TunedBackends::shipped(&name, WeightFormat::Fp8Block, e, i) else {
        println!("SKIP: no FP8 table shipped for {name}");
        return;
    };
    let mut b13 = stream.alloc_zeros::<bf16>(e * 2 * i * h).unwrap();
    let mut b2 = stream.alloc_zeros::<bf16>(e * h * i).unwrap();
    fill_device(&stream, &mut b13, 51, 0.05).unwrap();
    fill_device(&stream, &mut b2, 52, 0.05).unwrap();
    let mut status = DeviceStatus::new(&stream).unwrap();
    let f = ScaleFormat::F32;
    let w13 = Fp8BlockWeights::quantize_device(&stream, &b13.as_view(), e, 2 * i, h, f, &mut status).unwrap();
    let w2 = Fp8BlockWeights::quantize_device(&stream, &b2.as_view(), e, h, i, f, &mut status).unwrap();
    status.check(&stream).unwrap();
    let w = Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, w13, w2, None, None);
    let weights = Arc::new(w.unwrap());
    let mut layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(max_t, k)).unwrap();
    assert_eq!(layer.tuned(), Some(&table), "the FP8 table for E = {e}, N = {i} on {name}");
    assert_eq!(layer.auto_source(), AutoSource::ShippedTable(table.shipped_file().unwrap()));
    assert_ne!(TunedBackends::shipped(&name, WeightFormat::Dense, e, i).as_ref(), Some(&table));
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    for t in [1usize, 2, 8, 64, 256] {
        let backend = table.pick(t);
        assert_eq!(layer.backend_for(t), backend, "T = {t}");
        let x = stream.clone_htod(&random_vec::<bf16>(t * h, 53 + t as u64, 1.0)).unwrap();
        let ids = stream.clone_htod(&topk_ids(t, k, e, 54 + t as u64)).unwrap();
        let w = stream.clone_htod(&weights_for(t, k, 55 + t as u64)).unwrap();
        let mut run = |layer: &MoeLayer<bf16, Fp8ExpertWeights>| {
            let mut y = stream.clone_htod(&vec![bf16::NAN; t * h]).unwrap();
            let (xv, iv, wv) = views(&x, h, &ids, &w, k);
            let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
            layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut yv).unwrap();
            scratch.check(&stream).unwrap();
            stream.clone_dtoh(&y).unwrap()
        };
        let auto = run(&layer);
        layer.set_backend_with_passes(backend).unwrap();
        let by_hand = run(&layer);
        layer.set_backend(Backend::Auto).unwrap();
        assert!(auto.iter().all(|v| v.is_finite()), "T = {t}: non-finite output");
        assert_eq!(
            auto.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            by_hand.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "T = {t}: Auto and {backend:?} by hand"
        );
    }
}
