#include "moe-gemm/cpp/bridge/bridge.h"

#include "moe-gemm/cpp/bridge/bridge_fields.h"
#include "moe-gemm/src/ffi/bridge.rs.h"
#include "moe-gemm/src/ffi/bridge_fp8.rs.h"

namespace moe_gemm {
namespace bridge {
using detail::field_count;
using detail::same_fields;
using detail::wrap;

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
  GroupedGemmArgs a{};
  a.dtype = p.dtype;
  a.config = p.config;
  a.mode = p.mode;
  a.max_m = p.max_m;
  a.a_div = p.a_div;
  a.experts = p.experts;
  a.groups = p.groups;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = p.max_rows;
  a.a = p.a;
  a.b = p.b;
  a.d = p.d;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  a.status = p.status;
  a.device = p.device;
  a.sm_count = p.sm_count;
  a.stream = p.stream;
  static_assert(same_fields<GroupedGemmParams, GroupedGemmArgs>(21), "assign every GroupedGemmArgs field above");
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm90_bf16_run(a));
    case DType::F16: return wrap(moe_gemm::grouped_gemm_sm90_f16_run(a));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

bool grouped_gemm_sm90_fp8_built(Fp8TileConfig config) {
  return moe_gemm::grouped_gemm_sm90_fp8_blockwise_built(config);
}

LaunchStatus grouped_gemm_sm90_fp8_workspace(Fp8TileConfig config, int32_t groups, int32_t sm_count,
                                             uint64_t& bytes) {
  return wrap(moe_gemm::grouped_gemm_sm90_fp8_blockwise_workspace(config, groups, sm_count, &bytes));
}

// The cxx copy of a facts struct, field by field.
void copy_facts(const moe_gemm::Fp8KernelFacts& f, Fp8KernelFacts& out) {
  out.tile_m = f.tile_m;
  out.tile_n = f.tile_n;
  out.tile_k = f.tile_k;
  out.cluster_m = f.cluster_m;
  out.cluster_n = f.cluster_n;
  out.sms_per_mma = f.sms_per_mma;
  out.scale_m = f.scale_m;
  out.scale_n = f.scale_n;
  out.scale_k = f.scale_k;
  out.sfa_k_major = f.sfa_k_major;
  out.sfb_k_major = f.sfb_k_major;
  out.blockwise_mainloop = f.blockwise_mainloop;
  out.fast_accumulation = f.fast_accumulation;
  out.promotion_k = f.promotion_k;
  out.stages = f.stages;
  static_assert(same_fields<Fp8KernelFacts, moe_gemm::Fp8KernelFacts>(15), "assign every Fp8KernelFacts field above");
}

// An FP8 family's facts query, answered in the cxx struct (every FP8 family reports the same fields).
template <class Query, class Config>
LaunchStatus fp8_facts(Query query, Config config, Fp8KernelFacts& out) {
  moe_gemm::Fp8KernelFacts f{};
  const Status s = query(config, &f);
  if (s.code == StatusCode::Ok) copy_facts(f, out);
  return wrap(s);
}

// A family's schedule name ("" for a configuration it does not know).
rust::String schedule_name(const char* name) { return rust::String(name != nullptr ? name : ""); }

LaunchStatus grouped_gemm_sm90_fp8_facts(Fp8TileConfig config, Fp8KernelFacts& out) {
  return fp8_facts(moe_gemm::grouped_gemm_sm90_fp8_blockwise_facts, config, out);
}

rust::String grouped_gemm_sm90_fp8_schedule(Fp8TileConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm90_fp8_blockwise_schedule(config));
}

// The launch.h copy of the FP8 blockwise params, field by field (both arches read the same operands).
static GroupedGemmFp8Args fp8_args(const GroupedGemmFp8Params& p) {
  GroupedGemmFp8Args a{};
  a.config = p.config;
  a.mode = p.mode;
  a.max_m = p.max_m;
  a.groups = p.groups;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = p.max_rows;
  a.a = p.a;
  a.sfa = p.sfa;
  a.b = p.b;
  a.sfb = p.sfb;
  a.d = p.d;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  a.status = p.status;
  a.device = p.device;
  a.sm_count = p.sm_count;
  a.stream = p.stream;
  static_assert(same_fields<GroupedGemmFp8Params, GroupedGemmFp8Args>(20), "assign every GroupedGemmFp8Args field above");
  return a;
}

LaunchStatus grouped_gemm_sm90_fp8_run(const GroupedGemmFp8Params& p) {
  return wrap(moe_gemm::grouped_gemm_sm90_fp8_blockwise_run(fp8_args(p)));
}

bool grouped_gemm_sm100_fp8_built(Fp8TileConfig config) {
  return moe_gemm::grouped_gemm_sm100_fp8_blockwise_built(config);
}

LaunchStatus grouped_gemm_sm100_fp8_workspace(Fp8TileConfig config, int32_t groups, int32_t sm_count,
                                              uint64_t& bytes) {
  return wrap(moe_gemm::grouped_gemm_sm100_fp8_blockwise_workspace(config, groups, sm_count, &bytes));
}

LaunchStatus grouped_gemm_sm100_fp8_facts(Fp8TileConfig config, Fp8KernelFacts& out) {
  return fp8_facts(moe_gemm::grouped_gemm_sm100_fp8_blockwise_facts, config, out);
}

rust::String grouped_gemm_sm100_fp8_schedule(Fp8TileConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm100_fp8_blockwise_schedule(config));
}

LaunchStatus grouped_gemm_sm100_fp8_run(const GroupedGemmFp8Params& p) {
  return wrap(moe_gemm::grouped_gemm_sm100_fp8_blockwise_run(fp8_args(p)));
}

bool grouped_gemm_sm90_fp8_rowwise_built(Fp8RowwiseConfig config) {
  return moe_gemm::grouped_gemm_sm90_fp8_rowwise_built(config);
}

LaunchStatus grouped_gemm_sm90_fp8_rowwise_workspace(Fp8RowwiseConfig config, int32_t groups, int32_t sm_count,
                                                     uint64_t& bytes) {
  return wrap(moe_gemm::grouped_gemm_sm90_fp8_rowwise_workspace(config, groups, sm_count, &bytes));
}

LaunchStatus grouped_gemm_sm90_fp8_rowwise_facts(Fp8RowwiseConfig config, Fp8KernelFacts& out) {
  return fp8_facts(moe_gemm::grouped_gemm_sm90_fp8_rowwise_facts, config, out);
}

rust::String grouped_gemm_sm90_fp8_rowwise_schedule(Fp8RowwiseConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm90_fp8_rowwise_schedule(config));
}

LaunchStatus grouped_gemm_sm90_fp8_rowwise_run(const GroupedGemmFp8RowwiseParams& p) {
  GroupedGemmFp8RowwiseArgs a{};
  a.config = p.config;
  a.mode = p.mode;
  a.max_m = p.max_m;
  a.groups = p.groups;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = p.max_rows;
  a.a = p.a;
  a.sa = p.sa;
  a.b = p.b;
  a.sb = p.sb;
  a.d = p.d;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  a.status = p.status;
  a.device = p.device;
  a.sm_count = p.sm_count;
  a.stream = p.stream;
  static_assert(same_fields<GroupedGemmFp8RowwiseParams, GroupedGemmFp8RowwiseArgs>(20),
                "assign every GroupedGemmFp8RowwiseArgs field above");
  return wrap(moe_gemm::grouped_gemm_sm90_fp8_rowwise_run(a));
}

// SM100: bf16 only so far; f16 is NotBuilt.
bool grouped_gemm_sm100_built(DType dtype, Sm100TileConfig config) {
  return dtype == DType::BF16 && moe_gemm::grouped_gemm_sm100_bf16_built(config);
}

LaunchStatus grouped_gemm_sm100_workspace(DType dtype, Sm100TileConfig config, int32_t groups, int32_t sm_count,
                                          uint64_t& bytes) {
  if (dtype != DType::BF16) return LaunchStatus{StatusCode::NotBuilt, 0};
  return wrap(moe_gemm::grouped_gemm_sm100_bf16_workspace(config, groups, sm_count, &bytes));
}

LaunchStatus grouped_gemm_sm100_facts(DType dtype, Sm100TileConfig config, Sm100KernelFacts& out) {
  if (dtype != DType::BF16) return LaunchStatus{StatusCode::NotBuilt, 0};
  moe_gemm::Sm100KernelFacts f{};
  const Status s = moe_gemm::grouped_gemm_sm100_bf16_facts(config, &f);
  if (s.code != StatusCode::Ok) return wrap(s);
  out.tile_m = f.tile_m;
  out.tile_n = f.tile_n;
  out.tile_k = f.tile_k;
  out.cluster_m = f.cluster_m;
  out.cluster_n = f.cluster_n;
  out.atom_m = f.atom_m;
  out.stages = f.stages;
  out.umma_array_mainloop = f.umma_array_mainloop;
  out.ptr_array_epilogue = f.ptr_array_epilogue;
  static_assert(same_fields<Sm100KernelFacts, moe_gemm::Sm100KernelFacts>(9),
                "assign every Sm100KernelFacts field above");
  return wrap(s);
}

LaunchStatus grouped_gemm_sm100_run(const GroupedGemmSm100Params& p) {
  GroupedGemmSm100Args a{};
  a.dtype = p.dtype;
  a.config = p.config;
  a.mode = p.mode;
  a.max_m = p.max_m;
  a.a_div = p.a_div;
  a.experts = p.experts;
  a.groups = p.groups;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = p.max_rows;
  a.a = p.a;
  a.b = p.b;
  a.d = p.d;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  a.status = p.status;
  a.device = p.device;
  a.sm_count = p.sm_count;
  a.stream = p.stream;
  static_assert(same_fields<GroupedGemmSm100Params, GroupedGemmSm100Args>(21),
                "assign every GroupedGemmSm100Args field above");
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm100_bf16_run(a));
    case DType::F16: break;
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

int32_t cudart_version() { return moe_gemm::cudart_version(); }

rust::String cuda_error_name(int32_t code) {
  const char* name = moe_gemm::cuda_error_name(code);
  return rust::String(name != nullptr ? name : "unknown CUDA error");
}

int32_t spin(uint64_t ns, uint64_t stream) { return moe_gemm::spin(ns, stream); }

int32_t read_sweep(uint64_t ptr, uint64_t bytes, uint64_t sink, int32_t blocks, uint64_t stream) {
  return moe_gemm::read_sweep(ptr, bytes, sink, blocks, stream);
}

LaunchStatus route(const RouterParams& p) {
  RouterArgs a{};
  a.kind = p.kind;
  a.tokens = p.tokens;
  a.experts = p.experts;
  a.top_k = p.top_k;
  a.n_group = p.n_group;
  a.topk_group = p.topk_group;
  a.renormalize = p.renormalize;
  a.scaling = p.scaling;
  a.logits = p.logits;
  a.bias = p.bias;
  a.ids = p.ids;
  a.weights = p.weights;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<RouterParams, RouterArgs>(14), "assign every RouterArgs field above");
  return wrap(moe_gemm::route(a));
}

LaunchStatus extend_routing(const SharedRoutingParams& p) {
  SharedRoutingArgs a{};
  a.tokens = p.tokens;
  a.top_k = p.top_k;
  a.shared = p.shared;
  a.first_shared = p.first_shared;
  a.ids = p.ids;
  a.weights = p.weights;
  a.shared_weights = p.shared_weights;
  a.ids_out = p.ids_out;
  a.weights_out = p.weights_out;
  a.stream = p.stream;
  static_assert(same_fields<SharedRoutingParams, SharedRoutingArgs>(10), "assign every SharedRoutingArgs field above");
  return wrap(moe_gemm::extend_routing(a));
}

LaunchStatus build_layout(const LayoutParams& p) {
  LayoutArgs a{};
  a.kind = p.kind;
  a.rows = p.rows;
  a.experts = p.experts;
  a.local_experts = p.local_experts;
  a.block_m = p.block_m;
  a.max_m = p.max_m;
  a.capacity = p.capacity;
  a.topk_ids = p.topk_ids;
  a.expert_map = p.expert_map;
  a.counts = p.counts;
  a.offsets = p.offsets;
  a.sorted_ids = p.sorted_ids;
  a.expert_ids = p.expert_ids;
  a.block_ready = p.block_ready;
  a.m_indices = p.m_indices;
  a.positions = p.positions;
  a.total = p.total;
  a.scratch = p.scratch;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<LayoutParams, LayoutArgs>(20), "assign every LayoutArgs field above");
  return wrap(moe_gemm::build_layout(a));
}

int64_t layout_scratch_ints(int64_t rows, int64_t local_experts) {
  return moe_gemm::layout_scratch_ints(rows, local_experts);
}

LaunchStatus gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                         int64_t out_rows, uint64_t status, uint64_t stream) {
  return wrap(moe_gemm::gather_rows(rows, top_k, hidden, x, positions, out, out_rows, status, stream));
}

LaunchStatus combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t ld_d,
                          int64_t d_rows,
                          uint64_t positions, uint64_t weights, uint64_t row_experts, uint64_t bias,
                          int32_t experts, uint64_t y, uint64_t stream) {
  return wrap(moe_gemm::combine_rows(dtype, tokens, top_k, hidden, d, ld_d, d_rows, positions, weights, row_experts, bias,
                                     experts, y, stream));
}

LaunchStatus activate(const ActivationParams& p) {
  ActivationArgs a{};
  a.dtype = p.dtype;
  a.act = p.act;
  a.gate_up = p.gate_up;
  a.inter = p.inter;
  a.rows = p.rows;
  a.total = p.total;
  a.row_experts = p.row_experts;
  a.experts = p.experts;
  a.bias = p.bias;
  a.d1 = p.d1;
  a.h = p.h;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<ActivationParams, ActivationArgs>(13), "assign every ActivationArgs field above");
  return wrap(moe_gemm::activate(a));
}

LaunchStatus decode_layer(const DecodeParams& p) {
  DecodeArgs a{};
  a.dtype = p.dtype;
  a.act = p.act;
  a.gate_up = p.gate_up;
  a.tokens = p.tokens;
  a.top_k = p.top_k;
  a.experts = p.experts;
  a.hidden = p.hidden;
  a.inter = p.inter;
  a.x = p.x;
  a.ids = p.ids;
  a.weights = p.weights;
  a.w13 = p.w13;
  a.w2 = p.w2;
  a.b13 = p.b13;
  a.b2 = p.b2;
  a.h = p.h;
  a.y = p.y;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<DecodeParams, DecodeArgs>(19), "assign every DecodeArgs field above");
  return wrap(moe_gemm::decode_layer(a));
}

// The decode tiles (cpp/fused/fused_decode.cu); the others are the warpgroup-MMA tiles of fused_moe_sm90.cuh.
static bool is_swap_ab(FusedTile tile) {
  return tile == FusedTile::SwapAb16 || tile == FusedTile::SwapAb32 || tile == FusedTile::SwapAbMerged;
}

LaunchStatus fused_moe_gemm(const FusedGemmParams& p) {
  FusedGemmArgs a{};
  a.dtype = p.dtype;
  a.tile = p.tile;
  a.mode = p.mode;
  a.top_k = p.top_k;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.rows = p.rows;
  a.sm_count = p.sm_count;
  a.capacity = p.capacity;
  a.a = p.a;
  a.b = p.b;
  a.d = p.d;
  a.sorted_ids = p.sorted_ids;
  a.expert_ids = p.expert_ids;
  a.total = p.total;
  a.weights = p.weights;
  a.bias = p.bias;
  a.act = p.act;
  a.gate_up = p.gate_up;
  a.stream = p.stream;
  // Every field of FusedGemmArgs above; `offsets`, `ready` and `topk_ids` go to the SwapAb kernels beside it.
  static_assert(field_count<FusedGemmParams>() == 24 && field_count<FusedGemmArgs>() == 21 &&
                    sizeof(FusedGemmParams) == sizeof(FusedGemmArgs) + 3 * sizeof(uint64_t),
                "assign every FusedGemmArgs field above");
  if (is_swap_ab(p.tile)) return wrap(moe_gemm::fused_decode_gemm(a, p.offsets, p.ready, p.topk_ids));
  if (p.ready || p.mode == FusedMode::GatherGated) return LaunchStatus{StatusCode::NotBuilt, 0};  // SwapAb tiles only
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::fused_moe_gemm_bf16(a));
    case DType::F16: return wrap(moe_gemm::fused_moe_gemm_f16(a));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

LaunchStatus fused_moe_prepare(DType dtype, FusedTile tile) {
  if (is_swap_ab(tile)) return wrap(moe_gemm::fused_decode_prepare(dtype, tile));
  switch (dtype) {
    case DType::BF16: return wrap(moe_gemm::fused_moe_prepare_bf16(tile));
    case DType::F16: return wrap(moe_gemm::fused_moe_prepare_f16(tile));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

LaunchStatus fused_moe_gemm_fp8(const FusedGemmFp8Params& p) {
  FusedGemmFp8Args a{};
  a.tile = p.tile;
  a.mode = p.mode;
  a.top_k = p.top_k;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.rows = p.rows;
  a.sm_count = p.sm_count;
  a.capacity = p.capacity;
  a.a = p.a;
  a.sfa = p.sfa;
  a.b = p.b;
  a.sfb = p.sfb;
  a.d = p.d;
  a.sorted_ids = p.sorted_ids;
  a.expert_ids = p.expert_ids;
  a.total = p.total;
  a.weights = p.weights;
  a.bias = p.bias;
  a.stream = p.stream;
  static_assert(same_fields<FusedGemmFp8Params, FusedGemmFp8Args>(20), "assign every FusedGemmFp8Args field above");
  return wrap(moe_gemm::fused_moe_gemm_fp8(a));
}

LaunchStatus fused_moe_prepare_fp8(FusedFp8Tile tile) { return wrap(moe_gemm::fused_moe_prepare_fp8(tile)); }

// Two parts of grouped_gemm_sm100_mx.cu define the SM100 MX configurations: grouped_gemm_sm100_mxfp8.inl
// (kind::mxf8f6f4) and grouped_gemm_sm100_fp4.inl (kind::mxf4, kind::mxf4nvf4).
bool grouped_gemm_sm100_mx_built(Sm100MxConfig config) {
  return moe_gemm::sm100_mx_is_fp4(config) ? moe_gemm::grouped_gemm_sm100_fp4_built(config)
                                           : moe_gemm::grouped_gemm_sm100_mxf8_built(config);
}

LaunchStatus grouped_gemm_sm100_mx_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count,
                                             uint64_t& bytes) {
  return wrap(moe_gemm::sm100_mx_is_fp4(config)
                  ? moe_gemm::grouped_gemm_sm100_fp4_workspace(config, groups, sm_count, &bytes)
                  : moe_gemm::grouped_gemm_sm100_mxf8_workspace(config, groups, sm_count, &bytes));
}

namespace {
// The arguments of both MX GEMMs (the SM100 units and the portable one), field by field.
GroupedGemmMxArgs mx_args(const GroupedGemmMxParams& p) {
  GroupedGemmMxArgs a{};
  a.config = p.config;
  a.mode = p.mode;
  a.max_m = p.max_m;
  a.groups = p.groups;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = p.max_rows;
  a.a = p.a;
  a.sfa = p.sfa;
  a.sfa_bases = p.sfa_bases;
  a.b = p.b;
  a.sfb = p.sfb;
  a.a_tensor_scale = p.a_tensor_scale;
  a.b_tensor_scales = p.b_tensor_scales;
  a.d = p.d;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  a.status = p.status;
  a.device = p.device;
  a.sm_count = p.sm_count;
  a.stream = p.stream;
  static_assert(same_fields<GroupedGemmMxParams, GroupedGemmMxArgs>(23), "assign every GroupedGemmMxArgs field above");
  return a;
}
}  // namespace

LaunchStatus grouped_gemm_sm100_mx_run(const GroupedGemmMxParams& p) {
  const GroupedGemmMxArgs a = mx_args(p);
  return wrap(moe_gemm::sm100_mx_is_fp4(a.config) ? moe_gemm::grouped_gemm_sm100_fp4_run(a)
                                                  : moe_gemm::grouped_gemm_sm100_mxf8_run(a));
}

LaunchStatus grouped_gemm_mx_portable_run(const GroupedGemmMxParams& p) {
  return wrap(moe_gemm::grouped_gemm_mx_portable_run(mx_args(p)));
}

LaunchStatus sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                       uint64_t y, uint64_t stream) {
  return wrap(moe_gemm::sum_slots(dtype, tokens, top_k, hidden, pairs, positions, y, stream));
}

LaunchStatus decode_layer_fp8(const DecodeFp8Params& p) {
  DecodeFp8Args a{};
  a.act = p.act;
  a.tokens = p.tokens;
  a.top_k = p.top_k;
  a.experts = p.experts;
  a.hidden = p.hidden;
  a.inter = p.inter;
  a.eps = p.eps;
  a.ue8m0 = p.ue8m0;
  a.x = p.x;
  a.ids = p.ids;
  a.weights = p.weights;
  a.w13 = p.w13;
  a.w13_scales = p.w13_scales;
  a.w2 = p.w2;
  a.w2_scales = p.w2_scales;
  a.b13 = p.b13;
  a.b2 = p.b2;
  a.h = p.h;
  a.y = p.y;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<DecodeFp8Params, DecodeFp8Args>(21), "assign every DecodeFp8Args field above");
  return wrap(moe_gemm::decode_layer_fp8(a));
}

LaunchStatus ep_gather_ids(int64_t capacity, int32_t rows, uint64_t sorted_ids, uint64_t ids, int32_t sentinel,
                           uint64_t out, uint64_t stream) {
  return wrap(moe_gemm::ep_gather_ids(capacity, rows, sorted_ids, ids, sentinel, out, stream));
}

}  // namespace bridge
}  // namespace moe_gemm
