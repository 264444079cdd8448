//! [`GroupRows`]: where each group's rows are on the device, in every form the layouts build and the grouped
//! GEMMs read.

use cudarc::driver::{CudaSlice, CudaView};

use crate::ffi;

/// Where each group's rows are, on the device. Every form is read by the GEMM's own prepare kernel, which
/// clamps what it reads and reports violations to the [`DeviceStatus`](crate::DeviceStatus).
#[derive(Debug)]
pub enum GroupRows<'a> {
    /// int32 `[G + 1]` exclusive prefix sums: group `g` owns rows `offsets[g] .. offsets[g+1]`.
    Offsets(CudaView<'a, i32>),
    /// Padded layouts (vLLM align, DeepGEMM contiguous): group `g` starts at `offsets[g]` (`[G + 1]`, padded) and
    /// holds `counts[g]` rows (`[G]`); the padding rows are neither read nor written.
    Padded { offsets: CudaView<'a, i32>, counts: CudaView<'a, i32> },
    /// DeepGEMM masked layout: group `g` owns rows `g·max_m .. g·max_m + masked_m[g]` (`masked_m` int32 `[G]`).
    Masked { masked_m: CudaView<'a, i32>, max_m: usize },
    /// One group per output row (decode, the "batched" backend): D row `r` = A row `r / a_div` · B[`experts[r]`]ᵀ
    /// for `r < rows`; B holds `num_experts` matrices. With `a_div = k`, A is the tokens themselves, each read
    /// for its k choices, and nothing is gathered. `rows` must not exceed the plan's groups and max_rows.
    PerRow { experts: CudaView<'a, i32>, rows: usize, a_div: usize, num_experts: usize },
}

impl GroupRows<'_> {
    pub(crate) fn to_ffi(&self) -> ffi::gemm::GroupedRows<'_> {
        use ffi::gemm::GroupedRows as F;
        match self {
            GroupRows::Offsets(o) => F::Offsets(o),
            GroupRows::Padded { offsets, counts } => F::Padded { offsets, counts },
            GroupRows::Masked { masked_m, max_m } => F::Masked { masked_m, max_m: *max_m },
            GroupRows::PerRow { experts, rows, a_div, num_experts } => {
                F::PerRow { experts, rows: *rows, a_div: *a_div, num_experts: *num_experts }
            }
        }
    }
}

impl<'a> From<&'a CudaSlice<i32>> for GroupRows<'a> {
    /// Offsets `[G + 1]`.
    fn from(offsets: &'a CudaSlice<i32>) -> Self {
        GroupRows::Offsets(offsets.as_view())
    }
}

impl<'a> From<CudaView<'a, i32>> for GroupRows<'a> {
    /// Offsets `[G + 1]`.
    fn from(offsets: CudaView<'a, i32>) -> Self {
        GroupRows::Offsets(offsets)
    }
}
