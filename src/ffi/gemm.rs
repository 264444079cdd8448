//! What the grouped GEMM families' launchers (`crate::kernels::<family>::launch`, floor 0 with this module) and
//! the grouped quantisers share: the group arrays a launch reads, and their checks.

use cudarc::driver::CudaView;

use super::need_len;
use super::sys;
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

/// The FP8 GEMMs' group arrays: (mode, offsets, counts, max_m), checked against `groups` and `max_rows`
/// (per-row groups are not offered by the FP8 families).
pub(crate) type FfiRows<'a> = (sys::GroupMode, Option<&'a CudaView<'a, i32>>, Option<&'a CudaView<'a, i32>>, usize);

pub(crate) fn group_rows<'a>(rows: GroupedRows<'a>, groups: usize, max_rows: usize) -> Result<FfiRows<'a>> {
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
    if let Some(o) = offsets {
        need_len("offsets", o.len(), groups + 1, "G + 1")?;
    }
    if let Some(c) = counts {
        need_len("counts", c.len(), groups, "groups")?;
    }
    if mode == sys::GroupMode::Masked && groups * max_m > max_rows {
        return Err(Error::Buffer {
            name: "masked_m",
            detail: format!("G x max_m = {groups} x {max_m} exceeds the plan's max_rows = {max_rows}"),
        });
    }
    Ok((mode, offsets, counts, max_m))
}
