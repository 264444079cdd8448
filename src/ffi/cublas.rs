//! The ceilings' dense GEMMs: bf16 through cuBLAS and e4m3 through cuBLASLt (cudarc's handles), each planned
//! for one stream and one square size. Failures are [`Error::Cublas`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::need_len;
use crate::error::{Error, Result};

/// Whether libcublas can be loaded (cudarc panics on first use otherwise).
#[cfg(feature = "cuda-dynamic-loading")]
pub(crate) fn cublas_present() -> bool {
    // SAFETY: only attempts to dlopen the library and reports whether that succeeded.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Always true with dynamic linking: libcublas was linked at build time and resolved at start.
#[cfg(not(feature = "cuda-dynamic-loading"))]
pub(crate) fn cublas_present() -> bool {
    true
}

/// Whether libcublasLt can be loaded (cudarc panics on first use otherwise).
#[cfg(feature = "cuda-dynamic-loading")]
pub(crate) fn cublaslt_present() -> bool {
    // SAFETY: only attempts to dlopen the library and reports whether that succeeded.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// Always true with dynamic linking: libcublasLt was linked at build time and resolved at start.
#[cfg(not(feature = "cuda-dynamic-loading"))]
pub(crate) fn cublaslt_present() -> bool {
    true
}

/// `C = A · B` for square bf16 matrices of side `n` through cuBLAS (column-major, no transposes), on the stream
/// its handle was made for.
#[derive(Debug)]
pub(crate) struct CublasBf16Gemm {
    stream: Arc<CudaStream>,
    blas: cudarc::cublas::CudaBlas,
    n: usize,
}

impl CublasBf16Gemm {
    pub(crate) fn new(stream: &Arc<CudaStream>, n: usize) -> Result<Self> {
        super::bind(stream)?;
        let blas = cudarc::cublas::CudaBlas::new(stream.clone())
            .map_err(|e| Error::Cublas { op: "cuBLAS handle", status: format!("{e:?}") })?;
        Ok(CublasBf16Gemm { stream: stream.clone(), blas, n })
    }

    /// Queues `c = a · b`.
    pub(crate) fn launch(
        &self,
        a: &CudaSlice<half::bf16>,
        b: &CudaSlice<half::bf16>,
        c: &mut CudaSlice<half::bf16>,
    ) -> Result<()> {
        use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
        let n = self.n;
        need_len("a", a.len(), n * n, "n x n")?;
        need_len("b", b.len(), n * n, "n x n")?;
        need_len("c", c.len(), n * n, "n x n")?;
        let side = super::to_i32("n", n)?;
        super::bind(&self.stream)?;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: side,
            n: side,
            k: side,
            alpha: half::bf16::ONE,
            lda: side,
            ldb: side,
            beta: half::bf16::ZERO,
            ldc: side,
        };
        // SAFETY: a, b, c hold n*n elements each (checked), matching the leading dimensions given to cuBLAS; the
        // handle's stream is `self.stream`, whose context is bound to this thread.
        unsafe { self.blas.gemm(cfg, a, b, c) }
            .map_err(|e| Error::Cublas { op: "cuBLAS bf16 gemm", status: format!("{e:?}") })
    }
}

/// A dense fp8 GEMM through cuBLASLt, `D [n, n] bf16 = Aᵀ · B` with A, B e4m3 `[n, n]` (the TN form cuBLASLt's
/// fp8 kernels take), fp32 accumulation, unit scales: the dense fp8 ceiling. cudarc's safe cuBLASLt API has no
/// fp8 matmul, so this drives its raw descriptors; every handle is owned here and destroyed on drop.
pub(crate) struct CublasLtFp8Gemm {
    stream: Arc<CudaStream>,
    handle: cudarc::cublaslt::sys::cublasLtHandle_t,
    desc: cudarc::cublaslt::sys::cublasLtMatmulDesc_t,
    ab: cudarc::cublaslt::sys::cublasLtMatrixLayout_t,
    d: cudarc::cublaslt::sys::cublasLtMatrixLayout_t,
    algo: cudarc::cublaslt::sys::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    n: usize,
}

impl CublasLtFp8Gemm {
    pub(crate) fn new(stream: &Arc<CudaStream>, n: usize) -> Result<Self> {
        use cudarc::cublaslt::result as lt;
        use cudarc::cublaslt::sys;
        let err =
            |what: &str, e: lt::CublasError| Error::Cublas { op: "cuBLASLt fp8 GEMM", status: format!("{what}: {e}") };
        const WORKSPACE: usize = 32 << 20;
        super::bind(stream)?;
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
        super::bind(s)?;
        let (a_ptr, _a) = a.device_ptr(s);
        let (b_ptr, _b) = b.device_ptr(s);
        let (d_ptr, _d) = d.device_ptr_mut(s);
        let (w_ptr, _w) = self.workspace.device_ptr(s);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors are live and describe n x n matrices, which a, b and d hold (checked); the
        // workspace holds the bytes the heuristic was allowed; alpha/beta are host f32 (pointer mode host);
        // guards outlive the call, which only queues work on the stream, whose context is bound to this thread.
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
        .map_err(|e| Error::Cublas { op: "cuBLASLt fp8 matmul", status: e.to_string() })
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
