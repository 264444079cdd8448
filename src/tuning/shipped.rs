//! The tuned tables this crate ships: `moe-gemm tune` run on an H200 and an H100 over the suite models
//! (uniform, balanced and zipf routing, the median of graph replays per backend, Fused tile and bucket; per
//! bucket the backend with the least worst ratio to the fastest), committed under `configs/<gpu>/` and compiled
//! in, so that `Auto` on those layers follows measurements rather than the cost model's fitted constants.
//!
//! A table serves layers of its `E` and `N` over weights of its format (`dtype=bf16`: 16-bit dense experts, bf16
//! and f16 moving the same bytes through the same kernels; `dtype=fp8_w8a8,block_shape=[128, 128]`: block-FP8
//! experts) on a GPU whose name matches its `device_name`. Other layers keep the cost model.

use super::{table_format, ConfigName, TunedBackends};
use crate::backend::WeightFormat;

/// `(file name, text)` per table, from groups of `(folder, device_name, dtype part)` and the tables' `E=..,N=..`.
macro_rules! shipped {
    ($(($dir:literal, $gpu:literal, $dtype:literal): [$($shape:literal),*];)*) => {
        [$($((
            concat!($shape, ",device_name=", $gpu, ",", $dtype, ".json"),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"), "/configs/", $dir, "/", $shape, ",device_name=", $gpu, ",", $dtype, ".json"
            )),
        ),)*)*]
    };
}
/// `(file name, text)` of every shipped table: the H200's 16-bit tables (2026-12-01/02,
/// `benches/results/h200-2026-12-01-tuned-tables/`), the H100's 16-bit tables (2026-12-06,
/// `benches/results/h100-2026-12-06-tuned-tables/`; gpt-oss-120b's 2026-12-07,
/// `benches/results/h100-2026-12-07-gpu-5128bfd/`) and block-FP8 tables (2026-12-07, after the FP8 decode
/// kernels quantise h once: `benches/results/h100-2026-12-07-fp8-decode-h-once/`).
pub const SHIPPED: [(&str, &str); 14] = shipped! {
    ("h200", "NVIDIA_H200", "dtype=bf16"): ["E=8,N=14336", "E=128,N=768", "E=128,N=1536", "E=128,N=2880", "E=256,N=2048"];
    ("h100", "NVIDIA_H100_80GB_HBM3", "dtype=bf16"):
        ["E=8,N=14336", "E=128,N=768", "E=128,N=1536", "E=128,N=2880", "E=256,N=2048"];
    ("h100", "NVIDIA_H100_80GB_HBM3", "dtype=fp8_w8a8,block_shape=[128, 128]"):
        ["E=8,N=14336", "E=128,N=768", "E=128,N=1536", "E=256,N=2048"];
};

impl TunedBackends {
    /// The shipped table for layers of `experts` experts (global) of intermediate size `inter` over weights of
    /// `format` on the GPU named `device_name` (as `cuDeviceGetName` reports it), if one was tuned for them.
    pub fn shipped(device_name: &str, format: WeightFormat, experts: usize, inter: usize) -> Option<TunedBackends> {
        let device = ConfigName::device(device_name);
        SHIPPED.iter().find_map(|(file, text)| {
            let name = ConfigName::parse(file).expect("shipped file names parse (tests/tuning.rs)");
            let f = table_format(&name).expect("shipped tables name their format (tests/tuning.rs)");
            (name.device_name == device && f == format && name.experts == experts && name.n == inter).then(|| {
                let t = TunedBackends::from_json(&name, text).expect("shipped tables parse (tests/tuning.rs)");
                TunedBackends { shipped: Some(file), ..t }
            })
        })
    }
}
