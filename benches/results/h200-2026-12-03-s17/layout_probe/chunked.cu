// The single-CTA layout build against the chunked three-pass build (PDL-chained), both timed in CUDA graph
// replay (20 builds per graph), and their outputs compared. Built against a copy of cpp/ (chunk size by sed):
//   nvcc -std=c++17 -O3 -arch=sm_90a -I CPP chunked.cu -o chunked && ./chunked
#include "layouts.cu"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

using namespace moe_gemm;
using namespace moe_gemm::layouts;

static Status single(const LayoutArgs& a, cudaStream_t s) {
  const int E = a.local_experts;
  const size_t smem = sizeof(int32_t) * (2 * E + 1 + kWarps * E + kScanTmp);
  build_layout_kernel<<<1, kThreads, smem, s>>>(a);
  return {StatusCode::Ok, 0};
}

static Status chunked(const LayoutArgs& a, cudaStream_t s) {
  const int E = a.local_experts;
  const int chunks = (a.rows + kLayoutChunkRows - 1) / kLayoutChunkRows;
  const size_t scan_smem = sizeof(int32_t) * (2 * E + 1 + kScanTmp);
  const size_t scatter_smem = sizeof(int32_t) * (E + 1 + (kLayoutChunkRows / 32) * E);
  count_chunks_kernel<<<chunks, kLayoutChunkRows, sizeof(int32_t) * E, s>>>(a);
  cudaLaunchConfig_t cfg = {};
  cfg.stream = s;
  cudaLaunchAttribute attrs[1];
  pdl::allow_early_start(cfg, attrs);
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = scan_smem;
  cudaLaunchKernelEx(&cfg, scan_chunks_kernel, a, chunks);
  cfg.gridDim = dim3(chunks);
  cfg.blockDim = dim3(kLayoutChunkRows);
  cfg.dynamicSmemBytes = scatter_smem;
  cudaLaunchKernelEx(&cfg, scatter_chunks_kernel, a, chunks);
  return {StatusCode::Ok, 0};
}

template <class F>
float graph_us(F build, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t x;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 20; ++i) build(s);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&x, g, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(x, s);
  float best = 1e9f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(a, s);
    for (int i = 0; i < 10; ++i) cudaGraphLaunch(x, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms * 1000.f / 200);
  }
  return best;
}

int main() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  printf("chunk rows %d, single-CTA limit %d\n", kLayoutChunkRows, kLayoutSingleCtaRows);
  printf("empty-ish graph node (single build of 32 rows is not it): see rows rows\n");
  std::mt19937 rng(1);
  struct Case { int E, k, block_m; };
  for (Case c : {Case{128, 8, 1}, Case{128, 4, 32}, Case{256, 8, 32}}) {
    for (int tokens : {32, 64, 128, 256, 512}) {
      const int E = c.E, k = c.k, rows = tokens * k;
      std::vector<int> ids(rows);
      for (int t = 0; t < tokens; ++t) {
        std::vector<int> p(E);
        for (int e = 0; e < E; ++e) p[e] = e;
        std::shuffle(p.begin(), p.end(), rng);
        for (int j = 0; j < k; ++j) ids[t * k + j] = p[j];
      }
      const int64_t cap = c.block_m == 1 ? rows : ((rows + std::min(E, rows) * (c.block_m - 1) + c.block_m - 1) / c.block_m) * c.block_m;
      const int chunks = (rows + kLayoutChunkRows - 1) / kLayoutChunkRows;
      int32_t *d_ids, *counts, *offsets, *sorted, *eids, *ready, *mind, *pos, *total, *scratch;
      uint32_t* status;
      cudaMalloc(&d_ids, rows * 4); cudaMalloc(&counts, E * 4); cudaMalloc(&offsets, (E + 1) * 4);
      cudaMalloc(&sorted, cap * 4); cudaMalloc(&eids, cap * 4); cudaMalloc(&ready, cap * 4);
      cudaMalloc(&mind, cap * 4); cudaMalloc(&pos, rows * 4); cudaMalloc(&total, 4); cudaMalloc(&status, 4);
      cudaMalloc(&scratch, 2 * chunks * E * 4);
      cudaMemset(status, 0, 4);
      cudaMemcpy(d_ids, ids.data(), rows * 4, cudaMemcpyHostToDevice);
      LayoutArgs a{};
      a.kind = LayoutKind::Packed; a.rows = rows; a.experts = E; a.local_experts = E; a.block_m = c.block_m;
      a.capacity = cap; a.topk_ids = (uint64_t)d_ids; a.counts = (uint64_t)counts; a.offsets = (uint64_t)offsets;
      a.sorted_ids = (uint64_t)sorted; a.expert_ids = (uint64_t)eids; a.block_ready = (uint64_t)ready;
      a.m_indices = (uint64_t)mind; a.positions = (uint64_t)pos; a.total = (uint64_t)total;
      a.scratch = (uint64_t)scratch; a.status = (uint64_t)status; a.stream = (uint64_t)s;
      // outputs of both builds, compared
      std::vector<int> p1(rows), p2(rows), s1(cap), s2(cap), e1(cap / c.block_m), e2(cap / c.block_m);
      single(a, s); cudaStreamSynchronize(s);
      cudaMemcpy(p1.data(), pos, rows * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(s1.data(), sorted, cap * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(e1.data(), eids, cap / c.block_m * 4, cudaMemcpyDeviceToHost);
      cudaMemset(pos, 0xff, rows * 4); cudaMemset(sorted, 0xff, cap * 4); cudaMemset(eids, 0xff, cap / c.block_m * 4);
      chunked(a, s); cudaStreamSynchronize(s);
      cudaMemcpy(p2.data(), pos, rows * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(s2.data(), sorted, cap * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(e2.data(), eids, cap / c.block_m * 4, cudaMemcpyDeviceToHost);
      uint32_t st = 0;
      cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost);
      const bool same = p1 == p2 && s1 == s2 && e1 == e2;
      const float t1 = graph_us([&](cudaStream_t q) { single(a, q); }, s);
      const float t2 = graph_us([&](cudaStream_t q) { chunked(a, q); }, s);
      printf("E %3d k %d block_m %2d rows %5d: single %.2f us, chunked (%d chunks) %.2f us; same outputs %s, status %u (%s)\n",
             E, k, c.block_m, rows, t1, chunks, t2, same ? "yes" : "NO", st, cudaGetErrorString(cudaGetLastError()));
      cudaFree(d_ids); cudaFree(counts); cudaFree(offsets); cudaFree(sorted); cudaFree(eids); cudaFree(ready);
      cudaFree(mind); cudaFree(pos); cudaFree(total); cudaFree(status); cudaFree(scratch);
    }
  }
  return 0;
}
