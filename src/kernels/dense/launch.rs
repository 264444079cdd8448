//! The persistent bf16/f16 grouped GEMMs with device-side groups: SM90 (`cpp/dense/grouped_gemm_sm90.cuh`) and SM100
//! (`cpp/dense/grouped_gemm_sm100.cuh`, `cpp/dense/launch.h`). Their bridge, whether a configuration was built,
//! its workspace (and for SM100 its compile-time facts), and the launch (our prepare kernel, then CUTLASS's), one
//! checked path for both families: they take the same operands and group descriptions. C++ has one entry point per
//! element type; the element type picks it here. SM100 is built for bf16 only: f16 there is NotBuilt.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ffi::bridge::trivial_extern_types;
use crate::ffi::gemm::{GemmPlan, GroupArrays, GroupedRows};
use crate::ffi::status::{check, Launched, NOT_BUILT};
use crate::ffi::{dtype, need_aligned, need_len, need_row_len, to_i32, to_i64};

crate::ffi::family_sys!("dense");

pub(crate) use sys::{Sm100KernelFacts, Sm100TileConfig, TileConfig};

trivial_extern_types! { TileConfig Sm100TileConfig Sm100KernelFacts GroupedGemmArgs }

#[cxx::bridge(namespace = "moe_gemm")]
mod ffi {
    unsafe extern "C++" {
        include!("moe-gemm/cpp/dense/launch.h");

        type Status = crate::ffi::sys::Status;
        type TileConfig = crate::kernels::dense::launch::sys::TileConfig;
        type Sm100TileConfig = crate::kernels::dense::launch::sys::Sm100TileConfig;
        type Sm100KernelFacts = crate::kernels::dense::launch::sys::Sm100KernelFacts;
        type GroupedGemmArgs = crate::kernels::dense::launch::sys::GroupedGemmArgs;

        fn grouped_gemm_sm90_bf16_built(config: TileConfig) -> bool;
        fn grouped_gemm_sm90_f16_built(config: TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm90_bf16_workspace(
            config: TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm90_bf16_workspace`.
        unsafe fn grouped_gemm_sm90_f16_workspace(
            config: TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// Every address in `args` a live device allocation of the size the args imply, on the device and stream
        /// given, alive until the queued work completes; `args.dtype` bf16.
        unsafe fn grouped_gemm_sm90_bf16_run(config: TileConfig, args: &GroupedGemmArgs) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm90_bf16_run`, `args.dtype` f16.
        unsafe fn grouped_gemm_sm90_f16_run(config: TileConfig, args: &GroupedGemmArgs) -> Status;
        fn grouped_gemm_sm100_bf16_built(config: Sm100TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm100_bf16_workspace(
            config: Sm100TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// Compile-time facts of `config` (NotBuilt and `facts` untouched when it was not compiled).
        ///
        /// # Safety
        /// `facts` points to a live `Sm100KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm100_bf16_facts(config: Sm100TileConfig, facts: *mut Sm100KernelFacts) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm90_bf16_run`, on an SM100 device.
        unsafe fn grouped_gemm_sm100_bf16_run(config: Sm100TileConfig, args: &GroupedGemmArgs) -> Status;
    }
}

/// Whether (`dtype`, `config`) was compiled into the library.
pub(crate) fn built(d: DType, config: TileConfig) -> bool {
    match d {
        DType::BF16 => ffi::grouped_gemm_sm90_bf16_built(config),
        DType::F16 => ffi::grouped_gemm_sm90_f16_built(config),
    }
}

/// Whether the SM100 (`dtype`, `config`) was compiled into the library.
pub(crate) fn built_sm100(d: DType, config: Sm100TileConfig) -> bool {
    d == DType::BF16 && ffi::grouped_gemm_sm100_bf16_built(config)
}

const OP_SM100: &str = "grouped_gemm_sm100";

/// Compile-time facts of a built SM100 (`dtype`, `config`), read from its CUTLASS types (host only).
pub(crate) fn facts_sm100(d: DType, config: Sm100TileConfig) -> Result<Sm100KernelFacts> {
    let mut f = Sm100KernelFacts::default();
    // SAFETY: `f` is a live local, which the call may write (host only).
    let s = if d == DType::BF16 { unsafe { ffi::grouped_gemm_sm100_bf16_facts(config, &mut f) } } else { NOT_BUILT };
    check(s, &Launched { config: Some(&config), ..Launched::typed(OP_SM100, d) })?;
    Ok(f)
}

/// Bytes of device workspace an SM100 launch of `groups` groups needs on a device of `sm_count` SMs.
pub(crate) fn workspace_bytes_sm100(d: DType, config: Sm100TileConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let (mut bytes, groups) = (0u64, to_i32("groups", groups)?);
    let s = match d {
        // SAFETY: `bytes` is a live local, which the call writes (host only).
        DType::BF16 => unsafe { ffi::grouped_gemm_sm100_bf16_workspace(config, groups, sm_count, &mut bytes) },
        DType::F16 => NOT_BUILT,
    };
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
    let (mut bytes, groups) = (0u64, to_i32("groups", groups)?);
    // SAFETY: `bytes` is a live local, which the call writes (host only).
    let s = unsafe {
        match d {
            DType::BF16 => ffi::grouped_gemm_sm90_bf16_workspace(config, groups, sm_count, &mut bytes),
            DType::F16 => ffi::grouped_gemm_sm90_f16_workspace(config, groups, sm_count, &mut bytes),
        }
    };
    check(s, &Launched { config: Some(&config), ..Launched::typed("grouped_gemm_sm90 workspace", d) })?;
    Ok(bytes)
}

/// What a dense launch needs besides its buffers, fixed by a plan.
pub(crate) type GroupedPlan = GemmPlan<GroupedKernel>;

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
    let op = plan.config.op();
    plan.check_device(stream, format_args!("{op}:"))?;
    let (groups_max, n, k, max_rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
    need_row_len::<T>("N", n)?;
    need_row_len::<T>("K", k)?;
    let arrays = match rows {
        GroupedRows::Offsets(o) => {
            GroupArrays { mode: sys::GroupMode::Offsets, offsets: Some(o), counts: None, max_m: 0 }
        }
        GroupedRows::Padded { offsets, counts } => {
            GroupArrays { mode: sys::GroupMode::Padded, offsets: Some(offsets), counts: Some(counts), max_m: 0 }
        }
        GroupedRows::Masked { masked_m, max_m } => {
            GroupArrays { mode: sys::GroupMode::Masked, offsets: None, counts: Some(masked_m), max_m }
        }
        GroupedRows::PerRow { experts, .. } => {
            GroupArrays { mode: sys::GroupMode::PerRow, offsets: None, counts: Some(experts), max_m: 0 }
        }
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
    arrays.check(groups_max, groups, max_rows)?;
    need_len("d", d.len(), max_rows * n, "max_rows x N")?;
    let workspace_bytes = plan.check_workspace(op, workspace)?;
    let (max_m, a_div, experts, groups) = (
        to_i32("max_m", arrays.max_m)?,
        to_i32("a_div", a_div)?,
        to_i32("experts", num_experts)?,
        to_i32("groups", groups)?,
    );
    let max_rows = to_i64("max_rows", max_rows)?;
    crate::ffi::bind(stream)?;
    // The guards make `stream` wait for earlier writers of each buffer and record this use; they must outlive
    // the C++ call that queues the kernels, so they are bound to named locals.
    let (a_ptr, _a_guard) = a.device_ptr(stream);
    let (b_ptr, _b_guard) = b.device_ptr(stream);
    let ((offsets, counts), _group_guards) = arrays.device_ptrs(stream);
    let (d_ptr, _d_guard) = d.device_ptr_mut(stream);
    let (w_ptr, _w_guard) = workspace.device_ptr_mut(stream);
    let (s_ptr, _s_guard) = status.device_ptr_mut(stream);
    for (name, p) in [("a", a_ptr), ("b", b_ptr), ("d", d_ptr)] {
        need_aligned(name, p)?;
    }
    let (n, k, stream_u64) = (to_i32("n", n)?, to_i32("k", k)?, stream.cu_stream() as u64);
    let (device, sm_count, mode) = (plan.device, plan.sm_count, arrays.mode);
    // The argument struct of both arches: C++'s own (`sys`), read by the C++ side as written.
    let args = sys::GroupedGemmArgs {
        dtype: dtype(T::DTYPE),
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
    // Why both calls below are sound: every address is a live cudarc allocation, checked above to hold what the
    // plan's shape implies (A max_rows*K or the per-row tokens, B G*N*K or num_experts matrices, D max_rows*N,
    // offsets G+1 / counts per group where the mode reads them, G*max_m <= max_rows, per-row groups <= G and
    // max_rows, workspace >= the size C++ asked for for G >= the groups launched, status one u32); A/B/D bases
    // are 16-byte aligned and K, N multiples of the element type's 16-byte alignment (checked), so every group
    // base is too. Offsets and counts are device data the kernel clamps into [0, max_rows] and each group's
    // room. The stream's context is bound to this thread. The guards keep the buffers ordered on `stream`, and
    // the borrows keep them alive until this function returns; cudarc frees memory stream-ordered, so queued work
    // never outlives its buffers.
    let status = match plan.config {
        // SAFETY: the argument above, for the SM90 kernel of `args.dtype`.
        GroupedKernel::Sm90(config) => unsafe {
            match T::DTYPE {
                DType::BF16 => ffi::grouped_gemm_sm90_bf16_run(config, &args),
                DType::F16 => ffi::grouped_gemm_sm90_f16_run(config, &args),
            }
        },
        GroupedKernel::Sm100(config) => {
            match T::DTYPE {
                // SAFETY: the argument above, for the SM100 kernel (the same operands and group arrays).
                DType::BF16 => unsafe { ffi::grouped_gemm_sm100_bf16_run(config, &args) },
                DType::F16 => NOT_BUILT,
            }
        }
    };
    let config: &dyn std::fmt::Debug = match &plan.config {
        GroupedKernel::Sm90(c) => c,
        GroupedKernel::Sm100(c) => c,
    };
    check(status, &Launched { config: Some(config), workspace_bytes, ..Launched::typed(op, T::DTYPE) })
}
