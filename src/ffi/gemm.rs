//! What every grouped GEMM launch and the grouped quantisers share: the group arrays a launch reads, and their
//! checks. Plain descriptors of device buffers and extents; the callers build them from their own types.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, SyncOnDrop};

use super::sys;
use super::{need_len, to_i32, to_i64};
use crate::error::{Error, Result};

/// Where each group's rows are (mirrors `GroupMode` in `cpp/common/launch.h`): device arrays the prepare kernel reads
/// and clamps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum GroupedRows<'a> {
    /// int32 `[groups + 1]`: group g owns rows `offsets[g] .. offsets[g+1]`.
    Offsets(&'a CudaView<'a, i32>),
    /// Group g starts at `offsets[g]` (`[groups + 1]`) and holds `counts[g]` rows (`[groups]`).
    Padded { offsets: &'a CudaView<'a, i32>, counts: &'a CudaView<'a, i32> },
    /// Group g owns rows `g·max_m .. g·max_m + masked_m[g]` (`[groups]`).
    Masked { masked_m: &'a CudaView<'a, i32>, max_m: usize },
    /// One group per D row `r < rows`: A row `r / a_div` times B[`experts[r]`]ᵀ, B holding `num_experts`
    /// matrices.
    PerRow { experts: &'a CudaView<'a, i32>, rows: usize, a_div: usize, num_experts: usize },
}

/// A launch's group arrays, checked against the plan's `groups` and `max_rows` by [`group_rows`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupArrays<'a> {
    pub mode: sys::GroupMode,
    pub offsets: Option<&'a CudaView<'a, i32>>,
    pub counts: Option<&'a CudaView<'a, i32>>,
    pub max_m: usize,
}

/// The group arrays of `rows` for a plan of `groups` groups over `max_rows` rows, checked: offsets `[G + 1]`,
/// counts `[G]`, `G · max_m <= max_rows`. Per-row groups are refused (only the dense family offers them, and
/// checks them itself).
pub(crate) fn group_rows<'a>(rows: GroupedRows<'a>, groups: usize, max_rows: usize) -> Result<GroupArrays<'a>> {
    let (mode, offsets, counts, max_m) = match rows {
        GroupedRows::Offsets(o) => (sys::GroupMode::Offsets, Some(o), None, 0usize),
        GroupedRows::Padded { offsets, counts } => (sys::GroupMode::Padded, Some(offsets), Some(counts), 0),
        GroupedRows::Masked { masked_m, max_m } => (sys::GroupMode::Masked, None, Some(masked_m), max_m),
        GroupedRows::PerRow { .. } => {
            return Err(Error::InvalidProblem(
                "FP8 grouped GEMM: per-row groups are not offered (use offsets, padded or masked groups)".into(),
            ))
        }
    };
    let arrays = GroupArrays { mode, offsets, counts, max_m };
    arrays.check(groups, groups, max_rows)?;
    Ok(arrays)
}

impl GroupArrays<'_> {
    /// Offsets hold `G + 1` (the plan's `groups`), counts one per launched group (`launched`), and masked
    /// groups fit in `max_rows`.
    pub(crate) fn check(&self, groups: usize, launched: usize, max_rows: usize) -> Result<()> {
        if let Some(o) = self.offsets {
            need_len("offsets", o.len(), groups + 1, "G + 1")?;
        }
        if let Some(c) = self.counts {
            need_len("counts", c.len(), launched, "groups")?;
        }
        if self.mode == sys::GroupMode::Masked && groups * self.max_m > max_rows {
            return Err(Error::Buffer {
                name: "masked_m",
                detail: format!("G x max_m = {groups} x {} exceeds the plan's max_rows = {max_rows}", self.max_m),
            });
        }
        Ok(())
    }
}

/// Everything a launch needs besides its buffers, fixed by a plan: the shape (`groups` matrices `[n, k]` of B,
/// at most `max_rows` rows of A and D), the kernel's configuration `C` and the device it was planned for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmPlan<C> {
    pub config: C,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    pub max_rows: usize,
    pub device: i32,
    pub sm_count: i32,
    pub workspace_bytes: u64,
}

impl<C> GemmPlan<C> {
    /// Refuses a stream of another device than the plan's; `what` opens the message.
    pub(crate) fn check_device(&self, stream: &CudaStream, what: std::fmt::Arguments<'_>) -> Result<()> {
        let ordinal = stream.context().ordinal();
        if ordinal as i64 != self.device as i64 {
            return Err(Error::InvalidProblem(format!(
                "{what} planned for device {} launched on a stream of device {ordinal}",
                self.device
            )));
        }
        Ok(())
    }

    /// The bytes of `workspace`, refused when fewer than the plan's.
    pub(crate) fn check_workspace(&self, op: &'static str, workspace: &CudaSlice<u8>) -> Result<u64> {
        let got = workspace.len() as u64;
        if got < self.workspace_bytes {
            return Err(Error::WorkspaceTooSmall { op, needed: self.workspace_bytes, got });
        }
        Ok(got)
    }

    /// The plan's extents as the C++ argument structs take them: (max_m, groups, N, K, max_rows).
    pub(crate) fn extents(&self, max_m: usize) -> Result<(i32, i32, i32, i32, i64)> {
        let (max_m, groups) = (to_i32("max_m", max_m)?, to_i32("groups", self.groups)?);
        Ok((max_m, groups, to_i32("N", self.n)?, to_i32("K", self.k)?, to_i64("max_rows", self.max_rows)?))
    }
}

impl<'a> GroupArrays<'a> {
    /// The device addresses of the offsets and counts (0 where the mode reads none), with the guards that order
    /// them on `stream`: bind the guards to a named local until the C++ call has returned.
    pub(crate) fn device_ptrs(self, stream: &'a CudaStream) -> ((u64, u64), GroupGuards<'a>) {
        let (o_ptr, o_guard) = self.offsets.map(|o| o.device_ptr(stream)).unzip();
        let (c_ptr, c_guard) = self.counts.map(|c| c.device_ptr(stream)).unzip();
        ((o_ptr.unwrap_or(0), c_ptr.unwrap_or(0)), (o_guard, c_guard))
    }
}

/// The stream-ordering guards of a launch's offsets and counts.
pub(crate) type GroupGuards<'s> = (Option<SyncOnDrop<'s>>, Option<SyncOnDrop<'s>>);
