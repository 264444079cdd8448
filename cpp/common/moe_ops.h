// moe-gemm: the plain C++17 surface of the routing and layout kernels (routing.cu, layouts.cu). Kept apart from
// launch.h so that editing these declarations recompiles no CUTLASS translation unit.
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Routers (routing.cu): logits [tokens, experts] f32 -> ids [tokens, top_k] int32, weights [tokens, top_k] f32.
enum class RouterKind : uint32_t {
  Softmax = 0,         // softmax, top-k, optional renormalisation (Mixtral, Qwen3)
  TopKSoftmax = 1,     // top-k of the logits, softmax over the k (gpt-oss)
  GroupedSigmoid = 2,  // sigmoid, bias for selection, group-limited top-k, renorm, scale (DeepSeek-V3)
};

struct RouterArgs {
  RouterKind kind;
  int32_t tokens;
  int32_t experts;
  int32_t top_k;
  int32_t n_group;
  int32_t topk_group;
  int32_t renormalize;
  float scaling;
  uint64_t logits;
  uint64_t bias;  // float [experts] or 0
  uint64_t ids;
  uint64_t weights;
  uint64_t status;
  uint64_t stream;
};
Status route(const RouterArgs& args);

// Routing extended by shared-expert groups (routing.cu): every token joins `shared` more groups. Row t of the
// output is the token's top_k routed (id, weight) pairs, then the ids first_shared .. first_shared + shared - 1,
// each with the weight shared_weights[t] (or 1 when shared_weights is 0). Ids are copied, not checked: the layout
// that reads them range-checks every id.
struct SharedRoutingArgs {
  int32_t tokens;
  int32_t top_k;           // routed slots per token
  int32_t shared;          // shared groups per token
  int32_t first_shared;    // id of the first shared group
  uint64_t ids;            // int32 [tokens, top_k]
  uint64_t weights;        // f32 [tokens, top_k]
  uint64_t shared_weights; // f32 [tokens], or 0: weight 1
  uint64_t ids_out;        // int32 [tokens, top_k + shared]
  uint64_t weights_out;    // f32 [tokens, top_k + shared]
  uint64_t stream;
};
Status extend_routing(const SharedRoutingArgs& args);

// Expert layouts (layouts.cu). One kernel turns topk_ids into a layout: per-expert counts, (padded) offsets, the
// forward map position -> flat row (sorted_ids, vLLM's contract), the inverse map flat row -> position, and
// optionally the expert of every BLOCK_M tile (expert_ids) and of every position (m_indices, DeepGEMM's).
enum class LayoutKind : uint32_t {
  Packed = 0,  // experts back to back, each padded to a multiple of block_m (block_m = 1: no padding)
  Masked = 1,  // expert e at positions e * max_m .. e * max_m + max_m
};

struct LayoutArgs {
  LayoutKind kind;
  int32_t rows;           // tokens * top_k flat rows, r = t * top_k + j
  int32_t experts;        // global experts (range of topk_ids)
  int32_t local_experts;  // experts on this device (expert_map's range), == experts without a map
  int32_t block_m;
  int32_t max_m;
  int64_t capacity;       // positions available in sorted_ids / m_indices
  uint64_t topk_ids;      // int32 [rows]
  uint64_t expert_map;    // int32 [experts] -> local id or -1, or 0
  uint64_t counts;        // int32 [local_experts] (masked_m for Masked, clamped to max_m)
  uint64_t offsets;       // int32 [local_experts + 1]
  uint64_t sorted_ids;    // int32 [capacity] or 0; padding holds the sentinel `rows`
  uint64_t expert_ids;    // int32 [capacity / block_m] or 0; -1 past the last tile
  uint64_t block_ready;   // int32 [capacity / block_m] or 0: zeroed (the SwapAb GEMM1 -> GEMM2 hand-off counters)
  uint64_t m_indices;     // int32 [capacity] or 0; -1 on padding
  uint64_t positions;     // int32 [rows]; -1 for a dropped row (remote expert, bad id, overflow)
  uint64_t total;         // int32 [1]: padded rows in use (vLLM's num_tokens_post_padded)
  uint64_t scratch;       // int32 [2 * layout_chunks(rows) * local_experts]: per-chunk counts and bases
  uint64_t status;
  uint64_t stream;
};
Status build_layout(const LayoutArgs& args);
// Rows per chunk of the multi-CTA layout build, and the largest row count built by the single-CTA kernel (H200,
// CUDA graph replay, E = 128-256: the two builds take the same time at 1024 rows; at 2048 single 10.7-11.2 us,
// chunked 6.6-7.3; at 4096 17.7-20.0 against 6.9-7.5; 256-row chunks beat 512-row ones from 512 rows up, are
// within 0.25 us of 128-row ones at 1024-2048 rows and 0.5 us faster at 4096).
constexpr int32_t kLayoutChunkRows = 256;
constexpr int32_t kLayoutSingleCtaRows = 1024;
inline int64_t layout_scratch_ints(int64_t rows, int64_t local_experts) {
  return rows <= kLayoutSingleCtaRows ? 0 : 2 * ((rows + kLayoutChunkRows - 1) / kLayoutChunkRows) * local_experts;
}

// out[positions[r], :] = x[r / top_k, :] for every flat row r with a position (16-bit elements).
Status gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                   int64_t out_rows, uint64_t status, uint64_t stream);
// y[t, :] = sum_j weights[t, j] * (d[p, :] + bias[expert(p), :]) with p = positions[t * top_k + j], in f32,
// rounded once (16-bit elements). bias (f32 [experts, hidden]) and row_experts (int32 [d_rows], the expert of
// each row of d) may be 0 together.
Status combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t ld_d, int64_t d_rows,
                    uint64_t positions, uint64_t weights, uint64_t row_experts, uint64_t bias, int32_t experts,
                    uint64_t y, uint64_t stream);

// Gated activations between the expert GEMMs (activation.cu).
enum class GateUp : uint32_t {
  Concatenated = 0,  // [gate | up] along the output dimension (Mixtral, Qwen, DeepSeek; vLLM's w13)
  Interleaved = 1,   // [g0, u0, g1, u1, ...] (gpt-oss)
};

enum class Activation : uint32_t {
  SiluGated = 0,     // silu(gate) * up (SwiGLU)
  GptOssSwiglu = 1,  // gate = min(gate, 7); up = clamp(up, -7, 7); (up + 1) * gate * sigmoid(1.702 gate)
  Silu = 2,          // not gated: silu(x), d1 has `inter` columns
};

struct ActivationArgs {
  DType dtype;
  Activation act;
  GateUp gate_up;
  int32_t inter;        // I: columns of h; d1 has 2I (gated) or I
  int64_t rows;         // rows of d1 and h
  uint64_t total;       // int32* device count of rows in use, or 0 (all `rows`)
  uint64_t row_experts; // int32 [rows]: the expert of each row, -1 for none (skipped)
  int32_t experts;
  uint64_t bias;        // f32 [experts, 2I or I] added to d1 before the activation, or 0
  uint64_t d1;
  uint64_t h;
  uint64_t status;
  uint64_t stream;
};
Status activate(const ActivationArgs& args);

// The whole layer for small batches (decode.cu): h = act(W13[e] x (+ b13)) per (token, slot) row, then
// y[t] = sum_j w[t, j] (W2[e] h + b2), weights streamed by all SMs with no layout. H and I multiples of 8.
struct DecodeArgs {
  DType dtype;
  Activation act;
  GateUp gate_up;
  int32_t tokens;
  int32_t top_k;
  int32_t experts;
  int32_t hidden;
  int32_t inter;
  uint64_t x;        // [tokens, H]
  uint64_t ids;      // int32 [tokens * top_k]
  uint64_t weights;  // f32 [tokens * top_k]
  uint64_t w13;      // [E, 2I or I, H]
  uint64_t w2;       // [E, H, I]
  uint64_t b13;      // f32 [E, 2I or I] or 0
  uint64_t b2;       // f32 [E, H] or 0
  uint64_t h;        // scratch [tokens * top_k, I]
  uint64_t y;        // [tokens, H]
  uint64_t status;
  uint64_t stream;
};
Status decode_layer(const DecodeArgs& args);

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

// y[t, :] = sum_j pairs[t * top_k + j, :] over the slots placed by the layout (positions >= 0), in f32, rounded
// once (layouts.cu): the Fused backend's combine, after GEMM2 weighted and scattered the pairs.
Status sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                 uint64_t y, uint64_t stream);

}  // namespace moe_gemm
