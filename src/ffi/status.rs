//! The C++ launch status (`Status` in `cpp/common/launch.h`) and `cudaError_t` codes as [`Error`]s.

use std::fmt;

use super::bridge::ffi;
use super::sys::{Status, StatusCode};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What a launch was, for the error its status becomes.
#[derive(Clone, Copy)]
pub(crate) struct Launched<'a> {
    pub op: &'static str,
    pub dtype: Option<DType>,
    /// The tile configuration (a bridge enum, named by its `Debug`), where the operation has one.
    pub config: Option<&'a dyn fmt::Debug>,
    /// Bytes of workspace the launch was given (0 where it takes none).
    pub workspace_bytes: u64,
}

impl Launched<'_> {
    /// An operation with no element type, configuration or workspace.
    pub fn op(op: &'static str) -> Self {
        Launched { op, dtype: None, config: None, workspace_bytes: 0 }
    }

    /// An operation over elements of `dtype`.
    pub fn typed(op: &'static str, dtype: DType) -> Self {
        Launched { dtype: Some(dtype), ..Launched::op(op) }
    }
}

/// The status of an entry point with no kernel for what was asked (an element type or tile a unit does not build).
pub(crate) const NOT_BUILT: Status = Status { code: StatusCode::NotBuilt, detail: 0 };

/// `cudaGetErrorName` of a `cudaError_t` code, e.g. `cudaErrorInvalidValue` for 1 (no device needed).
pub(crate) fn cuda_error_name(code: i32) -> String {
    // SAFETY: C++ returns cudaGetErrorName's string, a literal of the runtime, or null.
    match unsafe { super::bridge::static_name(ffi::cuda_error_name(code)) } {
        "" => "unknown CUDA error".to_string(),
        name => name.to_string(),
    }
}

/// A `cudaError_t` returned by `op`: `Ok` for `cudaSuccess` (0).
pub(crate) fn cuda_result(op: &'static str, code: i32) -> Result<()> {
    match code {
        0 => Ok(()),
        code => Err(cuda_error(op, code)),
    }
}

fn cuda_error(op: &'static str, code: i32) -> Error {
    Error::CudaRuntime { op, code, name: cuda_error_name(code) }
}

/// The status of a launch as a `Result`.
pub(crate) fn check(s: Status, l: &Launched<'_>) -> Result<()> {
    let op = l.op;
    let cutlass = |stage| Err(Error::Cutlass { op, stage, status: cutlass_status_name(s.detail) });
    match s.code {
        StatusCode::Ok => Ok(()),
        StatusCode::NotBuilt => {
            Err(Error::KernelNotBuilt { op, dtype: l.dtype, config: l.config.map(|c| format!("{c:?}")) })
        }
        // detail: the bytes needed, clamped to i32::MAX by C++.
        StatusCode::WorkspaceTooSmall => {
            Err(Error::WorkspaceTooSmall { op, needed: s.detail.max(0) as u64, got: l.workspace_bytes })
        }
        StatusCode::CutlassCannotImplement => cutlass("can_implement"),
        StatusCode::CutlassInitialize => cutlass("initialize"),
        StatusCode::CutlassRun => cutlass("run"),
        StatusCode::Cuda => Err(cuda_error(op, s.detail)),
        // A code this build does not know: StatusCode is a newtype, so any u32 C++ returns is a value.
        _ => Err(Error::InvalidProblem(format!("{op}: unknown launch status {:?} (detail {})", s.code, s.detail))),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: StatusCode, detail: i32) -> Status {
        Status { code, detail }
    }

    #[test]
    fn cuda_error_names_come_from_the_runtime() {
        assert_eq!(cuda_error_name(0), "cudaSuccess");
        assert_eq!(cuda_error_name(1), "cudaErrorInvalidValue");
        assert_eq!(cuda_error_name(2), "cudaErrorMemoryAllocation");
        let e = cuda_result("spin", 1).unwrap_err();
        assert_eq!(e.to_string(), "CUDA runtime error cudaErrorInvalidValue (1) in spin");
        assert!(cuda_result("spin", 0).is_ok());
    }

    #[test]
    fn ok_is_ok() {
        assert!(check(status(StatusCode::Ok, 0), &Launched::op("route")).is_ok());
    }

    #[test]
    fn not_built_names_the_operation_not_a_cuda_code() {
        let e = check(status(StatusCode::NotBuilt, 0), &Launched::op("route")).unwrap_err();
        assert!(matches!(e, Error::KernelNotBuilt { op: "route", dtype: None, config: None }), "{e:?}");
        assert_eq!(e.to_string(), "kernel not built: route (see `moe-gemm info` for what was compiled)");

        // Any configuration enum, named by its Debug (a family's tile configuration, in the launchers).
        let config = super::super::sys::GroupMode::Masked;
        let l = Launched { config: Some(&config), ..Launched::typed("grouped_gemm_sm90", DType::F16) };
        let e = check(status(StatusCode::NotBuilt, 0), &l).unwrap_err();
        assert!(e.to_string().starts_with("kernel not built: grouped_gemm_sm90 for f16 with Masked"), "{e}");
    }

    #[test]
    fn workspace_too_small_reports_the_bytes_given() {
        let l = Launched { workspace_bytes: 1024, ..Launched::typed("grouped_gemm_sm90", DType::BF16) };
        let e = check(status(StatusCode::WorkspaceTooSmall, 4096), &l).unwrap_err();
        assert!(matches!(e, Error::WorkspaceTooSmall { needed: 4096, got: 1024, .. }), "{e:?}");
    }

    #[test]
    fn cutlass_stages_and_cuda_codes_are_named() {
        let l = Launched::typed("grouped_gemm_sm90", DType::BF16);
        let e = check(status(StatusCode::CutlassInitialize, 6), &l).unwrap_err();
        assert_eq!(e.to_string(), "CUTLASS initialize failed in grouped_gemm_sm90: kErrorWorkspaceNull (6)");
        let e = check(status(StatusCode::CutlassCannotImplement, 1), &l).unwrap_err();
        assert!(matches!(e, Error::Cutlass { stage: "can_implement", .. }), "{e:?}");
        let e = check(status(StatusCode::CutlassRun, 7), &l).unwrap_err();
        assert!(matches!(e, Error::Cutlass { stage: "run", .. }), "{e:?}");
        let e = check(status(StatusCode::Cuda, 1), &Launched::op("activate")).unwrap_err();
        assert!(matches!(&e, Error::CudaRuntime { op: "activate", code: 1, name } if name == "cudaErrorInvalidValue"));
        assert_eq!(e.to_string(), "CUDA runtime error cudaErrorInvalidValue (1) in activate");
    }

    #[test]
    fn an_unknown_status_code_is_an_error_not_undefined_behaviour() {
        let e = check(status(StatusCode(99), 5), &Launched::op("route")).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidProblem(m) if m == "route: unknown launch status StatusCode(99) (detail 5)"),
            "{e:?}"
        );
    }
}
