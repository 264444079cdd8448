// moe-gemm unit: family=grouped_gemm_sm100 targets=sm_100a seconds=40
// The SM100 (sm_100a) dense grouped GEMM over OpClassTensorOp, in one nvcc process (why one unit per family:
// build/toolchain.rs's kernel_units): bf16 in / bf16 out with fp32 accumulation in tensor memory. Never run on
// hardware: compiled and SASS-checked.
#include "dense/grouped_gemm_sm100.cuh"

#define MOE_GEMM_SM100_BF16_CONFIGS(X) X(Mma1Sm128x256x64) X(Mma1Sm128x128x64)
MOE_GEMM_DEFINE_SM100_FAMILY(bf16, cutlass::bfloat16_t, MOE_GEMM_SM100_BF16_CONFIGS)

