//! Test helpers shared by the CPU and GPU test binaries: seeded data and the GPU context.
#![allow(dead_code)]

use std::sync::Arc;

#[allow(unused_imports)] // each test binary uses a different part
pub use moe_gemm::random::{random_vec, SplitMix64 as Rng};

/// A bf16 layer output against its reference: every element within two half bf16 steps of the largest
/// reference magnitude plus two of its own (`None`), or the first that is not.
pub fn bf16_layer_mismatch(got: &[half::bf16], want: &[half::bf16]) -> Option<String> {
    use moe_gemm::reference;
    let w: Vec<f32> = want.iter().map(|x| x.to_f32()).collect();
    let g: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
    let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    let tol = reference::Tolerance { atol: 2.0 * max / 256.0, rtol: 2.0 / 256.0 };
    reference::first_mismatch(&g, &w, tol).map(|(i, a, b)| format!("element {i}: got {a}, reference {b}"))
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

/// A router test case: name, configuration, logits `[T, E]`, correction bias `[E]`.
pub type RouterCase = (&'static str, moe_gemm::RouterConfig, Vec<f32>, Option<Vec<f32>>);

/// Routers of every kind fed three tokens: all logits NaN, all −∞, and a normal token (distinct logits 0.5
/// apart), as (name, config, logits `[3, E]`, bias). Biases are binary fractions, exact in f32, so the all-NaN
/// token's selection (by the bias alone: σ(−∞) = 0) has the same ties on the device as in the f64 reference.
/// The last case has a group of NaN biases and one of −∞ and keeps three groups for k = 12, so the top-k must
/// reach into −∞ scores.
pub fn nonfinite_router_cases() -> Vec<RouterCase> {
    use moe_gemm::{RouterConfig, RouterKind};
    let e = 16;
    let normal: Vec<f32> = (0..e).map(|i| ((7 * i) % e) as f32 * 0.5 - 4.0).collect();
    let logits = [vec![f32::NAN; e], vec![f32::NEG_INFINITY; e], normal].concat();
    let bias: Vec<f32> = (0..e).map(|i| ((5 * i) % e) as f32 / 128.0 - 1.0 / 16.0).collect();
    let mut bad_groups = bias.clone();
    bad_groups[..4].fill(f32::NAN);
    bad_groups[4..8].fill(f32::NEG_INFINITY);
    let grouped = |topk_group| RouterKind::GroupedSigmoid {
        n_group: 4,
        topk_group,
        renormalize: true,
        routed_scaling_factor: 2.5,
    };
    let cfg = |k, kind| RouterConfig::new(e, k, kind).unwrap();
    vec![
        ("softmax renormalized", cfg(4, RouterKind::Softmax { renormalize: true }), logits.clone(), None),
        ("softmax", cfg(4, RouterKind::Softmax { renormalize: false }), logits.clone(), None),
        ("top-k softmax", cfg(4, RouterKind::TopKSoftmax), logits.clone(), None),
        ("grouped sigmoid", cfg(4, grouped(2)), logits.clone(), Some(bias)),
        ("grouped sigmoid, NaN and -inf bias groups", cfg(12, grouped(3)), logits, Some(bad_groups)),
    ]
}

/// A concatenated `w13 [gate; up]` (`[2I, K]`, one scale per row or per tensor) in gpt-oss's interleaved order
/// (`g0, u0, g1, u1, …`), its rows moved with their scales: what a fused interleaved checkpoint holds.
pub fn interleave_w13(m: &moe_gemm::quant::BlockFp8) -> moe_gemm::quant::BlockFp8 {
    use moe_gemm::quant::{BlockFp8, Scales};
    let (n, k) = (m.rows(), m.cols());
    let order: Vec<usize> = (0..n / 2).flat_map(|r| [r, n / 2 + r]).collect();
    let q = order.iter().flat_map(|&r| m.q()[r * k..(r + 1) * k].iter().copied()).collect();
    let Scales::F32(s) = m.scales() else { panic!("F32 scales") };
    let s = if m.block().rows == 1 { order.iter().map(|&r| s[r]).collect() } else { s.clone() };
    BlockFp8::from_parts(n, k, m.block(), q, Scales::F32(s)).unwrap()
}
