// SM100 (sm_100a) FP8 blockwise-scaled persistent ptr-array grouped GEMM (CUTLASS 4.2, tcgen05 UMMA with the f32
// partial sums of each 128 of K read out of tensor memory, scaled by sfa * sfb and added with FFMA): DeepSeek-V3's
// 1 x 128 / 128 x 128 recipe on Blackwell, reading the operands of the SM90 kernel (launch_fp8.h) through the same
// prepare kernel and launcher (fp8_blockwise_groups.cuh). The SM100 mainloop reads the per-group layout_SFA/SFB
// arrays the prepare kernel writes. Included only by grouped_gemm_sm100_fp8.cu. Never run on hardware:
// compiled, SASS-checked (tests/sass.rs), refused on other arches by the plan.
#pragma once

#include <type_traits>

#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "common/sm100_config.cuh"
#include "fp8_blockwise/fp8_blockwise_groups.cuh"
#include "common/fp8_schedules.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "grouped_gemm_sm100_fp8 must be compiled for sm_100a only (-gencode=arch=compute_100a,code=sm_100a)"
#endif

namespace moe_gemm {
namespace sm100_fp8 {

using namespace cute;
using fp8_blockwise::kScaleK;
using fp8_blockwise::kScaleM;
using fp8_blockwise::kScaleN;

// K-major SFA and SFB, as on SM90: Fp8Rows' [rows, ceil(K/128)] and Fp8BlockWeights' per-expert grids unchanged.
using ScaleConfig =
    cutlass::detail::Sm100BlockwiseScaleConfig<kScaleM, kScaleN, kScaleK, cute::UMMA::Major::K, cute::UMMA::Major::K>;

template <class P>
struct IsBlockwisePolicy : std::false_type {};
template <int S, int SP, int AP, class C>
struct IsBlockwisePolicy<cutlass::gemm::MainloopSm100ArrayTmaUmmaWarpSpecializedBlockwiseScaling<S, SP, AP, C>>
    : std::true_type {};

// MMA tile, kernel and epilogue schedule: one SM in a 1x1x1 cluster, or for a 2-SM schedule the two SMs of a
// static 2x1x1 cluster, 128 rows each (sm100_config.cuh).
template <class MmaTile_, class Kernel_, class Epilogue_>
struct Config : Sm100Config<MmaTile_, Kernel_, Epilogue_> {};
using Blockwise1Sm128x128x128 = Config<Shape<_128, _128, _128>,
                                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedBlockwise1SmSm100,
                                       cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
// Each SM's CTA tile stays 128x128x128: one 128 x 128 weight scale block per CTA, as in the 1-SM tile.
using Blockwise2Sm256x128x128 = Config<Shape<_256, _128, _128>,
                                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedBlockwise2SmSm100,
                                       cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm>;

template <class Cfg>
struct Builders {
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B stored [N, K] row-major == K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlignAB = 16;  // e4m3: 16-byte TMA rows
  static constexpr int kAlignD = 8;    // bf16
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, typename Cfg::MmaTile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, cutlass::bfloat16_t,
      LayoutD*, kAlignD, typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, float, void, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, cutlass::float_e4m3_t, cute::tuple<LayoutA*, LayoutSFA*>,
      kAlignAB, cutlass::float_e4m3_t, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, typename Cfg::MmaTile,
      typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<Shape<int, int, int>>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
};

template <class Cfg>
struct GroupedGemmFp8Sm100 : fp8_blockwise::Groups<typename Builders<Cfg>::Kernel, ScaleConfig> {
  using Base = fp8_blockwise::Groups<typename Builders<Cfg>::Kernel, ScaleConfig>;
  using CollectiveMainloop = typename Base::CollectiveMainloop;
  using Schedule = typename Cfg::KernelSchedule;
  static constexpr int kTileK = static_cast<int>(size<2>(typename Cfg::MmaTile{}));
  static constexpr int kMmaK = static_cast<int>(size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}));
  // The mainloop scales and adds the tensor-memory partial sum once per K_BLOCK_MMAS_PER_SCALE_K MMAs.
  static constexpr int kPromotionK = CollectiveMainloop::K_BLOCK_MMAS_PER_SCALE_K * kMmaK;
  static_assert(fp8_schedules::ScheduleTraits<Schedule>::name != nullptr, "a schedule this family knows by name");
  static_assert(!fp8_schedules::ScheduleTraits<Schedule>::fast_accumulation, "blockwise scaling never uses FastAccum");
  static_assert(IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value,
                "the builder must pick the SM100 blockwise-scaling mainloop");
  static_assert(Base::Kernel::IsGroupedGemmKernel, "not a grouped kernel");
  static_assert(kTileK == kScaleK && kPromotionK == kScaleK, "TileK = 128 and one promotion per scale block of K");
  static constexpr int kSmsPerMma = size(typename CollectiveMainloop::AtomThrShapeMNK{});
  static_assert(kSmsPerMma == Cfg::kSmsPerMma, "the builder took the MMA the schedule names (1 or 2 SMs)");

  static Fp8KernelFacts facts() {
    return Base::template kernel_facts<typename Cfg::MmaTile, typename Cfg::Cluster>(
        kSmsPerMma, IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value,
        fp8_schedules::ScheduleTraits<Schedule>::fast_accumulation, kPromotionK);
  }
};

}  // namespace sm100_fp8
}  // namespace moe_gemm
