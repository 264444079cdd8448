// Gated activations between the two expert GEMMs: h = act(gate, up) per row, f32 math on 16-bit inputs, one
// rounding on output. Rows whose expert is -1 (padding, dropped) and rows past the device-side total are skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "element.cuh"
#include "gated.cuh"
#include "moe_ops.h"

namespace moe_gemm {
namespace activation {

using element::cast;
using element::f32;

using gated::gpt_oss;
using gated::silu;

template <class T>
__device__ void activate_row(const ActivationArgs& a, int64_t row, int e) {
  const int I = a.inter;
  const bool gated = a.act != Activation::Silu;
  const int width = gated ? 2 * I : I;
  const T* d = reinterpret_cast<const T*>(a.d1) + row * width;
  const float* bias = a.bias ? reinterpret_cast<const float*>(a.bias) + static_cast<int64_t>(e) * width : nullptr;
  T* h = reinterpret_cast<T*>(a.h) + row * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    if (!gated) {
      h[i] = cast<T>(silu(f32(d[i]) + (bias ? bias[i] : 0.f)));
      continue;
    }
    const int gi = gated::gate_row(a.gate_up, I, i), ui = gated::up_row(a.gate_up, I, i);
    const float g = f32(d[gi]) + (bias ? bias[gi] : 0.f);
    const float u = f32(d[ui]) + (bias ? bias[ui] : 0.f);
    h[i] = cast<T>(gated::apply(a.act, g, u));
  }
}

// Blocks stride over the rows (a masked layout's capacity is mostly empty rows: a block per row would spend
// its time launching blocks that exit), threads over the I outputs.
template <class T>
__global__ void activate_kernel(const ActivationArgs a) {
  const int32_t* total = reinterpret_cast<const int32_t*>(a.total);
  const int64_t rows = total ? (*total < a.rows ? *total : a.rows) : a.rows;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int e = reinterpret_cast<const int32_t*>(a.row_experts)[row];
    if (e < 0 || e >= a.experts) continue;
    activate_row<T>(a, row, e);
  }
}

}  // namespace activation

Status activate(const ActivationArgs& a) {
  if (a.rows == 0) return {StatusCode::Ok, 0};
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  const int threads = a.inter >= 256 ? 256 : ((a.inter + 31) / 32) * 32;
  const unsigned blocks = static_cast<unsigned>(a.rows < 4096 ? a.rows : 4096);
  if (a.dtype == DType::BF16) {
    activation::activate_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(a);
  } else {
    activation::activate_kernel<__half><<<blocks, threads, 0, s>>>(a);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
