// Host-compiler side of the cxx bridge: converts the bridge's shared structs to launch.h's PODs and dispatches
// over dtype. Never includes CUDA or CUTLASS headers.
#pragma once

#include <cstdint>

#include "launch.h"

namespace moe_gemm {
namespace bridge {

struct LaunchStatus;
struct GroupedGemmParams;

bool grouped_gemm_sm90_built(DType dtype, TileConfig config);
LaunchStatus grouped_gemm_sm90_workspace(DType dtype, TileConfig config, int32_t groups, int32_t sm_count,
                                         uint64_t& bytes);
LaunchStatus grouped_gemm_sm90_run(const GroupedGemmParams& params);
int32_t cudart_version();

}  // namespace bridge
}  // namespace moe_gemm
