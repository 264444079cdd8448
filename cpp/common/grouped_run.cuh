// The host side every CUTLASS ptr-array grouped GEMM wrapper of ours shares: carving the per-group arrays out of
// the caller's workspace, the arguments all families set alike, the workspace size, and one launch (checks, our
// prepare kernel, CUTLASS's can_implement / initialize / run) with the statuses mapped alike. A family's G
// provides Arrays, carve(base, groups), arguments(arr, groups, device, sm_count) and Gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/gemm_enumerated_types.h"

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

// The per-group arrays of a plain grouped GEMM (A, B and D of one element type): shapes, operand pointers and
// packed strides, carved in this order.
template <class Shape, class Element, class StrideA, class StrideB, class StrideD>
struct PlainArrays {
  Shape* shapes;
  const Element** a;
  const Element** b;
  Element** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  uint64_t bytes;  // total bytes of the arrays, 256-aligned

  static PlainArrays carve(uint8_t* base, int groups) {
    Carver c{base};
    const uint64_t g = static_cast<uint64_t>(groups);
    PlainArrays r{c.take<Shape>(g),   c.take<const Element*>(g), c.take<const Element*>(g), c.take<Element*>(g),
                  c.take<StrideA>(g), c.take<StrideB>(g),        c.take<StrideD>(g),        0};
    r.bytes = c.bytes;
    return r;
  }
};

// What every family's CUTLASS arguments share: grouped mode over the device-only shapes, the per-group pointers
// and strides of A and B, D written with no source C (C's stride is D's), and the persistent grid's device and
// SM count. The family adds its scales and the epilogue's scalars.
template <class Gemm, class Shape, class A, class StrideA, class B, class StrideB, class D, class StrideD>
typename Gemm::Arguments base_arguments(int groups, Shape* shapes, A a, StrideA* sa, B b, StrideB* sb, D d,
                                        StrideD* sd, int device, int sm_count) {
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = typename Gemm::GemmKernel::ProblemShape{groups, shapes, nullptr};
  args.mainloop.ptr_A = a;
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = b;
  args.mainloop.dB = sb;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sd;
  args.epilogue.ptr_D = d;
  args.epilogue.dD = sd;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

// The per-group scale pointers and layouts of a block-scaled mainloop (FP8 blockwise, MX and NVFP4).
template <class Args, class Arrays>
void set_block_scales(Args& args, const Arrays& arr) {
  args.mainloop.ptr_SFA = arr.sfa;
  args.mainloop.layout_SFA = arr.lsfa;
  args.mainloop.ptr_SFB = arr.sfb;
  args.mainloop.layout_SFB = arr.lsfb;
}

// What a launch of G needs: our arrays, then CUTLASS's own workspace for arguments over them.
template <class G>
uint64_t workspace_bytes(int groups, int sm_count) {
  const typename G::Arrays arr = G::carve(nullptr, groups);
  return arr.bytes + align_up(G::Gemm::get_workspace_size(G::arguments(arr, groups, 0, sm_count)), 256);
}

// The status of the kernel launch just made with <<<...>>>.
inline Status launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

// Queues prepare(arr, stream) (our kernel filling the per-group arrays; it returns the launch's status) and the
// CUTLASS GEMM of G for the arguments p (groups, sm_count, device, workspace, workspace_bytes, stream), after
// `checked` (the family's own checks of p) passed. Nothing is queued when a check fails.
template <class G, class Args, class Prepare>
Status run(const Args& p, Status checked, Prepare prepare) {
  if (p.groups == 0) return {StatusCode::Ok, 0};
  if (checked.code != StatusCode::Ok) return checked;
  const uint64_t need = workspace_bytes<G>(p.groups, p.sm_count);
  if (p.workspace_bytes < need) {
    return {StatusCode::WorkspaceTooSmall, static_cast<int32_t>(need > 0x7fffffff ? 0x7fffffff : need)};
  }
  auto* ws = reinterpret_cast<uint8_t*>(p.workspace);
  typename G::Arrays arr = G::carve(ws, p.groups);
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  const Status prepared = prepare(arr, stream);
  if (prepared.code != StatusCode::Ok) return prepared;
  auto args = G::arguments(arr, p.groups, p.device, p.sm_count);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassCannotImplement, static_cast<int32_t>(s)};
  s = gemm.initialize(args, ws + arr.bytes, stream);
  if (s != cutlass::Status::kSuccess) return {StatusCode::CutlassInitialize, static_cast<int32_t>(s)};
  s = gemm.run(stream);
  if (s != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? Status{StatusCode::Cuda, static_cast<int32_t>(e)}
                            : Status{StatusCode::CutlassRun, static_cast<int32_t>(s)};
  }
  return {StatusCode::Ok, 0};
}

}  // namespace grouped_run
}  // namespace moe_gemm
