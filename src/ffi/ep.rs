//! Expert parallelism's helper kernel (`cpp/moe_ops/ep.cu`, contract in `cpp/moe_ops/ep.h`): the expert id of every send
//! position of a dispatch, or a sentinel on padding.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::bridge::ffi;
use super::status::{check, Launched};
use super::{need_len, to_i32, to_i64};
use crate::error::Result;

/// Queues `out[p] = ids[sorted_ids[p]]` for `sorted_ids[p] < rows`, else `sentinel`, for `p < capacity`.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))] // used by the NCCL step only
pub(crate) fn launch_gather_ids(
    stream: &CudaStream,
    capacity: usize,
    rows: usize,
    sorted_ids: &CudaSlice<i32>,
    ids: &impl DevicePtr<i32>,
    sentinel: i32,
    out: &mut impl DevicePtrMut<i32>,
) -> Result<()> {
    need_len("sorted_ids", sorted_ids.len(), capacity, "capacity")?;
    need_len("topk_ids", ids.len(), rows, "rows")?;
    need_len("send ids", out.len(), capacity, "capacity")?;
    let (capacity, rows) = (to_i64("capacity", capacity)?, to_i32("rows", rows)?);
    super::bind(stream)?;
    let (s_ptr, _s) = sorted_ids.device_ptr(stream);
    let (i_ptr, _i) = ids.device_ptr(stream);
    let (o_ptr, _o) = out.device_ptr_mut(stream);
    // SAFETY: sorted_ids and out hold capacity int32, ids rows int32 (checked); the kernel reads ids only below
    // rows. The stream's context is bound to this thread; guards outlive the call.
    let s = unsafe { ffi::ep_gather_ids(capacity, rows, s_ptr, i_ptr, sentinel, o_ptr, stream.cu_stream() as u64) };
    check(s, &Launched::op("ep_gather_ids"))
}

/// A communicator that may move to another thread: one thread per rank drives its device's communicator in a
/// single process (NCCL's "one process, several devices" use with a thread per device).
#[cfg(feature = "nccl")]
pub struct RankComm(cudarc::nccl::Comm);

#[cfg(feature = "nccl")]
impl std::fmt::Debug for RankComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankComm").field("rank", &self.0.rank()).field("world", &self.0.world_size()).finish()
    }
}

// SAFETY: cudarc's `Comm` holds the raw `ncclComm_t` (hence not `Send`) and an `Arc<CudaStream>`. NCCL allows a
// communicator to be used from any thread as long as calls on it are not concurrent; `RankComm` gives the one
// `Comm` to exactly one owner at a time (it is moved, never shared: no `Sync`), and the stream is `Send`.
#[cfg(feature = "nccl")]
unsafe impl Send for RankComm {}

#[cfg(feature = "nccl")]
impl RankComm {
    pub fn new(comm: cudarc::nccl::Comm) -> Self {
        RankComm(comm)
    }
    pub fn into_inner(self) -> cudarc::nccl::Comm {
        self.0
    }
}
