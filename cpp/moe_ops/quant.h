// moe-gemm: the plain C++17 surface of the FP8 quantisation kernels (quant.cu): activations per 1 x 128 group
// (QuantArgs) and expert weights per 128 x 128 block (WeightQuantArgs, at the end). Kept apart from launch.h and
// moe_ops.h so that editing it recompiles no CUTLASS translation unit.
//
// Activations, per token and per group of 128 columns (DeepSeek-V3's 1 x 128 activation blocks):
//   amax  = max |x| over the group's finite elements (a partial last group: over the columns it has)
//   scale = max(amax, eps) / 448, IEEE division; with ue8m0, rounded UP to a power of two (exponent + (mantissa
//           != 0), the bits of DeepGEMM's ceil_to_ue8m0)
//   q     = e4m3(x / scale), IEEE division, round to nearest even, saturating to +-448 (cvt.rn.satfinite);
//           a NaN or +-inf element becomes the e4m3 NaN with the element's sign (0x7F / 0xFF) and sets
//           kErrNonfiniteInput.
// Output: q [out_rows, k] (row stride k) and f32 scales K-major [out_rows][ceil(k / 128)], the per-group layout the
// SM90 CUTLASS blockwise grouped GEMM reads (a group's scales start at row_start * ceil(k / 128)).
//
// Per token (per_row): the same rules with one group of all k columns (amax over the row's finite elements);
// scales f32 [out_rows], what the rowwise-scaled grouped GEMM reads (Fp8TokenRows). With `scale` (per_row only)
// every row takes that static scale (a checkpoint's input_scale, device data) instead of its own, as is: a scale
// that is not finite and positive is replaced by 1 and sets kErrBadStaticScale. With `amax` instead (per_row only,
// dynamic per tensor): every row takes one scale, max(amax, eps) / 448 by the rules above, amax over the finite
// elements of every row the call quantises (Rows: the rows in use; Gather: every token); a first kernel reduces it
// into the uint32 word at `amax` (the f32 bits; zeroed first, on the stream), the second reads it.
#pragma once

#include <cstdint>

#include "common/launch.h"

namespace moe_gemm {

// Columns per scale.
constexpr int32_t kQuantGroup = 128;

enum class QuantSource : uint32_t {
  // out row r = quant(x row r) for r < rows; with row_experts, rows whose expert is outside [0, experts) are
  // skipped; with total, rows at or after min(*total, rows) are skipped (the activation kernel's rule).
  Rows = 0,
  // out row positions[t * top_k + j] = quant(x row t) for t < rows (tokens), j < top_k: the layout's gather and
  // the quantisation in one pass. Positions < 0 are dropped; positions >= out_rows are dropped and reported
  // (kErrCapacityOverflow).
  Gather = 1,
};

struct QuantArgs {
  DType dtype;          // of x
  QuantSource source;
  int64_t rows;         // Rows: rows of x (and of out); Gather: tokens (rows of x)
  int32_t top_k;        // Gather: slots per token (1 for Rows)
  int32_t k;            // columns of x and out
  int64_t x_stride;     // elements between rows of x (>= k)
  uint64_t x;           // [rows, x_stride] 16-bit
  uint64_t positions;   // Gather: int32 [rows * top_k]; Rows: 0
  int64_t out_rows;     // rows of out and scales
  uint64_t total;       // Rows: int32 [1] or 0
  uint64_t row_experts; // Rows: int32 [rows] or 0
  int32_t experts;      // Rows with row_experts: the valid range of an expert id
  float eps;            // amax floor: positive, eps / 448 a normal f32 (checked by the caller)
  int32_t ue8m0;        // nonzero: scales rounded up to powers of two
  int32_t per_row;      // nonzero: one scale per row over all k columns (scales [out_rows])
  uint64_t scale;       // per_row: f32 [1], a static scale for every row; 0: each row's own
  uint64_t amax;        // per_row, scale 0: uint32 [1] scratch, one dynamic scale for every row (above); 0: none
  uint64_t out;         // uint8 (e4m3) [out_rows, k]
  uint64_t scales;      // f32 [out_rows, ceil(k / 128)], or [out_rows] per row
  uint64_t status;      // uint32 device status word
  uint64_t stream;
};
Status quantize_fp8(const QuantArgs& args);

// Expert weights [experts, n, k] (nn.Linear [out, in] per expert) quantised per 128 x 128 block (DeepSeek-V3's
// weight blocks; the edge blocks of n % 128 rows or k % 128 columns cover what they have), the rules of the host
// quantiser BlockFp8::quantize (src/quant/mod.rs), bit for bit:
//   amax  = max |w| over the block's finite elements
//   scale = 1 for amax == 0; otherwise max(amax / 448, 2^-149) (IEEE division; the floor, the smallest positive
//           f32, keeps blocks of subnormals from a zero scale), with ue8m0 rounded UP to a power of two, at least
//           2^-127 (the smallest UE8M0; where amax / 448 <= 2^-128 the host refuses the block and the device
//           takes 2^-127, which saturates nothing: |w| / scale <= 224)
//   q     = e4m3(w / scale), IEEE division, round to nearest even, saturating to +-448; a NaN or +-inf element
//           becomes the e4m3 NaN with its sign (0x7F / 0xFF) and sets kErrNonfiniteInput (the host refuses such a
//           weight); the other elements of its block are quantised by the scale of the finite ones.
// Output: q [experts, n, k] (same layout as w) and f32 scales [experts, ceil(n / 128), ceil(k / 128)] (UE8M0
// scales as their f32 values 2^(b - 127)), the SFB layout of the blockwise grouped GEMM (launch_fp8.h).
constexpr int32_t kWeightBlock = 128;

struct WeightQuantArgs {
  DType dtype;      // of w
  int32_t ue8m0;    // nonzero: scales rounded up to powers of two
  int64_t experts;  // > 0
  int32_t n;        // rows per expert, > 0
  int32_t k;        // columns, > 0
  uint64_t w;       // [experts, n, k] 16-bit, any alignment (8-byte vectors where k % 8 == 0 and w % 16 == 0)
  uint64_t out;     // uint8 (e4m3) [experts, n, k]
  uint64_t scales;  // f32 [experts, ceil(n / 128), ceil(k / 128)]
  uint64_t status;  // uint32 device status word
  uint64_t stream;
};
Status quantize_weights_fp8(const WeightQuantArgs& args);

}  // namespace moe_gemm
