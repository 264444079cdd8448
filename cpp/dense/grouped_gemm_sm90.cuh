// SM90 persistent ptr-array grouped GEMM (CUTLASS 4.x, TMA warp-specialized), driven by device offsets.
//
// Included only by grouped_gemm_sm90_<dtype>.cu, each of which instantiates GroupedGemmSm90<Element, Config>
// for an explicit list of configurations. A small kernel of ours turns the device offsets into CUTLASS's
// per-group problem-shape, pointer and stride arrays inside the caller's workspace, so a launch needs no host
// copy of the group sizes, allocates nothing and never synchronises.
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "common/grouped_run.cuh"
#include "common/launch.h"
#include "dense/launch.h"
#include "common/pdl.cuh"
#include "dense/dense_gemm.cuh"

#if !defined(CUTLASS_ARCH_MMA_SM90A_SUPPORTED) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "grouped_gemm_sm90 must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace moe_gemm {
namespace sm90 {

using namespace cute;

// Schedules and tiles, named as in dense/launch.h's TileConfig.
template <class Tile_, class Kernel_, class Epilogue_>
struct Config {
  using Tile = Tile_;
  using Cluster = Shape<_1, _1, _1>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epilogue_;
};
using Coop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using PingEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;

using Cooperative128x128x64 = Config<Shape<_128, _128, _64>, Coop, CoopEpi>;
using Cooperative128x256x64 = Config<Shape<_128, _256, _64>, Coop, CoopEpi>;
using Pingpong64x128x64 = Config<Shape<_64, _128, _64>, Ping, PingEpi>;
using Pingpong128x128x64 = Config<Shape<_128, _128, _64>, Ping, PingEpi>;
// Decode with few active experts: 64-wide N tiles double the CTAs that stream weights.
using Pingpong64x64x128 = Config<Shape<_64, _64, _128>, Ping, PingEpi>;

template <class Element_, class Cfg>
struct GroupedGemmSm90 : dense::DenseGemm<cutlass::arch::Sm90, Element_, typename Cfg::Tile, Cfg> {};

// One thread per group: (offsets | counts) -> shapes, pointers and strides. Invalid values are clamped so that
// nothing is read or written out of bounds ([0, max_rows], and each group within its room), and reported
// through the status word.
template <class G>
__global__ void prepare_groups(GroupMode mode, const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                               int max_m, int a_div, int experts, int groups, int n, int k, int64_t max_rows, const typename G::Arrays arr,
                               const void* a, const void* b, void* d, uint32_t* error_word) {
  using Element = typename G::Element;
  pdl::wait_for_prerequisites();  // launched while the kernel before it runs (run below): its offsets first
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  auto clamp = [](int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); };
  uint32_t err = 0;
  int64_t lo, hi;
  int64_t a_row = -1, b_index = g;
  if (mode == GroupMode::PerRow) {
    lo = g;
    hi = g + 1 <= max_rows ? g + 1 : g;  // the host checks groups <= max_rows
    a_row = g / a_div;
    b_index = counts[g];
    if (b_index < 0 || b_index >= experts) {
      err |= kErrGroupCountOutOfRange;
      b_index = 0;
      hi = lo;  // an invalid expert computes nothing
    }
  } else if (mode == GroupMode::Masked) {
    lo = static_cast<int64_t>(g) * max_m;
    const int64_t c = counts[g];
    if (c < 0 || c > max_m) err |= kErrGroupCountOutOfRange;
    hi = lo + clamp(c, 0, max_m);
  } else {
    lo = offsets[g];
    hi = offsets[g + 1];
    if (g == 0 && lo != 0) err |= kErrOffsetsNotZeroBased;
    if (hi < lo) err |= kErrOffsetsNotMonotone;
    if (lo < 0 || hi > max_rows) err |= kErrOffsetsOutOfRange;
    lo = clamp(lo, 0, max_rows);
    hi = clamp(hi, lo, max_rows);
    if (mode == GroupMode::Padded) {
      const int64_t c = counts[g];
      if (c < 0 || c > hi - lo) err |= kErrGroupCountOutOfRange;
      hi = lo + clamp(c, 0, hi - lo);
    }
  }
  const int m = static_cast<int>(hi - lo);
  arr.shapes[g] = typename G::UnderlyingShape{m, n, k};
  arr.a[g] = static_cast<const Element*>(a) + (a_row >= 0 ? a_row : lo) * k;
  arr.b[g] = static_cast<const Element*>(b) + b_index * n * k;
  arr.d[g] = static_cast<Element*>(d) + lo * n;
  arr.sa[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(m, k, 1));
  arr.sb[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(n, k, 1));
  arr.sd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(m, n, 1));
  if (err) atomicOr(error_word, err);
}

// Programmatic dependent launch: where the kernel before it lets its dependents start early (the gather, the
// activation), the one-CTA prepare kernel is resident when that ends. The GEMM after it is launched plainly:
// CUTLASS 4.2's SM90 ptr-array kernels do not wait on griddepcontrol, so they must not start before it (entered
// through a waiting kernel and let in early, it measured 8% slower at Mixtral T = 512 uniform and nowhere faster:
// benches/results/h200-2026-12-03-tile-windows/r2/compare.txt).
template <class G>
Status run(const GroupedGemmArgs& p) {
  return grouped_run::run<G>(p, Status{StatusCode::Ok, 0}, [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    return pdl::launch(
        true, dim3((p.groups + kThreads - 1) / kThreads), dim3(kThreads), 0, stream, prepare_groups<G>, p.mode,
        reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts),
        static_cast<int>(p.max_m), static_cast<int>(p.a_div), static_cast<int>(p.experts),
        static_cast<int>(p.groups), static_cast<int>(p.n), static_cast<int>(p.k), static_cast<int64_t>(p.max_rows),
        arr, reinterpret_cast<const void*>(p.a), reinterpret_cast<const void*>(p.b), reinterpret_cast<void*>(p.d),
        reinterpret_cast<uint32_t*>(p.status));
  });
}

template <class G>
Status workspace(int32_t groups, int32_t sm_count, uint64_t* bytes) {
  *bytes = grouped_run::workspace_bytes<G>(groups, sm_count);
  return {StatusCode::Ok, 0};
}

}  // namespace sm90
}  // namespace moe_gemm

// Defines the three entry points of launch.h for one dtype family from an X-macro list of configurations:
//   X(Cooperative128x128x64) X(Pingpong64x128x64) ...
#define MOE_GEMM_DEFINE_SM90_FAMILY(NAME, ELEMENT, CONFIGS)                                                  \
  namespace moe_gemm {                                                                                      \
  bool grouped_gemm_sm90_##NAME##_built(TileConfig c) {                                                     \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_CASE_BUILT)                                                                          \
      default: return false;                                                                                \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_##NAME##_workspace(TileConfig c, int32_t g, int32_t sms, uint64_t* bytes) {      \
    using E = ELEMENT;                                                                                      \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_CASE_WORKSPACE)                                                                      \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_##NAME##_run(TileConfig c, const GroupedGemmArgs& p) {                           \
    using E = ELEMENT;                                                                                      \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_CASE_RUN)                                                                            \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  }
#define MOE_GEMM_CASE_BUILT(CFG) \
  case TileConfig::CFG:          \
    return true;
#define MOE_GEMM_CASE_WORKSPACE(CFG) \
  case TileConfig::CFG:              \
    return sm90::workspace<sm90::GroupedGemmSm90<E, sm90::CFG>>(g, sms, bytes);
#define MOE_GEMM_CASE_RUN(CFG) \
  case TileConfig::CFG:        \
    return sm90::run<sm90::GroupedGemmSm90<E, sm90::CFG>>(p);
