// SM100 (Blackwell, sm_100a) persistent ptr-array grouped GEMM (CUTLASS 4.2, TMA + tcgen05 UMMA warp-specialized,
// one SM per MMA), driven by device offsets as the SM90 family is.
//
// Included only by grouped_gemm_sm100_<dtype>.cu, each of which instantiates GroupedGemmSm100<Element, Config>
// for an explicit list of configurations. Our prepare kernel turns the device group description (GroupMode) into
// CUTLASS's per-group problem-shape, pointer and stride arrays inside the caller's workspace, so a launch needs no
// host copy of the group sizes, allocates nothing and never synchronises. The kernel updates its TMA descriptors
// on the device per group (tensormap.replace), into per-SM copies in the workspace.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "common/group_rows.cuh"
#include "common/grouped_run.cuh"
#include "common/sm100_config.cuh"
#include "dense/dense_gemm.cuh"
#include "dense/launch.h"

// tcgen05 (UMMA, tensor memory) and the SM100 TMA descriptor updates exist only in arch-specific sm_100a code:
// a device pass for any other target would compile CUTLASS's "not supported" stubs into a kernel that traps.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "grouped_gemm_sm100 must be compiled for sm_100a only (-gencode=arch=compute_100a,code=sm_100a)"
#endif

namespace moe_gemm {
namespace sm100 {

using namespace cute;

// MMA tile, kernel and epilogue schedule, named as in dense/launch.h's Sm100TileConfig. 1-SM schedules only, so
// the cluster is 1x1x1 (static, sm100_config.cuh): no multicast, every CTA independent, as the SM90 family
// measured best.
template <class MmaTile_, class Kernel_, class Epilogue_>
struct Config : Sm100Config<MmaTile_, Kernel_, Epilogue_> {};
using Kernel1Sm = cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmSm100;
using Epilogue1Sm = cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm;

using Mma1Sm128x256x64 = Config<Shape<_128, _256, _64>, Kernel1Sm, Epilogue1Sm>;
using Mma1Sm128x128x64 = Config<Shape<_128, _128, _64>, Kernel1Sm, Epilogue1Sm>;

template <class Policy>
struct is_umma_array_mainloop : std::false_type {};
template <int Stages, int SchedulerStages, int AccumulatorStages, class Cluster>
struct is_umma_array_mainloop<
    cutlass::gemm::MainloopSm100ArrayTmaUmmaWarpSpecialized<Stages, SchedulerStages, AccumulatorStages, Cluster>>
    : std::true_type {};

template <class Element_, class Cfg>
struct GroupedGemmSm100 : dense::DenseGemm<cutlass::arch::Sm100, Element_, typename Cfg::MmaTile, Cfg> {
  using Base = dense::DenseGemm<cutlass::arch::Sm100, Element_, typename Cfg::MmaTile, Cfg>;
  using CollectiveMainloop = typename Base::CollectiveMainloop;
  using Kernel = typename Base::Kernel;
  static_assert(Cfg::kSmsPerMma == 1, "1-SM schedules: a 1x1x1 cluster");

  // What the builder must have chosen: the ptr-array UMMA mainloop (not a fallback) on a grouped problem.
  using DispatchPolicy = typename CollectiveMainloop::DispatchPolicy;
  static constexpr bool kUmmaArrayMainloop = is_umma_array_mainloop<DispatchPolicy>::value;
  static_assert(kUmmaArrayMainloop, "the SM100 builder did not pick the ptr-array UMMA mainloop");
  static_assert(Kernel::IsGroupedGemmKernel, "not a grouped kernel");

  static Sm100KernelFacts facts() {
    using Tile = typename Cfg::MmaTile;
    using Atom = typename CollectiveMainloop::AtomThrShapeMNK;
    Sm100KernelFacts f{};
    f.tile_m = size<0>(Tile{});
    f.tile_n = size<1>(Tile{});
    f.tile_k = size<2>(Tile{});
    f.cluster_m = size<0>(typename Cfg::Cluster{});
    f.cluster_n = size<1>(typename Cfg::Cluster{});
    f.atom_m = size<0>(Atom{});
    f.stages = DispatchPolicy::Stages;
    f.umma_array_mainloop = kUmmaArrayMainloop;
    f.ptr_array_epilogue = std::is_base_of_v<cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm,
                                             typename Cfg::EpilogueSchedule>;
    return f;
  }
};

// One thread per group: the group's rows (group_rows::resolve, clamped) -> shapes, pointers and strides.
template <class G>
__global__ void prepare_groups(GroupMode mode, const int32_t* __restrict__ offsets,
                               const int32_t* __restrict__ counts, int max_m, int a_div, int experts, int groups,
                               int n, int k, int64_t max_rows, const typename G::Arrays arr, const void* a,
                               const void* b, void* d, uint32_t* error_word) {
  using Element = typename G::Element;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const group_rows::Group r = group_rows::resolve(mode, offsets, counts, max_m, a_div, experts, g, max_rows);
  const int64_t n64 = n, k64 = k;
  arr.shapes[g] = typename G::UnderlyingShape{r.m, n, k};
  arr.a[g] = static_cast<const Element*>(a) + r.a_row * k64;
  arr.b[g] = static_cast<const Element*>(b) + r.b_index * n64 * k64;
  arr.d[g] = static_cast<Element*>(d) + r.lo * n64;
  arr.sa[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(r.m, k, 1));
  arr.sb[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(n, k, 1));
  arr.sd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(r.m, n, 1));
  if (r.err) atomicOr(error_word, r.err);
}

// What CUTLASS's can_implement would check if it had the shapes (with device-only shapes it checks nothing),
// and what the prepare kernel's clamping relies on.
template <class G>
Status check_problem(const GroupedGemmArgs& p) {
  const auto refuse = [](cutlass::Status s) {
    return Status{StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)};
  };
  const bool per_row = p.mode == GroupMode::PerRow;
  if (p.mode != GroupMode::Offsets && p.mode != GroupMode::Padded && p.mode != GroupMode::Masked && !per_row) {
    return refuse(cutlass::Status::kErrorNotSupported);
  }
  if (p.groups < 0 || p.n <= 0 || p.n % G::kAlign != 0 || p.k <= 0 || p.k % G::kAlign != 0 || p.max_rows < 0 ||
      p.max_m < 0 || (p.mode == GroupMode::Masked && static_cast<int64_t>(p.groups) * p.max_m > p.max_rows) ||
      (per_row && (p.groups > p.max_rows || p.a_div <= 0 || p.experts <= 0))) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  if ((p.a | p.b | p.d) % 16 != 0 || p.a == 0 || p.b == 0 || p.d == 0 || p.status == 0) {
    return refuse(cutlass::Status::kErrorMisalignedOperand);
  }
  const bool reads_offsets = p.mode == GroupMode::Offsets || p.mode == GroupMode::Padded;
  if ((reads_offsets && p.offsets == 0) || (p.mode != GroupMode::Offsets && p.counts == 0)) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  return {StatusCode::Ok, 0};
}

// CUTLASS's own workspace (per-SM TMA descriptors of A, B and D) follows our arrays.
template <class G>
Status run(const GroupedGemmArgs& p) {
  return grouped_run::run<G>(p, check_problem<G>(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    prepare_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        p.mode, reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts), p.max_m,
        p.a_div, p.experts, p.groups, p.n, p.k, p.max_rows, arr, reinterpret_cast<const void*>(p.a),
        reinterpret_cast<const void*>(p.b), reinterpret_cast<void*>(p.d), reinterpret_cast<uint32_t*>(p.status));
    return grouped_run::launched();
  });
}

}  // namespace sm100
}  // namespace moe_gemm

// Defines the four SM100 entry points of dense/launch.h for one dtype family from an X-macro list of configurations:
//   X(Mma1Sm128x256x64) ...
#define MOE_GEMM_DEFINE_SM100_FAMILY(NAME, ELEMENT, CONFIGS)                                                    \
  namespace moe_gemm {                                                                                        \
  bool grouped_gemm_sm100_##NAME##_built(Sm100TileConfig c) {                                                 \
    switch (c) {                                                                                              \
      CONFIGS(MOE_GEMM_SM100_CASE_BUILT)                                                                      \
      default: return false;                                                                                  \
    }                                                                                                         \
  }                                                                                                           \
  Status grouped_gemm_sm100_##NAME##_workspace(Sm100TileConfig c, int32_t g, int32_t sms, uint64_t* bytes) {  \
    using E = ELEMENT;                                                                                        \
    switch (c) {                                                                                              \
      CONFIGS(MOE_GEMM_SM100_CASE_WORKSPACE)                                                                  \
      default: return {StatusCode::NotBuilt, 0};                                                              \
    }                                                                                                         \
  }                                                                                                           \
  Status grouped_gemm_sm100_##NAME##_run(Sm100TileConfig c, const GroupedGemmArgs& p) {                      \
    using E = ELEMENT;                                                                                        \
    switch (c) {                                                                                              \
      CONFIGS(MOE_GEMM_SM100_CASE_RUN)                                                                        \
      default: return {StatusCode::NotBuilt, 0};                                                              \
    }                                                                                                         \
  }                                                                                                           \
  Status grouped_gemm_sm100_##NAME##_facts(Sm100TileConfig c, Sm100KernelFacts* facts) {                      \
    using E = ELEMENT;                                                                                        \
    switch (c) {                                                                                              \
      CONFIGS(MOE_GEMM_SM100_CASE_FACTS)                                                                      \
      default: return {StatusCode::NotBuilt, 0};                                                              \
    }                                                                                                         \
  }                                                                                                           \
  }
#define MOE_GEMM_SM100_CASE_BUILT(CFG) \
  case Sm100TileConfig::CFG:           \
    return true;
#define MOE_GEMM_SM100_CASE_WORKSPACE(CFG)                                               \
  case Sm100TileConfig::CFG:                                                             \
    *bytes = grouped_run::workspace_bytes<sm100::GroupedGemmSm100<E, sm100::CFG>>(g, sms); \
    return {StatusCode::Ok, 0};
#define MOE_GEMM_SM100_CASE_RUN(CFG) \
  case Sm100TileConfig::CFG:         \
    return sm100::run<sm100::GroupedGemmSm100<E, sm100::CFG>>(p);
#define MOE_GEMM_SM100_CASE_FACTS(CFG)                              \
  case Sm100TileConfig::CFG:                                        \
    *facts = sm100::GroupedGemmSm100<E, sm100::CFG>::facts();       \
    return {StatusCode::Ok, 0};
