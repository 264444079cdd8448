// moe-gemm: the plain C++17 surface of the SM90 FP8 rowwise-scaled grouped GEMM, between its cxx bridge
// (src/kernels/fp8_rowwise/launch.rs) and grouped_gemm_sm90_fp8_rowwise.cu. No CUTLASS, CUDA or cxx headers; a
// header of its own so that the other CUTLASS units, which hash the headers they include, do not recompile for it.
//
// Its types are the source of truth for the family's Rust types (build/bindings.rs generates them as the
// crate builds).
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Configurations of the rowwise family, named by accumulation, schedule and CTA tile (M x N x K); cluster
// 1x1x1. FastAccum sums the whole K in the tensor cores' accumulators; Promoted adds the tensor cores' partial
// sums into f32 registers (FADD) every 4 MMAs (128 of K): slower, and the choice for long K.
enum class Fp8RowwiseConfig : uint32_t {
  FastAccumPingpong64x128x128 = 0,     // decode: 64-row tiles
  FastAccumCooperative128x128x128 = 1, // prefill
  PromotedCooperative128x128x128 = 2,  // prefill, promoted accumulation
};

// D[r, n] (bf16) = (A[r, :] . B[g][n, :]) * sa[r] * sb[g][n], with e4m3 A and B and f32 scales, per token (A's
// rows) and per output channel (B's rows). For group g (GroupMode, as for the bf16 GEMM; not PerRow):
//   a:  e4m3 [max_rows, k] row-major         sa: f32 [max_rows] (row r's scale at r)
//   b:  e4m3 [groups, n, k] ([out, in])      sb: f32 [groups, n] (expert g's channel scales at g * n)
//   d:  bf16 [max_rows, n] row-major; rows outside every group are not written
// A per-tensor scale is the same value in every element of sa (activations) or of one expert's sb (weights).
// Requires n and k positive multiples of 16, a/b/d 16-byte aligned, sa 4-byte and sb 16-byte aligned (checked
// by _run, reported as CutlassCannotImplement: CUTLASS checks nothing when the shapes live on the device).
struct GroupedGemmFp8RowwiseArgs {
  Fp8RowwiseConfig config;
  GroupMode mode;
  int32_t max_m;
  int32_t groups;
  int32_t n;
  int32_t k;
  int64_t max_rows;
  uint64_t a;
  uint64_t sa;
  uint64_t b;
  uint64_t sb;
  uint64_t d;
  uint64_t offsets;
  uint64_t counts;
  uint64_t workspace;
  uint64_t workspace_bytes;
  uint64_t status;  // uint32_t* device status word (kErr* bits of launch.h)
  int32_t device;
  int32_t sm_count;
  uint64_t stream;  // cudaStream_t / CUstream
};

bool grouped_gemm_sm90_fp8_rowwise_built(Fp8RowwiseConfig config);
Status grouped_gemm_sm90_fp8_rowwise_workspace(Fp8RowwiseConfig config, int32_t groups, int32_t sm_count,
                                               uint64_t* bytes);
Status grouped_gemm_sm90_fp8_rowwise_run(const GroupedGemmFp8RowwiseArgs& args);
// Facts as for the blockwise family (launch_fp8.h): scale_m = scale_n = 1 (per row, per channel), scale_k = 0
// (the whole K), blockwise_mainloop false, promotion_k = 0 for FastAccum (never promoted).
Status grouped_gemm_sm90_fp8_rowwise_facts(Fp8RowwiseConfig config, Fp8KernelFacts* facts);
const char* grouped_gemm_sm90_fp8_rowwise_schedule(Fp8RowwiseConfig config);

}  // namespace moe_gemm
