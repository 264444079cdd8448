//! The expert-parallel step on the host ([`ep_forward_reference`]), what `parallel`'s device step is tested
//! against.

use super::moe_forward;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::experts::PackedExperts;
use crate::parallel::{DispatchPlan, Placement};

fn bad<T>(s: String) -> Result<T> {
    Err(Error::InvalidProblem(s))
}

/// The EP step on the host: dispatch, each rank's local layer
/// ([`moe_forward`] over [`Placement::local_weights`], top-1 per received row with weight 1), the reverse
/// exchange and the combine (`Σ_j w[t, j] · row` in f32 in slot order, rounded once). Returns each rank's `y`.
///
/// # Errors
/// As [`DispatchPlan::new`] and [`Placement::local_weights`]; [`Error::InvalidProblem`] if a rank's `x` or
/// `weights` does not match its ids.
pub fn ep_forward_reference<T: Element>(
    placement: &Placement,
    experts: &PackedExperts<T>,
    x: &[&[T]],
    topk_ids: &[&[i32]],
    weights: &[&[f32]],
    k: usize,
) -> Result<Vec<Vec<T>>> {
    let h = experts.hidden;
    let world = placement.world();
    let plan = DispatchPlan::new(placement, topk_ids, k)?;
    if x.len() != world || weights.len() != world {
        return bad(format!("x of {} ranks and weights of {} for world = {world}", x.len(), weights.len()));
    }
    for s in 0..world {
        let t = plan.send(s).tokens;
        if x[s].len() != t * h || weights[s].len() != t * k {
            return bad(format!(
                "rank {s}: x has {} elements and weights {}, expected {} and {} for {t} tokens, H = {h}, k = {k}",
                x[s].len(),
                weights[s].len(),
                t * h,
                t * k
            ));
        }
    }
    // Results per source rank, at send positions (where the reverse exchange puts them).
    let mut back: Vec<Vec<T>> = (0..world).map(|s| vec![T::from_f32(0.0); plan.send(s).send_order.len() * h]).collect();
    for d in 0..world {
        let recv = plan.recv(d);
        if recv.rows.is_empty() {
            continue;
        }
        let local = placement.local_weights(experts, d)?;
        let rx: Vec<T> =
            recv.rows.iter().flat_map(|r| x[r.source][r.token * h..(r.token + 1) * h].iter().copied()).collect();
        let ids: Vec<i32> = recv.rows.iter().map(|r| r.local as i32).collect();
        let ones = vec![1.0f32; recv.rows.len()];
        let ry = moe_forward(&local, &rx, &ids, &ones, 1);
        for (s, out) in back.iter_mut().enumerate() {
            let lo = plan.send(s).send_offsets[d];
            for (i, row) in (recv.offsets[s]..recv.offsets[s + 1]).enumerate() {
                let p = lo + i;
                out[p * h..(p + 1) * h].copy_from_slice(&ry[row * h..(row + 1) * h]);
            }
        }
    }
    Ok((0..world)
        .map(|s| {
            let sp = plan.send(s);
            let mut y = vec![T::from_f32(0.0); sp.tokens * h];
            for t in 0..sp.tokens {
                let mut acc = vec![0f32; h];
                for j in 0..k {
                    let p = sp.slot_to_send[t * k + j];
                    let w = weights[s][t * k + j];
                    for (a, v) in acc.iter_mut().zip(&back[s][p * h..(p + 1) * h]) {
                        *a += w * v.to_f32();
                    }
                }
                for (o, a) in y[t * h..(t + 1) * h].iter_mut().zip(acc) {
                    *o = T::from_f32(a);
                }
            }
            y
        })
        .collect())
}
