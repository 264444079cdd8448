// One warp's mma.sync on f32 accumulators c[4] from A in four registers and B in two: the operands of the fused
// decode tiles' m16n8k16 (bf16, f16) and of the FP8 decode's m16n8k32 (e4m3). Only the shape and types the PTX
// names differ, and an asm string must be a literal: hence a macro, `shape_types` e.g.
// "m16n8k16.row.col.f32.bf16.bf16.f32".
#pragma once

#include <cstdint>

#define MOE_GEMM_MMA_SYNC(shape_types, c, a0, a1, a2, a3, b0, b1)                                         \
  asm volatile("mma.sync.aligned." shape_types " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                          \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

namespace moe_gemm {

// m16n8k32 e4m3 x e4m3 -> f32, the FP8 decode kernels' MMA (the Batched FP8 kernels, the FP8 swap-AB GEMM).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  MOE_GEMM_MMA_SYNC("m16n8k32.row.col.f32.e4m3.e4m3.f32", c, a0, a1, a2, a3, b0, b1);
}

}  // namespace moe_gemm
