// SM100 (sm_100a) block-scaled persistent ptr-array grouped GEMMs (CUTLASS 4.2, OpClassBlockScaledTensorOp),
// driven by device offsets: one template over A's and B's block-scaled element types (mx_float8_t,
// mx_float4_t, nv_float4_t) and the kernel schedule, for the units that instantiate it
// (grouped_gemm_sm100_mxfp8.inl: kind::mxf8f6f4; grouped_gemm_sm100_fp4.inl: kind::mxf4 and kind::mxf4nvf4). Our
// prepare kernel fills, per group, the problem shape, the operand pointers and strides, the scale pointers and
// layouts: the activation scales at the base the quantiser computed on the device (sfa_bases), each group's
// layout from its own rows (Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA), which the SM100 collective reads per
// group; for NVFP4 also each group's alpha, the product of A's and expert g's tensor scales. Never run on
// hardware: compiled, SASS-checked (tests/sass.rs), refused on other arches by the plan. Each family has a 1-SM
// and a 2-SM schedule (Config).
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
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
#include "mx/launch.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "the SM100 block-scaled GEMM units must be compiled for sm_100a only (-gencode=arch=compute_100a,code=sm_100a)"
#endif

namespace moe_gemm {
namespace sm100_mx {

using namespace cute;

// MMA tile, kernel and epilogue schedule: a 1-SM or a 2-SM MMA (sm100_config.cuh).
template <class MmaTile_, class Kernel_, class Epilogue_>
struct Config : Sm100Config<MmaTile_, Kernel_, Epilogue_> {};

// ElementA_ / ElementB_: cutlass::mx_float8_t<float_e4m3_t>, mx_float4_t<float_e2m1_t> or nv_float4_t<float_e2m1_t>
// (A and B of one scale type: the builder's rule).
template <class Cfg, class ElementA_, class ElementB_>
struct GroupedGemmMx {
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  using DataA = typename ElementA::DataType;
  using DataB = typename ElementB::DataType;
  // Bits of one element: 8 (e4m3) or 4 (e2m1, two per byte, the even element in the low nibble).
  static constexpr int kBitsA = cutlass::sizeof_bits<DataA>::value;
  static constexpr int kBitsB = cutlass::sizeof_bits<DataB>::value;
  // NVFP4 carries a per-tensor f32 beside its UE4M3 block scales: alpha per group.
  static constexpr bool kTensorScaled = std::is_same_v<typename ElementA::ScaleFactorType, cutlass::float_ue4m3_t>;
  static_assert(std::is_same_v<typename ElementA::ScaleFactorType, typename ElementB::ScaleFactorType>,
                "A and B must share their scale type");
  // Under kind::mxf8f6f4 a 4-bit operand sits in 8-bit containers and TMA needs 128 of its elements; under
  // kind::mxf4 / mxf4nvf4 (both operands 4-bit) 16 bytes, 32 elements; e4m3: 16 bytes (layout.hpp,
  // get_input_alignment_bits).
  static constexpr bool kF8F6F4 = !(kBitsA == 4 && kBitsB == 4);
  static constexpr int kAlignA = kBitsA == 8 ? 16 : (kF8F6F4 ? 128 : 32);
  static constexpr int kAlignB = kBitsB == 8 ? 16 : (kF8F6F4 ? 128 : 32);
  static constexpr int kAlignD = 8;
  static constexpr int kTileN = size<1>(typename Cfg::MmaTile{});
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, typename Cfg::MmaTile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementA, LayoutA*, kAlignA, ElementB,
      LayoutB*, kAlignB, float, typename Cfg::MmaTile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using LayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using LayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
  using SfConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElementSF = typename Kernel::ElementSF;
  static constexpr int kVec = SfConfig::SFVecSize;
  static_assert(std::is_same_v<ElementSF, typename ElementA::ScaleFactorType>, "the kernel's scale type");
  static_assert(kVec == (kTensorScaled ? 16 : 32), "one scale per 32 of K (MX), per 16 (NVFP4)");
  static_assert(Kernel::IsGroupedGemmKernel, "not a grouped kernel");
  // The builder took the MMA the schedule names: one SM per MMA, or the pair of the 2x1 cluster.
  static_assert(size(typename CollectiveMainloop::AtomThrShapeMNK{}) == Cfg::kSmsPerMma, "SMs per MMA");

  struct Arrays {
    UnderlyingShape* shapes;
    const DataA** a;
    const DataB** b;
    ElementD** d;
    const ElementSF** sfa;
    const ElementSF** sfb;
    StrideA* da;
    StrideB* db;
    StrideD* dd;
    LayoutSFA* lsfa;
    LayoutSFB* lsfb;
    float* alpha;              // NVFP4: [groups], written by the prepare kernel
    const float** alpha_ptrs;  // NVFP4: &alpha[g]
    uint64_t bytes;
  };

  static Arrays carve(uint8_t* base, int groups) {
    grouped_run::Carver c{base};
    const uint64_t g = static_cast<uint64_t>(groups);
    Arrays r{};
    r.shapes = c.take<UnderlyingShape>(g);
    r.a = c.take<const DataA*>(g);
    r.b = c.take<const DataB*>(g);
    r.d = c.take<ElementD*>(g);
    r.sfa = c.take<const ElementSF*>(g);
    r.sfb = c.take<const ElementSF*>(g);
    r.da = c.take<StrideA>(g);
    r.db = c.take<StrideB>(g);
    r.dd = c.take<StrideD>(g);
    r.lsfa = c.take<LayoutSFA>(g);
    r.lsfb = c.take<LayoutSFB>(g);
    if constexpr (kTensorScaled) {
      r.alpha = c.take<float>(g);
      r.alpha_ptrs = c.take<const float*>(g);
    }
    r.bytes = c.bytes;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    auto args = grouped_run::base_arguments<Gemm>(groups, arr.shapes, arr.a, arr.da, arr.b, arr.db, arr.d, arr.dd,
                                                  device, sm_count);
    grouped_run::set_block_scales(args, arr);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (kTensorScaled) {
      // One alpha per group (example 75's per-group form): the stride's batch mode steps one pointer a group.
      args.epilogue.thread.alpha_ptr_array = arr.alpha_ptrs;
      args.epilogue.thread.dAlpha = {_0{}, _0{}, 1};
    }
    return args;
  }
};

// Bytes from the start of a [rows, k] matrix of `bits`-bit elements to row r.
__device__ inline int64_t row_bytes(int64_t r, int64_t k, int bits) { return r * k * bits / 8; }

// One thread per group: rows (group_rows::resolve, clamped and reported), pointers, strides, the scale pointers
// and layouts of the group's own shape, and (NVFP4) alpha = a_scale * b_scales[g].
template <class G>
__global__ void prepare_mx_groups(GroupedGemmMxArgs p, const typename G::Arrays arr) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  const auto* offsets = reinterpret_cast<const int32_t*>(p.offsets);
  const auto* counts = reinterpret_cast<const int32_t*>(p.counts);
  const group_rows::Group r = group_rows::resolve(p.mode, offsets, counts, p.max_m, 1, p.groups, g, p.max_rows);
  const int64_t n = p.n, k = p.k;
  using SF = typename G::ElementSF;
  arr.shapes[g] = typename G::UnderlyingShape{r.m, p.n, p.k};
  arr.a[g] = reinterpret_cast<const typename G::DataA*>(reinterpret_cast<const uint8_t*>(p.a) +
                                                      row_bytes(r.lo, k, G::kBitsA));
  // Expert g's weights start g * n rows in.
  arr.b[g] = reinterpret_cast<const typename G::DataB*>(reinterpret_cast<const uint8_t*>(p.b) +
                                                      row_bytes(static_cast<int64_t>(g) * n, k, G::kBitsB));
  arr.d[g] = reinterpret_cast<typename G::ElementD*>(p.d) + r.lo * n;
  const auto* bases = reinterpret_cast<const int64_t*>(p.sfa_bases);
  arr.sfa[g] = reinterpret_cast<const SF*>(p.sfa) + bases[g];
  const int64_t sfb_bytes = 512 * ((n + 127) / 128) * ((k + 4 * G::kVec - 1) / (4 * G::kVec));
  arr.sfb[g] = reinterpret_cast<const SF*>(p.sfb) + static_cast<int64_t>(g) * sfb_bytes;
  arr.da[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(r.m, p.k, 1));
  arr.db[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(p.n, p.k, 1));
  arr.dd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(r.m, p.n, 1));
  arr.lsfa[g] = G::SfConfig::tile_atom_to_shape_SFA(make_shape(r.m, p.n, p.k, 1));
  arr.lsfb[g] = G::SfConfig::tile_atom_to_shape_SFB(make_shape(r.m, p.n, p.k, 1));
  if constexpr (G::kTensorScaled) {
    const float sa = *reinterpret_cast<const float*>(p.a_tensor_scale);
    const float sb = reinterpret_cast<const float*>(p.b_tensor_scales)[g];
    arr.alpha[g] = __fmul_rn(sa, sb);
    arr.alpha_ptrs[g] = arr.alpha + g;
  }
  if (r.err) atomicOr(reinterpret_cast<uint32_t*>(p.status), r.err);
}

template <class G>
Status check_problem(const GroupedGemmMxArgs& p) {
  const auto refuse = [](cutlass::Status s) { return Status{StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)}; };
  if (p.mode != GroupMode::Offsets && p.mode != GroupMode::Padded && p.mode != GroupMode::Masked) {
    return refuse(cutlass::Status::kErrorNotSupported);
  }
  // Whole MMA tiles of N (128, or 256 for the 2-SM tiles), as the plan checked.
  if (p.groups < 0 || p.n <= 0 || p.n % G::kTileN != 0 || p.k <= 0 || p.k % 128 != 0 || p.max_rows < 0 || p.max_m < 0 ||
      (p.mode == GroupMode::Masked && static_cast<int64_t>(p.groups) * p.max_m > p.max_rows)) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  if ((p.a | p.b | p.d) % 16 != 0 || (p.sfa | p.sfb) % 128 != 0 || p.sfa_bases % 8 != 0 || !p.a || !p.b || !p.d ||
      !p.sfa || !p.sfb || !p.sfa_bases || !p.status) {
    return refuse(cutlass::Status::kErrorMisalignedOperand);
  }
  // The tensor scales: both for NVFP4, neither for MX (a scale nobody reads is a caller's mistake).
  const bool scaled = p.a_tensor_scale != 0 && p.b_tensor_scales != 0;
  const bool unscaled = p.a_tensor_scale == 0 && p.b_tensor_scales == 0;
  if (G::kTensorScaled ? !scaled : !unscaled) return refuse(cutlass::Status::kErrorInvalidProblem);
  if ((p.a_tensor_scale | p.b_tensor_scales) % 4 != 0) return refuse(cutlass::Status::kErrorMisalignedOperand);
  if (p.mode != GroupMode::Masked && p.offsets == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  if (p.mode != GroupMode::Offsets && p.counts == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  return {StatusCode::Ok, 0};
}

template <class G>
Status run(const GroupedGemmMxArgs& p) {
  return grouped_run::run<G>(p, check_problem<G>(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    prepare_mx_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p, arr);
    return grouped_run::launched();
  });
}

}  // namespace sm100_mx
}  // namespace moe_gemm
