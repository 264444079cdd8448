//! SM100 FP8 blockwise-scaled grouped GEMM with device-side groups: DeepSeek-V3's recipe on Blackwell.
//!
//! The same GEMM as [`super::sm90::GroupedGemmFp8`] (SM90), over the same operands, shape rules and group
//! forms: [`Fp8Rows`] (e4m3 and f32 scales per row per 128 of K, K-major), [`Fp8BlockWeights`] (e4m3 `[G, N, K]`
//! and f32 scales per 128 × 128 block) and the [`GroupRows`] of the bf16 GEMM, bf16 D. A caller switches arch by
//! switching plan type, without requantising: both plans take a [`GroupedGemmFp8Shape`] and launch through one
//! prepare kernel (`cpp/fp8_blockwise/fp8_blockwise_groups.cuh`), which also writes the per-group scale layouts the SM100
//! mainloop reads.
//!
//! Two configurations: [`Fp8Sm100Config::Blockwise1Sm128x128x128`] (CUTLASS 4.2's
//! `KernelPtrArrayTmaWarpSpecializedBlockwise1SmSm100`, one SM per 128 × 128 × 128 tcgen05 MMA tile, cluster
//! 1x1x1) and [`Fp8Sm100Config::Blockwise2Sm256x128x128`] (`...Blockwise2SmSm100`: one 256 × 128 × 128 MMA,
//! `tcgen05` `cta_group::2`, over the two SMs of a static 2x1x1 cluster, each holding 128 rows and loading half
//! of the B tile; each SM's tile is still 128 × 128 × 128, so the scale blocks per CTA are the 1-SM kernel's).
//! [`Fp8Sm100Config::default_for`] picks one per shape; [`GroupedGemmFp8Sm100::with_config`] forces either. The
//! tensor cores sum each 128-wide block of K into tensor memory; the partial sum is then scaled by
//! `sfa · sfb` and added (FFMA) to f32 accumulators in registers. Scales stay K-major, so the MN-major rule of
//! 16-byte scale vectors (`M_g % 4 == 0`) does not arise: K-major scales are loaded one f32 at a time.
//!
//! **Never run on hardware**: no SM100 GPU is available to this project. The kernel is compiled for `sm_100a`
//! only and its machine code checked (`tests/sass.rs`: `UTCQMMA`, the FFMA promotion, no `UTCCP`); plans on any
//! other arch are refused with [`Error::UnsupportedArch`].
//!
//! [`GroupRows`]: crate::layouts::GroupRows

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;

use super::launch;
use super::sm90::{launch_planned, Fp8KernelFacts, GroupedGemmFp8Shape, Planned};
use crate::device::DeviceInfo;
use crate::device::KernelFamily;
use crate::error::{Error, Result};
use crate::kernels::plan::Workspace;
use crate::quant::{Fp8BlockWeights, Fp8Rows};

const OP: &str = "grouped_gemm_sm100_fp8_blockwise";

/// A compiled configuration of the SM100 FP8 blockwise grouped GEMM. The C++ enum (`cpp/fp8_blockwise/launch_fp8.h`'s
/// `Fp8TileConfig`, shared with the SM90 unit) is the source of truth.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Sm100Config {
    /// One SM per 128x128x128 MMA tile, cluster 1x1x1 (vLLM's and sglang's SM100 blockwise MoE tile).
    Blockwise1Sm128x128x128,
    /// Two SMs per 256x128x128 MMA tile, cluster 2x1x1: prefill.
    Blockwise2Sm256x128x128,
}

impl Fp8Sm100Config {
    pub const ALL: [Fp8Sm100Config; 2] =
        [Fp8Sm100Config::Blockwise1Sm128x128x128, Fp8Sm100Config::Blockwise2Sm256x128x128];
    /// Rows per group from which [`Self::default_for`] takes the 2-SM configuration: its MMA tile's height.
    pub const TWO_SM_MIN_ROWS_PER_GROUP: usize = 256;

    /// MMA tile (M, N, K); a 2-SM MMA's M spans both SMs of its cluster (128 rows each).
    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            Fp8Sm100Config::Blockwise1Sm128x128x128 => (128, 128, 128),
            Fp8Sm100Config::Blockwise2Sm256x128x128 => (256, 128, 128),
        }
    }

    /// SMs per MMA: 1, or 2 (`tcgen05` `cta_group::2`).
    pub const fn sms_per_mma(self) -> u32 {
        self.tile().0 / 128
    }

    /// Thread-block cluster (M, N): (SMs per MMA, 1), static in the kernel type.
    pub const fn cluster(self) -> (u32, u32) {
        (self.sms_per_mma(), 1)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Fp8Sm100Config::Blockwise1Sm128x128x128 => "fp8-sm100-1sm-128x128x128",
            Fp8Sm100Config::Blockwise2Sm256x128x128 => "fp8-sm100-2sm-256x128x128",
        }
    }

    /// The plan's default: 2-SM when the rows per group (`max_rows / groups`: the masked layout's `max_m`, the
    /// contiguous layout's mean) fill its 256-row MMA tile ([`Self::TWO_SM_MIN_ROWS_PER_GROUP`]), 1-SM
    /// otherwise. Below that a group leaves rows of the pair's tile idle where 128-row tiles leave at most 127,
    /// and the smaller 1-SM tiles keep more SMs busy on small groups. Not measured: no SM100 GPU has run either.
    pub fn default_for(shape: &GroupedGemmFp8Shape) -> Fp8Sm100Config {
        if shape.max_rows() / shape.groups().max(1) >= Self::TWO_SM_MIN_ROWS_PER_GROUP {
            Fp8Sm100Config::Blockwise2Sm256x128x128
        } else {
            Fp8Sm100Config::Blockwise1Sm128x128x128
        }
    }

    config_queries!(fp8
        /// What the compiled kernel is, read from its CUTLASS types (host only; no GPU needed).
    );
}

variants_into!(Fp8Sm100Config => launch::Fp8TileConfig {
    Blockwise1Sm128x128x128 => Sm100Blockwise1Sm128x128x128, Blockwise2Sm256x128x128 => Sm100Blockwise2Sm256x128x128
});

display_by_name!(Fp8Sm100Config);

/// An SM100 FP8 blockwise grouped GEMM planned for one shape and device.
#[derive(Debug)]
pub struct GroupedGemmFp8Sm100 {
    shape: GroupedGemmFp8Shape,
    config: Fp8Sm100Config,
    device: DeviceInfo,
    workspace_bytes: u64,
}

impl GroupedGemmFp8Sm100 {
    /// Plans on the device of `stream`.
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(stream: &Arc<CudaStream>, shape: GroupedGemmFp8Shape) -> Result<Self> {
        Self::for_device(DeviceInfo::query(stream.context())?, shape)
    }

    /// Plans for an already queried device (no driver call), with [`Fp8Sm100Config::default_for`]'s
    /// configuration. The shape rules are [`GroupedGemmFp8Shape::new`]'s, checked when the shape was made: the
    /// same as on SM90, and the same for both configurations (the 2-SM tile keeps N tiles of 128).
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] naming the device and `sm_100a` unless the device is SM100 (compute capability
    /// 10.0); [`Error::KernelNotBuilt`] when the configuration was not compiled.
    pub fn for_device(device: DeviceInfo, shape: GroupedGemmFp8Shape) -> Result<Self> {
        device.require(OP, KernelFamily::GroupedGemmSm100)?;
        let config = Fp8Sm100Config::default_for(&shape);
        GroupedGemmFp8Sm100 { shape, config, device, workspace_bytes: 0 }.with_config(config)
    }

    /// The same plan with `config` in place of the default.
    ///
    /// # Errors
    /// [`Error::KernelNotBuilt`] when `config` was not compiled.
    pub fn with_config(self, config: Fp8Sm100Config) -> Result<Self> {
        if !config.is_built() {
            return Err(Error::KernelNotBuilt { op: OP, dtype: None, config: Some(config.name().into()) });
        }
        let workspace_bytes = launch::workspace_bytes(config.into(), self.shape.groups(), self.device.sm_count)?;
        Ok(GroupedGemmFp8Sm100 { config, workspace_bytes, ..self })
    }

    plan_accessors!(GroupedGemmFp8Shape, Fp8Sm100Config);

    grouped_launch! {
        /// Queues `D = blockwise(A, B)` over the groups `rows` describes on `stream`: the operands and errors of
        /// [`super::sm90::GroupedGemmFp8::launch`].
        ///
        /// # Errors
        /// As [`super::sm90::GroupedGemmFp8::launch`].
        fn launch(&self, stream, a: &Fp8Rows, b: &Fp8BlockWeights, rows, d: bf16, workspace: &mut Workspace, status) {
            let planned = Planned::new(self.config.into(), &self.shape, &self.device, self.workspace_bytes);
            launch_planned(planned, stream, a, b, rows.into(), d, workspace, status)
        }
    }
}

arch_config!(Fp8Sm100Config, OP, GroupedGemmSm100, one_dtype launch::workspace_bytes);

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only: the
/// layer's sizing asks it without a device).
pub(crate) fn workspace_bytes(config: Fp8Sm100Config, groups: usize, sm_count: usize) -> Result<usize> {
    Ok(launch::workspace_bytes(config.into(), groups, sm_count.min(i32::MAX as usize) as i32)? as usize)
}
