// The SwapAb decode tiles' epilogues (fused_decode.cu): an m16n8k16 accumulator of weight rows x positions
// stored as GEMM1's gated h by position, GEMM1's plain output by position, or GEMM2's weighted pairs by flat row.
#pragma once

#include <cstdint>

#include "common/element.cuh"
#include "common/gated.cuh"
#include "fused/launch.h"

namespace moe_gemm {
namespace fused_decode {

// GatherGated: accumulator v of (0, j) / (1, j) is the gate / up of output n0 / 2 + g + 8(v / 2) at position
// p0 + 8j + 2t + v % 2; h = act of them, rounded and biased as the activation kernel does, at positions with a row.
template <class T, int MT, int NT>
__device__ __forceinline__ void store_gated(const FusedGemmArgs& a, const float (&acc)[MT][NT][4], int64_t total,
                                            int e, int64_t p0, int n0, int g, int t) {
  const int I = a.n / 2;
  const int* sorted = reinterpret_cast<const int32_t*>(a.sorted_ids);
  T* D = reinterpret_cast<T*>(a.d);
  const float* bias = a.bias ? reinterpret_cast<const float*>(a.bias) + static_cast<int64_t>(e) * a.n : nullptr;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int64_t p = p0 + 8 * j + 2 * t + q;
      if (p >= total) continue;
      const int r = sorted[p];
      if (r < 0 || r >= a.rows) continue;  // padding: the activation kernel skips it too
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int o = n0 / 2 + 8 * h + g;
        if (o >= I) continue;
        const int gi = gated::gate_row(a.gate_up, I, o), ui = gated::up_row(a.gate_up, I, o);
        const float gv = element::round_to<T>(acc[0][j][2 * h + q]) + (bias ? bias[gi] : 0.f);
        const float uv = element::round_to<T>(acc[1][j][2 * h + q]) + (bias ? bias[ui] : 0.f);
        D[p * I + o] = element::cast<T>(gated::apply(a.act, gv, uv));
      }
    }
}

// Accumulator v of (i, j) is weight row n0 + 16i + g + 8(v / 2) at position p0 + 8j + 2t + v % 2: gather stores
// it by position, scatter weights it and stores it at the position's flat row.
template <class T, int MT, int NT>
__device__ __forceinline__ void store(const FusedGemmArgs& a, const float (&acc)[MT][NT][4], int64_t total, int e,
                                      int64_t p0, int n0, int g, int t) {
  if (a.mode == FusedMode::GatherGated) return store_gated<T, MT, NT>(a, acc, total, e, p0, n0, g, t);
  const int N = a.n;
  const bool gather = a.mode == FusedMode::Gather;
  const int* sorted = reinterpret_cast<const int32_t*>(a.sorted_ids);
  T* D = reinterpret_cast<T*>(a.d);
  const float* bias = a.bias ? reinterpret_cast<const float*>(a.bias) + static_cast<int64_t>(e) * N : nullptr;
  const float* weights = reinterpret_cast<const float*>(a.weights);
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int64_t p = p0 + 8 * j + 2 * t + q;
      if (p >= total) continue;
      int64_t dst = p;
      float w = 1.f;
      if (!gather) {
        const int r = sorted[p];
        if (r < 0 || r >= a.rows) continue;
        dst = r;
        w = weights ? weights[r] : 1.f;
      }
      T* out = D + dst * N;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = n0 + 16 * i + 8 * h + g;
          if (n >= N) continue;
          const float v = acc[i][j][2 * h + q];
          // GEMM2 rounds to the element type before the bias and the router weight, as the other tiles do.
          out[n] = gather ? element::cast<T>(v)
                          : element::cast<T>((element::round_to<T>(v) + (bias ? bias[n] : 0.f)) * w);
        }
    }
}

}  // namespace fused_decode
}  // namespace moe_gemm
