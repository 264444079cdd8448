//! Host-side descriptions of how the T·k (token, slot) rows are laid out per expert.
//!
//! Grouped layout: rows of all groups back to back, described on the device by int32 offsets `[G + 1]`
//! (exclusive prefix sums of the group sizes, `offsets[0] == 0`). The routing kernels produce these offsets on
//! the device; these helpers build them on the host for tests, benchmarks and callers that route on the CPU.

use crate::error::{Error, Result};

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
