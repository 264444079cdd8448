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

// y[t, :] = sum_j pairs[t * top_k + j, :] over the slots placed by the layout (positions >= 0), in f32, rounded
// once (layouts.cu): the Fused backend's combine, after GEMM2 weighted and scattered the pairs.
Status sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                 uint64_t y, uint64_t stream);

}  // namespace moe_gemm
