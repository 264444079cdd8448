//! # moe-gemm
//!
//! The expert-compute layer of a Mixture-of-Experts model: CUTLASS-backed grouped GEMMs for Hopper (SM90)
//! behind safe Rust types, over cudarc's device memory and streams.
//!
//! ## Support matrix
//! | operation | arch | dtypes | status |
//! |---|---|---|---|
//! | grouped GEMM, device offsets ([`kernels::grouped`]) | SM90 (`sm_90a`) | bf16, f16 → same, fp32 accumulation | tested on H200 |
//!
//! ## Safety model
//! All `unsafe` code and the cxx bridge live in the private `ffi` module. Plans validate shapes once
//! ([`kernels::grouped::GroupedGemmShape`]); a launch checks buffer lengths and alignment against the plan
//! (O(1), host only), holds cudarc's stream-ordering guards across the C++ call, and queues work without
//! allocating, copying or synchronising. Device data (offsets) is never trusted: kernels clamp it and report
//! violations through a device error word that [`kernels::grouped::Workspace::check`] surfaces.
//! Launching on a device of another architecture is an [`Error::UnsupportedArch`], never undefined behaviour.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod device;
pub mod dtype;
pub mod error;
mod ffi;
pub mod kernels;
pub mod layouts;
pub mod reference;

pub use device::{Arch, DeviceInfo};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape, Workspace};
pub use kernels::TileConfig;

/// What was compiled into this library, from the build script.
pub mod build_info {
    pub const NVCC: &str = env!("MOE_GEMM_NVCC");
    pub const NVCC_RELEASE: &str = env!("MOE_GEMM_NVCC_RELEASE");
    pub const CUTLASS_VERSION: &str = env!("MOE_GEMM_CUTLASS_VERSION");
    pub const CUTLASS_DIR: &str = env!("MOE_GEMM_CUTLASS_DIR");
    /// Comma-separated CUDA targets with SASS in the library.
    pub const CUDA_ARCHS: &str = env!("MOE_GEMM_CUDA_ARCHS");

    /// The CUDA runtime version linked statically (e.g. 13000).
    pub fn cudart_version() -> i32 {
        crate::ffi::cudart_version()
    }
}
