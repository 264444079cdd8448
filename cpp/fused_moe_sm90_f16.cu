// Explicit instantiations: SM90 fused MoE GEMMs, f16 in / f16 out, fp32 accumulation.
#include "fused_moe_sm90.cuh"

moe_gemm::Status moe_gemm::fused_moe_gemm_f16(const FusedGemmArgs& args) {
  return fused::run_tile<cutlass::half_t>(args);
}

moe_gemm::Status moe_gemm::fused_moe_prepare_f16(FusedTile tile) {
  return fused::prepare_tile<cutlass::half_t>(tile);
}
