// Expert layouts: from topk_ids to per-expert rows (packed with BLOCK_M padding, or masked with a fixed capacity),
// plus the row gather and the weighted combine. See src/layouts/ for the contracts.
//
// build_layout runs as one CTA: count rows per expert, scan, then a stable scatter in chunks of the block's
// threads (rank within a warp by __match_any_sync, across warps by per-warp counts in shared memory), so every
// expert's rows keep token order. Nothing device-provided is trusted: bad ids, remote experts and rows past a
// masked expert's capacity are dropped (position -1) and reported through the status word.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_ops.h"

namespace moe_gemm {
namespace layouts {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// The local expert of flat row r, or -1 (and the status bit) when it has none.
__device__ __forceinline__ int local_expert(const LayoutArgs& a, int r, uint32_t& err) {
  const int e = reinterpret_cast<const int32_t*>(a.topk_ids)[r];
  if (e < 0 || e >= a.experts) {
    err |= kErrExpertIdOutOfRange;
    return -1;
  }
  if (!a.expert_map) return e;
  const int le = reinterpret_cast<const int32_t*>(a.expert_map)[e];
  if (le < -1 || le >= a.local_experts) {
    err |= kErrExpertIdOutOfRange;
    return -1;
  }
  return le;  // -1: expert on another device, its rows are not ours
}

__global__ void __launch_bounds__(kThreads) build_layout_kernel(const LayoutArgs a) {
  extern __shared__ int32_t sm[];
  const int E = a.local_experts;
  int32_t* count = sm;              // [E]
  int32_t* start = count + E;       // [E + 1] offsets
  int32_t* cursor = start + E + 1;  // [E] next rank per expert
  int32_t* wcount = cursor + E;     // [kWarps][E] rows per (warp, expert) in the current chunk
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  uint32_t err = 0;

  for (int e = tid; e < E; e += kThreads) count[e] = cursor[e] = 0;
  for (int i = tid; i < kWarps * E; i += kThreads) wcount[i] = 0;
  __syncthreads();
  for (int r = tid; r < a.rows; r += kThreads) {
    const int le = local_expert(a, r, err);
    if (le >= 0) atomicAdd(&count[le], 1);
  }
  __syncthreads();

  // Offsets: a serial scan by one thread (E <= 1024 adds), then everything else in parallel.
  if (tid == 0) {
    int64_t at = 0;
    for (int e = 0; e < E; ++e) {
      start[e] = static_cast<int32_t>(at);
      if (a.kind == LayoutKind::Masked) {
        at += a.max_m;
      } else {
        at += (count[e] + a.block_m - 1) / a.block_m * a.block_m;
      }
    }
    start[E] = static_cast<int32_t>(at);
    if (at > a.capacity) err |= kErrCapacityOverflow;  // the host sizes capacity so this cannot happen
    reinterpret_cast<int32_t*>(a.total)[0] = static_cast<int32_t>(at < a.capacity ? at : a.capacity);
  }
  __syncthreads();
  const int64_t total = start[E] < a.capacity ? start[E] : a.capacity;
  for (int e = tid; e <= E; e += kThreads) reinterpret_cast<int32_t*>(a.offsets)[e] = start[e];
  for (int e = tid; e < E; e += kThreads) {
    int c = count[e];
    if (a.kind == LayoutKind::Masked && c > a.max_m) {
      err |= kErrCapacityOverflow;
      c = a.max_m;
    }
    reinterpret_cast<int32_t*>(a.counts)[e] = c;
  }
  if (a.sorted_ids)
    for (int64_t p = tid; p < a.capacity; p += kThreads) reinterpret_cast<int32_t*>(a.sorted_ids)[p] = a.rows;
  if (a.m_indices)
    for (int64_t p = tid; p < a.capacity; p += kThreads) reinterpret_cast<int32_t*>(a.m_indices)[p] = -1;
  if (a.expert_ids) {
    const int64_t tiles = a.capacity / a.block_m;
    for (int64_t b = tid; b < tiles; b += kThreads) {
      // The expert whose padded range holds tile b: binary search over the offsets.
      int32_t owner = -1;
      const int64_t row = b * a.block_m;
      if (row < total) {
        int lo = 0, hi = E - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (start[mid] <= row) lo = mid; else hi = mid - 1;
        }
        owner = lo;
      }
      reinterpret_cast<int32_t*>(a.expert_ids)[b] = owner;
    }
  }
  __syncthreads();

  // Stable scatter, one chunk of kThreads flat rows at a time.
  for (int base = 0; base < a.rows; base += kThreads) {
    const int r = base + tid;
    uint32_t dummy = 0;
    const int le = r < a.rows ? local_expert(a, r, dummy) : -1;
    const unsigned peers = __match_any_sync(kFull, le);
    const int rank_in_warp = __popc(peers & ((1u << lane) - 1));
    if (le >= 0 && rank_in_warp == 0) wcount[warp * E + le] = __popc(peers);
    __syncthreads();
    int rank = -1;
    if (le >= 0) {
      int before = 0;
      for (int w = 0; w < warp; ++w) before += wcount[w * E + le];
      rank = cursor[le] + before + rank_in_warp;
    }
    __syncthreads();
    for (int e = tid; e < E; e += kThreads) {
      int sum = 0;
      for (int w = 0; w < kWarps; ++w) {
        sum += wcount[w * E + e];
        wcount[w * E + e] = 0;
      }
      cursor[e] += sum;
    }
    if (r < a.rows) {
      int64_t p = -1;
      if (le >= 0 && !(a.kind == LayoutKind::Masked && rank >= a.max_m)) p = start[le] + rank;
      if (p >= a.capacity) p = -1;
      reinterpret_cast<int32_t*>(a.positions)[r] = static_cast<int32_t>(p);
      if (p >= 0) {
        if (a.sorted_ids) reinterpret_cast<int32_t*>(a.sorted_ids)[p] = r;
        if (a.m_indices) reinterpret_cast<int32_t*>(a.m_indices)[p] = le;
      }
    }
    __syncthreads();
  }
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

// One warp per flat row: 16-byte copies of one hidden row.
__global__ void gather_kernel(int rows, int top_k, int vecs, const uint4* __restrict__ x,
                              const int32_t* __restrict__ positions, uint4* __restrict__ out, int64_t out_rows,
                              uint32_t* status) {
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int p = positions[r];
  if (p < 0) return;
  if (p >= out_rows) {
    if (threadIdx.x % 32 == 0) atomicOr(status, kErrCapacityOverflow);
    return;
  }
  const uint4* src = x + static_cast<int64_t>(r / top_k) * vecs;
  uint4* dst = out + static_cast<int64_t>(p) * vecs;
  for (int v = threadIdx.x % 32; v < vecs; v += 32) dst[v] = src[v];
}

template <class T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f32(float x) { return __float2half(x); }

// One block per token; each thread owns 8 consecutive hidden elements per step. Sums the k contributions in
// f32 and rounds once (the more accurate of transformers' two orders).
template <class T>
__global__ void combine_kernel(int top_k, int hidden, const T* __restrict__ d, int64_t d_rows,
                               const int32_t* __restrict__ positions, const float* __restrict__ weights,
                               T* __restrict__ y) {
  const int t = blockIdx.x;
  for (int h0 = threadIdx.x * 8; h0 < hidden; h0 += blockDim.x * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < top_k; ++j) {
      const int64_t r = static_cast<int64_t>(t) * top_k + j;
      const int p = positions[r];
      if (p < 0 || p >= d_rows) continue;  // dropped rows contribute nothing (remote experts)
      const float w = weights[r];
      uint4 raw = *reinterpret_cast<const uint4*>(d + static_cast<int64_t>(p) * hidden + h0);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += w * to_f32(v[i]);
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = from_f32<T>(acc[i]);
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(t) * hidden + h0) = out;
  }
}

inline Status last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace layouts

Status build_layout(const LayoutArgs& a) {
  const size_t smem = sizeof(int32_t) * (3 * a.local_experts + 1 + layouts::kWarps * a.local_experts);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(layouts::build_layout_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  }
  layouts::build_layout_kernel<<<1, layouts::kThreads, smem, reinterpret_cast<cudaStream_t>(a.stream)>>>(a);
  return layouts::last_error();
}

Status gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                   int64_t out_rows, uint64_t status, uint64_t stream) {
  if (rows == 0) return {StatusCode::Ok, 0};
  constexpr int kRowsPerBlock = 8;
  layouts::gather_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0,
                           reinterpret_cast<cudaStream_t>(stream)>>>(
      rows, top_k, hidden / 8, reinterpret_cast<const uint4*>(x), reinterpret_cast<const int32_t*>(positions),
      reinterpret_cast<uint4*>(out), out_rows, reinterpret_cast<uint32_t*>(status));
  return layouts::last_error();
}

Status combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t d_rows,
                    uint64_t positions, uint64_t weights, uint64_t y, uint64_t stream) {
  if (tokens == 0) return {StatusCode::Ok, 0};
  const int threads = hidden / 8 < 256 ? ((hidden / 8 + 31) / 32) * 32 : 256;
  auto s = reinterpret_cast<cudaStream_t>(stream);
  auto pos = reinterpret_cast<const int32_t*>(positions);
  auto w = reinterpret_cast<const float*>(weights);
  if (dtype == DType::BF16) {
    layouts::combine_kernel<__nv_bfloat16><<<tokens, threads, 0, s>>>(
        top_k, hidden, reinterpret_cast<const __nv_bfloat16*>(d), d_rows, pos, w, reinterpret_cast<__nv_bfloat16*>(y));
  } else {
    layouts::combine_kernel<__half><<<tokens, threads, 0, s>>>(top_k, hidden, reinterpret_cast<const __half*>(d),
                                                               d_rows, pos, w, reinterpret_cast<__half*>(y));
  }
  return layouts::last_error();
}

}  // namespace moe_gemm
