//! The SM90 FP8 rowwise-scaled grouped GEMM (`cpp/fp8_rowwise/grouped_gemm_sm90_fp8_rowwise.cuh`): its bridge, whether a
//! configuration was built, its compile-time facts, its workspace, and the launch (our prepare kernel, then
//! CUTLASS's).
//!
//! Operands (`cpp/fp8_rowwise/launch_fp8_rowwise.h`): A e4m3 `[max_rows, K]` with f32 scales `[max_rows]` (one per row),
//! B e4m3 `[G, N, K]` with f32 scales `[G, N]` (one per output channel), D bf16 `[max_rows, N]`.

use cudarc::driver::CudaStream;

use crate::error::Result;
use crate::ffi::bridge::{static_name, trivial_extern_types};
use crate::ffi::gemm::{scaled_gemm_args, GemmPlan, ScaledFamily, ScaledPtrs};
use crate::ffi::status::{check, Launched};
use crate::ffi::to_i32;

crate::ffi::family_sys!("fp8_rowwise");

pub(crate) use sys::{Fp8KernelFacts, Fp8RowwiseConfig};

trivial_extern_types! { Fp8RowwiseConfig GroupedGemmFp8RowwiseArgs }

#[cxx::bridge(namespace = "moe_gemm")]
mod ffi {
    unsafe extern "C++" {
        include!("moe-gemm/cpp/fp8_rowwise/launch_fp8_rowwise.h");

        type Status = crate::ffi::sys::Status;
        type Fp8RowwiseConfig = crate::kernels::fp8_rowwise::launch::sys::Fp8RowwiseConfig;
        type Fp8KernelFacts = crate::ffi::sys::Fp8KernelFacts;
        type GroupedGemmFp8RowwiseArgs = crate::kernels::fp8_rowwise::launch::sys::GroupedGemmFp8RowwiseArgs;

        fn grouped_gemm_sm90_fp8_rowwise_built(config: Fp8RowwiseConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm90_fp8_rowwise_workspace(
            config: Fp8RowwiseConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm90_fp8_rowwise_facts(config: Fp8RowwiseConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// The CUTLASS kernel schedule's type name of `config`: a literal, or null when not built.
        fn grouped_gemm_sm90_fp8_rowwise_schedule(config: Fp8RowwiseConfig) -> *const c_char;
        /// # Safety
        /// Every address in `args` a live device allocation of the size the args imply, on the device and stream
        /// given, alive until the queued work completes (e4m3 A and B, f32 per-row and per-channel scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_rowwise_run(args: &GroupedGemmFp8RowwiseArgs) -> Status;
    }
}

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
    // SAFETY: the schedule is a C++ string literal or null.
    let schedule = unsafe { static_name(ffi::grouped_gemm_sm90_fp8_rowwise_schedule(config)) };
    Ok((f, schedule.to_string()))
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

impl ScaledFamily for Fp8RowwiseConfig {
    const WHAT: &'static str = "FP8 rowwise grouped GEMM";
    // The epilogue loads each group's channel scales (g*N f32) as vectors.
    const SB_VECTORS: bool = true;
    const N_ALIGN: usize = ROWWISE_ALIGN;
    const K_ALIGN: usize = ROWWISE_ALIGN;

    fn op(self) -> &'static str {
        OP
    }

    fn scale_lens(plan: &RowwisePlan) -> ((usize, &'static str), (usize, &'static str)) {
        (
            (plan.max_rows, "max_rows (one scale per row)"),
            (plan.groups * plan.n, "G x N (one scale per output channel)"),
        )
    }

    unsafe fn run(plan: &RowwisePlan, mode: sys::GroupMode, p: &ScaledPtrs<'_>, stream: &CudaStream) -> sys::Status {
        let args = scaled_gemm_args!(sys::GroupedGemmFp8RowwiseArgs { sa, sb }, plan, mode, p, stream);
        // SAFETY: every address is a live cudarc allocation checked by `scaled_launch` to hold what the plan's
        // shape implies: A max_rows*K e4m3 and SA max_rows f32, B G*N*K e4m3 and SB G*N f32, D max_rows*N bf16,
        // offsets G+1 / counts G where the mode reads them, G*max_m <= max_rows for masked groups, workspace >=
        // the size C++ asked for, status one u32. A/B/D/SB bases are 16-byte aligned and N, K multiples of 16, so
        // every group's A, B, D base and channel-scale vector (g*N f32) is 16-byte aligned; SA is read one f32 at a
        // time from row starts the prepare kernel clamps into [0, max_rows]. The stream's context is bound to this
        // thread; the guards in `p` order the buffers on `stream` until `scaled_launch` returns
        // (cudarc frees stream-ordered).
        unsafe { ffi::grouped_gemm_sm90_fp8_rowwise_run(&args) }
    }
}
