// The SM90 (and the two SM100) FP8 ptr-array kernel schedules our FP8 families may use, by name, with whether each accumulates in
// the tensor cores only (FastAccum), and the config shape (tile, schedules, cluster 1x1x1) both families name
// their configurations with. A schedule not listed here fails to compile (its name is null).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace moe_gemm {
namespace fp8_schedules {

template <class S>
struct ScheduleTraits {
  static constexpr const char* name = nullptr;
  static constexpr bool fast_accumulation = false;
};
#define MOE_GEMM_FP8_SCHEDULE(S, FAST)                               \
  template <>                                                        \
  struct ScheduleTraits<cutlass::gemm::S> {                          \
    static constexpr const char* name = #S;                          \
    static constexpr bool fast_accumulation = FAST;                  \
  };
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise, false)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise, false)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum, true)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum, true)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedCooperative, false)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedBlockwise1SmSm100, false)
MOE_GEMM_FP8_SCHEDULE(KernelPtrArrayTmaWarpSpecializedBlockwise2SmSm100, false)
#undef MOE_GEMM_FP8_SCHEDULE

template <class Tile_, class Kernel_, class Epilogue_>
struct Config {
  using Tile = Tile_;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epilogue_;
};
using CoopEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using PingEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;

}  // namespace fp8_schedules
}  // namespace moe_gemm
