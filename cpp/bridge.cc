#include "moe-gemm/cpp/bridge.h"

#include "moe-gemm/src/ffi/bridge.rs.h"

namespace moe_gemm {
namespace bridge {
namespace {
LaunchStatus wrap(Status s) { return LaunchStatus{s.code, s.detail}; }
}  // namespace

bool grouped_gemm_sm90_built(DType dtype, TileConfig config) {
  switch (dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm90_bf16_built(config);
    case DType::F16: return moe_gemm::grouped_gemm_sm90_f16_built(config);
  }
  return false;
}

LaunchStatus grouped_gemm_sm90_workspace(DType dtype, TileConfig config, int32_t groups, int32_t sm_count,
                                         uint64_t& bytes) {
  switch (dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm90_bf16_workspace(config, groups, sm_count, &bytes));
    case DType::F16: return wrap(moe_gemm::grouped_gemm_sm90_f16_workspace(config, groups, sm_count, &bytes));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

LaunchStatus grouped_gemm_sm90_run(const GroupedGemmParams& p) {
  const GroupedGemmArgs args{p.dtype,   p.config,  p.mode,      p.max_m,  p.a_div, p.experts, p.groups,    p.n,
                             p.k,       p.max_rows, p.a,        p.b,               p.d,         p.offsets,
                             p.counts,  p.workspace, p.workspace_bytes, p.status, p.device, p.sm_count,
                             p.stream};
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm90_bf16_run(args));
    case DType::F16: return wrap(moe_gemm::grouped_gemm_sm90_f16_run(args));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

int32_t cudart_version() { return moe_gemm::cudart_version(); }

int32_t spin(uint64_t ns, uint64_t stream) { return moe_gemm::spin(ns, stream); }

int32_t read_sweep(uint64_t ptr, uint64_t bytes, uint64_t sink, int32_t blocks, uint64_t stream) {
  return moe_gemm::read_sweep(ptr, bytes, sink, blocks, stream);
}

LaunchStatus route(const RouterParams& p) {
  const RouterArgs a{p.kind,    p.tokens, p.experts, p.top_k, p.n_group, p.topk_group, p.renormalize,
                     p.scaling, p.logits, p.bias,    p.ids,   p.weights, p.status,     p.stream};
  return wrap(moe_gemm::route(a));
}

LaunchStatus build_layout(const LayoutParams& p) {
  const LayoutArgs a{p.kind,    p.rows,       p.experts,   p.local_experts, p.block_m,   p.max_m,
                     p.capacity, p.topk_ids,  p.expert_map, p.counts,       p.offsets,   p.sorted_ids,
                     p.expert_ids, p.m_indices, p.positions, p.total,       p.scratch,   p.status,
                     p.stream};
  return wrap(moe_gemm::build_layout(a));
}

int64_t layout_scratch_ints(int64_t rows, int64_t local_experts) {
  return moe_gemm::layout_scratch_ints(rows, local_experts);
}

LaunchStatus gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                         int64_t out_rows, uint64_t status, uint64_t stream) {
  return wrap(moe_gemm::gather_rows(rows, top_k, hidden, x, positions, out, out_rows, status, stream));
}

LaunchStatus combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t d_rows,
                          uint64_t positions, uint64_t weights, uint64_t row_experts, uint64_t bias,
                          int32_t experts, uint64_t y, uint64_t stream) {
  return wrap(moe_gemm::combine_rows(dtype, tokens, top_k, hidden, d, d_rows, positions, weights, row_experts, bias,
                                     experts, y, stream));
}

LaunchStatus activate(const ActivationParams& p) {
  const ActivationArgs a{p.dtype, p.act,     p.gate_up, p.inter, p.rows, p.total, p.row_experts,
                         p.experts, p.bias, p.d1,      p.h,     p.status, p.stream};
  return wrap(moe_gemm::activate(a));
}

LaunchStatus decode_layer(const DecodeParams& p) {
  const DecodeArgs a{p.dtype, p.act, p.gate_up, p.tokens, p.top_k, p.experts, p.hidden, p.inter, p.x, p.ids,
                     p.weights, p.w13, p.w2, p.b13, p.b2, p.h, p.y, p.status, p.stream};
  return wrap(moe_gemm::decode_layer(a));
}

LaunchStatus fused_moe_gemm(const FusedGemmParams& p) {
  const FusedGemmArgs a{p.dtype,    p.tile, p.mode,       p.top_k,      p.experts, p.n,       p.k,
                        p.rows,     p.capacity, p.a,      p.b,          p.d,       p.sorted_ids, p.expert_ids,
                        p.total,    p.weights, p.bias,    p.stream};
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::fused_moe_gemm_bf16(a));
    case DType::F16: return wrap(moe_gemm::fused_moe_gemm_f16(a));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

LaunchStatus sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                       uint64_t y, uint64_t stream) {
  return wrap(moe_gemm::sum_slots(dtype, tokens, top_k, hidden, pairs, positions, y, stream));
}

}  // namespace bridge
}  // namespace moe_gemm
