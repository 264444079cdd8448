// What the SM90 and SM100 dense grouped GEMMs (grouped_gemm_sm90.cuh, grouped_gemm_sm100.cuh) share: CUTLASS's
// collectives for one element type in and out with f32 accumulation and no source C, built for the arch, tile
// and schedules of Cfg; the per-group arrays; and the arguments over them. Each arch's wrapper derives from it.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "common/grouped_run.cuh"

namespace moe_gemm {
namespace dense {

using namespace cute;

// Cfg: Cluster, KernelSchedule and EpilogueSchedule; Tile: its CTA tile (SM90) or MMA tile (SM100).
template <class Arch, class Element_, class Tile, class Cfg>
struct DenseGemm {
  using Element = Element_;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B stored [N, K] row-major == K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA alignment

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlign,  // no source tensor C: beta is 0 and C is never read
      Element, LayoutD*, kAlign, typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element, LayoutB*, kAlign,
      float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  // Our per-group arrays, carved from the start of the workspace; CUTLASS's own workspace follows.
  using Arrays = grouped_run::PlainArrays<UnderlyingShape, Element, StrideA, StrideB, StrideD>;
  static Arrays carve(uint8_t* base, int groups) { return Arrays::carve(base, groups); }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    auto args = grouped_run::base_arguments<Gemm>(groups, arr.shapes, arr.a, arr.sa, arr.b, arr.sb, arr.d, arr.sd,
                                                  device, sm_count);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
  }
};

}  // namespace dense
}  // namespace moe_gemm
