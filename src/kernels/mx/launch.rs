//! The SM100 block-scaled grouped GEMMs (`cpp/mx/grouped_gemm_sm100_mxfp8.inl` and `grouped_gemm_sm100_fp4.inl`)
//! and the portable GEMM of the same operands (`cpp/mx/grouped_mx_portable.cu`), contract in `cpp/mx/launch.h`:
//! their bridge, whether a configuration was built, its workspace, and both launches, from the same checks.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use float8::F8E4M3;
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi::bridge::trivial_extern_types;
use crate::ffi::gemm::group_rows;
use crate::ffi::gemm::GroupedRows;
use crate::ffi::mx_quant::expert_sf_bytes;
use crate::ffi::status::{check, Launched};
use crate::ffi::{need_aligned, need_len, to_i32, to_i64};

crate::ffi::family_sys!("mx");

pub(crate) use sys::Sm100MxConfig;

trivial_extern_types! { Sm100MxConfig GroupedGemmMxArgs }

// Two parts of the SM100 unit compile the configurations (`grouped_gemm_sm100_mxfp8.inl`: kind::mxf8f6f4;
// `grouped_gemm_sm100_fp4.inl`: kind::mxf4, kind::mxf4nvf4), each with its entry points; `sm100_mx_is_fp4` says
// which has a configuration.
#[cxx::bridge(namespace = "moe_gemm")]
mod ffi {
    unsafe extern "C++" {
        include!("moe-gemm/cpp/mx/launch.h");

        type Status = crate::ffi::sys::Status;
        type Sm100MxConfig = crate::kernels::mx::launch::sys::Sm100MxConfig;
        type GroupedGemmMxArgs = crate::kernels::mx::launch::sys::GroupedGemmMxArgs;

        fn sm100_mx_is_fp4(config: Sm100MxConfig) -> bool;
        fn grouped_gemm_sm100_mxf8_built(config: Sm100MxConfig) -> bool;
        fn grouped_gemm_sm100_fp4_built(config: Sm100MxConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm100_mxf8_workspace(
            config: Sm100MxConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm100_mxf8_workspace`.
        unsafe fn grouped_gemm_sm100_fp4_workspace(
            config: Sm100MxConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// Buffers of the sizes `GroupedGemmMxArgs` documents (`cpp/mx/launch.h`), on an SM100 device;
        /// `args.config` one of this part's.
        unsafe fn grouped_gemm_sm100_mxf8_run(args: &GroupedGemmMxArgs) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm100_mxf8_run`.
        unsafe fn grouped_gemm_sm100_fp4_run(args: &GroupedGemmMxArgs) -> Status;
        /// # Safety
        /// As `grouped_gemm_sm100_mxf8_run` (the same buffers), on any device the portable unit has SASS for.
        unsafe fn grouped_gemm_mx_portable_run(args: &GroupedGemmMxArgs) -> Status;
    }
}

const OP: &str = "grouped_gemm_sm100_mx";
const OP_PORTABLE: &str = "grouped_gemm_mx_portable";

pub(crate) fn built(config: Sm100MxConfig) -> bool {
    if ffi::sm100_mx_is_fp4(config) {
        ffi::grouped_gemm_sm100_fp4_built(config)
    } else {
        ffi::grouped_gemm_sm100_mxf8_built(config)
    }
}

pub(crate) fn workspace_bytes(config: Sm100MxConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let (mut bytes, groups) = (0u64, to_i32("groups", groups)?);
    // SAFETY: `bytes` is a live local, which the call writes (host only).
    let s = unsafe {
        if ffi::sm100_mx_is_fp4(config) {
            ffi::grouped_gemm_sm100_fp4_workspace(config, groups, sm_count, &mut bytes)
        } else {
            ffi::grouped_gemm_sm100_mxf8_workspace(config, groups, sm_count, &mut bytes)
        }
    };
    check(s, &Launched { config: Some(&config), ..Launched::op("grouped_gemm_sm100_mx workspace") })?;
    Ok(bytes)
}

/// A configuration's (A's bits, B's bits, elements per scale, tensor-scaled).
fn traits(config: Sm100MxConfig) -> (usize, usize, usize, bool) {
    match config {
        Sm100MxConfig::Mxf8Mma1Sm128x128x128 | Sm100MxConfig::Mxf8Mma2Sm256x256x128 => (8, 8, 32, false),
        Sm100MxConfig::Mxf8f4Mma1Sm128x128x128 => (8, 4, 32, false),
        Sm100MxConfig::Mxf4Mma1Sm128x128x256 => (4, 4, 32, false),
        Sm100MxConfig::Nvf4Mma1Sm128x128x256 => (4, 4, 16, true),
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct MxPlan {
    pub config: Sm100MxConfig,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
    /// The configuration's MMA tile N (128, or 256 for the 2-SM tiles): N is whole tiles of it.
    pub tile_n: usize,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

/// An operand's elements: e4m3, or e2m1 packed two per byte (the configuration says which).
pub(crate) enum MxData<'a> {
    E4m3(&'a CudaSlice<F8E4M3>),
    E2m1(&'a CudaSlice<u8>),
}

impl<'a> MxData<'a> {
    fn device_ptr(&self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        match self {
            MxData::E4m3(b) => b.device_ptr(stream),
            MxData::E2m1(b) => b.device_ptr(stream),
        }
    }
    fn bits(&self) -> usize {
        match self {
            MxData::E4m3(_) => 8,
            MxData::E2m1(_) => 4,
        }
    }
    fn len_bytes(&self) -> usize {
        match self {
            MxData::E4m3(b) => b.len(),
            MxData::E2m1(b) => b.len(),
        }
    }
}

/// A's and B's buffers: element data, scale atoms (UE8M0, or UE4M3 for NVFP4), A's per-group atom bases
/// `[groups + 1]`, and for NVFP4 the tensor scales (A's one, B's one per expert).
pub(crate) struct MxOperands<'a> {
    pub a: MxData<'a>,
    pub sfa: &'a CudaSlice<u8>,
    pub sfa_bases: &'a CudaSlice<i64>,
    pub b: MxData<'a>,
    pub sfb: &'a CudaSlice<u8>,
    pub tensor_scales: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
}

/// Queues the prepare kernel and the CUTLASS block-scaled grouped GEMM on `stream` (an SM100 device's: the plan
/// checked the arch).
pub(crate) fn launch(
    stream: &CudaStream,
    plan: &MxPlan,
    ops: MxOperands<'_>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let workspace_bytes = workspace.len() as u64;
    if workspace_bytes < plan.workspace_bytes {
        return Err(Error::WorkspaceTooSmall { op: OP, needed: plan.workspace_bytes, got: workspace_bytes });
    }
    let launched = Launched { config: Some(&plan.config), workspace_bytes, ..Launched::op(OP) };
    with_args(stream, plan, ops, rows, d, Some(workspace), status, &launched, |args| {
        // SAFETY: `with_args` checked every buffer against the plan's shape (see there) and the workspace
        // against the plan's size (above); the plan checked the arch (SM100); the part is the configuration's.
        unsafe {
            if ffi::sm100_mx_is_fp4(args.config) {
                ffi::grouped_gemm_sm100_fp4_run(args)
            } else {
                ffi::grouped_gemm_sm100_mxf8_run(args)
            }
        }
    })
}

/// Queues the portable block-scaled grouped GEMM (`cpp/mx/grouped_mx_portable.cu`) on `stream`: the same function
/// of the same buffers as [`launch`], on any device its family has SASS for (the plan checked it); no workspace.
pub(crate) fn launch_portable(
    stream: &CudaStream,
    plan: &MxPlan,
    ops: MxOperands<'_>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let launched = Launched { config: Some(&plan.config), ..Launched::op(OP_PORTABLE) };
    with_args(stream, plan, ops, rows, d, None, status, &launched, |args| {
        // SAFETY: `with_args` checked every buffer against the plan's shape (see there); the kernel reads no
        // workspace; the plan checked that the device is one the unit has SASS for.
        unsafe { ffi::grouped_gemm_mx_portable_run(args) }
    })
}

/// The host checks both MX launches share, then `run` with the parameters while the buffers' stream guards are
/// held; its status as a `Result` (`launched` names the operation).
#[allow(clippy::too_many_arguments)]
fn with_args(
    stream: &CudaStream,
    plan: &MxPlan,
    ops: MxOperands<'_>,
    rows: GroupedRows<'_>,
    d: &mut impl DevicePtrMut<bf16>,
    workspace: Option<&mut CudaSlice<u8>>,
    status: &mut impl DevicePtrMut<u32>,
    launched: &Launched<'_>,
    run: impl FnOnce(&sys::GroupedGemmMxArgs) -> sys::Status,
) -> Result<()> {
    let (groups, n, k, max_rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
    if n == 0 || n % plan.tile_n != 0 || k == 0 || k % 128 != 0 {
        return Err(Error::InvalidProblem(format!(
            "MX grouped GEMM: N = {n} must be a positive multiple of the MMA tile's N ({}) and K = {k} of 128",
            plan.tile_n
        )));
    }
    let (a_bits, b_bits, vec, scaled) = traits(plan.config);
    if (ops.a.bits(), ops.b.bits()) != (a_bits, b_bits) || ops.tensor_scales.is_some() != scaled {
        return Err(Error::InvalidProblem(format!(
            "MX grouped GEMM: operands of {}-bit A and {}-bit B{} for the configuration {:?}",
            ops.a.bits(),
            ops.b.bits(),
            if ops.tensor_scales.is_some() { " with tensor scales" } else { "" },
            plan.config
        )));
    }
    let arrays = group_rows(rows, groups, max_rows)?;
    need_len("a", ops.a.len_bytes(), max_rows * k * a_bits / 8, "max_rows x K elements' bytes")?;
    need_len("sfa_bases", ops.sfa_bases.len(), groups + 1, "groups + 1")?;
    need_len("b", ops.b.len_bytes(), groups * n * k * b_bits / 8, "G x N x K elements' bytes")?;
    need_len("sfb", ops.sfb.len(), groups * expert_sf_bytes(n, k, vec), "G x 512 x ceil(N/128) x ceil(K/(4 vec))")?;
    if let Some((sa, sb)) = ops.tensor_scales {
        need_len("a tensor scale", sa.len(), 1, "1")?;
        need_len("b tensor scales", sb.len(), groups, "G")?;
    }
    need_len("d", d.len(), max_rows * n, "max_rows x N")?;
    let (max_m, groups_i, n_i, k_i) =
        (to_i32("max_m", arrays.max_m)?, to_i32("groups", groups)?, to_i32("N", n)?, to_i32("K", k)?);
    let max_rows_i = to_i64("max_rows", max_rows)?;
    crate::ffi::bind(stream)?;
    let (a_ptr, _a) = ops.a.device_ptr(stream);
    let (sfa_ptr, _sfa) = ops.sfa.device_ptr(stream);
    let (bases_ptr, _bases) = ops.sfa_bases.device_ptr(stream);
    let (b_ptr, _b) = ops.b.device_ptr(stream);
    let (sa_ptr, _sa) = ops.tensor_scales.map(|(sa, _)| sa.device_ptr(stream)).unzip();
    let (sb_ptr, _sb) = ops.tensor_scales.map(|(_, sb)| sb.device_ptr(stream)).unzip();
    let (sfb_ptr, _sfb) = ops.sfb.device_ptr(stream);
    let ((offsets, counts), _groups) = arrays.device_ptrs(stream);
    let (d_ptr, _d) = d.device_ptr_mut(stream);
    let workspace_bytes = workspace.as_ref().map_or(0, |w| w.len() as u64);
    let (w_ptr, _w) = workspace.map(|w| w.device_ptr_mut(stream)).unzip();
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    for (name, p) in [("a", a_ptr), ("b", b_ptr), ("d", d_ptr)] {
        need_aligned(name, p)?;
    }
    for (name, p) in [("sfa", sfa_ptr), ("sfb", sfb_ptr)] {
        if p % 128 != 0 {
            return Err(Error::Buffer { name, detail: format!("device address {p:#x} is not 128-byte aligned (TMA)") });
        }
    }
    let args = sys::GroupedGemmMxArgs {
        config: plan.config,
        mode: arrays.mode,
        max_m,
        groups: groups_i,
        n: n_i,
        k: k_i,
        max_rows: max_rows_i,
        a: a_ptr,
        sfa: sfa_ptr,
        sfa_bases: bases_ptr,
        b: b_ptr,
        sfb: sfb_ptr,
        a_tensor_scale: sa_ptr.unwrap_or(0),
        b_tensor_scales: sb_ptr.unwrap_or(0),
        d: d_ptr,
        offsets,
        counts,
        workspace: w_ptr.unwrap_or(0),
        workspace_bytes,
        status: s_ptr,
        device: plan.device,
        sm_count: plan.sm_count,
        stream: stream.cu_stream() as u64,
    };
    // What `run`'s unsafe call relies on: every buffer holds what the plan's shape implies (checked above), with
    // 16-byte aligned data and 128-byte aligned scale bases; sfa_bases are device data the quantiser wrote (each
    // group's atoms inside the scale buffer it sized for the worst case); the tensor scales (NVFP4 only) are one
    // f32 for A and G for B. Group rows are clamped on the device. The stream's context is bound; the guards
    // outlive the call.
    check(run(&args), launched)
}
