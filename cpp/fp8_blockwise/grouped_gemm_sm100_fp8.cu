// moe-gemm unit: family=grouped_gemm_sm100 targets=sm_100a seconds=49
// The SM100 (sm_100a) FP8 blockwise-scaled grouped GEMM, in one nvcc process,
// e4m3 x e4m3 with f32 1x128 / 128x128 scales (K-major), f32 two-level accumulation, bf16 out; two
// configurations: 1-SM 128x128x128 (cluster 1x1x1) and 2-SM 256x128x128 (cluster 2x1x1). Never run on hardware:
// compiled and SASS-checked (tests/sass.rs).
#include "fp8_blockwise/grouped_gemm_sm100_fp8.cuh"

namespace moe_gemm {

namespace {
using Blockwise1Sm = sm100_fp8::GroupedGemmFp8Sm100<sm100_fp8::Blockwise1Sm128x128x128>;
using Blockwise2Sm = sm100_fp8::GroupedGemmFp8Sm100<sm100_fp8::Blockwise2Sm256x128x128>;
using sm100_fp8::Blockwise1Sm128x128x128;
using sm100_fp8::Blockwise2Sm256x128x128;
}  // namespace

bool grouped_gemm_sm100_fp8_blockwise_built(Fp8TileConfig c) {
  return c == Fp8TileConfig::Sm100Blockwise1Sm128x128x128 || c == Fp8TileConfig::Sm100Blockwise2Sm256x128x128;
}

Status grouped_gemm_sm100_fp8_blockwise_workspace(Fp8TileConfig c, int32_t groups, int32_t sm_count, uint64_t* bytes) {
  switch (c) {
    case Fp8TileConfig::Sm100Blockwise1Sm128x128x128: *bytes = grouped_run::workspace_bytes<Blockwise1Sm>(groups, sm_count); break;
    case Fp8TileConfig::Sm100Blockwise2Sm256x128x128: *bytes = grouped_run::workspace_bytes<Blockwise2Sm>(groups, sm_count); break;
    default: return {StatusCode::NotBuilt, 0};
  }
  return {StatusCode::Ok, 0};
}

Status grouped_gemm_sm100_fp8_blockwise_run(const GroupedGemmFp8Args& p) {
  switch (p.config) {
    case Fp8TileConfig::Sm100Blockwise1Sm128x128x128: return fp8_blockwise::run<Blockwise1Sm>(p);
    case Fp8TileConfig::Sm100Blockwise2Sm256x128x128: return fp8_blockwise::run<Blockwise2Sm>(p);
    default: return {StatusCode::NotBuilt, 0};
  }
}

Status grouped_gemm_sm100_fp8_blockwise_facts(Fp8TileConfig c, Fp8KernelFacts* facts) {
  switch (c) {
    case Fp8TileConfig::Sm100Blockwise1Sm128x128x128: *facts = Blockwise1Sm::facts(); break;
    case Fp8TileConfig::Sm100Blockwise2Sm256x128x128: *facts = Blockwise2Sm::facts(); break;
    default: return {StatusCode::NotBuilt, 0};
  }
  return {StatusCode::Ok, 0};
}

const char* grouped_gemm_sm100_fp8_blockwise_schedule(Fp8TileConfig c) {
  switch (c) {
    case Fp8TileConfig::Sm100Blockwise1Sm128x128x128:
      return fp8_schedules::ScheduleTraits<Blockwise1Sm128x128x128::KernelSchedule>::name;
    case Fp8TileConfig::Sm100Blockwise2Sm256x128x128:
      return fp8_schedules::ScheduleTraits<Blockwise2Sm256x128x128::KernelSchedule>::name;
    default: return "";
  }
}

}  // namespace moe_gemm
