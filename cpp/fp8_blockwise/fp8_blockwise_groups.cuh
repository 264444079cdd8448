// What the FP8 blockwise-scaled ptr-array grouped GEMMs (DeepSeek-V3's 1 x 128 / 128 x 128 f32 scales) share
// across architectures: the per-group arrays carved from the workspace, the CUTLASS arguments, our prepare
// kernel (device offsets -> per-group shapes, operand and scale pointers, strides, scale layouts), the host
// checks and the launch. Templated over the CUTLASS kernel and its scale config, so that the SM90 unit
// (grouped_gemm_sm90_fp8.cuh) and the SM100 unit (grouped_gemm_sm100_fp8.cuh) read the same operands
// (launch_fp8.h) with the same rules: a caller switches arch without requantising.
//
// Scales are K-major for both arches: group g's SFA is the [M_g, ceil(K/128)] block at row_start * ceil(K/128)
// of the [max_rows, ceil(K/128)] array (Fp8Rows), its SFB expert g's [ceil(N/128), ceil(K/128)] grid
// (Fp8BlockWeights). K-major scales are compact at the default strides of each group's own shape, which the
// SM90 mainloop requires (it rebuilds the layouts from the shapes and ignores the layout arrays), and the SM100
// mainloop reads the per-group layouts we write, which are the same. K-major SFA is loaded one f32 at a time
// (cp.async of 4 bytes) on both arches: no M_g % 4 rule (that is MN-major SFA's 16-byte vectors on SM100) and
// no 128-byte per-group bases (those are the TMA-loaded MX scale atoms).
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/util/packed_stride.hpp"

#include "common/group_rows.cuh"
#include "common/grouped_run.cuh"
#include "common/pdl.cuh"
#include "fp8_blockwise/launch_fp8.h"

namespace moe_gemm {
namespace fp8_blockwise {

using namespace cute;

// DeepSeek-V3 block scaling: activations 1 x 128 (per row, per 128 of K), weights 128 x 128.
constexpr int kScaleM = 1;
constexpr int kScaleN = 128;
constexpr int kScaleK = 128;

// Kernel_: a cutlass::gemm::kernel::GemmUniversal over GroupProblemShape with e4m3 A (row-major) and B
// (column-major), f32 scales in ScaleConfig_'s layouts and bf16 D (row-major).
template <class Kernel_, class ScaleConfig_>
struct Groups {
  using Kernel = Kernel_;
  using ScaleConfig = ScaleConfig_;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using CollectiveMainloop = typename Kernel::CollectiveMainloop;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = typename Kernel::ProblemShape;
  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using InternalLayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using InternalLayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
  static_assert(std::is_same_v<InternalLayoutSFA, decltype(ScaleConfig::deduce_layoutSFA())> &&
                    std::is_same_v<InternalLayoutSFB, decltype(ScaleConfig::deduce_layoutSFB())>,
                "the mainloop's scale layouts are the config's");
  static_assert(CollectiveMainloop::ScaleGranularityM == kScaleM && CollectiveMainloop::ScaleGranularityN == kScaleN &&
                    CollectiveMainloop::ScaleGranularityK == kScaleK,
                "scale granularities 1 x 128 (A) and 128 x 128 (B)");
  // Whether the scale grids are MN-major, read from the layout types as CUTLASS's own SM100 mainloop does (a
  // K-major layout's MN stride is dynamic: 0 in a default-constructed layout).
  static constexpr bool kMnMajorSFA = size<0, 1>(InternalLayoutSFA{}.stride()) == 1;
  static constexpr bool kMnMajorSFB = size<0, 1>(InternalLayoutSFB{}.stride()) == 1;
  static_assert(!kMnMajorSFA && !kMnMajorSFB, "K-major SFA and SFB (Fp8Rows and Fp8BlockWeights)");

  // The facts (launch_fp8.h) of the configuration with MMA or CTA tile Tile and cluster Cluster: those read from
  // the mainloop here, and what the arch's wrapper checked (SMs per MMA, the two-level policy, FastAccum, the
  // promotion interval).
  template <class Tile, class Cluster>
  static Fp8KernelFacts kernel_facts(int sms_per_mma, bool blockwise, bool fast, int promotion_k) {
    Fp8KernelFacts f{};
    f.tile_m = size<0>(Tile{});
    f.tile_n = size<1>(Tile{});
    f.tile_k = size<2>(Tile{});
    f.cluster_m = size<0>(Cluster{});
    f.cluster_n = size<1>(Cluster{});
    f.sms_per_mma = sms_per_mma;
    f.scale_m = CollectiveMainloop::ScaleGranularityM;
    f.scale_n = CollectiveMainloop::ScaleGranularityN;
    f.scale_k = CollectiveMainloop::ScaleGranularityK;
    f.sfa_k_major = !kMnMajorSFA;
    f.sfb_k_major = !kMnMajorSFB;
    f.blockwise_mainloop = blockwise;
    f.fast_accumulation = fast;
    f.promotion_k = promotion_k;
    f.stages = CollectiveMainloop::DispatchPolicy::Stages;
    return f;
  }

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
    Arrays r{};
    r.shapes = c.take<UnderlyingShape>(g);
    r.a = c.take<const ElementA*>(g);
    r.b = c.take<const ElementB*>(g);
    r.d = c.take<ElementD*>(g);
    r.sfa = c.take<const float*>(g);
    r.sfb = c.take<const float*>(g);
    r.sa = c.take<StrideA>(g);
    r.sb = c.take<StrideB>(g);
    r.sd = c.take<StrideD>(g);
    r.lsfa = c.take<InternalLayoutSFA>(g);
    r.lsfb = c.take<InternalLayoutSFB>(g);
    r.bytes = c.bytes;
    return r;
  }

  static typename Gemm::Arguments arguments(const Arrays& arr, int groups, int device, int sm_count) {
    auto args = grouped_run::base_arguments<Gemm>(groups, arr.shapes, arr.a, arr.sa, arr.b, arr.sb, arr.d, arr.sd,
                                                  device, sm_count);
    grouped_run::set_block_scales(args, arr);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
  }
};

// One thread per group: rows (group_rows::resolve: clamped into [0, max_rows] and each group's room, reported
// through the status word), then shapes, operand and scale pointers, strides and scale layouts. Group g's
// scales: SFA at row_start * ceil(k/128) (K-major rows of A), SFB at g * ceil(n/128) * ceil(k/128) (expert g's
// grid).
template <class G>
__global__ void prepare_fp8_groups(GroupMode mode, const int32_t* __restrict__ offsets,
                                   const int32_t* __restrict__ counts, int max_m, int groups, int n, int k,
                                   int64_t max_rows, const typename G::Arrays arr, const void* a, const float* sfa,
                                   const void* b, const float* sfb, void* d, uint32_t* error_word) {
  pdl::wait_for_prerequisites();  // launched while the kernel before it ends (run below): its offsets first
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const group_rows::Group r = group_rows::resolve(mode, offsets, counts, max_m, 1, groups, g, max_rows);
  const int m = r.m;
  const int64_t lo = r.lo, n64 = n, k64 = k;
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
  arr.lsfa[g] = G::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  arr.lsfb[g] = G::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  if (r.err) atomicOr(error_word, r.err);
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

// Programmatic dependent launch, as the 16-bit family's (grouped_gemm_sm90.cuh): the one-CTA prepare kernel is
// resident when the quantisation before it (which lets it in early) ends; the GEMM after it is launched plainly.
template <class G>
Status run(const GroupedGemmFp8Args& p) {
  return grouped_run::run<G>(p, check_problem(p), [&](const typename G::Arrays& arr, cudaStream_t stream) {
    constexpr int kThreads = 128;
    return pdl::launch(
        true, dim3((p.groups + kThreads - 1) / kThreads), dim3(kThreads), 0, stream, prepare_fp8_groups<G>, p.mode,
        reinterpret_cast<const int32_t*>(p.offsets), reinterpret_cast<const int32_t*>(p.counts),
        static_cast<int>(p.max_m), static_cast<int>(p.groups), static_cast<int>(p.n), static_cast<int>(p.k),
        static_cast<int64_t>(p.max_rows), arr, reinterpret_cast<const void*>(p.a),
        reinterpret_cast<const float*>(p.sfa), reinterpret_cast<const void*>(p.b),
        reinterpret_cast<const float*>(p.sfb), reinterpret_cast<void*>(p.d), reinterpret_cast<uint32_t*>(p.status));
  });
}

}  // namespace fp8_blockwise
}  // namespace moe_gemm
