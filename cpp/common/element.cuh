// 16-bit element conversions shared by the non-CUTLASS kernels (f32 math on bf16 / f16 storage).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace moe_gemm {
namespace element {

// Both types convert as these name it: to f32 exactly, from f32 to nearest even (__bfloat162float,
// __float2bfloat16 and the __half ones, through the types' own conversions).
template <class T>
__device__ __forceinline__ float f32(T x) { return static_cast<float>(x); }
template <class T>
__device__ __forceinline__ T cast(float x) { return T(x); }

// The value an f32 takes once stored as T (the rounding a GEMM's output applies).
template <class T>
__device__ __forceinline__ float round_to(float x) { return f32(cast<T>(x)); }

}  // namespace element
}  // namespace moe_gemm
