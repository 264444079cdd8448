// SM90 FP8 blockwise-scaled persistent ptr-array grouped GEMM (CUTLASS 4.2, TMA warp-specialized), driven by
// device offsets: DeepSeek-V3's recipe. A e4m3 with one f32 scale per row per 128 of K, B e4m3 with one f32 scale
// per 128 x 128 block, f32 accumulation promoted (scaled by sfa * sfb and added with FFMA) once per 128 of K,
// bf16 D. See launch_fp8.h for the operands.
//
// Included only by grouped_gemm_sm90_fp8_blockwise.cu, which lists the configurations it instantiates. As for
// the bf16 GEMM (grouped_gemm_sm90.cuh), a kernel of ours turns the device offsets into CUTLASS's per-group
// shapes, pointers and strides inside the caller's workspace; here it also points each group at its scales.
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

#include "fp8_schedules.cuh"
#include "grouped_run.cuh"
#include "launch_fp8.h"

#if !defined(CUTLASS_ARCH_MMA_SM90A_SUPPORTED) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "grouped_gemm_sm90_fp8 must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace moe_gemm {
namespace sm90_fp8 {

using namespace cute;

// DeepSeek-V3 block scaling: activations 1 x 128 (per row, per 128 of K), weights 128 x 128; both grids K-major
// (the K blocks of one row of blocks are contiguous).
constexpr int kScaleM = 1;
constexpr int kScaleN = 128;
constexpr int kScaleK = 128;
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
struct GroupedGemmFp8Sm90 {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
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
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using InternalLayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using InternalLayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;

  // What the mainloop made of our types: checked here, at compile time, and reported by facts().
  using Schedule = typename Cfg::KernelSchedule;
  static constexpr int kTileM = static_cast<int>(size<0>(typename Cfg::Tile{}));
  static constexpr int kTileN = static_cast<int>(size<1>(typename Cfg::Tile{}));
  static constexpr int kTileK = static_cast<int>(size<2>(typename Cfg::Tile{}));
  static constexpr int kMmaK = static_cast<int>(size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}));
  static constexpr int kPromotionK = CollectiveMainloop::ScalePromotionInterval * kMmaK;
  static_assert(ScheduleTraits<Schedule>::name != nullptr, "an FP8 ptr-array schedule this family knows by name");
  static_assert(!ScheduleTraits<Schedule>::fast_accumulation, "blockwise scaling never uses FastAccum");
  static_assert(IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value,
                "the builder must pick the two-level blockwise mainloop");
  static_assert(CollectiveMainloop::ScaleGranularityM == kScaleM && CollectiveMainloop::ScaleGranularityN == kScaleN &&
                    CollectiveMainloop::ScaleGranularityK == kScaleK,
                "scale granularities 1 x 128 (A) and 128 x 128 (B)");
  static_assert(!CollectiveMainloop::MMajorSFA && !CollectiveMainloop::NMajorSFB, "K-major SFA and SFB");
  static_assert(kTileK == kScaleK && kPromotionK == kScaleK,
                "TileK = 128 and one promotion per scale block of K");
  static_assert(std::is_same_v<InternalLayoutSFA, LayoutSFA> && std::is_same_v<InternalLayoutSFB, LayoutSFB>);

  // Our per-group arrays, carved from the start of the workspace; CUTLASS's own workspace follows.
  struct Arrays {
    UnderlyingShape* shapes;
    const ElementA** a;
    const ElementB** b;
    ElementD** d;
    const float** sfa;
    const float** sfb;
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    InternalLayoutSFA* lsfa;
    InternalLayoutSFB* lsfb;
    uint64_t bytes;  // total bytes of the arrays, 256-aligned
  };

  static Arrays carve(uint8_t* base, int groups) {
    grouped_run::Carver c{base};
    const uint64_t g = static_cast<uint64_t>(groups);
    Arrays r{c.take<UnderlyingShape>(g),   c.take<const ElementA*>(g),  c.take<const ElementB*>(g),
             c.take<ElementD*>(g),         c.take<const float*>(g),     c.take<const float*>(g),
             c.take<StrideA>(g),           c.take<StrideB>(g),          c.take<StrideD>(g),
             c.take<InternalLayoutSFA>(g), c.take<InternalLayoutSFB>(g), 0};
    r.bytes = c.bytes;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = ProblemShape{groups, arr.shapes, nullptr};  // device-only shapes
    args.mainloop.ptr_A = arr.a;
    args.mainloop.dA = arr.sa;
    args.mainloop.ptr_B = arr.b;
    args.mainloop.dB = arr.sb;
    args.mainloop.ptr_SFA = arr.sfa;
    args.mainloop.layout_SFA = arr.lsfa;
    args.mainloop.ptr_SFB = arr.sfb;
    args.mainloop.layout_SFB = arr.lsfb;
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
    return arr.bytes + grouped_run::align_up(Gemm::get_workspace_size(args), 256);
  }

  static Fp8KernelFacts facts() {
    Fp8KernelFacts f{};
    f.tile_m = kTileM;
    f.tile_n = kTileN;
    f.tile_k = kTileK;
    f.scale_m = CollectiveMainloop::ScaleGranularityM;
    f.scale_n = CollectiveMainloop::ScaleGranularityN;
    f.scale_k = CollectiveMainloop::ScaleGranularityK;
    f.sfa_k_major = !CollectiveMainloop::MMajorSFA;
    f.sfb_k_major = !CollectiveMainloop::NMajorSFB;
    f.blockwise_mainloop = IsBlockwisePolicy<typename CollectiveMainloop::DispatchPolicy>::value;
    f.fast_accumulation = ScheduleTraits<Schedule>::fast_accumulation;
    f.promotion_k = kPromotionK;
    f.stages = CollectiveMainloop::DispatchPolicy::Stages;
    return f;
  }
};

// One thread per group: (offsets | counts) -> shapes, operand and scale pointers, strides and scale layouts.
// Invalid values are clamped so that nothing is read or written out of bounds ([0, max_rows], and each group
// within its room) and reported through the status word, with the bits the bf16 GEMM uses. Group g's scales:
// SFA at row_start * ceil(k/128) (K-major rows of A), SFB at g * ceil(n/128) * ceil(k/128) (expert g's grid).
template <class G>
__global__ void prepare_fp8_groups(GroupMode mode, const int32_t* __restrict__ offsets,
                                   const int32_t* __restrict__ counts, int max_m, int groups, int n, int k,
                                   int64_t max_rows, const typename G::Arrays arr, const void* a, const float* sfa,
                                   const void* b, const float* sfb, void* d, uint32_t* error_word) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  auto clamp = [](int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); };
  uint32_t err = 0;
  int64_t lo = 0, hi = 0;  // any other mode (refused on the host) computes nothing
  if (mode == GroupMode::Masked) {
    lo = static_cast<int64_t>(g) * max_m;  // the host checks groups * max_m <= max_rows
    const int64_t c = counts[g];
    if (c < 0 || c > max_m) err |= kErrGroupCountOutOfRange;
    hi = lo + clamp(c, 0, max_m);
  } else if (mode == GroupMode::Offsets || mode == GroupMode::Padded) {
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
  const int64_t n64 = n, k64 = k;
  const int64_t kb = (k64 + kScaleK - 1) / kScaleK;
  const int64_t nb = (n64 + kScaleN - 1) / kScaleN;
  arr.shapes[g] = typename G::UnderlyingShape{m, n, k};
  arr.a[g] = static_cast<const typename G::ElementA*>(a) + lo * k64;
  arr.b[g] = static_cast<const typename G::ElementB*>(b) + static_cast<int64_t>(g) * n64 * k64;
  arr.d[g] = static_cast<typename G::ElementD*>(d) + lo * n64;
  arr.sfa[g] = sfa + lo * kb;
  arr.sfb[g] = sfb + static_cast<int64_t>(g) * nb * kb;
  arr.sa[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(m, k, 1));
  arr.sb[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(n, k, 1));
  arr.sd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(m, n, 1));
  arr.lsfa[g] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  arr.lsfb[g] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  if (err) atomicOr(error_word, err);
}

// What CUTLASS's can_implement would check if it had the shapes (with device-only shapes it checks nothing):
// the problem extents and the operand alignments TMA and the scale grids rely on.
inline Status check_problem(const GroupedGemmFp8Args& p) {
  const auto refuse = [](cutlass::Status s) { return Status{StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)}; };
  if (p.mode != GroupMode::Offsets && p.mode != GroupMode::Padded && p.mode != GroupMode::Masked) {
    return refuse(cutlass::Status::kErrorNotSupported);
  }
  if (p.groups < 0 || p.n <= 0 || p.n % kScaleN != 0 || p.k <= 0 || p.k % 16 != 0 || p.max_rows < 0 ||
      p.max_m < 0 || (p.mode == GroupMode::Masked && static_cast<int64_t>(p.groups) * p.max_m > p.max_rows)) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  if ((p.a | p.b | p.d) % 16 != 0 || (p.sfa | p.sfb) % 4 != 0 || p.a == 0 || p.b == 0 || p.d == 0 || p.sfa == 0 ||
      p.sfb == 0) {
    return refuse(cutlass::Status::kErrorMisalignedOperand);
  }
  if (p.mode != GroupMode::Masked && p.offsets == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  if (p.mode != GroupMode::Offsets && p.counts == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  return {StatusCode::Ok, 0};
}

template <class G>
Status run(const GroupedGemmFp8Args& p) {
  return grouped_run::run<G>(p, check_problem(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    prepare_fp8_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        p.mode, reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts), p.max_m,
        p.groups, p.n, p.k, p.max_rows, arr, reinterpret_cast<const void*>(p.a),
        reinterpret_cast<const float*>(p.sfa), reinterpret_cast<const void*>(p.b),
        reinterpret_cast<const float*>(p.sfb), reinterpret_cast<void*>(p.d), reinterpret_cast<uint32_t*>(p.status));
  });
}

}  // namespace sm90_fp8
}  // namespace moe_gemm

// Defines the entry points of launch_fp8.h from an X-macro list of configurations:
//   X(Cooperative128x128x128) X(Pingpong64x128x128)
#define MOE_GEMM_DEFINE_SM90_FP8_BLOCKWISE(CONFIGS)                                                           \
  namespace moe_gemm {                                                                                      \
  bool grouped_gemm_sm90_fp8_blockwise_built(Fp8TileConfig c) {                                             \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_BUILT)                                                                      \
      default: return false;                                                                                \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_workspace(Fp8TileConfig c, int32_t g, int32_t sms, uint64_t* bytes) { \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_WORKSPACE)                                                                  \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_run(const GroupedGemmFp8Args& p) {                                 \
    switch (p.config) {                                                                                     \
      CONFIGS(MOE_GEMM_FP8_CASE_RUN)                                                                        \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  Status grouped_gemm_sm90_fp8_blockwise_facts(Fp8TileConfig c, Fp8KernelFacts* facts) {                    \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_FACTS)                                                                      \
      default: return {StatusCode::NotBuilt, 0};                                                            \
    }                                                                                                       \
  }                                                                                                         \
  const char* grouped_gemm_sm90_fp8_blockwise_schedule(Fp8TileConfig c) {                                   \
    switch (c) {                                                                                            \
      CONFIGS(MOE_GEMM_FP8_CASE_SCHEDULE)                                                                   \
      default: return "";                                                                                   \
    }                                                                                                       \
  }                                                                                                         \
  }
#define MOE_GEMM_FP8_CASE_BUILT(CFG) \
  case Fp8TileConfig::CFG:           \
    return true;
#define MOE_GEMM_FP8_CASE_WORKSPACE(CFG)                                                         \
  case Fp8TileConfig::CFG:                                                                       \
    *bytes = sm90_fp8::GroupedGemmFp8Sm90<sm90_fp8::CFG>::workspace_bytes(g, sms);               \
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
