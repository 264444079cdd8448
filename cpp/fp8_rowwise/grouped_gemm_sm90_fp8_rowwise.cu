// moe-gemm unit: family=grouped_gemm_sm90_fp8 targets=sm_90a seconds=59
// The SM90 FP8 rowwise-scaled grouped GEMM, e4m3 x e4m3 with f32 per-token x per-channel scales in the epilogue,
// bf16 out, in one nvcc process. Three configurations: two FastAccum tiles and one promoted.
#include "fp8_rowwise/grouped_gemm_sm90_fp8_rowwise.cuh"

namespace moe_gemm {

using sm90_fp8_rowwise::GroupedGemmFp8Rowwise;
namespace cfg = sm90_fp8_rowwise;

#define MOE_GEMM_ROWWISE_CONFIGS(X) \
  X(FastAccumPingpong64x128x128) X(FastAccumCooperative128x128x128) X(PromotedCooperative128x128x128)

bool grouped_gemm_sm90_fp8_rowwise_built(Fp8RowwiseConfig c) {
#define X(CFG) case Fp8RowwiseConfig::CFG: return true;
  switch (c) { MOE_GEMM_ROWWISE_CONFIGS(X) default: return false; }
#undef X
}

Status grouped_gemm_sm90_fp8_rowwise_workspace(Fp8RowwiseConfig c, int32_t groups, int32_t sm_count,
                                               uint64_t* bytes) {
#define X(CFG)                                                                             \
  case Fp8RowwiseConfig::CFG:                                                              \
    *bytes = grouped_run::workspace_bytes<GroupedGemmFp8Rowwise<cfg::CFG>>(groups, sm_count); \
    return {StatusCode::Ok, 0};
  switch (c) { MOE_GEMM_ROWWISE_CONFIGS(X) default: return {StatusCode::NotBuilt, 0}; }
#undef X
}

Status grouped_gemm_sm90_fp8_rowwise_run(const GroupedGemmFp8RowwiseArgs& p) {
#define X(CFG) case Fp8RowwiseConfig::CFG: return sm90_fp8_rowwise::run<GroupedGemmFp8Rowwise<cfg::CFG>>(p);
  switch (p.config) { MOE_GEMM_ROWWISE_CONFIGS(X) default: return {StatusCode::NotBuilt, 0}; }
#undef X
}

Status grouped_gemm_sm90_fp8_rowwise_facts(Fp8RowwiseConfig c, Fp8KernelFacts* facts) {
#define X(CFG)                                                 \
  case Fp8RowwiseConfig::CFG:                                  \
    *facts = GroupedGemmFp8Rowwise<cfg::CFG>::facts();         \
    return {StatusCode::Ok, 0};
  switch (c) { MOE_GEMM_ROWWISE_CONFIGS(X) default: return {StatusCode::NotBuilt, 0}; }
#undef X
}

const char* grouped_gemm_sm90_fp8_rowwise_schedule(Fp8RowwiseConfig c) {
#define X(CFG) \
  case Fp8RowwiseConfig::CFG: return sm90_fp8_rowwise::ScheduleTraits<cfg::CFG::KernelSchedule>::name;
  switch (c) { MOE_GEMM_ROWWISE_CONFIGS(X) default: return ""; }
#undef X
}

}  // namespace moe_gemm
