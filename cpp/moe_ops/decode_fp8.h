// moe-gemm: the plain C++17 surface of the FP8 decode kernels (decode_fp8.cu), the Batched backend over FP8 experts
// (block-scaled or per channel). Kept apart from moe_ops.h so that editing it recompiles no other translation unit.
//
// Per (token, slot) row r = t * top_k + j with expert e = ids[r] (rows of an expert outside [0, experts) are
// skipped and set kErrExpertIdOutOfRange), the same function as the FP8 layout path:
//   x_q   = e4m3 quantisation of x[t] per 128 columns (quant.h's rules, eps and ue8m0 below)
//   d1    = bf16(x_q . w13[e]^T), each 128-column block's partial sum scaled by its activation and weight scale
//   h[r]  = bf16(act(d1 + b13[e]))                (gate rows 0 .. I, up rows I .. 2I: GateUp::Concatenated)
//   h_q   = e4m3 quantisation of h[r] per 128 columns
//   y[t]  = bf16(sum_j w[r] * (bf16(h_q . w2[e]^T) + b2[e]))   (over the slots in order, in f32)
// H and I are multiples of 128. Weights e4m3 [E, 2I, H] and [E, H, I] with f32 scales [E, 2I / 128, H / 128] and
// [E, H / 128, I / 128] (DeepSeek's weight_scale_inv, stacked).
//
// Block128 quantises each row of h once, in the expand kernel: the four blocks that write a 128-column group of
// h count themselves in `arrivals`, and the one that finds the count at 3 (mod 4) quantises the group into h_q
// and h_scales. The counters are never reset: a launch adds 4 to each group it writes (the blocks of a row with
// an expert id out of range count nothing), so zeroed once they stay at multiples of 4 between launches.
//
// Per-channel weights (scaling != Block128): one f32 scale per output row, [E, 2I] and [E, H], and one activation
// scale per row of x and of h (ChannelToken: max(amax of the row, eps) / 448; ChannelTensor: the same of every
// row of x, and of every row of h in use; ChannelStatic: x_scale and h_scale, device data replaced by 1 and
// flagged kErrBadStaticScale unless finite and positive). d1 = bf16((x_q . w13[e]^T) * s_x * s_w13[row]), h_q and
// d2 alike: the rowwise layer's function (fp8_channel.rs).
#pragma once

#include <cstdint>

#include "common/launch.h"
#include "common/moe_ops.h"

namespace moe_gemm {

// How the weights and the activations are scaled.
enum class DecodeScaling : int32_t {
  Block128 = 0,       // weights per 128 x 128 block, activations per token per 128 columns
  ChannelToken = 1,   // weights per output row, activations per row at run time
  ChannelTensor = 2,  // weights per output row, activations per tensor at run time (amax words)
  ChannelStatic = 3,  // weights per output row, activations by the checkpoint's scales (x_scale, h_scale)
};

struct DecodeFp8Args {
  Activation act;       // gated: SiluGated or GptOssSwiglu
  DecodeScaling scaling;
  int32_t tokens;
  int32_t top_k;        // at most 32
  int32_t experts;
  int32_t hidden;       // H, a multiple of 128
  int32_t inter;        // I, a multiple of 128
  float eps;            // the activation quantisation's amax floor (quant.h)
  int32_t ue8m0;        // nonzero: activation scales rounded up to powers of two
  uint64_t x;           // bf16 [tokens, H]
  uint64_t ids;         // int32 [tokens * top_k]
  uint64_t weights;     // f32 [tokens * top_k]
  uint64_t w13;         // e4m3 [E, 2I, H]
  uint64_t w13_scales;  // f32 [E, 2I / 128, H / 128] (Block128) or [E, 2I]
  uint64_t w2;          // e4m3 [E, H, I]
  uint64_t w2_scales;   // f32 [E, H / 128, I / 128] (Block128) or [E, H]
  uint64_t b13;         // f32 [E, 2I] or 0
  uint64_t b2;          // f32 [E, H] or 0
  uint64_t h;           // bf16 scratch [tokens * top_k, I]
  uint64_t h_q;         // Block128: e4m3 scratch [tokens * top_k, I], h quantised once for the reduce kernel
  uint64_t h_scales;    // Block128: f32 scratch [tokens * top_k, I / 128], its scales
  uint64_t arrivals;    // Block128: u32 scratch [tokens * top_k, I / 128], zeroed when allocated (see above)
  uint64_t y;           // bf16 [tokens, H]
  uint64_t x_scale;     // ChannelStatic: f32 [1], else 0
  uint64_t h_scale;     // ChannelStatic: f32 [1], else 0
  uint64_t amax;        // ChannelTensor: u32 [2] scratch (x's and h's amax as f32 bits), else 0
  uint64_t status;
  uint64_t stream;
};
Status decode_layer_fp8(const DecodeFp8Args& args);

}  // namespace moe_gemm
