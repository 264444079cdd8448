// moe-gemm unit: family=decode targets=portable seconds=3
// The Batched backend over block-FP8 experts (decode_fp8.h states the function): two kernels, no layout.
//   expand: per (token, slot) row and 32 outputs of h per block, the token's x staged and quantised to e4m3 in
//           shared memory (every block of the row does it, bit for bit alike), gate and up weight rows
//           streamed with 16-byte loads into e4m3 tensor-core MMAs by four warps per tile splitting K, the
//           partial sums added in a fixed order, the activation, h in bf16; the last of the four blocks that
//           write a 128-column group of h quantises it once into scratch (decode_fp8.h).
//   reduce: per token and 16 outputs of y per block, the token's k rows of quantised h staged in shared memory,
//           warps per slot (and per share of K for small k) stream w2's rows, the block sums in a fixed order.
// Quantising h once instead of in each of the H / 16 reduce blocks, with the weight loads' cache hints, took 3-16%
// off the two kernels at 19 of 20 decode points on an H100, output bit-equal
// (benches/results/h100-2026-12-07-fp8-decode-h-once).
// Splitting K is what keeps enough loads in flight at T = 1 (DeepSeek-V3: 8 rows x 64 blocks of 8 warps).
// The reduce kernel is launched while expand's last wave runs (programmatic dependent launch): its blocks ask L2 for
// their first w2 tiles, which do not depend on expand, before they wait for h.
// Both grids put the rows (tokens) in x, the fastest: the blocks of one output tile for every row run side by side,
// so rows that share an expert read its weight tile while another row's read holds it in L2 (T = 4 to 64: 3-36%
// faster on an H200 than tiles in x, benches/results/h200-2026-12-06-fp8-decode-grid-order).
// The MMA is mma.sync m16n8k32 (e4m3 x e4m3, f32 accumulate): the weights are the 16-row A side, the one
// activation row the B side's column 0 (columns 1..7 are zero), so a 16-byte load of each weight row feeds two
// MMAs and nothing is converted on the CUDA cores. The K order inside a 64-byte chunk is permuted alike for A
// and B (lane t of a row holds bytes 16t .. 16t + 15: the first 8 feed one MMA, the last 8 the other), which a
// dot product does not see. Each 128-column block is summed by four MMAs and then scaled by its activation and
// weight scales into the f32 total (CUTLASS's two-level accumulation, at the same 128 interval).
// Per-channel weights (kChannel): the same kernels and MMAs with one activation scale per row (quantised with it
// in shared memory, h by each reduce block) and one weight scale per output row, applied once to the whole dot
// product.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_ops/decode_fp8.h"
#include "common/element.cuh"
#include "common/mma_sync.cuh"
#include "common/pdl.cuh"
#include "common/quant_rules.cuh"

namespace moe_gemm {
namespace decode_fp8 {

using bf16 = __nv_bfloat16;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kBlock = 128;      // columns per scale
constexpr int kTile = 16;        // weight rows per warp (the MMA's M)
constexpr int kExpandTiles = 2;   // expand: 16-output tiles of h per block
constexpr int kExpandSplits = 4;  // expand: warps sharing a tile's K (more loads in flight at small T)
constexpr int kExpandWarps = kExpandTiles * kExpandSplits;
constexpr int kReduceWarps = 16;  // reduce: warps per block for top_k <= 16 (slots x K splits)
constexpr int kMaxTopK = 32;
constexpr int kPrefetchBlocks = 2;  // K blocks per warp asked of L2 before the prologue
constexpr int kGroupBlocks = kBlock / (kExpandTiles * kTile);  // expand blocks writing one 128-column group of h
static_assert(kBlock % (kExpandTiles * kTile) == 0, "an expand block's outputs lie in one group of h");

// Four bf16 columns of shared memory: their bits, their values and the amax of the finite ones.
struct Quad {
  uint16_t raw[4];
  float f[4];
  float amax;
};

__device__ __forceinline__ Quad quad_of(uint2 v) {
  Quad d;
  d.raw[0] = static_cast<uint16_t>(v.x & 0xffffu), d.raw[1] = static_cast<uint16_t>(v.x >> 16);
  d.raw[2] = static_cast<uint16_t>(v.y & 0xffffu), d.raw[3] = static_cast<uint16_t>(v.y >> 16);
  d.amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    d.f[i] = __bfloat162float(__ushort_as_bfloat16(d.raw[i]));
    if (isfinite(d.f[i])) d.amax = fmaxf(d.amax, fabsf(d.f[i]));
  }
  return d;
}

__device__ __forceinline__ Quad load_quad(const bf16* __restrict__ src, int c0) {
  return quad_of(*reinterpret_cast<const uint2*>(src + c0));
}

// 16 bytes of a weight row, read once per launch: not kept in L1, and L2 asked for the whole 128-byte line (the
// warp reads all of it). 5% faster than plain __ldg over the two kernels on an H100 (geomean of 20 decode
// points), slower only where the weights stay in L2 between launches.
__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void store_quad(const Quad& d, float scale, uint8_t* q, int c0, uint32_t& err) {
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= quant::encode(d.f[i], d.raw[i], scale, err) << (8 * i);
  *reinterpret_cast<uint32_t*>(q + c0) = packed;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// Quantises group g (128 bf16 columns) of `src` into q (e4m3) and s[g] (f32) in shared memory by quant.h's rules,
// as quant.cu applies them: a lane owns 4 columns, the warp reduces the amax. Called warp-uniformly.
__device__ __forceinline__ uint32_t quantize_group(const bf16* __restrict__ src, int g, uint8_t* q, float* s,
                                                   float eps, bool ue8m0) {
  const int c0 = g * kBlock + 4 * (threadIdx.x % 32);
  const Quad d = load_quad(src, c0);
  const float scale = quant::group_scale(warp_max(d.amax), eps, ue8m0);
  uint32_t err = 0;
  store_quad(d, scale, q, c0, err);
  if (threadIdx.x % 32 == 0) s[g] = scale;
  return err;
}

// Per channel: group g of `src` into q with the row's `scale`. Called warp-uniformly.
__device__ __forceinline__ uint32_t quantize_group_with(const bf16* __restrict__ src, int g, uint8_t* q, float scale) {
  const int c0 = g * kBlock + 4 * (threadIdx.x % 32);
  uint32_t err = 0;
  store_quad(load_quad(src, c0), scale, q, c0, err);
  return err;
}

// The amax of this thread's columns 4 * first, 4 * (first + step), ... of an n-column row in shared memory.
__device__ __forceinline__ float amax_columns(const bf16* __restrict__ src, int n, int first, int step) {
  float m = 0.f;
  for (int c = 4 * first; c < n; c += 4 * step) m = fmaxf(m, load_quad(src, c).amax);
  return m;
}

// Per channel: the activation scale of a row whose finite elements have `amax` (ChannelToken), of the tensor's
// amax word (ChannelTensor; `second`: h's), or the checkpoint's (ChannelStatic; device data, replaced by 1 and
// flagged unless finite and positive), as quant.cu's token_scale has them.
__device__ __forceinline__ float channel_scale(const DecodeFp8Args& a, float amax, bool second, uint32_t& err) {
  if (a.scaling == DecodeScaling::ChannelStatic) {
    const float s = *reinterpret_cast<const float*>(second ? a.h_scale : a.x_scale);
    if (isfinite(s) && s > 0.f) return s;
    err |= kErrBadStaticScale;
    return 1.f;
  }
  if (a.scaling == DecodeScaling::ChannelTensor) amax = __uint_as_float(reinterpret_cast<const unsigned*>(a.amax)[second]);
  return quant::group_scale(amax, a.eps, a.ue8m0 != 0);
}

__device__ __forceinline__ void report(uint64_t status, uint32_t err) {
  err = __reduce_or_sync(kFull, err);
  if (err && threadIdx.x % 32 == 0) atomicOr(reinterpret_cast<uint32_t*>(status), err);
}

// Copies `bytes` (a multiple of 16) from global to shared memory with 16-byte loads, all threads of the block, so
// that the quantisation or the dots that follow read shared memory instead of waiting on one global load per group.
__device__ __forceinline__ void stage(const void* __restrict__ src, void* dst, int bytes) {
  const auto* from = static_cast<const uint8_t*>(src);
  auto* to = static_cast<uint8_t*>(dst);
#pragma unroll 4
  for (int c = threadIdx.x * 16; c < bytes; c += blockDim.x * 16)
    *reinterpret_cast<uint4*>(to + c) = *reinterpret_cast<const uint4*>(from + c);
}

// Asks L2 for the first `ahead` 128-column blocks of this warp's share (kb0, kb0 + step, ...) of NT 16-row weight
// tiles, before the block's prologue (staging and quantising the activations), so that the weight stream's first
// round trips to HBM overlap the prologue instead of following it. A hint only: it changes no result. `ahead` is
// small so that a wave's prefetches (blocks x warps x ahead x 2 KB per tile) stay well inside L2.
template <int NT>
__device__ __forceinline__ void prefetch_tiles(const uint8_t* const (&w)[NT], int len, int kb0, int step, int ahead) {
  const int lane = threadIdx.x % 32, row = lane % 16;
  for (int i = lane / 16; i < ahead; i += 2) {  // a K block of a tile is 16 lines of 128 bytes: two per instruction
    const int kb = kb0 + i * step;
    if (kb >= len / kBlock) break;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w[n] + static_cast<int64_t>(row) * len + kb * kBlock));
  }
}

// Scaled dots of NT 16-row weight tiles (row stride `len` bytes, tile n at w[n], its scale row at ws[n]: one f32
// per 128 columns) with the activation row q / s in shared memory, over the 128-column blocks kb0, kb0 + step,
// ... Lanes with lane % 4 == 0 return rows lane / 4 and lane / 4 + 8 of each tile in out[n][0], out[n][1].
// kChannel: the unscaled dots (ws and s unread), for the caller to scale per row.
template <int NT, bool kChannel>
__device__ __forceinline__ void tile_dots(const uint8_t* const (&w)[NT], const float* const (&ws)[NT],
                                          const uint8_t* q, const float* s, int len, int kb0, int step,
                                          float (&out)[NT][2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[NT][2];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = 0.f;
  const int64_t lo_row = static_cast<int64_t>(g) * len, hi_row = static_cast<int64_t>(g + 8) * len;
#pragma unroll(NT == 1 ? 2 : 1)  // 4 KB of weights in flight per warp either way
  for (int kb = kb0; kb < len / kBlock; kb += step) {
    uint4 lo[NT][2], hi[NT][2], b[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = kb * kBlock + half * 64 + t * 16;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        lo[n][half] = load_weights(w[n] + lo_row + c);
        hi[n][half] = load_weights(w[n] + hi_row + c);
      }
      b[half] = g == 0 ? *reinterpret_cast<const uint4*>(q + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    const float sa = kChannel ? 1.f : s[kb];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 l = lo[n][half], h = hi[n][half], bb = b[half];
        mma_e4m3(blk, l.x, h.x, l.y, h.y, bb.x, bb.y);
        mma_e4m3(blk, l.z, h.z, l.w, h.w, bb.z, bb.w);
      }
      if (kChannel) {
        acc[n][0] += blk[0];
        acc[n][1] += blk[2];
      } else {
        const float sc = sa * __ldg(ws[n] + kb);
        acc[n][0] += blk[0] * sc;  // row g, column 0
        acc[n][1] += blk[2] * sc;  // row g + 8, column 0
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) out[n][0] = acc[n][0], out[n][1] = acc[n][1];
}

__device__ __forceinline__ float activate(Activation act, float g, float u) {
  if (act == Activation::GptOssSwiglu) {
    const float gc = fminf(g, 7.f), uc = fminf(fmaxf(u, -7.f), 7.f);
    return (uc + 1.f) * gc / (1.f + __expf(-1.702f * gc));
  }
  return g / (1.f + __expf(-g)) * u;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// grid (rows, I / 32); block: 2 tiles of 16 outputs x 4 warps splitting K. Dynamic shared memory: x staged
// (H bf16), x_q (H bytes), its scales (H / 128 f32; per channel the first holds the row's), the partial sums
// [tiles][splits][gate, up][16].
template <bool kChannel>
__global__ void __launch_bounds__(32 * kExpandWarps, 2) expand_kernel(const DecodeFp8Args a) {
  extern __shared__ uint4 smem[];
  pdl::launch_dependents();  // the reduce kernel's blocks may take the SMs this grid's last wave leaves
  const int H = a.hidden, I = a.inter;
  bf16* xb = reinterpret_cast<bf16*>(smem);
  uint8_t* xq = reinterpret_cast<uint8_t*>(xb + H);
  float* xs = reinterpret_cast<float*>(xq + H);
  float* part = xs + H / kBlock;
  const int r = blockIdx.x;
  const int e = reinterpret_cast<const int32_t*>(a.ids)[r];
  if (e < 0 || e >= a.experts) {  // block-uniform: no thread reaches the barrier
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(reinterpret_cast<uint32_t*>(a.status), kErrExpertIdOutOfRange);
    return;
  }
  const int warp = threadIdx.x / 32;
  const int tile = warp / kExpandSplits, split = warp % kExpandSplits;
  const int i0 = (blockIdx.y * kExpandTiles + tile) * kTile;
  const int kb = H / kBlock;
  const uint8_t* w13 = reinterpret_cast<const uint8_t*>(a.w13) + static_cast<int64_t>(e) * 2 * I * H;
  // Block scales: [2I / 128][H / 128] per expert, a tile's row of them; channel scales: [2I] per expert.
  const float* s13 = reinterpret_cast<const float*>(a.w13_scales) +
                     static_cast<int64_t>(e) * (kChannel ? 2 * I : (2 * I / kBlock) * kb);
  const uint8_t* w[2] = {w13 + static_cast<int64_t>(i0) * H, w13 + static_cast<int64_t>(I + i0) * H};
  const float* ws[2] = {kChannel ? s13 + i0 : s13 + (i0 / kBlock) * kb,
                        kChannel ? s13 + I + i0 : s13 + ((I + i0) / kBlock) * kb};
  prefetch_tiles<2>(w, H, split, kExpandSplits, kPrefetchBlocks);
  stage(reinterpret_cast<const bf16*>(a.x) + static_cast<int64_t>(r / a.top_k) * H, xb, 2 * H);
  __syncthreads();
  uint32_t err = 0;
  if (kChannel) {
    // The row's amax, the block's warps' maxima through `part` (free until the dots below).
    float amax = 0.f;
    if (a.scaling == DecodeScaling::ChannelToken) {
      const float m = warp_max(amax_columns(xb, H, threadIdx.x, blockDim.x));
      if (threadIdx.x % 32 == 0) part[warp] = m;
      __syncthreads();
      for (int i = 0; i < kExpandWarps; ++i) amax = fmaxf(amax, part[i]);
    }
    const float scale = channel_scale(a, amax, false, err);
    for (int g = warp; g < H / kBlock; g += kExpandWarps) err |= quantize_group_with(xb, g, xq, scale);
    if (threadIdx.x == 0) xs[0] = scale;
  } else {
    for (int g = warp; g < H / kBlock; g += kExpandWarps) err |= quantize_group(xb, g, xq, xs, a.eps, a.ue8m0 != 0);
  }
  if (blockIdx.y == 0) report(a.status, err);  // every block of the row finds the same: the first tile's reports
  __syncthreads();
  float d[2][2];
  tile_dots<2, kChannel>(w, ws, xq, xs, H, split, kExpandSplits, d);
  const int lane = threadIdx.x % 32;
  if (kChannel) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int m = 0; m < 2; ++m) d[n][m] = d[n][m] * xs[0] * __ldg(ws[n] + lane / 4 + 8 * m);
  }
  if (lane % 4 == 0) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int m = 0; m < 2; ++m) part[((tile * kExpandSplits + split) * 2 + n) * kTile + lane / 4 + 8 * m] = d[n][m];
  }
  __syncthreads();
  if (threadIdx.x >= kExpandTiles * kTile) return;
  const int t2 = threadIdx.x / kTile, row = threadIdx.x % kTile, i = (blockIdx.y * kExpandTiles + t2) * kTile + row;
  float gate = 0.f, up = 0.f;
  for (int p = 0; p < kExpandSplits; ++p) {  // in order: the same bits in every run
    gate += part[((t2 * kExpandSplits + p) * 2 + 0) * kTile + row];
    up += part[((t2 * kExpandSplits + p) * 2 + 1) * kTile + row];
  }
  const float* b13 = a.b13 ? reinterpret_cast<const float*>(a.b13) + static_cast<int64_t>(e) * 2 * I : nullptr;
  const float g = round_bf16(gate) + (b13 ? b13[i] : 0.f);
  const float u = round_bf16(up) + (b13 ? b13[I + i] : 0.f);
  const bf16 hv = __float2bfloat16(activate(a.act, g, u));
  reinterpret_cast<bf16*>(a.h)[static_cast<int64_t>(r) * I + i] = hv;
  if (!kChannel) {
    // These 32 threads are warp 0, whole. The block's h is made visible before it counts (each lane's fence,
    // then the warp's barrier, then lane 0's atomic); the last of the group's blocks to count quantises the group
    // (its own 32 columns and the other three blocks').
    __threadfence();
    __syncwarp();
    const int grp = blockIdx.y / kGroupBlocks;
    const int64_t slot = static_cast<int64_t>(r) * (I / kBlock) + grp;
    unsigned seen = 0;
    if (threadIdx.x == 0) seen = atomicAdd(reinterpret_cast<unsigned*>(a.arrivals) + slot, 1u);
    if (__shfl_sync(kFull, seen, 0) % kGroupBlocks == kGroupBlocks - 1) {
      __threadfence();
      const int64_t c0 = static_cast<int64_t>(r) * I + grp * kBlock + 4 * threadIdx.x;
      // Read through L2 (ld.cg): the other blocks' rows are not in this SM's L1.
      const Quad d = quad_of(__ldcg(reinterpret_cast<const uint2*>(reinterpret_cast<const bf16*>(a.h) + c0)));
      const float scale = quant::group_scale(warp_max(d.amax), a.eps, a.ue8m0 != 0);
      uint32_t err = 0;
      store_quad(d, scale, reinterpret_cast<uint8_t*>(a.h_q), c0, err);
      if (threadIdx.x == 0) reinterpret_cast<float*>(a.h_scales)[slot] = scale;
      report(a.status, err);
    }
  }
  if (kChannel && a.scaling == DecodeScaling::ChannelTensor) {
    // h's amax for the reduce kernel's per-tensor scale: these 32 threads are warp 0, whole.
    const float v = __bfloat162float(hv);
    const float m = warp_max(isfinite(v) ? fabsf(v) : 0.f);
    if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<unsigned*>(a.amax) + 1, __float_as_uint(m));
  }
}

// grid (tokens, H / 16), block = top_k * splits warps (splits = max(1, 16 / top_k), at most I / 128): warp
// (j, split) streams the 16 rows of w2[e_j] over the K blocks split, split + splits, ...; the block adds the
// splits, then the slots, in order. Dynamic shared memory: the k rows of h staged (bf16), h_q (I bytes each),
// their scales (per channel: one per row, hs[j]), the partial sums [k][splits][16]. kThreads: the largest block
// this instantiation takes.
template <int kThreads, bool kChannel>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const DecodeFp8Args a, int splits) {
  extern __shared__ uint4 smem[];
  const int H = a.hidden, I = a.inter, k = a.top_k, groups = I / kBlock;
  // Per channel h is staged in bf16 and quantised here; block-scaled h comes quantised (expand did it once).
  bf16* hb = reinterpret_cast<bf16*>(smem);
  uint8_t* hq = reinterpret_cast<uint8_t*>(hb + (kChannel ? static_cast<int64_t>(k) * I : 0));
  float* hs = reinterpret_cast<float*>(hq + static_cast<int64_t>(k) * I);
  float* part = hs + k * groups;
  const int t = blockIdx.x;
  const int32_t* ids = reinterpret_cast<const int32_t*>(a.ids) + static_cast<int64_t>(t) * k;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int j = warp % k, split = warp / k;
  const int o0 = blockIdx.y * kTile;
  const int e = ids[j];
  const uint8_t* w[1] = {nullptr};
  if (e >= 0 && e < a.experts) {
    w[0] = reinterpret_cast<const uint8_t*>(a.w2) + static_cast<int64_t>(e) * H * I + static_cast<int64_t>(o0) * I;
    prefetch_tiles<1>(w, I, split, splits, kPrefetchBlocks);
  }
  // Launched early (pdl.cuh): the ids (written before expand, which was not) and w2 are read above; h, h_q, their
  // scales and the amax words only after expand has ended. Every thread waits: none returns before.
  pdl::wait_for_prerequisites();
  // The token's k rows of h are contiguous: one staging copy (rows of invalid slots are read, never used).
  if (!kChannel) {
    stage(reinterpret_cast<const uint8_t*>(a.h_q) + static_cast<int64_t>(t) * k * I, hq, k * I);
    const float* src = reinterpret_cast<const float*>(a.h_scales) + static_cast<int64_t>(t) * k * groups;
    for (int c = threadIdx.x; c < k * groups; c += blockDim.x) hs[c] = src[c];
  } else {
    stage(reinterpret_cast<const bf16*>(a.h) + static_cast<int64_t>(t) * k * I, hb, 2 * k * I);
  }
  __syncthreads();
  uint32_t err = 0;
  if (kChannel) {
    // One scale per row of h: warp j < k finds row j's (blocks hold at least k warps).
    if (warp < k) {
      float amax = 0.f;
      if (a.scaling == DecodeScaling::ChannelToken) amax = warp_max(amax_columns(hb + warp * I, I, threadIdx.x % 32, 32));
      const float scale = channel_scale(a, amax, true, err);
      if (threadIdx.x % 32 == 0) hs[warp] = scale;
    }
    __syncthreads();
  }
  if (kChannel) {
    for (int task = warp; task < k * groups; task += warps) {
      const int j = task / groups, g = task % groups;
      const int e = ids[j];
      if (e < 0 || e >= a.experts) continue;  // reported by expand
      err |= quantize_group_with(hb + j * I, g, hq + j * I, hs[j]);
    }
    if (blockIdx.y == 0) report(a.status, err);
    __syncthreads();
  }
  const int lane = threadIdx.x % 32;
  if (e >= 0 && e < a.experts) {
    // Block scales: [H / 128][I / 128] per expert, the tile's row of them; channel scales: [H] per expert.
    const float* s2 = reinterpret_cast<const float*>(a.w2_scales) +
                      static_cast<int64_t>(e) * (kChannel ? H : (H / kBlock) * groups);
    const float* ws[1] = {kChannel ? s2 + o0 : s2 + (o0 / kBlock) * groups};
    float d[1][2];
    tile_dots<1, kChannel>(w, ws, hq + j * I, hs + j * groups, I, split, splits, d);
    if (kChannel) {
#pragma unroll
      for (int m = 0; m < 2; ++m) d[0][m] = d[0][m] * hs[j] * __ldg(ws[0] + lane / 4 + 8 * m);
    }
    if (lane % 4 == 0) {
      part[(j * splits + split) * kTile + lane / 4] = d[0][0];
      part[(j * splits + split) * kTile + lane / 4 + 8] = d[0][1];
    }
  }
  __syncthreads();
  if (threadIdx.x < kTile) {
    const int row = threadIdx.x, o = o0 + row;
    const float* b2 = a.b2 ? reinterpret_cast<const float*>(a.b2) : nullptr;
    const float* wts = reinterpret_cast<const float*>(a.weights) + static_cast<int64_t>(t) * k;
    float acc = 0.f;
    for (int s = 0; s < k; ++s) {
      const int es = ids[s];
      if (es < 0 || es >= a.experts) continue;
      float d = 0.f;
      for (int p = 0; p < splits; ++p) d += part[(s * splits + p) * kTile + row];
      acc += wts[s] * (round_bf16(d) + (b2 ? b2[static_cast<int64_t>(es) * H + o] : 0.f));
    }
    reinterpret_cast<bf16*>(a.y)[static_cast<int64_t>(t) * H + o] = __float2bfloat16(acc);
  }
}

// Shared memory of the two kernels (bytes); decode_fp8.rs mirrors these to check them before launching.
inline size_t expand_smem(const DecodeFp8Args& a) {
  return 3 * static_cast<size_t>(a.hidden) + 4 * (a.hidden / kBlock) + 4 * kExpandTiles * kExpandSplits * 2 * kTile;
}
inline int reduce_splits(const DecodeFp8Args& a) {
  const int s = a.top_k >= kReduceWarps ? 1 : kReduceWarps / a.top_k;
  return s < a.inter / kBlock ? s : a.inter / kBlock;  // no warp without a K block
}
inline size_t reduce_smem(const DecodeFp8Args& a) {
  const size_t k = a.top_k, staged = a.scaling == DecodeScaling::Block128 ? 1 : 3;  // e4m3, or bf16 and e4m3
  return staged * k * a.inter + 4 * k * (a.inter / kBlock) + 4 * reduce_splits(a) * k * kTile;
}

// Per tensor: the amax of every finite element of x into the first amax word (zeroed before on the stream), as
// f32 bits: non-negative floats order as their unsigned bits, so atomicMax on them is a float max.
__global__ void __launch_bounds__(256) x_amax_kernel(const DecodeFp8Args a) {
  const int64_t quads = static_cast<int64_t>(a.tokens) * a.hidden / 4;
  const bf16* x = reinterpret_cast<const bf16*>(a.x);
  float m = 0.f;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, load_quad(x + q * 4, 0).amax);
  m = warp_max(m);
  if (threadIdx.x % 32 == 0 && m > 0.f) atomicMax(reinterpret_cast<unsigned*>(a.amax), __float_as_uint(m));
}

template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  // Past the default 48 KB only: an attribute of the function, not a stream operation (graph-safe).
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace decode_fp8

namespace decode_fp8 {

template <bool kChannel>
Status launch(const DecodeFp8Args& a, cudaStream_t s) {
  const size_t smem1 = expand_smem(a), smem2 = reduce_smem(a);
  const int splits = reduce_splits(a), threads2 = 32 * a.top_k * splits;
  auto reduce = threads2 <= 512 ? reduce_kernel<512, kChannel> : reduce_kernel<1024, kChannel>;
  cudaError_t e = allow_smem(expand_kernel<kChannel>, smem1);
  if (e == cudaSuccess) e = allow_smem(reduce, smem2);
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  if (kChannel && a.scaling == DecodeScaling::ChannelTensor) {
    // A memset node and a kernel before the two: graph-capturable, nothing synchronises.
    e = cudaMemsetAsync(reinterpret_cast<void*>(a.amax), 0, 2 * sizeof(unsigned), s);
    if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
    const int64_t quads = static_cast<int64_t>(a.tokens) * a.hidden / 4;
    const int blocks = static_cast<int>(quads / 256 + 1 < 264 ? quads / 256 + 1 : 264);
    x_amax_kernel<<<blocks, 256, 0, s>>>(a);
  }
  expand_kernel<kChannel><<<dim3(a.tokens * a.top_k, a.inter / (kTile * kExpandTiles)), 32 * kExpandWarps, smem1, s>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  const dim3 grid2(a.tokens, a.hidden / kTile);
  return pdl::launch(true, grid2, dim3(threads2), smem2, s, reduce, a, splits);
}

}  // namespace decode_fp8

Status decode_layer_fp8(const DecodeFp8Args& a) {
  using namespace decode_fp8;
  if (a.tokens == 0) return {StatusCode::Ok, 0};
  const bool channel = a.scaling != DecodeScaling::Block128;
  if (a.top_k < 1 || a.top_k > kMaxTopK || a.hidden % kBlock || a.inter % kBlock || a.hidden <= 0 || a.inter <= 0 ||
      (a.scaling == DecodeScaling::ChannelTensor && !a.amax) ||
      (a.scaling == DecodeScaling::ChannelStatic && (!a.x_scale || !a.h_scale)) ||
      (!channel && (!a.h_q || !a.h_scales || !a.arrivals)))
    return {StatusCode::Cuda, static_cast<int32_t>(cudaErrorInvalidValue)};  // the Rust side checks these first
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  return channel ? launch<true>(a, s) : launch<false>(a, s);
}

}  // namespace moe_gemm
