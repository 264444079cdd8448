//! The crate's one error type.

use crate::dtype::DType;

/// Everything that can go wrong in moe-gemm. Messages name the violated constraint and the values involved.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A problem description violates a shape or alignment constraint of the kernels.
    #[error("invalid problem: {0}")]
    InvalidProblem(String),

    /// A buffer passed at launch does not match the plan it is launched with.
    #[error("buffer `{name}`: {detail}")]
    Buffer { name: &'static str, detail: String },

    /// The device's architecture is not one the operation was built for.
    #[error("{op} needs an {required} GPU, but device {ordinal} ({name}) is compute capability {major}.{minor}")]
    UnsupportedArch { op: &'static str, required: &'static str, ordinal: usize, name: String, major: i32, minor: i32 },

    /// The requested kernel (operation, element type where it has one, tile configuration where it has one) was
    /// not compiled into the library.
    #[error("kernel not built: {op}{} (see `moe-gemm info` for what was compiled)", kernel_detail(.dtype, .config))]
    KernelNotBuilt { op: &'static str, dtype: Option<DType>, config: Option<String> },

    /// A workspace smaller than the plan requires.
    #[error("workspace too small: {op} needs {needed} bytes, the workspace has {got}")]
    WorkspaceTooSmall { op: &'static str, needed: u64, got: u64 },

    /// CUTLASS refused or failed an operation.
    #[error("CUTLASS {stage} failed in {op}: {status}")]
    Cutlass { op: &'static str, stage: &'static str, status: String },

    /// A CUDA runtime call or kernel launch failed: `code` is the `cudaError_t`, `name` its `cudaGetErrorName`.
    #[error("CUDA runtime error {name} ({code}) in {op}")]
    CudaRuntime { op: &'static str, code: i32, name: String },

    /// A cuBLAS or cuBLASLt call failed (the ceilings' dense GEMMs).
    #[error("{op} failed: {status}")]
    Cublas { op: &'static str, status: String },

    /// A device-side check found invalid data (offsets, ids, capacity); the kernels clamped instead of
    /// reading or writing out of bounds, so the results of that launch are not meaningful.
    #[error("device-side check failed: {what} (status word {word:#x})")]
    DeviceCheck { word: u32, what: String },

    /// An NCCL call of the expert-parallel step failed.
    #[error("NCCL {op} failed: {status}")]
    Nccl { op: &'static str, status: String },

    /// A checkpoint tensor is missing, malformed or does not fit the others. `file` is the checkpoint it was read
    /// from (`None` for tensors that came from elsewhere, as [`crate::checkpoint::pack_experts`]'s lookup).
    #[error("checkpoint tensor `{tensor}`{}: {problem}", in_file(.file))]
    Checkpoint { file: Option<std::path::PathBuf>, tensor: String, problem: String },

    /// A checkpoint or config file that cannot be read, or is not what it claims to be (truncated, a malformed
    /// safetensors header).
    #[error("checkpoint file `{}`: {problem}", .file.display())]
    CheckpointFile { file: std::path::PathBuf, problem: String },

    /// No CUDA driver (libcuda) could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),

    /// An error of the CUDA driver API, through cudarc.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    /// An unexpected C++ exception crossed the bridge.
    #[error("C++ exception across the bridge: {0}")]
    Bridge(#[from] cxx::Exception),
}

fn in_file(file: &Option<std::path::PathBuf>) -> String {
    file.as_ref().map_or_else(String::new, |f| format!(" in `{}`", f.display()))
}

fn kernel_detail(dtype: &Option<DType>, config: &Option<String>) -> String {
    let mut s = String::new();
    if let Some(d) = dtype {
        s += &format!(" for {d}");
    }
    if let Some(c) = config {
        s += &format!(" with {c}");
    }
    s
}

/// The message of an expected [`Error::InvalidProblem`], for the tests of checks that name their constraint.
#[cfg(test)]
pub(crate) fn invalid_problem(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
