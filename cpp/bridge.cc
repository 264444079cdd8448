#include "moe-gemm/cpp/bridge.h"

#include "moe-gemm/src/ffi/bridge.rs.h"

namespace moe_gemm {
namespace bridge {
namespace {
LaunchStatus wrap(Status s) { return LaunchStatus{s.code, s.detail}; }
}  // namespace

bool grouped_gemm_sm90_built(DType dtype, TileConfig config) {
  switch (dtype) {
    case DType::BF16: return moe_gemm::grouped_gemm_sm90_bf16_built(config);
    case DType::F16: return moe_gemm::grouped_gemm_sm90_f16_built(config);
  }
  return false;
}

LaunchStatus grouped_gemm_sm90_workspace(DType dtype, TileConfig config, int32_t groups, int32_t sm_count,
                                         uint64_t& bytes) {
  switch (dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm90_bf16_workspace(config, groups, sm_count, &bytes));
    case DType::F16: return wrap(moe_gemm::grouped_gemm_sm90_f16_workspace(config, groups, sm_count, &bytes));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

LaunchStatus grouped_gemm_sm90_run(const GroupedGemmParams& p) {
  const GroupedGemmArgs args{p.dtype, p.config, p.groups, p.n, p.k, p.max_rows, p.a, p.b, p.d, p.offsets,
                             p.workspace, p.workspace_bytes, p.status, p.device, p.sm_count, p.stream};
  switch (p.dtype) {
    case DType::BF16: return wrap(moe_gemm::grouped_gemm_sm90_bf16_run(args));
    case DType::F16: return wrap(moe_gemm::grouped_gemm_sm90_f16_run(args));
  }
  return LaunchStatus{StatusCode::NotBuilt, 0};
}

int32_t cudart_version() { return moe_gemm::cudart_version(); }

}  // namespace bridge
}  // namespace moe_gemm
