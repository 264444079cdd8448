// SM90 FP8 blockwise-scaled persistent ptr-array grouped GEMM (CUTLASS 4.2, TMA warp-specialized), driven by
// device offsets: DeepSeek-V3's recipe. A e4m3 with one f32 scale per row per 128 of K, B e4m3 with one f32 scale
// per 128 x 128 block, f32 accumulation promoted (scaled by sfa * sfb and added with FFMA) once per 128 of K,
// bf16 D. See launch_fp8.h for the operands.
//
// Included only by grouped_gemm_sm90_fp8_blockwise.inl, which lists the configurations it instantiates. As for
// the bf16 GEMM (grouped_gemm_sm90.cuh), a kernel of ours turns the device offsets into CUTLASS's per-group
// shapes, pointers and strides inside the caller's workspace; here it also points each group at its scales.
// That kernel, the arrays and the launch are fp8_blockwise_groups.cuh's, shared with the SM100 unit.
//
// Scales in grouped mode (CUTLASS 4.2): the blockwise mainloop rebuilds each group's scale layout from the
// group's (M, N, K) in `load_init` (called from `tensors_perform_update`) and never reads the `layout_SFA/SFB`
// arrays. A group's scales must therefore be compact at the default strides of its own shape, which K-major
// scales are: group g's SFA is the [M_g, ceil(K/128)] block at row_start * ceil(K/128) of the [max_rows,
// ceil(K/128)] array, and its SFB the [ceil(N/128), ceil(K/128)] grid of expert g. (A global MN-major
// [ceil(K/128), max_rows] SFA would be read wrongly for every group but the first.) We still fill the layout
// arrays with the same per-group layouts, so that a CUTLASS that honours them reads the same scales.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "fp8_blockwise/fp8_blockwise_groups.cuh"
#include "common/fp8_schedules.cuh"
#include "fp8_blockwise/swapab_decode.cuh"

#if !defined(CUTLASS_ARCH_MMA_SM90A_SUPPORTED) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "grouped_gemm_sm90_fp8 must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace moe_gemm {
namespace sm90_fp8 {

using namespace cute;

// DeepSeek-V3 block scaling: activations 1 x 128 (per row, per 128 of K), weights 128 x 128; both grids K-major
// (the K blocks of one row of blocks are contiguous).
using fp8_blockwise::kScaleK;
using fp8_blockwise::kScaleM;
using fp8_blockwise::kScaleN;
using ScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<kScaleM, kScaleN, kScaleK, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using fp8_schedules::ScheduleTraits;  // FastAccum listed there too, so the facts would say so (the static_asserts
                                     // below refuse it first)

// Whether a mainloop dispatch policy is the two-level (blockwise) one.
template <class P>
struct IsBlockwisePolicy : std::false_type {};
template <int S, class C, class K>
struct IsBlockwisePolicy<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise<S, C, K>> : std::true_type {};

// Schedules and tiles, named as in launch_fp8.h's Fp8TileConfig.
using fp8_schedules::Config;
using fp8_schedules::CoopEpi;
using fp8_schedules::PingEpi;
using CoopBlockwise = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
using PingBlockwise = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;

using Cooperative128x128x128 = Config<Shape<_128, _128, _128>, CoopBlockwise, CoopEpi>;
using Pingpong64x128x128 = Config<Shape<_64, _128, _128>, PingBlockwise, PingEpi>;

template <class Cfg>
struct Builders {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B stored [N, K] row-major == K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16 e4m3: 16-byte TMA rows
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;   // 8 bf16

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no source tensor C: beta is 0 and C is never read
      ElementD, LayoutD*, kAlignD, typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
};

// The arrays, arguments, workspace, prepare kernel and launch are fp8_blockwise's (shared with SM100).
template <class Cfg>
struct GroupedGemmFp8Sm90 : fp8_blockwise::Groups<typename Builders<Cfg>::Kernel, ScaleConfig> {
  using Base = fp8_blockwise::Groups<typename Builders<Cfg>::Kernel, ScaleConfig>;
  using CollectiveMainloop = typename Base::CollectiveMainloop;

  // What the mainloop made of our types: checked here, at compile time, and reported by facts().
  using Schedule = typename Cfg::KernelSchedule;
  static constexpr int kTileK = static_cast<int>(size<2>(typename Cfg::Tile{}));
  static constexpr int kMmaK = static_cast<int>(size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}));
  static constexpr int kPromotionK = CollectiveMainloop::ScalePromotionInterval * kMmaK;
  static_assert(ScheduleTraits<Schedule>::name != nullptr, "an FP8 ptr-array schedule this family knows by name");
  static_assert(!ScheduleTraits<Schedule>::fast_accumulation, "blockwise scaling never uses FastAccum");
  static_assert(IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value,
                "the builder must pick the two-level blockwise mainloop");
  static_assert(!CollectiveMainloop::MMajorSFA && !CollectiveMainloop::NMajorSFB, "K-major SFA and SFB");
  static_assert(kTileK == kScaleK && kPromotionK == kScaleK,
                "TileK = 128 and one promotion per scale block of K");

  static Fp8KernelFacts facts() {
    return Base::template kernel_facts<typename Cfg::Tile, typename Cfg::Cluster>(
        1,  // wgmma: one SM per MMA
        IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value,
        ScheduleTraits<Schedule>::fast_accumulation, kPromotionK);
  }
};

using fp8_blockwise::run;

}  // namespace sm90_fp8
}  // namespace moe_gemm

// Defines the entry points of launch_fp8.h from an X-macro list of CUTLASS configurations:
//   X(Cooperative128x128x128) X(Pingpong64x128x128)
// and SwapAb16 (swapab_decode.cuh), which every SM90 unit carries.
#define MOE_GEMM_DEFINE_SM90_FP8_BLOCKWISE(CONFIGS)                                                           \
  namespace moe_gemm {                                                                                      \
  bool grouped_gemm_sm90_fp8_blockwise_built(Fp8TileConfig c) {                                             \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_BUILT)                                                                      \
      case Fp8TileConfig::SwapAb16: return true;                                                            \
      default: return false;                                                                                \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_workspace(Fp8TileConfig c, int32_t g, int32_t sms, uint64_t* bytes) { \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_WORKSPACE)                                                                  \
      case Fp8TileConfig::SwapAb16: *bytes = 0; return {StatusCode::Ok, 0};                                 \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_run(const GroupedGemmFp8Args& p) {                                 \
    switch (p.config) {                                                                                     \
      CONFIGS(MOE_GEMM_FP8_CASE_RUN)                                                                        \
      case Fp8TileConfig::SwapAb16: return fp8_swapab::run(p, fp8_blockwise::check_problem(p));             \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_facts(Fp8TileConfig c, Fp8KernelFacts* facts) {                    \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_FACTS)                                                                      \
      case Fp8TileConfig::SwapAb16: *facts = fp8_swapab::facts(); return {StatusCode::Ok, 0};               \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  const char* grouped_gemm_sm90_fp8_blockwise_schedule(Fp8TileConfig c) {                                   \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_SCHEDULE)                                                                   \
      case Fp8TileConfig::SwapAb16: return fp8_swapab::kSchedule;                                           \
      default: return "";                                                                                   \
    }                                                                                                       \
  }                                                                                                         \
  }
#define MOE_GEMM_FP8_CASE_BUILT(CFG) \
  case Fp8TileConfig::CFG:           \
    return true;
#define MOE_GEMM_FP8_CASE_WORKSPACE(CFG)                                                         \
  case Fp8TileConfig::CFG:                                                                       \
    *bytes = grouped_run::workspace_bytes<sm90_fp8::GroupedGemmFp8Sm90<sm90_fp8::CFG>>(g, sms);   \
    return {StatusCode::Ok, 0};
#define MOE_GEMM_FP8_CASE_RUN(CFG) \
  case Fp8TileConfig::CFG:         \
    return sm90_fp8::run<sm90_fp8::GroupedGemmFp8Sm90<sm90_fp8::CFG>>(p);
#define MOE_GEMM_FP8_CASE_FACTS(CFG)                                \
  case Fp8TileConfig::CFG:                                          \
    *facts = sm90_fp8::GroupedGemmFp8Sm90<sm90_fp8::CFG>::facts();  \
    return {StatusCode::Ok, 0};
#define MOE_GEMM_FP8_CASE_SCHEDULE(CFG) \
  case Fp8TileConfig::CFG:              \
    return sm90_fp8::ScheduleTraits<sm90_fp8::CFG::KernelSchedule>::name;
