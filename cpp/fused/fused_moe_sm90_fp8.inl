// Included once, by fused_moe_sm90.cu. SM90 fused MoE GEMMs over block-FP8 operands (fused/launch.h): the bf16
// fused kernels' layout, producer and epilogue (fused_moe_sm90.cuh) with e4m3 A and B, TileK = one 128-wide scale
// block, and a consumer that promotes each k-tile's tensor-core sum into f32 accumulators with its scales: accum +=
// part * sfa[row] * sfb. The scales of a k-tile are loaded while its MMAs run. kChannel (per-channel scales): accum
// += part, then accum * sfa[row] * sfb[n] once before the epilogue.
#include "fused/fused_moe_sm90.cuh"
#include "fused/launch.h"

namespace moe_gemm {
namespace fused {

template <class G>
struct Fp8Params {
  typename G::TmaB tma_b;
  FusedMode mode;
  int32_t top_k, experts, n, k, rows;
  int64_t capacity;
  int32_t k_blocks, n_blocks;  // of the scale grids: ceil(K / 128), ceil(N / 128)
  const void* a;
  const float* sfa;
  const float* sfb;
  cutlass::bfloat16_t* d;
  const int32_t* sorted_ids;
  const int32_t* expert_ids;
  const int32_t* total;
  const float* weights;
  const float* bias;
};

template <class G, bool kChannel>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    fused_moe_fp8_kernel(const __grid_constant__ Fp8Params<G> p, int64_t num_tiles) {
  constexpr int BM = G::kBM, BN = G::kBN, BK = G::kBK;
  static_assert(BK == 128, "one k-tile per scale block of K");
  static_assert(128 % BN == 0, "an N tile within one scale block of N");
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
    return;
  }
  if constexpr (G::kMmaThreads == 256) cutlass::arch::warpgroup_reg_alloc<G::kConsumerRegs>();
  const int mma_thread = int(threadIdx.x) - 128;
  typename G::TiledMma tiled_mma;
  auto thr = tiled_mma.get_slice(mma_thread);
  Tensor sA = make_tensor(make_smem_ptr(ss.tensors.smem_A.data()), typename G::Mainloop::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(ss.tensors.smem_B.data()), typename G::Mainloop::SmemLayoutB{});
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor accum = partition_fragment_C(tiled_mma, make_shape(Int<BM>{}, Int<BN>{}));
  Tensor part = partition_fragment_C(tiled_mma, make_shape(Int<BM>{}, Int<BN>{}));
  static_assert(decltype(size<1>(accum))::value == 1 && decltype(size(accum))::value % 4 == 0);
  Tensor coord = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
  const int row_lo = get<0>(coord(0));
  typename G::PipelineState read_state;
  auto* D = p.d;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord c = tile_coord<G>(p, tile, n_tiles, total);
    if (!c.live) continue;
    // This thread's two rows: where they are stored, their router weight, and the A row whose scales they take
    // (-1: padding, which the producer loaded as zeros; its scale is 0, never read).
    int64_t dst[2];
    float w[2];
    int64_t a_row[2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t pos = c.m0 + row_lo + 8 * h;
      dst[h] = -1;
      w[h] = 1.0f;
      a_row[h] = -1;
      if (pos < total) {
        const int r = p.sorted_ids[pos];
        const bool placed = r >= 0 && r < p.rows;
        if (p.mode == FusedMode::Gather) {
          dst[h] = pos;
          if (placed) a_row[h] = r / p.top_k;
        } else if (placed) {
          dst[h] = r;
          a_row[h] = pos;
          w[h] = p.weights ? p.weights[r] : 1.0f;
        }
      }
    }
    const float* sfb = kChannel ? p.sfb + int64_t(c.expert) * p.n + c.n0
                                : p.sfb + (int64_t(c.expert) * p.n_blocks + c.n0 / 128) * p.k_blocks;
    clear(accum);
    for (int kt = 0; kt < k_tiles; ++kt) {
      auto token = pipeline.consumer_try_wait(read_state);
      pipeline.consumer_wait(read_state, token);
      const int stage = read_state.index();
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // This k-tile's scales, while the MMAs run (per channel: none; the sum goes in unscaled).
      float s0 = 1.0f, s1 = 1.0f;
      if constexpr (!kChannel) {
        const float sb = sfb[kt];
        s0 = a_row[0] >= 0 ? p.sfa[a_row[0] * p.k_blocks + kt] * sb : 0.0f;
        s1 = a_row[1] >= 0 ? p.sfa[a_row[1] * p.k_blocks + kt] * sb : 0.0f;
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(part);
      pipeline.consumer_release(read_state);
      ++read_state;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        accum(i) += kChannel ? part(i) : part(i) * (get<0>(coord(i)) == row_lo ? s0 : s1);
      }
    }
    if constexpr (kChannel) {
      // The whole dot product scaled once: its row's and its channel's scales (padding rows: 0, never stored).
      const float s0 = a_row[0] >= 0 ? p.sfa[a_row[0]] : 0.0f;
      const float s1 = a_row[1] >= 0 ? p.sfa[a_row[1]] : 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        const int n = c.n0 + get<1>(coord(i));
        const float sb = n < p.n ? sfb[get<1>(coord(i))] : 0.0f;
        accum(i) = accum(i) * (get<0>(coord(i)) == row_lo ? s0 : s1) * sb;
      }
    }
    const float* bias = p.bias ? p.bias + int64_t(c.expert) * p.n : nullptr;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      const int h = get<0>(coord(i)) == row_lo ? 0 : 1;
      const int n = c.n0 + get<1>(coord(i));
      if (dst[h] < 0 || n >= p.n) continue;
      cutlass::bfloat16_t v0, v1;
      if (p.mode == FusedMode::Gather) {
        v0 = cutlass::bfloat16_t(accum(i));
        v1 = cutlass::bfloat16_t(accum(i + 1));
      } else {
        const float b0 = bias ? bias[n] : 0.0f, b1 = bias ? bias[n + 1] : 0.0f;
        // Rounded to bf16 before the bias and the router weight, as the bf16 kernels and the other backends.
        v0 = cutlass::bfloat16_t((float(cutlass::bfloat16_t(accum(i))) + b0) * w[h]);
        v1 = cutlass::bfloat16_t((float(cutlass::bfloat16_t(accum(i + 1))) + b1) * w[h]);
      }
      cutlass::Array<cutlass::bfloat16_t, 2> pair;
      pair[0] = v0;
      pair[1] = v1;
      *reinterpret_cast<cutlass::Array<cutlass::bfloat16_t, 2>*>(D + dst[h] * p.n + n) = pair;
    }
  }
}

template <class G>
Status run_fp8(const FusedGemmFp8Args& a) {
  const int64_t m_tiles = (tile_bound(a.rows, a.experts, a.capacity, G::kBM) + G::kGroupM - 1) / G::kGroupM * G::kGroupM;
  const int64_t n_tiles = (a.n + G::kBN - 1) / G::kBN;
  if (m_tiles == 0 || n_tiles == 0) return {StatusCode::Ok, 0};
  if (m_tiles * n_tiles > 0x7fffffff || a.n % G::kBN != 0 || a.k % 16 != 0) {
    return {StatusCode::CutlassCannotImplement, 0};
  }
  if (a.sm_count <= 0) return {StatusCode::Cuda, static_cast<int32_t>(cudaErrorInvalidValue)};
  using E = cutlass::float_e4m3_t;
  Fp8Params<G> p{G::make_tma_b(reinterpret_cast<const E*>(a.b), a.n, a.k, a.experts),
                 a.mode,
                 a.top_k,
                 a.experts,
                 a.n,
                 a.k,
                 a.rows,
                 a.capacity,
                 (a.k + 127) / 128,
                 (a.n + 127) / 128,
                 reinterpret_cast<const void*>(a.a),
                 reinterpret_cast<const float*>(a.sfa),
                 reinterpret_cast<const float*>(a.sfb),
                 reinterpret_cast<cutlass::bfloat16_t*>(a.d),
                 reinterpret_cast<const int32_t*>(a.sorted_ids),
                 reinterpret_cast<const int32_t*>(a.expert_ids),
                 reinterpret_cast<const int32_t*>(a.total),
                 reinterpret_cast<const float*>(a.weights),
                 reinterpret_cast<const float*>(a.bias)};
  const int64_t tiles = m_tiles * n_tiles;
  const int64_t slots = int64_t(a.sm_count) * G::kMinBlocks;
  const int64_t ctas = tiles < slots ? tiles : slots;
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.scales == FusedFp8Scales::Channel)
    fused_moe_fp8_kernel<G, true><<<unsigned(ctas), G::kThreads, G::kSmem, s>>>(p, tiles);
  else
    fused_moe_fp8_kernel<G, false><<<unsigned(ctas), G::kThreads, G::kSmem, s>>>(p, tiles);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

template <class G>
Status prepare_fp8() {
  // Both scale forms of the tile.
  cudaError_t e =
      cudaFuncSetAttribute(fused_moe_fp8_kernel<G, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmem);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(fused_moe_fp8_kernel<G, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmem);
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

// The decode tile: 64 x 64 (half the bf16 tile's N: its part accumulators double the registers, and two CTAs
// per SM keep 128 each), four 16 KiB stages. The prefill tile: 128 x 128, two consumer warpgroups.
using Fp8M64N64K128 = FusedGemm<cutlass::float_e4m3_t, 64, 64, 128, 4, 2, 1>;
using Fp8M128N128K128 = FusedGemm<cutlass::float_e4m3_t, 128, 128, 128, 4, 1, 8>;

}  // namespace fused

Status fused_moe_gemm_fp8(const FusedGemmFp8Args& a) {
  switch (a.tile) {
    case FusedFp8Tile::M64N64K128: return fused::run_fp8<fused::Fp8M64N64K128>(a);
    case FusedFp8Tile::M128N128K128: return fused::run_fp8<fused::Fp8M128N128K128>(a);
  }
  return {StatusCode::NotBuilt, 0};
}

Status fused_moe_prepare_fp8(FusedFp8Tile tile) {
  switch (tile) {
    case FusedFp8Tile::M64N64K128: return fused::prepare_fp8<fused::Fp8M64N64K128>();
    case FusedFp8Tile::M128N128K128: return fused::prepare_fp8<fused::Fp8M128N128K128>();
  }
  return {StatusCode::NotBuilt, 0};
}

}  // namespace moe_gemm
