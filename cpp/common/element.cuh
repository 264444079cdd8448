// 16-bit element conversions shared by the non-CUTLASS kernels (f32 math on bf16 / f16 storage).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace moe_gemm {
namespace element {

template <class T>
__device__ __forceinline__ float f32(T x);
template <>
__device__ __forceinline__ float f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float f32(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T cast(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 cast(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half cast(float x) { return __float2half(x); }

// The value an f32 takes once stored as T (the rounding a GEMM's output applies).
template <class T>
__device__ __forceinline__ float round_to(float x) { return f32(cast<T>(x)); }

}  // namespace element
}  // namespace moe_gemm
