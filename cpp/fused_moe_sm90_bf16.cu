// Explicit instantiations: SM90 fused MoE GEMMs, bf16 in / bf16 out, fp32 accumulation.
#include "fused_moe_sm90.cuh"

moe_gemm::Status moe_gemm::fused_moe_gemm_bf16(const FusedGemmArgs& args) {
  return fused::run_tile<cutlass::bfloat16_t>(args);
}

moe_gemm::Status moe_gemm::fused_moe_prepare_bf16(FusedTile tile) {
  return fused::prepare_tile<cutlass::bfloat16_t>(tile);
}
