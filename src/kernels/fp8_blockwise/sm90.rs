//! SM90 FP8 blockwise-scaled grouped GEMM with device-side groups: DeepSeek-V3's recipe.
//!
//! For every row `r` of group `g`:
//!
//! `D[r, n] = Σ_kb (Σ_{k in kb} A_q[r, k] · B_q[g][n, k]) · sfa[r, kb] · sfb[g][n / 128, kb]`
//!
//! * A: [`Fp8Rows`] — e4m3 `[max_rows, K]` and f32 scales per row per 128 of K, K-major `[max_rows, ceil(K/128)]`;
//! * B: [`Fp8BlockWeights`] — e4m3 `[G, N, K]` and f32 scales per 128 × 128 block `[G, ceil(N/128), ceil(K/128)]`;
//! * D: bf16 `[max_rows, N]` row-major; rows outside every group are never written;
//! * groups: the [`GroupRows`] forms of the bf16 GEMM (offsets, padded, masked; not per-row), int32 on the
//!   device, clamped and reported into the [`DeviceStatus`] by our prepare kernel.
//!
//! Scales are dequantisation multipliers (`x ≈ q · s`). Accumulation is f32 in two levels: the tensor cores sum
//! one 128-wide block of K, which is then scaled by `sfa · sfb` and added (FFMA) to f32 accumulators; the
//! blockwise schedules have no fast-accumulation variant ([`Fp8KernelFacts`] reads this from the compiled
//! kernel).
//!
//! # Shape constraints, checked when the plan is made
//! CUTLASS checks nothing when the group shapes live only on the device, so [`GroupedGemmFp8Shape::new`] does:
//! * `K` a positive multiple of 16: rows of e4m3 A and B start on 16-byte boundaries, which TMA needs. `K` need
//!   not be a multiple of 128: the last block of K is partial, TMA fills it with zeros and its scale is the
//!   `ceil(K/128)`-th of the row, as in DeepSeek's zero-padded edge blocks.
//! * `N` a positive multiple of 128: every 128-wide N tile then covers exactly one row of its expert's scale
//!   grid and no tile is partial. The kernel's scale layout would also take a ceil grid of N, but that path is
//!   neither needed (DeepSeek-V3 w13/w2: N = 4096, 7168; Qwen3 FP8 MoE: 1536, 2048, 3072, 4096) nor covered by
//!   our GPU tests, so it is refused rather than trusted. The bf16 D rows are then 16-byte aligned as well.
//!
//! A launch queues two kernels (our prepare kernel and CUTLASS's; the swap-AB configuration, our own kernel
//! alone) and does no host work besides checks and the argument setup: no allocation, copy or synchronisation.
//!
//! On SM100 the same GEMM over the same operands and [`GroupedGemmFp8Shape`] is
//! [`super::sm100::GroupedGemmFp8Sm100`] (compiled and SASS-checked only): one plan type per arch.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtrMut};
use half::bf16;

use super::launch;
use crate::device::DeviceInfo;
use crate::error::{Error, Result};
use crate::ffi::gemm::{scaled_launch, ScaledOperands};
use crate::kernels::plan::{self, Workspace};
use crate::kernels::Schedule;
use crate::layouts::GroupRows;
use crate::quant::{scale_blocks, Fp8BlockWeights, Fp8Rows, SCALE_BLOCK};
use crate::status::DeviceStatus;

const OP: &str = "grouped_gemm_sm90_fp8_blockwise";

fp8_shape!(
    /// The shape of an FP8 blockwise grouped GEMM, validated against the kernels' constraints (module docs).
    GroupedGemmFp8Shape,
    n in SCALE_BLOCK => "the blockwise FP8 GEMM takes whole 128 x 128 weight-scale blocks along N (one scale-grid \
        row per N tile)",
    /// [`Error::InvalidProblem`] naming the constraint: `groups` in 1..=65536; `k` a positive multiple of 16
    /// (16-byte TMA rows of e4m3); `n` a positive multiple of 128 (whole weight-scale blocks); every extent
    /// within the kernels' 32-bit problem sizes; `G·N·K` and `max_rows·max(N, K)` within the address space.
);

impl GroupedGemmFp8Shape {
    /// One expert's weight-scale grid: `(ceil(N/128), ceil(K/128))`.
    pub fn scale_grid(&self) -> (usize, usize) {
        (scale_blocks(self.n), scale_blocks(self.k))
    }
}

/// The extents every SM90 FP8 grouped GEMM shares: `groups` in 1..=65536; `k` a positive multiple of 16 (16-byte
/// TMA rows of e4m3); `n` positive; every extent within the kernels' 32-bit problem sizes; `G·N·K` and
/// `max_rows·max(N, K)` within the address space.
pub(crate) fn check_fp8_extents(groups: usize, n: usize, k: usize, max_rows: usize) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidProblem(s));
    if groups == 0 || groups > 65536 {
        return bad(format!("groups = {groups}: must be in 1..=65536"));
    }
    if k == 0 || k % 16 != 0 {
        return bad(format!(
            "K = {k} is not a positive multiple of 16: rows of e4m3 A and B must be 16-byte aligned for TMA \
             (a partial last 128-block of K is fine)"
        ));
    }
    if n == 0 {
        return bad("N = 0: must be positive".into());
    }
    for (name, v) in [("N", n), ("K", k)] {
        if v > i32::MAX as usize {
            return bad(format!("{name} = {v} exceeds i32::MAX (CUTLASS problem sizes are 32-bit)"));
        }
    }
    if max_rows > i32::MAX as usize {
        return bad(format!("max_rows = {max_rows} exceeds i32::MAX (offsets are int32)"));
    }
    let limit = (isize::MAX as usize) / 4;
    if groups.checked_mul(n).and_then(|x| x.checked_mul(k)).is_none_or(|x| x > limit) {
        return bad(format!("G x N x K = {groups} x {n} x {k} overflows the address space"));
    }
    if max_rows.checked_mul(n.max(k)).is_none_or(|x| x > limit) {
        return bad(format!("max_rows x max(N, K) = {max_rows} x {} overflows the address space", n.max(k)));
    }
    Ok(())
}

/// A compiled configuration of the FP8 blockwise grouped GEMM (cluster 1x1x1, TileK 128). The C++ enum in
/// `cpp/fp8_blockwise/launch_fp8.h` is the source of truth; the bridge checks the discriminants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8TileConfig {
    /// Cooperative, 128x128x128: the prefill tile (the tile DeepGEMM and sglang use on SM90).
    Cooperative128x128x128,
    /// Ping-pong, 64x128x128: decode, half the idle MMA rows of a 128-row tile for small groups.
    Pingpong64x128x128,
    /// Swap AB, 16x128x128, no CUTLASS (`cpp/fp8_blockwise/swapab_decode.cuh`): decode, `mma.sync` with the
    /// weights on the MMA's M side and 16 rows of a group on its N side, a CTA per group and 128 weight rows, no
    /// workspace. A group of more than 16 rows takes a pass over its weights per 16. K must be a multiple of 128.
    SwapAb16,
}

impl Fp8TileConfig {
    pub const ALL: [Fp8TileConfig; 3] =
        [Fp8TileConfig::Cooperative128x128x128, Fp8TileConfig::Pingpong64x128x128, Fp8TileConfig::SwapAb16];

    /// CTA tile (M, N, K).
    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            Fp8TileConfig::Cooperative128x128x128 => (128, 128, 128),
            Fp8TileConfig::Pingpong64x128x128 => (64, 128, 128),
            Fp8TileConfig::SwapAb16 => (16, 128, 128),
        }
    }

    /// Thread-block cluster (M, N): 1x1.
    pub const fn cluster(self) -> (u32, u32) {
        (1, 1)
    }

    pub const fn schedule(self) -> Schedule {
        match self {
            Fp8TileConfig::Cooperative128x128x128 => Schedule::Cooperative,
            Fp8TileConfig::Pingpong64x128x128 => Schedule::Pingpong,
            Fp8TileConfig::SwapAb16 => Schedule::SwapAb,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Fp8TileConfig::Cooperative128x128x128 => "fp8-coop-128x128x128",
            Fp8TileConfig::Pingpong64x128x128 => "fp8-pingpong-64x128x128",
            Fp8TileConfig::SwapAb16 => "fp8-swapab-16x128x128",
        }
    }

    config_queries!(fp8
        /// What the compiled kernel of this configuration is, read from its CUTLASS types (host only).
    );

    /// The default for `groups` groups over about `expected_rows` rows in all: the swap-AB decode kernel up to
    /// 2 rows per group, 64-row ping-pong tiles up to 64 (a 128-row tile would leave at least half its MMA rows
    /// idle), 128x128 cooperative tiles above. The swap-AB kernel passes over an expert's weights once per 16 of
    /// its rows, so a skewed batch's popular experts cost it several passes. Against the 64-row tiles in the
    /// Grouped FP8 layer on an H100 (four models, T = 1-256, uniform and zipf routing): geomean 0.95 (0.88-1.10)
    /// at up to 2 rows per group, 0.97 at 3-4 (zipf up to 1.09), 1.06 at 5-8 and 1.44 at 9-16 (zipf up to 1.9)
    /// (`benches/results/h100-2026-12-07-fp8-swapab/`).
    pub fn heuristic(groups: usize, expected_rows: usize) -> Fp8TileConfig {
        let per_group = expected_rows.div_ceil(groups.max(1));
        if per_group <= 2 {
            Fp8TileConfig::SwapAb16
        } else if per_group <= 64 {
            Fp8TileConfig::Pingpong64x128x128
        } else {
            Fp8TileConfig::Cooperative128x128x128
        }
    }

    /// Whether this configuration takes a K of `k`: the swap-AB kernel steps through whole 128-blocks of K.
    pub const fn takes_k(self, k: usize) -> bool {
        !matches!(self, Fp8TileConfig::SwapAb16) || k % SCALE_BLOCK == 0
    }

    /// Whether this configuration takes `groups` groups: the swap-AB kernel's grid has one row of CTAs per group,
    /// at most 65535 (the shape takes 65536).
    pub const fn takes_groups(self, groups: usize) -> bool {
        !matches!(self, Fp8TileConfig::SwapAb16) || groups <= SWAP_AB_MAX_GROUPS
    }

    /// [`Error::InvalidProblem`] naming the rule where this configuration does not take `shape`.
    fn check_takes(self, shape: &GroupedGemmFp8Shape) -> Result<()> {
        if !self.takes_k(shape.k) {
            return Err(Error::InvalidProblem(format!(
                "{self} steps through whole 128-blocks of K: K = {} is not a multiple of 128 (the CUTLASS \
                 configurations take it)",
                shape.k
            )));
        }
        if !self.takes_groups(shape.groups) {
            return Err(Error::InvalidProblem(format!(
                "{self} launches one row of CTAs per group, at most {SWAP_AB_MAX_GROUPS}: G = {} (the CUTLASS \
                 configurations take it)",
                shape.groups
            )));
        }
        Ok(())
    }
}

/// The swap-AB kernel's most groups: its grid's y extent.
const SWAP_AB_MAX_GROUPS: usize = 65535;

variants_into!(Fp8TileConfig => launch::Fp8TileConfig { Cooperative128x128x128, Pingpong64x128x128, SwapAb16 });

display_by_name!(Fp8TileConfig);

impl Fp8KernelFacts {
    pub(crate) fn from_ffi(f: &launch::Fp8KernelFacts, schedule: String) -> Fp8KernelFacts {
        let u = |v: i32| v.max(0) as u32;
        Fp8KernelFacts {
            schedule,
            tile: (u(f.tile_m), u(f.tile_n), u(f.tile_k)),
            cluster: (u(f.cluster_m), u(f.cluster_n)),
            sms_per_mma: u(f.sms_per_mma),
            scale_block_a: (u(f.scale_m), u(f.scale_k)),
            scale_block_b: (u(f.scale_n), u(f.scale_k)),
            scales_k_major: (f.sfa_k_major, f.sfb_k_major),
            two_level_accumulation: f.blockwise_mainloop,
            fast_accumulation: f.fast_accumulation,
            promotion_k: u(f.promotion_k),
            stages: u(f.stages),
        }
    }
}

/// Compile-time facts of a built [`Fp8TileConfig`] (or [`crate::kernels::fp8_rowwise::Fp8RowwiseConfig`]), read
/// from the CUTLASS types of the compiled kernel.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fp8KernelFacts {
    /// CUTLASS kernel schedule, e.g. `KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise`.
    pub schedule: String,
    /// CTA tile (M, N, K); on SM100 the MMA tile, whose 256 rows a 2-SM MMA spreads over its two SMs.
    pub tile: (u32, u32, u32),
    /// Thread-block cluster (M, N).
    pub cluster: (u32, u32),
    /// SMs per MMA: 1 (wgmma, a 1-SM tcgen05 MMA) or 2 (an SM100 2-SM MMA, `tcgen05` `cta_group::2`).
    pub sms_per_mma: u32,
    /// Elements per activation scale (rows, K): (1, 128).
    pub scale_block_a: (u32, u32),
    /// Elements per weight scale (N, K): (128, 128).
    pub scale_block_b: (u32, u32),
    /// Whether the activation and weight scale grids are K-major.
    pub scales_k_major: (bool, bool),
    /// The blockwise mainloop: partial sums promoted into f32 accumulators with their scales.
    pub two_level_accumulation: bool,
    /// A FastAccum schedule (accumulation in the tensor cores only). Never true for the blockwise family.
    pub fast_accumulation: bool,
    /// Elements of K between promotions.
    pub promotion_k: u32,
    /// Shared-memory pipeline stages.
    pub stages: u32,
}

/// Options of a [`GroupedGemmFp8`] plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupedGemmFp8Options {
    /// Force a tile configuration; `None` picks [`Fp8TileConfig::heuristic`] (64-row ping-pong tiles in place of
    /// the swap-AB kernel where K is not a multiple of 128 or G is 65536).
    pub config: Option<Fp8TileConfig>,
    /// Expected rows in all groups together (T·k), a speed hint only: it picks the tile configuration and never
    /// changes results. Default `max_rows`.
    pub expected_rows: Option<usize>,
}

/// An FP8 blockwise grouped GEMM planned for one shape and device.
#[derive(Debug)]
pub struct GroupedGemmFp8 {
    shape: GroupedGemmFp8Shape,
    config: Fp8TileConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
}

impl GroupedGemmFp8 {
    /// Plans on the device of `stream`.
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(stream: &Arc<CudaStream>, shape: GroupedGemmFp8Shape, options: GroupedGemmFp8Options) -> Result<Self> {
        let device = DeviceInfo::query(stream.context())?;
        Self::for_device(device, shape, options)
    }

    /// Plans for an already queried device (no driver call).
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the device is SM90 (compute capability 9.0); [`Error::KernelNotBuilt`]
    /// when the configuration was not compiled; [`Error::InvalidProblem`] for [`Fp8TileConfig::SwapAb16`] forced
    /// on a K that is not a multiple of 128 or on 65536 groups (the heuristic picks the 64-row tiles there).
    pub fn for_device(device: DeviceInfo, shape: GroupedGemmFp8Shape, options: GroupedGemmFp8Options) -> Result<Self> {
        let expected = options.expected_rows.unwrap_or(shape.max_rows);
        let config = match options.config {
            Some(c) => {
                c.check_takes(&shape)?;
                c
            }
            None => match Fp8TileConfig::heuristic(shape.groups, expected) {
                c if c.check_takes(&shape).is_ok() => c,
                _ => Fp8TileConfig::Pingpong64x128x128,
            },
        };
        let workspace_bytes = plan::planned_workspace(&device, config, None, shape.groups)?;
        Ok(GroupedGemmFp8 { shape, config, device, workspace_bytes })
    }

    plan_accessors!(GroupedGemmFp8Shape, Fp8TileConfig);

    grouped_launch! {
        /// Queues `D = blockwise(A, B)` over the groups `rows` describes (offsets `[G + 1]` convert into it) on
        /// `stream`. See the module docs for the operands.
        ///
        /// # Errors
        /// [`Error::InvalidProblem`] when `a` or `b` does not have the plan's shape (`a.k() == K`,
        /// `a.rows() >= max_rows`; `b` exactly `[G, N, K]`) or `rows` is per-row groups; [`Error::Buffer`] when `d`
        /// or a group array is smaller than the plan implies or `d` is not 16-byte aligned;
        /// [`Error::WorkspaceTooSmall`]; CUTLASS or CUDA launch errors. Invalid offset or count *values* are
        /// clamped on the device and reported into `status`, read by [`DeviceStatus::check`].
        fn launch(&self, stream, a: &Fp8Rows, b: &Fp8BlockWeights, rows, d: bf16, workspace: &mut Workspace, status) {
            let planned = Planned::new(self.config.into(), &self.shape, &self.device, self.workspace_bytes);
            launch_planned(planned, stream, a, b, rows.into(), d, workspace, status)
        }
    }
}

/// What a launch of a planned FP8 blockwise GEMM needs besides its buffers: the compiled configuration (SM90 or
/// SM100: both read the same operands), the shape, the device and the workspace size planned for it.
pub(crate) struct Planned<'p> {
    pub config: launch::Fp8TileConfig,
    pub shape: &'p GroupedGemmFp8Shape,
    pub device: &'p DeviceInfo,
    pub workspace_bytes: u64,
}

impl<'p> Planned<'p> {
    pub fn new(
        config: launch::Fp8TileConfig,
        shape: &'p GroupedGemmFp8Shape,
        device: &'p DeviceInfo,
        workspace_bytes: u64,
    ) -> Self {
        Planned { config, shape, device, workspace_bytes }
    }
}

/// The launch every FP8 blockwise plan shares: checks `a` and `b` against the planned shape, then queues the
/// prepare kernel and the GEMM of `p.config`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_planned(
    p: Planned<'_>,
    stream: &Arc<CudaStream>,
    a: &Fp8Rows,
    b: &Fp8BlockWeights,
    rows: GroupRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    workspace: &mut Workspace,
    status: &mut DeviceStatus,
) -> Result<()> {
    let dims = p.shape.dims();
    plan::check_operand_shapes(("FP8 rows", a.rows(), a.k()), ("FP8 weights", (b.experts(), b.n(), b.k())), dims)?;
    let plan = plan::launch_plan(p.config, dims, p.device, p.workspace_bytes);
    let (aq, sfa, bq, sfb) = (a.q(), a.scales().as_view(), b.q(), b.scales());
    let ops = ScaledOperands { a: &aq, sa: &sfa, b: &bq, sb: &sfb };
    scaled_launch(stream, &plan, ops, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
}

arch_config!(Fp8TileConfig, OP, GroupedGemmSm90Fp8, one_dtype launch::workspace_bytes);

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only: the
/// layer's sizing asks it without a device).
pub(crate) fn workspace_bytes(config: Fp8TileConfig, groups: usize, sm_count: usize) -> Result<usize> {
    Ok(launch::workspace_bytes(config.into(), groups, sm_count.min(i32::MAX as usize) as i32)? as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceInfo {
        DeviceInfo::described("NVIDIA H200", (9, 0), 132)
    }

    #[test]
    fn names_round_trip_and_tiles_have_k_128() {
        for c in Fp8TileConfig::ALL {
            assert_eq!(Fp8TileConfig::from_name(c.name()), Some(c));
            assert_eq!(c.tile().2, 128, "{c}: TileK must equal the scale block of K");
        }
        assert_eq!(Fp8TileConfig::from_name("coop-128x128x64"), None);
    }

    #[test]
    fn the_plan_keeps_the_heuristic_choice() {
        let shape = GroupedGemmFp8Shape::new(256, 4096, 7168, 4096).unwrap();
        let decode = GroupedGemmFp8::for_device(
            h200(),
            shape,
            GroupedGemmFp8Options { expected_rows: Some(64), ..Default::default() },
        )
        .unwrap();
        assert_eq!(decode.config(), Fp8TileConfig::SwapAb16);
        assert_eq!(decode.workspace_bytes(), 0);
        // A shape the swap-AB kernel does not take: the heuristic's swap-AB pick (1 row per group) becomes the
        // 64-row tile, and a forced one is refused naming the rule.
        let refused = |shape: GroupedGemmFp8Shape, needles: [&str; 2]| {
            let opts = GroupedGemmFp8Options { expected_rows: Some(shape.groups()), ..Default::default() };
            let plan = GroupedGemmFp8::for_device(h200(), shape, opts).unwrap();
            assert_eq!(plan.config(), Fp8TileConfig::Pingpong64x128x128);
            let forced = GroupedGemmFp8Options { config: Some(Fp8TileConfig::SwapAb16), ..opts };
            let err = GroupedGemmFp8::for_device(h200(), shape, forced).unwrap_err().to_string();
            assert!(needles.iter().all(|n| err.contains(n)), "{err}");
        };
        // K = 7168 + 16: not whole 128-blocks.
        refused(GroupedGemmFp8Shape::new(256, 4096, 7184, 4096).unwrap(), ["K = 7184", "multiple of 128"]);
        // 65536 groups (the shape's most): past the swap-AB grid's 65535; one fewer is taken.
        refused(GroupedGemmFp8Shape::new(65536, 128, 128, 65536).unwrap(), ["G = 65536", "65535"]);
        let below = GroupedGemmFp8Shape::new(65535, 128, 128, 65535).unwrap();
        let opts = GroupedGemmFp8Options { expected_rows: Some(65535), ..Default::default() };
        assert_eq!(GroupedGemmFp8::for_device(h200(), below, opts).unwrap().config(), Fp8TileConfig::SwapAb16);
        let prefill = GroupedGemmFp8::for_device(
            h200(),
            GroupedGemmFp8Shape::new(8, 4096, 7168, 65536).unwrap(),
            Default::default(),
        )
        .unwrap();
        assert_eq!(prefill.config(), Fp8TileConfig::Cooperative128x128x128);
        assert!(prefill.workspace_bytes() > 0);
    }
}
