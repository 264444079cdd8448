// The e4m3 quantisation rules of moe_ops/quant.h as device functions, shared by the quantisation kernels
// (moe_ops/quant.cu, mx/mx_quant.cu) and the FP8 decode kernels (moe_ops/decode_fp8.cu), so that all quantise bit
// for bit alike: the activation group scale, the weight block scale, and the element encoding of both.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {
namespace quant {

// max(amax, eps) / 448, then (ue8m0) the next power of two: exponent + (mantissa != 0). eps / 448 is normal
// (checked by the caller), so the exponent field is never 0; it is capped at 254 (the largest finite exponent).
__device__ __forceinline__ float group_scale(float amax, float eps, bool ue8m0) {
  float s = __fdiv_rn(fmaxf(amax, eps), 448.f);
  if (ue8m0) {
    const uint32_t b = __float_as_uint(s);
    uint32_t e = ((b >> 23) & 0xffu) + ((b & 0x7fffffu) != 0u);
    e = e > 254u ? 254u : e;
    s = __uint_as_float(e << 23);
  }
  return s;
}

// The 128 x 128 weight block scale of a block whose finite elements have `amax` (>= 0, finite): 1 for an all-zero
// block, else max(amax / 448, 2^-149), and with ue8m0 the next power of two up, at least 2^-127 (quant.h). s is at
// most f32::MAX / 448 < 2^119, so a normal s has a power-of-two ceiling within the f32 range.
__device__ __forceinline__ float block_scale(float amax, bool ue8m0) {
  if (amax == 0.f) return 1.f;
  float s = fmaxf(__fdiv_rn(amax, 448.f), __uint_as_float(1u));  // the smallest positive f32 at least
  if (ue8m0) {
    const uint32_t b = __float_as_uint(s);
    if ((b >> 23) == 0u) {
      // Subnormal: 2^-127 (bits 0x400000) covers every s up to it, 2^-126 the rest.
      s = __uint_as_float(b <= 0x400000u ? 0x400000u : 0x800000u);
    } else {
      s = __uint_as_float((((b >> 23) & 0xffu) + ((b & 0x7fffffu) != 0u)) << 23);
    }
  }
  return s;
}

__device__ __forceinline__ uint32_t encode(float v, uint16_t raw, float scale, uint32_t& err) {
  if (!isfinite(v)) {
    err |= kErrNonfiniteInput;
    return 0x7Fu | ((raw >> 8) & 0x80u);  // e4m3 NaN, the element's sign
  }
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3));
}

}  // namespace quant
}  // namespace moe_gemm
