// moe-gemm: the plain C++17 surface between the cxx bridge (bridge.cc, host compiler) and the CUDA translation
// units (*.cu, nvcc). No CUTLASS, no CUDA and no cxx headers here: both sides include it.
//
// The enums and structs here are the source of truth: scripts/bindgen.sh generates their Rust types
// (src/ffi/sys.rs), which the cxx bridges take as trivial extern types.
#pragma once

#include <cstdint>

namespace moe_gemm {

enum class DType : uint32_t {
  BF16 = 0,
  F16 = 1,
};

// Kernel configurations of the SM90 persistent grouped GEMM, named by schedule and CTA tile (M x N x K).
// Cluster shape is 1x1x1 for all of them (a 256x128 tile on a 2x1 cluster measured slower on every point of the
// bench suite, H200, 2026-11-29). Keep in sync with the instantiation lists in grouped_gemm_sm90_*.cu.
enum class TileConfig : uint32_t {
  Cooperative128x128x64 = 0,
  Cooperative128x256x64 = 1,
  Pingpong64x128x64 = 2,
  Pingpong128x128x64 = 3,
  Pingpong64x64x128 = 4,
};

enum class StatusCode : uint32_t {
  Ok = 0,
  NotBuilt = 1,               // this (arch, dtype, config) was not compiled into the library
  WorkspaceTooSmall = 2,      // detail = bytes needed (low 32 bits clamp)
  CutlassCannotImplement = 3, // detail = cutlass::Status
  CutlassInitialize = 4,      // detail = cutlass::Status
  CutlassRun = 5,             // detail = cutlass::Status
  Cuda = 6,                   // detail = cudaError_t
};

struct Status {
  StatusCode code;
  int32_t detail;
};

// Bits of the device status word (a caller-owned uint32 on the device, `moe_gemm::DeviceStatus` in Rust). Kernels
// that validate device data only OR bits in, after clamping so that nothing is read or written out of bounds;
// the host reads and clears the word at a checked point. The Rust names are in src/status.rs.
constexpr uint32_t kErrOffsetsNotZeroBased = 1u << 0;
constexpr uint32_t kErrOffsetsNotMonotone = 1u << 1;
constexpr uint32_t kErrOffsetsOutOfRange = 1u << 2;
constexpr uint32_t kErrNonfiniteLogits = 1u << 3;
constexpr uint32_t kErrExpertIdOutOfRange = 1u << 4;
constexpr uint32_t kErrCapacityOverflow = 1u << 5;
constexpr uint32_t kErrGroupCountOutOfRange = 1u << 6;

// How a grouped GEMM finds the rows of group g (see GroupedGemmArgs).
enum class GroupMode : uint32_t {
  Offsets = 0,  // rows offsets[g] .. offsets[g+1]
  Padded = 1,   // rows offsets[g] .. offsets[g] + counts[g]; counts[g] <= offsets[g+1] - offsets[g]
  Masked = 2,   // rows g * max_m .. g * max_m + counts[g]; counts[g] <= max_m
  PerRow = 3,   // one row per group: D row g = A row (g / a_div) x B[counts[g]]^T; counts are expert ids < experts
};

// One grouped GEMM D[g] = A[g] * B[g]^T over groups described on the device (GroupMode).
//   A: [max_rows, k] row-major; group g owns the rows its GroupMode gives
//   B: [groups, n, k] (nn.Linear weight per group, i.e. column-major k x n)
//   D: [max_rows, n] row-major; rows past offsets[groups] are not written
//   offsets: int32 [groups + 1], offsets[0] == 0, non-decreasing, offsets[groups] <= max_rows (Offsets, Padded)
//   counts: int32 [groups] (Padded, Masked; expert ids for PerRow); max_m: rows per group (Masked),
//   groups * max_m <= max_rows; PerRow: `groups` rows, B holds `experts` matrices, A row of group g is g / a_div
struct GroupedGemmArgs {
  DType dtype;
  TileConfig config;
  GroupMode mode;
  int32_t max_m;
  int32_t a_div;
  int32_t experts;
  int32_t groups;
  int32_t n;
  int32_t k;
  int64_t max_rows;
  uint64_t a;
  uint64_t b;
  uint64_t d;
  uint64_t offsets;
  uint64_t counts;
  uint64_t workspace;
  uint64_t workspace_bytes;
  uint64_t status;  // uint32_t* device status word
  int32_t device;
  int32_t sm_count;
  uint64_t stream;  // cudaStream_t / CUstream
};

// Per dtype family: one definition each in grouped_gemm_sm90_<dtype>.cu.
bool grouped_gemm_sm90_bf16_built(TileConfig config);
Status grouped_gemm_sm90_bf16_workspace(TileConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm90_bf16_run(const GroupedGemmArgs& args);

bool grouped_gemm_sm90_f16_built(TileConfig config);
Status grouped_gemm_sm90_f16_workspace(TileConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm90_f16_run(const GroupedGemmArgs& args);

// Facts about the compiled library (runtime.cu).
int32_t cudart_version();
// Queues a one-thread kernel that keeps `stream` busy for `ns` nanoseconds (benchmarks: lets the host queue
// the timed work before the device reaches it). Returns the cudaError_t of the launch.
int32_t spin(uint64_t ns, uint64_t stream);
// Queues a streaming read of `bytes` (a multiple of 16) at `ptr` by `blocks` blocks; `sink` holds `blocks` words.
int32_t read_sweep(uint64_t ptr, uint64_t bytes, uint64_t sink, int32_t blocks, uint64_t stream);

}  // namespace moe_gemm
