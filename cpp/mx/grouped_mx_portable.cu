// moe-gemm unit: family=grouped_gemm_mx_portable targets=portable seconds=2
// The portable block-scaled grouped GEMM (mx/launch.h): the SM100 MX kernels' function and operand
// buffers (mx/launch.h) on any GPU with bf16 tensor cores. One template over (A's element, B's element,
// the scale block V), instantiated for the four pairs the SM100 configurations compute.
//
// A CTA of 4 warps computes a 64 x 64 tile of D for one group: grid.x = groups x N / 64 tiles, grid.z = row splits
// (each CTA loops over its group's 64-row tiles blockIdx.z, blockIdx.z + gridDim.z, ...). Per K step of 64 each
// thread loads 32 consecutive elements of one row of A and one row of B (e4m3: two 16-byte loads; e2m1: one) and
// their scales, for the next step while the current one multiplies, then writes them to shared memory dequantised
// into bf16: an e4m3 or e2m1 value times a power of two (UE8M0) or a UE4M3 value has at most 4 + 4 significant
// bits, so the product is exact in bf16 (bf16 keeps 8 bits; e4m3 is multiplied in f32, e2m1 decoded by a
// byte-permute table and multiplied in bf16) wherever bf16's exponent range holds it. Threads of A rows past
// the group's m load and convert nothing (at decode, most of A). Each warp then runs 2 x 2 wmma bf16 16x16x16
// MMAs per 16 of K, f32 accumulators, skipping 16-row fragments past the group's m. Epilogue: alpha (NVFP4),
// round to bf16, rows below the group's m only, through shared memory with 16-byte stores.
// Not tuned: one register-prefetched K step in flight per thread; a group of a few rows reads each weight byte
// once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "common/group_rows.cuh"
#include "mx/launch.h"
#include "mx/mx_formats.cuh"

namespace moe_gemm {
namespace mx_portable {

constexpr int kTileM = 64;           // rows of a group per tile
constexpr int kTileN = 64;           // columns of D (rows of B) per tile
constexpr int kTileK = 64;           // K per step: two (V = 32) or four (V = 16) scale blocks
constexpr int kThreads = 128;        // 4 warps, 2 x 2 over the tile, 32 x 32 each
constexpr int kPitch = kTileK + 8;   // bf16 per shared row (144 bytes: every 16th row 32-byte aligned for wmma)
constexpr int kOutPitch = kTileN + 4;  // f32 per staging row of the epilogue
constexpr int kMaxSplits = 32;       // row splits of grid.z at most
constexpr int kSmemBytes = 2 * kTileM * kPitch * 2;
static_assert(kTileM * kOutPitch * 4 <= kSmemBytes, "the epilogue's staging fits in the operand tiles");
static_assert(kThreads == 2 * kTileM && kTileM == kTileN && kTileK == 64, "a thread: 32 of K of one row");

enum class Elem { E4m3, E2m1 };

__device__ __forceinline__ __nv_bfloat162 as_bf16x2(uint32_t u) { return *reinterpret_cast<const __nv_bfloat162*>(&u); }
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 b) { return *reinterpret_cast<const uint32_t*>(&b); }

// The e4m3 pair in the low 16 bits of `two` (the even element in the low byte) as f32.
__device__ __forceinline__ float2 e4m3x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

// The four e2m1 codes in the low 16 bits of c (the first element in the low nibble) as two bf16 pairs, by byte
// permutes of a table: the bf16 bits of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (0x0000, 0x3F00, 0x3F80, 0x3FC0,
// 0x4000, 0x4040, 0x4080, 0x40C0), low bytes and high bytes apart, then each code's sign bit.
__device__ __forceinline__ void e2m1x4_bf16(uint32_t c, uint32_t* out) {
  const uint32_t sel = c & 0x7777u;  // the magnitudes as byte selectors
  const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);  // [lo(c0), lo(c1), lo(c2), lo(c3)]
  const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
  out[0] = __byte_perm(lo, hi, 0x5140u) | ((c << 12) & 0x8000u) | ((c << 24) & 0x80000000u);  // c0, c1
  out[1] = __byte_perm(lo, hi, 0x7362u) | ((c << 4) & 0x8000u) | ((c << 16) & 0x80000000u);   // c2, c3
}

// One thread's share of an operand tile per K step: 32 consecutive elements of one row (A: a row of the group;
// B: an expert row, a column of D) and their 32 / V scales. A dead share (an A row at or past the group's m)
// reads nothing and stages zeros.
template <Elem E, int V>
struct Share {
  static constexpr int kWords = E == Elem::E4m3 ? 8 : 4;  // 32 elements of 8 or 4 bits
  static constexpr int kScales = 32 / V;
  uint32_t w[kWords];
  uint32_t sf[kScales];

  // `row`: the row's first byte; `sf_row`: its row in the scale atoms at `atoms`; `k`: the first element.
  __device__ __forceinline__ void fetch(const uint8_t* row, const uint8_t* atoms, int64_t sf_row, int k, int k_atoms) {
    const auto* p = reinterpret_cast<const uint4*>(row + (E == Elem::E4m3 ? k : k / 2));
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = __ldg(p + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int s = 0; s < kScales; ++s) sf[s] = __ldg(atoms + mx_formats::sf_offset(sf_row, k / V + s, k_atoms));
  }

  // Scale s as f32 (exact).
  __device__ __forceinline__ float scale(int s) const {
    return V == 16 ? mx_formats::ue4m3_value(sf[s]) : mx_formats::ue8m0_value(sf[s]);
  }

  // The 32 elements times their scales, as bf16, to dst (16-byte aligned); zeros for a dead share. Exact: e4m3
  // codes times the scale in f32, e2m1 codes (2 significant bits) times it in bf16 (the scale's 4 and the
  // product's 6 bits fit bf16's 8).
  __device__ __forceinline__ void stage(__nv_bfloat16* dst, bool live) const {
    auto* d = reinterpret_cast<uint4*>(dst);
    if (!live) {
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] = make_uint4(0u, 0u, 0u, 0u);
      return;
    }
    uint32_t out[16];
    if constexpr (E == Elem::E4m3) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {  // elements 2j, 2j + 1
        const float s = scale(2 * j / V);
        const float2 v = e4m3x2(w[j / 2] >> (16 * (j % 2)));
        out[j] = bits_of(__floats2bfloat162_rn(v.x * s, v.y * s));
      }
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) {  // elements 4q .. 4q + 3
        const __nv_bfloat162 s = __bfloat162bfloat162(__float2bfloat16_rn(scale(4 * q / V)));
        uint32_t two[2];
        e2m1x4_bf16(w[q / 2] >> (16 * (q % 2)), two);
        out[2 * q] = bits_of(__hmul2(as_bf16x2(two[0]), s));
        out[2 * q + 1] = bits_of(__hmul2(as_bf16x2(two[1]), s));
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
  }
};

template <Elem E>
__host__ __device__ constexpr int64_t row_bytes(int64_t k) {
  return E == Elem::E4m3 ? k : k / 2;
}

template <Elem EA, Elem EB, int V, bool kScaled>
__global__ void __launch_bounds__(kThreads) grouped_mx_kernel(const GroupedGemmMxArgs p, const int n_tiles) {
  using namespace nvcuda;
  const int g = static_cast<int>(blockIdx.x / n_tiles);
  const int n0 = static_cast<int>(blockIdx.x % n_tiles) * kTileN;
  const group_rows::Group gr =
      group_rows::resolve(p.mode, reinterpret_cast<const int32_t*>(p.offsets),
                          reinterpret_cast<const int32_t*>(p.counts), p.max_m, 1, p.groups, g, p.max_rows);
  // One report per group: the CTA of its first column tile and first split.
  if (gr.err != 0u && n0 == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
    atomicOr(reinterpret_cast<uint32_t*>(p.status), gr.err);
  }
  if (static_cast<int64_t>(blockIdx.z) * kTileM >= gr.m) return;  // no rows for this CTA (an empty group: none)

  __shared__ __align__(128) uint8_t smem[kSmemBytes];
  auto* as = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTileM][kPitch]: rows of A, K along a row
  auto* bs = as + kTileM * kPitch;                     // [kTileN][kPitch]: rows of B (columns of D)
  auto* staged = reinterpret_cast<float*>(smem);       // [kTileM][kOutPitch] f32, after the K loop

  const int k = p.k, k_atoms = p.k / (4 * V);
  const int mine = threadIdx.x / 2, k_half = (threadIdx.x % 2) * 32;  // this thread's row of each tile, its 32 of K
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  const auto* a_bytes = reinterpret_cast<const uint8_t*>(p.a);
  const auto* sfa = reinterpret_cast<const uint8_t*>(p.sfa) + reinterpret_cast<const int64_t*>(p.sfa_bases)[g];
  const int64_t b_row = gr.b_index * p.n + n0 + mine;
  const uint8_t* b_ptr = reinterpret_cast<const uint8_t*>(p.b) + b_row * row_bytes<EB>(k);
  const uint8_t* sfb = reinterpret_cast<const uint8_t*>(p.sfb) +
                       gr.b_index * mx_formats::kAtomBytes * (p.n / 128) * k_atoms;
  float alpha = 1.f;
  if constexpr (kScaled) {
    alpha = __fmul_rn(*reinterpret_cast<const float*>(p.a_tensor_scale),
                      reinterpret_cast<const float*>(p.b_tensor_scales)[gr.b_index]);
  }

  const int64_t t_step = static_cast<int64_t>(gridDim.z) * kTileM;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.z) * kTileM; t0 < gr.m; t0 += t_step) {
    const int rows = static_cast<int>(gr.m - t0 < kTileM ? gr.m - t0 : kTileM);
    // A rows at or past the group's m are never read.
    const bool a_live = mine < rows;
    const uint8_t* a_ptr = a_bytes + (gr.a_row + t0 + mine) * row_bytes<EA>(k);
    Share<EA, V> sa{};
    Share<EB, V> sb{};
    if (a_live) sa.fetch(a_ptr, sfa, t0 + mine, k_half, k_atoms);
    sb.fetch(b_ptr, sfb, n0 + mine, k_half, k_atoms);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
    }
    // The warp's 16-row fragments that hold rows of the group (warp-uniform: skipped MMAs of padding rows).
    const int live_frags = rows > wm * 32 + 16 ? 2 : (rows > wm * 32 ? 1 : 0);

    for (int k0 = 0; k0 < k; k0 += kTileK) {
      __syncthreads();  // the previous step's (or tile's) reads of shared memory are done
      sa.stage(as + mine * kPitch + k_half, a_live);
      sb.stage(bs + mine * kPitch + k_half, true);
      __syncthreads();
      if (k0 + kTileK < k) {  // the next step's loads fly while this one multiplies
        if (a_live) sa.fetch(a_ptr, sfa, t0 + mine, k0 + kTileK + k_half, k_atoms);
        sb.fetch(b_ptr, sfb, n0 + mine, k0 + kTileK + k_half, k_atoms);
      }
#pragma unroll
      for (int kk = 0; kk < kTileK && live_frags > 0; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], bs + (wn * 32 + 16 * j) * kPitch + kk, kPitch);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (i < live_frags) {
            wmma::load_matrix_sync(fa[i], as + (wm * 32 + 16 * i) * kPitch + kk, kPitch);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
          }
        }
      }
    }

    __syncthreads();  // every warp is done with the operand tiles: the staging reuses them
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (i < live_frags) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float* at = staged + (wm * 32 + 16 * i) * kOutPitch + wn * 32 + 16 * j;
          wmma::store_matrix_sync(at, acc[i][j], kOutPitch, wmma::mem_row_major);
        }
      }
    }
    __syncthreads();
    // 8 columns (one 16-byte store) per thread per pass; rows past the group's m are not written.
    auto* d = reinterpret_cast<__nv_bfloat16*>(p.d) + (gr.lo + t0) * p.n + n0;
    for (int idx = threadIdx.x; idx < kTileM * (kTileN / 8); idx += kThreads) {
      const int r = idx / (kTileN / 8), c = (idx % (kTileN / 8)) * 8;
      if (r >= rows) break;  // idx grows with r
      const float* src = staged + r * kOutPitch + c;
      uint32_t out[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(src[2 * e], alpha), __fmul_rn(src[2 * e + 1], alpha));
        out[e] = *reinterpret_cast<const uint32_t*>(&b);
      }
      *reinterpret_cast<uint4*>(d + static_cast<int64_t>(r) * p.n + c) = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

using Kernel = void (*)(const GroupedGemmMxArgs, int);

// The kernel of a configuration's format pair, and whether it takes the tensor scales; null for none.
Kernel kernel_of(Sm100MxConfig c, bool* scaled) {
  *scaled = false;
  switch (c) {
    case Sm100MxConfig::Mxf8Mma1Sm128x128x128:
    case Sm100MxConfig::Mxf8Mma2Sm256x256x128: return grouped_mx_kernel<Elem::E4m3, Elem::E4m3, 32, false>;
    case Sm100MxConfig::Mxf8f4Mma1Sm128x128x128: return grouped_mx_kernel<Elem::E4m3, Elem::E2m1, 32, false>;
    case Sm100MxConfig::Mxf4Mma1Sm128x128x256: return grouped_mx_kernel<Elem::E2m1, Elem::E2m1, 32, false>;
    case Sm100MxConfig::Nvf4Mma1Sm128x128x256:
      *scaled = true;
      return grouped_mx_kernel<Elem::E2m1, Elem::E2m1, 16, true>;
    default: return nullptr;
  }
}

// cutlass::Status's numbers, which the Rust side names for a refused problem (no CUTLASS header here).
constexpr int32_t kMisaligned = 1, kInvalidProblem = 4, kNotSupported = 5;

// What the kernel relies on, as grouped_gemm_sm100_mx_run refuses it: 0 or the reason's number.
int32_t refusal(const GroupedGemmMxArgs& p, bool scaled) {
  const bool grouped = p.mode == GroupMode::Offsets || p.mode == GroupMode::Padded || p.mode == GroupMode::Masked;
  if (!grouped) return kNotSupported;
  const bool shape_ok = p.groups >= 0 && p.n > 0 && p.n % 128 == 0 && p.k > 0 && p.k % 128 == 0 &&
                        p.max_rows >= 0 && p.max_m >= 0 &&
                        (p.mode != GroupMode::Masked || static_cast<int64_t>(p.groups) * p.max_m <= p.max_rows);
  // Groups x column tiles are grid.x.
  if (!shape_ok || static_cast<int64_t>(p.groups) * (p.n / kTileN) > INT32_MAX) return kInvalidProblem;
  const bool addresses_ok = p.a && p.b && p.d && p.sfa && p.sfb && p.sfa_bases && p.status &&
                            (p.a | p.b | p.d) % 16 == 0 && (p.sfa | p.sfb) % 128 == 0 && p.sfa_bases % 8 == 0 &&
                            (p.a_tensor_scale | p.b_tensor_scales) % 4 == 0;
  if (!addresses_ok) return kMisaligned;
  // Both tensor scales for NVFP4, neither for MX; the group arrays the mode reads.
  const bool scales_ok = scaled ? (p.a_tensor_scale && p.b_tensor_scales) : !(p.a_tensor_scale || p.b_tensor_scales);
  const bool arrays_ok = (p.mode == GroupMode::Masked || p.offsets) && (p.mode == GroupMode::Offsets || p.counts);
  return scales_ok && arrays_ok ? 0 : kInvalidProblem;
}

}  // namespace mx_portable

Status grouped_gemm_mx_portable_run(const GroupedGemmMxArgs& p) {
  bool scaled = false;
  const mx_portable::Kernel kernel = mx_portable::kernel_of(p.config, &scaled);
  if (!kernel) return {StatusCode::NotBuilt, 0};
  if (const int32_t why = mx_portable::refusal(p, scaled)) return {StatusCode::CutlassCannotImplement, why};
  if (p.groups == 0 || p.max_rows == 0) return {StatusCode::Ok, 0};
  // Row splits for the rows a group is expected to hold (the masked room, or the mean), whole tiles.
  const int64_t per_group = p.mode == GroupMode::Masked ? p.max_m : (p.max_rows + p.groups - 1) / p.groups;
  const int64_t tiles = (per_group + mx_portable::kTileM - 1) / mx_portable::kTileM;
  constexpr int64_t kMax = mx_portable::kMaxSplits;
  const int splits = static_cast<int>(tiles < 1 ? 1 : tiles > kMax ? kMax : tiles);
  const int n_tiles = p.n / mx_portable::kTileN;
  const dim3 grid(static_cast<unsigned>(n_tiles * static_cast<int64_t>(p.groups)), 1, splits);
  kernel<<<grid, mx_portable::kThreads, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p, n_tiles);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
