// moe-gemm: the plain C++17 surface of the expert-parallel helper kernel (ep.cu). Kept apart from moe_ops.h so
// that editing it recompiles no other translation unit.
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// The dispatch's per-position expert ids: out[p] = ids[sorted_ids[p]] where sorted_ids[p] < rows (a routed
// (token, slot) row placed at send position p by a masked layout over the destination ranks), else `sentinel`
// (padding: an id the receiver's expert map sends to no expert). p < capacity.
Status ep_gather_ids(int64_t capacity, int32_t rows, uint64_t sorted_ids, uint64_t ids, int32_t sentinel, uint64_t out,
                     uint64_t stream);

}  // namespace moe_gemm
