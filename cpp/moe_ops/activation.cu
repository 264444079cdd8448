// moe-gemm unit: family=activation targets=portable seconds=2
// Gated activations between the two expert GEMMs: h = act(gate, up) per row, f32 math on 16-bit inputs, one
// rounding on output. Rows whose expert is -1 (padding, dropped) and rows past the device-side total are skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element.cuh"
#include "common/gated.cuh"
#include "common/moe_ops.h"
#include "common/pdl.cuh"

namespace moe_gemm {
namespace activation {

using element::cast;
using element::f32;

using gated::gpt_oss;
using gated::silu;

// Eight outputs per thread through 16-byte loads and stores (I % 8 == 0, 16-byte aligned d1 and h: the caller
// checks): the rows in use x I / 8 groups, flattened and grid-strided, so that a masked layout's empty capacity
// costs no blocks. (A block per row with a thread per output, 2-byte loads, took 10.4 us under ncu for the 9 MB
// of Qwen3-30B T = 256, each of a row's I / 256 steps waiting for its loads in turn.)
template <class T>
__global__ void __launch_bounds__(256) activate_kernel(const ActivationArgs a) {
  pdl::wait_for_prerequisites();  // launched as GEMM1 ends (activate): its d1 first
  pdl::launch_dependents();       // GEMM2's prepare kernel (one CTA) may queue now
  const int32_t* total = reinterpret_cast<const int32_t*>(a.total);
  const int64_t rows = total ? (*total < a.rows ? *total : a.rows) : a.rows;
  const int I = a.inter, groups = I / 8;
  const bool gated = a.act != Activation::Silu, inter = a.gate_up == GateUp::Interleaved;
  const int width = gated ? 2 * I : I;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * groups;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / groups;
    const int i0 = static_cast<int>(idx - row * groups) * 8;
    const int e = reinterpret_cast<const int32_t*>(a.row_experts)[row];
    if (e < 0 || e >= a.experts) continue;
    const T* d = reinterpret_cast<const T*>(a.d1) + row * width;
    const float* bias = a.bias ? reinterpret_cast<const float*>(a.bias) + static_cast<int64_t>(e) * width : nullptr;
    // g[j], u[j]: output i0 + j's gate and up; the gate's and up's w13 rows as gated::gate_row / up_row say.
    T g[8], u[8];
    if (!gated) {
      *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(d + i0);
    } else if (inter) {
      T pair[16];
      *reinterpret_cast<uint4*>(pair) = *reinterpret_cast<const uint4*>(d + 2 * i0);
      *reinterpret_cast<uint4*>(pair + 8) = *reinterpret_cast<const uint4*>(d + 2 * i0 + 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) g[j] = pair[2 * j], u[j] = pair[2 * j + 1];
    } else {
      *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(d + i0);
      *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(d + I + i0);
    }
    T out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = i0 + j;
      if (!gated) {
        out[j] = cast<T>(silu(f32(g[j]) + (bias ? bias[i] : 0.f)));
        continue;
      }
      const int gi = gated::gate_row(a.gate_up, I, i), ui = gated::up_row(a.gate_up, I, i);
      const float gv = f32(g[j]) + (bias ? bias[gi] : 0.f);
      const float uv = f32(u[j]) + (bias ? bias[ui] : 0.f);
      out[j] = cast<T>(gated::apply(a.act, gv, uv));
    }
    *reinterpret_cast<uint4*>(reinterpret_cast<T*>(a.h) + row * I + i0) = *reinterpret_cast<const uint4*>(out);
  }
}

}  // namespace activation

Status activate(const ActivationArgs& a) {
  if (a.rows == 0) return {StatusCode::Ok, 0};
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.inter % 8 != 0 || a.d1 % 16 != 0 || a.h % 16 != 0)  // checked by the caller: 16-byte vectors
    return {StatusCode::Cuda, static_cast<int32_t>(cudaErrorInvalidValue)};
  const int64_t threads = a.rows * (a.inter / 8);  // at most: the device total may be fewer rows
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256 < 2048 ? (threads + 255) / 256 : 2048);
  // Programmatic dependent launch (pdl.cuh): scheduled once GEMM1's CTAs have exited, it waits before it reads.
  return a.dtype == DType::BF16 ? pdl::launch(true, dim3(blocks), dim3(256), 0, s, activation::activate_kernel<__nv_bfloat16>, a)
                                : pdl::launch(true, dim3(blocks), dim3(256), 0, s, activation::activate_kernel<__half>, a);
}

}  // namespace moe_gemm
