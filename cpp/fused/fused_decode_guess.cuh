// SwapAb16's GEMM1 of a tiny batch (at most 32 (token, slot) rows), launched early (fused_decode.cu; included
// there after Task). While the layout build runs, GEMM1's first-wave CTAs wait, and HBM is idle: each guesses the
// expert of its layout block from topk_ids and starts its weight rows' first K steps towards L2. The guess feeds
// the prefetch only; the GEMM reads the built layout's expert_ids as before, so a wrong guess costs bandwidth,
// never a result.
#pragma once

#include <cstdint>

namespace moe_gemm {
namespace fused_decode {

// The local expert that the aligned layout gives block `mb` of BM positions, computed as the build does for the
// batch's `rows` (at most 32) in topk_ids: experts in increasing order, each padded to whole blocks; -1 past the
// batch. Every lane of the warp returns the same value.
template <int BM>
__device__ __forceinline__ int guess_expert(const int32_t* topk, int rows, int experts, int64_t mb, int lane) {
  int e = lane < rows ? topk[lane] : -1;
  if (e < 0 || e >= experts) e = -1;  // dropped by the build too
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const bool leader = e >= 0 && __ffs(peers) - 1 == lane;
  const int blocks = leader ? (__popc(peers) + BM - 1) / BM : 0;
  int before = 0;  // blocks of the smaller experts
  for (int j = 0; j < 32; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j), bj = __shfl_sync(0xffffffffu, blocks, j);
    if (ej < e) before += bj;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, leader && before <= mb && mb < before + blocks);
  return hit ? __shfl_sync(0xffffffffu, e, __ffs(hit) - 1) : -1;
}

// The row-owning lanes (t = 0) of a warp whose task is rows [n0, n0 + 32) over K steps [c0, c1) send those
// rows' first kPrefetchSteps steps of the guessed expert to L2. Call from every lane of the warp.
template <class T, int BM>
__device__ __forceinline__ void prefetch_guessed(const FusedGemmArgs& a, const int32_t* topk, int n0, int c0, int c1,
                                                 int lane) {
  const int e = guess_expert<BM>(topk, a.rows, a.experts, blockIdx.y, lane);
  if (e < 0 || n0 >= a.n || c0 >= c1 || lane % 4 != 0) return;
  Task<T, BM> task;
  task.bind(a, 0, e, 0, n0, lane / 4);  // limit 0: no position rows read, only the weight rows' addresses
  const int bytes = min(c1 - c0, kPrefetchSteps) * kChunk * static_cast<int>(sizeof(T));
  const int row_left = (a.k - c0 * kChunk) * static_cast<int>(sizeof(T));
#pragma unroll
  for (int i = 0; i < Task<T, BM>::MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) prefetch_l2(task.wr[i][h] + c0 * kChunk, min(bytes, row_left));
}

}  // namespace fused_decode
}  // namespace moe_gemm
