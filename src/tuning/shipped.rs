//! The tuned tables this crate ships: `moe-gemm tune` run on an H200 over the suite models (uniform, balanced
//! and zipf routing, median of 20 graph replays per backend, Fused tile and bucket; per bucket the backend with
//! the least worst ratio to the fastest, and since 2026-12-02 the Fused tile so chosen for the decode buckets
//! T = 1-256), committed under `configs/h200/` and compiled in, so that `Auto` on those layers follows
//! measurements rather than the cost model's fitted constants.
//!
//! A table serves layers of its `E` and `N` on a GPU whose name matches its `device_name`, over 16-bit dense
//! weights (bf16 and f16 move the same bytes through the same kernels). FP8 layers keep their own cost model.

use super::{ConfigName, TunedBackends};

macro_rules! shipped {
    ($file:literal) => {
        ($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/h200/", $file)))
    };
}
/// `(file name, text)` of every shipped table.
pub const SHIPPED: [(&str, &str); 5] = [
    shipped!("E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json"),
    shipped!("E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json"),
    shipped!("E=128,N=1536,device_name=NVIDIA_H200,dtype=bf16.json"),
    shipped!("E=128,N=2880,device_name=NVIDIA_H200,dtype=bf16.json"),
    shipped!("E=256,N=2048,device_name=NVIDIA_H200,dtype=bf16.json"),
];

impl TunedBackends {
    /// The shipped table for layers of `experts` experts (global) of intermediate size `inter` on the GPU named
    /// `device_name` (as `cuDeviceGetName` reports it), if one was tuned for them.
    pub fn shipped(device_name: &str, experts: usize, inter: usize) -> Option<TunedBackends> {
        let device = ConfigName::device(device_name);
        SHIPPED.iter().find_map(|(file, text)| {
            let name = ConfigName::parse(file).expect("shipped file names parse (tests/tuning.rs)");
            (name.device_name == device && name.experts == experts && name.n == inter)
                .then(|| TunedBackends::from_json(&name, text).expect("shipped tables parse (tests/tuning.rs)"))
        })
    }
}
