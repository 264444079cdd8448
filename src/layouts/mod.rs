//! How the T·k (token, slot) rows are laid out per expert, built on the device from `topk_ids` with no host
//! synchronisation ([`ExpertLayout`]), plus host helpers for offsets.
//!
//! Flat row `r = t·k + j` is token `t`'s `j`-th choice. Every layout gives each row a *position* (or drops it:
//! remote expert under an `expert_map`, invalid id, masked capacity exceeded — the latter two set
//! [`DeviceStatus`](crate::DeviceStatus) bits), keeps each expert's rows in token order, and exposes:
//!
//! | [`LayoutSpec`] | positions | per expert | for |
//! |---|---|---|---|
//! | `Grouped` | experts back to back, no padding | `offsets [E+1]` | the grouped GEMM ([`GroupRows::Offsets`]) |
//! | `Aligned { block_m }` | each expert padded to a multiple of `block_m` (none if empty) | padded `offsets [E+1]`, `counts [E]`, `expert_ids` per tile, `m_indices` per position (−1 on padding) | vLLM's `moe_align_block_size` contract (`sorted_ids`, sentinel `T·k`); DeepGEMM's contiguous layout (`block_m` 128) |
//! | `Masked { max_m }` | expert `e` at `e·max_m ..` | `masked_m [E]` (`counts`) | DeepGEMM's masked decode layout |
//!
//! `sorted_ids[p]` is the flat row at position `p` (`T·k` on padding); `positions[r]` is its inverse (−1 if
//! dropped). [`ExpertLayout::gather`] copies token rows to their positions, [`ExpertLayout::combine`] sums the
//! k results of each token back in token order, weighted by the router.
//!
//! **Sizing `max_m`** (masked): a token picks each expert at most once, so `max_m >= max_tokens` can never
//! overflow; smaller values trade memory for a capacity that a skewed batch can exceed, which is reported
//! (never silently dropped) at the next [`DeviceStatus::check`](crate::DeviceStatus::check).

mod expert_layout;
mod group_rows;

pub(crate) use expert_layout::{build_scratch_ints, LayoutRoom};
pub use expert_layout::{ExpertLayout, LayoutDims, LayoutSpec};
pub use group_rows::GroupRows;

use crate::error::{Error, Result};
use crate::ffi;

impl LayoutDims {
    /// The layout build's descriptor: grouped and aligned layouts are packed (padded to `block_m`, 1 for
    /// grouped), the masked one has `max_m` rows per expert.
    pub(crate) fn to_ffi(self) -> ffi::layouts::LayoutDesc {
        let (kind, max_m) = match self.spec {
            LayoutSpec::Masked { max_m } => (ffi::LayoutKind::Masked, max_m),
            LayoutSpec::Grouped | LayoutSpec::Aligned { .. } => (ffi::LayoutKind::Packed, 0),
        };
        ffi::layouts::LayoutDesc {
            kind,
            max_tokens: self.max_tokens,
            top_k: self.top_k,
            experts: self.experts,
            local_experts: self.local_experts,
            block_m: self.block_m(),
            max_m,
            capacity: self.capacity(),
        }
    }
}

/// Offsets `[G + 1]` from group sizes: `offsets[g+1] = offsets[g] + sizes[g]`.
///
/// # Errors
/// [`Error::InvalidProblem`] if the total exceeds `i32::MAX` (offsets are int32 on the device).
pub fn offsets_from_sizes(sizes: &[usize]) -> Result<Vec<i32>> {
    let mut offsets = Vec::with_capacity(sizes.len() + 1);
    let mut total: usize = 0;
    offsets.push(0);
    for (g, &s) in sizes.iter().enumerate() {
        total = total.checked_add(s).filter(|&t| t <= i32::MAX as usize).ok_or_else(|| {
            Error::InvalidProblem(format!("group sizes overflow int32 offsets at group {g} (total > {})", i32::MAX))
        })?;
        offsets.push(total as i32);
    }
    Ok(offsets)
}

/// Group sizes from offsets `[G + 1]`, checking the contract the device kernels rely on.
///
/// # Errors
/// [`Error::InvalidProblem`] naming the first violation: fewer than two entries, `offsets[0] != 0`, a decrease,
/// or `offsets[G] > max_rows`.
pub fn sizes_from_offsets(offsets: &[i32], max_rows: usize) -> Result<Vec<usize>> {
    let bad = |s: String| Err(Error::InvalidProblem(s));
    if offsets.len() < 2 {
        return bad(format!("offsets has {} entries: needs G + 1 >= 2", offsets.len()));
    }
    if offsets[0] != 0 {
        return bad(format!("offsets[0] = {}: must be 0", offsets[0]));
    }
    let mut sizes = Vec::with_capacity(offsets.len() - 1);
    for (g, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return bad(format!("offsets[{}] = {} < offsets[{g}] = {}: offsets must not decrease", g + 1, w[1], w[0]));
        }
        sizes.push((w[1] - w[0]) as usize);
    }
    let total = *offsets.last().unwrap() as usize;
    if total > max_rows {
        return bad(format!("offsets[G] = {total} exceeds max_rows = {max_rows}"));
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_limits_agree_with_the_build_kernel() {
        assert_eq!(expert_layout::MAX_LAYOUT_EXPERTS, ffi::layouts::MAX_EXPERTS);
        let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 64 }, 10, 2, 8, 4).unwrap();
        let d = dims.to_ffi();
        assert_eq!((d.kind, d.block_m, d.max_m, d.capacity), (ffi::LayoutKind::Packed, 64, 0, dims.capacity()));
        let d = LayoutDims::new(LayoutSpec::Masked { max_m: 16 }, 10, 2, 8, 8).unwrap().to_ffi();
        assert_eq!((d.kind, d.block_m, d.max_m, d.capacity), (ffi::LayoutKind::Masked, 1, 16, 128));
    }
}
