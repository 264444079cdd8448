//! Test helpers shared by the CPU and GPU test binaries: seeded data and the GPU context.
#![allow(dead_code)]

use std::sync::Arc;

#[allow(unused_imports)] // each test binary uses a different part
pub use moe_gemm::random::{random_vec, SplitMix64 as Rng};

/// Sizes of `groups` groups from `rows` rows routed uniformly at random (seeded).
pub fn uniform_sizes(groups: usize, rows: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed);
    let mut sizes = vec![0usize; groups];
    for _ in 0..rows {
        sizes[rng.below(groups)] += 1;
    }
    sizes
}

/// Device 0 and a stream on it for GPU tests. Panics with a clear message where there is no usable GPU:
/// these tests are `#[ignore]`d and only run on purpose (`--include-ignored`) on the GPU host.
pub fn gpu() -> (Arc<cudarc::driver::CudaContext>, Arc<cudarc::driver::CudaStream>) {
    let ctx = moe_gemm::device::open(0).expect("GPU tests need a CUDA device (run them on the H200)");
    // The per-thread default stream: capturable in a graph, and it keeps cudarc out of multi-stream mode, so no
    // tracking events are recorded inside a capture.
    let stream = ctx.per_thread_stream();
    (ctx, stream)
}
