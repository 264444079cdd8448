// The gated activations between the two expert GEMMs, shared by the activation kernel and the kernels that apply
// them in an epilogue, so that every path computes the same function bit for bit.
#pragma once

#include "common/moe_ops.h"

namespace moe_gemm {
namespace gated {

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// gpt-oss: the constants are fixed in its code, not read from the config.
__device__ __forceinline__ float gpt_oss(float gate, float up) {
  gate = fminf(gate, 7.f);
  up = fminf(fmaxf(up, -7.f), 7.f);
  return (up + 1.f) * gate / (1.f + __expf(-1.702f * gate));
}

// act(gate, up) for a gated activation (gate and up already rounded to the element type and biased).
__device__ __forceinline__ float apply(Activation act, float gate, float up) {
  return act == Activation::GptOssSwiglu ? gpt_oss(gate, up) : silu(gate) * up;
}

// Rows of w13 holding output i's gate and up.
__device__ __forceinline__ int gate_row(GateUp gu, int inter, int i) { return gu == GateUp::Interleaved ? 2 * i : i; }
__device__ __forceinline__ int up_row(GateUp gu, int inter, int i) {
  return gu == GateUp::Interleaved ? 2 * i + 1 : inter + i;
}

}  // namespace gated
}  // namespace moe_gemm
