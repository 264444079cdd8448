//! Routers on the GPU against the f64 CPU reference, token by token.

use cudarc::driver::CudaSlice;
use moe_gemm::reference::routing::{self as reference, Routing};
use moe_gemm::status::bits;
use moe_gemm::*;

use crate::common::*;

/// Routes on the GPU and returns (ids, weights).
pub fn gpu_route(config: RouterConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<i32>, Vec<f32>, Result<()>) {
    let (_ctx, stream) = gpu();
    let tokens = logits.len() / config.experts();
    let router = Router::new(&stream, config).unwrap();
    let l = stream.clone_htod(logits).unwrap();
    let b: Option<CudaSlice<f32>> = bias.map(|b| stream.clone_htod(b).unwrap());
    let mut ids = stream.alloc_zeros::<i32>(tokens * config.top_k()).unwrap();
    let mut w = stream.alloc_zeros::<f32>(tokens * config.top_k()).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (e, k) = (config.experts(), config.top_k());
    let (mut iv, mut wv) =
        (MatrixViewMut::of("topk_ids", &mut ids, k).unwrap(), MatrixViewMut::of("topk_weights", &mut w, k).unwrap());
    let bias = b.as_ref().map(|b| b.as_view());
    router
        .launch(&stream, &MatrixView::of("logits", &l, e).unwrap(), bias.as_ref(), &mut iv, &mut wv, &mut st)
        .unwrap();
    let checked = st.check(&stream);
    (stream.clone_dtoh(&ids).unwrap(), stream.clone_dtoh(&w).unwrap(), checked)
}

/// Compares a router's output with the reference token by token: the chosen (id, weight) pairs as sets (the
/// order among the chosen is not part of any family's contract, and two chosen scores within rounding may swap),
/// ids exactly, weights to 1e-5 relative. Tokens whose selection margin is within f32 rounding of the scores
/// are skipped, as shared/MOE_SEMANTICS.md advises. Returns the number of tokens compared.
pub fn compare(name: &str, k: usize, want: &Routing, ids: &[i32], weights: &[f32]) -> Result<usize, String> {
    let mut compared = 0;
    for t in 0..want.margin.len() {
        if want.margin[t] < 1e-5 {
            continue;
        }
        let r = t * k..(t + 1) * k;
        let sorted = |ids: &[i32], w: &[f32]| {
            let mut v: Vec<(i32, f32)> = ids.iter().copied().zip(w.iter().copied()).collect();
            v.sort_by_key(|p| p.0);
            v
        };
        let (got, exp) = (sorted(&ids[r.clone()], &weights[r.clone()]), sorted(&want.ids[r.clone()], &want.weights[r]));
        for ((gi, gw), (wi, ww)) in got.iter().zip(&exp) {
            if gi != wi {
                return Err(format!("{name}: token {t}: ids {got:?}, reference {exp:?}"));
            }
            let close = (gw - ww).abs() <= 1e-5 * ww.abs().max(1e-3); // false for NaN
            if !close {
                return Err(format!("{name}: token {t} expert {gi}: weight {gw}, reference {ww}"));
            }
        }
        compared += 1;
    }
    Ok(compared)
}

fn logits(tokens: usize, experts: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..tokens * experts).map(|_| rng.unit() * scale).collect()
}

fn deepseek_bias(experts: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..experts).map(|_| rng.unit() * 0.1).collect()
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn routers_match_the_reference() {
    let cases: Vec<(&str, RouterConfig)> = vec![
        ("mixtral", RouterConfig::mixtral()),
        ("qwen3 norm", RouterConfig::new(128, 8, RouterKind::Softmax { renormalize: true }).unwrap()),
        ("qwen3 no norm", RouterConfig::new(128, 8, RouterKind::Softmax { renormalize: false }).unwrap()),
        ("gpt-oss", RouterConfig::new(128, 4, RouterKind::TopKSoftmax).unwrap()),
        ("deepseek-v3", RouterConfig::deepseek_v3()),
        (
            "kimi-k2 (1 group)",
            RouterConfig::new(
                384,
                8,
                RouterKind::GroupedSigmoid {
                    n_group: 1,
                    topk_group: 1,
                    renormalize: true,
                    routed_scaling_factor: 2.827,
                },
            )
            .unwrap(),
        ),
        ("1024 experts", RouterConfig::new(1024, 32, RouterKind::Softmax { renormalize: true }).unwrap()),
    ];
    for (name, config) in cases {
        for tokens in [1usize, 37, 1000] {
            let l = logits(tokens, config.experts(), tokens as u64, 4.0);
            let bias = config.takes_bias().then(|| deepseek_bias(config.experts(), 9));
            let want = reference::route(&config, &l, bias.as_deref());
            let (ids, w, st) = gpu_route(config, &l, bias.as_deref());
            st.unwrap();
            let n = compare(&format!("{name} T={tokens}"), config.top_k(), &want, &ids, &w).unwrap();
            assert!(2 * n >= tokens, "{name} T={tokens}: only {n} tokens outside the precision margin");
        }
    }
}

/// Ties go to the lowest expert id: all-equal logits pick experts 0..k.
#[test]
#[ignore = "needs an SM90 GPU"]
fn ties_pick_the_lowest_expert_ids() {
    let config = RouterConfig::new(64, 6, RouterKind::Softmax { renormalize: true }).unwrap();
    let (ids, w, st) = gpu_route(config, &[0.5f32; 64 * 3], None);
    st.unwrap();
    for t in 0..3 {
        assert_eq!(&ids[t * 6..t * 6 + 6], &[0, 1, 2, 3, 4, 5]);
        assert!(w[t * 6..t * 6 + 6].iter().all(|&x| (x - 1.0 / 6.0).abs() < 1e-6));
    }
}

/// DeepSeek's correction bias steers the selection, never the weights; and a router that leaked the bias into
/// the weights would fail the comparison these tests use.
#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_bias_selects_but_does_not_weigh() {
    let config = RouterConfig::deepseek_v3();
    let (e, k, tokens) = (256, 8, 256);
    let l = logits(tokens, e, 77, 2.0);
    let mut rng = Rng(5);
    let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.5).collect();
    let zero = vec![0f32; e];
    let (ids_b, w_b, st) = gpu_route(config, &l, Some(&bias));
    st.unwrap();
    let (ids_0, _, _) = gpu_route(config, &l, Some(&zero));
    let changed = (0..tokens).filter(|t| ids_b[t * k..(t + 1) * k] != ids_0[t * k..(t + 1) * k]).count();
    assert!(changed > tokens / 2, "the bias changed the selection of only {changed} of {tokens} tokens");
    // Weights are the unbiased sigmoid of the chosen experts, renormalised and scaled.
    for t in 0..tokens {
        let s: Vec<f64> =
            ids_b[t * k..(t + 1) * k].iter().map(|&i| 1.0 / (1.0 + (-(l[t * e + i as usize] as f64)).exp())).collect();
        let sum: f64 = s.iter().sum();
        for j in 0..k {
            let want = s[j] / sum * 2.5;
            assert!((w_b[t * k + j] as f64 - want).abs() < 1e-5 * want, "token {t} slot {j}");
        }
    }
    // The leak (weights from biased scores) is caught by `compare`.
    let want = reference::route(&config, &l, Some(&bias));
    let mut leaky = w_b.clone();
    for t in 0..tokens {
        let c: Vec<f64> = ids_b[t * k..(t + 1) * k]
            .iter()
            .map(|&i| 1.0 / (1.0 + (-(l[t * e + i as usize] as f64)).exp()) + bias[i as usize] as f64)
            .collect();
        let sum: f64 = c.iter().sum();
        for j in 0..k {
            leaky[t * k + j] = (c[j] / sum * 2.5) as f32;
        }
    }
    assert!(compare("honest", k, &want, &ids_b, &w_b).is_ok());
    assert!(compare("leaky", k, &want, &ids_b, &leaky).is_err(), "a bias leaking into the weights went unnoticed");
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn nonfinite_logits_are_reported_and_never_chosen_over_finite_ones() {
    let config = RouterConfig::new(16, 2, RouterKind::Softmax { renormalize: true }).unwrap();
    let mut l = logits(2, 16, 3, 1.0);
    l[3] = f32::NAN;
    l[16 + 5] = f32::INFINITY;
    let (ids, _, st) = gpu_route(config, &l, None);
    match st {
        Err(Error::DeviceCheck { word, .. }) => assert_ne!(word & bits::NONFINITE_LOGITS, 0),
        other => panic!("expected a non-finite-logits report, got {other:?}"),
    }
    assert!(!ids[..2].contains(&3), "a NaN logit was chosen");
    assert_eq!(ids[2], 5, "+inf is the largest logit");
}

/// Tokens whose logits are all NaN or all −∞ get ids in `0..E`, equal to the reference's (the tie rule, or the
/// bias for the grouped sigmoid), and weights 0, never an INT_MAX id or a NaN weight; the status word reports
/// them; the normal token next to them is routed as usual. Also a grouped sigmoid whose NaN and −∞ bias groups
/// make the top-k reach into −∞ scores.
#[test]
#[ignore = "needs an SM90 GPU"]
fn tokens_without_a_finite_logit_get_ids_in_range_and_zero_weights() {
    for (name, config, l, bias) in nonfinite_router_cases() {
        let (e, k) = (config.experts() as i32, config.top_k());
        let want = reference::route(&config, &l, bias.as_deref());
        let (ids, w, st) = gpu_route(config, &l, bias.as_deref());
        match st {
            Err(Error::DeviceCheck { word, .. }) => assert_ne!(word & bits::NONFINITE_LOGITS, 0, "{name}: {word:#x}"),
            other => panic!("{name}: expected a non-finite-logits report, got {other:?}"),
        }
        assert!(ids.iter().all(|i| (0..e).contains(i)), "{name}: ids {ids:?} outside 0..{e}");
        for t in 0..2 {
            let r = t * k..(t + 1) * k;
            assert_eq!(ids[r.clone()], want.ids[r.clone()], "{name}: token {t}: ids");
            assert!(w[r.clone()].iter().all(|&x| x == 0.0), "{name}: token {t}: weights {:?}", &w[r]);
        }
        let normal = Routing {
            ids: want.ids[2 * k..].to_vec(),
            weights: want.weights[2 * k..].to_vec(),
            margin: want.margin[2..].to_vec(),
        };
        assert_eq!(compare(name, k, &normal, &ids[2 * k..], &w[2 * k..]), Ok(1), "{name}: the normal token");
    }
}

/// A missing or unexpected bias, and views of mismatched shapes (ids for 2 tokens, logits for 1), are refused
/// before a launch: the ids keep their sentinel and the status word stays clean.
#[test]
#[ignore = "needs an SM90 GPU"]
fn router_refuses_missing_or_unexpected_bias_and_mismatched_views() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let l = stream.alloc_zeros::<f32>(256).unwrap();
    let b = stream.alloc_zeros::<f32>(256).unwrap();
    let mut ids = stream.clone_htod(&[-7i32; 16]).unwrap();
    let mut w = stream.alloc_zeros::<f32>(16).unwrap();
    let lv = MatrixView::of("logits", &l, 256).unwrap();
    let ds = Router::new(&stream, RouterConfig::deepseek_v3()).unwrap();
    {
        let mut iv = MatrixViewMut::new("topk_ids", ids.slice_mut(..8), 1, 8).unwrap();
        let mut wv = MatrixViewMut::new("topk_weights", w.slice_mut(..8), 1, 8).unwrap();
        let e = ds.launch(&stream, &lv, None, &mut iv, &mut wv, &mut st).unwrap_err();
        assert!(e.to_string().contains("e_score_correction_bias"), "{e}");
        let mx = Router::new(&stream, RouterConfig::new(256, 8, RouterKind::Softmax { renormalize: true }).unwrap());
        let e = mx.unwrap().launch(&stream, &lv, Some(&b.as_view()), &mut iv, &mut wv, &mut st).unwrap_err();
        assert!(e.to_string().contains("no correction bias"), "{e}");
    }
    let mut iv = MatrixViewMut::of("topk_ids", &mut ids, 8).unwrap();
    let mut wv = MatrixViewMut::of("topk_weights", &mut w, 8).unwrap();
    let e = ds.launch(&stream, &lv, Some(&b.as_view()), &mut iv, &mut wv, &mut st).unwrap_err().to_string();
    assert!(e.contains("topk_ids") && e.contains("[2, 8]") && e.contains("[1, 256]"), "{e}");
    assert_eq!(stream.clone_dtoh(&ids).unwrap(), vec![-7; 16], "a refused launch wrote ids");
    st.check(&stream).unwrap();
}
