//! The FP8 blockwise-scaled grouped GEMMs (`cpp/fp8_blockwise/grouped_gemm_sm90_fp8.cuh`, and for the one SM100 configuration
//! `cpp/fp8_blockwise/grouped_gemm_sm100_fp8.cuh`): whether a configuration was built, its compile-time facts, its workspace,
//! and the launch (our prepare kernel, then CUTLASS's). The configuration names the unit: both read the same
//! operands through the same prepare kernel (`cpp/fp8_blockwise/fp8_blockwise_groups.cuh`).
//!
//! Operands (`cpp/fp8_blockwise/launch_fp8.h`): A e4m3 `[max_rows, K]` with f32 scales `[max_rows, ceil(K/128)]` (K-major),
//! B e4m3 `[G, N, K]` with f32 scales `[G, ceil(N/128), ceil(K/128)]`, D bf16 `[max_rows, N]`.

use cudarc::driver::CudaStream;

use crate::error::Result;
use crate::ffi::bridge::{static_name, trivial_extern_types};
use crate::ffi::gemm::{scaled_gemm_args, GemmPlan, ScaledFamily, ScaledPtrs};
use crate::ffi::status::{check, Launched};
use crate::ffi::to_i32;

crate::ffi::family_sys!("fp8_blockwise");

pub(crate) use sys::{Fp8KernelFacts, Fp8TileConfig};

trivial_extern_types! { Fp8TileConfig GroupedGemmFp8Args }

// The SM90 unit and the SM100 one declare the same entry points (`cpp/fp8_blockwise/launch_fp8.h`).
#[cxx::bridge(namespace = "moe_gemm")]
mod ffi {
    unsafe extern "C++" {
        include!("moe-gemm/cpp/fp8_blockwise/launch_fp8.h");

        type Status = crate::ffi::sys::Status;
        type Fp8TileConfig = crate::kernels::fp8_blockwise::launch::sys::Fp8TileConfig;
        type Fp8KernelFacts = crate::ffi::sys::Fp8KernelFacts;
        type GroupedGemmFp8Args = crate::kernels::fp8_blockwise::launch::sys::GroupedGemmFp8Args;

        fn grouped_gemm_sm90_fp8_blockwise_built(config: Fp8TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm90_fp8_blockwise_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// Compile-time facts of `config` (NotBuilt and `facts` untouched when it was not compiled).
        ///
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm90_fp8_blockwise_facts(config: Fp8TileConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// The CUTLASS kernel schedule's type name of `config`: a literal, or null when not built.
        fn grouped_gemm_sm90_fp8_blockwise_schedule(config: Fp8TileConfig) -> *const c_char;
        /// # Safety
        /// Every address in `args` a live device allocation of the size the args imply, on the device and stream
        /// given, alive until the queued work completes, with the operands `GroupedGemmFp8Args` documents (e4m3
        /// A and B, f32 scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_blockwise_run(args: &GroupedGemmFp8Args) -> Status;

        fn grouped_gemm_sm100_fp8_blockwise_built(config: Fp8TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm100_fp8_blockwise_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// Compile-time facts of `config` (NotBuilt and `facts` untouched when it was not compiled).
        ///
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm100_fp8_blockwise_facts(config: Fp8TileConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// The CUTLASS kernel schedule's type name of `config`: a literal, or null when not built.
        fn grouped_gemm_sm100_fp8_blockwise_schedule(config: Fp8TileConfig) -> *const c_char;
        /// # Safety
        /// Every address in `args` a live device allocation of the size the args imply, on the device and stream
        /// given, alive until the queued work completes, with the operands `GroupedGemmFp8Args` documents (e4m3
        /// A and B, f32 scales, bf16 D).
        unsafe fn grouped_gemm_sm100_fp8_blockwise_run(args: &GroupedGemmFp8Args) -> Status;
    }
}

const OP: &str = "grouped_gemm_sm90_fp8_blockwise";
const OP_SM100: &str = "grouped_gemm_sm100_fp8_blockwise";

/// Whether `config` is the SM100 unit's (the others are the SM90 unit's).
pub(crate) fn is_sm100(config: Fp8TileConfig) -> bool {
    matches!(config, Fp8TileConfig::Sm100Blockwise1Sm128x128x128 | Fp8TileConfig::Sm100Blockwise2Sm256x128x128)
}

fn op(config: Fp8TileConfig) -> &'static str {
    if is_sm100(config) {
        OP_SM100
    } else {
        OP
    }
}

/// Elements of K (and rows of N) per scale block.
pub(crate) const SCALE_BLOCK: usize = 128;

/// Whether `config` was compiled into the library.
pub(crate) fn built(config: Fp8TileConfig) -> bool {
    if is_sm100(config) {
        ffi::grouped_gemm_sm100_fp8_blockwise_built(config)
    } else {
        ffi::grouped_gemm_sm90_fp8_blockwise_built(config)
    }
}

/// Compile-time facts of a built `config` (read from the CUTLASS types), and its kernel schedule's name.
pub(crate) fn facts(config: Fp8TileConfig) -> Result<(Fp8KernelFacts, String)> {
    let mut f = Fp8KernelFacts::default();
    // SAFETY: `f` is a live local, which the calls may write (host only: no device, no CUDA call); a schedule is
    // a C++ string literal or null.
    let (s, schedule) = unsafe {
        if is_sm100(config) {
            let s = ffi::grouped_gemm_sm100_fp8_blockwise_facts(config, &mut f);
            (s, static_name(ffi::grouped_gemm_sm100_fp8_blockwise_schedule(config)))
        } else {
            let s = ffi::grouped_gemm_sm90_fp8_blockwise_facts(config, &mut f);
            (s, static_name(ffi::grouped_gemm_sm90_fp8_blockwise_schedule(config)))
        }
    };
    check(s, &Launched { config: Some(&config), ..Launched::op(op(config)) })?;
    Ok((f, schedule.to_string()))
}

/// Bytes of device workspace a launch of `groups` groups needs on a device of `sm_count` SMs.
pub(crate) fn workspace_bytes(config: Fp8TileConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let groups = to_i32("groups", groups)?;
    // SAFETY: `bytes` is a live local, which the call writes (host only).
    let s = unsafe {
        if is_sm100(config) {
            ffi::grouped_gemm_sm100_fp8_blockwise_workspace(config, groups, sm_count, &mut bytes)
        } else {
            ffi::grouped_gemm_sm90_fp8_blockwise_workspace(config, groups, sm_count, &mut bytes)
        }
    };
    check(s, &Launched { config: Some(&config), ..Launched::op(op(config)) })?;
    Ok(bytes)
}

/// What an FP8 blockwise launch needs besides its buffers, fixed by a plan.
pub(crate) type Fp8Plan = GemmPlan<Fp8TileConfig>;

impl ScaledFamily for Fp8TileConfig {
    const WHAT: &'static str = "FP8 grouped GEMM";
    const SB_VECTORS: bool = false;
    const N_ALIGN: usize = SCALE_BLOCK;
    const K_ALIGN: usize = 16;

    fn op(self) -> &'static str {
        op(self)
    }

    fn scale_lens(plan: &Fp8Plan) -> ((usize, &'static str), (usize, &'static str)) {
        let (kb, nb) = (plan.k.div_ceil(SCALE_BLOCK), plan.n.div_ceil(SCALE_BLOCK));
        ((plan.max_rows * kb, "max_rows x ceil(K/128)"), (plan.groups * nb * kb, "G x ceil(N/128) x ceil(K/128)"))
    }

    unsafe fn run(plan: &Fp8Plan, mode: sys::GroupMode, p: &ScaledPtrs<'_>, stream: &CudaStream) -> sys::Status {
        let args = scaled_gemm_args!(sys::GroupedGemmFp8Args { sfa, sfb }, plan, mode, p, stream);
        // SAFETY: every address is a live cudarc allocation, checked by `scaled_launch` to hold what the plan's
        // shape implies: A max_rows*K e4m3 and SFA max_rows*ceil(K/128) f32, B G*N*K e4m3 and SFB
        // G*ceil(N/128)*ceil(K/128) f32, D max_rows*N bf16, offsets G+1 / counts G where the mode reads them,
        // G*max_m <= max_rows for masked groups, workspace >= the size C++ asked for for these G groups, status
        // one u32. A/B/D bases are 16-byte aligned and K a multiple of 16 (1-byte e4m3) and N of 128, so every
        // group's A, B and D base is 16-byte aligned for TMA; SFA/SFB are 4-byte aligned and every group's scale
        // pointer (row_start*ceil(K/128), g*ceil(N/128)*ceil(K/128) elements in) stays inside its array for rows
        // the prepare kernel has clamped into [0, max_rows]. Offsets and counts are device data the kernel clamps
        // into [0, max_rows] and each group's room. The stream's context is bound to this thread. The guards keep
        // the buffers ordered on `stream`, and `p` keeps the guards until `scaled_launch` returns; cudarc frees
        // memory stream-ordered, so queued work never outlives its buffers. Both units read these args alike; a
        // unit launched on a GPU it has no SASS for fails with a CUDA error (no kernel image), which `check`
        // reports (the domain plans refuse that first).
        unsafe {
            if is_sm100(plan.config) {
                ffi::grouped_gemm_sm100_fp8_blockwise_run(&args)
            } else {
                ffi::grouped_gemm_sm90_fp8_blockwise_run(&args)
            }
        }
    }
}
