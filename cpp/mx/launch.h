// moe-gemm: the plain C++17 surface of the block-scaled grouped GEMMs: SM100 (grouped_gemm_sm100_mxfp8.inl,
// grouped_gemm_sm100_fp4.inl) and portable (grouped_mx_portable.cu), called by their cxx bridge
// (src/kernels/mx/launch.rs). No CUTLASS, CUDA or cxx headers. Its types are the source of truth for
// the family's Rust types (build/bindings.rs generates them as the crate builds).
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Configurations: activation x weight format, SMs per MMA and MMA tile (M x N x K): 1Sm in a 1x1x1 cluster, 2Sm
// (tcgen05 cta_group::2, each SM of a static 2x1x1 cluster holding 128 of the 256 rows) for the prefill shapes.
// The CUTLASS 4.2 builder has no FP8 x NVFP4 (UE4M3 scales exist only for 4-bit x 4-bit, kind::mxf4nvf4).
enum class Sm100MxConfig : uint32_t {
  Mxf8Mma1Sm128x128x128 = 0,    // MXFP8 x MXFP8 (tcgen05 kind::mxf8f6f4, UE8M0 per 32 of K)
  Mxf8f4Mma1Sm128x128x128 = 1,  // MXFP8 activations x MXFP4 weights (gpt-oss): the same instruction kind; B
                                // e2m1 packed two per byte, low nibble first
  Mxf4Mma1Sm128x128x256 = 2,    // MXFP4 x MXFP4 (kind::mxf4, UE8M0 per 32)
  Nvf4Mma1Sm128x128x256 = 3,    // NVFP4 x NVFP4 (kind::mxf4nvf4, UE4M3 per 16, alpha = the tensor scales)
  Mxf8Mma2Sm256x256x128 = 4,    // MXFP8 x MXFP8 on two SMs (N a multiple of 256)
};

// The unit that compiles a configuration.
inline bool sm100_mx_is_fp4(Sm100MxConfig c) {
  return c == Sm100MxConfig::Mxf4Mma1Sm128x128x256 || c == Sm100MxConfig::Nvf4Mma1Sm128x128x256;
}

// D[r, :] (bf16) = alpha_g * sum over K of (qa[r, k] * sfa[r, k/V]) * (qb[g][n, k] * sfb[g][n, k/V]) for the
// rows of group g (GroupMode as for the other grouped GEMMs; not PerRow), V = 32 (MX) or 16 (NVFP4):
//   a:   e4m3 [max_rows, k] row-major, or (Mxf4, Nvf4) e2m1 [max_rows, k / 2] bytes; sfa: the scale bytes
//        (UE8M0, or UE4M3 for Nvf4), group g's in CUTLASS's 128 x 4 atoms at sfa + sfa_bases[g] (int64
//        [groups + 1], as the device quantisers write them: mx_quant.h)
//   b:   e4m3 [groups, n, k] ([out, in]), or (Mxf8f4, Mxf4, Nvf4) e2m1 [groups, n, k / 2] bytes;
//        sfb: each expert's [n, k/V] grid in atoms, expert g's at g * 512 * ceil(n / 128) * ceil(k / (4 V))
//   alpha_g: 1, or for Nvf4 a_tensor_scale[0] * b_tensor_scales[g] (device f32; both 0 for the MX configs)
//   d:   bf16 [max_rows, n]
// Requires n a positive multiple of the MMA tile's N (128; 256 for the 2Sm configurations), k of 128 (for the
// 4-bit B of Mxf8f4 CUTLASS needs 128-element rows anyway), a/b/d 16-byte and sfa/sfb 128-byte aligned (checked
// by _run).
struct GroupedGemmMxArgs {
  Sm100MxConfig config;
  GroupMode mode;
  int32_t max_m;
  int32_t groups;
  int32_t n;
  int32_t k;
  int64_t max_rows;
  uint64_t a;
  uint64_t sfa;
  uint64_t sfa_bases;
  uint64_t b;
  uint64_t sfb;
  uint64_t a_tensor_scale;
  uint64_t b_tensor_scales;
  uint64_t d;
  uint64_t offsets;
  uint64_t counts;
  uint64_t workspace;
  uint64_t workspace_bytes;
  uint64_t status;
  int32_t device;
  int32_t sm_count;
  uint64_t stream;
};

// Each unit answers for its own configurations (NotBuilt for the others).
bool grouped_gemm_sm100_mxf8_built(Sm100MxConfig config);
Status grouped_gemm_sm100_mxf8_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm100_mxf8_run(const GroupedGemmMxArgs& args);
bool grouped_gemm_sm100_fp4_built(Sm100MxConfig config);
Status grouped_gemm_sm100_fp4_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm100_fp4_run(const GroupedGemmMxArgs& args);

// The SM100 block-scaled grouped GEMMs' function over their operand buffers, exactly as grouped_gemm_sm100_mx_run
// takes them (GroupedGemmMxArgs, above), on any GPU with bf16 tensor cores (the sm_90 and sm_100
// SASS built here): the operands are dequantised exactly into bf16 and multiplied with f32 accumulation. `config`
// picks the format pair only (a 2-SM configuration computes its pair; N need be whole 128s for every
// configuration); the workspace fields and sm_count are not read. Requires what _run requires of the shape, the
// alignments and the tensor scales; refuses PerRow. Each group's clamp bits (group_rows::resolve) are ORed into
// the status word once per group.
Status grouped_gemm_mx_portable_run(const GroupedGemmMxArgs& args);

}  // namespace moe_gemm
