//! A whole MoE step on the GPU, checked against the CPU reference: route DeepSeek-style logits, run the expert
//! layer with the `Auto` backend, compare every output element. Exits non-zero when an element is outside the
//! tolerance of the GPU layer tests (two bf16 steps of the largest output, plus two half-ulps relative).
//!
//! `cargo run --release --example 02_layer` (needs an SM90 GPU; says so otherwise).

use std::process::ExitCode;
use std::sync::Arc;

use half::bf16;
use moe_gemm::random::{random_vec, SplitMix64};
use moe_gemm::reference::moe_forward;
use moe_gemm::reference::{first_mismatch, Tolerance};
use moe_gemm::*;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("02_layer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the step; `Ok(false)` when the output disagrees with the reference.
fn run() -> Result<bool> {
    if !device::driver_present() {
        println!("no CUDA device: this example needs an SM90 GPU");
        return Ok(true);
    }
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;

    // A small DeepSeek-shaped layer: 64 experts, top-8 in 8 groups (keep 4), H 1024, I 256.
    let (e, k, h, i, tokens) = (64usize, 8usize, 1024usize, 256usize, 48usize);
    let router = Router::new(
        &stream,
        RouterConfig::new(
            e,
            k,
            RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
        )?,
    )?;
    let packed = PackedExperts::new(
        e,
        h,
        i,
        ExpertFormat::SWIGLU,
        random_vec::<bf16>(e * 2 * i * h, 1, 0.05),
        random_vec::<bf16>(e * h * i, 2, 0.05),
        None,
        None,
    )?;
    let weights = Arc::new(ExpertWeights::upload(&stream, &packed)?);
    let layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(256, k))?;
    let mut scratch = MoeScratch::for_layers(&stream, [&layer])?;

    let mut rng = SplitMix64(3);
    let logits: Vec<f32> = (0..tokens * e).map(|_| rng.unit() * 3.0).collect();
    let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
    let x_host = random_vec::<bf16>(tokens * h, 4, 1.0);
    let (logits_d, bias_d, x) = (stream.clone_htod(&logits)?, stream.clone_htod(&bias)?, stream.clone_htod(&x_host)?);
    let mut ids = stream.alloc_zeros::<i32>(tokens * k)?;
    let mut w = stream.alloc_zeros::<f32>(tokens * k)?;
    let mut y = stream.alloc_zeros::<bf16>(tokens * h)?;

    // The step: nothing below allocates or synchronises until the check; router and layer share one status word.
    let logits_v = MatrixView::of("logits", &logits_d, e)?;
    let (mut ids_v, mut w_v) =
        (MatrixViewMut::of("topk_ids", &mut ids, k)?, MatrixViewMut::of("topk_weights", &mut w, k)?);
    router.launch(&stream, &logits_v, Some(&bias_d.as_view()), &mut ids_v, &mut w_v, scratch.status_mut())?;
    let (xv, idv, wv) =
        (MatrixView::of("x", &x, h)?, MatrixView::of("topk_ids", &ids, k)?, MatrixView::of("topk_weights", &w, k)?);
    layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut MatrixViewMut::of("y", &mut y, h)?)?;
    scratch.check(&stream)?;

    let (ids_h, w_h, y_h) = (stream.clone_dtoh(&ids)?, stream.clone_dtoh(&w)?, stream.clone_dtoh(&y)?);
    let want: Vec<f32> = moe_forward(&packed, &x_host, &ids_h, &w_h, k).iter().map(|v| v.to_f32()).collect();
    let got: Vec<f32> = y_h.iter().map(|v| v.to_f32()).collect();
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max); // NaN-blind: see below
    println!(
        "{tokens} tokens through {:?}: max |y - reference| = {err:.3e} (max |y| = {max:.3}, {:.2} bf16 steps)",
        layer.backend_for(tokens),
        err / (max / 256.0)
    );
    // The GPU layer tests' tolerance; a NaN never passes it.
    let tol = Tolerance { atol: 2.0 * max / 256.0, rtol: 2.0 / 256.0 };
    if let Some((i, g, r)) = first_mismatch(&got, &want, tol) {
        eprintln!("02_layer: y[{}, {}] = {g}, reference {r}: outside {tol:?}", i / h, i % h);
        return Ok(false);
    }
    Ok(true)
}
