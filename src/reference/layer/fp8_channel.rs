//! The CPU reference of a layer over per-tensor or per-channel FP8 experts ([`moe_forward_fp8_channel`]), the
//! function the rowwise-scaled layer computes, step for step.

use half::bf16;

use super::activate;
use crate::experts::{Activation, Fp8ChannelExperts, GateUp};
use crate::quant::{quantize_element, ActivationScales, BlockFp8, Scales};

/// The activations of one GEMM quantised as `experts` declares: e4m3 values (as f32) and one scale per row.
fn quantise(experts: &Fp8ChannelExperts, rows: &[f32], k: usize, layer_static: f32) -> (Vec<f32>, Vec<f32>) {
    let quant = experts.dynamic_quant();
    let amax = |v: &[f32]| v.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
    let n = rows.len() / k;
    let scales: Vec<f32> = match experts.activations() {
        ActivationScales::StaticTensor => vec![layer_static; n],
        ActivationScales::DynamicTensor => vec![quant.scale(amax(rows)); n],
        // DynamicToken (the constructor admits no other scheme).
        _ => rows.chunks_exact(k).map(|r| quant.scale(amax(r))).collect(),
    };
    let q = rows.iter().enumerate().map(|(i, &x)| quantize_element(x, scales[i / k]).to_f32()).collect();
    (q, scales)
}

/// `Σ_c q_x[c] · q_w[n, c]` in f64, times the row's and the channel's scales, rounded to bf16 through f32.
fn gemm_row(w: &BlockFp8, xq: &[f32], xs: f32) -> Vec<f32> {
    let (n, k) = (w.rows(), w.cols());
    let Scales::F32(ws) = w.scales() else { unreachable!("per-row weights hold F32 scales") };
    let q = w.q();
    (0..n)
        .map(|o| {
            let dot: f64 = (0..k).map(|c| f64::from(xq[c]) * f64::from(q[o * k + c].to_f32())).sum();
            bf16::from_f32((dot * f64::from(xs) * f64::from(ws[o])) as f32).to_f32()
        })
        .collect()
}

/// The layer over per-tensor or per-channel FP8 experts on the host, as the device runs it: `x`'s rows quantised
/// as the checkpoint declares (per token, or per tensor over the batch, amax floored at
/// [`crate::experts::CHANNEL_ACT_EPS`]; or by the layer's static scale, the largest of the experts' GEMM1
/// `input_scale`s); GEMM1 over the exact products of the e4m3 values, summed in f64, times the row's and the
/// channel's scales, rounded to bf16 through f32; the activation in f32, rounded to bf16; `h` (all `T · k` rows)
/// quantised by the same rule with GEMM2's scales; GEMM2 likewise; the combine weights by the router and sums the
/// k contributions in f32, rounding once. No biases: the checkpoints of these schemes have none.
///
/// Single-threaded: for the tests' shapes.
///
/// # Panics
/// If the activation is not gated, the inputs' lengths do not fit the experts (`x [T, H]`, `ids`, `weights`
/// `[T, k]`) or an id is out of range.
pub fn moe_forward_fp8_channel(
    experts: &Fp8ChannelExperts,
    activation: Activation,
    x: &[bf16],
    ids: &[i32],
    weights: &[f32],
    k: usize,
) -> Vec<bf16> {
    assert!(activation.gated(), "FP8 experts hold gate and up: a gated activation");
    let (e, h, i) = (experts.experts(), experts.hidden(), experts.inter());
    let tokens = x.len() / h;
    assert_eq!(x.len(), tokens * h, "x holds whole rows of H = {h}");
    assert!(ids.len() == tokens * k && weights.len() == tokens * k, "ids and weights are [T, k]");
    assert!(ids.iter().all(|&id| id >= 0 && (id as usize) < e), "ids within 0..{e}");
    let (s1, s2) = experts.static_scales().map_or((0.0, 0.0), |s| s.layer_scales());
    let round = |v: f32| bf16::from_f32(v).to_f32();
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let (xq, xs) = quantise(experts, &xf, h, s1);
    // GEMM1 and the activation of every slot, then h quantised as one [T·k, I] tensor.
    let mut act = Vec::with_capacity(tokens * k * i);
    for (slot, &id) in ids.iter().enumerate() {
        let t = slot / k;
        let ex = id as usize;
        let d1 = gemm_row(&experts.w13()[ex], &xq[t * h..(t + 1) * h], xs[t]);
        act.extend((0..i).map(|n| round(activate(activation, GateUp::Concatenated, i, &d1, &|_| 0.0, n))));
    }
    let (hq, hs) = quantise(experts, &act, i, s2);
    let mut y = vec![bf16::ZERO; tokens * h];
    for (t, yrow) in y.chunks_mut(h).enumerate() {
        let mut acc = vec![0f32; h];
        for j in 0..k {
            let slot = t * k + j;
            let d2 = gemm_row(&experts.w2()[ids[slot] as usize], &hq[slot * i..(slot + 1) * i], hs[slot]);
            for (a, d) in acc.iter_mut().zip(d2) {
                *a += weights[slot] * d;
            }
        }
        for (v, a) in yrow.iter_mut().zip(acc) {
            *v = bf16::from_f32(a);
        }
    }
    y
}
