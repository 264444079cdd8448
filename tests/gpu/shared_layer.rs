//! Shared experts in the MoE layer (DeepSeek-V3 / Kimi-K2: weight 1; Qwen2-MoE: a per-token sigmoid gate; split
//! between expert-parallel ranks) against the full-width shared reference, with their mutations.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::reference::{moe_forward, moe_forward_with_shared, shared_gate_weights};
use moe_gemm::*;

use crate::common::*;
use crate::layer::{distinct_ids, mismatch, packed, replay_in_a_graph_with, views, weights_for};
/// A shared SwiGLU MLP `[I_s, H]`, `[H, I_s]` (and Qwen2-MoE's gate `[1, H]` when `gated`).
pub(crate) fn shared_expert(h: usize, is: usize, gated: bool, seed: u64) -> SharedExpert<bf16> {
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
