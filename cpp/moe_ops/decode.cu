// moe-gemm unit: family=decode targets=portable seconds=2
// Decode path of the MoE layer (the Batched backend): per (token, slot) row, weights streamed with 16-byte loads
// by every SM, no layout, no tiles. Two kernels for the whole layer:
//   expand: h[r, :] = act(W13[e_r] · x[r / k] (+ b13)), gate/up dot products rounded to the element type first
//   reduce: y[t, :] = Σ_j w[t, j] · (round(W2[e_{t,j}] · h[t·k + j]) + b2), summed in f32, rounded once
// The roundings are those of the GEMM path, so both compute the same function.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element.cuh"
#include "common/moe_ops.h"

namespace moe_gemm {
namespace decode {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 8;
constexpr int kOutPerWarp = 2;  // outputs per warp: several weight rows in flight

using element::cast;
using element::f32;
using element::round_to;

// Dot products of `n` weight rows with one activation row, all of length `len` (a multiple of 8): lane-strided
// 16-byte loads, then a warp reduction. Every lane returns the sums.
template <class T, int N>
__device__ __forceinline__ void warp_dots(const T* const (&w)[N], const T* __restrict__ v, int len, float (&out)[N]) {
  float acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.f;
  const int lane = threadIdx.x % 32;
  for (int c = lane * 8; c < len; c += 32 * 8) {
    const uint4 vv = *reinterpret_cast<const uint4*>(v + c);
    const T* ve = reinterpret_cast<const T*>(&vv);
    uint4 wv[N];
#pragma unroll
    for (int n = 0; n < N; ++n) wv[n] = __ldg(reinterpret_cast<const uint4*>(w[n] + c));
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const T* we = reinterpret_cast<const T*>(&wv[n]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[n] += f32(we[i]) * f32(ve[i]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    for (int off = 16; off; off >>= 1) acc[n] += __shfl_xor_sync(kFull, acc[n], off);
    out[n] = acc[n];
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

template <class T>
__global__ void __launch_bounds__(32 * kWarps) expand_kernel(const DecodeArgs a) {
  const int r = blockIdx.y;
  const int e = reinterpret_cast<const int32_t*>(a.ids)[r];
  if (e < 0 || e >= a.experts) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(reinterpret_cast<uint32_t*>(a.status), kErrExpertIdOutOfRange);
    return;
  }
  const int I = a.inter, H = a.hidden;
  const bool gated = a.act != Activation::Silu;
  const int rows13 = gated ? 2 * I : I;
  const T* x = reinterpret_cast<const T*>(a.x) + static_cast<int64_t>(r / a.top_k) * H;
  const T* w13 = reinterpret_cast<const T*>(a.w13) + static_cast<int64_t>(e) * rows13 * H;
  const float* b13 = a.b13 ? reinterpret_cast<const float*>(a.b13) + static_cast<int64_t>(e) * rows13 : nullptr;
  T* h = reinterpret_cast<T*>(a.h) + static_cast<int64_t>(r) * I;
  const int warp = threadIdx.x / 32;
  const int i0 = (blockIdx.x * kWarps + warp) * kOutPerWarp;
  if (i0 >= I) return;
  // Rows of W13 feeding outputs i0, i0 + 1: (gate, up) each, or the plain row.
  int gi[kOutPerWarp], ui[kOutPerWarp];
#pragma unroll
  for (int n = 0; n < kOutPerWarp; ++n) {
    const int i = min(i0 + n, I - 1);
    gi[n] = !gated ? i : (a.gate_up == GateUp::Interleaved ? 2 * i : i);
    ui[n] = !gated ? i : (a.gate_up == GateUp::Interleaved ? 2 * i + 1 : I + i);
  }
  const T* rows[2 * kOutPerWarp];
#pragma unroll
  for (int n = 0; n < kOutPerWarp; ++n) {
    rows[2 * n] = w13 + static_cast<int64_t>(gi[n]) * H;
    rows[2 * n + 1] = w13 + static_cast<int64_t>(ui[n]) * H;
  }
  float d[2 * kOutPerWarp];
  warp_dots<T, 2 * kOutPerWarp>(rows, x, H, d);
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int n = 0; n < kOutPerWarp; ++n) {
      if (i0 + n >= I) break;
      const float g = round_to<T>(d[2 * n]) + (b13 ? b13[gi[n]] : 0.f);
      const float u = round_to<T>(d[2 * n + 1]) + (b13 ? b13[ui[n]] : 0.f);
      float v;
      if (!gated) {
        v = silu(g);
      } else if (a.act == Activation::GptOssSwiglu) {
        const float gc = fminf(g, 7.f), uc = fminf(fmaxf(u, -7.f), 7.f);
        v = (uc + 1.f) * gc / (1.f + __expf(-1.702f * gc));
      } else {
        v = silu(g) * u;
      }
      h[i0 + n] = cast<T>(v);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps) reduce_kernel(const DecodeArgs a) {
  const int t = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int o0 = (blockIdx.x * kWarps + warp) * kOutPerWarp;
  const int I = a.inter, H = a.hidden;
  if (o0 >= H) return;
  float acc[kOutPerWarp];
#pragma unroll
  for (int n = 0; n < kOutPerWarp; ++n) acc[n] = 0.f;
  for (int j = 0; j < a.top_k; ++j) {
    const int64_t r = static_cast<int64_t>(t) * a.top_k + j;
    const int e = reinterpret_cast<const int32_t*>(a.ids)[r];
    if (e < 0 || e >= a.experts) continue;  // reported by expand
    const T* w2 = reinterpret_cast<const T*>(a.w2) + static_cast<int64_t>(e) * H * I;
    const T* h = reinterpret_cast<const T*>(a.h) + r * I;
    const T* rows[kOutPerWarp];
#pragma unroll
    for (int n = 0; n < kOutPerWarp; ++n) rows[n] = w2 + static_cast<int64_t>(min(o0 + n, H - 1)) * I;
    float d[kOutPerWarp];
    warp_dots<T, kOutPerWarp>(rows, h, I, d);
    const float w = reinterpret_cast<const float*>(a.weights)[r];
    const float* b2 = a.b2 ? reinterpret_cast<const float*>(a.b2) + static_cast<int64_t>(e) * H : nullptr;
#pragma unroll
    for (int n = 0; n < kOutPerWarp; ++n) acc[n] += w * (round_to<T>(d[n]) + (b2 ? b2[min(o0 + n, H - 1)] : 0.f));
  }
  if (threadIdx.x % 32 == 0) {
    T* y = reinterpret_cast<T*>(a.y) + static_cast<int64_t>(t) * H;
#pragma unroll
    for (int n = 0; n < kOutPerWarp; ++n)
      if (o0 + n < H) y[o0 + n] = cast<T>(acc[n]);
  }
}

template <class T>
Status run(const DecodeArgs& a) {
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  constexpr int per_block = kWarps * kOutPerWarp;
  expand_kernel<T><<<dim3((a.inter + per_block - 1) / per_block, a.tokens * a.top_k), 32 * kWarps, 0, s>>>(a);
  reduce_kernel<T><<<dim3((a.hidden + per_block - 1) / per_block, a.tokens), 32 * kWarps, 0, s>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace decode

Status decode_layer(const DecodeArgs& a) {
  if (a.tokens == 0) return {StatusCode::Ok, 0};
  return a.dtype == DType::BF16 ? decode::run<__nv_bfloat16>(a) : decode::run<__half>(a);
}

}  // namespace moe_gemm
