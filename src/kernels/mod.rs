//! Kernel families and their configurations.
//!
//! | family | arch | dtypes | layout |
//! |---|---|---|---|
//! | [`grouped::GroupedGemm`] | SM90 (`sm_90a`) | bf16, f16 (fp32 accumulation) | A `[rows, K]` grouped by device offsets, B `[G, N, K]`, D `[rows, N]` |

pub mod grouped;

use std::fmt;

use crate::dtype::DType;
use crate::ffi;

/// CUTLASS kernel schedule of a tile configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Two consumer warpgroups share one CTA tile (better for large tiles / prefill).
    Cooperative,
    /// Two consumer warpgroups alternate over two tiles, overlapping one's epilogue with the other's MMAs.
    Pingpong,
}

/// A compiled tile configuration of the SM90 grouped GEMM (cluster 1x1x1). The C++ enum in `cpp/launch.h`
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
}

impl TileConfig {
    pub const ALL: [TileConfig; 4] = [
        TileConfig::Cooperative128x128x64,
        TileConfig::Cooperative128x256x64,
        TileConfig::Pingpong64x128x64,
        TileConfig::Pingpong128x128x64,
    ];

    /// CTA tile (M, N, K).
    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            TileConfig::Cooperative128x128x64 | TileConfig::Pingpong128x128x64 => (128, 128, 64),
            TileConfig::Cooperative128x256x64 => (128, 256, 64),
            TileConfig::Pingpong64x128x64 => (64, 128, 64),
        }
    }

    pub const fn schedule(self) -> Schedule {
        match self {
            TileConfig::Cooperative128x128x64 | TileConfig::Cooperative128x256x64 => Schedule::Cooperative,
            TileConfig::Pingpong64x128x64 | TileConfig::Pingpong128x128x64 => Schedule::Pingpong,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            TileConfig::Cooperative128x128x64 => "coop-128x128x64",
            TileConfig::Cooperative128x256x64 => "coop-128x256x64",
            TileConfig::Pingpong64x128x64 => "pingpong-64x128x64",
            TileConfig::Pingpong128x128x64 => "pingpong-128x128x64",
        }
    }

    pub fn from_name(name: &str) -> Option<TileConfig> {
        TileConfig::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether this configuration was compiled for `dtype` into the linked library.
    pub fn is_built(self, dtype: DType) -> bool {
        ffi::grouped_gemm_sm90_built(dtype, self)
    }

    /// The default choice for a grouped GEMM whose groups hold about `expected_rows` rows each.
    ///
    /// Small groups (decode) waste most of a 128-row tile, so they take the 64-row ping-pong tile; larger groups
    /// take the 128x256 cooperative tile, which re-reads A half as often.
    pub fn heuristic(expected_rows: usize, n: usize) -> TileConfig {
        if expected_rows <= 64 {
            TileConfig::Pingpong64x128x64
        } else if n >= 256 {
            TileConfig::Cooperative128x256x64
        } else {
            TileConfig::Cooperative128x128x64
        }
    }
}

impl fmt::Display for TileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}
