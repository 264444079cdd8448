// moe-gemm unit: family=quant targets=portable seconds=3
// MXFP8, MXFP4 and NVFP4 activations in CUTLASS's SM100 block-scale layout, per group, built on the device from
// the group rows (mx_quant.h). Portable: it runs on SM90 too, where the tests check it against the host layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/group_rows.cuh"
#include "mx/mx_formats.cuh"
#include "mx/mx_quant.h"
#include "common/quant_rules.cuh"

namespace moe_gemm {
namespace mx {

constexpr int kVec = 32;  // elements per UE8M0 scale
using mx_formats::kAtomBytes;
using mx_formats::sf_offset;
using mx_formats::ue4m3_value;

// One thread: every group's rows (clamped as the GEMMs clamp them) and its layout base, in group order.
__global__ void sf_bases_kernel(GroupMode mode, const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                                int max_m, int groups, int64_t max_rows, int k_atoms, uint64_t sf_bytes,
                                int64_t* __restrict__ bases, uint32_t* status, float* amax_reset) {
  if (amax_reset) *amax_reset = 0.f;
  int64_t at = 0;
  uint32_t err = 0;
  for (int g = 0; g < groups; ++g) {
    const group_rows::Group r = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, g, max_rows);
    err |= r.err;
    bases[g] = at;
    at += kAtomBytes * ((r.m + 127) / 128) * k_atoms;
  }
  bases[groups] = at;
  if (static_cast<uint64_t>(at) > sf_bytes) err |= kErrCapacityOverflow;
  if (err) atomicOr(status, err);
}

template <class T>
__device__ __forceinline__ float load(const T* p);
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <>
__device__ __forceinline__ float load<__half>(const __half* p) { return __half2float(*p); }
template <class T>
__device__ __forceinline__ uint16_t raw(const T* p) { return *reinterpret_cast<const uint16_t*>(p); }

// The group of row r and r's row within it (-1: in no group).
__device__ __forceinline__ int group_of(GroupMode mode, const int32_t* offsets, const int32_t* counts, int max_m,
                                        int groups, int64_t max_rows, int64_t r, int64_t* local, int32_t* rows) {
  if (mode == GroupMode::Masked) {
    const int g = static_cast<int>(r / max_m);
    if (g >= groups) return -1;
    const group_rows::Group gr = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, g, max_rows);
    *local = r - gr.lo;
    *rows = gr.m;
    return *local < gr.m ? g : -1;
  }
  // Offsets / Padded: the last group starting at or before r (offsets are checked monotone by the bases kernel;
  // a bad array only misplaces rows inside the buffers, never outside them).
  int lo = 0, hi = groups - 1, g = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= r) {
      g = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (g < 0) return -1;
  const group_rows::Group gr = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, g, max_rows);
  *local = r - gr.lo;
  *rows = gr.m;
  return (*local >= 0 && *local < gr.m) ? g : -1;
}

// One thread per block of 32 elements of one row: amax, the UE8M0 scale, 32 e4m3 codes (two 16-byte stores),
// the scale byte at its place in the group's atoms.
template <class T>
__global__ void quantize_kernel(MxQuantArgs a, int k_blocks, int k_atoms) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = idx / k_blocks;
  const int kb = static_cast<int>(idx % k_blocks);
  if (r >= a.max_rows) return;
  const auto* offsets = reinterpret_cast<const int32_t*>(a.offsets);
  const auto* counts = reinterpret_cast<const int32_t*>(a.counts);
  int64_t m = 0;
  int32_t rows = 0;
  const int g = group_of(a.mode, offsets, counts, a.max_m, a.groups, a.max_rows, r, &m, &rows);
  if (g < 0) return;
  const auto* bases = reinterpret_cast<const int64_t*>(a.sf_bases);
  const int64_t at = bases[g] + sf_offset(m, kb, k_atoms);
  if (at >= static_cast<int64_t>(a.sf_bytes)) return;  // reported by the bases kernel
  auto* scale = reinterpret_cast<uint8_t*>(a.sf) + at;
  if (kb * kVec >= a.k_in) {
    // The zero pad of a padded K: e4m3 +0 codes, scale 2^0, as an all-zero block; x has no such columns.
    auto* pad = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(a.out) + r * a.k + static_cast<int64_t>(kb) * kVec);
    pad[0] = pad[1] = make_uint4(0u, 0u, 0u, 0u);
    *scale = 127u;
    return;
  }
  const T* x = reinterpret_cast<const T*>(a.x) + r * a.x_stride + static_cast<int64_t>(kb) * kVec;
  float v[kVec];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    v[i] = load(x + i);
    if (isfinite(v[i])) amax = fmaxf(amax, fabsf(v[i]));
  }
  const float s = quant::block_scale(amax, true);
  uint32_t err = 0;
  uint32_t words[kVec / 4];
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) word |= quant::encode(v[4 * w + j], raw(x + 4 * w + j), s, err) << (8 * j);
    words[w] = word;
  }
  auto* out = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(a.out) + r * a.k + static_cast<int64_t>(kb) * kVec);
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[1] = make_uint4(words[4], words[5], words[6], words[7]);
  const uint32_t sb = __float_as_uint(s);
  // s is 2^e with e in [-127, 127]: its UE8M0 byte is e + 127, the exponent field (0 for the subnormal 2^-127).
  *scale = static_cast<uint8_t>((sb >> 23) & 0xffu);
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}


// ---- FP4 ----

// The e2m1 code of v (already divided by its scale): nearest, ties to the even code, saturating at 6, the sign
// bit kept (E2m1::from_f32). NaN is +6, as PTX cvt.rn.satfinite and the host write it.
__device__ __forceinline__ uint32_t e2m1(float v) {
  if (isnan(v)) return 7u;
  const float a = fabsf(v);
  // Midpoints between neighbouring magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6); a tie goes to the even code.
  const uint32_t c = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
                   : a <= 2.5f  ? 4u : a < 3.5f  ? 5u : a <= 5.f   ? 6u : 7u;
  return c | (signbit(v) ? 8u : 0u);
}

// The UE8M0 scale of an MXFP4 block: 1 for amax 0, else the smallest power of two >= max(amax / 6, 2^-127).
__device__ __forceinline__ float mx4_scale(float amax) {
  if (amax == 0.f) return 1.f;
  const uint32_t b = __float_as_uint(fmaxf(__fdiv_rn(amax, 6.f), __uint_as_float(0x400000u)));  // 2^-127
  if ((b >> 23) == 0u) return __uint_as_float(b <= 0x400000u ? 0x400000u : 0x800000u);
  return __uint_as_float((((b >> 23) & 0xffu) + ((b & 0x7fffffu) != 0u)) << 23);
}

// The smallest UE4M3 byte whose value is >= y (y >= 0, finite or +inf), 0x7E (448) for anything above 448
// (Ue4m3::from_f32_ceil): e4m3 rounds to nearest, which is the ceiling or one below it.
__device__ __forceinline__ uint32_t ue4m3_ceil(float y) {
  if (!(y <= 448.f)) return 0x7Eu;
  uint32_t b = static_cast<uint32_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3)) & 0x7fu;
  if (ue4m3_value(b) < y && b < 0x7Eu) ++b;
  return b;
}

// Nvfp4::quantize's tensor scale of a tensor whose finite elements' largest magnitude is amax.
__device__ __forceinline__ float nv_tensor_scale(float amax) {
  return amax == 0.f ? 1.f : fmaxf(__fdiv_rn(amax, 2688.f), __uint_as_float(1u));  // 6 * 448; 2^-149
}

// One thread per block of V elements of one row: its amax in scratch, for the tensor scale (NVFP4, derived).
template <class T, int V>
__global__ void amax_kernel(Fp4QuantArgs a, int k_blocks) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = idx / k_blocks;
  const int kb = static_cast<int>(idx % k_blocks);
  float amax = 0.f;
  if (r < a.max_rows) {
    int64_t m = 0;
    int32_t rows = 0;
    const int g = group_of(a.mode, reinterpret_cast<const int32_t*>(a.offsets),
                           reinterpret_cast<const int32_t*>(a.counts), a.max_m, a.groups, a.max_rows, r, &m, &rows);
    if (g >= 0 && kb * V < a.k_in) {  // the pad is zeros
      const T* x = reinterpret_cast<const T*>(a.x) + r * a.x_stride + static_cast<int64_t>(kb) * V;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = load(x + i);
        if (isfinite(v)) amax = fmaxf(amax, fabsf(v));
      }
    }
  }
  // Non-negative floats order as their bits: one atomic per warp.
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0 && amax > 0.f) {
    atomicMax(reinterpret_cast<unsigned*>(reinterpret_cast<float*>(a.tensor) + 1), __float_as_uint(amax));
  }
}

// One thread per block of V elements of one row: amax, the scale byte at its place in the group's atoms, V
// e2m1 codes (V / 2 bytes, one store).
template <class T, bool kNv>
__global__ void quantize_fp4_kernel(Fp4QuantArgs a, int k_blocks, int k_atoms) {
  constexpr int V = kNv ? 16 : 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float t = 1.f;
  if (kNv) {
    float* tensor = reinterpret_cast<float*>(a.tensor);
    t = a.tensor_scale > 0.f ? a.tensor_scale : nv_tensor_scale(tensor[1]);
    if (idx == 0) tensor[0] = t;
  }
  const int64_t r = idx / k_blocks;
  const int kb = static_cast<int>(idx % k_blocks);
  if (r >= a.max_rows) return;
  int64_t m = 0;
  int32_t rows = 0;
  const int g = group_of(a.mode, reinterpret_cast<const int32_t*>(a.offsets),
                         reinterpret_cast<const int32_t*>(a.counts), a.max_m, a.groups, a.max_rows, r, &m, &rows);
  if (g < 0) return;
  const auto* bases = reinterpret_cast<const int64_t*>(a.sf_bases);
  const int64_t at = bases[g] + sf_offset(m, kb, k_atoms);
  if (at >= static_cast<int64_t>(a.sf_bytes)) return;  // reported by the bases kernel
  uint8_t* out = reinterpret_cast<uint8_t*>(a.out) + r * (a.k / 2) + static_cast<int64_t>(kb) * (V / 2);
  if (kb * V >= a.k_in) {
    // The zero pad of a padded K: e2m1 +0 codes, scale 1 (UE8M0 127, UE4M3 0x38), as an all-zero block.
    if (kNv) {
      *reinterpret_cast<uint2*>(out) = make_uint2(0u, 0u);
    } else {
      *reinterpret_cast<uint4*>(out) = make_uint4(0u, 0u, 0u, 0u);
    }
    reinterpret_cast<uint8_t*>(a.sf)[at] = kNv ? 0x38u : 127u;
    return;
  }
  const T* x = reinterpret_cast<const T*>(a.x) + r * a.x_stride + static_cast<int64_t>(kb) * V;
  float v[V];
  float amax = 0.f;
  uint32_t err = 0;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    v[i] = load(x + i);
    if (isfinite(v[i])) {
      amax = fmaxf(amax, fabsf(v[i]));
    } else {
      err |= kErrNonfiniteInput;
    }
  }
  uint8_t sf_byte;
  float s;  // the divisor of the elements
  if (kNv) {
    uint32_t b = 0x38u;  // 1.0 for an all-zero block
    if (amax != 0.f) {
      const float y = __fdiv_rn(__fdiv_rn(amax, 6.f), t);
      if (!(y <= 448.f) && a.tensor_scale > 0.f) err |= kErrScaleOverflow;
      b = ue4m3_ceil(y);
    }
    sf_byte = static_cast<uint8_t>(b);
    s = __fmul_rn(ue4m3_value(b), t);
  } else {
    s = mx4_scale(amax);
    // s is 2^e with e in [-127, 127]: its UE8M0 byte is e + 127, the exponent field (0 for the subnormal 2^-127).
    sf_byte = static_cast<uint8_t>((__float_as_uint(s) >> 23) & 0xffu);
  }
  uint32_t words[V / 8];
#pragma unroll
  for (int w = 0; w < V / 8; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float q = s == 0.f ? 0.f : (isinf(v[8 * w + j]) ? v[8 * w + j] : __fdiv_rn(v[8 * w + j], s));
      word |= e2m1(q) << (4 * j);
    }
    words[w] = word;
  }
  if (kNv) {
    *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
  } else {
    *reinterpret_cast<uint4*>(out) = make_uint4(words[0], words[1], words[2], words[3]);
  }
  reinterpret_cast<uint8_t*>(a.sf)[at] = sf_byte;
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

template <class T>
void launch_fp4(const Fp4QuantArgs& a, int k_blocks, int k_atoms, unsigned blocks, int threads, cudaStream_t stream) {
  if (a.format == Fp4Format::Nvfp4) {
    if (!(a.tensor_scale > 0.f)) amax_kernel<T, 16><<<blocks, threads, 0, stream>>>(a, k_blocks);
    quantize_fp4_kernel<T, true><<<blocks, threads, 0, stream>>>(a, k_blocks, k_atoms);
  } else {
    quantize_fp4_kernel<T, false><<<blocks, threads, 0, stream>>>(a, k_blocks, k_atoms);
  }
}

}  // namespace mx

Status quantize_mxfp8_grouped(const MxQuantArgs& a) {
  if (a.k <= 0 || a.k % mx::kVec != 0 || a.k_in <= 0 || a.k_in > a.k || a.k_in % mx::kVec != 0 || a.groups <= 0 ||
      a.max_rows < 0) {
    return {StatusCode::CutlassCannotImplement, 0};
  }
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  const int k_blocks = a.k / mx::kVec;
  const int k_atoms = (k_blocks + 3) / 4;
  mx::sf_bases_kernel<<<1, 1, 0, stream>>>(a.mode, reinterpret_cast<const int32_t*>(a.offsets),
                                           reinterpret_cast<const int32_t*>(a.counts), a.max_m, a.groups, a.max_rows,
                                           k_atoms, a.sf_bytes, reinterpret_cast<int64_t*>(a.sf_bases),
                                           reinterpret_cast<uint32_t*>(a.status), nullptr);
  const int64_t threads = a.max_rows * k_blocks;
  if (threads > 0) {
    constexpr int kThreads = 256;
    const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
    if (a.dtype == DType::BF16) {
      mx::quantize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(a, k_blocks, k_atoms);
    } else {
      mx::quantize_kernel<__half><<<blocks, kThreads, 0, stream>>>(a, k_blocks, k_atoms);
    }
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

Status quantize_fp4_grouped(const Fp4QuantArgs& a) {
  const bool nv = a.format == Fp4Format::Nvfp4;
  const int vec = nv ? 16 : 32;
  if ((!nv && a.format != Fp4Format::Mxfp4) || a.k <= 0 || a.k % vec != 0 || a.k_in <= 0 || a.k_in > a.k ||
      a.k_in % vec != 0 || a.groups <= 0 || a.max_rows < 0 ||
      (nv && (a.tensor == 0 || a.tensor % 4 != 0 || !(a.tensor_scale >= 0.f) || isinf(a.tensor_scale)))) {
    return {StatusCode::CutlassCannotImplement, 0};
  }
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  const int k_blocks = a.k / vec;
  const int k_atoms = (k_blocks + 3) / 4;
  float* scratch = nv ? reinterpret_cast<float*>(a.tensor) + 1 : nullptr;
  mx::sf_bases_kernel<<<1, 1, 0, stream>>>(a.mode, reinterpret_cast<const int32_t*>(a.offsets),
                                           reinterpret_cast<const int32_t*>(a.counts), a.max_m, a.groups, a.max_rows,
                                           k_atoms, a.sf_bytes, reinterpret_cast<int64_t*>(a.sf_bases),
                                           reinterpret_cast<uint32_t*>(a.status), scratch);
  // At least one thread, so that the tensor scale is written for an empty batch too.
  const int64_t threads = a.max_rows * k_blocks > 0 ? a.max_rows * k_blocks : 1;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  if (a.dtype == DType::BF16) {
    mx::launch_fp4<__nv_bfloat16>(a, k_blocks, k_atoms, blocks, kThreads, stream);
  } else {
    mx::launch_fp4<__half>(a, k_blocks, k_atoms, blocks, kThreads, stream);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
