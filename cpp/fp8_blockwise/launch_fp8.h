// moe-gemm: the plain C++17 surface of the FP8 blockwise grouped GEMMs, between their cxx bridge
// (src/kernels/fp8_blockwise/launch.rs) and grouped_gemm_sm90_fp8_blockwise.inl (and the SM100 .inl). No CUTLASS,
// CUDA or cxx headers. A header of its own, so that adding to it does not change common/launch.h, which every
// unit hashes and would recompile for.
//
// Its types are the source of truth for the family's Rust types (build/bindings.rs generates them as the
// crate builds).
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Configurations of the SM90 FP8 blockwise-scaled grouped GEMM, named by schedule and CTA tile (M x N x K).
// Cluster 1x1x1. TileK is 128 for both: the blockwise mainloop promotes its partial sums once per scale block
// of K (128), and CUTLASS requires the promotion interval to cover a whole K tile. Keep in sync with the list in
// grouped_gemm_sm90_fp8_blockwise.inl.
enum class Fp8TileConfig : uint32_t {
  Cooperative128x128x128 = 0,  // prefill: two consumer warpgroups on one 128-row tile
  Pingpong64x128x128 = 1,      // decode: 64-row tiles, half the idle MMA rows of a 128-row tile for tiny groups
  // SM100 (grouped_gemm_sm100_fp8.cu): tcgen05, the same operands. One SM per 128x128x128 MMA tile
  // (cluster 1x1x1), or two SMs per 256x128x128 MMA tile (tcgen05 cta_group::2, a static 2x1x1 cluster, each SM
  // holding 128 of the 256 rows): for prefill.
  Sm100Blockwise1Sm128x128x128 = 2,
  Sm100Blockwise2Sm256x128x128 = 3,
  // SM90, built into the SM90 unit: decode, no CUTLASS (swapab_decode.cuh): mma.sync with the weights on the
  // MMA's M side and 16 rows of a group on its N side; no workspace.
  SwapAb16 = 4,
};

// D[r, :] (bf16) = sum over K blocks kb of (A[r, kb] . B[g][:, kb]^T) * sfa[r, kb] * sfb[g][n / 128, kb], with
// e4m3 A and B, f32 scales and f32 accumulation promoted once per 128 of K. For group g (GroupMode, as for the
// bf16 GEMM; PerRow is not offered by this family):
//   a:   e4m3 [max_rows, k] row-major
//   sfa: f32 [max_rows, ceil(k / 128)] (K-major: one scale per row per 128 of K; group g's start at
//        row_start * ceil(k / 128))
//   b:   e4m3 [groups, n, k] (nn.Linear [out, in] per expert)
//   sfb: f32 [groups, ceil(n / 128), ceil(k / 128)] (DeepSeek's weight_scale_inv per expert, a dequantisation
//        multiplier)
//   d:   bf16 [max_rows, n] row-major; rows outside every group are not written
// Requires n a positive multiple of 128, k a positive multiple of 16, a/b/d 16-byte aligned, sfa/sfb 4-byte
// aligned (checked by _run, which reports a violation as CutlassCannotImplement: CUTLASS itself checks nothing
// when the problem shapes live only on the device).
struct GroupedGemmFp8Args {
  Fp8TileConfig config;
  GroupMode mode;
  int32_t max_m;
  int32_t groups;
  int32_t n;
  int32_t k;
  int64_t max_rows;
  uint64_t a;
  uint64_t sfa;
  uint64_t b;
  uint64_t sfb;
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


// The entry points of one arch's unit (ARCH: sm90, or sm100 for Sm100Blockwise{1Sm128x128x128,2Sm256x128x128},
// the same arguments and operands on an SM100 GPU): whether `config` was compiled; its workspace; the launch;
// its compile-time facts (NotBuilt, `facts` untouched, for a configuration that was not compiled); the CUTLASS
// kernel schedule's name, e.g. "KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise" ("" when not built).
#define MOE_GEMM_DECLARE_FP8_BLOCKWISE(ARCH)                                                                    \
  bool grouped_gemm_##ARCH##_fp8_blockwise_built(Fp8TileConfig config);                                       \
  Status grouped_gemm_##ARCH##_fp8_blockwise_workspace(Fp8TileConfig config, int32_t groups, int32_t sm_count, \
                                                       uint64_t* bytes);                                      \
  Status grouped_gemm_##ARCH##_fp8_blockwise_run(const GroupedGemmFp8Args& args);                             \
  Status grouped_gemm_##ARCH##_fp8_blockwise_facts(Fp8TileConfig config, Fp8KernelFacts* facts);              \
  const char* grouped_gemm_##ARCH##_fp8_blockwise_schedule(Fp8TileConfig config);
MOE_GEMM_DECLARE_FP8_BLOCKWISE(sm90)
MOE_GEMM_DECLARE_FP8_BLOCKWISE(sm100)
#undef MOE_GEMM_DECLARE_FP8_BLOCKWISE

}  // namespace moe_gemm
