//! CUTLASS-backed Mixture-of-Experts GEMMs for Hopper (SM90) and Blackwell (SM100) behind safe Rust types.
//!
//! moe-gemm is the expert-compute layer of a MoE model for Rust serving stacks: persistent grouped GEMMs
//! ([`GroupedGemm`], [`GroupedGemmFp8`], [`GroupedGemmSm100`], ...), device-side routers ([`Router`]) and expert
//! layouts ([`ExpertLayout`]), and a whole MoE layer ([`MoeLayer`]) over bf16, f16, block-FP8 and MXFP4 experts, on
//! [cudarc](https://docs.rs/cudarc)'s device memory and streams (re-exported as [`cudarc`]). Everything between the
//! router logits and the expert GEMMs runs on the GPU with no host synchronisation, so a model's step can be
//! captured in one CUDA graph. The SM100 kernels are compiled and their machine code checked, but no Blackwell GPU
//! has run them; the same operands run on Hopper through the portable block-scaled GEMM.
//!
//! # Levels
//!
//! The modules stand on floors; each names only modules on lower floors (`tests/layering.rs` checks this).
//!
//! | floor | module | what it holds |
//! |---|---|---|
//! | 0 | [`dtype`], [`error`] | element types ([`DType`], [`Element`]); the one [`Error`] type |
//! | 1 | `ffi` (private) | the cxx bridges and launch layer, with each GEMM family's launcher and bridge (`kernels::<family>::launch`, private): all the `unsafe` code, no domain types |
//! | 2 | [`device`], [`status`], [`view`] | arch and device facts ([`Arch`], [`DeviceInfo`], [`KernelFamily`]); the device status word ([`DeviceStatus`]); 2-D device views ([`MatrixView`]) |
//! | 3 | [`layouts`], [`routing`] | expert layouts and the group forms the GEMMs read ([`GroupRows`]); routers ([`RouterConfig`]) |
//! | 4 | [`quant`] | FP8 and MX / NV block formats, their device types and quantisers |
//! | 5 | [`experts`], [`backend`] | expert weights on the host and their formats ([`ExpertFormat`], [`PackedExperts`]); the layer's backends ([`Backend`]) |
//! | 6 | [`kernels`] | the GEMM families and their tile configurations ([`TileConfig`]) |
//! | 7 | [`tuning`] | vLLM config files and the shipped tuned tables ([`TunedBackends`]) |
//! | 8 | [`checkpoint`] | safetensors reading and packing, FP8 and MXFP4 checkpoints |
//! | 9 | [`layer`] | the MoE layer: device weights, plans, sizing, the shared scratch ([`MoeScratch`]) |
//! | 10 | [`parallel`] | expert parallelism: placement ([`Placement`]), dispatch plans, the NCCL step |
//! | 11 | [`reference`](mod@reference) | the CPU references of every part (GEMM rows, layouts, routers, the layer in every dtype) |
//!
//! [`GroupedGemm`]: kernels::grouped::GroupedGemm
//! [`GroupedGemmFp8`]: kernels::grouped_fp8::GroupedGemmFp8
//! [`GroupedGemmSm100`]: kernels::grouped_sm100::GroupedGemmSm100
//! [`ExpertLayout`]: layouts::ExpertLayout
//! [`DType`]: dtype::DType
//! [`Element`]: dtype::Element
//! [`Arch`]: device::Arch
//! [`KernelFamily`]: device::KernelFamily
//! [`GroupRows`]: layouts::GroupRows
//! [`TileConfig`]: kernels::TileConfig
//! [`TunedBackends`]: tuning::TunedBackends
//! [`Placement`]: parallel::Placement
//!
//! # Safety
//!
//! - All `unsafe` code and the cxx bridges are confined to the bottom floor: the private `ffi` module and each
//!   GEMM family's private `launch` module (with the family's bridge), each unsafe block with its argument. The crate denies `unsafe_code`
//!   but there, and `tests/layering.rs` fails if `unsafe` appears elsewhere.
//! - Validation before launch: plans check shapes once; every launch checks buffer lengths, alignments and its
//!   stream before it queues anything. C++ never prints, aborts or synchronises to report an error: it returns a
//!   status that becomes one [`Error`] variant naming the constraint.
//! - Device data is never trusted: offsets, ids and counts that break a contract are clamped on the device and set
//!   bits of a [`DeviceStatus`], reported as [`Error::DeviceCheck`] at the next checked point.
//! - Files are not trusted: checkpoints, `config.json` and tuned tables are validated before anything is
//!   allocated, and their parsers are fuzzed.
//! - The GPU tests run under compute-sanitizer's four tools (`scripts/sanitize.py`, its allow-list documenting
//!   each exception); the last runs and their summary lines are in `docs/gpu-tests.md`.
//!
//! # A grouped GEMM
//!
//! `D[r, :] = A[r, :] · B[g]ᵀ` for every row `r` of group `g`, the group offsets int32 `[G + 1]` on the device:
//!
//! ```rust,no_run
//! use half::bf16;
//! use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmShape};
//! use moe_gemm::{device, DeviceStatus};
//!
//! let ctx = device::open(0)?;
//! let stream = ctx.new_stream()?;
//! let (e, n, k, max_rows) = (256, 4096, 7168, 32768);
//! let plan = GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(e, n, k, max_rows)?, Default::default())?;
//! let mut ws = plan.alloc_workspace(&stream)?;
//! let mut status = DeviceStatus::new(&stream)?;
//! let a = stream.alloc_zeros::<bf16>(max_rows * k)?;   // permuted tokens
//! let w13 = stream.alloc_zeros::<bf16>(e * n * k)?;     // [E, 2I, H]
//! let offsets = stream.alloc_zeros::<i32>(e + 1)?;      // written by your router on the device
//! let mut d = stream.alloc_zeros::<bf16>(max_rows * n)?;
//! plan.launch(&stream, &a, &w13, &offsets, &mut d, &mut ws, &mut status)?;
//! status.check(&stream)?; // optional checked point: synchronises
//! # Ok::<(), moe_gemm::Error>(())
//! ```
//!
//! # A model's MoE layers
//!
//! One small plan per layer over shared weights, one scratch for all layers, one status word for the whole step:
//!
//! ```rust,no_run
//! use std::sync::Arc;
//! use half::bf16;
//! use moe_gemm::*;
//!
//! let ctx = device::open(0)?;
//! let stream = ctx.new_stream()?;
//! let (layers, e, k, h, i, max_tokens) = (58, 256, 8, 7168, 2048, 4096);
//! let router = Router::new(&stream, RouterConfig::deepseek_v3())?;
//! let mut plans = Vec::new();
//! for _ in 0..layers {
//!     let w13 = stream.alloc_zeros::<bf16>(e * 2 * i * h)?; // this layer's packed [E, 2I, H] weights
//!     let w2 = stream.alloc_zeros::<bf16>(e * h * i)?;      // and [E, H, I]
//!     let weights = ExpertWeights::from_device(e, h, i, GateUp::Concatenated, Activation::SiluGated, w13, w2, None, None)?;
//!     plans.push(MoeLayer::new(&stream, Arc::new(weights), MoeLayerOptions::new(max_tokens, k))?);
//! }
//! // One scratch for all 58 layers: sized by the largest need (`moe-gemm plan` prints it without a GPU).
//! let mut scratch = MoeScratch::for_layers(&stream, &plans)?;
//! let (logits, bias) = (stream.alloc_zeros::<f32>(max_tokens * e)?, stream.alloc_zeros::<f32>(e)?);
//! let mut x = stream.alloc_zeros::<bf16>(max_tokens * h)?;
//! let (mut ids, mut w) = (stream.alloc_zeros::<i32>(max_tokens * k)?, stream.alloc_zeros::<f32>(max_tokens * k)?);
//! let mut y = stream.alloc_zeros::<bf16>(max_tokens * h)?;
//! let tokens = 64;
//! for layer in &plans {
//!     // (attention and the router's logits for this layer come first in a real model)
//!     // The router takes its tokens from the views; shapes that disagree are refused before any launch.
//!     let lv = MatrixView::new("logits", logits.slice(..tokens * e), tokens, e)?;
//!     let mut idm = MatrixViewMut::new("topk_ids", ids.slice_mut(..tokens * k), tokens, k)?;
//!     let mut wm = MatrixViewMut::new("topk_weights", w.slice_mut(..tokens * k), tokens, k)?;
//!     router.launch(&stream, &lv, Some(&bias.as_view()), &mut idm, &mut wm, scratch.status_mut())?;
//!     let xv = MatrixView::new("x", x.slice(..tokens * h), tokens, h)?;
//!     let idv = MatrixView::new("topk_ids", ids.slice(..tokens * k), tokens, k)?;
//!     let wv = MatrixView::new("topk_weights", w.slice(..tokens * k), tokens, k)?;
//!     let mut yv = MatrixViewMut::new("y", y.slice_mut(..tokens * h), tokens, h)?;
//!     layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut yv)?;
//!     std::mem::swap(&mut x, &mut y);
//! }
//! scratch.check(&stream)?; // one checked point for the whole step (synchronises)
//! # Ok::<(), moe_gemm::Error>(())
//! ```
//!
//! The repository's `README.md` and `docs/` hold the build (features, link modes, next to candle), the support
//! matrix, the layer's backends and memory, benchmarks and the roadmap.

#![deny(unsafe_code, unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

/// Plain getters, `pub fn field(&self) -> Type { self.field }` with their docs, written once for the weight and
/// plan types that expose their small `Copy` fields (experts, N, K, H, I): `getters!(experts: usize, n: usize)`;
/// `getters!(in dims; experts: usize)` reads `self.dims.experts`.
macro_rules! getters {
    (in $via:ident; $($(#[$doc:meta])* $field:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $field(&self) -> $ty {
                self.$via.$field
            }
        )*
    };
    ($($(#[$doc:meta])* $field:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $field(&self) -> $ty {
                self.$field
            }
        )*
    };
}

/// `Display` by the type's `name()`, padded (so `{:>10}` aligns it), for the crate's named enums.
macro_rules! display_by_name {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl std::fmt::Display for $ty {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.pad(self.name())
                }
            }
        )+
    };
}

/// `From<$from> for $to` variant by variant, between an enum and its twin on the other side of the bridge (the
/// bridge checks the discriminants): each variant to the one of the same name, or to the one named after `=>`.
macro_rules! variants_into {
    ($from:ident => $to:ty { $($v:ident $(=> $w:ident)?),+ $(,)? }) => {
        impl From<$from> for $to {
            fn from(v: $from) -> Self {
                match v {
                    $($from::$v => variants_into!(@to $v $($w)?),)+
                }
            }
        }
    };
    (@to $v:ident) => { Self::$v };
    (@to $v:ident $w:ident) => { Self::$w };
}

pub mod backend;
#[cfg(feature = "candle")]
pub mod candle;
pub mod checkpoint;
pub mod device;
pub mod dtype;
pub mod error;
pub mod experts;
#[allow(unsafe_code)] // the bottom floor, with the families' `kernels::<family>::launch`
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

// The names a serving engineer uses, at the root (25): the layer, its options, sizing and scratch, the weights
// it takes (and their format) and the checkpoints they come from, the router, views, errors and the device. Everything else is
// reached through its module (`kernels::grouped::GroupedGemm`, `layouts::ExpertLayout`, `quant::BlockFp8`, ...).

pub use checkpoint::Checkpoint;
/// The cudarc this crate is built on (device memory, streams, graphs), so users need not pin it themselves.
pub use cudarc;
pub use device::DeviceInfo;
pub use error::{Error, Result};
pub use layer::{
    Activation, Backend, Backends, ExpertFormat, ExpertWeights, Fp8ExpertWeights, GateUp, LayerSizing, MoeLayer,
    MoeLayerOptions, MoeScratch, Mxfp4ExpertWeights, PackedExperts, SharedExpert,
};
pub use routing::{Router, RouterConfig, RouterKind};
pub use status::DeviceStatus;
pub use view::{MatrixView, MatrixViewMut};

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
    /// compute_90 (PTX); ...`. [`crate::device::KernelFamily`] has the same per family, typed.
    pub const CUDA_ARCHS: &str = env!("MOE_GEMM_CUDA_ARCHS");

    /// The CUDA runtime version linked statically (e.g. 13000).
    pub fn cudart_version() -> i32 {
        crate::ffi::runtime::cudart_version()
    }
}

// The README's and docs/' Rust examples are doc-tests too, so the copies there keep compiling.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_examples {}
#[cfg(doctest)]
#[doc = include_str!("../docs/grouped-gemm.md")]
mod grouped_gemm_examples {}
#[cfg(doctest)]
#[doc = include_str!("../docs/layer.md")]
mod layer_examples {}
