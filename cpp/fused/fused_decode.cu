// moe-gemm unit: family=fused_moe_sm90 targets=sm_90a seconds=25
// (Plain mma.sync, but in the Fused backend's SM90 family: launched only through FusedGemm, which requires it.)
// The Fused backend's decode tiles (FusedTile::SwapAb16 / SwapAb32 / SwapAbMerged): the same gather and scatter
// GEMMs over the same aligned layout as fused_moe_sm90.cuh, for the batches where every expert gets a handful of rows.
//
// Why not the warpgroup MMA of fused_moe_sm90.cuh: it wants 64 rows on its M side, so a 64-row tile that holds
// 2 real rows spends its shared-memory and tensor bandwidth on padding and leaves fewer tiles to stream the
// weights. Here A and B swap roles (vLLM's
// "swap AB"): the expert's weight rows sit on the M side of `mma.sync.m16n8k16` and the BM (16 or 32) positions of
// one layout block on its N side. SwapAb16: each warp streams 32 weight rows with 16-byte `cp.async` into its own
// ring of kStages stages in shared memory (L2 only for the weights, through L1 for the positions' rows, which
// the block's warps share), so that kStages - 1 steps of every warp are in flight. A lane copies exactly the
// pieces it later reads itself: no barrier, and a lane-major ring without bank conflicts. SwapAb32: the four
// warps share one copy of the block's positions per stage instead (shared_gemm_kernel). The dot products are
// order-free in K, so each lane takes 16 elements of its rows and of its positions and both MMA fragments use
// the same (permuted) k: no shuffles.
//
// Grid: x = groups of (4 / S) warp tasks of 32 weight rows, each task's K split over S warps where the batch has
// too few tasks to fill the SMs (SwapAb16; the shared-ring tiles have S = 1); y = the layout's blocks of BM
// positions (blocks past the batch's *total return at once, so a captured graph replays for any routing; the
// merged tile's CTA takes up to four blocks of one expert). Outputs and their roundings are those of the
// warpgroup-MMA tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fused/fused_decode_async.cuh"
#include "fused/fused_decode_handoff.cuh"
#include "fused/fused_decode_store.cuh"
#include "common/gated.cuh"
#include "common/mma_sync.cuh"
#include "common/moe_ops.h"
#include "fused/launch.h"
#include "common/pdl.cuh"

namespace moe_gemm {
namespace fused_decode {

constexpr int kWarps = 4;
constexpr int cmax(int x, int y) { return x > y ? x : y; }
// K steps in each warp's private ring (kStages - 1 in flight while one multiplies): 24 KB per warp, so that two
// CTAs fit an SM's shared memory. (The 32-position tile shares its positions and holds 5: SharedRing below.)
template <int BM>
constexpr int kStages = 4;
// m16 tiles of weight rows per warp: 2 (32 rows; 16 rows per warp left too few bytes in flight).
template <int BM>
constexpr int kMt = 2;
template <int BM>
constexpr int kRowsPerWarp = 16 * kMt<BM>;
constexpr int kChunk = 64;    // K per step: one 128-byte line of each row
// K steps per row sent to L2 ahead: by GEMM2 before GEMM1 has finished, by a tiny GEMM1 before the layout is built.
constexpr int kPrefetchSteps = 4;

// Programmatic dependent launch (pdl.cuh) along layout -> GEMM1 -> GEMM2 -> sum_slots: GEMM1, launched while the
// layout kernel runs, waits for it before its first read of the layout, then lets GEMM2's CTAs be scheduled into
// its last wave; GEMM2 starts its weights towards L2 (they depend only on the layout, complete before any GEMM1
// CTA got past its wait) and waits for GEMM1's h before its first copy of a position row, then lets sum_slots in.
// A GEMM1 of at most 32 rows guesses its weights from topk_ids meanwhile (fused_decode_guess.cuh).
using pdl::launch_dependents;
using pdl::wait_for_prerequisites;

template <class T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint32_t b0, uint32_t b1) {
  MOE_GEMM_MMA_SYNC("m16n8k16.row.col.f32.bf16.bf16.f32", c, a0, a1, a2, a3, b0, b1);
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  MOE_GEMM_MMA_SYNC("m16n8k16.row.col.f32.f16.f16.f32", c, a0, a1, a2, a3, b0, b1);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A lane's pieces of one K step: per weight row (g and g + 8 of each m16 tile) and per n8 tile's position, the
// 8 elements at k0 + 8t and at k0 + 32 + 8t. Slot order in the ring: weights [i][h][u], then positions [j][u].
template <int MT, int NT>
struct Ring {
  static constexpr int kStages = fused_decode::kStages<NT * 8>;
  static constexpr int kSlots = 4 * MT + 2 * NT;
  static constexpr int kWarpBytes = kStages * kSlots * 32 * 16;
};

// This lane's weight pieces of one K step into its slots of a stage (`st` already offset by the lane).
template <class T, int MT>
__device__ __forceinline__ void issue_weights(uint4* st, const T* const (&wr)[MT][2], const T* any, int k0, int t,
                                              int K) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int o = k0 + 32 * u + 8 * t;
    const bool ok = o < K;  // K % 8 == 0: a piece is wholly in or out
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) cp_async_cg(st + ((i * 2 + h) * 2 + u) * 32, ok ? wr[i][h] + o : any, ok ? 16 : 0);
  }
}

// One position piece: 8 elements of row `xr` at K offset o, zeros for a padding row or past K.
template <class T>
__device__ __forceinline__ void issue_position(uint4* dst, const T* xr, const T* any, int o, int K) {
  const bool ok = o < K && xr != nullptr;
  cp_async_ca(dst, ok ? xr + o : any, ok ? 16 : 0);
}

template <class T, int MT, int NT>
__device__ __forceinline__ void issue_step(uint4* ring, int stage, const T* const (&wr)[MT][2],
                                           const T* const (&xr)[NT], const T* any, int k0, int t, int lane, int K,
                                           uint32_t live) {
  uint4* st = ring + stage * Ring<MT, NT>::kSlots * 32 + lane;
  issue_weights<T, MT>(st, wr, any, k0, t, K);
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int j = 0; j < NT; ++j)
      if (live >> j & 1u) issue_position<T>(st + (4 * MT + j * 2 + u) * 32, xr[j], any, k0 + 32 * u + 8 * t, K);
}

// A lane's operands of one K step, read from a stage's weight slots `wst` and position slots `xst` (both offset
// by the lane).
template <int MT, int NT>
struct Operands {
  uint4 w[MT][2][2], x[NT][2];

  __device__ __forceinline__ void load(const uint4* wst, const uint4* xst) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) w[i][h][u] = wst[((i * 2 + h) * 2 + u) * 32];
#pragma unroll
      for (int j = 0; j < NT; ++j) x[j][u] = xst[(j * 2 + u) * 32];
    }
  }

  // The four m16n8k16 steps. Lane (g, t) holds, per row, words 0-3 (piece 0) and 4-7 (piece 1) of its 16
  // elements; MMA step q takes words 2q and 2q + 1 as the fragment's k = {2t, 2t+1} and {2t+8, 2t+9}, for A
  // (weight rows g, g + 8) and B (position g) alike, so every product pairs equal physical k.
  // `live`: bit j set where n8 tile j holds a row (the others' products are never stored: skipped).
  template <class T>
  __device__ __forceinline__ void multiply(float (&acc)[MT][NT][4], uint32_t live = ~0u) const {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int u = q / 2, w0 = (q % 2) * 2;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (live >> j & 1u)
            mma<T>(acc[i][j], word(w[i][0][u], w0), word(w[i][1][u], w0), word(w[i][0][u], w0 + 1),
                   word(w[i][1][u], w0 + 1), word(x[j][u], w0), word(x[j][u], w0 + 1));
    }
  }
};

template <class T, int MT, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[MT][NT][4], const uint4* ring, int stage, int lane,
                                         uint32_t live) {
  const uint4* st = ring + stage * Ring<MT, NT>::kSlots * 32 + lane;
  Operands<MT, NT> op;
  op.load(st, st + 4 * MT * 32);
  op.template multiply<T>(acc, live);
}

// The A row of layout position p: the token's row of x (gather) or the position's row of h (scatter); null on
// padding and past the batch (its pieces are zeros).
template <class T>
__device__ __forceinline__ const T* position_row(const FusedGemmArgs& a, int64_t total, int64_t p) {
  if (p >= total) return nullptr;
  const T* A = reinterpret_cast<const T*>(a.a);
  if (a.mode == FusedMode::Scatter) return A + p * a.k;
  const int r = reinterpret_cast<const int32_t*>(a.sorted_ids)[p];
  return r >= 0 && r < a.rows ? A + static_cast<int64_t>(r / a.top_k) * a.k : nullptr;
}

// A warp's task: weight rows [n0, n0 + 32) of the expert of layout block `mb` (positions [mb·BM, mb·BM + BM)).
template <class T, int BM>
struct Task {
  static constexpr int MT = kMt<BM>, NT = BM / 8;
  const T* wr[MT][2];  // this lane's weight rows g, g + 8 of each m16 tile
  const T* xr[NT];     // this lane's position row of each n8 tile (null: padding or past the batch: zeros)

  // Weight row of row r (0-15) of the task's m16 tile i: gated, the gate (tile 0) or up (tile 1) row of output
  // n0 / 2 + r; otherwise row n0 + 16i + r. Clamped into the matrix (rows past it are never stored).
  static __device__ __forceinline__ int row_of(const FusedGemmArgs& a, int n0, int i, int r) {
    if (a.mode == FusedMode::GatherGated) {
      const int I = a.n / 2, o = min(n0 / 2 + r, I - 1);
      return i == 0 ? gated::gate_row(a.gate_up, I, o) : gated::up_row(a.gate_up, I, o);
    }
    return min(n0 + 16 * i + r, a.n - 1);
  }

  // Positions p0 + 8j + g of the task, valid below `limit` (the batch's total, or the end of a merged run).
  __device__ __forceinline__ void bind(const FusedGemmArgs& a, int64_t limit, int e, int64_t p0, int n0, int g) {
    const int N = a.n, K = a.k;
    const T* B = reinterpret_cast<const T*>(a.b) + static_cast<int64_t>(e) * N * K;
    if (a.mode == FusedMode::GatherGated) {
      // The task's 32 rows are the gate (m16 tile 0) and up (tile 1) rows of outputs [n0 / 2, n0 / 2 + 16).
      static_assert(MT == 2, "a gated task pairs two m16 tiles");
      const int I = N / 2;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int o = min(n0 / 2 + 8 * h + g, I - 1);
        wr[0][h] = B + static_cast<int64_t>(gated::gate_row(a.gate_up, I, o)) * K;
        wr[1][h] = B + static_cast<int64_t>(gated::up_row(a.gate_up, I, o)) * K;
      }
    } else {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) wr[i][h] = B + static_cast<int64_t>(min(n0 + 16 * i + 8 * h + g, N - 1)) * K;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) xr[j] = position_row<T>(a, limit, p0 + 8 * j + g);
  }
};

__device__ __forceinline__ int64_t batch_total(const FusedGemmArgs& a) {
  return min(static_cast<int64_t>(*reinterpret_cast<const int32_t*>(a.total)), a.capacity);
}

// Bit j: n8 tile j of the NT * 8 positions from p0 (below `limit`) holds a row. A run's padding is its tail, so
// a SwapAb16 block of at most 8 rows multiplies 1 tile, not 2. Skipping only tiles without any row keeps every
// stored product (store() skips padding positions) whatever the order of rows in the layout. Only SwapAb16's
// private rings use it: in the shared-ring kernels it cost Mixtral T = 64 zipf 1.2-1.8%
// (benches/results/h200-2026-12-03-live-tiles/r1/compare-liveall.txt).
template <int NT>
__device__ __forceinline__ uint32_t live_tiles(const FusedGemmArgs& a, int64_t limit, int64_t p0, int lane) {
  const int* sorted = reinterpret_cast<const int32_t*>(a.sorted_ids);
  uint32_t live = 0;
#pragma unroll
  for (int h = 0; h < (NT * 8 + 31) / 32; ++h) {
    const int64_t p = p0 + 32 * h + lane;
    bool has = false;
    if (32 * h + lane < NT * 8 && p < limit) {
      const int r = sorted[p];
      has = r >= 0 && r < a.rows;
    }
    const uint32_t m = __ballot_sync(0xffffffffu, has);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (m >> (8 * j) & 0xffu) live |= 1u << (4 * h + j);
  }
  return live;
}

template <int BM>
constexpr int smem_bytes() {
  return kWarps * Ring<kMt<BM>, BM / 8>::kWarpBytes;
}

}  // namespace fused_decode
}  // namespace moe_gemm
#include "fused/fused_decode_wgmma.cuh"
#include "fused/fused_decode_guess.cuh"
namespace moe_gemm {
namespace fused_decode {

// One CTA per (4 / S weight-row tasks, layout block), each task's K split over S warps and summed through the
// drained rings. The grid runs N fastest: at any time the SMs stream neighbouring rows of one expert's weights.
// (Measured on the H200 against two persistent forms, 2026-12-01: a warp-strided task walk was no faster, and
// contiguous task ranges per warp 3-14% slower, their warps reading a thousand regions of HBM at once.)
template <class T, int BM, int S>
__global__ void __launch_bounds__(32 * kWarps, 2)
    gemm_kernel(const FusedGemmArgs a, bool early, const int32_t* topk, int32_t* /*ready*/) {
  using Tk = Task<T, BM>;
  constexpr int MT = Tk::MT, NT = Tk::NT;
  constexpr int kStages = Ring<MT, NT>::kStages;
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = (blockIdx.x * (kWarps / S) + warp / S) * kRowsPerWarp<BM>;
  const int split = warp % S;
  const int N = a.n, K = a.k;
  const int chunks = (K + kChunk - 1) / kChunk;
  const int per = (chunks + S - 1) / S;
  const int c0 = min(chunks, split * per), c1 = min(chunks, c0 + per);
  if (early && a.mode != FusedMode::Scatter) {
    // `topk` (a batch of at most 32 rows, launch_private): the first wave's weights towards L2 meanwhile.
    if (topk && blockIdx.x + int64_t(gridDim.x) * blockIdx.y < 2 * a.sm_count)
      prefetch_guessed<T, BM>(a, topk, n0, c0, c1, lane);
    wait_for_prerequisites();  // the layout, before any read of it
  }
  const int64_t total = batch_total(a);
  const int64_t mb = blockIdx.y, p0 = mb * BM;
  if (p0 >= total) return;
  const int e = reinterpret_cast<const int32_t*>(a.expert_ids)[mb];
  if (e < 0 || e >= a.experts) return;
  Tk task;
  task.bind(a, total, e, p0, n0, g);
  const T* any = reinterpret_cast<const T*>(a.a);
  const uint32_t live = live_tiles<NT>(a, total, p0, lane);
  float acc[MT][NT][4] = {};
  uint4* ring = smem + warp * (Ring<MT, NT>::kWarpBytes / 16);
  if (a.mode != FusedMode::Scatter) {
    launch_dependents();
  } else if (early) {
    // Launched early: each of the 8 row-owning lanes (t = 0) starts its 4 rows' first kPrefetchSteps K steps
    // towards L2 while GEMM1 drains. (Issued on every launch it cost 1-3% on grids of 3-4 waves.)
    if (n0 < N && c0 < c1 && t == 0) {
      const int bytes = min(c1 - c0, kPrefetchSteps) * kChunk * static_cast<int>(sizeof(T));
      const int row_left = (K - c0 * kChunk) * static_cast<int>(sizeof(T));
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) prefetch_l2(task.wr[i][h] + c0 * kChunk, min(bytes, row_left));
    }
    wait_for_prerequisites();
    launch_dependents();  // sum_slots (a CTA per token, no shared memory) waits for all of this grid anyway
  }
  if (n0 < N && c0 < c1) {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (c0 + st < c1) issue_step<T, MT, NT>(ring, st, task.wr, task.xr, any, (c0 + st) * kChunk, t, lane, K, live);
      cp_async_commit();
    }
    int st = 0;
    for (int c = c0; c < c1; ++c) {
      cp_async_wait<kStages - 2>();  // this lane's copies of step c have landed
      // Refill the stage read in the previous step (its values are already in registers and used).
      const int next = c + kStages - 1;
      if (next < c1)
        issue_step<T, MT, NT>(ring, (st + kStages - 1) % kStages, task.wr, task.xr, any, next * kChunk, t, lane, K,
                              live);
      cp_async_commit();
      mma_step<T, MT, NT>(acc, ring, st, lane, live);
      st = st + 1 == kStages ? 0 : st + 1;
    }
  }
  cp_async_wait<0>();
  if constexpr (S > 1) {
    constexpr int kValues = MT * NT * 4;
    __syncthreads();
    float* partial = reinterpret_cast<float*>(smem);
    if (split != 0) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) partial[(warp * kValues + (i * NT + j) * 4 + v) * 32 + lane] = acc[i][j][v];
    }
    __syncthreads();
    if (split != 0) return;
    for (int s = 1; s < S; ++s)
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v)
            acc[i][j][v] += partial[((warp + s) * kValues + (i * NT + j) * 4 + v) * 32 + lane];
  }
  if (n0 < N) store<T, MT, NT>(a, acc, total, e, p0, n0, g, t);
}

// The 32-position tile (SwapAb32): the CTA's four warps stream four different 32-row weight tasks of one layout
// block, in step, and share one copy of the block's position rows per stage. With a private copy per warp (as
// gemm_kernel does) the positions filled half of each ring and left room for 3 stages; shared, a stage is 4 x 4 KB
// of weights and 4 KB of positions, and 5 stages fit two CTAs per SM. Each thread copies its weight pieces and
// NT / 2 of the block's position pieces; per stage, `full` completes when all 128 threads' copies have landed and
// `empty` when all have read the stage, before anyone refills it. No __syncthreads in the loop (a CTA-shared
// variant lost to its barrier stalls), and K is not split: the warps move through K together.
template <int MT, int NT>
struct SharedRing {
  static constexpr int kStages = NT <= 4 ? 5 : 4;  // two CTAs per SM
  static constexpr int kWeightSlots = 4 * MT;                           // per warp, x 32 lanes
  static constexpr int kStageSlots = kWarps * kWeightSlots + 2 * NT;    // x 32 lanes of 16 bytes
  static constexpr int kBarriersAt = kStages * kStageSlots * 32 * 16;  // bytes: the 2 x kStages mbarriers after
  static constexpr int kBytes = kBarriersAt + 2 * kStages * 8;
  static_assert(NT % 2 == 0, "each of 128 threads copies NT / 2 of the 64 NT position pieces");
};

// Thread (warp w, lane (g, t)) copies position pieces of slot w + 4i: row 8(w / 2 + 2i) + g (`mine[i]`) at K
// offset k0 + 32(w % 2) + 8t, the slot (j = w / 2 + 2i, u = w % 2) that mma reads as (j * 2 + u).
template <class T, int MT, int NT>
__device__ __forceinline__ void issue_shared_step(uint4* stage, const T* const (&wr)[MT][2],
                                                  const T* const (&mine)[NT / 2], const T* any, int k0, int warp,
                                                  int lane, int K) {
  const int t = lane % 4;
  issue_weights<T, MT>(stage + warp * SharedRing<MT, NT>::kWeightSlots * 32 + lane, wr, any, k0, t, K);
  uint4* xst = stage + kWarps * SharedRing<MT, NT>::kWeightSlots * 32 + lane;
#pragma unroll
  for (int i = 0; i < NT / 2; ++i)
    issue_position<T>(xst + (warp + 4 * i) * 32, mine[i], any, k0 + 32 * (warp % 2) + 8 * t, K);
}

// The CTA's four 32-row tasks (weight-row chunk `chunk`) over NT * 8 positions from p0 of expert e, valid below
// `limit`, through the shared ring (Wg: through the warpgroup MMA's stages, fused_decode_wgmma.cuh).
template <class T, int NT, bool Wg = false>
__device__ __forceinline__ void stream_shared(const FusedGemmArgs& a, bool early, int32_t* ready, int64_t limit,
                                              int e, int64_t mb, int64_t p0, int chunk, uint4* smem) {
  using Tk = Task<T, NT * 8>;
  constexpr int MT = Tk::MT;
  using R = SharedRing<MT, NT>;
  constexpr int S = R::kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = (chunk * kWarps + warp) * kRowsPerWarp<16>;
  const int N = a.n, K = a.k;
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(smem) + R::kBarriersAt);
  uint64_t* empty = full + S;
  if (!Wg && threadIdx.x == 0)
    for (int s = 0; s < S; ++s) {
      mbar_init(full + s, 32 * kWarps);
      mbar_init(empty + s, 32 * kWarps);
    }
  // A warp past N still copies its share of the positions and arrives: Task::bind clamps its rows to N - 1,
  // and its stores are skipped.
  Tk task;
  task.bind(a, limit, e, p0, n0, g);
  const T* mine[NT / 2];  // the position rows whose pieces this thread copies
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) mine[i] = position_row<T>(a, limit, p0 + 8 * (warp / 2 + 2 * i) + g);
  const T* any = reinterpret_cast<const T*>(a.a);
  const int chunks = (K + kChunk - 1) / kChunk;
  __syncthreads();  // the barriers' init
  if (a.mode != FusedMode::Scatter) {
    launch_dependents();
  } else if (early) {
    // As gemm_kernel: the 8 row-owning lanes start their rows' first K steps towards L2 while GEMM1 drains.
    if (n0 < N && t == 0) {
      const int bytes = min(chunks, kPrefetchSteps) * kChunk * static_cast<int>(sizeof(T));
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) prefetch_l2(task.wr[i][h], min(bytes, K * static_cast<int>(sizeof(T))));
    }
    if (ready) {
      await_ready(ready + mb, K);
    } else {
      wait_for_prerequisites();
    }
    launch_dependents();
  }
  float acc[MT][NT][4] = {};
  if constexpr (Wg) {
    static_assert(NT == 8 || NT == 16, "the warpgroup MMA path is the 64- and 128-position runs'");
    const T* B = reinterpret_cast<const T*>(a.b) + static_cast<int64_t>(e) * N * K;
    const int r0 = threadIdx.x / 8;
    const T* wrow[8];
    const T* xrow[NT / 2];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int m = (r0 + 16 * u) % 64;  // row m of A_{(r0 + 16u) / 64}: row 16i + m % 16 of warp m / 16's task
      wrow[u] = B + static_cast<int64_t>(Tk::row_of(a, (chunk * kWarps + m / 16) * kRowsPerWarp<16>,
                                                    (r0 + 16 * u) / 64, m % 16)) * K;
    }
#pragma unroll
    for (int u = 0; u < NT / 2; ++u) xrow[u] = position_row<T>(a, limit, p0 + r0 + 16 * u);
    wg_mainloop<T, NT * 8>(acc, smem, wrow, xrow, any, K);
  } else {
    auto stage = [&](int s) { return smem + s * R::kStageSlots * 32; };
    for (int c = 0; c < S - 1 && c < chunks; ++c) {
      issue_shared_step<T, MT, NT>(stage(c), task.wr, mine, any, c * kChunk, warp, lane, K);
      cp_async_arrive(full + c);
    }
    for (int c = 0; c < chunks; ++c) {
      const int s = c % S;
      mbar_wait(full + s, (c / S) & 1);  // every thread's copies of step c have landed
      Operands<MT, NT> op;
      op.load(stage(s) + warp * R::kWeightSlots * 32 + lane, stage(s) + kWarps * R::kWeightSlots * 32 + lane);
      mbar_arrive(empty + s);
      // Refill the stage of step c - 1 once every thread has read it.
      const int next = c + S - 1;
      if (next < chunks) {
        const int ns = next % S;
        if (c > 0) mbar_wait(empty + ns, ((c - 1) / S) & 1);
        issue_shared_step<T, MT, NT>(stage(ns), task.wr, mine, any, next * kChunk, warp, lane, K);
        cp_async_arrive(full + ns);
      }
      op.template multiply<T>(acc);
    }
  }
  // Started on the counts: GEMM1 has ended by now; wait for it as before, so that the chain of grids holds.
  if (ready && early && a.mode == FusedMode::Scatter) wait_for_prerequisites();
  if (n0 < N) store<T, MT, NT>(a, acc, limit, e, p0, n0, g, t);
  if (ready && a.mode == FusedMode::GatherGated && n0 < N) signal_ready(ready + mb, a.n / 2, n0, lane);
}

// The CTA's layout block `mb` of `bm` positions: the batch's total, the block's first position and its expert;
// false (the CTA returns) past the batch or where the expert id is out of range. Where launched early, waits for
// the layout kernel first. `mb` is blockIdx.y, or with `interleave` the blocks of the batch (within the grid)
// taken alternately from the layout's front and, backwards, from its end: a bijection for any total.
__device__ __forceinline__ bool layout_block(const FusedGemmArgs& a, bool early, int bm, int64_t& total, int64_t& mb,
                                             int64_t& p0, int& e, bool interleave = false) {
  if (early && a.mode != FusedMode::Scatter) wait_for_prerequisites();  // the layout, before any read of it
  total = batch_total(a);
  const int64_t blocks = min((total + bm - 1) / bm, static_cast<int64_t>(gridDim.y)), y = blockIdx.y;
  mb = interleave && y < blocks ? (y % 2 == 0 ? y / 2 : blocks - 1 - y / 2) : y;
  p0 = mb * bm;
  if (p0 >= total) return false;
  e = reinterpret_cast<const int32_t*>(a.expert_ids)[mb];
  return e >= 0 && e < a.experts;
}

// SwapAb32: one 32-position layout block per CTA (`offsets` unused: the SwapAb kernels share one signature).
template <class T>
__global__ void __launch_bounds__(32 * kWarps, 2)
    shared_gemm_kernel(const FusedGemmArgs a, bool early, const int32_t* /*offsets*/, int32_t* /*ready*/) {
  extern __shared__ uint4 smem[];
  int64_t total, mb, p0;
  int e;
  if (layout_block(a, early, 32, total, mb, p0, e))
    stream_shared<T, 4>(a, early, nullptr, total, e, mb, p0, blockIdx.x, smem);
}

// SwapAbMerged: a layout of 16-position blocks, whose CTA for an expert's block d (counted from the expert's
// first block, by the layout's offsets) takes blocks d .. d + 7 of that expert when d % 8 == 0 and returns at
// once otherwise: an expert's weight rows are streamed once per 128 of its positions, but an expert with at most
// 16 rows costs the MMAs of 16 positions. Runs of 3-4 blocks take the 64-position path, 5-8 the 128-position one
// (both wgmma, fused_decode_wgmma.cuh). The run's positions end at its last block (the next belongs to another
// expert). The CTAs take the blocks interleaved (layout_block): a skewed batch's hot experts (long runs, fed from
// L2 after their first) then share the SMs with cold experts streaming from HBM, wherever they sit in expert order.
// H200, forced, against runs of 4 on mma.sync: geomean 0.975 over 36 points; Mixtral T = 256 uniform
// -28%, Qwen3-235B T = 256 zipf -4.1%, Mixtral T = 128 balanced +1.0%
// (benches/results/h200-2026-12-03-merged-wgmma/r1/cmp-forced.txt).
constexpr int kMergedBlocks = 8;
template <class T>
__global__ void __launch_bounds__(32 * kWarps, 2)
    merged_gemm_kernel(const FusedGemmArgs a, bool early, const int32_t* offsets, int32_t* ready) {
  extern __shared__ uint4 smem[];
  int64_t total, mb, p0;
  int e;
  if (!layout_block(a, early, 16, total, mb, p0, e, true)) return;
  int64_t d = mb - offsets[e] / 16, blocks = (static_cast<int64_t>(offsets[e + 1]) - offsets[e]) / 16;
  if (d < 0 || d >= blocks) d = 0, blocks = 1;  // offsets that contradict expert_ids: this block alone
  if (d % kMergedBlocks != 0) return;
  const int64_t run_blocks = min(static_cast<int64_t>(kMergedBlocks), blocks - d);
  const int64_t limit = min(total, p0 + 16 * run_blocks);
  switch (run_blocks) {
    case 1: return stream_shared<T, 2>(a, early, ready, limit, e, mb, p0, blockIdx.x, smem);
    case 2: return stream_shared<T, 4>(a, early, ready, limit, e, mb, p0, blockIdx.x, smem);
    case 3:
    case 4: return stream_shared<T, 8, true>(a, early, ready, limit, e, mb, p0, blockIdx.x, smem);
    default: return stream_shared<T, 16, true>(a, early, ready, limit, e, mb, p0, blockIdx.x, smem);
  }
}

// K splits per weight-row task. GEMM1 (gather, K = H): as many as keep 8 K steps per split, even where the tasks
// already fill the SMs: finer tasks even out the last wave (H200, 2026-12-01: 2-4% faster at T = 2-8 on the Qwen3
// models and at T = 2 on Mixtral and gpt-oss; 0-1.2% at T = 16-64). GEMM2 (scatter, K = I): only while the tasks
// would not fill every SM's 8 resident warps, and at 16 K steps per split: a split of Qwen3-30B's K = 768 lost
// 2-6% at T = 2-16. The rule against no split, per point:
// benches/results/h200-2026-12-01-gated-epilogue/README.md (`COMPARE-gated-split.txt`).
template <int BM>
int splits_for(const FusedGemmArgs& a, int64_t m_blocks) {
  const int chunks = (a.k + kChunk - 1) / kChunk;
  int s = 1;
  if (a.mode != FusedMode::Scatter) {
    while (s < kWarps && chunks >= 8 * (2 * s)) s *= 2;
    return s;
  }
  const int64_t tasks = (a.n + kRowsPerWarp<BM> - 1) / kRowsPerWarp<BM>;
  const int64_t want = int64_t(a.sm_count > 0 ? a.sm_count : 132) * 2 * kWarps;  // two CTAs per SM
  while (s < kWarps && tasks * m_blocks * s < want && chunks >= 16 * (2 * s)) s *= 2;
  return s;
}

// Shared memory of the shared-ring kernels: SwapAb32's, and the merged kernel's largest run (its 16-, 32- and
// 64-/128-position (wgmma) paths lay their rings out in the same allocation).
constexpr int kSwapAb32Smem = SharedRing<2, 4>::kBytes;
constexpr int kMergedSmem = cmax(cmax(SharedRing<2, 2>::kBytes, SharedRing<2, 4>::kBytes),
                                  cmax(WgRing<64>::kBytes, WgRing<128>::kBytes));

// Grids of at most two waves of two CTAs per SM: GEMM2 is launched early (below).
inline bool within_two_waves(const FusedGemmArgs& a, int64_t ctas) {
  return ctas <= int64_t(a.sm_count > 0 ? a.sm_count : 132) * 2 * 2;
}

template <class Kernel>
Status launch(const FusedGemmArgs& a, const int32_t* offsets, Kernel kernel, int rows_per_block, int smem,
              int64_t m_blocks, int32_t* ready = nullptr) {
  const dim3 grid((a.n + rows_per_block - 1) / rows_per_block, static_cast<unsigned>(m_blocks));
  // GEMM2 may start while GEMM1 (which triggers at its start) drains, where its grid is at most two waves of
  // two CTAs per SM (H200, 2026-12-01, Fused layer: gpt-oss T = 1 -3.5%, Qwen3-30B T = 2 -2.4%, Qwen3-235B T = 1
  // -1.4%, Mixtral T = 1-4 -0.6 to -1.2%, no point slower than +0.2%; early launch and L2 prefetch on every
  // GEMM2 had cost 0.4-3% on its 3-4-wave grids, Qwen3-30B T = 8-128 and DeepSeek-V3 T = 2-256).
  // GEMM1 always: the single-CTA layout kernel lets it in at its start (the chunked one, past 1024 rows, at the start of its last pass).
  const bool early = a.mode != FusedMode::Scatter || within_two_waves(a, int64_t(grid.x) * grid.y);
  return pdl::launch(early, grid, dim3(32 * kWarps), smem, reinterpret_cast<cudaStream_t>(a.stream), kernel, a, early,
                     offsets, ready);
}

// Blocks of BM positions the aligned layout can have: each expert with rows pads at most BM - 1, and at most
// capacity / BM.
inline int64_t layout_blocks(const FusedGemmArgs& a, int bm) {
  const int64_t active = a.experts < a.rows ? a.experts : a.rows;
  const int64_t by_rows = (a.rows + active * (bm - 1)) / bm, by_cap = a.capacity / bm;
  return by_rows < by_cap ? by_rows : by_cap;
}

// `topk` goes to a GEMM1 of at most 32 rows (fused_decode_guess.cuh).
template <class T, int S>
Status launch_private(const FusedGemmArgs& a, int64_t m_blocks, const int32_t* topk) {
  const int32_t* guess = a.mode != FusedMode::Scatter && a.rows <= 32 ? topk : nullptr;
  return launch(a, guess, gemm_kernel<T, 16, S>, kRowsPerWarp<16> * (kWarps / S), smem_bytes<16>(), m_blocks);
}

template <class T>
Status run_tile(const FusedGemmArgs& a, const int32_t* offsets, int32_t* ready, const int32_t* topk) {
  const int bm = a.tile == FusedTile::SwapAb32 ? 32 : 16;
  const int64_t m_blocks = layout_blocks(a, bm);
  if (m_blocks == 0 || a.n == 0) return {StatusCode::Ok, 0};
  if (m_blocks > 65535) return {StatusCode::CutlassCannotImplement, 0};
  switch (a.tile) {
    case FusedTile::SwapAb16:
      switch (splits_for<16>(a, m_blocks)) {
        case 1: return launch_private<T, 1>(a, m_blocks, topk);
        case 2: return launch_private<T, 2>(a, m_blocks, topk);
        default: return launch_private<T, 4>(a, m_blocks, topk);
      }
    case FusedTile::SwapAb32:
      return launch(a, nullptr, shared_gemm_kernel<T>, kRowsPerWarp<32> * kWarps, kSwapAb32Smem, m_blocks);
    case FusedTile::SwapAbMerged: {
      // The hand-off where GEMM2 is launched early: GEMM1 counts, GEMM2 (H = GEMM1's K wide) waits on the counts.
      constexpr int kRows = kRowsPerWarp<16> * kWarps;
      const int h = a.mode == FusedMode::Scatter ? a.n : a.k;
      const bool handoff =
          a.mode != FusedMode::Gather && within_two_waves(a, int64_t((h + kRows - 1) / kRows) * m_blocks);
      return launch(a, offsets, merged_gemm_kernel<T>, kRows, kMergedSmem, m_blocks, handoff ? ready : nullptr);
    }
    default: return {StatusCode::NotBuilt, 0};
  }
}

template <class Kernel>
Status opt_in(Kernel kernel, int smem) {
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

// Every kernel of (T, tile) opted into its ring's shared memory (once per device, with it current).
template <class T>
Status prepare(FusedTile tile) {
  switch (tile) {
    case FusedTile::SwapAb16:
      for (Status s : {opt_in(gemm_kernel<T, 16, 1>, smem_bytes<16>()), opt_in(gemm_kernel<T, 16, 2>, smem_bytes<16>()),
                       opt_in(gemm_kernel<T, 16, 4>, smem_bytes<16>())})
        if (s.code != StatusCode::Ok) return s;
      return {StatusCode::Ok, 0};
    case FusedTile::SwapAb32: return opt_in(shared_gemm_kernel<T>, kSwapAb32Smem);
    case FusedTile::SwapAbMerged: return opt_in(merged_gemm_kernel<T>, kMergedSmem);
    default: return {StatusCode::NotBuilt, 0};
  }
}

}  // namespace fused_decode

Status fused_decode_gemm(const FusedGemmArgs& a, uint64_t offsets, uint64_t ready, uint64_t topk) {
  const auto* o = reinterpret_cast<const int32_t*>(offsets);
  auto* r = reinterpret_cast<int32_t*>(ready);
  const auto* t = reinterpret_cast<const int32_t*>(topk);
  return a.dtype == DType::BF16 ? fused_decode::run_tile<__nv_bfloat16>(a, o, r, t)
                                : fused_decode::run_tile<__half>(a, o, r, t);
}

Status fused_decode_prepare(DType dtype, FusedTile tile) {
  return dtype == DType::BF16 ? fused_decode::prepare<__nv_bfloat16>(tile) : fused_decode::prepare<__half>(tile);
}

}  // namespace moe_gemm
