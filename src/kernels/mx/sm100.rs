//! SM100 block-scaled grouped GEMMs with device-side groups, bf16 out, the activation and weight formats chosen
//! per plan ([`MxFormat`] each; [`MxConfig`] the compiled pairs):
//!
//! | activations × weights | tcgen05 kind | scales | 1-SM configuration | 2-SM configuration |
//! |---|---|---|---|---|
//! | MXFP8 × MXFP8 | `kind::mxf8f6f4` | UE8M0 per 32 of K | [`MxConfig::Mxf8Mma1Sm128x128x128`] | [`MxConfig::Mxf8Mma2Sm256x256x128`] |
//! | MXFP8 × MXFP4 (gpt-oss's e2m1) | `kind::mxf8f6f4` | UE8M0 per 32 | [`MxConfig::Mxf8f4Mma1Sm128x128x128`] | none (one more kernel in that unit's nvcc time) |
//! | MXFP4 × MXFP4 | `kind::mxf4` | UE8M0 per 32 | [`MxConfig::Mxf4Mma1Sm128x128x256`] | none (taken out: nvcc time) |
//! | NVFP4 × NVFP4 | `kind::mxf4nvf4` | UE4M3 per 16, × A's and each expert's f32 tensor scales (alpha) | [`MxConfig::Nvf4Mma1Sm128x128x256`] | none (taken out: nvcc time) |
//!
//! A 1-SM configuration runs one 128-row MMA per SM (cluster 1x1x1). A 2-SM one runs CUTLASS's
//! `KernelPtrArrayTmaWarpSpecialized2Sm*Sm100` schedule: one 256 x 256 MMA (`tcgen05` `cta_group::2`) over the two SMs
//! of a static 2x1x1 cluster, each holding 128 of the rows and loading half of the B tile, so each SM does twice
//! the MMA work of a 1-SM 128 x 128 tile per byte of A and B it loads. It needs N in whole 256s. The plan picks it by
//! [`MxConfig::default_for`] (prefill shapes); [`GroupedGemmMx::with_config`] forces either.
//!
//! FP8 × NVFP4 is refused ([`Error::KernelNotBuilt`], saying why): the CUTLASS 4.2 builder has no such kernel
//! (UE4M3 scales exist only when both operands are 4-bit; FP8 × FP4 runs only under `kind::mxf8f6f4` with UE8M0
//! per 32). Pairs of other scale types, and FP4 activations × FP8 weights, are not built either.
//!
//! For every row `r` of group `g`: `D[r, n] = α_g Σ_k (qa[r, k] · sa[r, k/V]) · (qb[g][n, k] · sb[g][n, k/V])`,
//! `α_g = 1` (MX) or A's tensor scale × expert `g`'s (NVFP4).
//!
//! * A: [`Mxfp8Rows`], [`Mxfp4Rows`] or [`Nvfp4Rows`] ([`MxRows`]) — the elements and each group's scales in
//!   CUTLASS's 128 x 4 atoms at the base the device quantiser ([`crate::quant::quantize_mxfp8_grouped`],
//!   [`crate::quant::quantize_mxfp4_grouped`], [`crate::quant::quantize_nvfp4_grouped`]) computed on the
//!   device: the launch reads the bases (and NVFP4's tensor scale) from there, so the step stays graph-safe and
//!   needs no host copy of the counts;
//! * B: [`Mxfp8Weights`] (e4m3 `[G, N, K]`), [`Mxfp4Weights`] or [`Nvfp4Weights`] (e2m1 packed `[G, N, K /
//!   2]`), each expert's scale atoms ([`MxWeights`]);
//! * D: bf16 `[max_rows, N]`; groups: offsets, padded or masked (not per-row).
//!
//! **Never run on hardware**: no SM100 GPU is available to this project. The kernels are compiled for `sm_100a`
//! and their machine code checked (`tests/sass.rs`: the block-scaled `UTCQMMA` (8-bit operands) and `UTCOMMA`
//! (4-bit, `.4X` for NVFP4's 16-element blocks) with the scale operand in tensor memory, `UTCCP` copying scales
//! there); the activation layouts they read are built by portable kernels whose GPU tests compare them with the
//! host layout; plans on any other arch are refused with [`Error::UnsupportedArch`].

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;

use super::launch;
use super::launch::MxData;
use crate::device::DeviceInfo;
use crate::device::KernelFamily;
use crate::error::{Error, Result};
use crate::kernels::fp8_blockwise::sm90::check_fp8_extents;
use crate::kernels::plan::Workspace;
use crate::quant::{Mxfp4Rows, Mxfp4Weights, Mxfp8Rows, Mxfp8Weights, Nvfp4Rows, Nvfp4Weights};

const OP: &str = "grouped_gemm_sm100_mx";

/// The multiple of 128 the plans take N and K in (whole MMA tiles and 4 x 32 scale atoms). A K off it is
/// zero-padded up to it, exactly ([`crate::quant::Mxfp4::pad_k`]): gpt-oss's 2880 runs as 2944.
pub const MX_K_MULTIPLE: usize = 128;

/// An operand's block-scaled format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MxFormat {
    /// e4m3, UE8M0 per 32 of K.
    Mxfp8,
    /// e2m1 packed two per byte, UE8M0 per 32 (gpt-oss's weights).
    Mxfp4,
    /// e2m1 packed two per byte, UE4M3 per 16, one f32 per tensor.
    Nvfp4,
}

impl MxFormat {
    /// Elements per scale.
    pub const fn block(self) -> usize {
        match self {
            MxFormat::Nvfp4 => 16,
            _ => 32,
        }
    }
    pub const fn bits(self) -> usize {
        match self {
            MxFormat::Mxfp8 => 8,
            _ => 4,
        }
    }
}

/// A compiled configuration (`cpp/mx/launch.h`): a pair of formats, SMs per MMA and the MMA tile.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MxConfig {
    /// MXFP8 x MXFP8, one SM per MMA, 128 x 128 x 128.
    Mxf8Mma1Sm128x128x128,
    /// MXFP8 x MXFP4, one SM per MMA, 128 x 128 x 128.
    Mxf8f4Mma1Sm128x128x128,
    /// MXFP4 x MXFP4, one SM per MMA, 128 x 128 x 256.
    Mxf4Mma1Sm128x128x256,
    /// NVFP4 x NVFP4, one SM per MMA, 128 x 128 x 256.
    Nvf4Mma1Sm128x128x256,
    /// MXFP8 x MXFP8, two SMs per MMA (a 2x1 cluster), 256 x 256 x 128.
    Mxf8Mma2Sm256x256x128,
}

impl MxConfig {
    pub const ALL: [MxConfig; 5] = [
        MxConfig::Mxf8Mma1Sm128x128x128,
        MxConfig::Mxf8f4Mma1Sm128x128x128,
        MxConfig::Mxf4Mma1Sm128x128x256,
        MxConfig::Nvf4Mma1Sm128x128x256,
        MxConfig::Mxf8Mma2Sm256x256x128,
    ];
    /// Rows per group from which [`Self::default_for`] takes a 2-SM configuration: its MMA tile's height.
    pub const TWO_SM_MIN_ROWS_PER_GROUP: usize = 256;

    pub const fn name(self) -> &'static str {
        match self {
            MxConfig::Mxf8Mma1Sm128x128x128 => "mxf8-1sm-128x128x128",
            MxConfig::Mxf8f4Mma1Sm128x128x128 => "mxf8f4-1sm-128x128x128",
            MxConfig::Mxf4Mma1Sm128x128x256 => "mxf4-1sm-128x128x256",
            MxConfig::Nvf4Mma1Sm128x128x256 => "nvf4-1sm-128x128x256",
            MxConfig::Mxf8Mma2Sm256x256x128 => "mxf8-2sm-256x256x128",
        }
    }
    config_queries!();
    /// (activations, weights).
    pub const fn formats(self) -> (MxFormat, MxFormat) {
        match self {
            MxConfig::Mxf8Mma1Sm128x128x128 | MxConfig::Mxf8Mma2Sm256x256x128 => (MxFormat::Mxfp8, MxFormat::Mxfp8),
            MxConfig::Mxf8f4Mma1Sm128x128x128 => (MxFormat::Mxfp8, MxFormat::Mxfp4),
            MxConfig::Mxf4Mma1Sm128x128x256 => (MxFormat::Mxfp4, MxFormat::Mxfp4),
            MxConfig::Nvf4Mma1Sm128x128x256 => (MxFormat::Nvfp4, MxFormat::Nvfp4),
        }
    }
    /// The weights it takes.
    pub const fn weights(self) -> MxFormat {
        self.formats().1
    }
    /// The MMA tile (M, N, K); a 2-SM MMA's M spans both SMs of its cluster (128 rows each).
    pub const fn tile(self) -> (usize, usize, usize) {
        match self {
            MxConfig::Mxf8Mma1Sm128x128x128 | MxConfig::Mxf8f4Mma1Sm128x128x128 => (128, 128, 128),
            MxConfig::Mxf4Mma1Sm128x128x256 | MxConfig::Nvf4Mma1Sm128x128x256 => (128, 128, 256),
            MxConfig::Mxf8Mma2Sm256x256x128 => (256, 256, 128),
        }
    }
    /// SMs per MMA: 1, or 2 (`tcgen05` `cta_group::2`).
    pub const fn sms_per_mma(self) -> usize {
        self.tile().0 / 128
    }
    /// The thread-block cluster (M, N): (SMs per MMA, 1), static in the kernel type.
    pub const fn cluster(self) -> (usize, usize) {
        (self.sms_per_mma(), 1)
    }
    /// The 1-SM configuration of `activations x weights`.
    ///
    /// # Errors
    /// [`Error::KernelNotBuilt`] for a pair with none, saying why (FP8 x NVFP4: the CUTLASS 4.2 builder refuses
    /// it).
    pub fn for_formats(activations: MxFormat, weights: MxFormat) -> Result<MxConfig> {
        let pair = |c: &MxConfig| c.formats() == (activations, weights) && c.sms_per_mma() == 1;
        if let Some(c) = MxConfig::ALL.into_iter().find(pair) {
            return Ok(c);
        }
        let why = match (activations, weights) {
            (MxFormat::Mxfp8, MxFormat::Nvfp4) => {
                "MXFP8 x NVFP4: the CUTLASS 4.2 builder refuses FP8 x NVFP4 (UE4M3 scales exist only for 4-bit x \
                 4-bit under kind::mxf4nvf4; FP8 x FP4 runs only under kind::mxf8f6f4 with UE8M0 per 32: use MXFP4 \
                 weights)"
            }
            (a, b) if (a == MxFormat::Nvfp4) != (b == MxFormat::Nvfp4) => {
                "A and B of different scale types (UE4M3 x UE8M0): CUTLASS needs one scale type and block for both"
            }
            _ => "FP4 activations x FP8 weights: not compiled (kind::mxf8f6f4 could run it; no instantiation is built)",
        };
        Err(Error::KernelNotBuilt { op: OP, dtype: None, config: Some(why.into()) })
    }
    /// The 2-SM configuration of `activations x weights`, if one is compiled (MXFP8 x MXFP8 only).
    pub fn two_sm(activations: MxFormat, weights: MxFormat) -> Option<MxConfig> {
        MxConfig::ALL.into_iter().find(|c| c.formats() == (activations, weights) && c.sms_per_mma() == 2)
    }
    /// The plan's default for `groups` groups of `[n, k]` over `max_rows` rows: the 2-SM configuration when the
    /// pair has one, N is whole 256-wide tiles and the rows per group (`max_rows / groups`: the masked layout's
    /// `max_m`, the contiguous layout's mean) fill its 256-row MMA tile ([`Self::TWO_SM_MIN_ROWS_PER_GROUP`]);
    /// the 1-SM one otherwise. Below 256 rows a group leaves rows of the pair's tile idle where 128-row tiles
    /// leave at most 127, and the smaller 1-SM tiles keep more SMs busy on small groups. Not measured: no SM100
    /// GPU has run either.
    ///
    /// # Errors
    /// As [`Self::for_formats`].
    pub fn default_for(
        activations: MxFormat,
        weights: MxFormat,
        groups: usize,
        n: usize,
        max_rows: usize,
    ) -> Result<MxConfig> {
        let one = MxConfig::for_formats(activations, weights)?;
        Ok(match MxConfig::two_sm(activations, weights) {
            Some(two) if n % two.tile().1 == 0 && max_rows / groups.max(1) >= Self::TWO_SM_MIN_ROWS_PER_GROUP => two,
            _ => one,
        })
    }
    pub fn is_built(self) -> bool {
        launch::built(self.into())
    }
}

variants_into!(MxConfig => launch::Sm100MxConfig {
    Mxf8Mma1Sm128x128x128, Mxf8f4Mma1Sm128x128x128, Mxf4Mma1Sm128x128x256, Nvf4Mma1Sm128x128x256, Mxf8Mma2Sm256x256x128
});

/// The rules of a plan of `activations x weights` over `shape` that every configuration of the pair shares, and
/// the portable GEMM too (it accepts the same problems): the pair's 1-SM configuration, the one these rules are of.
///
/// # Errors
/// As [`GroupedGemmMx::for_device`], but for the device.
pub(super) fn check_plan(activations: MxFormat, weights: MxFormat, shape: MxShape) -> Result<MxConfig> {
    let MxShape { groups, n, k, max_rows } = shape;
    let config = MxConfig::for_formats(activations, weights)?;
    for (name, v) in [("N", n), ("K", k)] {
        if v == 0 || v % MX_K_MULTIPLE != 0 {
            let why = match (name, config) {
                ("N", _) => "whole 128-wide MMA tiles of N".to_string(),
                (_, MxConfig::Mxf8f4Mma1Sm128x128x128) => {
                    "whole 4 x 32 scale atoms of K; a 4-bit operand under kind::mxf8f6f4 needs 128-element rows".into()
                }
                (_, MxConfig::Nvf4Mma1Sm128x128x256) => {
                    "NVFP4's 4 x 16 scale atoms would take K in 64s, but the plan keeps the MX formats' whole 128s \
                     until a partial K tile of these kernels has run"
                        .into()
                }
                _ => format!("whole 4 x {} scale atoms of K", activations.block()),
            };
            return Err(Error::InvalidProblem(format!(
                "MX grouped GEMM: {name} = {v} is not a positive multiple of 128 ({why})"
            )));
        }
    }
    check_fp8_extents(groups, n, k, max_rows)?;
    Ok(config)
}

/// A plan's shape: `groups` experts of `[n, k]` over at most `max_rows` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MxShape {
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
}

impl MxShape {
    /// The launch descriptor of `config` over this shape on `device`, N in whole `tile_n`s.
    pub(super) fn plan(
        self,
        config: MxConfig,
        tile_n: usize,
        device: &DeviceInfo,
        workspace_bytes: u64,
    ) -> launch::MxPlan {
        let MxShape { groups, n, k, max_rows } = self;
        let (device, sm_count) = (device.ordinal as i32, device.sm_count);
        launch::MxPlan { config: config.into(), groups, n, k, max_rows, tile_n, device, sm_count, workspace_bytes }
    }
}

/// The launch's operands for a plan of `formats` and `shape`, checked: the formats and shapes of `a` and `b`.
///
/// # Errors
/// [`Error::InvalidProblem`] when `a` or `b` is not of the plan's formats or shape.
pub(super) fn operands<'a>(
    formats: (MxFormat, MxFormat),
    shape: MxShape,
    a: MxRows<'a>,
    b: MxWeights<'a>,
) -> Result<launch::MxOperands<'a>> {
    if (a.format(), b.format()) != formats {
        return Err(Error::InvalidProblem(format!(
            "MX grouped GEMM planned for {:?} x {:?}, launched with {:?} x {:?}",
            formats.0,
            formats.1,
            a.format(),
            b.format()
        )));
    }
    let MxShape { groups, n, k, max_rows } = shape;
    let (am, ak, ag) = a.shape();
    let (be, bn, bk) = b.shape();
    if (am, ak, ag) != (max_rows, k, groups) || (be, bn, bk) != (groups, n, k) {
        return Err(Error::InvalidProblem(format!(
            "MX operands: A [{am}, {ak}] over {ag} groups, B [{be}, {bn}, {bk}], for a plan of {groups} groups of \
             [{n}, {k}] over {max_rows} rows"
        )));
    }
    let (aq, sfa, sfa_bases, sa) = match a {
        MxRows::Mxfp8(a) => (MxData::E4m3(a.q()), a.sf(), a.sf_bases(), None),
        MxRows::Mxfp4(a) => (MxData::E2m1(a.q()), a.sf(), a.sf_bases(), None),
        MxRows::Nvfp4(a) => (MxData::E2m1(a.q()), a.sf(), a.sf_bases(), Some(a.tensor_scale())),
    };
    let (bq, sfb, sb) = match b {
        MxWeights::Mxfp8(w) => (MxData::E4m3(w.q()), w.sf(), None),
        MxWeights::Mxfp4(w) => (MxData::E2m1(w.q()), w.sf(), None),
        MxWeights::Nvfp4(w) => (MxData::E2m1(w.q()), w.sf(), Some(w.tensor_scales())),
    };
    let tensor_scales = sa.zip(sb);
    Ok(launch::MxOperands { a: aq, sfa, sfa_bases, b: bq, sfb, tensor_scales })
}

/// An operand of a launch in one of the three formats (`$t8`, `$t4`, `$nv`), with its format and `$shape`
/// (`$x` the operand): one enum and the same two matches for the activations and the weights.
macro_rules! mx_operand {
    ($(#[$doc:meta])* $name:ident($t8:ty, $t4:ty, $nv:ty), $(#[$shape_doc:meta])* |$x:ident| $shape:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub enum $name<'a> {
            Mxfp8(&'a $t8),
            Mxfp4(&'a $t4),
            Nvfp4(&'a $nv),
        }

        impl $name<'_> {
            pub fn format(&self) -> MxFormat {
                match self {
                    $name::Mxfp8(_) => MxFormat::Mxfp8,
                    $name::Mxfp4(_) => MxFormat::Mxfp4,
                    $name::Nvfp4(_) => MxFormat::Nvfp4,
                }
            }
            $(#[$shape_doc])*
            fn shape(&self) -> (usize, usize, usize) {
                match self {
                    $name::Mxfp8($x) => $shape,
                    $name::Mxfp4($x) => $shape,
                    $name::Nvfp4($x) => $shape,
                }
            }
        }
    };
}

mx_operand!(
    /// The activations of a launch.
    MxRows(Mxfp8Rows, Mxfp4Rows, Nvfp4Rows),
    /// (max_rows, K, groups).
    |a| (a.max_rows(), a.k(), a.groups())
);
mx_operand!(
    /// The expert weights of a launch.
    MxWeights(Mxfp8Weights, Mxfp4Weights, Nvfp4Weights),
    /// (experts, N, K).
    |w| (w.experts(), w.n(), w.k())
);

/// A block-scaled grouped GEMM planned for one pair of formats, one shape and one SM100 device.
#[derive(Debug)]
pub struct GroupedGemmMx {
    groups: usize,
    n: usize,
    k: usize,
    max_rows: usize,
    config: MxConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
}

impl GroupedGemmMx {
    mx_planners! {
        /// Plans for an already queried device, with the configuration [`MxConfig::default_for`] picks (2-SM for
        /// prefill shapes; [`Self::with_config`] overrides it).
        ///
        /// # Errors
        /// [`Error::KernelNotBuilt`] for a pair of formats with no kernel ([`MxConfig::for_formats`]: FP8 x NVFP4
        /// among them); [`Error::InvalidProblem`] for `n` or `k` not positive multiples of 128 (whole 128-wide MMA
        /// tiles of N and whole scale atoms of K; for MXFP4 weights under FP8 activations also CUTLASS's
        /// 128-element rows of a 4-bit operand under `kind::mxf8f6f4`: gpt-oss's K = 2880 is refused here; pad it
        /// to 2944, exactly, with [`crate::quant::Mxfp4::pad_k`] or
        /// [`GptOssMxfp4Experts::padded_for_sm100`](crate::checkpoint::GptOssMxfp4Experts::padded_for_sm100))
        /// and the extents of [`crate::kernels::grouped_fp8::GroupedGemmFp8Shape::new`];
        /// [`Error::UnsupportedArch`] naming the device and the arch the kernels need (SM100) on any other device.
        fn for_device(device, activations, weights, groups, n, k, max_rows) {
            check_plan(activations, weights, MxShape { groups, n, k, max_rows })?;
            device.require(OP, KernelFamily::GroupedGemmSm100)?;
            let config = MxConfig::default_for(activations, weights, groups, n, max_rows)?;
            Self::planned(GroupedGemmMx { groups, n, k, max_rows, config, device, workspace_bytes: 0 })
        }
    }

    /// The same plan with `config` in place of [`MxConfig::default_for`]'s choice, e.g. the 1-SM or the 2-SM
    /// kernel of the plan's formats.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `config` takes other formats than the plan's, or (a 2-SM configuration)
    /// when N is not a multiple of its 256-wide MMA tile; [`Error::KernelNotBuilt`] when it was not compiled.
    pub fn with_config(self, config: MxConfig) -> Result<Self> {
        if config.formats() != self.config.formats() {
            return Err(Error::InvalidProblem(format!(
                "MX grouped GEMM planned for {:?} x {:?}: {} takes {:?} x {:?}",
                self.config.formats().0,
                self.config.formats().1,
                config.name(),
                config.formats().0,
                config.formats().1
            )));
        }
        Self::planned(GroupedGemmMx { config, ..self })
    }

    /// Checks what `p.config` needs beyond the 1-SM rules (whole MMA tiles of N) and sizes its workspace.
    fn planned(mut p: GroupedGemmMx) -> Result<Self> {
        let (tile_m, tile_n, _) = p.config.tile();
        if p.n % tile_n != 0 {
            return Err(Error::InvalidProblem(format!(
                "MX grouped GEMM: N = {} is not a multiple of {tile_n}: {} ({} SMs per {tile_m}x{tile_n} MMA tile) \
                 takes whole {tile_n}-wide MMA tiles of N",
                p.n,
                p.config.name(),
                p.config.sms_per_mma()
            )));
        }
        if !p.config.is_built() {
            return Err(Error::KernelNotBuilt { op: OP, dtype: None, config: Some(p.config.name().into()) });
        }
        p.workspace_bytes = launch::workspace_bytes(p.config.into(), p.groups, p.device.sm_count)?;
        Ok(p)
    }

    pub fn config(&self) -> MxConfig {
        self.config
    }
    /// Rows of A (and D) the plan reads.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes as usize
    }
    /// Allocates a zeroed workspace of [`Self::workspace_bytes`] on `stream` (outside the launch path).
    ///
    /// # Errors
    /// Driver errors of the allocation.
    pub fn alloc_workspace(&self, stream: &Arc<CudaStream>) -> Result<Workspace> {
        Workspace::zeroed(stream, self.workspace_bytes())
    }

    grouped_launch! {
        /// Queues `D = alpha_g · A · Bᵀ` with both operands' block scales over the groups `rows` describes.
        ///
        /// # Errors
        /// [`Error::InvalidProblem`] when `a` or `b` is not of the plan's formats or shape; [`Error::Buffer`] for
        /// short or misaligned buffers; [`Error::WorkspaceTooSmall`]; launch errors.
        fn launch(&self, stream, a: MxRows<'_>, b: MxWeights<'_>, rows, d: bf16, workspace: &mut Workspace, status) {
            let shape = MxShape { groups: self.groups, n: self.n, k: self.k, max_rows: self.max_rows };
            let ops = operands(self.config.formats(), shape, a, b)?;
            let plan = shape.plan(self.config, self.config.tile().1, &self.device, self.workspace_bytes);
            let rows = rows.into();
            launch::launch(stream, &plan, ops, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
        }
    }
}

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only).
///
/// # Errors
/// [`Error::KernelNotBuilt`] for a configuration not compiled; the query's errors.
pub(crate) fn workspace_bytes(config: MxConfig, groups: usize, sm_count: usize) -> Result<usize> {
    if !config.is_built() {
        return Err(Error::KernelNotBuilt { op: OP, dtype: None, config: Some(config.name().into()) });
    }
    let sm = sm_count.min(i32::MAX as usize) as i32;
    Ok(launch::workspace_bytes(config.into(), groups, sm)? as usize)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A described device of compute capability `cc` (no GPU needed).
    pub(in crate::kernels) fn device(cc: (i32, i32), name: &str) -> DeviceInfo {
        DeviceInfo::described(name, cc, 148)
    }

    #[test]
    fn plans_on_sm100_and_refuses_hopper_naming_both() {
        let b200 = device((10, 0), "NVIDIA B200");
        for c in MxConfig::ALL {
            let (a, w) = c.formats();
            let plan = GroupedGemmMx::for_device(b200.clone(), a, w, 256, 4096, 7168, 4096).unwrap();
            let plan = plan.with_config(c).unwrap();
            assert_eq!((plan.config(), c.weights()), (c, w));
            assert!(plan.workspace_bytes() > 0);
        }
        let h200 = device((9, 0), "NVIDIA H200");
        match GroupedGemmMx::for_device(h200, MxFormat::Mxfp8, MxFormat::Mxfp8, 256, 4096, 7168, 4096) {
            Err(e @ Error::UnsupportedArch { .. }) => {
                let m = e.to_string();
                assert!(m.contains("H200") && m.contains("grouped_gemm_sm100_mx"), "{m}");
            }
            other => panic!("expected UnsupportedArch, got {other:?}"),
        }
        // gpt-oss's K = 2880 under MXFP4 weights: refused, naming the 4-bit operand's rule.
        let e = GroupedGemmMx::for_device(b200, MxFormat::Mxfp8, MxFormat::Mxfp4, 128, 5760, 2880, 64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("K = 2880 is not a positive multiple of 128") && e.contains("4-bit operand"), "{e}");
    }
}
