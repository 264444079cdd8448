//! CPU reference of the MoE expert layer, from the model families' definitions, with the same roundings as
//! the GPU path: GEMM1 and GEMM2 accumulate in f32 and round to the element type, the activation runs in f32
//! and rounds, the combine adds `b2`, weights and sums the k contributions in f32 and rounds once.
//!
//! A shared expert ([`moe_forward_with_shared`]) is computed from its own full-width tensors (`[I_s, H]`,
//! `[H, I_s]`), not from the groups the device splits it into, so a comparison checks the split. Its GEMM1 and
//! activation round as the routed ones do; its GEMM2 is rounded where the device rounds it: once per `I`-wide
//! slice of the `I_s` reduction (the device's groups each round their partial sum to the element type), each
//! slice weighted by `s_t` and added in f32 with the routed contributions. For `I_s = I` (DeepSeek-V3) that is
//! the model's own rounding; for `I_s = m·I` it differs from a single rounding over `I_s` by at most `m` half
//! steps of the partial sums.
//!
//! The FP8 layer's reference ([`moe_forward_fp8`]) takes a block-FP8 shared expert the same way
//! ([`moe_forward_fp8_with_shared`]): full-width matrices, GEMM2 rounded per `I`-wide slice.

use std::thread;

mod fp8;
mod fp8_channel;
mod mx;
pub use fp8::*;
pub use fp8_channel::moe_forward_fp8_channel;
pub use mx::{moe_forward_mx, MxHostLayer};

use crate::dtype::Element;
use crate::experts::{Activation, GateUp, PackedExperts, SharedExpert, Storage};

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `y [tokens, H]` for `x [tokens, H]` and the routing `ids`, `weights` (`[tokens, k]`).
pub fn moe_forward<T: Element>(p: &PackedExperts<T>, x: &[T], ids: &[i32], weights: &[f32], k: usize) -> Vec<T> {
    forward(p, None, x, ids, weights, k)
}

/// `y = Σ_j w[t,j] · expert_j(x) + s_t · shared(x)` with `s_t = shared_weights[t]` (Qwen2-MoE's gate, see
/// [`shared_gate_weights`]) or 1 (DeepSeek-V3, Kimi-K2). The shared MLP's GEMM2 rounds per `p.inter`-wide slice
/// of its reduction, as the device does (see the module docs).
///
/// # Panics
/// If the shared expert's hidden size differs from the routed experts' or `shared_weights` is shorter than the
/// tokens.
pub fn moe_forward_with_shared<T: Element>(
    p: &PackedExperts<T>,
    shared: &SharedExpert<T>,
    x: &[T],
    ids: &[i32],
    weights: &[f32],
    k: usize,
    shared_weights: Option<&[f32]>,
) -> Vec<T> {
    assert_eq!(shared.hidden, p.hidden, "the shared expert's hidden size differs from the routed experts'");
    if let Some(s) = shared_weights {
        assert!(s.len() >= x.len() / p.hidden, "shared_weights holds {} of {} tokens", s.len(), x.len() / p.hidden);
    }
    forward(p, Some((shared, shared_weights)), x, ids, weights, k)
}

/// Qwen2-MoE's shared-expert weights `s_t = sigmoid(x_t · shared_expert_gate)` as transformers computes them in
/// the element type: the gate's logit rounded, the sigmoid rounded. `None` without a gate tensor.
pub fn shared_gate_weights<T: Element>(shared: &SharedExpert<T>, x: &[T]) -> Option<Vec<f32>> {
    let gate = shared.expert_gate.as_ref()?;
    let h = shared.hidden;
    let round = |v: f32| T::from_f32(v).to_f32();
    let logit = |row: &[T]| round(row.iter().zip(gate).map(|(a, b)| a.to_f32() * b.to_f32()).sum());
    Some(x.chunks(h).map(|row| round(1.0 / (1.0 + (-logit(row)).exp()))).collect())
}

type SharedPart<'a, T> = Option<(&'a SharedExpert<T>, Option<&'a [f32]>)>;

fn forward<T: Element>(
    p: &PackedExperts<T>,
    shared: SharedPart<'_, T>,
    x: &[T],
    ids: &[i32],
    weights: &[f32],
    k: usize,
) -> Vec<T> {
    let (h, i) = (p.hidden, p.inter);
    let r13 = p.w13_rows();
    // Weight accessors in [out, in] terms whatever the storage.
    let w13 = |e: usize, o: usize, c: usize| -> f32 {
        match p.format.storage {
            Storage::OutIn => p.w13[(e * r13 + o) * h + c].to_f32(),
            Storage::InOut => p.w13[(e * h + c) * r13 + o].to_f32(),
        }
    };
    let w2 = |e: usize, o: usize, c: usize| -> f32 {
        match p.format.storage {
            Storage::OutIn => p.w2[(e * h + o) * i + c].to_f32(),
            Storage::InOut => p.w2[(e * i + c) * h + o].to_f32(),
        }
    };
    let round = |v: f32| T::from_f32(v).to_f32();
    per_token(x, h, |t, xr| {
        let mut acc = vec![0f32; h];
        for j in 0..k {
            let e = ids[t * k + j] as usize;
            let d1: Vec<f32> = (0..r13)
                .map(|o| {
                    let dot: f32 = (0..h).map(|c| xr[c] * w13(e, o, c)).sum();
                    round(dot)
                })
                .collect();
            let b13 = |o: usize| p.b13.as_ref().map_or(0.0, |b| b[e * r13 + o]);
            let act: Vec<f32> =
                (0..i).map(|n| round(activate(p.format.activation, p.format.gate_up, i, &d1, &b13, n))).collect();
            for (o, a) in acc.iter_mut().enumerate() {
                let dot: f32 = (0..i).map(|n| act[n] * w2(e, o, n)).sum();
                let b2 = p.b2.as_ref().map_or(0.0, |b| b[e * h + o]);
                *a += weights[t * k + j] * (round(dot) + b2);
            }
        }
        if let Some((s, sw)) = shared {
            add_shared(s, sw.map_or(1.0, |w| w[t]), i, xr, &mut acc);
        }
        acc
    })
}

/// A layer's `y [T, H]` from `x [T, H]`, token by token over the host's threads: `token(t, x_t)` gives token
/// `t`'s output row in f32 from its input row widened to f32; each element is rounded to `T` once.
pub(super) fn per_token<T: Element>(x: &[T], h: usize, token: impl Fn(usize, &[f32]) -> Vec<f32> + Sync) -> Vec<T> {
    let tokens = x.len() / h;
    let mut y = vec![T::from_f32(0.0); tokens * h];
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = tokens.div_ceil(threads).max(1);
    let token = &token;
    thread::scope(|s| {
        for (c, out) in y.chunks_mut(chunk * h).enumerate() {
            s.spawn(move || {
                for (tt, yrow) in out.chunks_mut(h).enumerate() {
                    let t = c * chunk + tt;
                    let xr: Vec<f32> = x[t * h..(t + 1) * h].iter().map(|v| v.to_f32()).collect();
                    for (v, a) in yrow.iter_mut().zip(token(t, &xr)) {
                        *v = T::from_f32(a);
                    }
                }
            });
        }
    });
    y
}

/// Output `n` of the activation of one row `d1` (`2I` or `I` values, before the bias `b13`), in f32, unrounded.
pub(super) fn activate(
    act: Activation,
    gate_up: GateUp,
    i: usize,
    d1: &[f32],
    b13: &dyn Fn(usize) -> f32,
    n: usize,
) -> f32 {
    match act {
        Activation::Silu => silu(d1[n] + b13(n)),
        gated => {
            let (gi, ui) = match gate_up {
                GateUp::Concatenated => (n, i + n),
                GateUp::Interleaved => (2 * n, 2 * n + 1),
            };
            let (g, u) = (d1[gi] + b13(gi), d1[ui] + b13(ui));
            if gated == Activation::GptOssSwiglu {
                let g = g.min(7.0);
                let u = u.clamp(-7.0, 7.0);
                (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
            } else {
                silu(g) * u
            }
        }
    }
}

/// `acc += s_t · shared(x)`: GEMM1 over the full `I_s` rows and the activation rounded as the routed experts',
/// GEMM2 rounded once per `slice`-wide part of its reduction (the device's groups).
fn add_shared<T: Element>(s: &SharedExpert<T>, st: f32, slice: usize, xr: &[f32], acc: &mut [f32]) {
    let (h, is) = (s.hidden, s.inter);
    let round = |v: f32| T::from_f32(v).to_f32();
    let dot = |w: &[T]| -> f32 { (0..h).map(|c| xr[c] * w[c].to_f32()).sum() };
    let act: Vec<f32> = (0..is)
        .map(|n| {
            let g = round(dot(&s.gate_proj[n * h..(n + 1) * h]));
            let u = round(dot(&s.up_proj[n * h..(n + 1) * h]));
            round(silu(g) * u)
        })
        .collect();
    for (o, a) in acc.iter_mut().enumerate() {
        let down = &s.down_proj[o * is..(o + 1) * is];
        for lo in (0..is).step_by(slice.max(1)) {
            let hi = (lo + slice.max(1)).min(is);
            let part: f32 = (lo..hi).map(|n| act[n] * down[n].to_f32()).sum();
            *a += st * round(part);
        }
    }
}
