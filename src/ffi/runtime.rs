//! The process, the driver and the runtime: driver probe and version, the linked runtime's version, the
//! benchmarks' spin and read-sweep kernels, SIGPIPE, and memory-mapping checkpoint files.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::bridge::ffi;
use super::status::cuda_result;
use crate::error::{Error, Result};

/// Restores the default action of SIGPIPE (Rust ignores it, so `println!` into a closed pipe panics).
#[cfg(feature = "cli")]
pub(crate) fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL has no memory-safety preconditions; called once at the
    // start of the command-line tool, before any thread is spawned.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `n` elements nothing writes: the planted bug `MOE_GEMM_PLANT=uninit-status` (build.rs) and nothing else.
#[cfg(moe_gemm_plant_uninit_status)]
pub(crate) fn alloc_unwritten<T: cudarc::driver::DeviceRepr>(
    stream: &std::sync::Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    // SAFETY: the memory is left unwritten on purpose; only device kernels read it (initcheck's planted case).
    Ok(unsafe { stream.alloc::<T>(n)? })
}

/// `ids` (u32, as candle's arg-sort gives top-k ids) as the i32 the layouts read: the same bits, so an id of 2^31
/// or more reads as negative, which the layout kernels treat as out of range (clamped and flagged, never used).
#[cfg(feature = "candle")]
pub(crate) fn u32_ids_as_i32(ids: cudarc::driver::CudaView<'_, u32>) -> cudarc::driver::CudaView<'_, i32> {
    let n = ids.len();
    // SAFETY: i32 and u32 have the same size and alignment and every bit pattern is a valid i32; the view
    // covers exactly the u32 view's bytes and lives no longer than it; only device kernels read it.
    unsafe { ids.transmute::<i32>(n) }.expect("an i32 view of n elements fits n u32")
}

/// Maps a checkpoint file read-only.
pub(crate) fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to the Checkpoint that owns it; as with every memory-mapped
    // file, another process truncating the file while it is mapped would fault, which callers accept by
    // loading checkpoints (documented on Checkpoint::open).
    unsafe { memmap2::Mmap::map(file) }
}

/// Whether libcuda can be loaded (cudarc's dynamic loading panics on first use otherwise).
#[cfg(feature = "cuda-dynamic-loading")]
pub(crate) fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen the driver library and reports whether that succeeded.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Always true with dynamic linking: the loader resolved libcuda before the program started, or it did not start.
#[cfg(not(feature = "cuda-dynamic-loading"))]
pub(crate) fn driver_present() -> bool {
    true
}

/// The CUDA version the installed driver supports (e.g. 13000). Call only after [`driver_present`].
pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: the driver library is loaded (caller checked `driver_present`); the call writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// The CUDA runtime version linked statically into the library (e.g. 13000).
pub(crate) fn cudart_version() -> i32 {
    ffi::cudart_version()
}

/// Queues a kernel that keeps `stream` busy for `ns` nanoseconds.
pub(crate) fn spin(stream: &CudaStream, ns: u64) -> Result<()> {
    super::bind(stream)?;
    // SAFETY: the stream handle comes from a live cudarc stream whose context is bound to this thread; the
    // kernel touches no memory.
    cuda_result("spin", unsafe { ffi::spin(ns, stream.cu_stream() as u64) })
}

/// Queues a streaming read of the first `bytes` of `buf` (rounded up to whole 16-byte vectors) by `sink.len()`
/// blocks.
#[cfg_attr(not(feature = "cli"), allow(dead_code))] // the bandwidth ceiling and read floors of the benchmarks
pub(crate) fn read_sweep<T>(
    stream: &CudaStream,
    buf: &CudaSlice<T>,
    bytes: usize,
    sink: &mut CudaSlice<u32>,
) -> Result<()> {
    let vectors = bytes.div_ceil(16) * 16;
    if vectors > buf.num_bytes() {
        return Err(Error::InvalidProblem(format!(
            "read_sweep: {bytes} bytes ({vectors} in 16-byte vectors) asked of a buffer of {}",
            buf.num_bytes()
        )));
    }
    super::bind(stream)?;
    let blocks = sink.len().min(i32::MAX as usize) as i32;
    let (p, _p) = buf.device_ptr(stream);
    let (s, _s) = sink.device_ptr_mut(stream);
    // SAFETY: the kernel reads `vectors` <= buf's size bytes from its (256-byte aligned) start and writes at most
    // one word per block into sink, which has `blocks` words; the guards order both on `stream`, whose context is
    // bound to this thread.
    cuda_result("read_sweep", unsafe { ffi::read_sweep(p, vectors as u64, s, blocks, stream.cu_stream() as u64) })
}
