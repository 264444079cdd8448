// Where group g's rows are, resolved on the device from a GroupMode (launch.h) and clamped: the one definition
// for the grouped GEMM families that include it (the SM100 family today; grouped_gemm_sm90.cuh keeps its own
// copy of the same rules, since editing it would recompile the SM90 CUTLASS units).
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {
namespace group_rows {

// Rows lo .. lo + m of A and D, A's rows starting at a_row (a per-row group reads token g / a_div), B matrix
// b_index; err holds the kErr* bits of what was clamped.
struct Group {
  int64_t lo;
  int64_t a_row;
  int64_t b_index;
  int32_t m;
  uint32_t err;
};

__device__ inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Invalid values are clamped so that nothing is read or written out of bounds ([0, max_rows], each group within
// its room, expert ids within [0, experts)) and reported in err. The host checks groups * max_m <= max_rows
// (Masked) and groups <= max_rows (PerRow).
__device__ inline Group resolve(GroupMode mode, const int32_t* __restrict__ offsets,
                                const int32_t* __restrict__ counts, int max_m, int a_div, int experts, int g,
                                int64_t max_rows) {
  uint32_t err = 0;
  int64_t lo = 0, hi = 0;  // an unknown mode (refused on the host) computes nothing
  int64_t a_row = -1, b_index = g;
  if (mode == GroupMode::PerRow) {
    lo = g;
    hi = g + 1 <= max_rows ? g + 1 : g;
    a_row = g / a_div;
    b_index = counts[g];
    if (b_index < 0 || b_index >= experts) {
      err |= kErrGroupCountOutOfRange;
      b_index = 0;
      hi = lo;  // an invalid expert computes nothing
    }
  } else if (mode == GroupMode::Masked) {
    lo = static_cast<int64_t>(g) * max_m;
    const int64_t c = counts[g];
    if (c < 0 || c > max_m) err |= kErrGroupCountOutOfRange;
    hi = lo + clamp64(c, 0, max_m);
  } else if (mode == GroupMode::Offsets || mode == GroupMode::Padded) {
    lo = offsets[g];
    hi = offsets[g + 1];
    if (g == 0 && lo != 0) err |= kErrOffsetsNotZeroBased;
    if (hi < lo) err |= kErrOffsetsNotMonotone;
    if (lo < 0 || hi > max_rows) err |= kErrOffsetsOutOfRange;
    lo = clamp64(lo, 0, max_rows);
    hi = clamp64(hi, lo, max_rows);
    if (mode == GroupMode::Padded) {
      const int64_t c = counts[g];
      if (c < 0 || c > hi - lo) err |= kErrGroupCountOutOfRange;
      hi = lo + clamp64(c, 0, hi - lo);
    }
  }
  return Group{lo, a_row >= 0 ? a_row : lo, b_index, static_cast<int32_t>(hi - lo), err};
}

}  // namespace group_rows
}  // namespace moe_gemm
