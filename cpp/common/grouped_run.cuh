// The host side every CUTLASS ptr-array grouped GEMM wrapper of ours shares: carving the per-group arrays out of
// the caller's workspace, and one launch (checks, our prepare kernel, CUTLASS's can_implement / initialize /
// run) with the statuses mapped alike. A family's G provides Arrays, carve(base, groups), arguments(arr, groups,
// device, sm_count), workspace_bytes(groups, sm_count) and Gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass/cutlass.h"
#include "common/launch.h"

namespace moe_gemm {
namespace grouped_run {

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Hands out 256-byte aligned pieces of a buffer (or, with base == nullptr, only counts their bytes).
struct Carver {
  uint8_t* base;
  uint64_t bytes = 0;
  template <class T>
  T* take(uint64_t count) {
    uint8_t* p = base ? base + bytes : nullptr;
    bytes = align_up(bytes + count * sizeof(T), 256);
    return reinterpret_cast<T*>(p);
  }
};

// Queues prepare(arr, stream) (our kernel filling the per-group arrays) and the CUTLASS GEMM of G for the
// arguments p (groups, sm_count, device, workspace, workspace_bytes, stream), after `checked` (the family's own
// checks of p) passed. Nothing is queued when a check fails.
template <class G, class Args, class Prepare>
Status run(const Args& p, Status checked, Prepare prepare) {
  if (p.groups == 0) return {StatusCode::Ok, 0};
  if (checked.code != StatusCode::Ok) return checked;
  const uint64_t need = G::workspace_bytes(p.groups, p.sm_count);
  if (p.workspace_bytes < need) {
    return {StatusCode::WorkspaceTooSmall, static_cast<int32_t>(need > 0x7fffffff ? 0x7fffffff : need)};
  }
  auto* ws = reinterpret_cast<uint8_t*>(p.workspace);
  typename G::Arrays arr = G::carve(ws, p.groups);
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  prepare(arr, stream);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  auto args = G::arguments(arr, p.groups, p.device, p.sm_count);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)};
  s = gemm.initialize(args, ws + arr.bytes, stream);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassInitialize, static_cast<int32_t>(s)};
  s = gemm.run(stream);
  if (s != cutlass::Status::kSuccess) {
    e = cudaGetLastError();
    return e != cudaSuccess ? Status{StatusCode::Cuda, static_cast<int32_t>(e)}
                            : Status{StatusCode::CutlassRun, static_cast<int32_t>(s)};
  }
  return {StatusCode::Ok, 0};
}

}  // namespace grouped_run
}  // namespace moe_gemm
