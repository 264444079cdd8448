// SM90 fused MoE GEMMs: vLLM's fused_moe design on Hopper tensor cores (wgmma), no permuted copy of x.
//
// The aligned layout (block_m = the tile's M) gives every BM-row tile of positions one expert (expert_ids) and
// maps each position p to a flat row r = t * top_k + j (sorted_ids, the sentinel `rows` on padding). One CTA
// computes one BM x BN tile of one expert:
//   Gather:  D[p, :]  = A[sorted_ids[p] / top_k, :] . B[e]^T        (A = x; padding rows load zeros)
//   Scatter: D[r, :]  = w[r] * (round(A[p, :] . B[e]^T) + bias[e])  (A in position order; r = sorted_ids[p])
// TMA cannot gather rows, so a producer warpgroup issues 16-byte cp.async copies of A's rows into CUTLASS's
// swizzled shared memory stages (row indices computed once per tile) while one of its threads brings B's tile by
// TMA into the same stage (one mbarrier counts both); the consumer warpgroups run CUTLASS's SM90 GMMA collective; the epilogue stores straight from the accumulators (gather: by position; scatter: by flat row,
// weighted). Launched with a fixed grid bounded by the batch size, so a CUDA graph replays it for any routing.
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/pipeline/pipeline.hpp"

#include "fused/launch.h"

#if !defined(CUTLASS_ARCH_MMA_SM90A_SUPPORTED) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fused_moe_sm90 must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace moe_gemm {
namespace fused {

using namespace cute;

template <class Element_, int BM, int BN, int BK, int Stages, int MinBlocks, int GroupM>
struct FusedGemm {
  using Element = Element_;
  using Tile = Shape<Int<BM>, Int<BN>, Int<BK>>;
  static constexpr int kBM = BM, kBN = BN, kBK = BK;
  // One consumer warpgroup per 64 rows (the builder's cooperative atom layout); one producer warpgroup.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, 8, Element,
      cutlass::layout::ColumnMajor, 8, float, Tile, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCount<Stages>,
      cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  static constexpr int kMmaThreads = size(TiledMma{});
  static constexpr int kThreads = 128 + kMmaThreads;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kGroupM = GroupM;
  // Two consumer warpgroups: the producer hands them its registers. It keeps 72 (its cp.async addressing and
  // tile loop spill below that; CUTLASS's TMA-only producers keep 40); 128 x 72 + 256 x 216 <= 64K.
  static constexpr int kProducerRegs = 72, kConsumerRegs = 216;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;  // first: the dynamic smem base keeps B's stages 1024-byte aligned
    alignas(16) typename Mainloop::PipelineStorage pipeline;
  };
  static constexpr int kSmem = int(sizeof(SharedStorage));  // dynamic shared memory of one CTA

  // B (the experts' weights, [E, N, K] as an (N, K, E) tensor) arrives by TMA; OOB rows and columns are zeros.
  using StrideB = Stride<int64_t, _1, int64_t>;
  using SmemLayoutBStage = decltype(typename Mainloop::SmemLayoutB{}(_, _, Int<0>{}));
  static auto make_tma_b(const Element* b, int n, int k, int experts) {
    auto mB = make_tensor(make_gmem_ptr(b), make_shape(n, k, experts), StrideB{int64_t(k), _1{}, int64_t(n) * k});
    return make_tma_copy(SM90_TMA_LOAD{}, mB, SmemLayoutBStage{}, make_shape(Int<BN>{}, Int<BK>{}), _1{});
  }
  using TmaB = decltype(make_tma_b(nullptr, 0, 0, 0));
  static constexpr uint32_t kTmaBytesB = BN * BK * sizeof(Element);

  // 16-byte chunks per row of a k-tile, and rows one pass of the 128 producer threads covers.
  static constexpr int kChunks = BK * int(sizeof(Element)) / 16;
  static constexpr int kRowsPerPass = 128 / kChunks;
  static_assert(128 % kChunks == 0 && BM % kRowsPerPass == 0);
};

template <class G>
struct Params {
  typename G::TmaB tma_b;
  FusedMode mode;
  int32_t top_k, experts, n, k, rows;
  int64_t capacity;
  const void* a;
  void* d;
  const int32_t* sorted_ids;
  const int32_t* expert_ids;
  const int32_t* total;
  const float* weights;
  const float* bias;
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // src-size 0 fills the 16 bytes with zeros and reads nothing.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

// One tile of the persistent loop: where it is and whose weights it multiplies.
struct TileCoord {
  int64_t m_tile, m0;
  int n0, expert;
  bool live;  // false: past the batch (or an expert id out of range); skipped by every role alike
};

// Raster: windows of kGroupM consecutive M tiles, each cut where the expert changes; within a piece (one
// expert's M tiles of the window) M runs fastest across every N tile. The tiles in flight then read each B tile
// once for all the piece's M tiles (an expert's ragged last tile too, whose B N-fastest read again from HBM:
// Mixtral T = 256 uniform on the 64-row tile, 1.39x its balanced time, H200 2026-12-03) and, at prefill, each
// gathered A tile once for all N tiles. Where each expert has one M tile it is N-fastest: one expert's
// consecutive weight rows stream together.
template <class G, class P>
__device__ __forceinline__ TileCoord tile_coord(const P& p, int64_t tile, int n_tiles, int64_t total) {
  constexpr int kGroupM = G::kGroupM;
  auto expert_of = [&](int64_t m_tile) -> int {  // -1 past the batch
    const int64_t m0 = m_tile * G::kBM;
    return m0 < total && m0 < p.capacity ? p.expert_ids[m_tile] : -1;
  };
  const int64_t q = tile / n_tiles;  // the M tile whose share of the tile space `tile` falls in
  const int expert = expert_of(q);
  int64_t lo = q, hi = q + 1;  // the piece: [lo, hi) of q's window, all of `expert`
  if constexpr (kGroupM > 1) {
    const int64_t w0 = q / kGroupM * kGroupM;
    while (lo > w0 && expert_of(lo - 1) == expert) --lo;
    while (hi < w0 + kGroupM && expert_of(hi) == expert) ++hi;
  }
  const int64_t within = tile - lo * n_tiles;  // the piece owns tiles [lo, hi) x n_tiles, in order
  const int len = int(hi - lo);
  TileCoord c;
  c.m_tile = lo + within % len;
  c.m0 = c.m_tile * G::kBM;
  c.n0 = int(within / len) * G::kBN;
  c.live = expert >= 0 && expert < p.experts;  // our layout writes ids below `experts`
  c.expert = c.live ? expert : -1;
  return c;
}

// The producer warpgroup of a fused kernel: every thread owns one 16-byte column chunk of BM/16 A rows (gathered
// by cp.async through sorted_ids: x's token row for Gather, the position's own row for Scatter; zeros on
// padding), thread 0 also issues B's TMA; one stage completes when all of them have landed. `P` is any params
// struct with the fields used here (the bf16 and the FP8 kernels').
template <class G, class P>
__device__ __forceinline__ void produce(const P& p, typename G::SharedStorage& ss, typename G::Pipeline& pipeline,
                                        int64_t num_tiles, int n_tiles, int64_t total, int k_tiles) {
  using Element = typename G::Element;
  constexpr int BM = G::kBM, BN = G::kBN, BK = G::kBK;
  if constexpr (G::kMmaThreads == 256) cutlass::arch::warpgroup_reg_dealloc<G::kProducerRegs>();
  const int t = int(threadIdx.x);
  const int chunk = t % G::kChunks, row0 = t / G::kChunks;
  const int kc = chunk * (16 / int(sizeof(Element)));  // element column of this chunk in a k-tile
  constexpr int kA = BM / G::kRowsPerPass;
  const auto* A = static_cast<const Element*>(p.a);
  Tensor sA = make_tensor(make_smem_ptr(ss.tensors.smem_A.data()), typename G::Mainloop::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(ss.tensors.smem_B.data()), typename G::Mainloop::SmemLayoutB{});
  Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.n, p.k, p.experts));
  auto tma = p.tma_b.get_slice(0);
  Tensor tBsB = tma.partition_D(sB);  // (TMA,TMA_N,TMA_K,PIPE)
  auto state = cutlass::make_producer_start_state<typename G::Pipeline>();
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord c = tile_coord<G>(p, tile, n_tiles, total);
    if (!c.live) continue;
    int a_src[kA];  // A row of each of this thread's tile rows, -1: zeros (padding, past the batch)
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kA; ++i) {
      const int64_t pos = c.m0 + row0 + i * G::kRowsPerPass;
      const int r = pos < total ? p.sorted_ids[pos] : -1;
      const bool placed = r >= 0 && r < p.rows;
      // Gather: x's row of the token; scatter: the position's own row of h (padding rows are never stored).
      a_src[i] = !placed ? -1 : (p.mode == FusedMode::Gather ? r / p.top_k : int(pos));
    }
    Tensor gB = local_tile(mB(_, _, c.expert), make_shape(Int<BN>{}, Int<BK>{}), make_coord(c.n0 / BN, _));
    Tensor tBgB = tma.partition_S(gB);  // (TMA,TMA_N,TMA_K,k)
    for (int kt = 0; kt < k_tiles; ++kt) {
      pipeline.producer_acquire(state);
      const int stage = state.index();
      if (t == 0) {
        // The stage completes once the 128 producer arrivals, their cp.asyncs and B's bytes have all landed.
        auto* bar = pipeline.producer_get_barrier(state);
        cutlass::arch::ClusterTransactionBarrier::expect_transaction(bar, G::kTmaBytesB);
        copy(p.tma_b.with(*bar), tBgB(_, _, _, kt), tBsB(_, _, _, stage));
      }
      const int kg = kt * BK + kc;
      const bool k_ok = kg < p.k;  // k % 8 == 0: a chunk is wholly inside or outside
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kA; ++i) {
        const bool ok = a_src[i] >= 0 && k_ok;
        cp_async_16(&sA(row0 + i * G::kRowsPerPass, kc, stage), ok ? A + int64_t(a_src[i]) * p.k + kg : A, ok);
      }
      // The thread's one arrival of the stage, made when its cp.asyncs have landed (`.noinc`: it counts towards the
      // 128 the barrier expects). Not CUTLASS's producer_commit(cpasync_barrier_arrive), which pairs an async
      // arrive that first raises the pending count with a plain arrive: the same synchronisation, but
      // compute-sanitizer's synccheck reports that pair as "Missing wait" and faults the kernel under the tool.
      cutlass::arch::cpasync_barrier_arrive_noinc(pipeline.producer_get_barrier(state));
      ++state;
    }
  }
  pipeline.producer_tail(state);
}

// Persistent: each CTA walks tiles blockIdx.x, + gridDim.x, ...; the producer runs ahead into the next tile
// while the consumers store the last one, and the pipeline state carries over between tiles.
template <class G>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    fused_moe_gemm_kernel(const __grid_constant__ Params<G> p, int64_t num_tiles) {
  using Element = typename G::Element;
  constexpr int BM = G::kBM, BN = G::kBN, BK = G::kBK;
  extern __shared__ __align__(128) char smem_raw[];
  auto& ss = *reinterpret_cast<typename G::SharedStorage*>(smem_raw);

  const int n_tiles = (p.n + BN - 1) / BN;
  const int64_t total = *p.total;
  const int k_tiles = (p.k + BK - 1) / BK;

  const int warp_group = int(threadIdx.x) / 128;
  typename G::Pipeline::Params pp;
  pp.role = warp_group == 0 ? G::Pipeline::ThreadCategory::Producer : G::Pipeline::ThreadCategory::Consumer;
  pp.producer_arv_count = 128;
  pp.consumer_arv_count = G::kMmaThreads;
  typename G::Pipeline pipeline(ss.pipeline, pp);
  __syncthreads();

  if (warp_group == 0) {
    produce<G>(p, ss, pipeline, num_tiles, n_tiles, total, k_tiles);
  } else {
    if constexpr (G::kMmaThreads == 256) cutlass::arch::warpgroup_reg_alloc<G::kConsumerRegs>();
    const int mma_thread = int(threadIdx.x) - 128;
    typename G::TiledMma tiled_mma;
    Tensor accum = partition_fragment_C(tiled_mma, make_shape(Int<BM>{}, Int<BN>{}));
    // GMMA's accumulator layout gives each thread two rows (m and m + 8 of its warp's 16) and adjacent column
    // pairs: the epilogue stores pairs as one word and looks its two rows up once per tile.
    static_assert(decltype(size<1>(accum))::value == 1 && decltype(size(accum))::value % 4 == 0);
    auto thr = tiled_mma.get_slice(mma_thread);
    Tensor coord = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    const int row_lo = get<0>(coord(0));
    typename G::Mainloop mainloop;
    typename G::PipelineState read_state;
    typename G::Mainloop::Params unused{};
    auto* D = static_cast<Element*>(p.d);
    for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord c = tile_coord<G>(p, tile, n_tiles, total);
      if (!c.live) continue;
      // Destination row (or -1) and router weight of this thread's two rows, loaded before the mainloop hides
      // their latency.
      int64_t dst[2];
      float w[2];
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int64_t pos = c.m0 + row_lo + 8 * h;
        dst[h] = -1;
        w[h] = 1.0f;
        if (pos < total) {
          if (p.mode == FusedMode::Gather) {
            dst[h] = pos;
          } else {
            const int r = p.sorted_ids[pos];
            if (r >= 0 && r < p.rows) {
              dst[h] = r;
              w[h] = p.weights ? p.weights[r] : 1.0f;
            }
          }
        }
      }
      mainloop.mma(pipeline, read_state, accum, k_tiles, mma_thread, ss.tensors, unused);
      mainloop.mma_tail(pipeline, read_state, k_tiles);
      read_state.advance(k_tiles);

      const float* bias = p.bias ? p.bias + int64_t(c.expert) * p.n : nullptr;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); i += 2) {
        const int h = get<0>(coord(i)) == row_lo ? 0 : 1;
        const int n = c.n0 + get<1>(coord(i));
        if (dst[h] < 0 || n >= p.n) continue;
        Element v0, v1;
        if (p.mode == FusedMode::Gather) {
          v0 = Element(accum(i));
          v1 = Element(accum(i + 1));
        } else {
          const float b0 = bias ? bias[n] : 0.0f, b1 = bias ? bias[n + 1] : 0.0f;
          // GEMM2 rounds to the element type before the bias and the router weight, as the other backends do.
          v0 = Element((float(Element(accum(i))) + b0) * w[h]);
          v1 = Element((float(Element(accum(i + 1))) + b1) * w[h]);
        }
        // n is even and n + 1 < N (N % 8 == 0): one aligned 4-byte store.
        cutlass::Array<Element, 2> pair;
        pair[0] = v0;
        pair[1] = v1;
        *reinterpret_cast<cutlass::Array<Element, 2>*>(D + dst[h] * p.n + n) = pair;
      }
    }
  }
}

// Tiles the aligned layout can have for `rows` flat rows over `experts` local experts (each expert with rows
// adds at most BM - 1 rows of padding), and at most the layout's capacity.
inline int64_t tile_bound(int64_t rows, int64_t experts, int64_t capacity, int bm) {
  const int64_t active = experts < rows ? experts : rows;
  const int64_t by_rows = (rows + active * (bm - 1)) / bm;
  const int64_t by_cap = capacity / bm;
  return by_rows < by_cap ? by_rows : by_cap;
}

template <class G>
Status run(const FusedGemmArgs& a) {
  // Whole raster groups of M tiles (tiles past the batch return at once).
  const int64_t m_tiles = (tile_bound(a.rows, a.experts, a.capacity, G::kBM) + G::kGroupM - 1) / G::kGroupM * G::kGroupM;
  const int64_t n_tiles = (a.n + G::kBN - 1) / G::kBN;
  if (m_tiles == 0 || n_tiles == 0) return {StatusCode::Ok, 0};
  if (m_tiles * n_tiles > 0x7fffffff) return {StatusCode::CutlassCannotImplement, 0};
  const Params<G> p{G::make_tma_b(reinterpret_cast<const typename G::Element*>(a.b), a.n, a.k, a.experts),
                    a.mode,
                 a.top_k,
                 a.experts,
                 a.n,
                 a.k,
                 a.rows,
                 a.capacity,
                 reinterpret_cast<const void*>(a.a),
                 reinterpret_cast<void*>(a.d),
                 reinterpret_cast<const int32_t*>(a.sorted_ids),
                 reinterpret_cast<const int32_t*>(a.expert_ids),
                 reinterpret_cast<const int32_t*>(a.total),
                 reinterpret_cast<const float*>(a.weights),
                 reinterpret_cast<const float*>(a.bias)};
  // The SM count is the plan's fact about the stream's device (not cudaGetDevice's), and the shared-memory opt-in
  // was made once by prepare<G>: a launch queries and sets nothing.
  if (a.sm_count <= 0) return {StatusCode::Cuda, static_cast<int32_t>(cudaErrorInvalidValue)};
  const int64_t tiles = m_tiles * n_tiles;
  const int64_t slots = int64_t(a.sm_count) * G::kMinBlocks;
  const int64_t ctas = tiles < slots ? tiles : slots;
  fused_moe_gemm_kernel<G><<<unsigned(ctas), G::kThreads, G::kSmem, reinterpret_cast<cudaStream_t>(a.stream)>>>(p, tiles);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

// Opts the kernel of G into its dynamic shared memory on the current device: once per plan, not per launch.
template <class G>
Status prepare() {
  const cudaError_t e =
      cudaFuncSetAttribute(fused_moe_gemm_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmem);
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

// The tiles, named as in fused/launch.h's FusedTile. The 64-row tile runs two CTAs per SM (4 x 24 KiB stages each),
// so one CTA's prologue and epilogue overlap the other's streaming. The 128 x 256 tile (4 x 48 KiB) halves the
// operand traffic per FLOP of a 128 x 128 one, which measured 1.2-1.4x slower at prefill (H200, 2026-11-29).
template <class E>
using M64N128K64 = FusedGemm<E, 64, 128, 64, 4, 2, 4>;
template <class E>
using M128N256K64 = FusedGemm<E, 128, 256, 64, 4, 1, 8>;

template <class E>
Status run_tile(const FusedGemmArgs& a) {
  switch (a.tile) {
    case FusedTile::M64N128K64: return run<M64N128K64<E>>(a);
    case FusedTile::M128N256K64: return run<M128N256K64<E>>(a);
  }
  return {StatusCode::NotBuilt, 0};
}

template <class E>
Status prepare_tile(FusedTile tile) {
  switch (tile) {
    case FusedTile::M64N128K64: return prepare<M64N128K64<E>>();
    case FusedTile::M128N256K64: return prepare<M128N256K64<E>>();
  }
  return {StatusCode::NotBuilt, 0};
}

}  // namespace fused
}  // namespace moe_gemm
