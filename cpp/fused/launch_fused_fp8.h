// moe-gemm: the plain C++17 surface of the SM90 fused MoE GEMMs over block-FP8 operands
// (fused_moe_sm90_fp8.inl), between the cxx bridge and the kernel. A header of its own, so that the units
// including moe_ops.h do not recompile for it. Its types are the source of
// truth for src/ffi/sys.rs (scripts/bindgen.sh).
#pragma once

#include <cstdint>

#include "common/moe_ops.h"

namespace moe_gemm {

// The fused GEMMs of moe_ops.h (gather / scatter over an aligned layout) with e4m3 A and B and DeepSeek's block
// scales: A's rows quantised per 1 x 128 (sfa f32 [a_rows, ceil(K/128)], a_rows = tokens for Gather, capacity
// for Scatter), B per 128 x 128 (sfb f32 [experts, ceil(N/128), ceil(K/128)]), bf16 D. TileK is one scale
// block: each k-tile's tensor-core sum is scaled by sfa[row] * sfb[n / 128] and added into f32 accumulators.
//   Gather:  D[p, :] = A[r / top_k, :] . B[e]^T          (D bf16 [capacity, N])
//   Scatter: D[r, :] = w[r] * (round(A[p, :] . B[e]^T) + bias[e])   (D bf16 [rows, N])
// N % 64 == 0 (M64N64K128) or % 128 (M128N128K128: whole N tiles), K % 16 == 0.
// Per-channel scales (FusedFp8Scales::Channel): sfa one f32 per A row [a_rows], sfb one per output channel
// [experts, N]; the k-tiles' sums are added unscaled into the f32 accumulators and the whole dot product is scaled
// once by sfa[row] * sfb[n] (the rowwise layer's function).
enum class FusedFp8Scales : uint32_t {
  Block128 = 0,  // sfa [a_rows, ceil(K/128)], sfb [experts, ceil(N/128), ceil(K/128)]
  Channel = 1,   // sfa [a_rows], sfb [experts, N]
};
enum class FusedFp8Tile : uint32_t {
  M64N64K128 = 0,    // decode: block_m 64, two CTAs per SM
  M128N128K128 = 1,  // prefill: block_m 128, two consumer warpgroups
};
struct FusedGemmFp8Args {
  FusedFp8Tile tile;
  FusedFp8Scales scales;
  FusedMode mode;
  int32_t top_k;
  int32_t experts;
  int32_t n;
  int32_t k;
  int32_t rows;      // tokens * top_k
  int32_t sm_count;
  int64_t capacity;
  uint64_t a;
  uint64_t sfa;
  uint64_t b;
  uint64_t sfb;
  uint64_t d;
  uint64_t sorted_ids;
  uint64_t expert_ids;
  uint64_t total;
  uint64_t weights;
  uint64_t bias;
  uint64_t stream;
};
Status fused_moe_gemm_fp8(const FusedGemmFp8Args& args);
Status fused_moe_prepare_fp8(FusedFp8Tile tile);

}  // namespace moe_gemm
