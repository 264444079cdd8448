// Explicit instantiations: SM90 grouped GEMM, bf16 in / bf16 out, fp32 accumulation.
#include "grouped_gemm_sm90.cuh"

#define CONFIGS(X) X(Cooperative128x128x64) X(Cooperative128x256x64) X(Pingpong64x128x64) X(Pingpong128x128x64) \
  X(Pingpong64x64x128)
MOE_GEMM_DEFINE_SM90_FAMILY(bf16, cutlass::bfloat16_t, CONFIGS)
