//! GPU tests: every test here needs an SM90 device (the SM100 ones any device, see `gemm_sm100`) and is
//! `#[ignore]`d elsewhere. One binary, so it can be carried to the GPU host and run with `--include-ignored`.

#[path = "../common/mod.rs"]
mod common;

mod ep;
mod fp8;
mod fp8_channel;
mod fp8_layer;
mod fp8_rowwise;
mod fused;
mod gemm;
mod gemm_sm100;
mod layer;
mod layouts;
mod mx_layer;
mod mx_portable;
mod mx_quant;
mod mxfp4;
mod pipeline;
mod quant;
mod routing;
mod serving;
mod shared_layer;
mod weight_quant;
