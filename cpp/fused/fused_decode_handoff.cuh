// The SwapAb decode tiles' GEMM1 -> GEMM2 hand-off per layout block (fused_decode.cu, the merged tile).
#pragma once

#include <cstdint>

#include "common/pdl.cuh"

namespace moe_gemm {
namespace fused_decode {

// The GEMM1 -> GEMM2 hand-off per layout block (`ready`, zeroed by the layout build): each GEMM1 warp that stores
// a task adds the h columns it wrote to its block's counter, and GEMM2's CTAs of the block start once it reaches
// K (= I), where they would otherwise wait for all of GEMM1 to end. A per-CTA trace of Mixtral T = 64 had up to
// 256 GEMM2 CTAs waiting through GEMM1's last 45 us while it drained at 1.8-4.2 TB/s
// (benches/results/h200-2026-12-03-per-cta-trace/r1/timeline-mixtral-64-z.txt).
// Its prototypes, measured on the H200 (benches/results/h200-2026-12-03-live-tiles-16/r2/compare.txt): Mixtral
// T = 64 zipf -2.3%, T = 32 zipf -1.3%, T = 64 uniform -0.7% (the merged tile); on SwapAb16 (T = 1-16) +1-2.3%,
// and wherever GEMM2 is not launched early the fence before each count only costs (Qwen3-30B T = 8-64 +7-10%).
// So: the merged tile, early GEMM2s.
__device__ __forceinline__ void signal_ready(int32_t* count, int n_out, int n0, int lane) {
  __threadfence();  // this lane's h stores, before the count
  __syncwarp();
  if (lane == 0) atomicAdd(count, max(0, min(16, n_out - n0 / 2)));
}

__device__ __forceinline__ int ld_relaxed(const int32_t* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread of the CTA: returns once this block's h has K columns written, or, where the count never comes
// (device data that GEMM1 read otherwise), after 20 ms and the end of GEMM1. Relaxed polls and one acquire
// fence: an acquire load per poll would invalidate the SM's L1, where the CTA beside keeps its position rows.
__device__ __forceinline__ void await_ready(const int32_t* count, int K) {
  if (threadIdx.x == 0) {
    const uint64_t t0 = global_ns();
    while (ld_relaxed(count) < K) {
      if (global_ns() - t0 > 20000000ull) {
        pdl::wait_for_prerequisites();
        break;
      }
      __nanosleep(100);
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}

}  // namespace fused_decode
}  // namespace moe_gemm
