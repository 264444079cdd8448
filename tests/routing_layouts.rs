//! CPU tests of the router and layout references and of every validation error.

mod common;

use moe_gemm::layouts::{LayoutDims, LayoutSpec};
use moe_gemm::reference::layouts as layout_ref;
use moe_gemm::reference::routing::route;
use moe_gemm::view::ViewShape;
use moe_gemm::*;

fn invalid<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

#[test]
fn router_config_constraints_are_named() {
    let soft = RouterKind::Softmax { renormalize: true };
    assert!(invalid(RouterConfig::new(0, 1, soft)).contains("experts = 0"));
    assert!(invalid(RouterConfig::new(2048, 1, soft)).contains("1..=1024"));
    assert!(invalid(RouterConfig::new(8, 9, soft)).contains("top_k = 9"));
    assert!(invalid(RouterConfig::new(64, 33, soft)).contains("top_k = 33"));
    let g = |n_group, topk_group, k| {
        RouterConfig::new(
            256,
            k,
            RouterKind::GroupedSigmoid { n_group, topk_group, renormalize: true, routed_scaling_factor: 2.5 },
        )
    };
    assert!(invalid(g(6, 2, 8)).contains("not a multiple of n_group = 6"));
    assert!(invalid(g(8, 9, 8)).contains("topk_group = 9"));
    assert!(invalid(g(64, 4, 8)).contains("n_group = 64"));
    assert!(invalid(g(8, 1, 33)).contains("top_k = 33"));
    let tiny = RouterConfig::new(
        8,
        2,
        RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 1.0 },
    );
    assert!(invalid(tiny).contains("needs >= 2"));
    let few = RouterConfig::new(
        16,
        8,
        RouterKind::GroupedSigmoid { n_group: 4, topk_group: 1, renormalize: true, routed_scaling_factor: 1.0 },
    );
    assert!(invalid(few).contains("exceeds the 4 experts"));
    let nan = RouterConfig::new(
        16,
        2,
        RouterKind::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: true, routed_scaling_factor: f32::NAN },
    );
    assert!(invalid(nan).contains("not finite"));
    assert!(RouterConfig::deepseek_v3().takes_bias());
    assert!(!RouterConfig::mixtral().takes_bias());
}

#[test]
fn softmax_reference_by_hand() {
    // logits [0, ln 2, ln 3, ln 4]: p = [1, 2, 3, 4] / 10; top-2 = experts 3, 2.
    let l = [0.0, 2f32.ln(), 3f32.ln(), 4f32.ln()];
    let cfg = RouterConfig::new(4, 2, RouterKind::Softmax { renormalize: false }).unwrap();
    let r = route(&cfg, &l, None);
    assert_eq!(r.ids, vec![3, 2]);
    assert!((r.weights[0] - 0.4).abs() < 1e-6 && (r.weights[1] - 0.3).abs() < 1e-6);
    let cfg = RouterConfig::new(4, 2, RouterKind::Softmax { renormalize: true }).unwrap();
    let r = route(&cfg, &l, None);
    assert!((r.weights[0] - 4.0 / 7.0).abs() < 1e-6 && (r.weights[1] - 3.0 / 7.0).abs() < 1e-6);
}

#[test]
fn gpt_oss_softmax_runs_over_the_chosen_only() {
    let l = [1.0f32, 5.0, 3.0, 3.0];
    let cfg = RouterConfig::new(4, 2, RouterKind::TopKSoftmax).unwrap();
    let r = route(&cfg, &l, None);
    assert_eq!(r.ids, vec![1, 2], "tie between 2 and 3 goes to the lower id");
    let e = (-2f32).exp();
    assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
    assert_eq!(r.margin[0], 0.0, "the tie is reported as a zero margin");
}

#[test]
fn deepseek_reference_limits_groups_and_keeps_bias_out_of_weights() {
    // 8 experts in 4 groups of 2, keep 1 group, top-2.
    let cfg = RouterConfig::new(
        8,
        2,
        RouterKind::GroupedSigmoid { n_group: 4, topk_group: 1, renormalize: true, routed_scaling_factor: 2.0 },
    )
    .unwrap();
    let l = [0.0f32, 0.0, 1.0, -1.0, 3.0, -3.0, 0.5, 0.5];
    // Without bias, group scores (sum of 2 sigmoids): g0 1.0, g1 ~1.0, g2 ~1.0 (0.9526+0.0474), g3 ~1.245 -> g3.
    let r = route(&cfg, &l, Some(&[0.0; 8]));
    assert_eq!(r.ids, vec![6, 7]);
    // A bias on expert 0 moves the kept group to g0, but the weights stay those of the unbiased scores.
    let r = route(&cfg, &l, Some(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]));
    assert_eq!(r.ids, vec![0, 1]);
    assert!((r.weights[0] - 1.0).abs() < 1e-6 && (r.weights[1] - 1.0).abs() < 1e-6, "{:?}", r.weights);
}

#[test]
fn reference_treats_nan_as_minus_infinity() {
    let cfg = RouterConfig::new(4, 1, RouterKind::TopKSoftmax).unwrap();
    assert_eq!(route(&cfg, &[f32::NAN, -5.0, -6.0, -7.0], None).ids, vec![1]);
}

#[test]
fn reference_without_a_finite_logit_picks_by_the_tie_rule_with_zero_weights() {
    let nan = [f32::NAN; 4];
    let neg = [f32::NEG_INFINITY; 4];
    for kind in
        [RouterKind::Softmax { renormalize: true }, RouterKind::Softmax { renormalize: false }, RouterKind::TopKSoftmax]
    {
        let cfg = RouterConfig::new(4, 2, kind).unwrap();
        for l in [nan, neg] {
            let r = route(&cfg, &l, None);
            assert_eq!((r.ids, r.weights), (vec![0, 1], vec![0.0, 0.0]), "{kind:?} {l:?}");
        }
    }
    // One finite logit among NaNs takes all the weight; the second choice is the lowest NaN expert, weight 0.
    let cfg = RouterConfig::new(4, 2, RouterKind::TopKSoftmax).unwrap();
    let r = route(&cfg, &[f32::NAN, -30.0, f32::NAN, f32::NEG_INFINITY], None);
    assert_eq!((r.ids, r.weights), (vec![1, 0], vec![1.0, 0.0]));
    // +inf is the largest finite value, not a NaN factory.
    let cfg = RouterConfig::new(4, 1, RouterKind::Softmax { renormalize: false }).unwrap();
    let r = route(&cfg, &[0.0, f32::INFINITY, 1.0, f32::NAN], None);
    assert_eq!((r.ids, r.weights), (vec![1], vec![1.0]));
}

#[test]
fn reference_grouped_sigmoid_treats_nan_scores_and_dead_groups_as_minus_infinity() {
    // 8 experts in 4 groups of 2, keep 2 groups, top-4: group 0's biases are NaN, group 1's -inf.
    let cfg = RouterConfig::new(
        8,
        4,
        RouterKind::GroupedSigmoid { n_group: 4, topk_group: 2, renormalize: true, routed_scaling_factor: 1.0 },
    )
    .unwrap();
    let inf = f32::NEG_INFINITY;
    let bias = [f32::NAN, f32::NAN, inf, inf, 0.0, 0.0, 0.0, 0.0];
    // Groups 2 and 3 are kept; after their 4 experts nothing else is needed.
    let r = route(&cfg, &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0], Some(&bias));
    assert_eq!(r.ids, vec![7, 6, 5, 4]);
    // Only group 3 is alive: the second kept group is a dead one (the lower id, group 0), whose experts are
    // chosen by the tie rule after group 3's, with their sigmoid weights.
    let bias = [f32::NAN, f32::NAN, inf, inf, inf, inf, 0.0, 0.0];
    let r = route(&cfg, &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0], Some(&bias));
    assert_eq!(r.ids, vec![7, 6, 0, 1]);
    assert!(r.weights.iter().all(|w| w.is_finite() && *w > 0.0), "{:?}", r.weights);
    // Logits all NaN: every sigmoid is 0, so are the weights; the ids follow the bias.
    let r = route(&cfg, &[f32::NAN; 8], Some(&[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]));
    assert_eq!((r.ids, r.weights), (vec![7, 6, 5, 4], vec![0.0; 4]));
}

/// The inputs of the GPU test of non-finite logits, through the reference: ids in range, the bad tokens' weights
/// 0, the normal token routed as usual and outside the precision margin (so the GPU test compares it).
#[test]
fn reference_routes_the_nonfinite_gpu_cases_in_range() {
    for (name, cfg, l, bias) in common::nonfinite_router_cases() {
        let (e, k) = (cfg.experts(), cfg.top_k());
        let r = route(&cfg, &l, bias.as_deref());
        assert_eq!(r.ids.len(), 3 * k, "{name}");
        for t in 0..3 {
            let ids = &r.ids[t * k..(t + 1) * k];
            assert!(ids.iter().all(|&i| (0..e as i32).contains(&i)), "{name}: token {t} ids {ids:?}");
            let mut distinct = ids.to_vec();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), k, "{name}: token {t} ids {ids:?} repeat an expert");
        }
        for t in 0..2 {
            assert!(r.weights[t * k..(t + 1) * k].iter().all(|&w| w == 0.0), "{name}: token {t} {:?}", r.weights);
        }
        if !cfg.takes_bias() {
            assert_eq!(&r.ids[..k], &(0..k as i32).collect::<Vec<_>>()[..], "{name}: the tie rule");
        }
        let w = &r.weights[2 * k..];
        assert!(w.iter().all(|x| x.is_finite() && *x > 0.0), "{name}: normal token {w:?}");
        assert!(r.margin[2] >= 1e-5, "{name}: normal token margin {}", r.margin[2]);
    }
}

#[test]
fn layout_dims_constraints_are_named() {
    assert!(invalid(LayoutDims::new(LayoutSpec::Grouped, 0, 2, 8, 8)).contains("positive"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Grouped, 4, 2, 8, 9)).contains("local_experts = 9"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Grouped, 4, 9, 8, 8)).contains("top_k = 9"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Aligned { block_m: 0 }, 4, 2, 8, 8)).contains("block_m = 0"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Masked { max_m: 0 }, 4, 2, 8, 8)).contains("max_m = 0"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Masked { max_m: 1 << 30 }, 4, 2, 8, 8)).contains("overflows int32"));
    assert!(invalid(LayoutDims::new(LayoutSpec::Grouped, 4, 2, 2048, 2048)).contains("1024"));
}

#[test]
fn capacities_follow_the_documented_formulas() {
    let d = |spec| LayoutDims::new(spec, 100, 8, 256, 256).unwrap().capacity();
    assert_eq!(d(LayoutSpec::Grouped), 800);
    // vLLM: numel + E * (block - 1), rounded up to the block
    assert_eq!(d(LayoutSpec::Aligned { block_m: 16 }), (800 + 256 * 15usize).next_multiple_of(16));
    assert_eq!(d(LayoutSpec::Masked { max_m: 100 }), 25600);
}

#[test]
fn layout_reference_reproduces_the_vllm_example() {
    let ids = [2, 3, 4, 1, 2, 4, 1, 3, 4, 1, 2, 3];
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 4 }, 4, 3, 5, 5).unwrap();
    let r = layout_ref::build(&dims, 4, &ids, None);
    assert_eq!(&r.sorted_ids[..16], &[3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]);
    assert_eq!(&r.expert_ids[..4], &[1, 2, 3, 4]);
    assert_eq!(r.total, 16);
    assert_eq!(r.counts, vec![0, 3, 3, 3, 3]);
    // the inverse permutation really inverts sorted_ids
    for (row, &p) in r.positions.iter().enumerate() {
        assert_eq!(r.sorted_ids[p as usize], row as i32);
    }
}

#[test]
fn layout_reference_drops_remote_and_invalid_rows() {
    let dims = LayoutDims::new(LayoutSpec::Grouped, 3, 2, 4, 2).unwrap();
    let map = [-1, 0, -1, 1];
    let r = layout_ref::build(&dims, 3, &[1, 0, 3, 2, 7, 1], Some(&map));
    assert_eq!(r.positions, vec![0, -1, 2, -1, -1, 1]);
    assert!(r.bad_id);
    assert_eq!(r.counts, vec![2, 1]);
}

fn buffer_error<T: std::fmt::Debug>(r: Result<T>) -> (&'static str, String) {
    match r {
        Err(Error::Buffer { name, detail }) => (name, detail),
        other => panic!("expected a Buffer error, got {other:?}"),
    }
}

/// `Router::launch` takes its tokens from the views: logits `[T, E]`, ids and weights `[T, k]`, bias `[E]`. Every
/// mismatch is refused before a launch, naming the view and both shapes.
#[test]
fn router_view_shapes_are_checked_naming_both() {
    use ViewShape as V;
    let ds = RouterConfig::deepseek_v3();
    let (l, ik) = (V::packed(64, 256), V::packed(64, 8));
    assert_eq!(ds.check_shapes(l, Some(256), ik, ik).unwrap(), 64);
    assert_eq!(ds.check_shapes(V::packed(0, 256), Some(256), V::packed(0, 8), V::packed(0, 8)).unwrap(), 0);
    // Ids for 65 tokens against logits for 64.
    let (name, d) = buffer_error(ds.check_shapes(l, Some(256), V::packed(65, 8), ik));
    assert_eq!(name, "topk_ids");
    assert!(d.contains("[65, 8]") && d.contains("[64, 256]") && d.contains("[64, 8]"), "{d}");
    let (name, d) = buffer_error(ds.check_shapes(l, Some(256), ik, V::packed(63, 8)));
    assert!(name == "topk_weights" && d.contains("[63, 8]") && d.contains("[64, 256]"), "{d}");
    // E columns that are not the config's experts; k that is not top_k.
    let (name, d) = buffer_error(ds.check_shapes(V::packed(64, 128), Some(256), ik, ik));
    assert!(name == "logits" && d.contains("[64, 128]") && d.contains("[T, 256]"), "{d}");
    let (name, d) = buffer_error(ds.check_shapes(l, Some(256), V::packed(64, 6), ik));
    assert!(name == "topk_ids" && d.contains("[64, 6]") && d.contains("[64, 8]") && d.contains("top_k"), "{d}");
    // A bias of the wrong length, a missing one, one the softmax router does not take.
    let (name, d) = buffer_error(ds.check_shapes(l, Some(255), ik, ik));
    assert!(name == "bias" && d.contains("255") && d.contains("[256]") && d.contains("[64, 256]"), "{d}");
    assert_eq!(buffer_error(ds.check_shapes(l, None, ik, ik)).0, "bias");
    let mx = RouterConfig::mixtral();
    let (l8, k2) = (V::packed(5, 8), V::packed(5, 2));
    assert_eq!(mx.check_shapes(l8, None, k2, k2).unwrap(), 5);
    assert!(buffer_error(mx.check_shapes(l8, Some(8), k2, k2)).1.contains("no correction bias"));
    // A view with a row stride: the kernel reads packed rows.
    let strided = V { rows: 5, cols: 8, stride: 16 };
    let (name, d) = buffer_error(mx.check_shapes(strided, None, k2, k2));
    assert!(name == "logits" && d.contains("row stride 16") && d.contains("packed"), "{d}");
}
