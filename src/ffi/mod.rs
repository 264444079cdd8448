//! The one door to C++: the cxx bridge (`bridge`) and the launch layer around it. Every `unsafe` block of the
//! crate lives in this module, each with the argument for its safety.
//!
//! The launch functions take cudarc views and hold their stream-ordering guards until the C++ call has queued
//! its work; they check buffer sizes against an already validated problem (O(1) host work: nothing is
//! allocated, copied, read back or synchronised).

mod bridge;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use bridge::ffi;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::kernels::grouped::GroupedGemmShape;
use crate::kernels::TileConfig;

fn dtype(d: DType) -> ffi::DType {
    match d {
        DType::BF16 => ffi::DType::BF16,
        DType::F16 => ffi::DType::F16,
    }
}

fn config(c: TileConfig) -> ffi::TileConfig {
    match c {
        TileConfig::Cooperative128x128x64 => ffi::TileConfig::Cooperative128x128x64,
        TileConfig::Cooperative128x256x64 => ffi::TileConfig::Cooperative128x256x64,
        TileConfig::Pingpong64x128x64 => ffi::TileConfig::Pingpong64x128x64,
        TileConfig::Pingpong128x128x64 => ffi::TileConfig::Pingpong128x128x64,
        TileConfig::Pingpong64x64x128 => ffi::TileConfig::Pingpong64x64x128,
    }
}

/// cutlass::Status names (cutlass/cutlass.h), for error messages.
fn cutlass_status_name(s: i32) -> String {
    let name = match s {
        0 => "kSuccess",
        1 => "kErrorMisalignedOperand",
        2 => "kErrorInvalidDataType",
        3 => "kErrorInvalidLayout",
        4 => "kErrorInvalidProblem",
        5 => "kErrorNotSupported",
        6 => "kErrorWorkspaceNull",
        7 => "kErrorInternal",
        8 => "kErrorArchMismatch",
        9 => "kErrorInsufficientDriver",
        10 => "kErrorMemoryAllocation",
        11 => "kInvalid",
        _ => "unknown",
    };
    format!("{name} ({s})")
}

fn check(op: &'static str, d: DType, c: TileConfig, s: ffi::LaunchStatus) -> Result<()> {
    match s.code {
        ffi::StatusCode::Ok => Ok(()),
        ffi::StatusCode::NotBuilt => Err(Error::KernelNotBuilt { op, dtype: d, config: c }),
        ffi::StatusCode::WorkspaceTooSmall => {
            Err(Error::WorkspaceTooSmall { op, needed: s.detail as u64, got: 0 })
        }
        ffi::StatusCode::CutlassCannotImplement => {
            Err(Error::Cutlass { op, stage: "can_implement", status: cutlass_status_name(s.detail) })
        }
        ffi::StatusCode::CutlassInitialize => {
            Err(Error::Cutlass { op, stage: "initialize", status: cutlass_status_name(s.detail) })
        }
        ffi::StatusCode::CutlassRun => Err(Error::Cutlass { op, stage: "run", status: cutlass_status_name(s.detail) }),
        ffi::StatusCode::Cuda => Err(Error::CudaRuntime { op, code: s.detail }),
        _ => Err(Error::CudaRuntime { op, code: -1 }),
    }
}

pub(crate) fn grouped_gemm_sm90_built(d: DType, c: TileConfig) -> bool {
    ffi::grouped_gemm_sm90_built(dtype(d), config(c))
}

pub(crate) fn grouped_gemm_sm90_workspace(d: DType, c: TileConfig, groups: i32, sm_count: i32) -> Result<u64> {
    let mut bytes = 0u64;
    let s = ffi::grouped_gemm_sm90_workspace(dtype(d), config(c), groups, sm_count, &mut bytes);
    check("grouped_gemm_sm90 workspace", d, c, s)?;
    Ok(bytes)
}

/// Whether libcuda can be loaded (cudarc's dynamic loading panics on first use otherwise).
pub(crate) fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen the driver library and reports whether that succeeded.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The CUDA version the installed driver supports (e.g. 13000). Call only after [`driver_present`].
pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: the driver library is loaded (caller checked `driver_present`); the call writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

pub(crate) fn cudart_version() -> i32 {
    ffi::cudart_version()
}

/// Everything a grouped-GEMM launch needs besides its buffers, fixed by a plan.
pub(crate) struct GroupedLaunch<'p> {
    pub shape: &'p GroupedGemmShape,
    pub config: TileConfig,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

fn need_len(name: &'static str, len: usize, need: usize, what: &str) -> Result<()> {
    if len < need {
        return Err(Error::Buffer { name, detail: format!("holds {len} elements, needs {need} ({what})") });
    }
    Ok(())
}

fn need_aligned(name: &'static str, ptr: u64) -> Result<()> {
    if ptr % 16 != 0 {
        return Err(Error::Buffer { name, detail: format!("device address {ptr:#x} is not 16-byte aligned (TMA)") });
    }
    Ok(())
}

/// Queues `prepare_groups` and the CUTLASS grouped GEMM on `stream`.
pub(crate) fn launch_grouped_gemm_sm90<T: Element>(
    stream: &CudaStream,
    plan: &GroupedLaunch<'_>,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    offsets: &impl DevicePtr<i32>,
    d: &mut impl DevicePtrMut<T>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let s = plan.shape;
    need_len("a", a.len(), s.max_rows() * s.k(), "max_rows x K")?;
    need_len("b", b.len(), s.groups() * s.n() * s.k(), "G x N x K")?;
    need_len("offsets", offsets.len(), s.groups() + 1, "G + 1")?;
    need_len("d", d.len(), s.max_rows() * s.n(), "max_rows x N")?;
    if (workspace.len() as u64) < plan.workspace_bytes {
        return Err(Error::WorkspaceTooSmall {
            op: "grouped_gemm_sm90",
            needed: plan.workspace_bytes,
            got: workspace.len() as u64,
        });
    }
    // The guards make `stream` wait for earlier writers of each buffer and record this use; they must outlive
    // the C++ call that queues the kernels, so they are bound to named locals.
    let (a_ptr, _a_guard) = a.device_ptr(stream);
    let (b_ptr, _b_guard) = b.device_ptr(stream);
    let (o_ptr, _o_guard) = offsets.device_ptr(stream);
    let (d_ptr, _d_guard) = d.device_ptr_mut(stream);
    let workspace_bytes = workspace.len() as u64;
    let (w_ptr, _w_guard) = workspace.device_ptr_mut(stream);
    let (s_ptr, _s_guard) = status.device_ptr_mut(stream);
    for (name, p) in [("a", a_ptr), ("b", b_ptr), ("d", d_ptr)] {
        need_aligned(name, p)?;
    }
    let params = ffi::GroupedGemmParams {
        dtype: dtype(T::DTYPE),
        config: config(plan.config),
        groups: s.groups() as i32,
        n: s.n() as i32,
        k: s.k() as i32,
        max_rows: s.max_rows() as i64,
        a: a_ptr,
        b: b_ptr,
        d: d_ptr,
        offsets: o_ptr,
        workspace: w_ptr,
        workspace_bytes,
        status: s_ptr,
        device: plan.device,
        sm_count: plan.sm_count,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: every address is a live cudarc allocation on this stream's context, checked above to hold what the
    // validated shape implies (A max_rows*K, B G*N*K, D max_rows*N, offsets G+1, workspace >= the size C++
    // asked for, status one u32 by its type); A/B/D bases are 16-byte aligned and K, N are multiples of 8 (GroupedGemmShape), so every group
    // base is too. Offsets are device data the kernel clamps to [0, max_rows] before use. The guards above keep
    // the buffers ordered on `stream`, and the borrows keep them alive until this function returns; cudarc frees
    // memory stream-ordered, so queued work never outlives its buffers.
    let status = unsafe { ffi::grouped_gemm_sm90_run(&params) };
    check("grouped_gemm_sm90", T::DTYPE, plan.config, status)
}
