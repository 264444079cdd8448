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
#include "dense/launch_sm100.h"

// tcgen05 (UMMA, tensor memory) and the SM100 TMA descriptor updates exist only in arch-specific sm_100a code:
// a device pass for any other target would compile CUTLASS's "not supported" stubs into a kernel that traps.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "grouped_gemm_sm100 must be compiled for sm_100a only (-gencode=arch=compute_100a,code=sm_100a)"
#endif

namespace moe_gemm {
namespace sm100 {

using namespace cute;

// MMA tile, kernel and epilogue schedule, named as in launch_sm100.h's Sm100TileConfig. Cluster 1x1x1 (static):
// no multicast, every CTA independent, as the SM90 family measured best.
template <class MmaTile_, class Kernel_, class Epilogue_>
struct Config {
  using MmaTile = MmaTile_;
  using Cluster = Shape<_1, _1, _1>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epilogue_;
};
using Kernel1Sm = cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmSm100;
using Epilogue1Sm = cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm;

using Mma1Sm128x256x64 = Config<Shape<_128, _256, _64>, Kernel1Sm, Epilogue1Sm>;
using Mma1Sm128x128x64 = Config<Shape<_128, _128, _64>, Kernel1Sm, Epilogue1Sm>;

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

template <class Policy>
struct is_umma_array_mainloop : std::false_type {};
template <int Stages, int SchedulerStages, int AccumulatorStages, class Cluster>
struct is_umma_array_mainloop<
    cutlass::gemm::MainloopSm100ArrayTmaUmmaWarpSpecialized<Stages, SchedulerStages, AccumulatorStages, Cluster>>
    : std::true_type {};

template <class Element_, class Cfg>
struct GroupedGemmSm100 {
  using Element = Element_;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B stored [N, K] row-major == K x N column-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA alignment

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, typename Cfg::MmaTile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlign,  // no source tensor C: beta is 0 and C is never read
      Element, LayoutD*, kAlign, typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element, LayoutB*, kAlign,
      float, typename Cfg::MmaTile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  // What the builder must have chosen: the ptr-array UMMA mainloop (not a fallback) on a grouped problem.
  using DispatchPolicy = typename CollectiveMainloop::DispatchPolicy;
  static constexpr bool kUmmaArrayMainloop = is_umma_array_mainloop<DispatchPolicy>::value;
  static_assert(kUmmaArrayMainloop, "the SM100 builder did not pick the ptr-array UMMA mainloop");
  static_assert(Kernel::IsGroupedGemmKernel, "not a grouped kernel");

  // Our per-group arrays, carved from the start of the workspace; CUTLASS's own workspace (per-SM TMA
  // descriptors of A, B and D) follows.
  struct Arrays {
    UnderlyingShape* shapes;
    const Element** a;
    const Element** b;
    Element** d;
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    uint64_t bytes;  // total bytes of the arrays, 256-aligned
  };

  static Arrays carve(uint8_t* base, int groups) {
    Arrays r{};
    uint64_t off = 0;
    auto take = [&](uint64_t n) {
      uint8_t* p = base ? base + off : nullptr;
      off = align_up(off + n, 256);
      return p;
    };
    const uint64_t g = static_cast<uint64_t>(groups);
    r.shapes = reinterpret_cast<UnderlyingShape*>(take(g * sizeof(UnderlyingShape)));
    r.a = reinterpret_cast<const Element**>(take(g * sizeof(void*)));
    r.b = reinterpret_cast<const Element**>(take(g * sizeof(void*)));
    r.d = reinterpret_cast<Element**>(take(g * sizeof(void*)));
    r.sa = reinterpret_cast<StrideA*>(take(g * sizeof(StrideA)));
    r.sb = reinterpret_cast<StrideB*>(take(g * sizeof(StrideB)));
    r.sd = reinterpret_cast<StrideD*>(take(g * sizeof(StrideD)));
    r.bytes = off;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;  // the persistent grid; the cluster shape is static, so hw.cluster_shape is unused
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = ProblemShape{groups, arr.shapes, nullptr};  // device-only shapes
    args.mainloop.ptr_A = arr.a;
    args.mainloop.dA = arr.sa;
    args.mainloop.ptr_B = arr.b;
    args.mainloop.dB = arr.sb;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = arr.sd;
    args.epilogue.ptr_D = arr.d;
    args.epilogue.dD = arr.sd;
    args.hw_info = hw;
    return args;
  }

  static uint64_t workspace_bytes(int groups, int sm_count) {
    Arrays arr = carve(nullptr, groups);
    auto args = arguments(arr, groups, 0, sm_count);
    return arr.bytes + align_up(Gemm::get_workspace_size(args), 256);
  }

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
Status check_problem(const GroupedGemmSm100Args& p) {
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

template <class G>
Status run(const GroupedGemmSm100Args& p) {
  if (p.groups == 0) return {StatusCode::Ok, 0};
  const Status checked = check_problem<G>(p);
  if (checked.code != StatusCode::Ok) return checked;
  const uint64_t need = G::workspace_bytes(p.groups, p.sm_count);
  if (p.workspace_bytes < need) {
    return {StatusCode::WorkspaceTooSmall, static_cast<int32_t>(need > 0x7fffffff ? 0x7fffffff : need)};
  }
  auto* ws = reinterpret_cast<uint8_t*>(p.workspace);
  auto* error_word = reinterpret_cast<uint32_t*>(p.status);
  typename G::Arrays arr = G::carve(ws, p.groups);
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);

  constexpr int kThreads = 128;
  prepare_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      p.mode, reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts), p.max_m,
      p.a_div, p.experts, p.groups, p.n, p.k, p.max_rows, arr, reinterpret_cast<const void*>(p.a),
      reinterpret_cast<const void*>(p.b), reinterpret_cast<void*>(p.d), error_word);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};

  auto args = G::arguments(arr, p.groups, p.device, p.sm_count);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)};
  uint8_t* cutlass_ws = ws + arr.bytes;
  s = gemm.initialize(args, cutlass_ws, stream);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassInitialize, static_cast<int32_t>(s)};
  s = gemm.run(stream);
  if (s != cutlass::Status::kSuccess) {
    e = cudaGetLastError();
    return e != cudaSuccess ? Status{StatusCode::Cuda, static_cast<int32_t>(e)}
                            : Status{StatusCode::CutlassRun, static_cast<int32_t>(s)};
  }
  return {StatusCode::Ok, 0};
}

}  // namespace sm100
}  // namespace moe_gemm

// Defines the four entry points of launch_sm100.h for one dtype family from an X-macro list of configurations:
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
  Status grouped_gemm_sm100_##NAME##_run(const GroupedGemmSm100Args& p) {                                     \
    using E = ELEMENT;                                                                                        \
    switch (p.config) {                                                                                       \
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
    *bytes = sm100::GroupedGemmSm100<E, sm100::CFG>::workspace_bytes(g, sms);            \
    return {StatusCode::Ok, 0};
#define MOE_GEMM_SM100_CASE_RUN(CFG) \
  case Sm100TileConfig::CFG:         \
    return sm100::run<sm100::GroupedGemmSm100<E, sm100::CFG>>(p);
#define MOE_GEMM_SM100_CASE_FACTS(CFG)                              \
  case Sm100TileConfig::CFG:                                        \
    *facts = sm100::GroupedGemmSm100<E, sm100::CFG>::facts();       \
    return {StatusCode::Ok, 0};
