//! The SM90 FP8 rowwise-scaled grouped GEMM (`cpp/fp8/grouped_gemm_sm90_fp8_rowwise.cuh`): whether a configuration
//! was built, its compile-time facts, its workspace, and the launch (our prepare kernel, then CUTLASS's).
//!
//! Operands (`cpp/fp8/launch_fp8_rowwise.h`): A e4m3 `[max_rows, K]` with f32 scales `[max_rows]` (one per row),
//! B e4m3 `[G, N, K]` with f32 scales `[G, N]` (one per output channel), D bf16 `[max_rows, N]`.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi::bridge_fp8::ffi;
use crate::ffi::gemm::{group_rows, scaled_gemm_args, E4m3Buffer, GemmPlan, GroupedRows, ScaleBuffer, ScaledOperands};
use crate::ffi::status::{check, Launched};
use crate::ffi::sys;
use crate::ffi::{need_aligned, need_f32_aligned, to_i32};

pub(crate) use sys::{Fp8KernelFacts, Fp8RowwiseConfig};

const OP: &str = "grouped_gemm_sm90_fp8_rowwise";

/// N and K must be multiples of this: 16-byte rows of e4m3 A and B for TMA, and 16-byte aligned per-expert
/// channel-scale vectors (`g · N` f32) for the epilogue's vector loads.
pub(crate) const ROWWISE_ALIGN: usize = 16;

pub(crate) fn built(config: Fp8RowwiseConfig) -> bool {
    ffi::grouped_gemm_sm90_fp8_rowwise_built(config)
}

/// Compile-time facts of a built `config` and its kernel schedule's name.
pub(crate) fn facts(config: Fp8RowwiseConfig) -> Result<(Fp8KernelFacts, String)> {
    let mut f = Fp8KernelFacts::default();
    // SAFETY: `f` is a live local, which the call may write (host only: no device, no CUDA call).
    let s = unsafe { ffi::grouped_gemm_sm90_fp8_rowwise_facts(config, &mut f) };
    check(s, &Launched { config: Some(&config), ..Launched::op(OP) })?;
    Ok((f, ffi::grouped_gemm_sm90_fp8_rowwise_schedule(config)))
}

pub(crate) fn workspace_bytes(config: Fp8RowwiseConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let groups = to_i32("groups", groups)?;
    // SAFETY: `bytes` is a live local, which the call writes (host only).
    let s = unsafe { ffi::grouped_gemm_sm90_fp8_rowwise_workspace(config, groups, sm_count, &mut bytes) };
    check(s, &Launched { config: Some(&config), ..Launched::op("grouped_gemm_sm90_fp8_rowwise workspace") })?;
    Ok(bytes)
}

/// What a rowwise launch needs besides its buffers, fixed by a plan.
pub(crate) type RowwisePlan = GemmPlan<Fp8RowwiseConfig>;

/// The buffers of one launch: e4m3 A and B, SA one f32 per row of A, SB one per output channel of each group.
pub(crate) type RowwiseOperands<'a, A, SA, B, SB> = ScaledOperands<'a, A, SA, B, SB>;

/// Queues `prepare_rowwise_groups` and the CUTLASS FP8 rowwise grouped GEMM on `stream`.
pub(crate) fn launch<A: E4m3Buffer, SA: ScaleBuffer, B: E4m3Buffer, SB: ScaleBuffer>(
    stream: &CudaStream,
    plan: &RowwisePlan,
    ops: RowwiseOperands<'_, A, SA, B, SB>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    plan.check_device(stream, format_args!("FP8 rowwise grouped GEMM"))?;
    let (groups, n, k, max_rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
    if n == 0 || n % ROWWISE_ALIGN != 0 || k == 0 || k % ROWWISE_ALIGN != 0 {
        return Err(Error::InvalidProblem(format!(
            "FP8 rowwise grouped GEMM: N = {n} and K = {k} must be positive multiples of {ROWWISE_ALIGN}"
        )));
    }
    let arrays = group_rows(rows, groups, max_rows)?;
    let (sa, sb) = ((max_rows, "max_rows (one scale per row)"), (groups * n, "G x N (one scale per output channel)"));
    ops.check_lens(plan, sa, sb, d.len())?;
    let p = ops.bind(stream, plan, OP, arrays, d, workspace, status)?;
    for (name, ptr) in [("a", p.a), ("b", p.b), ("d", p.d), ("sb", p.sb)] {
        need_aligned(name, ptr)?;
    }
    need_f32_aligned("sa", p.sa)?;
    let workspace_bytes = p.workspace_bytes;
    let args = scaled_gemm_args!(sys::GroupedGemmFp8RowwiseArgs { sa, sb }, plan, arrays.mode, p, stream);
    // SAFETY: every address is a live cudarc allocation checked above to hold what the plan's shape implies: A
    // max_rows*K e4m3 and SA max_rows f32, B G*N*K e4m3 and SB G*N f32, D max_rows*N bf16, offsets G+1 /
    // counts G where the mode reads them, G*max_m <= max_rows for masked groups, workspace >= the size C++
    // asked for, status one u32. A/B/D/SB bases are 16-byte aligned and N, K multiples of 16, so every group's
    // A, B, D base and channel-scale vector (g*N f32) is 16-byte aligned; SA is read one f32 at a time from row
    // starts the prepare kernel clamps into [0, max_rows]. The stream's context is bound to this thread; the
    // guards in `p` order the buffers on `stream` until this function returns
    // (cudarc frees stream-ordered).
    let status = unsafe { ffi::grouped_gemm_sm90_fp8_rowwise_run(&args) };
    check(status, &Launched { config: Some(&plan.config), workspace_bytes, ..Launched::op(OP) })
}
