// moe-gemm unit: family=grouped_gemm_sm90 targets=sm_90a seconds=82
// The SM90 grouped GEMM, bf16 and f16 in / out, fp32 accumulation, in one nvcc process (why one unit per family:
// build/toolchain.rs's kernel_units). The tiles are TileConfig's; each is one CUTLASS kernel per dtype.
#include "dense/grouped_gemm_sm90.cuh"

#define MOE_GEMM_SM90_CONFIGS(X) X(Cooperative128x128x64) X(Cooperative128x256x64) X(Pingpong64x128x64) \
  X(Pingpong128x128x64) X(Pingpong64x64x128)
MOE_GEMM_DEFINE_SM90_FAMILY(bf16, cutlass::bfloat16_t, MOE_GEMM_SM90_CONFIGS)
MOE_GEMM_DEFINE_SM90_FAMILY(f16, cutlass::half_t, MOE_GEMM_SM90_CONFIGS)
