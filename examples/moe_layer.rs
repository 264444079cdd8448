//! A whole MoE step on the GPU, checked against the CPU reference: route DeepSeek-style logits, run the expert
//! layer with the `Auto` backend, compare every output element.
//!
//! `cargo run --release --example moe_layer` (needs an SM90 GPU; says so otherwise).

use std::sync::Arc;

use half::bf16;
use moe_gemm::layer::reference::moe_forward;
use moe_gemm::random::{random_vec, SplitMix64};
use moe_gemm::*;

fn main() -> Result<()> {
    if !device::driver_present() {
        println!("no CUDA device: this example needs an SM90 GPU");
        return Ok(());
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
    router.launch(&stream, tokens, &logits_d, Some(&bias_d.as_view()), &mut ids, &mut w, scratch.status_mut())?;
    let (xv, idv, wv) =
        (MatrixView::of("x", &x, h)?, MatrixView::of("topk_ids", &ids, k)?, MatrixView::of("topk_weights", &w, k)?);
    layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut MatrixViewMut::of("y", &mut y, h)?)?;
    scratch.check(&stream)?;

    let (ids_h, w_h, y_h) = (stream.clone_dtoh(&ids)?, stream.clone_dtoh(&w)?, stream.clone_dtoh(&y)?);
    let want = moe_forward(&packed, &x_host, &ids_h, &w_h, k);
    let max = want.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
    let err = y_h.iter().zip(&want).map(|(a, b)| (a.to_f32() - b.to_f32()).abs()).fold(0f32, f32::max);
    println!(
        "{tokens} tokens through {:?}: max |y - reference| = {err:.3e} (max |y| = {max:.3}, {:.2} bf16 steps)",
        layer.backend_for(tokens),
        err / (max / 256.0)
    );
    Ok(())
}
