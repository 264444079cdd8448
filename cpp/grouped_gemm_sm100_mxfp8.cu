// SM100 (sm_100a) MXFP8 block-scaled persistent ptr-array grouped GEMM (CUTLASS 4.2, OpClassBlockScaledTensorOp,
// tcgen05 kind::mxf8f6f4 with UE8M0 scales per 32 of K), driven by device offsets. Our prepare kernel fills, per
// group, the problem shape, the operand pointers and strides, and the scale pointers and layouts: the activation
// scales at the base the quantiser computed on the device (sfa_bases), each group's layout from its own rows
// (Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA), which the SM100 collective reads per group. Never run on
// hardware: compiled, SASS-checked (tests/sass.rs), refused on other arches by the plan.
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

#include "group_rows.cuh"
#include "grouped_run.cuh"
#include "launch_sm100_mx.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "grouped_gemm_sm100_mxfp8 must be compiled for sm_100a only (-gencode=arch=compute_100a,code=sm_100a)"
#endif

namespace moe_gemm {
namespace sm100_mx {

using namespace cute;

template <class MmaTile_, class Kernel_, class Epilogue_>
struct Config {
  using MmaTile = MmaTile_;
  using Cluster = Shape<_1, _1, _1>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epilogue_;
};
using Mxf8Mma1Sm128x128x128 = Config<Shape<_128, _128, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf8f6f4Sm100,
                                     cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;

template <class Cfg, class ElementB_>
struct GroupedGemmMxfp8 {
  using ElementA = cutlass::mx_float8_t<cutlass::float_e4m3_t>;
  using ElementB = ElementB_;
  using DataB = typename ElementB::DataType;
  // Bits of one B element: 8 (e4m3) or 4 (e2m1, two per byte).
  static constexpr int kBitsB = cutlass::sizeof_bits<DataB>::value;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16;  // e4m3 elements: 16 bytes
  // B: 16 bytes of e4m3; a 4-bit operand under kind::mxf8f6f4 takes 128 elements (FP8_NOTES, layout.hpp).
  static constexpr int kAlignB = kBitsB == 4 ? 128 : 16;
  static constexpr int kAlignD = 8;

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
  using DataA = cutlass::float_e4m3_t;
  static_assert(std::is_same_v<ElementSF, cutlass::float_ue8m0_t>, "MX scales are UE8M0");
  static_assert(SfConfig::SFVecSize == 32, "one scale per 32 of K");
  static_assert(Kernel::IsGroupedGemmKernel, "not a grouped kernel");

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
    uint64_t bytes;
  };

  static Arrays carve(uint8_t* base, int groups) {
    grouped_run::Carver c{base};
    const uint64_t g = static_cast<uint64_t>(groups);
    Arrays r{c.take<UnderlyingShape>(g), c.take<const DataA*>(g),     c.take<const DataB*>(g),
             c.take<ElementD*>(g),       c.take<const ElementSF*>(g), c.take<const ElementSF*>(g),
             c.take<StrideA>(g),         c.take<StrideB>(g),          c.take<StrideD>(g),
             c.take<LayoutSFA>(g),       c.take<LayoutSFB>(g),        0};
    r.bytes = c.bytes;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = ProblemShape{groups, arr.shapes, nullptr};
    args.mainloop.ptr_A = arr.a;
    args.mainloop.dA = arr.da;
    args.mainloop.ptr_B = arr.b;
    args.mainloop.dB = arr.db;
    args.mainloop.ptr_SFA = arr.sfa;
    args.mainloop.layout_SFA = arr.lsfa;
    args.mainloop.ptr_SFB = arr.sfb;
    args.mainloop.layout_SFB = arr.lsfb;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = arr.dd;
    args.epilogue.ptr_D = arr.d;
    args.epilogue.dD = arr.dd;
    args.hw_info = hw;
    return args;
  }

  static uint64_t workspace_bytes(int groups, int sm_count) {
    Arrays arr = carve(nullptr, groups);
    auto args = arguments(arr, groups, 0, sm_count);
    return arr.bytes + grouped_run::align_up(Gemm::get_workspace_size(args), 256);
  }
};

// One thread per group: rows (group_rows::resolve, clamped and reported), pointers, strides, and the scale
// pointers and layouts of the group's own shape.
template <class G>
__global__ void prepare_mx_groups(GroupedGemmMxfp8Args p, const typename G::Arrays arr) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.groups) return;
  const auto* offsets = reinterpret_cast<const int32_t*>(p.offsets);
  const auto* counts = reinterpret_cast<const int32_t*>(p.counts);
  const group_rows::Group r = group_rows::resolve(p.mode, offsets, counts, p.max_m, 1, p.groups, g, p.max_rows);
  const int64_t n = p.n, k = p.k;
  using DataA = typename G::DataA;
  using SF = typename G::ElementSF;
  arr.shapes[g] = typename G::UnderlyingShape{r.m, p.n, p.k};
  arr.a[g] = reinterpret_cast<const DataA*>(p.a) + r.lo * k;
  // Expert g's weights start g * n * k elements in: g * n * k * bits / 8 bytes.
  arr.b[g] = reinterpret_cast<const typename G::DataB*>(reinterpret_cast<const uint8_t*>(p.b) +
                                                      static_cast<int64_t>(g) * n * k * G::kBitsB / 8);
  arr.d[g] = reinterpret_cast<typename G::ElementD*>(p.d) + r.lo * n;
  const auto* bases = reinterpret_cast<const int64_t*>(p.sfa_bases);
  arr.sfa[g] = reinterpret_cast<const SF*>(p.sfa) + bases[g];
  const int64_t sfb_bytes = 512 * ((n + 127) / 128) * ((k + 127) / 128);
  arr.sfb[g] = reinterpret_cast<const SF*>(p.sfb) + static_cast<int64_t>(g) * sfb_bytes;
  arr.da[g] = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(r.m, p.k, 1));
  arr.db[g] = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(p.n, p.k, 1));
  arr.dd[g] = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(r.m, p.n, 1));
  arr.lsfa[g] = G::SfConfig::tile_atom_to_shape_SFA(make_shape(r.m, p.n, p.k, 1));
  arr.lsfb[g] = G::SfConfig::tile_atom_to_shape_SFB(make_shape(r.m, p.n, p.k, 1));
  if (r.err) atomicOr(reinterpret_cast<uint32_t*>(p.status), r.err);
}

inline Status check_problem(const GroupedGemmMxfp8Args& p) {
  const auto refuse = [](cutlass::Status s) { return Status{StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)}; };
  if (p.mode != GroupMode::Offsets && p.mode != GroupMode::Padded && p.mode != GroupMode::Masked) {
    return refuse(cutlass::Status::kErrorNotSupported);
  }
  if (p.groups < 0 || p.n <= 0 || p.n % 128 != 0 || p.k <= 0 || p.k % 128 != 0 || p.max_rows < 0 || p.max_m < 0 ||
      (p.mode == GroupMode::Masked && static_cast<int64_t>(p.groups) * p.max_m > p.max_rows)) {
    return refuse(cutlass::Status::kErrorInvalidProblem);
  }
  if ((p.a | p.b | p.d) % 16 != 0 || (p.sfa | p.sfb) % 128 != 0 || p.sfa_bases % 8 != 0 || !p.a || !p.b || !p.d ||
      !p.sfa || !p.sfb || !p.sfa_bases || !p.status) {
    return refuse(cutlass::Status::kErrorMisalignedOperand);
  }
  if (p.mode != GroupMode::Masked && p.offsets == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  if (p.mode != GroupMode::Offsets && p.counts == 0) return refuse(cutlass::Status::kErrorInvalidProblem);
  return {StatusCode::Ok, 0};
}

template <class G>
Status run(const GroupedGemmMxfp8Args& p) {
  return grouped_run::run<G>(p, check_problem(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    prepare_mx_groups<G><<<(p.groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p, arr);
  });
}

}  // namespace sm100_mx

namespace sm100_mx {
using Mxf8 = GroupedGemmMxfp8<Mxf8Mma1Sm128x128x128, cutlass::mx_float8_t<cutlass::float_e4m3_t>>;
using Mxf8f4 = GroupedGemmMxfp8<Mxf8Mma1Sm128x128x128, cutlass::mx_float4_t<cutlass::float_e2m1_t>>;
}  // namespace sm100_mx

bool grouped_gemm_sm100_mxfp8_built(Sm100MxConfig c) {
  return c == Sm100MxConfig::Mxf8Mma1Sm128x128x128 || c == Sm100MxConfig::Mxf8f4Mma1Sm128x128x128;
}

Status grouped_gemm_sm100_mxfp8_workspace(Sm100MxConfig c, int32_t groups, int32_t sm_count, uint64_t* bytes) {
  switch (c) {
    case Sm100MxConfig::Mxf8Mma1Sm128x128x128: *bytes = sm100_mx::Mxf8::workspace_bytes(groups, sm_count); break;
    case Sm100MxConfig::Mxf8f4Mma1Sm128x128x128: *bytes = sm100_mx::Mxf8f4::workspace_bytes(groups, sm_count); break;
    default: return {StatusCode::NotBuilt, 0};
  }
  return {StatusCode::Ok, 0};
}

Status grouped_gemm_sm100_mxfp8_run(const GroupedGemmMxfp8Args& p) {
  switch (p.config) {
    case Sm100MxConfig::Mxf8Mma1Sm128x128x128: return sm100_mx::run<sm100_mx::Mxf8>(p);
    case Sm100MxConfig::Mxf8f4Mma1Sm128x128x128: return sm100_mx::run<sm100_mx::Mxf8f4>(p);
  }
  return {StatusCode::NotBuilt, 0};
}

}  // namespace moe_gemm
