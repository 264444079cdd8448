// Included once, by grouped_gemm_sm100_mx.cu. SM100 4-bit x 4-bit block-scaled grouped GEMMs (the template:
// grouped_gemm_sm100_mx.cuh): MXFP4 x MXFP4 (tcgen05 kind::mxf4, UE8M0 per 32 of K) and NVFP4 x NVFP4 (kind::mxf4nvf4,
// UE4M3 per 16, the tensor scales' product per group as the epilogue's alpha: CUTLASS example 75's form), each 1-SM
// 128x128x256. Both operands K-major, as these kinds require. Their 2-SM 256x256x256 kernels were built once
// and taken out again: 43 s of nvcc CPU that the 10-minute cold build could not keep, for a rule no B200 had
// measured. Never run on hardware: compiled and SASS-checked.
#include "mx/grouped_gemm_sm100_mx.cuh"

namespace moe_gemm {

namespace sm100_mx {
using Epi1Sm = cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm;
using Mxf4Mma1Sm128x128x256 =
    Config<Shape<_128, _128, _256>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf4Sm100, Epi1Sm>;
using Nvf4Mma1Sm128x128x256 =
    Config<Shape<_128, _128, _256>, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100, Epi1Sm>;
using MxFp4 = cutlass::mx_float4_t<cutlass::float_e2m1_t>;
using NvFp4 = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
using Mxf4 = GroupedGemmMx<Mxf4Mma1Sm128x128x256, MxFp4, MxFp4>;
using Nvf4 = GroupedGemmMx<Nvf4Mma1Sm128x128x256, NvFp4, NvFp4>;
static_assert(!Mxf4::kTensorScaled && Nvf4::kTensorScaled && Mxf4::kVec == 32 && Nvf4::kVec == 16);
}  // namespace sm100_mx

bool grouped_gemm_sm100_fp4_built(Sm100MxConfig c) { return sm100_mx_is_fp4(c); }

Status grouped_gemm_sm100_fp4_workspace(Sm100MxConfig c, int32_t groups, int32_t sm_count, uint64_t* bytes) {
  switch (c) {
    case Sm100MxConfig::Mxf4Mma1Sm128x128x256: *bytes = grouped_run::workspace_bytes<sm100_mx::Mxf4>(groups, sm_count); break;
    case Sm100MxConfig::Nvf4Mma1Sm128x128x256: *bytes = grouped_run::workspace_bytes<sm100_mx::Nvf4>(groups, sm_count); break;
    default: return {StatusCode::NotBuilt, 0};
  }
  return {StatusCode::Ok, 0};
}

Status grouped_gemm_sm100_fp4_run(const GroupedGemmMxArgs& p) {
  switch (p.config) {
    case Sm100MxConfig::Mxf4Mma1Sm128x128x256: return sm100_mx::run<sm100_mx::Mxf4>(p);
    case Sm100MxConfig::Nvf4Mma1Sm128x128x256: return sm100_mx::run<sm100_mx::Nvf4>(p);
    default: return {StatusCode::NotBuilt, 0};
  }
}

}  // namespace moe_gemm
