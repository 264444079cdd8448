pub mod args;
pub mod bench;
pub mod compare;
#[cfg(feature = "nccl")]
pub mod ep_bench;
pub mod fp8_bench;
pub mod info;
pub mod layer_bench;
mod layer_fp8;
mod layer_inputs;
pub mod peer;
pub mod plan;
pub mod plot;
pub mod tune;
