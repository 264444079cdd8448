//! PyTorch's memory and stream seen through cudarc without owning them: the only `unsafe` of the package.
//!
//! cudarc frees a `CudaSlice` when it is dropped; memory that PyTorch's allocator handed out must never reach
//! that drop. Every buffer made here is therefore a [`Borrowed`], which gives the pointer back with
//! `CudaSlice::leak` when it goes, and the layer's weights are taken apart and leaked the same way when the
//! layer goes (`lib.rs`).

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};

use moe_gemm::cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr};

/// The primary context of `device`, the one PyTorch uses, retained once per process. Its event tracking is off:
/// cudarc would otherwise record an event per buffer use, and ordering is PyTorch's, by its streams.
pub fn context(device: usize) -> Result<Arc<CudaContext>, moe_gemm::Error> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut map = CONTEXTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ctx) = map.get(&device) {
        ctx.bind_to_thread()?;
        return Ok(ctx.clone());
    }
    let ctx = moe_gemm::device::open(device)?;
    // SAFETY: no CudaSlice of this context exists yet; every one made later is ordered by PyTorch's streams
    // (the op runs on the caller's current stream, as every PyTorch op does).
    unsafe { ctx.disable_event_tracking() };
    map.insert(device, ctx.clone());
    Ok(ctx)
}

/// PyTorch's stream `handle` (`torch.cuda.current_stream().cuda_stream`), not destroyed when dropped.
pub fn stream(ctx: &Arc<CudaContext>, handle: u64) -> Arc<CudaStream> {
    // SAFETY: the handle comes from torch.cuda.current_stream() of the context's device (checked by the Python
    // side); PyTorch never destroys its streams, so it outlives the wrapper.
    unsafe { ctx.wrap_borrowed_stream(handle as sys::CUstream) }
}

/// `len` elements of type `T` at `ptr`, owned by PyTorch.
pub struct Borrowed<T>(ManuallyDrop<CudaSlice<T>>);

impl<T: DeviceRepr> Borrowed<T> {
    /// # Safety
    /// `ptr` must be the address of a live PyTorch tensor on the stream's device holding at least `len`
    /// elements of `T` (the Python side checks dtype, device, shape and contiguity and passes `data_ptr()`),
    /// kept alive by the caller for as long as the work queued on it runs.
    pub unsafe fn new(stream: &Arc<CudaStream>, ptr: u64, len: usize) -> Self {
        // With event tracking off, upgrade_device_ptr records nothing and allocates nothing on the device.
        Borrowed(ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<T>(ptr as sys::CUdeviceptr, len) }))
    }

    /// The slice by value, for a constructor that takes ownership; give it back with [`release`].
    pub fn into_slice(mut self) -> CudaSlice<T> {
        // SAFETY: self is forgotten right after, so the slice is taken exactly once and never dropped here.
        let s = unsafe { ManuallyDrop::take(&mut self.0) };
        std::mem::forget(self);
        s
    }
}

impl<T> std::ops::Deref for Borrowed<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Borrowed<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

impl<T> Drop for Borrowed<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; leak() hands the pointer back without freeing it.
        release(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

/// Lets go of a slice made from PyTorch's memory without freeing it.
pub fn release<T>(s: CudaSlice<T>) {
    let _ = s.leak();
}
