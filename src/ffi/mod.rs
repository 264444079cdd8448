//! The one door to C++: the cxx bridge (`bridge`) and the launch layer around it. Every `unsafe` block of the
//! crate lives in this module, each with the argument for its safety.
//!
//! The launch functions take cudarc views and hold their stream-ordering guards until the C++ call has queued
//! its work; they check buffer sizes against an already validated problem (O(1) host work: nothing is
//! allocated, copied, read back or synchronised).

mod bridge;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::kernels::grouped::GroupRows;
use crate::layouts::{LayoutDims, LayoutSpec};
use crate::routing::{RouterConfig, RouterKind};

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

fn activation(a: crate::layer::Activation) -> ffi::Activation {
    use crate::layer::Activation;
    match a {
        Activation::SiluGated => ffi::Activation::SiluGated,
        Activation::GptOssSwiglu => ffi::Activation::GptOssSwiglu,
        Activation::Silu => ffi::Activation::Silu,
    }
}

fn gate_up(g: crate::layer::GateUp) -> ffi::GateUp {
    use crate::layer::GateUp;
    match g {
        GateUp::Concatenated => ffi::GateUp::Concatenated,
        GateUp::Interleaved => ffi::GateUp::Interleaved,
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
        ffi::StatusCode::WorkspaceTooSmall => Err(Error::WorkspaceTooSmall { op, needed: s.detail as u64, got: 0 }),
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

/// Restores the default action of SIGPIPE (Rust ignores it, so `println!` into a closed pipe panics).
pub(crate) fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL has no memory-safety preconditions; called once at the
    // start of the command-line tool, before any thread is spawned.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Maps a checkpoint file read-only.
pub(crate) fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to the Checkpoint that owns it; as with every memory-mapped
    // file, another process truncating the file while it is mapped would fault, which callers accept by
    // loading checkpoints (documented on Checkpoint::open).
    unsafe { memmap2::Mmap::map(file) }
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

/// Queues a kernel that keeps `stream` busy for `ns` nanoseconds.
pub(crate) fn spin(stream: &CudaStream, ns: u64) -> Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: the stream handle comes from a live cudarc stream whose context is bound to this thread; the
    // kernel touches no memory.
    match unsafe { ffi::spin(ns, stream.cu_stream() as u64) } {
        0 => Ok(()),
        code => Err(Error::CudaRuntime { op: "spin", code }),
    }
}

/// Queues a streaming read of all of `buf` (its whole 16-byte vectors) by `sink.len()` blocks.
pub(crate) fn read_sweep<T>(stream: &CudaStream, buf: &CudaSlice<T>, sink: &mut CudaSlice<u32>) -> Result<()> {
    let bytes = (buf.num_bytes() / 16 * 16) as u64;
    let blocks = sink.len().min(i32::MAX as usize) as i32;
    let (p, _p) = buf.device_ptr(stream);
    let (s, _s) = sink.device_ptr_mut(stream);
    // SAFETY: the kernel reads bytes <= buf's size from its (256-byte aligned) start and writes at most one
    // word per block into sink, which has `blocks` words; the guards order both on `stream`.
    match unsafe { ffi::read_sweep(p, bytes, s, blocks, stream.cu_stream() as u64) } {
        0 => Ok(()),
        code => Err(Error::CudaRuntime { op: "read_sweep", code }),
    }
}

/// Whether libcublas can be loaded (cudarc panics on first use otherwise).
pub(crate) fn cublas_present() -> bool {
    // SAFETY: only attempts to dlopen the library and reports whether that succeeded.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Queues `C = A · B` for square bf16 matrices of side `n` through cuBLAS (column-major, no transposes).
pub(crate) fn cublas_gemm_bf16(
    blas: &cudarc::cublas::CudaBlas,
    n: usize,
    a: &CudaSlice<half::bf16>,
    b: &CudaSlice<half::bf16>,
    c: &mut CudaSlice<half::bf16>,
) -> Result<()> {
    use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    need_len("a", a.len(), n * n, "n x n")?;
    need_len("b", b.len(), n * n, "n x n")?;
    need_len("c", c.len(), n * n, "n x n")?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: half::bf16::ONE,
        lda: n as i32,
        ldb: n as i32,
        beta: half::bf16::ZERO,
        ldc: n as i32,
    };
    // SAFETY: a, b, c hold n*n elements each (checked), matching the leading dimensions given to cuBLAS.
    unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| Error::InvalidProblem(format!("cuBLAS gemm: {e:?}")))
}

/// Whether libcublasLt can be loaded (cudarc panics on first use otherwise).
pub(crate) fn cublaslt_present() -> bool {
    // SAFETY: only attempts to dlopen the library and reports whether that succeeded.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// A dense fp8 GEMM through cuBLASLt, `D [n, n] bf16 = Aᵀ · B` with A, B e4m3 `[n, n]` (the TN form cuBLASLt's
/// fp8 kernels take), fp32 accumulation, unit scales: the dense fp8 ceiling. cudarc's safe cuBLASLt API has no
/// fp8 matmul, so this drives its raw descriptors; every handle is owned here and destroyed on drop.
pub(crate) struct CublasLtFp8Gemm {
    stream: std::sync::Arc<CudaStream>,
    handle: cudarc::cublaslt::sys::cublasLtHandle_t,
    desc: cudarc::cublaslt::sys::cublasLtMatmulDesc_t,
    ab: cudarc::cublaslt::sys::cublasLtMatrixLayout_t,
    d: cudarc::cublaslt::sys::cublasLtMatrixLayout_t,
    algo: cudarc::cublaslt::sys::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    n: usize,
}

impl CublasLtFp8Gemm {
    pub(crate) fn new(stream: &std::sync::Arc<CudaStream>, n: usize) -> Result<Self> {
        use cudarc::cublaslt::result as lt;
        use cudarc::cublaslt::sys;
        let err = |what: &str, e: lt::CublasError| Error::InvalidProblem(format!("cuBLASLt fp8 {what}: {e}"));
        const WORKSPACE: usize = 32 << 20;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE)?;
        let handle = lt::create_handle().map_err(|e| err("handle", e))?;
        // Owned from here: a failure below drops `this`, which destroys whatever was created.
        let mut this = CublasLtFp8Gemm {
            stream: stream.clone(),
            handle,
            desc: std::ptr::null_mut(),
            ab: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: a plain C struct of integers; overwritten by the heuristic before any use.
            algo: unsafe { std::mem::zeroed() },
            workspace,
            n,
        };
        this.desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(|e| err("matmul desc", e))?;
        let trans = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: `desc` is live; the attribute is a cublasOperation_t passed by pointer with its size.
        unsafe {
            lt::set_matmul_desc_attribute(
                this.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans as *const cudarc::cublas::sys::cublasOperation_t).cast(),
                std::mem::size_of::<cudarc::cublas::sys::cublasOperation_t>(),
            )
        }
        .map_err(|e| err("transa", e))?;
        let (rows, ld) = (n as u64, n as i64);
        this.ab = lt::create_matrix_layout(sys::cudaDataType::CUDA_R_8F_E4M3, rows, rows, ld)
            .map_err(|e| err("A/B layout", e))?;
        this.d =
            lt::create_matrix_layout(sys::cudaDataType::CUDA_R_16BF, rows, rows, ld).map_err(|e| err("D layout", e))?;
        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        // SAFETY: `pref` is live; the attribute is a usize passed by pointer with its size. Then the heuristic
        // reads the live descriptors, and `pref` is destroyed exactly once.
        let heuristic = unsafe {
            let ws = WORKSPACE;
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const usize).cast(),
                std::mem::size_of::<usize>(),
            );
            let h = set.and_then(|_| {
                lt::get_matmul_algo_heuristic(this.handle, this.desc, this.ab, this.ab, this.d, this.d, pref)
            });
            let _ = lt::destroy_matmul_pref(pref);
            h
        }
        .map_err(|e| err("heuristic (no fp8 algorithm for this device?)", e))?;
        this.algo = heuristic.algo;
        Ok(this)
    }

    /// Queues `d = aᵀ · b` on the stream the GEMM was made for.
    pub(crate) fn launch(&self, a: &CudaSlice<u8>, b: &CudaSlice<u8>, d: &mut CudaSlice<half::bf16>) -> Result<()> {
        let nn = self.n * self.n;
        need_len("a", a.len(), nn, "n x n e4m3")?;
        need_len("b", b.len(), nn, "n x n e4m3")?;
        need_len("d", d.len(), nn, "n x n bf16")?;
        let s = &self.stream;
        let (a_ptr, _a) = a.device_ptr(s);
        let (b_ptr, _b) = b.device_ptr(s);
        let (d_ptr, _d) = d.device_ptr_mut(s);
        let (w_ptr, _w) = self.workspace.device_ptr(s);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors are live and describe n x n matrices, which a, b and d hold (checked); the
        // workspace holds the bytes the heuristic was allowed; alpha/beta are host f32 (pointer mode host);
        // guards outlive the call, which only queues work on the stream.
        unsafe {
            cudarc::cublaslt::result::matmul(
                self.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                a_ptr as *const std::ffi::c_void,
                self.ab,
                b_ptr as *const std::ffi::c_void,
                self.ab,
                d_ptr as *const std::ffi::c_void,
                self.d,
                d_ptr as *mut std::ffi::c_void,
                self.d,
                &self.algo,
                w_ptr as *mut std::ffi::c_void,
                self.workspace.len(),
                s.cu_stream() as cudarc::cublaslt::sys::cudaStream_t,
            )
        }
        .map_err(|e| Error::InvalidProblem(format!("cuBLASLt fp8 matmul: {e}")))
    }
}

impl Drop for CublasLtFp8Gemm {
    fn drop(&mut self) {
        use cudarc::cublaslt::result as lt;
        // SAFETY: each handle was created by `new` (or is null and skipped) and is destroyed once, here.
        unsafe {
            if !self.d.is_null() {
                let _ = lt::destroy_matrix_layout(self.d);
            }
            if !self.ab.is_null() {
                let _ = lt::destroy_matrix_layout(self.ab);
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
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
#[allow(clippy::too_many_arguments)] // one argument per buffer: bundling them would hide which guard is which
pub(crate) fn launch_grouped_gemm_sm90<T: Element>(
    stream: &CudaStream,
    plan: &GroupedLaunch<'_>,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    rows: &GroupRows<'_>,
    d: &mut impl DevicePtrMut<T>,
    workspace: &mut CudaSlice<u8>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let s = plan.shape;
    let (mode, offsets, counts, max_m) = match rows {
        GroupRows::Offsets(o) => (ffi::GroupMode::Offsets, Some(o), None, 0usize),
        GroupRows::Padded { offsets, counts } => (ffi::GroupMode::Padded, Some(offsets), Some(counts), 0),
        GroupRows::Masked { masked_m, max_m } => (ffi::GroupMode::Masked, None, Some(masked_m), *max_m),
        GroupRows::PerRow { experts, .. } => (ffi::GroupMode::PerRow, None, Some(experts), 0),
    };
    // What A and B must hold, and how many groups this launch runs.
    let (a_rows, b_mats, groups, a_div, num_experts) = match rows {
        GroupRows::PerRow { rows, a_div, num_experts, .. } => {
            if *rows > s.groups() || *rows > s.max_rows() || *a_div == 0 || *num_experts == 0 {
                return Err(Error::InvalidProblem(format!(
                    "per-row groups: rows = {rows} must be <= the plan's groups ({}) and max_rows ({}), a_div = {a_div} and num_experts = {num_experts} positive",
                    s.groups(),
                    s.max_rows()
                )));
            }
            (rows.div_ceil(*a_div), *num_experts, *rows, *a_div, *num_experts)
        }
        _ => (s.max_rows(), s.groups(), s.groups(), 1, s.groups()),
    };
    need_len("a", a.len(), a_rows * s.k(), "rows of A x K")?;
    need_len("b", b.len(), b_mats * s.n() * s.k(), "matrices x N x K")?;
    if let Some(o) = offsets {
        need_len("offsets", o.len(), s.groups() + 1, "G + 1")?;
    }
    if let Some(c) = counts {
        need_len("counts", c.len(), groups, "groups")?;
    }
    if mode == ffi::GroupMode::Masked && s.groups() * max_m > s.max_rows() {
        return Err(Error::Buffer {
            name: "masked_m",
            detail: format!("G x max_m = {} x {max_m} exceeds the plan's max_rows = {}", s.groups(), s.max_rows()),
        });
    }
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
    let (o_ptr, _o_guard) = offsets.map(|o| o.device_ptr(stream)).unzip();
    let (c_ptr, _c_guard) = counts.map(|c| c.device_ptr(stream)).unzip();
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
        mode,
        max_m: max_m as i32,
        a_div: a_div as i32,
        experts: num_experts as i32,
        groups: groups as i32,
        n: s.n() as i32,
        k: s.k() as i32,
        max_rows: s.max_rows() as i64,
        a: a_ptr,
        b: b_ptr,
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
    // SAFETY: every address is a live cudarc allocation on this stream's context, checked above to hold what the
    // validated shape implies (A max_rows*K or the per-row tokens, B G*N*K or num_experts matrices, D
    // max_rows*N, offsets G+1 / counts per group where the mode reads them, G*max_m <= max_rows, per-row groups
    // <= G and max_rows, workspace >= the size C++ asked for for G >= the groups launched, status one u32); A/B/D bases are 16-byte aligned and K, N are multiples of 8 (GroupedGemmShape), so every group
    // base is too. Offsets and counts are device data the kernel clamps into [0, max_rows] and each group's room. The guards above keep
    // the buffers ordered on `stream`, and the borrows keep them alive until this function returns; cudarc frees
    // memory stream-ordered, so queued work never outlives its buffers.
    let status = unsafe { ffi::grouped_gemm_sm90_run(&params) };
    check("grouped_gemm_sm90", T::DTYPE, plan.config, status)
}

fn status_check(op: &'static str, s: ffi::LaunchStatus) -> Result<()> {
    match s.code {
        ffi::StatusCode::Ok => Ok(()),
        ffi::StatusCode::Cuda => Err(Error::CudaRuntime { op, code: s.detail }),
        _ => Err(Error::CudaRuntime { op, code: -1 }),
    }
}

/// Queues the router on `stream` for `tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_router(
    stream: &CudaStream,
    cfg: &RouterConfig,
    tokens: usize,
    logits: &impl DevicePtr<f32>,
    bias: Option<&CudaView<'_, f32>>,
    ids: &mut impl DevicePtrMut<i32>,
    weights: &mut impl DevicePtrMut<f32>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let (e, k) = (cfg.experts(), cfg.top_k());
    need_len("logits", logits.len(), tokens * e, "tokens x experts")?;
    need_len("topk_ids", ids.len(), tokens * k, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), tokens * k, "tokens x top_k")?;
    match (cfg.takes_bias(), bias) {
        (true, Some(b)) => need_len("bias", b.len(), e, "experts")?,
        (true, None) => {
            return Err(Error::Buffer {
                name: "bias",
                detail: "the grouped sigmoid router (DeepSeek-V3) needs e_score_correction_bias [experts]".into(),
            })
        }
        (false, Some(_)) => {
            return Err(Error::Buffer { name: "bias", detail: "this router takes no correction bias".into() })
        }
        (false, None) => {}
    }
    if tokens > i32::MAX as usize {
        return Err(Error::InvalidProblem(format!("tokens = {tokens} exceeds i32::MAX")));
    }
    let (kind, n_group, topk_group, renorm, scaling) = match cfg.kind() {
        RouterKind::Softmax { renormalize } => (ffi::RouterKind::Softmax, 1, 1, renormalize, 1.0),
        RouterKind::TopKSoftmax => (ffi::RouterKind::TopKSoftmax, 1, 1, false, 1.0),
        RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, routed_scaling_factor } => {
            (ffi::RouterKind::GroupedSigmoid, n_group, topk_group, renormalize, routed_scaling_factor)
        }
    };
    let (l_ptr, _l) = logits.device_ptr(stream);
    let (b_ptr, _b) = bias.map(|b| b.device_ptr(stream)).unzip();
    let (i_ptr, _i) = ids.device_ptr_mut(stream);
    let (w_ptr, _w) = weights.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let params = ffi::RouterParams {
        kind,
        tokens: tokens as i32,
        experts: e as i32,
        top_k: k as i32,
        n_group: n_group as i32,
        topk_group: topk_group as i32,
        renormalize: renorm as i32,
        scaling,
        logits: l_ptr,
        bias: b_ptr.unwrap_or(0),
        ids: i_ptr,
        weights: w_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: logits hold tokens*E f32, ids/weights tokens*k, bias E where the kind reads it (checked above);
    // E <= 1024 and k <= 32 by RouterConfig, which the kernel's shared memory and lane-per-choice rely on. The
    // guards order every buffer on `stream` and outlive the call that queues the kernel.
    status_check("route", unsafe { ffi::route(&params) })
}

/// Buffers a layout build writes, borrowed from an `ExpertLayout`.
pub(crate) struct LayoutOut<'a> {
    pub counts: &'a mut CudaSlice<i32>,
    pub offsets: &'a mut CudaSlice<i32>,
    pub sorted_ids: &'a mut CudaSlice<i32>,
    pub expert_ids: &'a mut CudaSlice<i32>,
    pub m_indices: &'a mut CudaSlice<i32>,
    pub positions: &'a mut CudaSlice<i32>,
    pub total: &'a mut CudaSlice<i32>,
    pub scratch: &'a mut CudaSlice<i32>,
}

/// int32 elements of scratch the layout build needs for `rows` rows (0 for the single-CTA path).
pub(crate) fn layout_scratch_ints(rows: usize, local_experts: usize) -> usize {
    ffi::layout_scratch_ints(rows as i64, local_experts as i64) as usize
}

/// Queues the layout build for `tokens` tokens.
pub(crate) fn launch_build_layout(
    stream: &CudaStream,
    dims: &LayoutDims,
    tokens: usize,
    topk_ids: &impl DevicePtr<i32>,
    expert_map: Option<&CudaView<'_, i32>>,
    out: LayoutOut<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let rows = tokens * dims.top_k;
    if tokens > dims.max_tokens {
        return Err(Error::InvalidProblem(format!(
            "tokens = {tokens} exceeds the layout's max_tokens = {}",
            dims.max_tokens
        )));
    }
    need_len("topk_ids", topk_ids.len(), rows, "tokens x top_k")?;
    if let Some(m) = expert_map {
        need_len("expert_map", m.len(), dims.experts, "experts")?;
    }
    let cap = dims.capacity();
    // The layout's own buffers were sized from `dims` at construction; checked again because they are
    // the kernel's bounds.
    need_len("counts", out.counts.len(), dims.local_experts, "local experts")?;
    need_len("offsets", out.offsets.len(), dims.local_experts + 1, "local experts + 1")?;
    need_len("sorted_ids", out.sorted_ids.len(), cap, "capacity")?;
    need_len("expert_ids", out.expert_ids.len(), cap / dims.block_m(), "capacity / block_m")?;
    need_len("m_indices", out.m_indices.len(), cap, "capacity")?;
    need_len("positions", out.positions.len(), dims.max_tokens * dims.top_k, "max_tokens x top_k")?;
    need_len("scratch", out.scratch.len(), layout_scratch_ints(rows, dims.local_experts), "chunks x experts x 2")?;
    let (kind, max_m) = match dims.spec {
        LayoutSpec::Masked { max_m } => (ffi::LayoutKind::Masked, max_m),
        _ => (ffi::LayoutKind::Packed, 0),
    };
    let (t_ptr, _t) = topk_ids.device_ptr(stream);
    let (m_ptr, _m) = expert_map.map(|m| m.device_ptr(stream)).unzip();
    let (c_ptr, _c) = out.counts.device_ptr_mut(stream);
    let (o_ptr, _o) = out.offsets.device_ptr_mut(stream);
    let (si_ptr, _si) = out.sorted_ids.device_ptr_mut(stream);
    let (ei_ptr, _ei) = out.expert_ids.device_ptr_mut(stream);
    let (mi_ptr, _mi) = out.m_indices.device_ptr_mut(stream);
    let (p_ptr, _p) = out.positions.device_ptr_mut(stream);
    let (tot_ptr, _tot) = out.total.device_ptr_mut(stream);
    let (sc_ptr, _sc) = out.scratch.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let params = ffi::LayoutParams {
        kind,
        rows: rows as i32,
        experts: dims.experts as i32,
        local_experts: dims.local_experts as i32,
        block_m: dims.block_m() as i32,
        max_m: max_m as i32,
        capacity: cap as i64,
        topk_ids: t_ptr,
        expert_map: m_ptr.unwrap_or(0),
        counts: c_ptr,
        offsets: o_ptr,
        sorted_ids: si_ptr,
        expert_ids: ei_ptr,
        m_indices: mi_ptr,
        positions: p_ptr,
        total: tot_ptr,
        scratch: sc_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: every buffer holds what `dims` implies (checked above: ids `rows`, map `experts`, counts and
    // offsets per local expert, the position-indexed arrays `capacity`, positions max_tokens*k, scratch what
    // C++ asks for these rows). Ids and map
    // entries are device data the kernel range-checks before indexing; positions past `capacity` are dropped.
    // Local experts <= 1024 (LayoutDims) bounds the kernel's shared memory. Guards outlive the call.
    status_check("build_layout", unsafe { ffi::build_layout(&params) })
}

/// Queues `out[positions[r]] = x[r / top_k]` for `tokens * top_k` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_gather<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    x: &impl DevicePtr<T>,
    positions: &CudaSlice<i32>,
    out: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    check_hidden(hidden)?;
    need_len("x", x.len(), tokens * hidden, "tokens x hidden")?;
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    let out_rows = out.len() / hidden;
    let (x_ptr, _x) = x.device_ptr(stream);
    let (p_ptr, _p) = positions.device_ptr(stream);
    let (o_ptr, _o) = out.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    for (name, p) in [("x", x_ptr), ("out", o_ptr)] {
        need_aligned(name, p)?;
    }
    // SAFETY: x holds tokens*hidden, positions tokens*top_k, out out_rows*hidden elements of 2 bytes, both
    // 16-byte aligned with hidden % 8 == 0 (16-byte rows); positions are device data the kernel checks against
    // out_rows before writing. Guards outlive the call.
    status_check("gather_rows", unsafe {
        ffi::gather_rows(
            (tokens * top_k) as i32,
            top_k as i32,
            hidden as i32,
            x_ptr,
            p_ptr,
            o_ptr,
            out_rows as i64,
            s_ptr,
            stream.cu_stream() as u64,
        )
    })
}

/// Queues `y[t] = Σ_j w[t, j] · d[positions[t·k + j]]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_combine<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    d: &impl DevicePtr<T>,
    positions: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    bias: Option<(&CudaView<'_, i32>, &CudaView<'_, f32>, usize)>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    check_hidden(hidden)?;
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), tokens * top_k, "tokens x top_k")?;
    need_len("y", y.len(), tokens * hidden, "tokens x hidden")?;
    // With a bias the kernel reads the expert of every row it combines: only rows that have one are valid.
    let d_rows = match bias {
        Some((re, _, _)) => (d.len() / hidden).min(re.len()),
        None => d.len() / hidden,
    };
    if let Some((_, b, experts)) = bias {
        need_len("b2 bias", b.len(), experts * hidden, "experts x hidden")?;
    }
    let (d_ptr, _d) = d.device_ptr(stream);
    let (p_ptr, _p) = positions.device_ptr(stream);
    let (w_ptr, _w) = weights.device_ptr(stream);
    let (re_ptr, _re) = bias.map(|(re, _, _)| re.device_ptr(stream)).unzip();
    let (b_ptr, _b) = bias.map(|(_, b, _)| b.device_ptr(stream)).unzip();
    let experts = bias.map(|(_, _, e)| e).unwrap_or(0);
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    for (name, p) in [("d", d_ptr), ("y", y_ptr)] {
        need_aligned(name, p)?;
    }
    // SAFETY: d holds d_rows*hidden, y tokens*hidden elements, positions and weights tokens*top_k (checked);
    // rows are 16-byte aligned (hidden % 8 == 0, aligned bases); the kernel skips positions outside
    // [0, d_rows) and bias rows of experts outside [0, experts); row experts cover d_rows (d_rows is clamped to
    // them), bias experts*hidden.
    // Guards outlive the call.
    status_check("combine_rows", unsafe {
        ffi::combine_rows(
            dtype(T::DTYPE),
            tokens as i32,
            top_k as i32,
            hidden as i32,
            d_ptr,
            d_rows as i64,
            p_ptr,
            w_ptr,
            re_ptr.unwrap_or(0),
            b_ptr.unwrap_or(0),
            experts as i32,
            y_ptr,
            stream.cu_stream() as u64,
        )
    })
}

/// Gated activation of the layer (mirrors `ActivationArgs`).
pub(crate) struct ActivationLaunch<'a> {
    pub act: crate::layer::Activation,
    pub gate_up: crate::layer::GateUp,
    pub inter: usize,
    pub rows: usize,
    pub total: Option<&'a CudaSlice<i32>>,
    pub row_experts: CudaView<'a, i32>,
    pub experts: usize,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Queues `h = act(d1 (+ bias))` for the rows of `d1 [rows, 2I or I]` that have an expert.
pub(crate) fn launch_activate<T: Element>(
    stream: &CudaStream,
    p: &ActivationLaunch<'_>,
    d1: &impl DevicePtr<T>,
    h: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let width = if p.act == crate::layer::Activation::Silu { p.inter } else { 2 * p.inter };
    need_len("d1", d1.len(), p.rows * width, "rows x (2I or I)")?;
    need_len("h", h.len(), p.rows * p.inter, "rows x I")?;
    need_len("row experts", p.row_experts.len(), p.rows, "rows")?;
    if let Some(b) = p.bias {
        need_len("b13 bias", b.len(), p.experts * width, "experts x (2I or I)")?;
    }
    if p.rows > u32::MAX as usize || p.inter > i32::MAX as usize {
        return Err(Error::InvalidProblem(format!("activation over {} rows of {} exceeds the grid", p.rows, p.inter)));
    }
    let (d_ptr, _d) = d1.device_ptr(stream);
    let (h_ptr, _h) = h.device_ptr_mut(stream);
    let (re_ptr, _re) = p.row_experts.device_ptr(stream);
    let (t_ptr, _t) = p.total.map(|t| t.device_ptr(stream)).unzip();
    let (b_ptr, _b) = p.bias.map(|b| b.device_ptr(stream)).unzip();
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let params = ffi::ActivationParams {
        dtype: dtype(T::DTYPE),
        act: activation(p.act),
        gate_up: gate_up(p.gate_up),
        inter: p.inter as i32,
        rows: p.rows as i64,
        total: t_ptr.unwrap_or(0),
        row_experts: re_ptr,
        experts: p.experts as i32,
        bias: b_ptr.unwrap_or(0),
        d1: d_ptr,
        h: h_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: d1 holds rows*(2I or I), h rows*I, row_experts rows, bias experts*(2I or I) (checked above); the
    // kernel skips rows whose expert is outside [0, experts) and rows at or past *total. Guards outlive the call.
    status_check("activate", unsafe { ffi::activate(&params) })
}

fn check_hidden(hidden: usize) -> Result<()> {
    if hidden == 0 || hidden % 8 != 0 || hidden > i32::MAX as usize {
        return Err(Error::InvalidProblem(format!(
            "hidden = {hidden}: must be a positive multiple of 8 (16-byte rows of 16-bit elements)"
        )));
    }
    Ok(())
}

/// Queues the two decode kernels of the batched backend: the whole layer for `tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_decode_layer<T: Element>(
    stream: &CudaStream,
    w: &crate::layer::ExpertWeights<T>,
    tokens: usize,
    top_k: usize,
    x: &impl DevicePtr<T>,
    ids: &CudaSlice<i32>,
    weights: &CudaSlice<f32>,
    h: &mut CudaSlice<T>,
    y: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let (hid, inter, e) = (w.hidden(), w.inter(), w.experts());
    let rows = tokens * top_k;
    need_len("x", x.len(), tokens * hid, "tokens x hidden")?;
    need_len("topk_ids", ids.len(), rows, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), rows, "tokens x top_k")?;
    need_len("h", h.len(), rows * inter, "rows x I")?;
    need_len("y", y.len(), tokens * hid, "tokens x hidden")?;
    if rows > u16::MAX as usize {
        return Err(Error::InvalidProblem(format!("decode path: {rows} rows exceed the grid's 65535")));
    }
    let (x_ptr, _x) = x.device_ptr(stream);
    let (i_ptr, _i) = ids.device_ptr(stream);
    let (wt_ptr, _wt) = weights.device_ptr(stream);
    let (w13_ptr, _w13) = w.w13.device_ptr(stream);
    let (w2_ptr, _w2) = w.w2.device_ptr(stream);
    let (b13_ptr, _b13) = w.b13.as_ref().map(|b| b.device_ptr(stream)).unzip();
    let (b2_ptr, _b2) = w.b2.as_ref().map(|b| b.device_ptr(stream)).unzip();
    let (h_ptr, _h) = h.device_ptr_mut(stream);
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    for (name, p) in [("x", x_ptr), ("y", y_ptr)] {
        need_aligned(name, p)?;
    }
    let params = ffi::DecodeParams {
        dtype: dtype(T::DTYPE),
        act: activation(w.activation()),
        gate_up: gate_up(w.gate_up()),
        tokens: tokens as i32,
        top_k: top_k as i32,
        experts: e as i32,
        hidden: hid as i32,
        inter: inter as i32,
        x: x_ptr,
        ids: i_ptr,
        weights: wt_ptr,
        w13: w13_ptr,
        w2: w2_ptr,
        b13: b13_ptr.unwrap_or(0),
        b2: b2_ptr.unwrap_or(0),
        h: h_ptr,
        y: y_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: x holds tokens*H, ids/weights tokens*k, h rows*I, y tokens*H (checked above); the weights hold
    // E*(2I or I)*H and E*H*I with biases E*(2I or I) and E*H (ExpertWeights validates at construction); H and
    // I are multiples of 8 (16-byte rows, aligned bases). Expert ids are device data the kernels range-check.
    status_check("decode_layer", unsafe { ffi::decode_layer(&params) })
}

fn fused_tile(t: crate::kernels::fused::FusedTile) -> ffi::FusedTile {
    use crate::kernels::fused::FusedTile;
    match t {
        FusedTile::M64N128K64 => ffi::FusedTile::M64N128K64,
        FusedTile::M128N256K64 => ffi::FusedTile::M128N256K64,
    }
}

/// One fused MoE GEMM over an aligned layout (mirrors `FusedGemmArgs`; see `kernels::fused`).
pub(crate) struct FusedLaunch<'a> {
    pub tile: crate::kernels::fused::FusedTile,
    /// `None`: gather (A = x by token, D by position); `Some`: scatter (A by position, D by flat row, weighted).
    pub scatter: Option<FusedScatter<'a>>,
    pub top_k: usize,
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    pub rows: usize,
    pub capacity: usize,
    /// SMs of the stream's device (the persistent grid), from the caller's plan.
    pub sm_count: i32,
    pub sorted_ids: &'a CudaSlice<i32>,
    pub expert_ids: &'a CudaSlice<i32>,
    pub total: &'a CudaSlice<i32>,
}

/// The scatter epilogue's router weights `[rows]` and bias `[experts, n]`.
pub(crate) struct FusedScatter<'a> {
    pub weights: &'a CudaSlice<f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Opts the kernel of (`d`, `tile`) into its dynamic shared memory on `stream`'s device: once per plan, before
/// its first launch (launches set no attribute).
pub(crate) fn fused_prepare(stream: &CudaStream, d: DType, tile: crate::kernels::fused::FusedTile) -> Result<()> {
    stream.context().bind_to_thread()?;
    status_check("fused_moe_prepare", ffi::fused_moe_prepare(dtype(d), fused_tile(tile)))
}

/// Queues one fused MoE GEMM (gather or scatter) on `stream`. The kernel of (`T`, `p.tile`) must have been
/// prepared ([`fused_prepare`]) on the stream's device.
pub(crate) fn launch_fused_gemm<T: Element>(
    stream: &CudaStream,
    p: &FusedLaunch<'_>,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    d: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let bm = p.tile.block_m();
    if p.top_k == 0 || p.rows % p.top_k != 0 || p.capacity % bm != 0 {
        return Err(Error::InvalidProblem(format!(
            "fused GEMM: rows = {} must be a multiple of top_k = {} and the layout's capacity {} a multiple of the tile's BLOCK_M = {bm}",
            p.rows, p.top_k, p.capacity
        )));
    }
    if p.rows > i32::MAX as usize || p.n > i32::MAX as usize || p.k > i32::MAX as usize {
        return Err(Error::InvalidProblem("fused GEMM: rows, n and k must fit int32".into()));
    }
    if p.sm_count <= 0 {
        return Err(Error::InvalidProblem(format!("fused GEMM: sm_count = {} must be positive", p.sm_count)));
    }
    need_len("sorted_ids", p.sorted_ids.len(), p.capacity, "the layout's capacity")?;
    need_len("expert_ids", p.expert_ids.len(), p.capacity / bm, "capacity / BLOCK_M")?;
    need_len("total", p.total.len(), 1, "one count")?;
    need_len("B", b.len(), p.experts * p.n * p.k, "experts x n x k")?;
    let (a_rows, d_rows) = match p.scatter {
        None => (p.rows / p.top_k, p.capacity),
        Some(_) => (p.capacity, p.rows),
    };
    need_len("A", a.len(), a_rows * p.k, "its rows x k")?;
    need_len("D", d.len(), d_rows * p.n, "its rows x n")?;
    if let Some(s) = &p.scatter {
        need_len("topk_weights", s.weights.len(), p.rows, "tokens x top_k")?;
        if let Some(bias) = s.bias {
            need_len("b2 bias", bias.len(), p.experts * p.n, "experts x n")?;
        }
    }
    let (a_ptr, _a) = a.device_ptr(stream);
    let (b_ptr, _b) = b.device_ptr(stream);
    let (d_ptr, _d) = d.device_ptr_mut(stream);
    for (name, ptr) in [("A", a_ptr), ("B", b_ptr), ("D", d_ptr)] {
        need_aligned(name, ptr)?;
    }
    let (s_ptr, _s) = p.sorted_ids.device_ptr(stream);
    let (e_ptr, _e) = p.expert_ids.device_ptr(stream);
    let (t_ptr, _t) = p.total.device_ptr(stream);
    let (w_ptr, _w) = p.scatter.as_ref().map(|s| s.weights.device_ptr(stream)).unzip();
    let (bias_ptr, _bias) = p.scatter.as_ref().and_then(|s| s.bias).map(|b| b.device_ptr(stream)).unzip();
    let params = ffi::FusedGemmParams {
        dtype: dtype(T::DTYPE),
        tile: fused_tile(p.tile),
        mode: if p.scatter.is_some() { ffi::FusedMode::Scatter } else { ffi::FusedMode::Gather },
        top_k: p.top_k as i32,
        experts: p.experts as i32,
        n: p.n as i32,
        k: p.k as i32,
        rows: p.rows as i32,
        sm_count: p.sm_count,
        capacity: p.capacity as i64,
        a: a_ptr,
        b: b_ptr,
        d: d_ptr,
        sorted_ids: s_ptr,
        expert_ids: e_ptr,
        total: t_ptr,
        weights: w_ptr.unwrap_or(0),
        bias: bias_ptr.unwrap_or(0),
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: A, B, D, sorted_ids, expert_ids, weights and bias hold what the mode needs (checked above), with
    // 16-byte aligned bases and n, k multiples of 8 (kernels::fused validates them). The kernel reads positions
    // below min(*total, capacity) only, skips tiles whose expert id is negative, zero-fills A rows whose flat row
    // is outside [0, rows) and writes D rows below capacity (gather) or flat rows in [0, rows) (scatter).
    // Expert ids come from our layout build, which only writes ids below `experts`. Guards outlive the call.
    status_check("fused_moe_gemm", unsafe { ffi::fused_moe_gemm(&params) })
}

/// Queues `y[t] = Σ_j pairs[t·k + j]` over the slots the layout placed (the Fused backend's combine).
pub(crate) fn launch_sum_slots<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    pairs: &impl DevicePtr<T>,
    positions: &CudaSlice<i32>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    check_hidden(hidden)?;
    need_len("pairs", pairs.len(), tokens * top_k * hidden, "tokens x top_k x hidden")?;
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    need_len("y", y.len(), tokens * hidden, "tokens x hidden")?;
    let (p_ptr, _p) = pairs.device_ptr(stream);
    let (pos_ptr, _pos) = positions.device_ptr(stream);
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    for (name, ptr) in [("pairs", p_ptr), ("y", y_ptr)] {
        need_aligned(name, ptr)?;
    }
    // SAFETY: pairs holds tokens*k*hidden, positions tokens*k, y tokens*hidden elements (checked), 16-byte
    // aligned rows (hidden % 8 == 0). Guards outlive the call.
    status_check("sum_slots", unsafe {
        ffi::sum_slots(
            dtype(T::DTYPE),
            tokens as i32,
            top_k as i32,
            hidden as i32,
            p_ptr,
            pos_ptr,
            y_ptr,
            stream.cu_stream() as u64,
        )
    })
}
