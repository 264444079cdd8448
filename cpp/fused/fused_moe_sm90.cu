// moe-gemm unit: family=fused_moe_sm90 targets=sm_90a seconds=34
// The SM90 fused MoE GEMMs (gather in GEMM1, router weight and scatter in GEMM2's epilogue), in one nvcc process
// (why one unit per family: build/toolchain.rs's kernel_units): bf16 and f16 in / out with fp32 accumulation
// (below), and e4m3 with f32 blockwise scales (fused_moe_sm90_fp8.inl).
#include "fused/fused_moe_sm90.cuh"

moe_gemm::Status moe_gemm::fused_moe_gemm_bf16(const FusedGemmArgs& args) {
  return fused::run_tile<cutlass::bfloat16_t>(args);
}

moe_gemm::Status moe_gemm::fused_moe_prepare_bf16(FusedTile tile) {
  return fused::prepare_tile<cutlass::bfloat16_t>(tile);
}

moe_gemm::Status moe_gemm::fused_moe_gemm_f16(const FusedGemmArgs& args) {
  return fused::run_tile<cutlass::half_t>(args);
}

moe_gemm::Status moe_gemm::fused_moe_prepare_f16(FusedTile tile) {
  return fused::prepare_tile<cutlass::half_t>(tile);
}

#include "fused/fused_moe_sm90_fp8.inl"
