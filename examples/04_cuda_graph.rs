//! A MoE step (router and layer) captured once in a CUDA graph and replayed with new router logits: each replay
//! routes its own tokens, and its output equals, bit for bit, the same step run eagerly. Exits non-zero when a
//! replay differs.
//!
//! `cargo run --release --example 04_cuda_graph` (needs an SM90 GPU; says so otherwise).

use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use half::bf16;
use moe_gemm::cudarc;
use moe_gemm::random::{random_vec, SplitMix64};
use moe_gemm::*;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("04_cuda_graph: {e}");
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
    // The per-thread stream keeps cudarc on one stream, so it records no tracking events inside the capture
    // (docs/layer.md, "CUDA graphs").
    let stream = ctx.per_thread_stream();

    // Qwen3-30B-shaped routing on a small layer: 128 experts, top-8, softmax with renormalisation.
    let (e, k, h, i, tokens, replays) = (128usize, 8usize, 512usize, 256usize, 16usize, 100u64);
    let router = Router::new(&stream, RouterConfig::new(e, k, RouterKind::Softmax { renormalize: true })?)?;
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
    let layer =
        MoeLayer::new(&stream, Arc::new(ExpertWeights::upload(&stream, &packed)?), MoeLayerOptions::new(tokens, k))?;
    let mut scratch = MoeScratch::for_layers(&stream, [&layer])?;
    let x = stream.clone_htod(&random_vec::<bf16>(tokens * h, 3, 1.0))?;
    let mut logits = stream.alloc_zeros::<f32>(tokens * e)?;
    let (mut ids, mut w) = (stream.alloc_zeros::<i32>(tokens * k)?, stream.alloc_zeros::<f32>(tokens * k)?);
    let mut y = stream.alloc_zeros::<bf16>(tokens * h)?;

    // One step: nothing in it allocates or synchronises, so it captures as it runs.
    let step = |scratch: &mut MoeScratch<bf16>,
                logits: &CudaSlice<f32>,
                ids: &mut CudaSlice<i32>,
                w: &mut CudaSlice<f32>,
                y: &mut CudaSlice<bf16>|
     -> Result<()> {
        let (mut iv, mut wv) = (MatrixViewMut::of("topk_ids", ids, k)?, MatrixViewMut::of("topk_weights", w, k)?);
        router.launch(&stream, &MatrixView::of("logits", logits, e)?, None, &mut iv, &mut wv, scratch.status_mut())?;
        let (xv, iv, wv) =
            (MatrixView::of("x", &x, h)?, MatrixView::of("topk_ids", ids, k)?, MatrixView::of("topk_weights", w, k)?);
        layer.forward(&stream, scratch, &xv, &iv, &wv, &mut MatrixViewMut::of("y", y, h)?)
    };
    step(&mut scratch, &logits, &mut ids, &mut w, &mut y)?; // warm-up: plans and kernels loaded before capture
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    step(&mut scratch, &logits, &mut ids, &mut w, &mut y)?;
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))?
        .ok_or_else(|| Error::InvalidProblem("the capture recorded no graph".into()))?;

    for replay in 0..replays {
        let mut rng = SplitMix64(100 + replay);
        let l: Vec<f32> = (0..tokens * e).map(|_| rng.unit() * 3.0).collect();
        stream.memcpy_htod(&l, &mut logits)?;
        graph.launch()?;
        let replayed = stream.clone_dtoh(&y)?;
        step(&mut scratch, &logits, &mut ids, &mut w, &mut y)?;
        let eager = stream.clone_dtoh(&y)?;
        scratch.check(&stream)?;
        if replayed.iter().zip(&eager).any(|(a, b)| a.to_bits() != b.to_bits()) {
            eprintln!("04_cuda_graph: replay {replay} differs from the eager step");
            return Ok(false);
        }
    }
    println!(
        "{replays} replays of one captured step ({:?}), each with new routing: bit-equal to eager",
        layer.backend_for(tokens)
    );
    Ok(true)
}
