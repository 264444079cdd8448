// moe-gemm: the plain C++17 surface of the SM90 fused MoE GEMMs (fused_moe_sm90.cu with its block-FP8 part
// fused_moe_sm90_fp8.inl, fused_decode.cu), between
// their cxx bridge (src/kernels/fused/launch.rs, host compiler) and the kernels. No CUTLASS, CUDA or cxx headers.
//
// Its types are the source of truth for the family's Rust types (build/bindings.rs generates them as the
// crate builds).
#pragma once

#include <cstdint>

#include "common/launch.h"
#include "common/moe_ops.h"

namespace moe_gemm {

// Fused MoE GEMMs on SM90 (fused_moe_sm90_<dtype>.cu): vLLM's fused_moe design, no permuted copy of x. The
// aligned layout, built with block_m = the tile's M, gives each BM-row tile of positions one expert
// (expert_ids) and each position p its flat row r = sorted_ids[p] (the sentinel `rows` on padding).
//   Gather:  D[p, :] = A[r / top_k, :] . B[e]^T for positions p < total (A = x [tokens, K]; D [capacity, N])
//   Scatter: D[r, :] = w[r] * (round(A[p, :] . B[e]^T) + bias[e]) for r < rows (A [capacity, K]; D [rows, N])
// B is [experts, N, K]; N % 8 == 0 and K % 8 == 0 (16-byte rows); weights f32 [rows] and bias f32 [experts, N]
// may be 0 (Scatter only).
enum class FusedTile : uint32_t {
  M64N128K64 = 0,
  M128N256K64 = 1,
  // Decode tiles (fused_decode.cu): mma.sync with the weight rows on M and 16 / 32 positions on N; Merged: blocks
  // of 16, up to four of one expert per CTA (reads `offsets`).
  SwapAb16 = 2,
  SwapAb32 = 3,
  SwapAbMerged = 4,
};
enum class FusedMode : uint32_t {
  Gather = 0,
  Scatter = 1,
  // The SwapAb tiles only: Gather with the gated activation in the epilogue. B is w13 [experts, N = 2I, K], D is
  // h [capacity, I] = act(round(A . gate^T) + b13, round(A . up^T) + b13) (the activation kernel's function),
  // written at positions whose flat row is in [0, rows); bias = b13 [experts, 2I] or 0.
  GatherGated = 2,
};
struct FusedGemmArgs {
  DType dtype;
  FusedTile tile;
  FusedMode mode;
  int32_t top_k;
  int32_t experts;    // local experts (rows of B / N / K)
  int32_t n;
  int32_t k;
  int32_t rows;       // tokens * top_k
  int32_t sm_count;   // SMs of the stream's device (the persistent grid), from the caller's plan
  int64_t capacity;   // positions of the layout
  uint64_t a;
  uint64_t b;
  uint64_t d;
  uint64_t sorted_ids;
  uint64_t expert_ids;
  uint64_t total;
  uint64_t weights;
  uint64_t bias;
  Activation act;   // GatherGated only
  GateUp gate_up;   // GatherGated only
  uint64_t stream;
};
Status fused_moe_gemm_bf16(const FusedGemmArgs& args);
Status fused_moe_gemm_f16(const FusedGemmArgs& args);
// The SwapAb tiles, both dtypes (fused_decode.cu, portable); prepare opts their rings into shared memory.
// `offsets`: the layout's per-expert first positions [experts + 1] (int32), read by SwapAbMerged. It travels
// beside FusedGemmArgs, not in it: a field more in the kernels' by-value argument changed the SwapAb16 kernel's
// code (94 -> 98 registers) and cost it 0.8% (H200, 2026-12-02,
// benches/results/h200-2026-12-02-swapab-merged/s16-*.log).
// `ready`: int32 [capacity / 16] zeroed by the layout build, or 0. Where given to a GatherGated GEMM1 and then to
// the Scatter GEMM2 over the same layout (the layer's pass, nothing between), GEMM2's CTAs of a block start once
// GEMM1 has written that block's h instead of when all of GEMM1 has ended (SwapAbMerged only; see fused_decode.cu).
// `topk`: the int32 [rows] topk_ids the layout was built from (no expert map), or 0: a SwapAb16 GEMM1 of at most
// 32 rows starts the weights of the experts they name towards L2 while the layout build runs.
Status fused_decode_gemm(const FusedGemmArgs& args, uint64_t offsets, uint64_t ready, uint64_t topk);
Status fused_decode_prepare(DType dtype, FusedTile tile);
// Per device, once per plan and before any launch of the tile (with the device current): opts the kernel into
// the dynamic shared memory its stages need. Launches do no such host work.
Status fused_moe_prepare_bf16(FusedTile tile);
Status fused_moe_prepare_f16(FusedTile tile);

// The fused GEMMs above (gather / scatter over an aligned layout) with e4m3 A and B and DeepSeek's block
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
