// moe-gemm: the plain C++17 surface of the SM100 block-scaled grouped GEMMs (grouped_gemm_sm100_mxfp8.cu). No
// CUTLASS, CUDA or cxx headers. The enum is the source of truth; src/ffi/bridge.rs redeclares it.
#pragma once

#include <cstdint>

#include "launch.h"

namespace moe_gemm {

// Configurations: MMA tile (M x N x K), one SM per MMA, cluster 1x1x1.
enum class Sm100MxConfig : uint32_t {
  Mxf8Mma1Sm128x128x128 = 0,    // MXFP8 x MXFP8 (tcgen05 kind::mxf8f6f4, UE8M0 per 32 of K)
  Mxf8f4Mma1Sm128x128x128 = 1,  // MXFP8 activations x MXFP4 weights (gpt-oss): the same instruction kind; B
                                // e2m1 packed two per byte, low nibble first
};

// D[r, :] (bf16) = sum over K of (qa[r, k] * 2^sfa[r, k/32]) * (qb[g][n, k] * 2^sfb[g][n, k/32]) for the rows
// of group g (GroupMode as for the other grouped GEMMs; not PerRow):
//   a:   e4m3 [max_rows, k] row-major;  sfa: UE8M0 bytes, group g's in CUTLASS's 128 x 4 atoms at
//        sfa + sfa_bases[g] (int64 [groups + 1], as quantize_mxfp8_grouped writes them: mx_quant.h)
//   b:   e4m3 [groups, n, k] ([out, in]), or for Mxf8f4 e2m1 [groups, n, k / 2] bytes;
//        sfb: UE8M0 atoms of each expert's [n, k/32] grid, expert g's at
//        g * 512 * ceil(n / 128) * ceil(k / 128)
//   d:   bf16 [max_rows, n]
// Requires n and k positive multiples of 128 (for the 4-bit B of Mxf8f4 CUTLASS needs 128-element rows anyway),
// a/b/d 16-byte and sfa/sfb 128-byte aligned (checked by _run).
struct GroupedGemmMxfp8Args {
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

bool grouped_gemm_sm100_mxfp8_built(Sm100MxConfig config);
Status grouped_gemm_sm100_mxfp8_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count, uint64_t* bytes);
Status grouped_gemm_sm100_mxfp8_run(const GroupedGemmMxfp8Args& args);

}  // namespace moe_gemm
