// Explicit instantiations: SM90 grouped GEMM, fp16 in / fp16 out, fp32 accumulation.
#include "grouped_gemm_sm90.cuh"

#define CONFIGS(X) X(Cooperative128x128x64) X(Cooperative128x256x64) X(Pingpong64x128x64) X(Pingpong128x128x64) \
  X(Pingpong64x64x128)
MOE_GEMM_DEFINE_SM90_FAMILY(f16, cutlass::half_t, CONFIGS)
