// moe-gemm unit: family=layouts targets=portable seconds=3
// Expert layouts: from topk_ids to per-expert rows (packed with BLOCK_M padding, or masked with a fixed capacity),
// plus the row gather and the weighted combine. See src/layouts/ for the contracts.
//
// build_layout runs as one warp (at most 32 rows), one CTA (at most kLayoutSingleCtaRows) or three passes over
// chunks of rows: count rows per expert, scan, then a stable scatter (rank within a warp by __match_any_sync,
// across warps by per-warp counts in shared memory), so every expert's rows keep token order. Nothing
// device-provided is trusted: bad ids, remote experts and rows past a masked expert's capacity are dropped
// (position -1) and reported through the status word.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element.cuh"
#include "common/moe_ops.h"
#include "common/pdl.cuh"

namespace moe_gemm {
namespace layouts {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Shared ints block_exclusive_scan needs: a prefix per warp (at most 32) and the total.
constexpr int kScanTmp = 33;

// In-place exclusive scan of v[0..n) in shared memory by the whole block; returns the total. A contiguous slice
// of ceil(n / blockDim) elements per thread, the slices' sums scanned by warp shuffles, the warps' sums by the
// first warp: three barriers (a Hillis-Steele scan over the threads took two per step, 18 for 512 threads).
__device__ int64_t block_exclusive_scan(int32_t* v, int n, int32_t* tmp /* [kScanTmp] */) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int per = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, static_cast<int>(threadIdx.x) * per), hi = min(n, lo + per);
  int32_t sum = 0;
  for (int i = lo; i < hi; ++i) sum += v[i];
  int32_t incl = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const int32_t x = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += x;
  }
  if (lane == 31) tmp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int32_t w = lane < warps ? tmp[lane] : 0;
    int32_t wincl = w;
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t x = __shfl_up_sync(kFull, wincl, off);
      if (lane >= off) wincl += x;
    }
    if (lane < warps) tmp[lane] = wincl - w;  // exclusive prefix of the warp
    if (lane == warps - 1) tmp[kScanTmp - 1] = wincl;  // the total
  }
  __syncthreads();
  int32_t run = tmp[warp] + incl - sum;  // exclusive prefix of this thread's slice
  for (int i = lo; i < hi; ++i) {
    const int32_t x = v[i];
    v[i] = run;
    run += x;
  }
  const int64_t total = tmp[kScanTmp - 1];
  __syncthreads();
  return total;
}

// Room an expert takes in the layout.
__device__ __forceinline__ int32_t room(const LayoutArgs& a, int32_t count) {
  return a.kind == LayoutKind::Masked ? a.max_m : (count + a.block_m - 1) / a.block_m * a.block_m;
}

// The expert whose range [start[e], start[e+1]) holds `row` (the last of several empty ones).
__device__ __forceinline__ int32_t owner(const int32_t* start, int E, int64_t row) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

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

// Fills what does not depend on the routing: sentinels in sorted_ids, -1 in m_indices (grid-stride).
__device__ void fill_padding(const LayoutArgs& a, int64_t first, int64_t step) {
  if (a.sorted_ids)
    for (int64_t p = first; p < a.capacity; p += step) reinterpret_cast<int32_t*>(a.sorted_ids)[p] = a.rows;
  if (a.m_indices)
    for (int64_t p = first; p < a.capacity; p += step) reinterpret_cast<int32_t*>(a.m_indices)[p] = -1;
}

// The layout's total (one thread, once start[E] = total is set), then the per-expert outputs of count[0..E) and
// start[0..E] (shared memory): offsets and the clamped counts (strided over `step` threads from `first`).
__device__ void write_total(const LayoutArgs& a, int64_t total, uint32_t& err) {
  if (total > a.capacity) err |= kErrCapacityOverflow;  // the host sizes capacity so this cannot happen
  reinterpret_cast<int32_t*>(a.total)[0] = static_cast<int32_t>(total < a.capacity ? total : a.capacity);
}
__device__ void write_counts(const LayoutArgs& a, const int32_t* count, const int32_t* start, int first, int step,
                             uint32_t& err) {
  const int E = a.local_experts;
  for (int e = first; e <= E; e += step) reinterpret_cast<int32_t*>(a.offsets)[e] = start[e];
  for (int e = first; e < E; e += step) {
    int c = count[e];
    if (a.kind == LayoutKind::Masked && c > a.max_m) {
      err |= kErrCapacityOverflow;
      c = a.max_m;
    }
    reinterpret_cast<int32_t*>(a.counts)[e] = c;
  }
}

// Offsets from counts (shared memory), and every per-expert output. `start` has E + 1 entries.
__device__ void write_offsets(const LayoutArgs& a, const int32_t* count, int32_t* start, int32_t* tmp, uint32_t& err) {
  const int E = a.local_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) start[e] = room(a, count[e]);
  __syncthreads();
  const int64_t total = block_exclusive_scan(start, E, tmp);
  if (threadIdx.x == 0) {
    start[E] = static_cast<int32_t>(total);
    write_total(a, total, err);
  }
  __syncthreads();
  write_counts(a, count, start, threadIdx.x, blockDim.x, err);
}

// expert_ids: the owner of every tile below the total, -1 above (grid-stride).
__device__ void write_expert_ids(const LayoutArgs& a, const int32_t* start, int64_t first, int64_t step) {
  if (!a.expert_ids) return;
  const int64_t total = start[a.local_experts] < a.capacity ? start[a.local_experts] : a.capacity;
  for (int64_t b = first; b < a.capacity / a.block_m; b += step) {
    const int64_t row = b * a.block_m;
    reinterpret_cast<int32_t*>(a.expert_ids)[b] = row < total ? owner(start, a.local_experts, row) : -1;
    if (a.block_ready) reinterpret_cast<int32_t*>(a.block_ready)[b] = 0;
  }
}

// Ranks rows base .. base + blockDim of the block in token order within each expert: returns this thread's
// row's rank among the chunk's rows of the same expert, and leaves per-expert chunk counts in wcount[w * E + e]
// (one row per warp; the caller sums and clears them).
__device__ __forceinline__ int rank_in_chunk(int le, int32_t* wcount, int E) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned peers = __match_any_sync(kFull, le);
  const int rank_in_warp = __popc(peers & ((1u << lane) - 1));
  if (le >= 0 && rank_in_warp == 0) wcount[warp * E + le] = __popc(peers);
  __syncthreads();
  int before = 0;
  if (le >= 0)
    for (int w = 0; w < warp; ++w) before += wcount[w * E + le];
  return before + rank_in_warp;
}

__device__ __forceinline__ void place(const LayoutArgs& a, int r, int le, int64_t p, int32_t first_of_expert) {
  if (le < 0 || (a.kind == LayoutKind::Masked && p - first_of_expert >= a.max_m) || p >= a.capacity) p = -1;
  reinterpret_cast<int32_t*>(a.positions)[r] = static_cast<int32_t>(p);
  if (p >= 0) {
    if (a.sorted_ids) reinterpret_cast<int32_t*>(a.sorted_ids)[p] = r;
    if (a.m_indices) reinterpret_cast<int32_t*>(a.m_indices)[p] = le;
  }
}

// Tiny batches (rows <= 32: a decode step of T <= 32 / k): one warp, a lane per row, no block barrier. The
// 512-thread build took 7.0 us for gpt-oss T = 1 under ncu, on the critical path of every layout backend (the
// Fused GEMM1 waits for it). The same outputs as build_layout_kernel: tests/gpu/layouts.rs checks both against
// the reference.
__global__ void __launch_bounds__(32) build_layout_warp_kernel(const LayoutArgs a) {
  pdl::launch_dependents();  // as build_layout_kernel
  extern __shared__ int32_t sm[];
  const int E = a.local_experts, lane = threadIdx.x;
  int32_t* count = sm;         // [E]
  int32_t* start = count + E;  // [E + 1]
  uint32_t err = 0;
  const int le = lane < a.rows ? local_expert(a, lane, err) : -1;
  for (int e = lane; e < E; e += 32) count[e] = 0;
  fill_padding(a, lane, 32);
  __syncwarp();  // also orders the padding's stores before place()'s below
  // A row's rank among the rows of its expert, in token order: the lower lanes with the same expert.
  const unsigned peers = __match_any_sync(kFull, le);
  const int rank = __popc(peers & ((1u << lane) - 1));
  if (le >= 0 && rank == 0) count[le] = __popc(peers);
  __syncwarp();
  // Exclusive scan of the rooms: a contiguous slice per lane, then a warp scan of the slices' sums.
  const int per = (E + 31) / 32, lo = min(E, lane * per), hi = min(E, lo + per);
  int32_t sum = 0;
  for (int e = lo; e < hi; ++e) sum += room(a, count[e]);
  int32_t incl = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const int32_t v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += v;
  }
  int32_t run = incl - sum;
  for (int e = lo; e < hi; ++e) {
    const int32_t r = room(a, count[e]);
    start[e] = run;
    run += r;
  }
  const int64_t total = __shfl_sync(kFull, incl, 31);
  if (lane == 0) {
    start[E] = static_cast<int32_t>(total);
    write_total(a, total, err);
  }
  __syncwarp();
  write_counts(a, count, start, lane, 32, err);
  write_expert_ids(a, start, lane, 32);
  if (lane < a.rows) place(a, lane, le, le >= 0 ? static_cast<int64_t>(start[le]) + rank : -1, le >= 0 ? start[le] : 0);
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

// Small batches (32 < rows <= kLayoutSingleCtaRows): everything in one CTA and one launch. Warp w owns a
// contiguous segment of kSub rows per lane, read once into registers (one global latency, not one per pass):
// ranks within the segment by __match_any_sync per 32 rows and the warp's running counts (its own row of
// wcount, no block barrier), the warps' counts scanned per expert, then each row placed at its expert's start
// + the earlier warps' rows + its rank. Stable: segments, their 32-row steps and lanes all in token order.
// (The chunked form before it, a block barrier and a reload of topk_ids per 512 rows, took 19.3 us for 2048
// rows under ncu: Qwen3-30B T = 256, on the critical path of the GEMMs.)
constexpr int kSub = kLayoutSingleCtaRows / kThreads;  // 32-row steps per warp at most
static_assert(kSub * kThreads == kLayoutSingleCtaRows, "the single-CTA limit is whole steps of every warp");

__global__ void __launch_bounds__(kThreads) build_layout_kernel(const LayoutArgs a) {
  // The Fused decode GEMM1 may take the rest of the GPU now: it waits for this grid before it reads the layout.
  pdl::launch_dependents();
  extern __shared__ int32_t sm[];
  const int E = a.local_experts, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t* count = sm;                 // [E]
  int32_t* start = count + E;          // [E + 1]
  int32_t* wcount = start + E + 1;     // [kWarps][E]: a warp's rows per expert, then the earlier warps' rows
  int32_t* tmp = wcount + kWarps * E;  // [kScanTmp]
  int32_t* mine = wcount + warp * E;
  uint32_t err = 0;

  const int steps = (a.rows + kThreads - 1) / kThreads;  // 32-row steps per warp
  const int first = warp * steps * 32;
  int le[kSub];
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int r = first + 32 * s + lane;
    le[s] = s < steps && r < a.rows ? local_expert(a, r, err) : -1;
  }
  for (int e = lane; e < E; e += 32) mine[e] = 0;
  fill_padding(a, threadIdx.x, kThreads);
  __syncwarp();
  int rank[kSub];
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    if (s >= steps) break;
    const unsigned peers = __match_any_sync(kFull, le[s]);
    const int below = __popc(peers & ((1u << lane) - 1));
    const int before = le[s] >= 0 ? mine[le[s]] : 0;
    __syncwarp();
    if (le[s] >= 0 && below == 0) mine[le[s]] = before + __popc(peers);
    rank[s] = before + below;
    __syncwarp();
  }
  __syncthreads();  // every warp's counts; also orders the padding's stores before place()'s below
  for (int e = threadIdx.x; e < E; e += kThreads) {
    int32_t run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int32_t x = wcount[w * E + e];
      wcount[w * E + e] = run;
      run += x;
    }
    count[e] = run;
  }
  __syncthreads();
  write_offsets(a, count, start, tmp, err);
  write_expert_ids(a, start, threadIdx.x, kThreads);
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int r = first + 32 * s + lane;
    if (s >= steps || r >= a.rows) break;
    const int e = le[s];
    place(a, r, e, e >= 0 ? static_cast<int64_t>(start[e]) + mine[e] + rank[s] : -1, e >= 0 ? start[e] : 0);
  }
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

// Larger batches (rows > kLayoutSingleCtaRows): three kernels over chunks of kLayoutChunkRows rows, chained by
// programmatic dependent launch (each lets the next in at its start; each waits for the one before it before it
// reads). A single CTA's scattered stores of the placement, its padding and its per-tile expert ids grow with
// the rows on one SM (2048 rows: 11.2 us in graph replay on the H200, 58% of the kernel's cycles in those three
// phases), so past kLayoutSingleCtaRows the chunks' CTAs share them (6.7 us).
//
// Pass 1 of 3: one CTA per chunk counts its rows per expert into scratch[chunk][e]; all CTAs fill the padding.
__global__ void __launch_bounds__(kLayoutChunkRows) count_chunks_kernel(const LayoutArgs a) {
  pdl::launch_dependents();  // the scan (one CTA) may queue now
  extern __shared__ int32_t sm[];
  const int E = a.local_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) sm[e] = 0;
  fill_padding(a, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<int64_t>(gridDim.x) * blockDim.x);
  __syncthreads();
  uint32_t err = 0;
  const int r = blockIdx.x * kLayoutChunkRows + threadIdx.x;
  if (r < a.rows) {
    const int le = local_expert(a, r, err);
    if (le >= 0) atomicAdd(&sm[le], 1);
  }
  __syncthreads();
  int32_t* chunk_count = reinterpret_cast<int32_t*>(a.scratch) + static_cast<int64_t>(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_count[e] = sm[e];
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

// Pass 2: one CTA scans the chunk counts per expert (token order) and the experts' rooms (offsets).
// scratch[chunks + chunk][e] = the rows of expert e in the chunks before `chunk` (pass 3 adds the expert's start).
// The counts are read kScanBatch chunks at a time, every load of a batch before any store, so that a thread waits
// one L2 round trip per batch rather than one per chunk (the bases share the scratch with the counts: the
// compiler could not hoist a load over a store itself).
constexpr int kScanBatch = 16;
__global__ void __launch_bounds__(kThreads) scan_chunks_kernel(const LayoutArgs a, int chunks) {
  pdl::wait_for_prerequisites();  // pass 1's counts
  pdl::launch_dependents();       // pass 3's CTAs may queue now
  extern __shared__ int32_t sm[];
  const int E = a.local_experts;
  int32_t* count = sm;         // [E]
  int32_t* start = count + E;  // [E + 1]
  int32_t* tmp = start + E + 1;
  const int32_t* chunk_count = reinterpret_cast<const int32_t*>(a.scratch);
  int32_t* chunk_base = reinterpret_cast<int32_t*>(a.scratch) + static_cast<int64_t>(chunks) * E;
  uint32_t err = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int c0 = 0; c0 < chunks; c0 += kScanBatch) {
      int32_t x[kScanBatch];
#pragma unroll
      for (int u = 0; u < kScanBatch; ++u)
        x[u] = c0 + u < chunks ? chunk_count[static_cast<int64_t>(c0 + u) * E + e] : 0;
#pragma unroll
      for (int u = 0; u < kScanBatch; ++u) {
        if (c0 + u < chunks) chunk_base[static_cast<int64_t>(c0 + u) * E + e] = run;
        run += x[u];
      }
    }
    count[e] = run;
  }
  __syncthreads();
  write_offsets(a, count, start, tmp, err);
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
}

// Pass 3: one CTA per chunk places its rows (stable within the chunk, chunks in order); all CTAs write
// expert_ids.
__global__ void __launch_bounds__(kLayoutChunkRows) scatter_chunks_kernel(const LayoutArgs a, int chunks) {
  pdl::wait_for_prerequisites();  // pass 2's offsets and bases
  pdl::launch_dependents();       // the GEMM (or gather) after the build may queue now: it waits for this grid
  extern __shared__ int32_t sm[];
  const int E = a.local_experts;
  int32_t* start = sm;               // [E + 1]
  int32_t* wcount = start + E + 1;   // [kLayoutChunkRows / 32][E]
  for (int e = threadIdx.x; e <= E; e += blockDim.x) start[e] = reinterpret_cast<const int32_t*>(a.offsets)[e];
  for (int i = threadIdx.x; i < (kLayoutChunkRows / 32) * E; i += blockDim.x) wcount[i] = 0;
  __syncthreads();
  write_expert_ids(a, start, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<int64_t>(gridDim.x) * blockDim.x);
  const int r = blockIdx.x * kLayoutChunkRows + threadIdx.x;
  uint32_t ignored = 0;
  const int le = r < a.rows ? local_expert(a, r, ignored) : -1;
  const int rank = rank_in_chunk(le, wcount, E);
  if (r < a.rows) {
    const int32_t* chunk_base = reinterpret_cast<const int32_t*>(a.scratch) + static_cast<int64_t>(chunks + blockIdx.x) * E;
    const int64_t p = le >= 0 ? static_cast<int64_t>(start[le]) + chunk_base[le] + rank : -1;
    place(a, r, le, p, le >= 0 ? start[le] : 0);
  }
}

// One warp per flat row: 16-byte copies of one hidden row.
__global__ void gather_kernel(int rows, int top_k, int vecs, const uint4* __restrict__ x,
                              const int32_t* __restrict__ positions, uint4* __restrict__ out, int64_t out_rows,
                              uint32_t* status) {
  pdl::wait_for_prerequisites();  // launched while the layout build runs (gather_rows): its positions first
  pdl::launch_dependents();       // the GEMM's prepare kernel (one CTA) may queue now
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

using element::cast;
using element::f32;

// Slots of a token whose loads are issued together in the combines: the k rows of a token are independent, so
// their position, weight and data loads are batched rather than chained slot after slot (at gpt-oss T = 1,
// k = 4, the Fused sum took 5.8 us under ncu for 2880 columns, nearly all of it 8 dependent loads in a row).
constexpr int kSlotBatch = 8;

// One block per token; each thread owns 8 consecutive hidden elements per step. Sums the k contributions in
// f32 and rounds once (the more accurate of transformers' two orders), in slot order.
template <class T>
__global__ void combine_kernel(int top_k, int hidden, const T* __restrict__ d, int64_t ld_d, int64_t d_rows,
                               const int32_t* __restrict__ positions, const float* __restrict__ weights,
                               const int32_t* __restrict__ row_experts, const float* __restrict__ bias, int experts,
                               T* __restrict__ y) {
  pdl::wait_for_prerequisites();  // launched as GEMM2 ends (combine_rows): its rows first
  const int t = blockIdx.x;
  for (int h0 = threadIdx.x * 8; h0 < hidden; h0 += blockDim.x * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 < top_k; j0 += kSlotBatch) {
      int p[kSlotBatch];
      float w[kSlotBatch];
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u) {
        const int64_t r = static_cast<int64_t>(t) * top_k + j0 + u;
        const bool in = j0 + u < top_k;
        p[u] = in ? positions[r] : -1;
        w[u] = in ? weights[r] : 0.f;
        if (p[u] >= d_rows) p[u] = -1;  // dropped rows contribute nothing (remote experts)
      }
      uint4 raw[kSlotBatch];
      int e[kSlotBatch];
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u) {
        if (p[u] >= 0) raw[u] = *reinterpret_cast<const uint4*>(d + static_cast<int64_t>(p[u]) * ld_d + h0);
        e[u] = p[u] >= 0 && bias ? row_experts[p[u]] : -1;
      }
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u) {
        if (p[u] < 0) continue;
        const T* v = reinterpret_cast<const T*>(&raw[u]);
        const float* b = (e[u] >= 0 && e[u] < experts) ? bias + static_cast<int64_t>(e[u]) * hidden + h0 : nullptr;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += w[u] * (f32(v[i]) + (b ? b[i] : 0.f));
      }
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = cast<T>(acc[i]);
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(t) * hidden + h0) = out;
  }
}

// The Fused backend's combine: GEMM2 already weighted each (token, slot) row and wrote it at its flat row.
template <class T>
__global__ void sum_slots_kernel(int top_k, int hidden, const T* __restrict__ pairs,
                                 const int32_t* __restrict__ positions, T* __restrict__ y) {
  pdl::wait_for_prerequisites();  // launched while GEMM2 runs (sum_slots below): its pairs, before any read
  const int t = blockIdx.x;
  for (int h0 = threadIdx.x * 8; h0 < hidden; h0 += blockDim.x * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 < top_k; j0 += kSlotBatch) {
      bool live[kSlotBatch];
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u)  // dropped rows (remote experts) were never written
        live[u] = j0 + u < top_k && positions[static_cast<int64_t>(t) * top_k + j0 + u] >= 0;
      uint4 raw[kSlotBatch];
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u)
        if (live[u]) raw[u] = *reinterpret_cast<const uint4*>(pairs + (static_cast<int64_t>(t) * top_k + j0 + u) * hidden + h0);
#pragma unroll
      for (int u = 0; u < kSlotBatch; ++u) {
        if (!live[u]) continue;
        const T* v = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += f32(v[i]);
      }
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = cast<T>(acc[i]);
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(t) * hidden + h0) = out;
  }
}

inline Status last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace layouts

Status build_layout(const LayoutArgs& a) {
  using namespace layouts;
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  const int E = a.local_experts;
  auto smem_attr = [](auto kernel, size_t bytes) {
    return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(bytes))
                             : cudaSuccess;
  };
  if (a.rows <= 32) {
    build_layout_warp_kernel<<<1, 32, sizeof(int32_t) * (2 * E + 1), stream>>>(a);
    return last_error();
  }
  if (a.rows <= kLayoutSingleCtaRows) {
    const size_t smem = sizeof(int32_t) * (2 * E + 1 + kWarps * E + kScanTmp);
    const cudaError_t e = smem_attr(build_layout_kernel, smem);
    if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
    build_layout_kernel<<<1, kThreads, smem, stream>>>(a);
    return last_error();
  }
  const int chunks = (a.rows + kLayoutChunkRows - 1) / kLayoutChunkRows;
  const size_t scan_smem = sizeof(int32_t) * (2 * E + 1 + kScanTmp);
  const size_t scatter_smem = sizeof(int32_t) * (E + 1 + (kLayoutChunkRows / 32) * E);
  cudaError_t e = smem_attr(scatter_chunks_kernel, scatter_smem);
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  count_chunks_kernel<<<chunks, kLayoutChunkRows, sizeof(int32_t) * E, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  const Status s = pdl::launch(true, dim3(1), dim3(kThreads), scan_smem, stream, scan_chunks_kernel, a, chunks);
  if (s.code != StatusCode::Ok) return s;
  return pdl::launch(true, dim3(chunks), dim3(kLayoutChunkRows), scatter_smem, stream, scatter_chunks_kernel, a, chunks);
}

Status gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                   int64_t out_rows, uint64_t status, uint64_t stream) {
  if (rows == 0) return {StatusCode::Ok, 0};
  constexpr int kRowsPerBlock = 8;
  // Programmatic dependent launch: the layout build lets its dependents start at once, so the gather's CTAs are
  // resident and waiting when it ends (one launch latency less on the layout backends' chain).
  return pdl::launch(true, dim3((rows + kRowsPerBlock - 1) / kRowsPerBlock), dim3(32 * kRowsPerBlock), 0,
                     reinterpret_cast<cudaStream_t>(stream), layouts::gather_kernel, static_cast<int>(rows),
                     static_cast<int>(top_k), static_cast<int>(hidden / 8), reinterpret_cast<const uint4*>(x),
                     reinterpret_cast<const int32_t*>(positions), reinterpret_cast<uint4*>(out), out_rows,
                     reinterpret_cast<uint32_t*>(status));
}

Status combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t ld_d, int64_t d_rows,
                    uint64_t positions, uint64_t weights, uint64_t row_experts, uint64_t bias, int32_t experts,
                    uint64_t y, uint64_t stream) {
  if (tokens == 0) return {StatusCode::Ok, 0};
  // Programmatic dependent launch: the GEMM before it (CUTLASS's) does not signal early, so this may be scheduled
  // once the GEMM's CTAs have exited, before the stream has seen the grid complete; it waits before it reads.
  const dim3 grid(tokens), block(hidden / 8 < 256 ? ((hidden / 8 + 31) / 32) * 32 : 256);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  auto pos = reinterpret_cast<const int32_t*>(positions);
  auto w = reinterpret_cast<const float*>(weights);
  auto re = reinterpret_cast<const int32_t*>(row_experts);
  auto b = reinterpret_cast<const float*>(bias);
  const int k = top_k, hd = hidden, e = experts;
  return dtype == DType::BF16
             ? pdl::launch(true, grid, block, 0, s, layouts::combine_kernel<__nv_bfloat16>, k, hd,
                           reinterpret_cast<const __nv_bfloat16*>(d), ld_d, d_rows, pos, w, re, b, e,
                           reinterpret_cast<__nv_bfloat16*>(y))
             : pdl::launch(true, grid, block, 0, s, layouts::combine_kernel<__half>, k, hd,
                           reinterpret_cast<const __half*>(d), ld_d, d_rows, pos, w, re, b, e,
                           reinterpret_cast<__half*>(y));
}

Status sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                 uint64_t y, uint64_t stream) {
  if (tokens == 0) return {StatusCode::Ok, 0};
  const int threads = hidden / 8 < 256 ? ((hidden / 8 + 31) / 32) * 32 : 256;
  auto pos = reinterpret_cast<const int32_t*>(positions);
  // Programmatic dependent launch: scheduled once GEMM2 lets it (the SwapAb GEMM2 on grids of at most two waves,
  // fused_decode.cu), else when GEMM2 ends; the kernel waits for GEMM2 before it reads.
  auto s = reinterpret_cast<cudaStream_t>(stream);
  return dtype == DType::BF16
             ? pdl::launch(true, dim3(tokens), dim3(threads), 0, s, layouts::sum_slots_kernel<__nv_bfloat16>, top_k,
                           hidden, reinterpret_cast<const __nv_bfloat16*>(pairs), pos,
                           reinterpret_cast<__nv_bfloat16*>(y))
             : pdl::launch(true, dim3(tokens), dim3(threads), 0, s, layouts::sum_slots_kernel<__half>, top_k, hidden,
                           reinterpret_cast<const __half*>(pairs), pos, reinterpret_cast<__half*>(y));
}

}  // namespace moe_gemm
