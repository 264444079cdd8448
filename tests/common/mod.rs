//! Test helpers shared by the CPU and GPU test binaries: seeded data and the GPU context.
#![allow(dead_code)]

use std::sync::Arc;
use std::thread;

use moe_gemm::Element;

/// splitmix64: small, seedable, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `len` values uniform in [-scale, scale), generated on all cores (weights of real shapes are gigabytes).
pub fn random_vec<T: Element>(len: usize, seed: u64, scale: f32) -> Vec<T> {
    let mut v = vec![T::from_f32(0.0); len];
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = len.div_ceil(threads).max(1 << 16);
    thread::scope(|s| {
        for (i, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = Rng(seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
                for x in part {
                    *x = T::from_f32(rng.unit() * scale);
                }
            });
        }
    });
    v
}

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
