// moe-gemm: MXFP8, MXFP4 and NVFP4 activations for the SM100 block-scaled grouped GEMMs (mx_quant.cu). Plain C++17; a header of
// its own so that the other quantisation units do not recompile for it.
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Quantises the rows of x [max_rows, k] (bf16 or f16, row stride x_stride) that belong to a group (GroupMode
// Offsets, Padded or Masked, as the grouped GEMMs read them) into MXFP8: e4m3 out [max_rows, k] (row stride k)
// and one UE8M0 byte per row per 32 of K, written in CUTLASS's SM100 block-scale layout, per group:
//   group g (m_g rows) takes 512 * ceil(m_g / 128) * ceil(k / 128) bytes at sf_bases[g] = the sum of those of
//   the groups before it (each a multiple of 512: 128-byte aligned for TMA); within a group, the scale of
//   (row m, block kb) lies at (m / 128 * ceil(k / 128) + kb / 4) * 512 + 16 * (m % 32) + 4 * (m / 32 % 4) + kb % 4.
// sf_bases [groups + 1] is written on the device (sf_bases[groups] = the bytes in use); rows past the layout's
// room (sf_bytes) are not written and set kErrCapacityOverflow. Per block of 32: s = the smallest power of two
// >= max(amax / 448, 2^-127), 1 for an all-zero block; q = e4m3(x / s), round to nearest even. Non-finite
// elements become e4m3 NaN and set kErrNonfiniteInput. Scale bytes of padding rows (m_g .. 128 * ceil(m_g/128))
// are not written. Requires k a positive multiple of 32.
// x holds k_in <= k columns (a multiple of 32): the blocks past it are the zero pad of a K padded for the SM100
// GEMMs (gpt-oss's 2880 as 2944), written without reading x as an all-zero block is (codes 0, scale 1).
struct MxQuantArgs {
  DType dtype;
  GroupMode mode;
  int32_t groups;
  int32_t max_m;
  int32_t k;
  int32_t k_in;
  int64_t max_rows;
  int64_t x_stride;
  uint64_t x;
  uint64_t offsets;
  uint64_t counts;
  uint64_t out;
  uint64_t sf;
  uint64_t sf_bytes;
  uint64_t sf_bases;  // int64_t [groups + 1]
  uint64_t status;
  uint64_t stream;
};
Status quantize_mxfp8_grouped(const MxQuantArgs& args);

// NVFP4 with the caller's tensor scale: a block whose scale exceeded UE4M3's 448 (it saturated; its largest
// elements clipped to +-6).
constexpr uint32_t kErrScaleOverflow = 1u << 8;

enum class Fp4Format : uint32_t {
  Mxfp4 = 0,  // e2m1, one UE8M0 per 32 of K
  Nvfp4 = 1,  // e2m1, one UE4M3 per 16 of K, times one f32 tensor scale
};

// As quantize_mxfp8_grouped, into FP4: out [max_rows, k / 2] bytes (row stride k / 2), e2m1 two per byte, the
// even element in the low nibble; one scale byte per row per V of K (V = 32 MXFP4, 16 NVFP4) in the same
// per-group atom layout (a group takes 512 * ceil(m_g / 128) * ceil(k / (4 V)) bytes; within it (m, kb) lies
// at (m / 128 * ceil(k / (4 V)) + kb / 4) * 512 + 16 * (m % 32) + 4 * (m / 32 % 4) + kb % 4). Bit for bit the
// host's src/quant/mx.rs:
//   MXFP4: s = the smallest power of two >= max(amax / 6, 2^-127), 1 for an all-zero block; q = e2m1(x / s).
//   NVFP4: t = tensor_scale if > 0, else derived from the amax of every grouped row (finite elements):
//          t = max(amax / 2688, 2^-149), 1 for amax 0 (Nvfp4::quantize's rule), written to tensor[0];
//          s = the smallest UE4M3 >= (amax_block / 6) / t (448 at most; past it, with the caller's t,
//          kErrScaleOverflow), 1 for an all-zero block; q = e2m1(x / (s * t)), 0 where s * t is 0.
//   e2m1: nearest, ties to the even code, +-6 at most, the sign kept. Non-finite elements take no part in the
//   amax, become +6 (NaN) or +-6 (inf) and set kErrNonfiniteInput.
// Requires k a positive multiple of V. tensor (NVFP4): f32 [2], [1] the amax scratch. k_in as for MXFP8 (a
// multiple of V): the pad's blocks are all-zero blocks, and take no part in the tensor scale.
struct Fp4QuantArgs {
  Fp4Format format;
  DType dtype;
  GroupMode mode;
  int32_t groups;
  int32_t max_m;
  int32_t k;
  int32_t k_in;
  int64_t max_rows;
  int64_t x_stride;
  uint64_t x;
  uint64_t offsets;
  uint64_t counts;
  uint64_t out;
  uint64_t sf;
  uint64_t sf_bytes;
  uint64_t sf_bases;  // int64_t [groups + 1]
  float tensor_scale;
  uint64_t tensor;
  uint64_t status;
  uint64_t stream;
};
Status quantize_fp4_grouped(const Fp4QuantArgs& args);

}  // namespace moe_gemm
