//! SM90 persistent grouped GEMM with device-side groups.
//!
//! `D[r, :] = A[r, :] · B[g]ᵀ` for every row `r` of group `g`, where group `g` owns rows
//! `offsets[g] .. offsets[g+1]` of A and D:
//!
//! * A `[max_rows, K]` row-major: the rows of all groups back to back (e.g. tokens permuted by expert);
//! * B `[G, N, K]`: one nn.Linear weight `[out, in]` per group (expert);
//! * D `[max_rows, N]` row-major; rows at and past `offsets[G]` are never written;
//! * `offsets`: **int32 `[G + 1]` on the device**, exclusive prefix sums of the group sizes: `offsets[0] == 0`,
//!   non-decreasing, `offsets[G] <= max_rows`. Groups with zero rows cost nothing and write nothing.
//!
//! [`GroupRows`] also describes padded groups (vLLM align, DeepGEMM contiguous: start offsets plus counts), the
//! masked layout (`g·max_m` plus `masked_m[g]`) and one group per row with the expert picked by id (decode);
//! the layouts of [`crate::layouts`] produce each form on the device.
//!
//! The plan ([`GroupedGemm`]) is validated once for a shape (`G`, `N`, `K`, `max_rows`) and a device; a launch
//! queues two kernels (ours, which turns the offsets into CUTLASS's per-group arguments inside the
//! [`Workspace`], then CUTLASS's) and does nothing else on the host: no allocation, no copy, no
//! synchronisation. It can therefore be captured in a CUDA graph and replayed with new offsets.
//!
//! Invalid offsets are not trusted: the device clamps them into `[0, max_rows]` and sets a bit in the
//! caller's [`DeviceStatus`], which [`DeviceStatus::check`] turns into [`Error::DeviceCheck`].
//!
//! [`DeviceStatus`]: crate::status::DeviceStatus
//! [`DeviceStatus::check`]: crate::status::DeviceStatus::check

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

pub use crate::layouts::GroupRows;

use super::launch;
use crate::device::DeviceInfo;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::plan;
use crate::kernels::TileConfig;

/// The shape of a grouped GEMM, validated against the kernels' constraints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedGemmShape {
    groups: usize,
    n: usize,
    k: usize,
    max_rows: usize,
}

impl GroupedGemmShape {
    /// `groups` experts of weight `[n, k]`, over at most `max_rows` rows of A in total.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: `groups` in 1..=65536; `n`, `k` positive multiples of 8
    /// (rows of A, B and D must start on 16-byte boundaries for TMA); every extent and `max_rows·max(n,k)`
    /// within the kernels' 32-bit problem sizes and 64-bit addressing.
    pub fn new(groups: usize, n: usize, k: usize, max_rows: usize) -> Result<Self> {
        let bad = |s: String| Err(Error::InvalidProblem(s));
        if groups == 0 || groups > 65536 {
            return bad(format!("groups = {groups}: must be in 1..=65536"));
        }
        for (name, v) in [("N", n), ("K", k)] {
            if v == 0 {
                return bad(format!("{name} = 0: must be positive"));
            }
            if v % 8 != 0 {
                return bad(format!(
                    "{name} = {v} is not a multiple of 8: rows of 16-bit elements must be 16-byte aligned for TMA"
                ));
            }
            if v > i32::MAX as usize {
                return bad(format!("{name} = {v} exceeds i32::MAX (CUTLASS problem sizes are 32-bit)"));
            }
        }
        if max_rows > i32::MAX as usize {
            return bad(format!("max_rows = {max_rows} exceeds i32::MAX (offsets are int32)"));
        }
        if groups.checked_mul(n).and_then(|x| x.checked_mul(k)).is_none_or(|x| x > (isize::MAX as usize) / 2) {
            return bad(format!("G x N x K = {groups} x {n} x {k} overflows the address space"));
        }
        Ok(GroupedGemmShape { groups, n, k, max_rows })
    }

    shape_accessors!();
}

/// Options of a [`GroupedGemm`] plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupedGemmOptions {
    /// Force a tile configuration; `None` picks [`TileConfig::heuristic`].
    pub config: Option<TileConfig>,
    /// Expected rows in all groups together (T·k), a speed hint only: it picks the tile configuration and never
    /// changes results. Default `max_rows`. (DeepGEMM's `expected_m` is this divided by the groups.)
    pub expected_rows: Option<usize>,
}

/// A grouped GEMM planned for one shape, element type and device.
#[derive(Debug)]
pub struct GroupedGemm<T: Element> {
    shape: GroupedGemmShape,
    config: TileConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
    _t: PhantomData<T>,
}

impl<T: Element> GroupedGemm<T> {
    /// Plans the grouped GEMM on the device of `stream`.
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the family was built for the device (SM90, compute capability 9.0; see
    /// [`crate::kernels::grouped_sm100::GroupedGemmSm100`] for SM100);
    /// [`Error::KernelNotBuilt`] when the configuration was not compiled for `T`; driver errors.
    pub fn new(stream: &Arc<CudaStream>, shape: GroupedGemmShape, options: GroupedGemmOptions) -> Result<Self> {
        let device = DeviceInfo::query(stream.context())?;
        Self::for_device(device, shape, options)
    }

    /// Plans for an already queried device (no driver call).
    pub fn for_device(device: DeviceInfo, shape: GroupedGemmShape, options: GroupedGemmOptions) -> Result<Self> {
        let expected = options.expected_rows.unwrap_or(shape.max_rows);
        let config = options
            .config
            .unwrap_or_else(|| TileConfig::heuristic(shape.groups, shape.n, expected, device.sm_count.max(1) as usize));
        let workspace_bytes = plan::planned_workspace(&device, config, Some(T::DTYPE), shape.groups)?;
        Ok(GroupedGemm { shape, config, device, workspace_bytes, _t: PhantomData })
    }

    plan_accessors!(GroupedGemmShape, TileConfig);

    grouped_launch! {
        /// Queues `D = grouped(A, B)` over the groups `rows` describes (offsets `[G + 1]` convert into it) on
        /// `stream`. See the module docs for the layouts.
        ///
        /// # Errors
        /// [`Error::Buffer`] if a buffer is smaller than the plan's shape implies or not 16-byte aligned;
        /// [`Error::WorkspaceTooSmall`]; CUTLASS or CUDA launch errors. Invalid offset, count or expert-id
        /// *values* are clamped on the device and reported into `status`, read by [`DeviceStatus::check`].
        ///
        /// [`DeviceStatus::check`]: crate::status::DeviceStatus::check
        fn launch(&self, stream, a: &impl DevicePtr<T>, b: &impl DevicePtr<T>, rows,
            d: T, workspace: &mut Workspace, status) {
            let kernel = launch::GroupedKernel::Sm90(self.config.into());
            let plan = plan::launch_plan(kernel, self.shape.dims(), &self.device, self.workspace_bytes);
            let rows = rows.into();
            launch::launch(stream, &plan, a, b, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
        }
    }
}

arch_config!(TileConfig, "grouped_gemm_sm90", GroupedGemmSm90, per_dtype launch::workspace_bytes);

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only).
pub(crate) fn workspace_bytes(
    dtype: crate::dtype::DType,
    config: TileConfig,
    groups: usize,
    sm_count: usize,
) -> Result<usize> {
    Ok(launch::workspace_bytes(dtype, config.into(), groups, sm_count.min(i32::MAX as usize) as i32)? as usize)
}

pub use crate::kernels::plan::Workspace;
