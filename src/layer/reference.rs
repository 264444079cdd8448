//! CPU reference of the MoE expert layer, from the model families' definitions, with the same roundings as
//! the GPU path: GEMM1 and GEMM2 accumulate in f32 and round to the element type, the activation runs in f32
//! and rounds, the combine adds `b2`, weights and sums the k contributions in f32 and rounds once.

use std::thread;

use super::{Activation, GateUp, PackedExperts, Storage};
use crate::dtype::Element;

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `y [tokens, H]` for `x [tokens, H]` and the routing `ids`, `weights` (`[tokens, k]`).
pub fn moe_forward<T: Element>(p: &PackedExperts<T>, x: &[T], ids: &[i32], weights: &[f32], k: usize) -> Vec<T> {
    let (h, i) = (p.hidden, p.inter);
    let r13 = p.w13_rows();
    let tokens = x.len() / h;
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
    let mut y = vec![T::from_f32(0.0); tokens * h];
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = tokens.div_ceil(threads).max(1);
    thread::scope(|s| {
        for (c, out) in y.chunks_mut(chunk * h).enumerate() {
            s.spawn(move || {
                for (tt, yrow) in out.chunks_mut(h).enumerate() {
                    let t = c * chunk + tt;
                    let xr: Vec<f32> = x[t * h..(t + 1) * h].iter().map(|v| v.to_f32()).collect();
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
                        let act: Vec<f32> = (0..i)
                            .map(|n| {
                                let v = match p.format.activation {
                                    Activation::Silu => silu(d1[n] + b13(n)),
                                    gated => {
                                        let (gi, ui) = match p.format.gate_up {
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
                                };
                                round(v)
                            })
                            .collect();
                        for (o, a) in acc.iter_mut().enumerate() {
                            let dot: f32 = (0..i).map(|n| act[n] * w2(e, o, n)).sum();
                            let b2 = p.b2.as_ref().map_or(0.0, |b| b[e * h + o]);
                            *a += weights[t * k + j] * (round(dot) + b2);
                        }
                    }
                    for (o, v) in yrow.iter_mut().enumerate() {
                        *v = T::from_f32(acc[o]);
                    }
                }
            });
        }
    });
    y
}
