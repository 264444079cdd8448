//! GPU tests: every test here needs an SM90 device and is `#[ignore]`d elsewhere. One binary, so it can be
//! carried to the GPU host and run with `--include-ignored`.

#[path = "../common/mod.rs"]
mod common;

mod fp8;
mod fp8_layer;
mod fused;
mod gemm;
mod layer;
mod layouts;
mod pipeline;
mod quant;
mod routing;
mod serving;
