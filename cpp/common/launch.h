// moe-gemm: what every launch surface shares (element types, the status, group modes, the FP8 GEMMs' kernel
// facts, runtime facts), plain C++17 between the cxx bridges (host compiler) and the CUDA translation units
// (nvcc). No CUTLASS, no CUDA and no cxx headers here: both sides include it. Each kernel family's surface is
// its own folder's launch header.
//
// The enums and structs here are the source of truth: build/bindings.rs generates their Rust types (ffi::sys) as
// the crate builds, which the cxx bridges take as trivial extern types.
#pragma once

#include <cstdint>

namespace moe_gemm {

enum class DType : uint32_t {
  BF16 = 0,
  F16 = 1,
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
// An input element of a quantised row or weight was NaN or infinite (its e4m3 is NaN).
constexpr uint32_t kErrNonfiniteInput = 1u << 7;
// (1u << 8 is kErrScaleOverflow, the MX quantisers': mx/mx_quant.h.)
// A static FP8 activation scale (QuantArgs.scale) was not finite and positive; the rows took scale 1.
constexpr uint32_t kErrBadStaticScale = 1u << 9;

// How a grouped GEMM finds the rows of group g (see GroupedGemmArgs).
enum class GroupMode : uint32_t {
  Offsets = 0,  // rows offsets[g] .. offsets[g+1]
  Padded = 1,   // rows offsets[g] .. offsets[g] + counts[g]; counts[g] <= offsets[g+1] - offsets[g]
  Masked = 2,   // rows g * max_m .. g * max_m + counts[g]; counts[g] <= max_m
  PerRow = 3,   // one row per group: D row g = A row (g / a_div) x B[counts[g]]^T; counts are expert ids < experts
};

// Compile-time facts of one compiled configuration of an FP8 grouped GEMM (blockwise or rowwise), read from the CUTLASS types themselves (not restated), so
// that tests and `moe-gemm info` can check what was built.
struct Fp8KernelFacts {
  int32_t tile_m;  // the MMA tile (on SM100 a 2-SM MMA's 256 rows span both SMs of the cluster)
  int32_t tile_n;
  int32_t tile_k;
  int32_t cluster_m;  // thread-block cluster (M, N)
  int32_t cluster_n;
  int32_t sms_per_mma;  // 1, or 2 for an SM100 2-SM MMA (tcgen05 cta_group::2)
  int32_t scale_m;  // scale granularities the mainloop took from the SFA / SFB layout types
  int32_t scale_n;
  int32_t scale_k;
  bool sfa_k_major;
  bool sfb_k_major;
  bool blockwise_mainloop;  // MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise: two-level accumulation
  bool fast_accumulation;   // a FastAccum schedule (tensor-core accumulation only); never for this family
  int32_t promotion_k;      // elements of K between two promotions of the partial sums into the f32 accumulators
  int32_t stages;           // shared-memory pipeline stages the builder chose
};

// Facts about the compiled library (runtime.cu).
int32_t cudart_version();
// Queues a one-thread kernel that keeps `stream` busy for `ns` nanoseconds (benchmarks: lets the host queue
// the timed work before the device reaches it). Returns the cudaError_t of the launch.
int32_t spin(uint64_t ns, uint64_t stream);
// Queues a streaming read of `bytes` (a multiple of 16) at `ptr` by `blocks` blocks; `sink` holds `blocks` words.
int32_t read_sweep(uint64_t ptr, uint64_t bytes, uint64_t sink, int32_t blocks, uint64_t stream);

}  // namespace moe_gemm
