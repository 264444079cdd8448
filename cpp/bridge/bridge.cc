#include "moe-gemm/cpp/bridge/bridge.h"

namespace moe_gemm {
namespace bridge {

bool grouped_gemm_sm90_built(DType dtype, TileConfig config) {
  switch (dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm90_bf16_built(config);
    case DType::F16: return moe_gemm::grouped_gemm_sm90_f16_built(config);
  }
  return false;
}

Status grouped_gemm_sm90_workspace(DType dtype, TileConfig config, int32_t groups, int32_t sm_count, uint64_t& bytes) {
  switch (dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm90_bf16_workspace(config, groups, sm_count, &bytes);
    case DType::F16: return moe_gemm::grouped_gemm_sm90_f16_workspace(config, groups, sm_count, &bytes);
  }
  return Status{StatusCode::NotBuilt, 0};
}

Status grouped_gemm_sm90_run(const GroupedGemmArgs& args) {
  switch (args.dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm90_bf16_run(args);
    case DType::F16: return moe_gemm::grouped_gemm_sm90_f16_run(args);
  }
  return Status{StatusCode::NotBuilt, 0};
}

// A family's schedule name ("" for a configuration it does not know).
static rust::String schedule_name(const char* name) { return rust::String(name != nullptr ? name : ""); }

rust::String grouped_gemm_sm90_fp8_schedule(Fp8TileConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm90_fp8_blockwise_schedule(config));
}

rust::String grouped_gemm_sm100_fp8_schedule(Fp8TileConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm100_fp8_blockwise_schedule(config));
}

rust::String grouped_gemm_sm90_fp8_rowwise_schedule(Fp8RowwiseConfig config) {
  return schedule_name(moe_gemm::grouped_gemm_sm90_fp8_rowwise_schedule(config));
}

// SM100: bf16 only so far; f16 is NotBuilt.
bool grouped_gemm_sm100_built(DType dtype, Sm100TileConfig config) {
  return dtype == DType::BF16 && moe_gemm::grouped_gemm_sm100_bf16_built(config);
}

Status grouped_gemm_sm100_workspace(DType dtype, Sm100TileConfig config, int32_t groups, int32_t sm_count,
                                    uint64_t& bytes) {
  if (dtype != DType::BF16) return Status{StatusCode::NotBuilt, 0};
  return moe_gemm::grouped_gemm_sm100_bf16_workspace(config, groups, sm_count, &bytes);
}

Status grouped_gemm_sm100_facts(DType dtype, Sm100TileConfig config, Sm100KernelFacts& facts) {
  if (dtype != DType::BF16) return Status{StatusCode::NotBuilt, 0};
  return moe_gemm::grouped_gemm_sm100_bf16_facts(config, &facts);
}

Status grouped_gemm_sm100_run(const GroupedGemmSm100Args& args) {
  switch (args.dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm100_bf16_run(args);
    case DType::F16: break;
  }
  return Status{StatusCode::NotBuilt, 0};
}

rust::String cuda_error_name(int32_t code) {
  const char* name = moe_gemm::cuda_error_name(code);
  return rust::String(name != nullptr ? name : "unknown CUDA error");
}

// The decode tiles (cpp/fused/fused_decode.cu); the others are the warpgroup-MMA tiles of fused_moe_sm90.cuh.
static bool is_swap_ab(FusedTile tile) {
  return tile == FusedTile::SwapAb16 || tile == FusedTile::SwapAb32 || tile == FusedTile::SwapAbMerged;
}

Status fused_moe_gemm(const FusedGemmArgs& args, uint64_t offsets, uint64_t ready, uint64_t topk_ids) {
  if (is_swap_ab(args.tile)) return moe_gemm::fused_decode_gemm(args, offsets, ready, topk_ids);
  if (ready || args.mode == FusedMode::GatherGated) return Status{StatusCode::NotBuilt, 0};  // SwapAb tiles only
  switch (args.dtype) {
    case DType::BF16: return moe_gemm::fused_moe_gemm_bf16(args);
    case DType::F16: return moe_gemm::fused_moe_gemm_f16(args);
  }
  return Status{StatusCode::NotBuilt, 0};
}

Status fused_moe_prepare(DType dtype, FusedTile tile) {
  if (is_swap_ab(tile)) return moe_gemm::fused_decode_prepare(dtype, tile);
  switch (dtype) {
    case DType::BF16: return moe_gemm::fused_moe_prepare_bf16(tile);
    case DType::F16: return moe_gemm::fused_moe_prepare_f16(tile);
  }
  return Status{StatusCode::NotBuilt, 0};
}

// Two parts of grouped_gemm_sm100_mx.cu define the SM100 MX configurations: grouped_gemm_sm100_mxfp8.inl
// (kind::mxf8f6f4) and grouped_gemm_sm100_fp4.inl (kind::mxf4, kind::mxf4nvf4).
bool grouped_gemm_sm100_mx_built(Sm100MxConfig config) {
  return moe_gemm::sm100_mx_is_fp4(config) ? moe_gemm::grouped_gemm_sm100_fp4_built(config)
                                           : moe_gemm::grouped_gemm_sm100_mxf8_built(config);
}

Status grouped_gemm_sm100_mx_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count, uint64_t& bytes) {
  return moe_gemm::sm100_mx_is_fp4(config)
             ? moe_gemm::grouped_gemm_sm100_fp4_workspace(config, groups, sm_count, &bytes)
             : moe_gemm::grouped_gemm_sm100_mxf8_workspace(config, groups, sm_count, &bytes);
}

Status grouped_gemm_sm100_mx_run(const GroupedGemmMxArgs& args) {
  return moe_gemm::sm100_mx_is_fp4(args.config) ? moe_gemm::grouped_gemm_sm100_fp4_run(args)
                                                : moe_gemm::grouped_gemm_sm100_mxf8_run(args);
}

}  // namespace bridge
}  // namespace moe_gemm
