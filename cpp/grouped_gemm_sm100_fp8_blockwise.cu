// Explicit instantiation: SM100 FP8 blockwise-scaled grouped GEMM, e4m3 x e4m3 with f32 1x128 / 128x128 scales
// (K-major), f32 two-level accumulation, bf16 out; one configuration (1-SM 128x128x128, cluster 1x1x1): one
// CUTLASS SM100 unit costs minutes of nvcc on the build machines. Never run on hardware: compiled and
// SASS-checked (tests/sass.rs).
#include "grouped_gemm_sm100_fp8.cuh"

namespace moe_gemm {

namespace {
using Blockwise = sm100_fp8::GroupedGemmFp8Sm100<sm100_fp8::Blockwise1Sm128x128x128>;
constexpr Fp8TileConfig kBuilt = Fp8TileConfig::Sm100Blockwise1Sm128x128x128;
}  // namespace

bool grouped_gemm_sm100_fp8_blockwise_built(Fp8TileConfig c) { return c == kBuilt; }

Status grouped_gemm_sm100_fp8_blockwise_workspace(Fp8TileConfig c, int32_t groups, int32_t sm_count, uint64_t* bytes) {
  if (c != kBuilt) return {StatusCode::NotBuilt, 0};
  *bytes = Blockwise::workspace_bytes(groups, sm_count);
  return {StatusCode::Ok, 0};
}

Status grouped_gemm_sm100_fp8_blockwise_run(const GroupedGemmFp8Args& p) {
  if (p.config != kBuilt) return {StatusCode::NotBuilt, 0};
  return fp8_blockwise::run<Blockwise>(p);
}

Status grouped_gemm_sm100_fp8_blockwise_facts(Fp8TileConfig c, Fp8KernelFacts* facts) {
  if (c != kBuilt) return {StatusCode::NotBuilt, 0};
  *facts = Blockwise::facts();
  return {StatusCode::Ok, 0};
}

const char* grouped_gemm_sm100_fp8_blockwise_schedule(Fp8TileConfig c) {
  return c == kBuilt ? fp8_schedules::ScheduleTraits<sm100_fp8::Blockwise1Sm128x128x128::KernelSchedule>::name : "";
}

}  // namespace moe_gemm
