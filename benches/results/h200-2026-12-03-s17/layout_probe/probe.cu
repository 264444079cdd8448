// Where the single-CTA layout build spends its time: the shipped kernel timed back to back (events), and a copy
// with a block barrier and a clock64 stamp between its phases. Built on the GPU host with nvcc against cpp/:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I cpp probe.cu -o probe && ./probe
#include "../../../../cpp/layouts.cu"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

using namespace moe_gemm;
using namespace moe_gemm::layouts;

__global__ void empty_kernel() {}

// build_layout_kernel's body, barriers and stamps added (stamp[i] = clock64 after phase i, thread 0).
template <bool kShfl>
__global__ void __launch_bounds__(kThreads) probe_kernel(const LayoutArgs a, long long* stamp) {
  long long t0 = clock64();
  extern __shared__ int32_t sm[];
  const int E = a.local_experts, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t* count = sm;
  int32_t* start = count + E;
  int32_t* wcount = start + E + 1;
  int32_t* tmp = wcount + kWarps * E;
  int32_t* mine = wcount + warp * E;
  uint32_t err = 0;
  const int steps = (a.rows + kThreads - 1) / kThreads;
  const int first = warp * steps * 32;
  int le[kSub];
  int sum = 0;
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int r = first + 32 * s + lane;
    le[s] = s < steps && r < a.rows ? local_expert(a, r, err) : -1;
    sum += le[s];
  }
  if (sum == -123456) stamp[100] = sum;
  __syncthreads();
  long long t1 = clock64();
  for (int e = lane; e < E; e += 32) mine[e] = 0;
  fill_padding(a, threadIdx.x, kThreads);
  __syncthreads();
  long long t2 = clock64();
  int rank[kSub];
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    if (s >= steps) break;
    unsigned peers = 0;
    if (kShfl) {  // the same mask from 32 shuffles instead of match.any
#pragma unroll
      for (int j = 0; j < 32; ++j) peers |= (__shfl_sync(kFull, le[s], j) == le[s] ? 1u : 0u) << j;
    } else {
      peers = __match_any_sync(kFull, le[s]);
    }
    const int below = __popc(peers & ((1u << lane) - 1));
    const int before = le[s] >= 0 ? mine[le[s]] : 0;
    __syncwarp();
    if (le[s] >= 0 && below == 0) mine[le[s]] = before + __popc(peers);
    rank[s] = before + below;
    __syncwarp();
  }
  __syncthreads();
  long long t3 = clock64();
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
  long long t4 = clock64();
  write_offsets(a, count, start, tmp, err);
  __syncthreads();
  long long t5 = clock64();
  write_expert_ids(a, start, threadIdx.x, kThreads);
  __syncthreads();
  long long t6 = clock64();
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int r = first + 32 * s + lane;
    if (s >= steps || r >= a.rows) break;
    const int e = le[s];
    place(a, r, e, e >= 0 ? static_cast<int64_t>(start[e]) + mine[e] + rank[s] : -1, e >= 0 ? start[e] : 0);
  }
  if (err) atomicOr(reinterpret_cast<uint32_t*>(a.status), err);
  __syncthreads();
  long long t7 = clock64();
  if (threadIdx.x == 0) {
    stamp[0] = t1 - t0; stamp[1] = t2 - t1; stamp[2] = t3 - t2; stamp[3] = t4 - t3;
    stamp[4] = t5 - t4; stamp[5] = t6 - t5; stamp[6] = t7 - t6; stamp[7] = t7 - t0;
  }
}

template <class F>
float time_us(F launch, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 10; ++i) launch();
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) launch();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.f / reps;
}

int main() {
  int clk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  printf("SM clock attribute %d kHz\n", clk);
  printf("empty kernel back to back: %.2f us\n", time_us([] { empty_kernel<<<1, 32>>>(); }, 500));
  const int E = 128, k = 8;
  std::mt19937 rng(1);
  for (int tokens : {16, 64, 128, 256, 512}) {
    const int rows = tokens * k;
    std::vector<int> ids(rows);
    for (int t = 0; t < tokens; ++t) {
      std::vector<int> p(E);
      for (int e = 0; e < E; ++e) p[e] = e;
      std::shuffle(p.begin(), p.end(), rng);
      for (int j = 0; j < k; ++j) ids[t * k + j] = p[j];
    }
    int32_t *d_ids, *counts, *offsets, *sorted, *eids, *ready, *mind, *pos, *total;
    uint32_t* status;
    long long* stamp;
    cudaMalloc(&d_ids, rows * 4); cudaMalloc(&counts, E * 4); cudaMalloc(&offsets, (E + 1) * 4);
    cudaMalloc(&sorted, rows * 4); cudaMalloc(&eids, rows * 4); cudaMalloc(&ready, rows * 4);
    cudaMalloc(&mind, rows * 4); cudaMalloc(&pos, rows * 4); cudaMalloc(&total, 4); cudaMalloc(&status, 4);
    cudaMalloc(&stamp, 128 * 8);
    cudaMemcpy(d_ids, ids.data(), rows * 4, cudaMemcpyHostToDevice);
    LayoutArgs a{};
    a.kind = LayoutKind::Packed; a.rows = rows; a.experts = E; a.local_experts = E; a.block_m = 1; a.max_m = 0;
    a.capacity = rows; a.topk_ids = (uint64_t)d_ids; a.counts = (uint64_t)counts; a.offsets = (uint64_t)offsets;
    a.sorted_ids = (uint64_t)sorted; a.expert_ids = (uint64_t)eids; a.block_ready = (uint64_t)ready;
    a.m_indices = (uint64_t)mind; a.positions = (uint64_t)pos; a.total = (uint64_t)total; a.status = (uint64_t)status;
    a.stream = 0;
    const float shipped = time_us([&] { build_layout(a); }, 200);
    const size_t smem = sizeof(int32_t) * (2 * E + 1 + kWarps * E + kScanTmp);
    for (int v = 0; v < 2; ++v) {
      const float probe = time_us([&] {
        if (v) probe_kernel<true><<<1, kThreads, smem>>>(a, stamp); else probe_kernel<false><<<1, kThreads, smem>>>(a, stamp);
      }, 200);
      long long s[8];
      cudaMemcpy(s, stamp, sizeof s, cudaMemcpyDeviceToHost);
      printf("rows %5d: build_layout %.2f us, probe(%s) %.2f us; cycles: ids %lld, zero+padding %lld, rank %lld, "
             "warp scan %lld, offsets %lld, expert_ids %lld, place %lld, all %lld (%s)\n",
             rows, shipped, v ? "shfl" : "match", probe, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
             cudaGetErrorString(cudaGetLastError()));
    }
  }
  return 0;
}
