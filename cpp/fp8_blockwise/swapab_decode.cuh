// The FP8 blockwise grouped GEMM's decode configuration (Fp8TileConfig::SwapAb16): the same operands and
// function as the CUTLASS kernels (launch_fp8.h), for groups of a handful of rows, with plain mma.sync and no
// CUTLASS. Why: the ptr-array kernels give each CTA a 64- or 128-row tile of one group at a time and, their tiles
// dealt round-robin, switch group (and rewrite their TMA descriptors) at nearly every tile; at decode their weight
// streams ran at 75-91% of the DRAM peak on an H100 where the bf16 swap-AB decode tiles ran at 85-96% (ncu,
// Qwen3-30B-A3B to DeepSeek-V3 at T = 8-64: benches/results/h100-2026-12-07-fp8-swapab/ncu-main-chain.txt).
//
// Swap AB (as the fused decode tiles, fused/fused_decode.cu): the expert's weight rows sit on the M side of
// `mma.sync.m16n8k32` (e4m3 x e4m3, f32) and 16 of the group's rows of A on its N side. A CTA of four warps takes
// 128 weight rows (one 128-row scale block of N) of one group; each warp streams its 32 rows, 128 of K (one
// scale block) per step, with 16-byte cp.async into a ring of kStages steps in shared memory, and the group's
// rows of A, their scales and the weight scale with them. A lane copies exactly the pieces it later reads itself
// (lane-major, so no bank conflicts and no barrier). Each step's four MMAs per tile pair are summed and then
// scaled by sfa * sfb into the f32 total: CUTLASS's two-level accumulation at the same 128 interval. A group of
// more than 16 rows takes ceil(m / 16) passes over its weights.
//
// The K order inside a 64-byte chunk is permuted alike for A and B (lane t of a row holds bytes 16t .. 16t + 15:
// the first 8 feed one MMA, the last 8 the other), which a dot product does not see.
//
// Launched with programmatic dependent launch: the kernel waits before it reads anything (the offsets may be
// the previous kernel's), so that its CTAs are resident when the quantiser before it ends.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass/cutlass.h"

#include "common/cp_async.cuh"
#include "common/group_rows.cuh"
#include "common/mma_sync.cuh"
#include "common/pdl.cuh"
#include "fp8_blockwise/launch_fp8.h"

namespace moe_gemm {
namespace fp8_swapab {

constexpr int kWarps = 4;
constexpr int kBlock = 128;                // K per step, N rows per CTA: one scale block each
constexpr int kWarpRows = kBlock / kWarps;  // 32 weight rows per warp: two m16 tiles
constexpr int kPositions = 16;             // rows of A per pass: two n8 tiles
constexpr int kStages = 4;                 // kStages - 1 steps in flight per warp
constexpr int kTileM = kPositions;         // the facts' tile: rows of A x weight rows x K step

// One warp's step in shared memory, lane-major: element [i][lane] is what lane `lane` copied and reads.
struct Step {
  uint4 w[8][32];    // weight pieces: [m tile][row g or g + 8][64-byte half]
  uint4 x[4][32];    // A pieces: [n tile][64-byte half]
  float sfa[4][32];  // the scales of the four positions of the lane's accumulators
  float sfb[32];     // the warp's weight scale (every lane its own copy)
};
constexpr int kSmemBytes = kWarps * kStages * static_cast<int>(sizeof(Step));

struct Operands {
  const uint8_t* a;    // this group's first row of A
  const float* sfa;    // its scales
  const uint8_t* b;    // the warp's first weight row
  const float* sfb;    // the warp's row of weight scales (one per K block)
  int64_t k;           // K (= the row stride of A and B)
  int64_t kb;          // K blocks (= the row stride of sfa)
  int m;               // this group's rows
};

// Queues step `s` (K block s) of pass `pass` into `st`. Rows of A past the group's are zero-filled.
__device__ __forceinline__ void issue(Step& st, const Operands& o, int pass, int s, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t k0 = static_cast<int64_t>(s) * kBlock + 16 * t;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint8_t* src = o.b + static_cast<int64_t>(mt * 16 + h * 8 + g) * o.k + k0 + 64 * c;
        cp_async_cg(&st.w[mt * 4 + h * 2 + c][lane], src, 16);
      }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int p = pass * kPositions + nt * 8 + g;
    const bool live = p < o.m;
    const uint8_t* row = o.a + (live ? static_cast<int64_t>(p) * o.k : 0);
#pragma unroll
    for (int c = 0; c < 2; ++c) cp_async_ca(&st.x[nt * 2 + c][lane], row + k0 + 64 * c, live ? 16 : 0);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int q = pass * kPositions + nt * 8 + 2 * t + e;
      const bool on = q < o.m;
      cp_async_ca4(&st.sfa[nt * 2 + e][lane], o.sfa + (on ? static_cast<int64_t>(q) * o.kb + s : 0), on ? 4 : 0);
    }
  }
  cp_async_ca4(&st.sfb[lane], o.sfb + s, 4);
}

// D[lo + p, n0 + r] for the group's rows p and the CTA's 128 weight rows r. Grid: x = N / 128, y = groups.
__global__ void __launch_bounds__(32 * kWarps, 2)
    swapab_kernel(GroupMode mode, const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                  int max_m, int groups, int n, int k, int64_t max_rows, const uint8_t* __restrict__ a,
                  const float* __restrict__ sfa, const uint8_t* __restrict__ b, const float* __restrict__ sfb,
                  __nv_bfloat16* __restrict__ d, uint32_t* error_word) {
  pdl::wait_for_prerequisites();
  pdl::launch_dependents();
  const int grp = blockIdx.y;
  const group_rows::Group r = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, grp, max_rows);
  if (r.err && blockIdx.x == 0 && threadIdx.x == 0) atomicOr(error_word, r.err);
  if (r.m == 0) return;

  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Step* ring = reinterpret_cast<Step*>(smem) + warp * kStages;
  const int64_t k64 = k, kb = k / kBlock, nb = n / kBlock;
  const int row0 = blockIdx.x * kBlock + warp * kWarpRows;  // the warp's first weight row (of n)
  Operands o;
  o.a = a + r.lo * k64;
  o.sfa = sfa + r.lo * kb;
  o.b = b + (static_cast<int64_t>(grp) * n + row0) * k64;
  o.sfb = sfb + (static_cast<int64_t>(grp) * nb + blockIdx.x) * kb;
  o.k = k64;
  o.kb = kb;
  o.m = r.m;
  const int steps = static_cast<int>(kb);
  const int g = lane >> 2, t = lane & 3;

  for (int pass = 0; pass * kPositions < r.m; ++pass) {
    float total[2][2][4] = {};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) issue(ring[s], o, pass, s, lane);
      cp_async_commit();
    }
    for (int s = 0; s < steps; ++s) {
      cp_async_wait<kStages - 2>();
      const int next = s + kStages - 1;
      if (next < steps) issue(ring[next % kStages], o, pass, next, lane);
      cp_async_commit();
      const Step& st = ring[s % kStages];
      float part[2][2][4] = {};
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint4 w[2][2], x[2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) w[mt][h] = st.w[mt * 4 + h * 2 + c][lane];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) x[nt] = st.x[nt * 2 + c][lane];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            mma_e4m3(part[mt][nt], w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y, x[nt].x, x[nt].y);
            mma_e4m3(part[mt][nt], w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w, x[nt].z, x[nt].w);
          }
      }
      const float wscale = st.sfb[lane];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float scale = st.sfa[nt * 2 + e][lane] * wscale;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            total[mt][nt][e] = fmaf(part[mt][nt][e], scale, total[mt][nt][e]);
            total[mt][nt][2 + e] = fmaf(part[mt][nt][2 + e], scale, total[mt][nt][2 + e]);
          }
        }
    }
    // Accumulator (mt, nt, i): weight row mt * 16 + g (+ 8 for i >= 2), position nt * 8 + 2t + (i & 1).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = pass * kPositions + nt * 8 + 2 * t + e;
        if (p >= r.m) continue;
        __nv_bfloat16* out = d + (r.lo + p) * static_cast<int64_t>(n) + row0;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          out[mt * 16 + g] = __float2bfloat16_rn(total[mt][nt][e]);
          out[mt * 16 + g + 8] = __float2bfloat16_rn(total[mt][nt][2 + e]);
        }
      }
    cp_async_wait<0>();  // the ring is reused by the next pass
  }
}

// This kernel's own rules beyond the family's (check_problem): K a multiple of 128 (whole scale blocks per step),
// at most 65535 groups (the grid's y).
inline Status check(const GroupedGemmFp8Args& p) {
  if (p.k % kBlock != 0 || p.groups > 65535) {
    return {StatusCode::CutlassCannotImplement, static_cast<int32_t>(cutlass::Status::kErrorInvalidProblem)};
  }
  return {StatusCode::Ok, 0};
}

// `checked`: the family's host checks (fp8_blockwise::check_problem). No workspace.
inline Status run(const GroupedGemmFp8Args& p, Status checked) {
  if (checked.code != StatusCode::Ok) return checked;
  const Status own = check(p);
  if (own.code != StatusCode::Ok) return own;
  if (p.groups == 0 || p.max_rows == 0) return {StatusCode::Ok, 0};
  static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two CTAs' rings (and their reserved 1 KB) fit an SM");
  const cudaError_t attr =
      cudaFuncSetAttribute(swapab_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(attr)};
  return pdl::launch(true, dim3(p.n / kBlock, p.groups), dim3(32 * kWarps), kSmemBytes,
                     reinterpret_cast<cudaStream_t>(p.stream), swapab_kernel, p.mode,
                     reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts),
                     static_cast<int>(p.max_m), static_cast<int>(p.groups), static_cast<int>(p.n),
                     static_cast<int>(p.k), static_cast<int64_t>(p.max_rows),
                     reinterpret_cast<const uint8_t*>(p.a), reinterpret_cast<const float*>(p.sfa),
                     reinterpret_cast<const uint8_t*>(p.b), reinterpret_cast<const float*>(p.sfb),
                     reinterpret_cast<__nv_bfloat16*>(p.d), reinterpret_cast<uint32_t*>(p.status));
}

// The facts (launch_fp8.h) of this configuration: its tile is 16 rows of A by 128 weight rows by one K step.
inline Fp8KernelFacts facts() {
  Fp8KernelFacts f{};
  f.tile_m = kTileM;
  f.tile_n = kBlock;
  f.tile_k = kBlock;
  f.cluster_m = 1;
  f.cluster_n = 1;
  f.sms_per_mma = 1;
  f.scale_m = 1;
  f.scale_n = kBlock;
  f.scale_k = kBlock;
  f.sfa_k_major = true;
  f.sfb_k_major = true;
  f.blockwise_mainloop = true;
  f.fast_accumulation = false;
  f.promotion_k = kBlock;
  f.stages = kStages;
  return f;
}

constexpr const char* kSchedule = "SwapAbMmaSyncFP8Blockwise";

}  // namespace fp8_swapab
}  // namespace moe_gemm
