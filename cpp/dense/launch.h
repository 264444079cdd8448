// moe-gemm: the plain C++17 surface of the bf16/f16 persistent grouped GEMMs, SM90 (grouped_gemm_sm90.cu) and SM100
// (Blackwell, sm_100a: grouped_gemm_sm100.cu), between their cxx bridge (src/kernels/dense/launch.rs, host
// compiler) and the units (nvcc). No CUTLASS, CUDA or cxx headers.
//
// Its types are the source of truth for the family's Rust types (build/bindings.rs generates them as the
// crate builds).
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

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

// One grouped GEMM D[g] = A[g] * B[g]^T over groups described on the device (GroupMode), SM90's or SM100's (the
// configuration, passed beside it, picks the kernel).
//   A: [max_rows, k] row-major; group g owns the rows its GroupMode gives
//   B: [groups, n, k] (nn.Linear weight per group, i.e. column-major k x n)
//   D: [max_rows, n] row-major; rows past offsets[groups] are not written
//   offsets: int32 [groups + 1], offsets[0] == 0, non-decreasing, offsets[groups] <= max_rows (Offsets, Padded)
//   counts: int32 [groups] (Padded, Masked; expert ids for PerRow); max_m: rows per group (Masked),
//   groups * max_m <= max_rows; PerRow: `groups` rows, B holds `experts` matrices, A row of group g is g / a_div
struct GroupedGemmArgs {
  DType dtype;
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
Status grouped_gemm_sm90_bf16_run(TileConfig config, const GroupedGemmArgs& args);

bool grouped_gemm_sm90_f16_built(TileConfig config);
Status grouped_gemm_sm90_f16_workspace(TileConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm90_f16_run(TileConfig config, const GroupedGemmArgs& args);

// Configurations of the SM100 ptr-array grouped GEMM (CUTLASS KernelPtrArrayTmaWarpSpecialized1SmSm100: one SM
// per MMA, tcgen05 UMMA into tensor memory), named by the MMA tile (M x N x K). Cluster 1x1x1. Keep in sync with
// the instantiation lists in grouped_gemm_sm100_*.cu.
enum class Sm100TileConfig : uint32_t {
  Mma1Sm128x256x64 = 0,  // prefill: CUTLASS example 75's 1-SM tile, one read of an A tile per 256 of N
  Mma1Sm128x128x64 = 1,  // few active experts: twice the CTAs streaming weights for the same N
};

// Compile-time facts of one compiled configuration, read from the CUTLASS types themselves.
struct Sm100KernelFacts {
  int32_t tile_m;  // MMA tile (M x N x K) of the collective
  int32_t tile_n;
  int32_t tile_k;
  int32_t cluster_m;
  int32_t cluster_n;
  int32_t atom_m;              // SMs per MMA (1 for the 1-SM schedules)
  int32_t stages;              // shared-memory pipeline stages the builder chose
  bool umma_array_mainloop;    // MainloopSm100ArrayTmaUmmaWarpSpecialized: tcgen05 UMMA, ptr-array TMA
  bool ptr_array_epilogue;     // the epilogue updates its TMA descriptors per group
};

// The SM100 entry points, over GroupedGemmArgs too. _run checks what CUTLASS would if it had the shapes (it checks
// nothing when they live only on the device): n, k positive multiples of 8, a/b/d 16-byte aligned and non-null,
// the arrays the mode reads present, groups * max_m <= max_rows (Masked), groups <= max_rows with a_div, experts
// positive (PerRow); a violation is CutlassCannotImplement.
bool grouped_gemm_sm100_bf16_built(Sm100TileConfig config);
Status grouped_gemm_sm100_bf16_workspace(Sm100TileConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm100_bf16_run(Sm100TileConfig config, const GroupedGemmArgs& args);
// NotBuilt (and `facts` untouched) for a configuration that was not compiled.
Status grouped_gemm_sm100_bf16_facts(Sm100TileConfig config, Sm100KernelFacts* facts);

}  // namespace moe_gemm
