//! The bottom floor: the one door to C++ (the cxx bridge, `bridge`) and the launch layer around it. Every
//! `unsafe` block of the crate lives under this module, each with the argument for its safety.
//!
//! ffi knows no domain type: it takes cudarc buffers, `DType`/`Element` and its own plain descriptors (the
//! bridge's shared enums, small structs of scalars and buffers defined here), which `kernels`, `layouts`,
//! `routing` and `layer` build from their validated types. Each launcher binds the stream's context to the calling thread,
//! checks the buffer lengths and alignments its unsafe call relies on (O(1) host work: nothing is allocated,
//! copied, read back or synchronised), holds cudarc's stream-ordering guards until the C++ call has queued its
//! work, and maps the C++ status to `crate::Error` (`status`).
//!
//! | module | what |
//! |---|---|
//! | `bridge` | the `#[cxx::bridge]`: shared enums and params, the C++ functions |
//! | `grouped` | SM90 grouped GEMM: built / workspace / launch |
//! | `grouped_fp8` | SM90 and SM100 FP8 blockwise-scaled grouped GEMMs: built / facts / workspace / launch |
//! | `fused` | fused MoE GEMMs: prepare (per plan) / launch |
//! | `routing` | routers |
//! | `layouts` | layout build, gather, combine |
//! | `elementwise` | activation, the fused backend's sum over slots, the batched decode layer |
//! | `quant` | FP8 activation quantisation: rows, rows gathered to layout positions, rows in use |
//! | `runtime` | driver and runtime facts, spin, read sweep, SIGPIPE, mmap of checkpoints |
//! | `cublas` | the ceilings' cuBLAS bf16 and cuBLASLt fp8 GEMMs |
//! | `status` | `LaunchStatus` → `Error` |

mod bridge;
mod bridge_fp8;
#[cfg(feature = "cli")]
pub(crate) mod cublas;
pub(crate) mod decode_fp8;
pub(crate) mod elementwise;
pub(crate) mod ep;
pub(crate) mod fused;
pub(crate) mod grouped;
pub(crate) mod grouped_fp8;
pub(crate) mod grouped_fp8_rowwise;
pub(crate) mod grouped_mx;
pub(crate) mod layouts;
pub(crate) mod mx_quant;
pub(crate) mod quant;
pub(crate) mod routing;
pub(crate) mod runtime;
mod status;

use cudarc::driver::CudaStream;

pub(crate) use bridge::ffi::{Activation, FusedTile, GateUp, LayoutKind, RouterKind, TileConfig};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

fn dtype(d: DType) -> bridge::ffi::DType {
    match d {
        DType::BF16 => bridge::ffi::DType::BF16,
        DType::F16 => bridge::ffi::DType::F16,
    }
}

/// Makes the stream's context current on this thread: a fresh thread, or one that last worked on another
/// device, then launches on the stream's device. Cheap when it already is current (one driver query).
fn bind(stream: &CudaStream) -> Result<()> {
    Ok(stream.context().bind_to_thread()?)
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

/// A row length (in elements of `T`) whose rows start on 16-byte boundaries when the base does: the element
/// type's TMA alignment, which the kernels' vector loads and TMA descriptors need. Positive and within int32.
fn need_row_len<T: Element>(name: &'static str, len: usize) -> Result<()> {
    let align = T::DTYPE.tma_alignment();
    if len == 0 || len % align != 0 || len > i32::MAX as usize {
        return Err(Error::InvalidProblem(format!(
            "{name} = {len}: must be a positive multiple of {align} within int32 (16-byte rows of {})",
            T::DTYPE
        )));
    }
    Ok(())
}

/// `v` as the kernels' int32 extent named `name`.
fn to_i32(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidProblem(format!("{name} = {v} exceeds the kernels' int32 range")))
}

/// `v` as the kernels' int64 extent named `name`.
fn to_i64(name: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidProblem(format!("{name} = {v} exceeds the kernels' int64 range")))
}
