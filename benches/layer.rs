//! Criterion benches of the layout build (vLLM align contract) and the MoE layer's forward, so regressions show in
//! `cargo bench --features bench`. Needs an SM90 GPU; elsewhere it says so and measures nothing. Each iteration queues
//! and synchronises (launch overhead included); `moe-gemm bench --layer` gives graph-replay numbers next to peers.

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::Arc;

use half::bf16;
use moe_gemm::layer::GateUp;
use moe_gemm::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use moe_gemm::random::{fill_device, topk_ids};
use moe_gemm::*;

fn ids(tokens: usize, k: usize, e: usize) -> Vec<i32> {
    topk_ids(tokens, k, e, tokens as u64)
}

fn benches(c: &mut Criterion) {
    let Ok(ctx) = device::open(0) else {
        eprintln!("layer bench: no CUDA device; nothing measured");
        return;
    };
    let stream = ctx.per_thread_stream();
    let (e, k) = (256usize, 8usize);
    let mut status = DeviceStatus::new(&stream).unwrap();
    for tokens in [1usize, 64, 4096] {
        let idd = stream.clone_htod(&ids(tokens, k, e)).unwrap();
        let mut layout =
            ExpertLayout::new(&stream, LayoutDims::new(LayoutSpec::Aligned { block_m: 16 }, tokens, k, e, e).unwrap())
                .unwrap();
        c.bench_function(&format!("align E=256 k=8 T={tokens}"), |b| {
            b.iter(|| {
                layout.build(&stream, tokens, &idd, None, &mut status).unwrap();
                stream.synchronize().unwrap();
            })
        });
    }
    // DeepSeek-V3-shaped layer with 64 experts (fits any H200 run quickly), decode and prefill.
    let (e, h, i) = (64usize, 7168usize, 2048usize);
    let mut w13 = stream.alloc_zeros::<bf16>(e * 2 * i * h).unwrap();
    let mut w2 = stream.alloc_zeros::<bf16>(e * h * i).unwrap();
    fill_device(&stream, &mut w13, 1, 0.02).unwrap();
    fill_device(&stream, &mut w2, 2, 0.02).unwrap();
    let weights =
        ExpertWeights::from_device(e, h, i, GateUp::Concatenated, Activation::SiluGated, w13, w2, None, None).unwrap();
    let opts = MoeLayerOptions::new(1024, k).backends(Backends::AUTO);
    let mut layer = MoeLayer::new(&stream, Arc::new(weights), opts).unwrap();
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    let mut x = stream.alloc_zeros::<bf16>(1024 * h).unwrap();
    fill_device(&stream, &mut x, 3, 1.0).unwrap();
    let mut y = stream.alloc_zeros::<bf16>(1024 * h).unwrap();
    // Auto's pick at decode and prefill, and the Fused and Grouped backends side by side at T = 64.
    for (tokens, backend) in
        [(1usize, Backend::Auto), (64, Backend::Fused), (64, Backend::Grouped), (1024, Backend::Auto)]
    {
        let idd = stream.clone_htod(&ids(tokens, k, e)).unwrap();
        let w = stream.clone_htod(&vec![1.0f32 / k as f32; tokens * k]).unwrap();
        layer.set_backend(backend).unwrap();
        let ran = layer.backend_for(tokens);
        let xv = MatrixView::new("x", x.slice(..tokens * h), tokens, h).unwrap();
        let idv = MatrixView::of("topk_ids", &idd, k).unwrap();
        let wv = MatrixView::of("topk_weights", &w, k).unwrap();
        c.bench_function(&format!("layer forward E=64 H=7168 I=2048 k=8 T={tokens} ({ran:?})"), |b| {
            b.iter(|| {
                let mut yv = MatrixViewMut::new("y", y.slice_mut(..tokens * h), tokens, h).unwrap();
                layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut yv).unwrap();
                stream.synchronize().unwrap();
            })
        });
    }
    scratch.check(&stream).unwrap();
}

criterion_group!(layer_benches, benches);
criterion_main!(layer_benches);
