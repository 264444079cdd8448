// Explicit instantiations (included once, by grouped_gemm_sm90_fp8.cu): SM90 FP8 blockwise-scaled grouped GEMM,
// e4m3 x e4m3 with f32 1x128 / 128x128 scales, f32 two-level accumulation, bf16 out. Two configurations.
#include "fp8_blockwise/grouped_gemm_sm90_fp8.cuh"

#define MOE_GEMM_FP8_CONFIGS(X) X(Cooperative128x128x128) X(Pingpong64x128x128)
MOE_GEMM_DEFINE_SM90_FP8_BLOCKWISE(MOE_GEMM_FP8_CONFIGS)
