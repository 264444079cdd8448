//! Kernel families and their configurations, one folder per family (as `cpp/` has): `dense` (bf16 / f16),
//! `fp8_blockwise`, `fp8_rowwise`, `mx` (block-scaled) and `fused`. A family's folder holds its per-arch plans
//! (`sm90.rs`, `sm100.rs`, `portable.rs`), its plan that picks the arch (`mod.rs`) and its launcher over the cxx
//! bridge (`launch.rs`: part of the bottom floor with `crate::ffi`, the only files here with `unsafe` code).
//! `plan.rs` holds what every plan shares.
//!
//! | family | arch | dtypes | layout |
//! |---|---|---|---|
//! | [`dense::sm90::GroupedGemm`] | SM90 (`sm_90a`) | bf16, f16 (fp32 accumulation) | A `[rows, K]` grouped by device offsets, B `[G, N, K]`, D `[rows, N]` |
//! | [`fp8_blockwise::sm90::GroupedGemmFp8`] | SM90 (`sm_90a`) | e4m3 x e4m3 with f32 1x128 / 128x128 block scales, bf16 out (fp32 two-level accumulation) | A [`crate::quant::Fp8Rows`] grouped by device offsets (or padded, masked), B [`crate::quant::Fp8BlockWeights`] `[G, N, K]`, D bf16 `[rows, N]` |
//! | [`fp8_rowwise::GroupedGemmFp8Rowwise`] | SM90 (`sm_90a`) | e4m3 x e4m3 with f32 per-token x per-channel scales (per-tensor as a special case), bf16 out (fast or promoted fp32 accumulation) | A [`crate::quant::Fp8TokenRows`] grouped as above, B [`crate::quant::Fp8ChannelWeights`] `[G, N, K]`, D bf16 `[rows, N]` |
//! | [`fused::FusedGemm`] (`gemm1_gather`, `gemm2_scatter`) | SM90 (`sm_90a`) | bf16, f16 (fp32 accumulation) | aligned layout: A rows gathered through `sorted_ids`, D scattered to flat rows with the router weight |
//! | [`dense::sm100::GroupedGemmSm100`] | SM100 (`sm_100a`), **compiled and SASS-checked only, never run on hardware** | bf16 (fp32 accumulation in tensor memory) | as [`dense::sm90::GroupedGemm`] |
//! | [`fp8_blockwise::sm100::GroupedGemmFp8Sm100`] | SM100 (`sm_100a`), **compiled and SASS-checked only, never run on hardware** | as [`fp8_blockwise::sm90::GroupedGemmFp8`] (tcgen05 MMA, fp32 two-level accumulation) | as [`fp8_blockwise::sm90::GroupedGemmFp8`]: the same operands and groups |
//! | [`mx::sm100::GroupedGemmMx`] | SM100 (`sm_100a`), **compiled and SASS-checked only, never run on hardware** | block-scaled: MXFP8 x MXFP8, MXFP8 x MXFP4, MXFP4 x MXFP4, NVFP4 x NVFP4 (not FP8 x NVFP4), bf16 out | A [`crate::quant::Mxfp8Rows`] / [`crate::quant::Mxfp4Rows`] / [`crate::quant::Nvfp4Rows`] grouped by device offsets (or padded, masked), B `[G, N, K]` with per-expert scale atoms, D bf16 `[rows, N]` |
//! | [`mx::portable::GroupedGemmMxPortable`] | SM90 and SM100 (`sm_90a`, `sm_100a`; `wmma`, not tuned) | as [`mx::sm100::GroupedGemmMx`], dequantised exactly into bf16, fp32 accumulation | as [`mx::sm100::GroupedGemmMx`]: the same operands and groups |
//!
//! Three plans pick the kernel for their device themselves, so that a caller names no arch:
//! [`dense::DenseGemm`] (SM90's or SM100's dense kernel), [`fp8_blockwise::BlockwiseFp8Gemm`] (SM90's or SM100's
//! FP8 blockwise kernel) and [`mx::MxGemm`] (SM100's block-scaled kernel or the portable one); the layer plans
//! through them. The per-arch plans above remain for callers that want one arch's kernel by name. The modules'
//! earlier names (`grouped`, `grouped_fp8`, `blockwise`, `block_scaled`, ...) are re-exported.
//!
//! Which targets each family was compiled for is [`KernelFamily`]'s to say (the build's gencode table); plans
//! refuse a device their family has no SASS for.

#[macro_use]
pub mod plan;
pub(crate) mod elementwise;
// The families: `pub mod <family>;` for each folder here whose launch.rs has a bridge (build.rs writes them, so
// that a new family adds no line to this file).
include!(concat!(env!("OUT_DIR"), "/kernel_modules.rs"));

// The modules' names before the families had folders, kept for callers: each is the family's arch module now.
pub use dense::sm100 as grouped_sm100;
pub use dense::sm90 as grouped;
pub use fp8_blockwise as blockwise;
pub use fp8_blockwise::sm100 as grouped_fp8_sm100;
pub use fp8_blockwise::sm90 as grouped_fp8;
pub use fp8_rowwise as grouped_fp8_rowwise;
pub use mx as block_scaled;
pub use mx::portable as grouped_mx_portable;
pub use mx::sm100 as grouped_mx;

pub use crate::device::KernelFamily;

use crate::dtype::DType;

/// Kernel schedule of a tile configuration (CUTLASS's, or the crate's own swap-AB decode kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Two consumer warpgroups share one CTA tile (better for large tiles / prefill).
    Cooperative,
    /// Two consumer warpgroups alternate over two tiles, overlapping one's epilogue with the other's MMAs.
    Pingpong,
    /// Not CUTLASS: warps of `mma.sync` with the weights on the MMA's M side and a group's few rows on its N
    /// side, each streaming its weight rows through its own ring of `cp.async` steps (decode).
    SwapAb,
}

/// A compiled tile configuration of the SM90 grouped GEMM (cluster 1x1x1). The C++ enum in `cpp/dense/launch.h`
/// is the source of truth; the bridge checks the discriminants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileConfig {
    /// Cooperative, 128x128x64: the general-purpose prefill tile.
    Cooperative128x128x64,
    /// Cooperative, 128x256x64: fewer re-reads of A for large N.
    Cooperative128x256x64,
    /// Ping-pong, 64x128x64: small groups (decode), half the wasted rows of a 128-row tile.
    Pingpong64x128x64,
    /// Ping-pong, 128x128x64.
    Pingpong128x128x64,
    /// Ping-pong, 64x64x128: decode with few active experts, twice the CTAs streaming weights.
    Pingpong64x64x128,
}

impl TileConfig {
    pub const ALL: [TileConfig; 5] = [
        TileConfig::Cooperative128x128x64,
        TileConfig::Cooperative128x256x64,
        TileConfig::Pingpong64x128x64,
        TileConfig::Pingpong128x128x64,
        TileConfig::Pingpong64x64x128,
    ];

    /// CTA tile (M, N, K).
    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            TileConfig::Cooperative128x128x64 | TileConfig::Pingpong128x128x64 => (128, 128, 64),
            TileConfig::Cooperative128x256x64 => (128, 256, 64),
            TileConfig::Pingpong64x128x64 => (64, 128, 64),
            TileConfig::Pingpong64x64x128 => (64, 64, 128),
        }
    }

    /// Thread-block cluster (M, N): 1x1 for every compiled configuration.
    pub const fn cluster(self) -> (u32, u32) {
        (1, 1)
    }

    pub const fn schedule(self) -> Schedule {
        match self {
            TileConfig::Cooperative128x128x64 | TileConfig::Cooperative128x256x64 => Schedule::Cooperative,
            TileConfig::Pingpong64x128x64 | TileConfig::Pingpong128x128x64 | TileConfig::Pingpong64x64x128 => {
                Schedule::Pingpong
            }
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            TileConfig::Cooperative128x128x64 => "coop-128x128x64",
            TileConfig::Cooperative128x256x64 => "coop-128x256x64",
            TileConfig::Pingpong64x128x64 => "pingpong-64x128x64",
            TileConfig::Pingpong128x128x64 => "pingpong-128x128x64",
            TileConfig::Pingpong64x64x128 => "pingpong-64x64x128",
        }
    }

    config_queries!();

    /// Whether this configuration was compiled for `dtype` into the linked library.
    pub fn is_built(self, dtype: DType) -> bool {
        dense::launch::built(dtype, self.into())
    }

    /// The default choice for `groups` groups of an `[n, k]` weight over about `expected_rows` rows in all,
    /// on a device with `sm_count` SMs. Measured on an H200 over the model suite of `moe-gemm bench`
    /// (`--config all`, 2026-11-29):
    ///
    /// * up to 32 rows per group (decode): 64-row ping-pong tiles, which waste least of the MMA; and 64-wide
    ///   N tiles when the experts that can be active hold 128-wide N tiles for fewer than half the SMs
    ///   (Mixtral w2 at T=1: 89 µs against 102);
    /// * more rows: 128x256 cooperative tiles, which re-read A half as often as 128x128 and were best or
    ///   within 3% of best at every prefill point (and at Mixtral's 64 rows per expert, 797 µs against 912 for
    ///   the layer at T = 256).
    pub fn heuristic(groups: usize, n: usize, expected_rows: usize, sm_count: usize) -> TileConfig {
        let per_group = expected_rows.div_ceil(groups.max(1));
        let active = groups.min(expected_rows.max(1));
        if per_group > 32 {
            TileConfig::Cooperative128x256x64
        } else if 2 * active * n.div_ceil(128) <= sm_count {
            TileConfig::Pingpong64x64x128
        } else {
            TileConfig::Pingpong64x128x64
        }
    }
}

variants_into!(TileConfig => dense::launch::TileConfig {
    Cooperative128x128x64, Cooperative128x256x64, Pingpong64x128x64, Pingpong128x128x64, Pingpong64x64x128
});

display_by_name!(TileConfig);
