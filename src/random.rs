//! Seeded random data for tests, benchmarks and examples: never zeros (they hide unwritten outputs and time
//! faster than real data), always reproducible.

use std::sync::Arc;
use std::thread;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use crate::dtype::Element;
use crate::error::Result;

/// splitmix64: small, fast, seedable.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
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
    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `tokens` rows of `k` distinct expert ids in `0..experts`, uniformly at random (seeded): `[tokens, k]`.
pub fn topk_ids(tokens: usize, k: usize, experts: usize, seed: u64) -> Vec<i32> {
    assert!(k <= experts, "k = {k} distinct ids out of {experts} experts");
    let mut rng = SplitMix64(seed);
    let mut ids = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let start = ids.len();
        while ids.len() - start < k {
            let x = rng.below(experts) as i32;
            if !ids[start..].contains(&x) {
                ids.push(x);
            }
        }
    }
    ids
}

/// `len` values uniform in [-scale, scale), generated on all cores (weights of real shapes are gigabytes).
pub fn random_vec<T: Element>(len: usize, seed: u64, scale: f32) -> Vec<T> {
    let mut v = vec![T::from_f32(0.0); len];
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = len.div_ceil(threads).max(1 << 16);
    thread::scope(|s| {
        for (i, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = SplitMix64(seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
                for x in part {
                    *x = T::from_f32(rng.unit() * scale);
                }
            });
        }
    });
    v
}

/// Fills a device buffer with values uniform in [-scale, scale): one random block of up to 16 Mi elements,
/// tiled by copies. For benchmarks of multi-gigabyte weights, where the values must be non-trivial but need not
/// be independent.
pub fn fill_device<T: Element>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>, seed: u64, scale: f32) -> Result<()> {
    let block = random_vec::<T>(buf.len().min(16 << 20), seed, scale);
    fill_tiled(stream, buf, &block)
}

/// Fills a device buffer with copies of `block`, back to back (the last one cut at the buffer's end).
pub fn fill_tiled<T: DeviceRepr>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>, block: &[T]) -> Result<()> {
    let mut at = 0;
    while at < buf.len() && !block.is_empty() {
        let len = block.len().min(buf.len() - at);
        stream.memcpy_htod(&block[..len], &mut buf.slice_mut(at..at + len))?;
        at += len;
    }
    Ok(())
}
