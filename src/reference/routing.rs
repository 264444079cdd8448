//! CPU reference routers, in f64, written from the model families' definitions (shared/MOE_SEMANTICS.md)
//! rather than from the kernels.

use crate::routing::{RouterConfig, RouterKind};

/// The result of routing `T` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// `[T, k]` expert ids, in descending order of the selection score (ties: lowest id first).
    pub ids: Vec<i32>,
    /// `[T, k]` gate weights.
    pub weights: Vec<f32>,
    /// Per token, how far the selection was from changing: the smallest relative gap
    /// `(kept − rejected) / max(|kept|, |rejected|)` between a kept and a rejected candidate (expert or group). A reduced-precision router may legitimately choose differently when this
    /// is within its rounding; tests skip such tokens instead of loosening every tolerance.
    pub margin: Vec<f64>,
}

/// Whether `(score, id)` `a` is preferred over `b`: higher score, then lower id (the order every router uses).
fn better(a: (f64, usize), b: (f64, usize)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// Indices of the `k` best of `keys` (in preference order) and the relative gap between the k-th and the best
/// rejected one (`inf` when nothing was rejected).
fn top_k(keys: &[f64], k: usize) -> (Vec<usize>, f64) {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| {
        if better((keys[a], a), (keys[b], b)) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    let gap = if k < keys.len() && keys[order[k - 1]].is_finite() && keys[order[k]].is_finite() {
        let (a, b) = (keys[order[k - 1]], keys[order[k]]);
        (a - b) / a.abs().max(b.abs()).max(1e-300)
    } else {
        f64::INFINITY
    };
    (order[..k].to_vec(), gap)
}

/// `x / sum`, or 0 where nothing has any weight (`sum = 0`: every candidate was −∞).
fn share(x: f64, sum: f64) -> f64 {
    if sum > 0.0 {
        x / sum
    } else {
        0.0
    }
}

/// `exp(x − m)`, exactly 0 for `x = −∞` (also when `m = −∞`, where the difference is NaN).
fn exp_from(x: f64, m: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        0.0
    } else {
        (x - m).exp()
    }
}

/// NaN → −∞: a score that is not a number is never preferred.
fn or_neg_inf(x: f64) -> f64 {
    if x.is_nan() {
        f64::NEG_INFINITY
    } else {
        x
    }
}

/// Routes `logits [T, E]` with `config`; `bias [E]` is required by `GroupedSigmoid` and ignored otherwise.
/// Non-finite logits follow the kernels' documented policy ([`routing`](super)): NaN and −∞ count as −∞, +∞ as
/// f32::MAX; a NaN biased score counts as −∞ too. Ids are always in `0..E`.
pub fn route(config: &RouterConfig, logits: &[f32], bias: Option<&[f32]>) -> Routing {
    let (e, k) = (config.experts(), config.top_k());
    assert_eq!(logits.len() % e, 0, "logits must be [T, {e}]");
    let tokens = logits.len() / e;
    let mut out = Routing { ids: Vec::new(), weights: Vec::new(), margin: Vec::new() };
    for t in 0..tokens {
        let l: Vec<f64> = logits[t * e..(t + 1) * e]
            .iter()
            .map(|&x| if x == f32::INFINITY { f32::MAX as f64 } else { or_neg_inf(x as f64) })
            .collect();
        let (ids, weights, margin) = match config.kind() {
            RouterKind::Softmax { renormalize } => {
                let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = l.iter().map(|&x| exp_from(x, m)).collect();
                let sum: f64 = ex.iter().sum();
                let p: Vec<f64> = ex.iter().map(|&x| share(x, sum)).collect();
                let (ids, gap) = top_k(&p, k);
                let mut w: Vec<f64> = ids.iter().map(|&i| p[i]).collect();
                if renormalize {
                    let s: f64 = w.iter().sum();
                    w.iter_mut().for_each(|x| *x = share(*x, s));
                }
                (ids, w, gap)
            }
            RouterKind::TopKSoftmax => {
                let (ids, gap) = top_k(&l, k);
                let m = ids.iter().map(|&i| l[i]).fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = ids.iter().map(|&i| exp_from(l[i], m)).collect();
                let s: f64 = ex.iter().sum();
                (ids, ex.iter().map(|&x| share(x, s)).collect(), gap)
            }
            RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, routed_scaling_factor } => {
                let bias = bias.expect("GroupedSigmoid needs the correction bias");
                assert_eq!(bias.len(), e);
                let s: Vec<f64> = l.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
                let c: Vec<f64> = s.iter().zip(bias).map(|(s, b)| or_neg_inf(s + *b as f64)).collect();
                let size = e / n_group;
                let mut group_gap = f64::INFINITY;
                let mut chosen = c.clone();
                if n_group > 1 {
                    let group_scores: Vec<f64> = (0..n_group)
                        .map(|g| {
                            let (top2, _) = top_k(&c[g * size..(g + 1) * size], 2);
                            or_neg_inf(top2.iter().map(|&i| c[g * size + i]).sum())
                        })
                        .collect();
                    let (kept, gap) = top_k(&group_scores, topk_group);
                    group_gap = gap;
                    for g in 0..n_group {
                        if !kept.contains(&g) {
                            chosen[g * size..(g + 1) * size].fill(f64::NEG_INFINITY);
                        }
                    }
                }
                let (ids, gap) = top_k(&chosen, k);
                let mut w: Vec<f64> = ids.iter().map(|&i| s[i]).collect(); // unbiased scores
                if renormalize {
                    let sum: f64 = w.iter().sum::<f64>() + 1e-20;
                    w.iter_mut().for_each(|x| *x /= sum);
                }
                w.iter_mut().for_each(|x| *x *= routed_scaling_factor as f64);
                (ids, w, gap.min(group_gap))
            }
        };
        out.ids.extend(ids.iter().map(|&i| i as i32));
        out.weights.extend(weights.iter().map(|&w| w as f32));
        out.margin.push(margin);
    }
    out
}
