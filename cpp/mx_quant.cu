// MXFP8 activations in CUTLASS's SM100 block-scale layout, per group, built on the device from the group rows
// (mx_quant.h). Portable: it runs on SM90 too, where the tests check it against the host layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "group_rows.cuh"
#include "mx_quant.h"
#include "quant_rules.cuh"

namespace moe_gemm {
namespace mx {

constexpr int kVec = 32;            // elements per UE8M0 scale
constexpr int64_t kAtomBytes = 512;  // 128 rows x 4 scales

// One thread: every group's rows (clamped as the GEMMs clamp them) and its layout base, in group order.
__global__ void sf_bases_kernel(GroupMode mode, const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                                int max_m, int groups, int64_t max_rows, int k_atoms, uint64_t sf_bytes,
                                int64_t* __restrict__ bases, uint32_t* status) {
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
  const int64_t at = bases[g] + (m / 128 * k_atoms + kb / 4) * kAtomBytes + 16 * (m % 32) + 4 * (m / 32 % 4) + kb % 4;
  if (at >= static_cast<int64_t>(a.sf_bytes)) return;  // reported by the bases kernel
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
  reinterpret_cast<uint8_t*>(a.sf)[at] = static_cast<uint8_t>((sb >> 23) & 0xffu);
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

}  // namespace mx

Status quantize_mxfp8_grouped(const MxQuantArgs& a) {
  if (a.k <= 0 || a.k % mx::kVec != 0 || a.groups <= 0 || a.max_rows < 0) {
    return {StatusCode::CutlassCannotImplement, 0};
  }
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  const int k_blocks = a.k / mx::kVec;
  const int k_atoms = (k_blocks + 3) / 4;
  mx::sf_bases_kernel<<<1, 1, 0, stream>>>(a.mode, reinterpret_cast<const int32_t*>(a.offsets),
                                           reinterpret_cast<const int32_t*>(a.counts), a.max_m, a.groups, a.max_rows,
                                           k_atoms, a.sf_bytes, reinterpret_cast<int64_t*>(a.sf_bases),
                                           reinterpret_cast<uint32_t*>(a.status));
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

}  // namespace moe_gemm
