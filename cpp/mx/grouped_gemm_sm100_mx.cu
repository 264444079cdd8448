// moe-gemm unit: family=grouped_gemm_sm100 targets=sm_100a seconds=93
// The SM100 (sm_100a) block-scaled grouped GEMMs (OpClassBlockScaledTensorOp, the template:
// grouped_gemm_sm100_mx.cuh) in one nvcc process (why: build/toolchain.rs's kernel_units): MXFP8 activations x
// MXFP8 or MXFP4 weights, and the 4-bit x 4-bit pairs. Never run on hardware: compiled and SASS-checked.
#include "mx/grouped_gemm_sm100_mxfp8.inl"
#include "mx/grouped_gemm_sm100_fp4.inl"
