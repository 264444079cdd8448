//! The persistent bf16/f16 grouped GEMMs with device-side groups: SM90 (`cpp/dense/grouped_gemm_sm90.cuh`) and SM100
//! (`cpp/dense/grouped_gemm_sm100.cuh`, `cpp/dense/launch_sm100.h`). Whether a configuration was built, its workspace (and
//! for SM100 its compile-time facts), and the launch (our prepare kernel, then CUTLASS's), one checked path for
//! both families: they take the same operands and group descriptions.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ffi::bridge::ffi;
use crate::ffi::gemm::GroupedRows;
use crate::ffi::status::{check, Launched};
use crate::ffi::sys;
use crate::ffi::{dtype, need_aligned, need_len, need_row_len, to_i32, to_i64};

pub(crate) use sys::{Sm100KernelFacts, Sm100TileConfig, TileConfig};

/// Whether (`dtype`, `config`) was compiled into the library.
pub(crate) fn built(d: DType, config: TileConfig) -> bool {
    ffi::grouped_gemm_sm90_built(dtype(d), config)
}

/// Whether the SM100 (`dtype`, `config`) was compiled into the library.
pub(crate) fn built_sm100(d: DType, config: Sm100TileConfig) -> bool {
    ffi::grouped_gemm_sm100_built(dtype(d), config)
}

const OP_SM100: &str = "grouped_gemm_sm100";

/// Compile-time facts of a built SM100 (`dtype`, `config`), read from its CUTLASS types (host only).
pub(crate) fn facts_sm100(d: DType, config: Sm100TileConfig) -> Result<Sm100KernelFacts> {
    let mut f = Sm100KernelFacts::default();
    let s = ffi::grouped_gemm_sm100_facts(dtype(d), config, &mut f);
    check(s, &Launched { config: Some(&config), ..Launched::typed(OP_SM100, d) })?;
    Ok(f)
}

/// Bytes of device workspace an SM100 launch of `groups` groups needs on a device of `sm_count` SMs.
pub(crate) fn workspace_bytes_sm100(d: DType, config: Sm100TileConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let s = ffi::grouped_gemm_sm100_workspace(dtype(d), config, to_i32("groups", groups)?, sm_count, &mut bytes);
    check(s, &Launched { config: Some(&config), ..Launched::typed("grouped_gemm_sm100 workspace", d) })?;
    Ok(bytes)
}

/// Which family's kernel a plan launches, with its configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) enum GroupedKernel {
    Sm90(TileConfig),
    Sm100(Sm100TileConfig),
}

impl GroupedKernel {
    fn op(self) -> &'static str {
        match self {
            GroupedKernel::Sm90(_) => "grouped_gemm_sm90",
            GroupedKernel::Sm100(_) => OP_SM100,
        }
    }
}

/// Bytes of device workspace a launch of `groups` groups needs on a device of `sm_count` SMs.
pub(crate) fn workspace_bytes(d: DType, config: TileConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let s = ffi::grouped_gemm_sm90_workspace(dtype(d), config, to_i32("groups", groups)?, sm_count, &mut bytes);
    check(s, &Launched { config: Some(&config), ..Launched::typed("grouped_gemm_sm90 workspace", d) })?;
    Ok(bytes)
}

/// Everything a launch needs besides its buffers, fixed by a plan: the shape (`groups` matrices `[n, k]` of B,
/// at most `max_rows` rows of A and D), the kernel and configuration, and the device it was planned for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupedPlan {
    pub kernel: GroupedKernel,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

/// Queues `prepare_groups` and the CUTLASS grouped GEMM of `plan.kernel` on `stream`.
#[allow(clippy::too_many_arguments)] // one argument per buffer: bundling them would hide which guard is which
pub(crate) fn launch<T: Element>(
    stream: &CudaStream,
    plan: &GroupedPlan,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<T>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let op = plan.kernel.op();
    let ordinal = stream.context().ordinal();
    if ordinal as i64 != plan.device as i64 {
        return Err(Error::InvalidProblem(format!(
            "{op}: planned for device {} launched on a stream of device {ordinal}",
            plan.device
        )));
    }
    let (groups_max, n, k, max_rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
    need_row_len::<T>("N", n)?;
    need_row_len::<T>("K", k)?;
    let (mode, offsets, counts, max_m) = match rows {
        GroupedRows::Offsets(o) => (sys::GroupMode::Offsets, Some(o), None, 0usize),
        GroupedRows::Padded { offsets, counts } => (sys::GroupMode::Padded, Some(offsets), Some(counts), 0),
        GroupedRows::Masked { masked_m, max_m } => (sys::GroupMode::Masked, None, Some(masked_m), max_m),
        GroupedRows::PerRow { experts, .. } => (sys::GroupMode::PerRow, None, Some(experts), 0),
    };
    // What A and B must hold, and how many groups this launch runs.
    let (a_rows, b_mats, groups, a_div, num_experts) = match rows {
        GroupedRows::PerRow { rows, a_div, num_experts, .. } => {
            if rows > groups_max || rows > max_rows || a_div == 0 || num_experts == 0 {
                return Err(Error::InvalidProblem(format!(
                    "per-row groups: rows = {rows} must be <= the plan's groups ({groups_max}) and max_rows ({max_rows}), a_div = {a_div} and num_experts = {num_experts} positive"
                )));
            }
            (rows.div_ceil(a_div), num_experts, rows, a_div, num_experts)
        }
        _ => (max_rows, groups_max, groups_max, 1, groups_max),
    };
    need_len("a", a.len(), a_rows * k, "rows of A x K")?;
    need_len("b", b.len(), b_mats * n * k, "matrices x N x K")?;
    if let Some(o) = offsets {
        need_len("offsets", o.len(), groups_max + 1, "G + 1")?;
    }
    if let Some(c) = counts {
        need_len("counts", c.len(), groups, "groups")?;
    }
    if mode == sys::GroupMode::Masked && groups_max * max_m > max_rows {
        return Err(Error::Buffer {
            name: "masked_m",
            detail: format!("G x max_m = {groups_max} x {max_m} exceeds the plan's max_rows = {max_rows}"),
        });
    }
    need_len("d", d.len(), max_rows * n, "max_rows x N")?;
    let workspace_bytes = workspace.len() as u64;
    if workspace_bytes < plan.workspace_bytes {
        return Err(Error::WorkspaceTooSmall { op, needed: plan.workspace_bytes, got: workspace_bytes });
    }
    let (max_m, a_div, experts, groups) =
        (to_i32("max_m", max_m)?, to_i32("a_div", a_div)?, to_i32("experts", num_experts)?, to_i32("groups", groups)?);
    let max_rows = to_i64("max_rows", max_rows)?;
    crate::ffi::bind(stream)?;
    // The guards make `stream` wait for earlier writers of each buffer and record this use; they must outlive
    // the C++ call that queues the kernels, so they are bound to named locals.
    let (a_ptr, _a_guard) = a.device_ptr(stream);
    let (b_ptr, _b_guard) = b.device_ptr(stream);
    let (o_ptr, _o_guard) = offsets.map(|o| o.device_ptr(stream)).unzip();
    let (c_ptr, _c_guard) = counts.map(|c| c.device_ptr(stream)).unzip();
    let (d_ptr, _d_guard) = d.device_ptr_mut(stream);
    let (w_ptr, _w_guard) = workspace.device_ptr_mut(stream);
    let (s_ptr, _s_guard) = status.device_ptr_mut(stream);
    for (name, p) in [("a", a_ptr), ("b", b_ptr), ("d", d_ptr)] {
        need_aligned(name, p)?;
    }
    let (n, k, stream_u64) = (to_i32("n", n)?, to_i32("k", k)?, stream.cu_stream() as u64);
    let (offsets, counts) = (o_ptr.unwrap_or(0), c_ptr.unwrap_or(0));
    let (device, sm_count) = (plan.device, plan.sm_count);
    // Why both calls below are sound: every address is a live cudarc allocation, checked above to hold what the
    // plan's shape implies (A max_rows*K or the per-row tokens, B G*N*K or num_experts matrices, D max_rows*N,
    // offsets G+1 / counts per group where the mode reads them, G*max_m <= max_rows, per-row groups <= G and
    // max_rows, workspace >= the size C++ asked for for G >= the groups launched, status one u32); A/B/D bases
    // are 16-byte aligned and K, N multiples of the element type's 16-byte alignment (checked), so every group
    // base is too. Offsets and counts are device data the kernel clamps into [0, max_rows] and each group's
    // room. The stream's context is bound to this thread. The guards keep the buffers ordered on `stream`, and
    // the borrows keep them alive until this function returns; cudarc frees memory stream-ordered, so queued work
    // never outlives its buffers. Both args structs are C++'s own (`sys`), read by the C++ side as written.
    let status = match plan.kernel {
        GroupedKernel::Sm90(config) => {
            let args = sys::GroupedGemmArgs {
                dtype: dtype(T::DTYPE),
                config,
                mode,
                max_m,
                a_div,
                experts,
                groups,
                n,
                k,
                max_rows,
                a: a_ptr,
                b: b_ptr,
                d: d_ptr,
                offsets,
                counts,
                workspace: w_ptr,
                workspace_bytes,
                status: s_ptr,
                device,
                sm_count,
                stream: stream_u64,
            };
            // SAFETY: the argument above, for the SM90 kernel.
            unsafe { ffi::grouped_gemm_sm90_run(&args) }
        }
        GroupedKernel::Sm100(config) => {
            let args = sys::GroupedGemmSm100Args {
                dtype: dtype(T::DTYPE),
                config,
                mode,
                max_m,
                a_div,
                experts,
                groups,
                n,
                k,
                max_rows,
                a: a_ptr,
                b: b_ptr,
                d: d_ptr,
                offsets,
                counts,
                workspace: w_ptr,
                workspace_bytes,
                status: s_ptr,
                device,
                sm_count,
                stream: stream_u64,
            };
            // SAFETY: the argument above, for the SM100 kernel (the same operands and group arrays).
            unsafe { ffi::grouped_gemm_sm100_run(&args) }
        }
    };
    let config: &dyn std::fmt::Debug = match &plan.kernel {
        GroupedKernel::Sm90(c) => c,
        GroupedKernel::Sm100(c) => c,
    };
    check(status, &Launched { config: Some(config), workspace_bytes, ..Launched::typed(op, T::DTYPE) })
}
