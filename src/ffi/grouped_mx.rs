//! The SM100 MXFP8 block-scaled grouped GEMM (`cpp/grouped_gemm_sm100_mxfp8.cu`, contract in
//! `cpp/launch_sm100_mx.h`): whether a configuration was built, its workspace, and the launch.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use float8::F8E4M3;
use half::bf16;

use super::bridge_fp8::ffi;
use super::grouped::GroupedRows;
use super::grouped_fp8::group_rows;
use super::status::{check, Launched};
use super::{need_aligned, need_len, to_i32, to_i64};
use crate::error::{Error, Result};

pub(crate) use ffi::Sm100MxConfig;

const OP: &str = "grouped_gemm_sm100_mxfp8";

pub(crate) fn built(config: Sm100MxConfig) -> bool {
    ffi::grouped_gemm_sm100_mxfp8_built(config)
}

pub(crate) fn workspace_bytes(config: Sm100MxConfig, groups: usize, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let s = ffi::grouped_gemm_sm100_mxfp8_workspace(config, to_i32("groups", groups)?, sm_count, &mut bytes);
    check(s, &Launched { config: Some(&config), ..Launched::op("grouped_gemm_sm100_mxfp8 workspace") })?;
    Ok(bytes)
}

/// Bytes of one expert's scale atoms: `512 · ceil(n / 128) · ceil(k / 128)`.
pub(crate) fn expert_sf_bytes(n: usize, k: usize) -> usize {
    512 * n.div_ceil(128) * k.div_ceil(128)
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct MxPlan {
    pub config: Sm100MxConfig,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

/// B's elements: e4m3, or e2m1 packed two per byte (the configuration says which).
pub(crate) enum MxB<'a> {
    E4m3(&'a CudaSlice<F8E4M3>),
    E2m1(&'a CudaSlice<u8>),
}

/// A's and B's buffers: element data, UE8M0 scale atoms, and A's per-group atom bases `[groups + 1]`.
pub(crate) struct MxOperands<'a> {
    pub a: &'a CudaSlice<F8E4M3>,
    pub sfa: &'a CudaSlice<u8>,
    pub sfa_bases: &'a CudaSlice<i64>,
    pub b: MxB<'a>,
    pub sfb: &'a CudaSlice<u8>,
}

/// Queues the prepare kernel and the CUTLASS MXFP8 grouped GEMM on `stream` (an SM100 device's: the plan
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
    let (groups, n, k, max_rows) = (plan.groups, plan.n, plan.k, plan.max_rows);
    if n == 0 || n % 128 != 0 || k == 0 || k % 128 != 0 {
        return Err(Error::InvalidProblem(format!(
            "MXFP8 grouped GEMM: N = {n} and K = {k} must be positive multiples of 128"
        )));
    }
    let (mode, offsets, counts, max_m) = group_rows(rows, groups, max_rows)?;
    need_len("a", ops.a.len(), max_rows * k, "max_rows x K")?;
    need_len("sfa_bases", ops.sfa_bases.len(), groups + 1, "groups + 1")?;
    let (b_len, b_want, b_what) = match (&ops.b, plan.config) {
        (MxB::E4m3(b), Sm100MxConfig::Mxf8Mma1Sm128x128x128) => (b.len(), groups * n * k, "G x N x K e4m3"),
        (MxB::E2m1(b), Sm100MxConfig::Mxf8f4Mma1Sm128x128x128) => {
            (b.len(), groups * n * k / 2, "G x N x K / 2 bytes of e2m1")
        }
        _ => {
            return Err(Error::InvalidProblem(format!(
                "MXFP grouped GEMM: B's element type does not match the configuration {:?}",
                plan.config
            )))
        }
    };
    need_len("b", b_len, b_want, b_what)?;
    need_len("sfb", ops.sfb.len(), groups * expert_sf_bytes(n, k), "G x 512 x ceil(N/128) x ceil(K/128)")?;
    need_len("d", d.len(), max_rows * n, "max_rows x N")?;
    let workspace_bytes = workspace.len() as u64;
    if workspace_bytes < plan.workspace_bytes {
        return Err(Error::WorkspaceTooSmall { op: OP, needed: plan.workspace_bytes, got: workspace_bytes });
    }
    let (max_m, groups_i, n_i, k_i) =
        (to_i32("max_m", max_m)?, to_i32("groups", groups)?, to_i32("N", n)?, to_i32("K", k)?);
    let max_rows_i = to_i64("max_rows", max_rows)?;
    super::bind(stream)?;
    let (a_ptr, _a) = ops.a.device_ptr(stream);
    let (sfa_ptr, _sfa) = ops.sfa.device_ptr(stream);
    let (bases_ptr, _bases) = ops.sfa_bases.device_ptr(stream);
    let (b_ptr, _b) = match &ops.b {
        MxB::E4m3(b) => b.device_ptr(stream),
        MxB::E2m1(b) => b.device_ptr(stream),
    };
    let (sfb_ptr, _sfb) = ops.sfb.device_ptr(stream);
    let (o_ptr, _o) = offsets.map(|o| o.device_ptr(stream)).unzip();
    let (c_ptr, _c) = counts.map(|c| c.device_ptr(stream)).unzip();
    let (d_ptr, _d) = d.device_ptr_mut(stream);
    let (w_ptr, _w) = workspace.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    for (name, p) in [("a", a_ptr), ("b", b_ptr), ("d", d_ptr)] {
        need_aligned(name, p)?;
    }
    for (name, p) in [("sfa", sfa_ptr), ("sfb", sfb_ptr)] {
        if p % 128 != 0 {
            return Err(Error::Buffer { name, detail: format!("device address {p:#x} is not 128-byte aligned (TMA)") });
        }
    }
    let params = ffi::GroupedGemmMxfp8Params {
        config: plan.config,
        mode,
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
        d: d_ptr,
        offsets: o_ptr.unwrap_or(0),
        counts: c_ptr.unwrap_or(0),
        workspace: w_ptr,
        workspace_bytes,
        status: s_ptr,
        device: plan.device,
        sm_count: plan.sm_count,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: every buffer holds what the plan's shape implies (checked above), with 16-byte aligned data and
    // 128-byte aligned scale bases; sfa_bases are device data the quantiser wrote (each group's atoms inside
    // the scale buffer it sized for the worst case). Group rows are clamped on the device. The stream's
    // context is bound; the guards outlive the call.
    let status = unsafe { ffi::grouped_gemm_sm100_mxfp8_run(&params) };
    check(status, &Launched { config: Some(&plan.config), workspace_bytes, ..Launched::op(OP) })
}
