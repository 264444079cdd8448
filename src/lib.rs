#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod backend;
pub mod checkpoint;
pub mod device;
pub mod dtype;
pub mod error;
pub mod experts;
mod ffi;
pub mod kernels;
pub mod layer;
pub mod layouts;
pub mod parallel;
pub mod quant;
pub mod reference;
pub mod routing;
pub mod status;
pub mod tuning;
pub mod view;

// Benchmark support shared by the `moe-gemm` binary, the tests, the benches and the examples: behind the default
// `cli` feature, public only for them, not part of the library's API.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod ceilings;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod random;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod timing;

/// The cudarc this crate is built on (device memory, streams, graphs), so users need not pin it themselves.
pub use cudarc;
pub use device::{Arch, DeviceInfo, KernelFamily};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use kernels::fused::{FusedBatch, FusedTile};
pub use kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape, Workspace};
pub use kernels::grouped_fp8::{
    Fp8KernelFacts, Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape,
};
pub use kernels::grouped_fp8_sm100::{Fp8Sm100Config, GroupedGemmFp8Sm100};
pub use kernels::grouped_mx_portable::GroupedGemmMxPortable;
pub use kernels::grouped_sm100::{GroupedGemmSm100, GroupedGemmSm100Options, Sm100KernelFacts, Sm100TileConfig};
pub use kernels::TileConfig;
pub use layer::{
    auto_backend, auto_backend_fp8, Activation, Backend, Backends, ExpertFormat, ExpertWeights, Footprint,
    Fp8ExpertWeights, GateUp, LayerGemm, LayerShape, LayerSizing, LayerWeights, MoeLayer, MoeLayerOptions, MoeScratch,
    Mxfp4ExpertWeights, PackedExperts, PlanBytes, ScratchNeeds, SharedExpert, Storage, WeightFormat,
};
pub use layouts::{ExpertLayout, GroupRows, LayoutDims, LayoutSpec};
pub use parallel::{DispatchPlan, EpSizing, ExpertSlot, Placement};
pub use routing::{Router, RouterConfig, RouterKind};
pub use status::DeviceStatus;
pub use tuning::TunedBackends;
pub use view::{MatrixView, MatrixViewMut, ViewShape};

/// For the `moe-gemm` binary (`cli` feature).
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod process {
    /// Lets a closed pipe (`moe-gemm info | head`) end the process quietly, as C tools do, instead of making
    /// `println!` panic. Call first thing in `main`.
    pub fn default_sigpipe() {
        crate::ffi::runtime::default_sigpipe();
    }
}

/// What was compiled into this library, from the build script.
pub mod build_info {
    pub const NVCC: &str = env!("MOE_GEMM_NVCC");
    pub const NVCC_RELEASE: &str = env!("MOE_GEMM_NVCC_RELEASE");
    pub const CUTLASS_VERSION: &str = env!("MOE_GEMM_CUTLASS_VERSION");
    pub const CUTLASS_DIR: &str = env!("MOE_GEMM_CUTLASS_DIR");
    /// The CUDA targets compiled into the library, per kernel family (the build's gencode table):
    /// `family: target, target; family: ...`, e.g. `grouped_gemm_sm90: sm_90a; ...; routing: sm_90, sm_100,
    /// compute_90 (PTX); ...`. [`crate::KernelFamily`] has the same per family, typed.
    pub const CUDA_ARCHS: &str = env!("MOE_GEMM_CUDA_ARCHS");

    /// The CUDA runtime version linked statically (e.g. 13000).
    pub fn cudart_version() -> i32 {
        crate::ffi::runtime::cudart_version()
    }
}
