// One SM100 grouped GEMM configuration: the MMA tile (M x N x K) of one MMA, which a 2-SM schedule
// (KernelSchedule2Sm) spreads over the two SMs of a static 2x1x1 cluster (TMA loads each SM's half:
// SM100_TMA_2SM_LOAD, no multicast); a 1-SM one runs in a 1x1x1 cluster. The cluster being static, the kernel
// type carries it and hw_info.cluster_shape stays unused (only dynamic-cluster kernels read it:
// gemm_universal_adapter.h), and the workspace query sees the same type. Each family names its configurations
// with a Config of its own deriving from this one.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace moe_gemm {

template <class MmaTile_, class Kernel_, class Epilogue_>
struct Sm100Config {
  using MmaTile = MmaTile_;
  static constexpr int kSmsPerMma = cute::is_base_of_v<cutlass::gemm::KernelSchedule2Sm, Kernel_> ? 2 : 1;
  using Cluster = cute::Shape<cute::Int<kSmsPerMma>, cute::_1, cute::_1>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epilogue_;
};

}  // namespace moe_gemm
