// SM90 FP8 rowwise-scaled persistent ptr-array grouped GEMM (CUTLASS 4.2, TMA warp-specialized), driven by
// device offsets: per-token activation scales times per-channel weight scales, applied once to the f32
// accumulator in the epilogue (the recipe of vLLM's `cutlass_moe_mm` and PyTorch's rowwise
// `_scaled_grouped_mm`; per-tensor scales are its special case). See launch_fp8_rowwise.h for the operands.
//
// Included only by grouped_gemm_sm90_fp8_rowwise.cu, which lists the configurations it instantiates. Our
// prepare kernel turns the device offsets into CUTLASS's per-group shapes, pointers and strides inside the
// caller's workspace, and points each group at its scale vectors: the epilogue's column broadcast (one value per
// row of D) reads sa[g] = sa + row_start, the row broadcast (one value per column of D) sb[g] = sb + g * n.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "common/fp8_schedules.cuh"
#include "common/group_rows.cuh"
#include "common/grouped_run.cuh"
#include "fp8_rowwise/launch_fp8_rowwise.h"

#if !defined(CUTLASS_ARCH_MMA_SM90A_SUPPORTED) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "grouped_gemm_sm90_fp8_rowwise must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace moe_gemm {
namespace sm90_fp8_rowwise {

using namespace cute;

using fp8_schedules::ScheduleTraits;

// Whether the builder picked the FP8 mainloop that promotes partial sums into f32 registers.
template <class P>
struct IsPromotingPolicy : std::false_type {};
template <int S, class C, class K>
struct IsPromotingPolicy<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecializedFP8<S, C, K>> : std::true_type {};

using fp8_schedules::Config;
using fp8_schedules::CoopEpi;
using fp8_schedules::PingEpi;
using FastAccumPingpong64x128x128 =
    Config<Shape<_64, _128, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum, PingEpi>;
using FastAccumCooperative128x128x128 =
    Config<Shape<_128, _128, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum, CoopEpi>;
using PromotedCooperative128x128x128 =
    Config<Shape<_128, _128, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, CoopEpi>;

// The partial sums are promoted every this many MMAs (CUTLASS's default `mma_promotion_interval`).
constexpr int kPromotionMmas = 4;

template <class Cfg>
struct GroupedGemmFp8Rowwise {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B stored [N, K] row-major == K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using Tile = typename Cfg::Tile;

  // D = bf16(sb[n] * (sa[m] * acc)): the per-token scale is a column vector (one value per row m of D, read one
  // by one: a group starts at any row), the per-channel scale a row vector (one per column n, 16-byte loads).
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, float*, float, Stride<_1, _0, _0>, 1>;
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, float*, float, Stride<_0, _1, _0>, 4>;
  using Mul = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                                     cutlass::FloatRoundStyle::round_to_nearest>;
  using Cast = cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, float,
                                                      cutlass::FloatRoundStyle::round_to_nearest>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      Mul, ScaleB, cutlass::epilogue::fusion::Sm90EVT<Mul, ScaleA, cutlass::epilogue::fusion::Sm90AccFetch>>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Cast, Scaled>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no source tensor C
      ElementD, LayoutD*, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignAB, ElementB, LayoutB*,
      kAlignAB, float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  using Schedule = typename Cfg::KernelSchedule;
  static constexpr bool kFast = ScheduleTraits<Schedule>::fast_accumulation;
  static constexpr bool kPromoting = IsPromotingPolicy<typename CollectiveMainloop::DispatchPolicy>::value;
  static constexpr int kMmaK = static_cast<int>(size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}));
  static_assert(ScheduleTraits<Schedule>::name != nullptr, "an FP8 ptr-array schedule this family knows by name");
  static_assert(kFast != kPromoting, "FastAccum schedules never promote; the plain schedule must promote");

  struct Arrays {
    UnderlyingShape* shapes;
    const ElementA** a;
    const ElementB** b;
    ElementD** d;
    const float** sa;
    const float** sb;
    StrideA* da;
    StrideB* db;
    StrideD* dd;
    uint64_t bytes;
  };

  static Arrays carve(uint8_t* base, int groups) {
    grouped_run::Carver c{base};
    const uint64_t g = static_cast<uint64_t>(groups);
    Arrays r{c.take<UnderlyingShape>(g), c.take<const ElementA*>(g), c.take<const ElementB*>(g),
             c.take<ElementD*>(g),       c.take<const float*>(g),    c.take<const float*>(g),
             c.take<StrideA>(g),         c.take<StrideB>(g),         c.take<StrideD>(g),
             0};
    r.bytes = c.bytes;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    auto args = grouped_run::base_arguments<Gemm>(groups, arr.shapes, arr.a, arr.da, arr.b, arr.db, arr.d, arr.dd,
                                                  device, sm_count);
    // EVT arguments nest as the tree: Cast{ Scaled{ ScaleB, Inner{ ScaleA, Acc, Mul }, Mul }, Cast-op }.
    auto& scaled = args.epilogue.thread;
    scaled = {{{arr.sb}, {{arr.sa}, {}, {}}, {}}, {}};
    return args;
  }

  static Fp8KernelFacts facts() {
    Fp8KernelFacts f{};
    f.tile_m = static_cast<int>(size<0>(Tile{}));
    f.tile_n = static_cast<int>(size<1>(Tile{}));
    f.tile_k = static_cast<int>(size<2>(Tile{}));
    f.cluster_m = size<0>(typename Cfg::Cluster{});
    f.cluster_n = size<1>(typename Cfg::Cluster{});
    f.sms_per_mma = 1;  // wgmma: one SM per MMA
    f.scale_m = 1;
    f.scale_n = 1;
    f.scale_k = 0;
    f.sfa_k_major = true;
    f.sfb_k_major = true;
    f.blockwise_mainloop = false;
    f.fast_accumulation = kFast;
    f.promotion_k = kPromoting ? kPromotionMmas * kMmaK : 0;
    f.stages = CollectiveMainloop::DispatchPolicy::Stages;
    return f;
  }
};

// One thread per group: group rows (group_rows.cuh, clamped and reported) -> shapes, operand and scale
// pointers and strides.
template <class G>
__global__ void prepare_rowwise_groups(GroupMode mode, const int32_t* __restrict__ offsets,
                                       const int32_t* __restrict__ counts, int max_m, int groups, int n, int k,
                                       int64_t max_rows, const typename G::Arrays arr, const void* a,
                                       const float* sa, const void* b, const float* sb, void* d,
                                       uint32_t* error_word) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const group_rows::Group r = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, g, max_rows);
  const int64_t n64 = n, k64 = k;
  arr.shapes[g] = typename G::UnderlyingShape{r.m, n, k};
  arr.a[g] = static_cast<const typename G::ElementA*>(a) + r.lo * k64;
  arr.b[g] = static_cast<const typename G::ElementB*>(b) + static_cast<int64_t>(g) * n64 * k64;
  arr.d[g] = static_cast<typename G::ElementD*>(d) + r.lo * n64;
  arr.sa[g] = sa + r.lo;
  arr.sb[g] = sb + static_cast<int64_t>(g) * n64;
  arr.da[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(r.m, k, 1));
  arr.db[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(n, k, 1));
  arr.dd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(r.m, n, 1));
  if (r.err) atomicOr(error_word, r.err);
}

inline Status check_problem(const GroupedGemmFp8RowwiseArgs& p) {
  const auto refuse = [](cutlass::Status s) { return Status{StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)}; };
  if (p.mode != GroupMode::Offsets && p.mode != GroupMode::Padded && p.mode != GroupMode::Masked) {
    return refuse(cutlass::Status::kErrorNotSupported);
  }
  if (p.groups < 0 || p.n <= 0 || p.n % 16 != 0 || p.k <= 0 || p.k % 16 != 0 || p.max_rows < 0 || p.max_m < 0 ||
      (p.mode == GroupMode::Masked && static_cast<int64_t>(p.groups) * p.max_m > p.max_rows)) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  if ((p.a | p.b | p.d | p.sb) % 16 != 0 || p.sa % 4 != 0 || p.a == 0 || p.b == 0 || p.d == 0 || p.sa == 0 ||
      p.sb == 0) {
    return refuse(cutlass::Status::kErrorMisalignedOperand);
  }
  if (p.mode != GroupMode::Masked && p.offsets == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  if (p.mode != GroupMode::Offsets && p.counts == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  return {StatusCode::Ok, 0};
}

template <class G>
Status run(const GroupedGemmFp8RowwiseArgs& p) {
  return grouped_run::run<G>(p, check_problem(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    prepare_rowwise_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        p.mode, reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts), p.max_m,
        p.groups, p.n, p.k, p.max_rows, arr, reinterpret_cast<const void*>(p.a),
        reinterpret_cast<const float*>(p.sa), reinterpret_cast<const void*>(p.b),
        reinterpret_cast<const float*>(p.sb), reinterpret_cast<void*>(p.d), reinterpret_cast<uint32_t*>(p.status));
    return grouped_run::launched();
  });
}

}  // namespace sm90_fp8_rowwise
}  // namespace moe_gemm
