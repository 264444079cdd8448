// The SM90 FP8 grouped GEMMs, e4m3 x e4m3 with bf16 out, in one nvcc process (why one unit per family:
// build/toolchain.rs's KERNEL_UNITS): DeepSeek's blockwise f32 scales and the rowwise (per-token x per-channel)
// scales.
#include "fp8_blockwise/grouped_gemm_sm90_fp8_blockwise.inl"
#include "fp8_rowwise/grouped_gemm_sm90_fp8_rowwise.inl"
