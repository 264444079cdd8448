// Session 13 micro-benchmark: HBM read bandwidth of the SwapAb kernels' access pattern (each CTA streams 128
// rows of ROW bytes, C bytes of each row per step) against a contiguous grid-stride read. Question: do longer
// per-row bursts (C = 256 / 512 / 1024 B instead of 128) read HBM faster? nvcc -O3 -arch=sm_90a burst_read.cu
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

template <int C, bool kHint>
__global__ void __launch_bounds__(128) rows_kernel(const uint4* __restrict__ p, int64_t row_bytes, uint32_t* sink) {
  constexpr int kLoads = C / 16;  // 16-byte loads per lane per step: a warp reads 32 rows x C bytes
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * 4 + warp) * 32;
  uint32_t acc = 0;
  for (int64_t k0 = 0; k0 < row_bytes; k0 += C) {
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = i * 32 + lane, row = idx / kLoads, col = idx % kLoads;
      const uint4* src = p + ((row0 + row) * row_bytes + k0) / 16 + col;
      if (kHint) {
        asm volatile("ld.global.cs.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w) : "l"(src));
      } else {
        v[i] = __ldcs(src);
      }
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

__global__ void flat_kernel(const uint4* __restrict__ p, uint64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

template <class F>
float time_it(F f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  return best;
}

int main() {
  const size_t bytes = size_t(2) << 30;
  uint4* p;
  uint32_t* sink;
  cudaMalloc(&p, bytes);
  cudaMalloc(&sink, 1 << 20);
  cudaMemset(p, 1, bytes);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const float flat = time_it([&] { flat_kernel<<<sms * 4, 512>>>(p, bytes / 16, sink); });
  printf("flat grid-stride: %.0f GB/s\n", bytes / flat / 1e6);
  for (int64_t row : {8192, 28672}) {
    const int64_t rows = bytes / row, blocks = rows / 128;
    auto run = [&](auto kernel, const char* name) {
      const float ms = time_it([&] { kernel<<<blocks, 128>>>(p, row, sink); });
      printf("row %6lld B, %-14s: %.0f GB/s\n", (long long)row, name, blocks * 128.0 * row / ms / 1e6);
    };
    run(rows_kernel<128, false>, "C=128");
    run(rows_kernel<128, true>, "C=128 L2::256B");
    run(rows_kernel<256, false>, "C=256");
    run(rows_kernel<512, false>, "C=512");
    run(rows_kernel<1024, false>, "C=1024");
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("%s\n", cudaGetErrorString(e));
}
