//! What every grouped GEMM launch and the grouped quantisers share: the group arrays a launch reads, and their
//! checks. Plain descriptors of device buffers and extents; the callers build them from their own types.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};
use float8::F8E4M3;
use half::bf16;

use super::status::{check, Launched};
use super::sys;
use super::{need_aligned, need_f32_aligned, need_len, to_i32, to_i64};
use crate::error::{Error, Result};

/// Where each group's rows are (mirrors `GroupMode` in `cpp/common/launch.h`): device arrays the prepare kernel reads
/// and clamps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum GroupedRows<'a> {
    /// int32 `[groups + 1]`: group g owns rows `offsets[g] .. offsets[g+1]`.
    Offsets(&'a CudaView<'a, i32>),
    /// Group g starts at `offsets[g]` (`[groups + 1]`) and holds `counts[g]` rows (`[groups]`).
    Padded { offsets: &'a CudaView<'a, i32>, counts: &'a CudaView<'a, i32> },
    /// Group g owns rows `g·max_m .. g·max_m + masked_m[g]` (`[groups]`).
    Masked { masked_m: &'a CudaView<'a, i32>, max_m: usize },
    /// One group per D row `r < rows`: A row `r / a_div` times B[`experts[r]`]ᵀ, B holding `num_experts`
    /// matrices.
    PerRow { experts: &'a CudaView<'a, i32>, rows: usize, a_div: usize, num_experts: usize },
}

/// A launch's group arrays, checked against the plan's `groups` and `max_rows` by [`group_rows`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupArrays<'a> {
    pub mode: sys::GroupMode,
    pub offsets: Option<&'a CudaView<'a, i32>>,
    pub counts: Option<&'a CudaView<'a, i32>>,
    pub max_m: usize,
}

/// The group arrays of `rows` for a plan of `groups` groups over `max_rows` rows, checked: offsets `[G + 1]`,
/// counts `[G]`, `G · max_m <= max_rows`. Per-row groups are refused (only the dense family offers them, and
/// checks them itself).
pub(crate) fn group_rows<'a>(rows: GroupedRows<'a>, groups: usize, max_rows: usize) -> Result<GroupArrays<'a>> {
    let (mode, offsets, counts, max_m) = match rows {
        GroupedRows::Offsets(o) => (sys::GroupMode::Offsets, Some(o), None, 0usize),
        GroupedRows::Padded { offsets, counts } => (sys::GroupMode::Padded, Some(offsets), Some(counts), 0),
        GroupedRows::Masked { masked_m, max_m } => (sys::GroupMode::Masked, None, Some(masked_m), max_m),
        GroupedRows::PerRow { .. } => {
            return Err(Error::InvalidProblem(
                "FP8 grouped GEMM: per-row groups are not offered (use offsets, padded or masked groups)".into(),
            ))
        }
    };
    let arrays = GroupArrays { mode, offsets, counts, max_m };
    arrays.check(groups, groups, max_rows)?;
    Ok(arrays)
}

impl GroupArrays<'_> {
    /// Offsets hold `G + 1` (the plan's `groups`), counts one per launched group (`launched`), and masked
    /// groups fit in `max_rows`.
    pub(crate) fn check(&self, groups: usize, launched: usize, max_rows: usize) -> Result<()> {
        if let Some(o) = self.offsets {
            need_len("offsets", o.len(), groups + 1, "G + 1")?;
        }
        if let Some(c) = self.counts {
            need_len("counts", c.len(), launched, "groups")?;
        }
        if self.mode == sys::GroupMode::Masked && groups * self.max_m > max_rows {
            return Err(Error::Buffer {
                name: "masked_m",
                detail: format!("G x max_m = {groups} x {} exceeds the plan's max_rows = {max_rows}", self.max_m),
            });
        }
        Ok(())
    }
}

/// Everything a launch needs besides its buffers, fixed by a plan: the shape (`groups` matrices `[n, k]` of B,
/// at most `max_rows` rows of A and D), the kernel's configuration `C` and the device it was planned for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmPlan<C> {
    pub config: C,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

impl<C> GemmPlan<C> {
    /// Refuses a stream of another device than the plan's; `what` opens the message.
    pub(crate) fn check_device(&self, stream: &CudaStream, what: std::fmt::Arguments<'_>) -> Result<()> {
        let ordinal = stream.context().ordinal();
        if ordinal as i64 != self.device as i64 {
            return Err(Error::InvalidProblem(format!(
                "{what} planned for device {} launched on a stream of device {ordinal}",
                self.device
            )));
        }
        Ok(())
    }

    /// The bytes of `workspace`, refused when fewer than the plan's.
    pub(crate) fn check_workspace(&self, op: &'static str, workspace: &CudaSlice<u8>) -> Result<u64> {
        let got = workspace.len() as u64;
        if got < self.workspace_bytes {
            return Err(Error::WorkspaceTooSmall { op, needed: self.workspace_bytes, got });
        }
        Ok(got)
    }

    /// The plan's extents as the C++ argument structs take them: (max_m, groups, N, K, max_rows).
    pub(crate) fn extents(&self, max_m: usize) -> Result<(i32, i32, i32, i32, i64)> {
        let (max_m, groups) = (to_i32("max_m", max_m)?, to_i32("groups", self.groups)?);
        Ok((max_m, groups, to_i32("N", self.n)?, to_i32("K", self.k)?, to_i64("max_rows", self.max_rows)?))
    }
}

impl<'a> GroupArrays<'a> {
    /// The device addresses of the offsets and counts (0 where the mode reads none), with the guards that order
    /// them on `stream`: bind the guards to a named local until the C++ call has returned.
    pub(crate) fn device_ptrs(self, stream: &'a CudaStream) -> ((u64, u64), GroupGuards<'a>) {
        let (o_ptr, o_guard) = self.offsets.map(|o| o.device_ptr(stream)).unzip();
        let (c_ptr, c_guard) = self.counts.map(|c| c.device_ptr(stream)).unzip();
        ((o_ptr.unwrap_or(0), c_ptr.unwrap_or(0)), (o_guard, c_guard))
    }
}

/// The stream-ordering guards of a launch's offsets and counts.
pub(crate) type GroupGuards<'s> = (Option<SyncOnDrop<'s>>, Option<SyncOnDrop<'s>>);

/// e4m3 operand data on the device: A or B of a scaled FP8 GEMM.
pub(crate) trait E4m3Buffer: DevicePtr<F8E4M3> {}
impl<T: DevicePtr<F8E4M3>> E4m3Buffer for T {}

/// f32 dequantisation multipliers on the device: SA or SB of a scaled FP8 GEMM.
pub(crate) trait ScaleBuffer: DevicePtr<f32> {}
impl<T: DevicePtr<f32>> ScaleBuffer for T {}

/// The buffers of one scaled FP8 grouped GEMM (blockwise or rowwise): e4m3 A and B and their f32 dequantisation
/// multipliers, in the grids of the family's docs.
pub(crate) struct ScaledOperands<'a, A, SA, B, SB> {
    pub a: &'a A,
    pub sa: &'a SA,
    pub b: &'a B,
    pub sb: &'a SB,
}

impl<A: E4m3Buffer, SA: ScaleBuffer, B: E4m3Buffer, SB: ScaleBuffer> ScaledOperands<'_, A, SA, B, SB> {
    /// A holds `max_rows x K`, B `G x N x K`, D `max_rows x N`, the scales what the family's grid needs
    /// (`(elements, what)` each).
    pub(crate) fn check_lens<C>(
        &self,
        plan: &GemmPlan<C>,
        sa: (usize, &str),
        sb: (usize, &str),
        d: usize,
    ) -> Result<()> {
        let (g, n, k, rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
        need_len("a", self.a.len(), rows * k, "max_rows x K")?;
        need_len("sa", self.sa.len(), sa.0, sa.1)?;
        need_len("b", self.b.len(), g * n * k, "G x N x K")?;
        need_len("sb", self.sb.len(), sb.0, sb.1)?;
        need_len("d", d, rows * n, "max_rows x N")
    }

    /// The launch of `plan` (named `op`) bound: `workspace` checked against the plan, the plan's extents as C++
    /// takes them, the stream's context bound to this thread, and the device addresses of the buffers on
    /// `stream`, each with the guard that makes `stream` wait for its earlier writers and records this use: keep
    /// the result alive until the C++ call has returned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind<'s, C>(
        &'s self,
        stream: &'s CudaStream,
        plan: &GemmPlan<C>,
        op: &'static str,
        arrays: GroupArrays<'s>,
        d: &'s mut impl DevicePtrMut<bf16>,
        workspace: &'s mut CudaSlice<u8>,
        status: &'s mut impl DevicePtrMut<u32>,
    ) -> Result<ScaledPtrs<'s>> {
        let workspace_bytes = plan.check_workspace(op, workspace)?;
        let extents = plan.extents(arrays.max_m)?;
        super::bind(stream)?;
        let (a, ga) = self.a.device_ptr(stream);
        let (sa, gsa) = self.sa.device_ptr(stream);
        let (b, gb) = self.b.device_ptr(stream);
        let (sb, gsb) = self.sb.device_ptr(stream);
        let ((offsets, counts), groups) = arrays.device_ptrs(stream);
        let (d, gd) = d.device_ptr_mut(stream);
        let (workspace, gw) = workspace.device_ptr_mut(stream);
        let (status, gs) = status.device_ptr_mut(stream);
        Ok(ScaledPtrs {
            extents,
            a,
            sa,
            b,
            sb,
            d,
            offsets,
            counts,
            workspace,
            workspace_bytes,
            status,
            _guards: ([ga, gsa, gb, gsb, gd, gw, gs], groups),
        })
    }
}

/// The device addresses of a scaled grouped GEMM's buffers ([`ScaledOperands::bind`]) and their guards, with the
/// plan's extents (max_m, groups, N, K, max_rows) and the workspace's bytes.
pub(crate) struct ScaledPtrs<'s> {
    pub extents: (i32, i32, i32, i32, i64),
    pub a: u64,
    pub sa: u64,
    pub b: u64,
    pub sb: u64,
    pub d: u64,
    pub offsets: u64,
    pub counts: u64,
    pub workspace: u64,
    pub workspace_bytes: u64,
    pub status: u64,
    _guards: ([SyncOnDrop<'s>; 7], GroupGuards<'s>),
}

/// The C++ argument struct `$args` of a scaled FP8 grouped GEMM (blockwise or rowwise: the same fields but for
/// the names of the scale pointers, `$sa` and `$sb`) for a launch of `$plan` over groups of `$mode`, from the
/// bound buffers `$p` ([`ScaledOperands::bind`]) on `$stream`.
macro_rules! scaled_gemm_args {
    ($args:path { $sa:ident, $sb:ident }, $plan:expr, $mode:expr, $p:expr, $stream:expr) => {{
        let (plan, p) = ($plan, &$p);
        let (max_m, groups, n, k, max_rows) = p.extents;
        $args {
            config: plan.config,
            mode: $mode,
            max_m,
            groups,
            n,
            k,
            max_rows,
            a: p.a,
            $sa: p.sa,
            b: p.b,
            $sb: p.sb,
            d: p.d,
            offsets: p.offsets,
            counts: p.counts,
            workspace: p.workspace,
            workspace_bytes: p.workspace_bytes,
            status: p.status,
            device: plan.device,
            sm_count: plan.sm_count,
            stream: $stream.cu_stream() as u64,
        }
    }};
}
pub(crate) use scaled_gemm_args;

/// A family of scaled FP8 grouped GEMMs, named by its configuration type (blockwise or rowwise): what its launch
/// checks beyond what [`scaled_launch`] checks for both, and the C++ call that queues it.
pub(crate) trait ScaledFamily: Copy + std::fmt::Debug + 'static {
    /// The GEMM as errors name it.
    const WHAT: &'static str;
    /// Whether SB is read in 16-byte vectors (per-channel scales) rather than one f32 at a time.
    const SB_VECTORS: bool;
    /// The C++ unit this configuration is built into, as errors name it.
    fn op(self) -> &'static str;
    /// N and K must be positive multiples of these (what the TMA descriptors and scale grids rely on).
    const N_ALIGN: usize;
    const K_ALIGN: usize;
    /// SA's and SB's lengths for `plan`, `(elements, what)` each.
    fn scale_lens(plan: &GemmPlan<Self>) -> ((usize, &'static str), (usize, &'static str));
    /// Queues the prepare kernel and the CUTLASS GEMM over the buffers `p` bound for `plan`, groups of `mode`.
    ///
    /// # Safety
    /// `p` comes from [`ScaledOperands::bind`] for `plan` after every check of [`scaled_launch`] passed.
    unsafe fn run(plan: &GemmPlan<Self>, mode: sys::GroupMode, p: &ScaledPtrs<'_>, stream: &CudaStream) -> sys::Status;
}

/// Queues a scaled FP8 grouped GEMM of `plan` (its prepare kernel, then CUTLASS's) on `stream`, after checking
/// the device, N and K, the buffers' lengths and alignment against the plan.
pub(crate) fn scaled_launch<C: ScaledFamily, A: E4m3Buffer, SA: ScaleBuffer, B: E4m3Buffer, SB: ScaleBuffer>(
    stream: &CudaStream,
    plan: &GemmPlan<C>,
    ops: ScaledOperands<'_, A, SA, B, SB>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    plan.check_device(stream, format_args!("{}", C::WHAT))?;
    // The domain plans guarantee these; checked again so that this floor is sound on its own.
    let (n, k, na, ka) = (plan.n, plan.k, C::N_ALIGN, C::K_ALIGN);
    if n == 0 || n % na != 0 || k == 0 || k % ka != 0 {
        return Err(Error::InvalidProblem(format!(
            "{}: N = {n} must be a positive multiple of {na} and K = {k} a positive multiple of {ka}",
            C::WHAT
        )));
    }
    let arrays = group_rows(rows, plan.groups, plan.max_rows)?;
    let (sa, sb) = C::scale_lens(plan);
    ops.check_lens(plan, sa, sb, d.len())?;
    let op = plan.config.op();
    let p = ops.bind(stream, plan, op, arrays, d, workspace, status)?;
    for (name, ptr) in [("a", p.a), ("b", p.b), ("d", p.d)] {
        need_aligned(name, ptr)?;
    }
    if C::SB_VECTORS {
        need_aligned("sb", p.sb)?;
    }
    // f32 scales read one by one (cp.async of 4 bytes).
    need_f32_aligned("sa", p.sa)?;
    if !C::SB_VECTORS {
        need_f32_aligned("sb", p.sb)?;
    }
    let workspace_bytes = p.workspace_bytes;
    // SAFETY: `p` is bound for `plan` and every check above passed; each family's `run` says what that makes sound.
    let s = unsafe { C::run(plan, arrays.mode, &p, stream) };
    check(s, &Launched { config: Some(&plan.config), workspace_bytes, ..Launched::op(op) })
}
