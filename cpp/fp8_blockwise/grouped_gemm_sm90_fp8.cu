// moe-gemm unit: family=grouped_gemm_sm90_fp8 targets=sm_90a seconds=62
// The SM90 FP8 blockwise grouped GEMM, e4m3 x e4m3 with DeepSeek's f32 block scales and bf16 out, in one nvcc
// process (why one unit per family: build/toolchain.rs's kernel_units).
#include "fp8_blockwise/grouped_gemm_sm90_fp8_blockwise.inl"
