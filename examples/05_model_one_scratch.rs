//! A model's MoE layers as a server holds them: one small plan per layer over its own weights, one scratch for all
//! of them (sized by the largest need, not their sum), one device status word checked once per step. Every layer
//! runs on the same step's tokens with the router's own ids, and each layer's output is checked against the CPU
//! reference. Exits non-zero on a mismatch.
//!
//! `cargo run --release --example 05_model_one_scratch` (needs an SM90 GPU; says so otherwise).

use std::process::ExitCode;
use std::sync::Arc;

use half::bf16;
use moe_gemm::random::{random_vec, SplitMix64};
use moe_gemm::reference::{first_mismatch, moe_forward, Tolerance};
use moe_gemm::*;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("05_model_one_scratch: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    if !device::driver_present() {
        println!("no CUDA device: this example needs an SM90 GPU");
        return Ok(true);
    }
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;

    // Six DeepSeek-shaped layers (grouped sigmoid routing with a correction bias), small widths.
    let (layers, e, k, h, i, max_tokens, tokens) = (6usize, 64usize, 6usize, 512usize, 256usize, 512usize, 40usize);
    let kind = RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 };
    let router = Router::new(&stream, RouterConfig::new(e, k, kind)?)?;
    let mut experts = Vec::new();
    let mut plans = Vec::new();
    for l in 0..layers as u64 {
        let p = PackedExperts::new(
            e,
            h,
            i,
            ExpertFormat::SWIGLU,
            random_vec::<bf16>(e * 2 * i * h, 10 * l + 1, 0.05),
            random_vec::<bf16>(e * h * i, 10 * l + 2, 0.05),
            None,
            None,
        )?;
        let weights = Arc::new(ExpertWeights::upload(&stream, &p)?);
        plans.push(MoeLayer::new(&stream, weights, MoeLayerOptions::new(max_tokens, k))?);
        experts.push(p);
    }
    let mut scratch = MoeScratch::for_layers(&stream, &plans)?;
    let each: Vec<usize> = plans.iter().map(|p| p.needs().footprint().total()).collect();
    println!(
        "{layers} layers, one scratch of {} bytes (the largest layer needs {}, all of them {} together); plans hold {} device bytes",
        scratch.bytes(),
        each.iter().max().unwrap_or(&0),
        each.iter().sum::<usize>(),
        plans.iter().map(|p| p.plan_bytes().device).sum::<usize>()
    );

    let mut rng = SplitMix64(7);
    let logits_host: Vec<f32> = (0..tokens * e).map(|_| rng.unit() * 3.0).collect();
    let bias_host: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
    let x_host = random_vec::<bf16>(tokens * h, 8, 1.0);
    let (logits, bias, x) =
        (stream.clone_htod(&logits_host)?, stream.clone_htod(&bias_host)?, stream.clone_htod(&x_host)?);
    let (mut ids, mut w) = (stream.alloc_zeros::<i32>(tokens * k)?, stream.alloc_zeros::<f32>(tokens * k)?);
    let mut ys =
        (0..layers).map(|_| stream.alloc_zeros::<bf16>(tokens * h)).collect::<std::result::Result<Vec<_>, _>>()?;

    // The step: one router launch, every layer, one checked point.
    let (mut iv, mut wv) = (MatrixViewMut::of("topk_ids", &mut ids, k)?, MatrixViewMut::of("topk_weights", &mut w, k)?);
    router.launch(
        &stream,
        &MatrixView::of("logits", &logits, e)?,
        Some(&bias.as_view()),
        &mut iv,
        &mut wv,
        scratch.status_mut(),
    )?;
    let (xv, idv, wv) =
        (MatrixView::of("x", &x, h)?, MatrixView::of("topk_ids", &ids, k)?, MatrixView::of("topk_weights", &w, k)?);
    for (layer, y) in plans.iter().zip(ys.iter_mut()) {
        layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut MatrixViewMut::of("y", y, h)?)?;
    }
    scratch.check(&stream)?;

    let (ids_host, w_host) = (stream.clone_dtoh(&ids)?, stream.clone_dtoh(&w)?);
    for (l, (p, y)) in experts.iter().zip(&ys).enumerate() {
        let want: Vec<f32> = moe_forward(p, &x_host, &ids_host, &w_host, k).iter().map(|v| v.to_f32()).collect();
        let got: Vec<f32> = stream.clone_dtoh(y)?.iter().map(|v| v.to_f32()).collect();
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        // The GPU layer tests' tolerance: two bf16 steps of the largest output, two half-ulps relative.
        let tol = Tolerance { atol: 2.0 * max / 256.0, rtol: 2.0 / 256.0 };
        if let Some((n, g, r)) = first_mismatch(&got, &want, tol) {
            eprintln!("05_model_one_scratch: layer {l}: y[{}, {}] = {g}, reference {r}", n / h, n % h);
            return Ok(false);
        }
    }
    println!(
        "{tokens} tokens through {layers} layers ({:?}): every output within the layer tests' tolerance",
        plans[0].backend_for(tokens)
    );
    Ok(true)
}
