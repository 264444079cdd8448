//! Criterion bench of the grouped GEMM launch (regressions show in `cargo bench --features bench`). Needs an SM90 GPU;
//! elsewhere it says so and measures nothing. Each iteration launches and synchronises, so the figure includes launch
//! overhead; `moe-gemm bench` gives event-timed, L2-flushed numbers next to PyTorch.

use criterion::{criterion_group, criterion_main, Criterion};
use half::bf16;
use moe_gemm::device;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmShape};
use moe_gemm::random::fill_device;

fn grouped(c: &mut Criterion) {
    let Ok(ctx) = device::open(0) else {
        eprintln!("grouped_gemm bench: no CUDA device; nothing measured");
        return;
    };
    let stream = ctx.per_thread_stream();
    // (name, experts, N, K, rows): DeepSeek-V3 w13 at decode and prefill, Mixtral w13 prefill.
    for (name, e, n, k, rows) in [
        ("deepseek-v3 w13 T=8", 256usize, 4096usize, 7168usize, 64usize),
        ("deepseek-v3 w13 T=4096", 256, 4096, 7168, 32768),
        ("mixtral w13 T=4096", 8, 28672, 4096, 8192),
    ] {
        let sizes: Vec<usize> = (0..e).map(|g| rows / e + usize::from(g < rows % e)).collect();
        let offsets = stream.clone_htod(&moe_gemm::layouts::offsets_from_sizes(&sizes).unwrap()).unwrap();
        let mut a = stream.alloc_zeros::<bf16>(rows * k).unwrap();
        let mut b = stream.alloc_zeros::<bf16>(e * n * k).unwrap();
        fill_device(&stream, &mut a, 1, 1.0).unwrap();
        fill_device(&stream, &mut b, 2, 0.02).unwrap();
        let mut d = stream.alloc_zeros::<bf16>(rows * n).unwrap();
        let plan = GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(e, n, k, rows).unwrap(), Default::default())
            .unwrap();
        let mut ws = plan.alloc_workspace(&stream).unwrap();
        let mut st = moe_gemm::DeviceStatus::new(&stream).unwrap();
        c.bench_function(name, |bench| {
            bench.iter(|| {
                plan.launch(&stream, &a, &b, &offsets, &mut d, &mut ws, &mut st).unwrap();
                stream.synchronize().unwrap();
            })
        });
    }
}

criterion_group!(benches, grouped);
criterion_main!(benches);
