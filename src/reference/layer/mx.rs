//! The MXFP4 layer on the host ([`moe_forward_mx`]), step for step as the device runs it (`layer/mx.rs`).

use half::bf16;

use super::{activate, per_token};
use crate::experts::GptOssMxfp4Experts;
use crate::experts::{Activation, GateUp};
use crate::quant::{Mxfp4, Mxfp8};

/// MXFP4 experts as the host reference reads them: `gate_up` `[E · 2I, H]`, `down` `[E · H, I]` (`[out, in]`,
/// padded storage or not), the gate/up order of `gate_up`'s rows, the activation and the f32 biases.
#[derive(Clone, Copy, Debug)]
pub struct MxHostLayer<'a> {
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub gate_up: &'a Mxfp4,
    pub down: &'a Mxfp4,
    pub order: GateUp,
    pub activation: Activation,
    pub b13: Option<&'a [f32]>,
    pub b2: Option<&'a [f32]>,
}

impl<'a> MxHostLayer<'a> {
    /// gpt-oss's experts: interleaved gate/up, the clamped SwiGLU, both biases.
    pub fn gpt_oss(e: &'a GptOssMxfp4Experts) -> Self {
        MxHostLayer {
            experts: e.experts(),
            hidden: e.hidden(),
            inter: e.inter(),
            gate_up: e.gate_up(),
            down: e.down(),
            order: GateUp::Interleaved,
            activation: Activation::GptOssSwiglu,
            b13: Some(e.gate_up_bias()),
            b2: Some(e.down_bias()),
        }
    }
}

/// One row quantised to MXFP8 by the device quantiser's rules ([`Mxfp8::quantize`]: UE8M0 scales rounded up,
/// e4m3 nearest-even) and dequantised. The device pads the row with zero columns to the GEMM's K; those blocks
/// quantise to zeros and meet zero weight columns, so the logical row is the whole product.
fn mxfp8_row(v: &[f32]) -> Vec<f32> {
    Mxfp8::quantize(v, 1, v.len()).expect("an activation row quantises").dequantize()
}

/// `Σ_c a[c] · w[c]` in f64, rounded to bf16 through f32 (the device's f32 accumulators round to bf16 once).
fn dot_bf16(a: &[f32], w: &[f32]) -> f32 {
    let s: f64 = a.iter().zip(w).map(|(&a, &w)| a as f64 * w as f64).sum();
    bf16::from_f32(s as f32).to_f32()
}

/// The MXFP4 layer on the host: each token's row of `x` quantised to MXFP8 per 32 columns; GEMM1 over the exact
/// products of the dequantised activations and weights, summed in f64 and rounded to bf16; the activation in
/// f32 with `b13`, rounded to bf16; `h` quantised to MXFP8 by the same rules; GEMM2 likewise; the combine adds
/// `b2`, weights by the router and sums the k contributions in f32, rounding once. It differs from the device in
/// the GEMMs' accumulation order only: compare with [`super::Fp8LayerBound`] (its derivation holds with 32-wide
/// scale blocks, where a rounding flip that moves a block's scale moves at most 32 elements).
///
/// # Panics
/// If the inputs' lengths do not fit the experts (`x [T, H]`, `ids`, `weights` `[T, k]`) or an id is out of range.
pub fn moe_forward_mx(l: &MxHostLayer<'_>, x: &[bf16], ids: &[i32], weights: &[f32], k: usize) -> Vec<bf16> {
    let (e, h, i) = (l.experts, l.hidden, l.inter);
    let r13 = 2 * i;
    let tokens = x.len() / h;
    assert!(l.activation.gated(), "MXFP4 experts hold gate and up: a gated activation");
    assert_eq!(x.len(), tokens * h, "x holds whole rows of H = {h}");
    assert!(ids.len() == tokens * k && weights.len() == tokens * k, "ids and weights are [T, k]");
    assert!(ids.iter().all(|&id| id >= 0 && (id as usize) < e), "ids within 0..{e}");
    assert_eq!((l.gate_up.rows(), l.gate_up.k(), l.down.rows(), l.down.k()), (e * r13, h, e * h, i));
    let (w13, w2) = (l.gate_up.dequantize(), l.down.dequantize());
    let (w13, w2) = (&w13, &w2);
    let round = |v: f32| bf16::from_f32(v).to_f32();
    per_token(x, h, |t, xr| {
        let xq = mxfp8_row(xr);
        let mut acc = vec![0f32; h];
        for j in 0..k {
            let ex = ids[t * k + j] as usize;
            let d1: Vec<f32> = (0..r13).map(|o| dot_bf16(&xq, &w13[(ex * r13 + o) * h..][..h])).collect();
            let b13 = |o: usize| l.b13.map_or(0.0, |b| b[ex * r13 + o]);
            let act: Vec<f32> = (0..i).map(|n| round(activate(l.activation, l.order, i, &d1, &b13, n))).collect();
            let hq = mxfp8_row(&act);
            for (o, a) in acc.iter_mut().enumerate() {
                let d2 = dot_bf16(&hq, &w2[(ex * h + o) * i..][..i]);
                let b2 = l.b2.map_or(0.0, |b| b[ex * h + o]);
                *a += weights[t * k + j] * (d2 + b2);
            }
        }
        acc
    })
}
