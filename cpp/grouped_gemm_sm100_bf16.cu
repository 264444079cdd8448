// Explicit instantiations: SM100 (sm_100a) grouped GEMM, bf16 in / bf16 out, fp32 accumulation in tensor memory.
#include "grouped_gemm_sm100.cuh"

#define CONFIGS(X) X(Mma1Sm128x256x64) X(Mma1Sm128x128x64)
MOE_GEMM_DEFINE_SM100_FAMILY(bf16, cutlass::bfloat16_t, CONFIGS)
