// The merged tile's 64- and 128-position runs on the warpgroup MMA (fused_decode.cu; included there after its cp.async
// and mbarrier primitives). Such a run is a hot expert's: with `mma.sync` each warp reads its 32 weight rows and all 64
// positions from shared memory into registers every K step, and these CTAs, fed from L2 after the expert's first run,
// hold their SM slots about twice as long per weight byte as a cold expert's 16-position CTA. `wgmma` reads both
// operands from shared memory itself: the CTA's one warpgroup multiplies its 128 weight rows (two m64 halves) by the 64
// or 128 positions (n64, n128), with no operand registers and no LDS.
//
// Per stage: A0 and A1 (64 weight rows x 64 K each, 8 KB) and B (NP positions x 64 K), K-major in the
// 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8) of the row; 1024-byte aligned). Row m of A_i
// is row 16i + m % 16 of warp m / 16's 32-row task (Task::row_of), so the m64nNP accumulator of each thread holds
// what the `mma.sync` path's acc[i][j][v] holds, and the same store() writes it.
#pragma once

#include <cstdint>
#include <type_traits>

namespace moe_gemm {
namespace fused_decode {

// The stages of a run of NP positions (64 or 128): A0, A1 (8 KB each) and B (NP x 128 bytes); 4 stages of 24 KB
// or 3 of 32 KB, within the shared ring's 96 KB.
template <int NP>
struct WgRing {
  static constexpr int kStages = NP == 64 ? 4 : 3;
  static constexpr int kTileBytes = 64 * 128;  // one 64-row x 64-K weight tile
  static constexpr int kStageBytes = 2 * kTileBytes + NP * 128;
  static constexpr int kBarriersAt = kStages * kStageBytes;
  static constexpr int kBytes = kBarriersAt + 2 * kStages * 8;
};

// The wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: start address, stride between
// 8-row groups 1024 bytes (leading offset unused by this layout), swizzle mode 1 (128 B).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous MMAs.
template <int NJ>
__device__ __forceinline__ void wg_fence_operands(float (&d)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) asm volatile("" : "+f"(d[j][v])::"memory");
}

#define MOE_WG_D(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define MOE_WG_D8(j0)                                                                                              \
  MOE_WG_D(j0), MOE_WG_D(j0 + 1), MOE_WG_D(j0 + 2), MOE_WG_D(j0 + 3), MOE_WG_D(j0 + 4), MOE_WG_D(j0 + 5),        \
      MOE_WG_D(j0 + 6), MOE_WG_D(j0 + 7)
#define MOE_WG_64(TY)                                                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                         \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;"                \
               : MOE_WG_D8(0)                                                                                     \
               : "l"(da), "l"(db))
#define MOE_WG_128(TY)                                                                                             \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                                        \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "   \
               "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "   \
               "%59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;"                                             \
               : MOE_WG_D8(0), MOE_WG_D8(8)                                                                       \
               : "l"(da), "l"(db))
// D (64 x N, f32) += A (64 x 16) . B (N x 16)^T, both K-major in shared memory (N = 8 * NJ: 64 or 128).
template <class T, int NJ>
__device__ __forceinline__ void wgmma_64xn(float (&d)[NJ][4], uint64_t da, uint64_t db) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "bf16 or f16");
  static_assert(NJ == 8 || NJ == 16, "N = 64 or 128");
  if constexpr (NJ == 8) {
    if constexpr (kBf16) MOE_WG_64("bf16");
    else MOE_WG_64("f16");
  } else {
    if constexpr (kBf16) MOE_WG_128("bf16");
    else MOE_WG_128("f16");
  }
}
#undef MOE_WG_64
#undef MOE_WG_128
#undef MOE_WG_D8
#undef MOE_WG_D

// One K step's copies of this thread into stage `st`: 16-byte chunk tid % 8 of its 8 weight rows (rows
// tid / 8 + 16u of the 128: A_{row / 64}, row % 64) and of its NP / 16 position rows (tid / 8 + 16u), zeros past K
// or for a padding position. Eight lanes read one row's 128 bytes: whole sectors per request.
template <class T, int NP>
__device__ __forceinline__ void wg_issue(char* st, const T* const (&wrow)[8], const T* const (&xrow)[NP / 16],
                                         const T* any, int k0, int K) {
  constexpr int kTile = WgRing<NP>::kTileBytes;
  const int c = threadIdx.x % 8, r0 = threadIdx.x / 8, o = k0 + 8 * c;
  const bool k_ok = o < K;  // K % 8 == 0
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int r = r0 + 16 * u, m = r % 64;
    cp_async_cg(st + (r / 64) * kTile + m * 128 + ((c ^ (m & 7)) * 16), k_ok ? wrow[u] + o : any, k_ok ? 16 : 0);
  }
#pragma unroll
  for (int u = 0; u < NP / 16; ++u) {
    const int q = r0 + 16 * u;
    const bool ok = k_ok && xrow[u] != nullptr;
    cp_async_ca(st + 2 * kTile + q * 128 + ((c ^ (q & 7)) * 16), ok ? xrow[u] + o : any, ok ? 16 : 0);
  }
}

// The mainloop over `chunks` K steps of 64: acc[i] (this thread's share of A_i . B^T) as the mma.sync path's.
// `wrow`, `xrow`: the rows wg_issue copies from (null position: zeros). As CUTLASS's cp.async GMMA mainloop,
// no proxy fence: the mbarrier's completion orders the copies before the MMAs. Same full / empty protocol as the
// shared ring: `full` completes when all 128 threads' copies of a step have landed, `empty` when all 128 have
// seen that step's MMAs complete.
template <class T, int NP>
__device__ __forceinline__ void wg_mainloop(float (&acc)[2][NP / 8][4], uint4* smem, const T* const (&wrow)[8],
                                            const T* const (&xrow)[NP / 16], const T* any, int K) {
  using R = WgRing<NP>;
  constexpr int S = R::kStages;
  char* base = reinterpret_cast<char*>(smem);
  const uint32_t base_addr = smem_addr(base);
  if (base_addr % 1024 != 0) __trap();  // the swizzle's atoms: the dynamic base follows the 1 KB system area
  uint64_t* full = reinterpret_cast<uint64_t*>(base + R::kBarriersAt);
  uint64_t* empty = full + S;
  if (threadIdx.x == 0)
    for (int s = 0; s < S; ++s) {
      mbar_init(full + s, 128);
      mbar_init(empty + s, 128);
    }
  __syncthreads();
  const int chunks = (K + kChunk - 1) / kChunk;
  for (int c = 0; c < S - 1 && c < chunks; ++c) {
    wg_issue<T, NP>(base + c * R::kStageBytes, wrow, xrow, any, c * kChunk, K);
    cp_async_arrive(full + c);
  }
  for (int c = 0; c < chunks; ++c) {
    const int s = c % S;
    mbar_wait(full + s, (c / S) & 1);
    const uint32_t st = base_addr + s * R::kStageBytes;
    wg_fence_operands(acc[0]);
    wg_fence_operands(acc[1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = sw128_desc(st + 2 * R::kTileBytes) + 2 * kk;  // + 32 bytes: the next 16 K
      wgmma_64xn<T, NP / 8>(acc[0], sw128_desc(st) + 2 * kk, db);
      wgmma_64xn<T, NP / 8>(acc[1], sw128_desc(st + R::kTileBytes) + 2 * kk, db);
    }
    wg_commit();
    wg_wait<1>();  // step c - 1's MMAs have read their stage
    wg_fence_operands(acc[0]);
    wg_fence_operands(acc[1]);
    if (c > 0) mbar_arrive(empty + (c - 1) % S);
    const int next = c + S - 1;
    if (next < chunks) {
      const int ns = next % S;  // = (c - 1) % S
      if (c > 0) mbar_wait(empty + ns, ((c - 1) / S) & 1);
      wg_issue<T, NP>(base + ns * R::kStageBytes, wrow, xrow, any, next * kChunk, K);
      cp_async_arrive(full + ns);
    }
  }
  wg_wait<0>();
  wg_fence_operands(acc[0]);
  wg_fence_operands(acc[1]);
}

}  // namespace fused_decode
}  // namespace moe_gemm
