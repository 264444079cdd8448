// Included once, by grouped_gemm_sm100_mx.cu. SM100 MXFP8 activations x MXFP8 or MXFP4 weights: tcgen05 kind::mxf8f6f4,
// UE8M0 scales per 32 of K (the template: grouped_gemm_sm100_mx.cuh). 1-SM 128x128x128 for both weight formats; 2-SM
// 256x256x128 (a 2x1 cluster, half the B tile per SM) for MXFP8 x MXFP8 only: one more configuration is one more
// CUTLASS kernel in this unit's nvcc time. Never run on hardware: compiled and SASS-checked.
#include "mx/grouped_gemm_sm100_mx.cuh"

namespace moe_gemm {

namespace sm100_mx {
using Mxf8Mma1Sm128x128x128 = Config<Shape<_128, _128, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf8f6f4Sm100,
                                     cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
using Mxf8Mma2Sm256x256x128 = Config<Shape<_256, _256, _128>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100,
                                     cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm>;
using Mxf8 = GroupedGemmMx<Mxf8Mma1Sm128x128x128, cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                           cutlass::mx_float8_t<cutlass::float_e4m3_t>>;
using Mxf8f4 = GroupedGemmMx<Mxf8Mma1Sm128x128x128, cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                             cutlass::mx_float4_t<cutlass::float_e2m1_t>>;
using Mxf8x2 = GroupedGemmMx<Mxf8Mma2Sm256x256x128, cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                             cutlass::mx_float8_t<cutlass::float_e4m3_t>>;
static_assert(Mxf8Mma1Sm128x128x128::kSmsPerMma == 1 && Mxf8Mma2Sm256x256x128::kSmsPerMma == 2);
}  // namespace sm100_mx

bool grouped_gemm_sm100_mxf8_built(Sm100MxConfig c) {
  return c == Sm100MxConfig::Mxf8Mma1Sm128x128x128 || c == Sm100MxConfig::Mxf8f4Mma1Sm128x128x128 ||
         c == Sm100MxConfig::Mxf8Mma2Sm256x256x128;
}

Status grouped_gemm_sm100_mxf8_workspace(Sm100MxConfig c, int32_t groups, int32_t sm_count, uint64_t* bytes) {
  switch (c) {
    case Sm100MxConfig::Mxf8Mma1Sm128x128x128: *bytes = grouped_run::workspace_bytes<sm100_mx::Mxf8>(groups, sm_count); break;
    case Sm100MxConfig::Mxf8f4Mma1Sm128x128x128: *bytes = grouped_run::workspace_bytes<sm100_mx::Mxf8f4>(groups, sm_count); break;
    case Sm100MxConfig::Mxf8Mma2Sm256x256x128: *bytes = grouped_run::workspace_bytes<sm100_mx::Mxf8x2>(groups, sm_count); break;
    default: return {StatusCode::NotBuilt, 0};
  }
  return {StatusCode::Ok, 0};
}

Status grouped_gemm_sm100_mxf8_run(const GroupedGemmMxArgs& p) {
  switch (p.config) {
    case Sm100MxConfig::Mxf8Mma1Sm128x128x128: return sm100_mx::run<sm100_mx::Mxf8>(p);
    case Sm100MxConfig::Mxf8f4Mma1Sm128x128x128: return sm100_mx::run<sm100_mx::Mxf8f4>(p);
    case Sm100MxConfig::Mxf8Mma2Sm256x256x128: return sm100_mx::run<sm100_mx::Mxf8x2>(p);
    default: return {StatusCode::NotBuilt, 0};
  }
}

}  // namespace moe_gemm
