//! SM90 FP8 rowwise-scaled grouped GEMM with device-side groups: per-token activation scales times per-channel
//! weight scales (per-tensor scales as their special case), the recipe of FP8 checkpoints that are not
//! block-scaled (vLLM's `fp8` w8a8 per-tensor and channelwise schemes, PyTorch's rowwise `_scaled_grouped_mm`).
//!
//! For every row `r` of group `g`: `D[r, n] = (Σ_k A_q[r, k] · B_q[g][n, k]) · sa[r] · sb[g][n]`.
//!
//! * A: [`Fp8TokenRows`] — e4m3 `[max_rows, K]` and f32 `[max_rows]`;
//! * B: [`Fp8ChannelWeights`] — e4m3 `[G, N, K]` and f32 `[G, N]`;
//! * D: bf16 `[max_rows, N]` row-major; rows outside every group are never written;
//! * groups: the [`GroupRows`] forms of the bf16 GEMM (offsets, padded, masked; not per-row).
//!
//! The scales multiply the f32 accumulator once, in the epilogue. Accumulation ([`Fp8Accumulation`]): `Fast`
//! keeps the whole K in the tensor cores' accumulators (CUTLASS's FP8FastAccum schedules, what vLLM's
//! `cutlass_moe_mm` runs); `Promoted` adds the tensor cores' partial sums into f32 registers every 128 of K,
//! which costs issue slots and bounds the error on long K. Plans default to `Fast`; the GPU tests state the error
//! of both at K = 7168 and 16384.
//!
//! # Shape constraints, checked when the plan is made
//! `N` and `K` positive multiples of 16 (16-byte e4m3 rows for TMA, 16-byte aligned per-expert channel scales),
//! and the extents of every FP8 GEMM (see [`super::grouped_fp8`]).
//!
//! [`GroupRows`]: crate::layouts::GroupRows

#[allow(unsafe_code)] // floor 0: the launcher over the bridge
mod launch;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;

use super::fp8_blockwise::sm90::Fp8KernelFacts;
use crate::device::DeviceInfo;
use crate::error::Result;
use crate::ffi::gemm::{scaled_launch, ScaledOperands};

use crate::kernels::plan::{self, Workspace};
use crate::kernels::Schedule;
use crate::quant::{Fp8ChannelWeights, Fp8TokenRows};
pub(crate) use launch::ROWWISE_ALIGN;

const OP: &str = "grouped_gemm_sm90_fp8_rowwise";

fp8_shape!(
    /// The shape of an FP8 rowwise grouped GEMM, validated against the kernels' constraints (module docs).
    GroupedGemmFp8RowwiseShape,
    n in ROWWISE_ALIGN => "bf16 D rows and each expert's f32 channel scales must start 16-byte aligned",
    /// [`Error::InvalidProblem`](crate::error::Error::InvalidProblem) naming the constraint (module docs).
);

/// How the tensor cores' e4m3 products are summed over K.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fp8Accumulation {
    /// All of K in the tensor cores' accumulators (FP8FastAccum schedules): fastest.
    #[default]
    Fast,
    /// Partial sums added into f32 registers every 128 of K: slower, a bounded error on long K.
    Promoted,
}

/// A compiled configuration of the rowwise family (cluster 1x1x1). The C++ enum in `cpp/fp8_rowwise/launch_fp8_rowwise.h`
/// is the source of truth; the bridge checks the discriminants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8RowwiseConfig {
    /// FastAccum ping-pong, 64x128x128: decode.
    FastAccumPingpong64x128x128,
    /// FastAccum cooperative, 128x128x128: prefill.
    FastAccumCooperative128x128x128,
    /// Promoted cooperative, 128x128x128: prefill with promoted accumulation (also serves decode when asked).
    PromotedCooperative128x128x128,
}

impl Fp8RowwiseConfig {
    pub const ALL: [Fp8RowwiseConfig; 3] = [
        Fp8RowwiseConfig::FastAccumPingpong64x128x128,
        Fp8RowwiseConfig::FastAccumCooperative128x128x128,
        Fp8RowwiseConfig::PromotedCooperative128x128x128,
    ];

    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            Fp8RowwiseConfig::FastAccumPingpong64x128x128 => (64, 128, 128),
            _ => (128, 128, 128),
        }
    }
    pub const fn schedule(self) -> Schedule {
        match self {
            Fp8RowwiseConfig::FastAccumPingpong64x128x128 => Schedule::Pingpong,
            _ => Schedule::Cooperative,
        }
    }
    pub const fn accumulation(self) -> Fp8Accumulation {
        match self {
            Fp8RowwiseConfig::PromotedCooperative128x128x128 => Fp8Accumulation::Promoted,
            _ => Fp8Accumulation::Fast,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Fp8RowwiseConfig::FastAccumPingpong64x128x128 => "fp8-rowwise-fast-pingpong-64x128x128",
            Fp8RowwiseConfig::FastAccumCooperative128x128x128 => "fp8-rowwise-fast-coop-128x128x128",
            Fp8RowwiseConfig::PromotedCooperative128x128x128 => "fp8-rowwise-promoted-coop-128x128x128",
        }
    }
    config_queries!(fp8
        /// What the compiled kernel is, read from its CUTLASS types: per-row and per-channel scales
        /// (`scale_block_a = (1, 0)`: one per row over all of K), no two-level accumulation, and for FastAccum no
        /// promotion (`promotion_k = 0`).
    );

    /// The default for `accumulation` over `groups` groups of about `expected_rows` rows in all: 64-row
    /// ping-pong tiles up to 64 rows per group with fast accumulation, 128-row cooperative tiles above; the
    /// promoted family has the one tile. Not yet measured on an H200: the threshold is the tile height, as for
    /// the blockwise family.
    pub fn heuristic(accumulation: Fp8Accumulation, groups: usize, expected_rows: usize) -> Fp8RowwiseConfig {
        match accumulation {
            Fp8Accumulation::Promoted => Fp8RowwiseConfig::PromotedCooperative128x128x128,
            Fp8Accumulation::Fast if expected_rows.div_ceil(groups.max(1)) <= 64 => {
                Fp8RowwiseConfig::FastAccumPingpong64x128x128
            }
            Fp8Accumulation::Fast => Fp8RowwiseConfig::FastAccumCooperative128x128x128,
        }
    }
}

variants_into!(Fp8RowwiseConfig => launch::Fp8RowwiseConfig {
    FastAccumPingpong64x128x128, FastAccumCooperative128x128x128, PromotedCooperative128x128x128
});

display_by_name!(Fp8RowwiseConfig);

/// Options of a [`GroupedGemmFp8Rowwise`] plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupedGemmFp8RowwiseOptions {
    /// Force a configuration; `None` picks [`Fp8RowwiseConfig::heuristic`] for `accumulation`.
    pub config: Option<Fp8RowwiseConfig>,
    /// Used when `config` is `None`.
    pub accumulation: Fp8Accumulation,
    /// Expected rows in all groups together, a speed hint only. Default `max_rows`.
    pub expected_rows: Option<usize>,
}

/// An FP8 rowwise grouped GEMM planned for one shape and device.
#[derive(Debug)]
pub struct GroupedGemmFp8Rowwise {
    shape: GroupedGemmFp8RowwiseShape,
    config: Fp8RowwiseConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
}

impl GroupedGemmFp8Rowwise {
    /// Plans on the device of `stream`.
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GroupedGemmFp8RowwiseShape,
        options: GroupedGemmFp8RowwiseOptions,
    ) -> Result<Self> {
        Self::for_device(DeviceInfo::query(stream.context())?, shape, options)
    }

    /// Plans for an already queried device (no driver call).
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`](crate::error::Error::UnsupportedArch) unless the device is SM90;
    /// [`Error::KernelNotBuilt`](crate::error::Error::KernelNotBuilt) when the configuration was not compiled.
    pub fn for_device(
        device: DeviceInfo,
        shape: GroupedGemmFp8RowwiseShape,
        options: GroupedGemmFp8RowwiseOptions,
    ) -> Result<Self> {
        let expected = options.expected_rows.unwrap_or(shape.max_rows);
        let config =
            options.config.unwrap_or_else(|| Fp8RowwiseConfig::heuristic(options.accumulation, shape.groups, expected));
        let workspace_bytes = plan::planned_workspace(&device, config, None, shape.groups)?;
        Ok(GroupedGemmFp8Rowwise { shape, config, device, workspace_bytes })
    }

    plan_accessors!(GroupedGemmFp8RowwiseShape, Fp8RowwiseConfig);

    grouped_launch! {
        /// Queues `D = rowwise(A, B)` over the groups `rows` describes on `stream`.
        ///
        /// # Errors
        /// [`Error::InvalidProblem`](crate::error::Error::InvalidProblem) when `a` or `b` does not have the plan's
        /// shape (`a.k() == K`, `a.rows() >= max_rows`; `b` exactly `[G, N, K]`) or `rows` is per-row groups;
        /// [`Error::Buffer`](crate::error::Error::Buffer) when `d` or a group array is too small or misaligned;
        /// [`Error::WorkspaceTooSmall`](crate::error::Error::WorkspaceTooSmall); CUTLASS or CUDA launch errors.
        /// Invalid offset or count values are clamped on the device and reported into `status`.
        fn launch(&self, stream, a: &Fp8TokenRows, b: &Fp8ChannelWeights, rows,
            d: bf16, workspace: &mut Workspace, status) {
            let dims = self.shape.dims();
            let b_dims = (b.experts(), b.n(), b.k());
            plan::check_operand_shapes(("FP8 token rows", a.rows(), a.k()), ("FP8 channel weights", b_dims), dims)?;
            let plan: launch::RowwisePlan = plan::launch_plan(self.config.into(), dims, &self.device, self.workspace_bytes);
            let rows = rows.into();
            let (aq, sa, bq, sb) = (a.q(), a.scales(), b.q(), b.scales());
            let ops = ScaledOperands { a: &aq, sa: &sa, b: &bq, sb: &sb };
            scaled_launch(stream, &plan, ops, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
        }
    }
}

arch_config!(Fp8RowwiseConfig, OP, GroupedGemmSm90Fp8, one_dtype launch::workspace_bytes);

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only: the
/// layer's sizing asks it without a device).
pub(crate) fn workspace_bytes(config: Fp8RowwiseConfig, groups: usize, sm_count: usize) -> Result<usize> {
    let sm = sm_count.min(i32::MAX as usize) as i32;
    Ok(launch::workspace_bytes(config.into(), groups, sm)? as usize)
}
