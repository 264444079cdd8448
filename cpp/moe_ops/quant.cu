// moe-gemm unit: family=quant targets=portable seconds=5
// FP8 (e4m3) quantisation of 16-bit rows with one f32 scale per token per 128 columns, K-major (quant.h states the
// rules). One warp per (row, group): each lane owns 4 consecutive columns, the warp reduces the group's amax with
// shuffles, lane 0 writes the scale. Per token (per_row): one warp per row, over all its groups. The Gather
// source quantises a token row once and writes it at each of its layout positions, so the permuted copy of x is
// produced directly in e4m3.
//
// The row kernels are launched with programmatic dependent launch (pdl.cuh): scheduled while the kernel before them
// (the layout build, the activation) ends, they wait for it before reading anything, then let the GEMM's one-CTA
// prepare kernel after them be scheduled likewise.
//
// Expert weights per 128 x 128 block (quantize_weights_fp8, quant.h states the rules): one CTA of 256 threads per
// block, grid-stride over the blocks; each thread owns 8 columns of 8 rows and keeps their raw bits in registers
// between the amax reduction (warp shuffles, then the 8 warps' maxima through shared memory) and the encoding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element.cuh"
#include "moe_ops/quant.h"
#include "common/pdl.cuh"
#include "common/quant_rules.cuh"

namespace moe_gemm {
namespace quant {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 8;  // warps per block
constexpr int kPerLane = kQuantGroup / 32;
static_assert(kPerLane == 4, "a lane owns 4 columns of a 128-column group");
constexpr unsigned kMaxBlocks = 16384;  // grid-stride beyond this

__device__ __forceinline__ uint16_t raw_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint16_t raw_bits(__half x) { return __half_as_ushort(x); }
template <class T>
__device__ __forceinline__ T from_raw(uint16_t b);
template <>
__device__ __forceinline__ __nv_bfloat16 from_raw(uint16_t b) { return __ushort_as_bfloat16(b); }
template <>
__device__ __forceinline__ __half from_raw(uint16_t b) { return __ushort_as_half(b); }

// One quantised group slice of a lane: its 4 e4m3 bytes (packed little-endian) and the group's scale.
struct Slice {
  uint32_t q;
  float scale;
};

// Group g of row `row` (x + row * x_stride): lane columns c0 .. c0 + 3 with c0 = g * 128 + 4 * lane, their raw
// bits and f32 values (0 past k), and the lane's amax over the finite ones. kVec: k % 4 == 0, x_stride % 4 == 0
// and x 8-byte aligned, so a lane's 4 elements are one 8-byte load, wholly inside or wholly past the row.
template <class T, bool kVec>
__device__ __forceinline__ float load_slice(const QuantArgs& a, const T* __restrict__ xrow, int g,
                                            uint16_t (&raw)[kPerLane], float (&v)[kPerLane]) {
  const int c0 = g * kQuantGroup + 4 * (threadIdx.x % 32);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) raw[i] = 0;
  if (kVec) {
    if (c0 < a.k) {
      const uint2 w = *reinterpret_cast<const uint2*>(xrow + c0);
      raw[0] = w.x & 0xffffu;
      raw[1] = w.x >> 16;
      raw[2] = w.y & 0xffffu;
      raw[3] = w.y >> 16;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (c0 + i < a.k) raw[i] = raw_bits(xrow[c0 + i]);
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    v[i] = element::f32(from_raw<T>(raw[i]));
    if (isfinite(v[i])) amax = fmaxf(amax, fabsf(v[i]));  // columns past k hold 0
  }
  return amax;
}

// The lane's 4 e4m3 bytes of a loaded slice under `scale`, packed little-endian.
__device__ __forceinline__ uint32_t encode_slice(const uint16_t (&raw)[kPerLane], const float (&v)[kPerLane],
                                                 float scale, uint32_t& err) {
  uint32_t q = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) q |= encode(v[i], raw[i], scale, err) << (8 * i);
  return q;
}

template <class T, bool kVec>
__device__ __forceinline__ Slice quantize_slice(const QuantArgs& a, const T* __restrict__ xrow, int g, uint32_t& err) {
  uint16_t raw[kPerLane];
  float v[kPerLane];
  float amax = load_slice<T, kVec>(a, xrow, g, raw, v);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
  Slice s;
  s.scale = group_scale(amax, a.eps, a.ue8m0 != 0);
  s.q = encode_slice(raw, v, s.scale, err);
  return s;
}

// Writes a lane's e4m3 bytes of group g at row `row` of out. kVec: k % 4 == 0 and out 4-byte aligned.
template <bool kVec>
__device__ __forceinline__ void store_q(const QuantArgs& a, int64_t row, int g, uint32_t q) {
  const int c0 = g * kQuantGroup + 4 * (threadIdx.x % 32);
  uint8_t* orow = reinterpret_cast<uint8_t*>(a.out) + row * a.k;
  if (kVec) {
    if (c0 < a.k) *reinterpret_cast<uint32_t*>(orow + c0) = q;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (c0 + i < a.k) orow[c0 + i] = static_cast<uint8_t>(q >> (8 * i));
  }
}

// Writes the slice at row `row` of out and scales.
template <bool kVec>
__device__ __forceinline__ void store_slice(const QuantArgs& a, int64_t row, int g, int groups, const Slice& s) {
  store_q<kVec>(a, row, g, s.q);
  if (threadIdx.x % 32 == 0) reinterpret_cast<float*>(a.scales)[row * groups + g] = s.scale;
}

// Per token (per_row): the scale of a whole row of `groups` 128-column groups, the warp's amax over all of them.
template <class T, bool kVec>
__device__ __forceinline__ float row_scale(const QuantArgs& a, const T* __restrict__ xrow, int groups) {
  float amax = 0.f;
  for (int g = 0; g < groups; ++g) {
    uint16_t raw[kPerLane];
    float v[kPerLane];
    amax = fmaxf(amax, load_slice<T, kVec>(a, xrow, g, raw, v));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
  return group_scale(amax, a.eps, a.ue8m0 != 0);
}

// ORs a warp's error bits into the status word at `status`; every lane of the warp calls it.
__device__ __forceinline__ void report(uint64_t status, uint32_t err) {
  err = __reduce_or_sync(kFull, err);
  if (err && threadIdx.x % 32 == 0) atomicOr(reinterpret_cast<uint32_t*>(status), err);
}

// Rows source: the rows to quantise, `rows` clamped to the device count `*total` where there is one.
__device__ __forceinline__ int64_t rows_counted(const QuantArgs& a) {
  if (!a.total) return a.rows;
  const int64_t t = *reinterpret_cast<const int32_t*>(a.total);
  return t < 0 ? 0 : (t < a.rows ? t : a.rows);
}

// Rows source: whether `row`'s expert (with row_experts) is in [0, experts); rows of others are skipped.
__device__ __forceinline__ bool row_in_use(const QuantArgs& a, int64_t row) {
  if (!a.row_experts) return true;
  const int e = reinterpret_cast<const int32_t*>(a.row_experts)[row];
  return e >= 0 && e < a.experts;
}

// Tasks are (row, group) pairs, warp-uniform, so every lane of a warp takes the same branches and joins the
// shuffles.
template <class T, bool kVec>
__global__ void __launch_bounds__(32 * kWarps) quantize_rows_kernel(const QuantArgs a) {
  pdl::wait_for_prerequisites();  // every thread, first: none returns before
  pdl::launch_dependents();
  const int groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int64_t rows = rows_counted(a);
  const T* x = reinterpret_cast<const T*>(a.x);
  uint32_t err = 0;
  const int64_t tasks = rows * groups;
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; task < tasks;
       task += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t row = task / groups;
    const int g = static_cast<int>(task - row * groups);
    if (!row_in_use(a, row)) continue;
    const Slice s = quantize_slice<T, kVec>(a, x + row * a.x_stride, g, err);
    store_slice<kVec>(a, row, g, groups, s);
  }
  report(a.status, err);
}

template <class T, bool kVec>
__global__ void __launch_bounds__(32 * kWarps) quantize_gather_kernel(const QuantArgs a) {
  pdl::wait_for_prerequisites();  // every thread, first: none returns before
  pdl::launch_dependents();
  const int groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int32_t* positions = reinterpret_cast<const int32_t*>(a.positions);
  const T* x = reinterpret_cast<const T*>(a.x);
  uint32_t err = 0;
  const int64_t tasks = a.rows * groups;
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; task < tasks;
       task += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t t = task / groups;
    const int g = static_cast<int>(task - t * groups);
    const Slice s = quantize_slice<T, kVec>(a, x + t * a.x_stride, g, err);
    for (int j = 0; j < a.top_k; ++j) {
      const int64_t p = positions[t * a.top_k + j];
      if (p < 0) continue;  // dropped: another device's expert, a bad id, past a masked capacity
      if (p >= a.out_rows) {
        err |= kErrCapacityOverflow;
        continue;
      }
      store_slice<kVec>(a, p, g, groups, s);
    }
  }
  report(a.status, err);
}

// Per tensor (dynamic): the amax of every row the call quantises, into the word at a.amax (zeroed before on the
// stream) as f32 bits: non-negative floats order as their unsigned bits, so atomicMax on them is a float max.
// Rows and tokens as the per-row kernels take them, one warp each.
template <class T, bool kVec>
__global__ void __launch_bounds__(32 * kWarps) tensor_amax_kernel(const QuantArgs a) {
  const int groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int64_t rows = a.source == QuantSource::Gather ? a.rows : rows_counted(a);
  const T* x = reinterpret_cast<const T*>(a.x);
  float amax = 0.f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    if (a.source == QuantSource::Rows && !row_in_use(a, row)) continue;
    for (int g = 0; g < groups; ++g) {
      uint16_t raw[kPerLane];
      float v[kPerLane];
      amax = fmaxf(amax, load_slice<T, kVec>(a, x + row * a.x_stride, g, raw, v));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
  if (threadIdx.x % 32 == 0 && amax > 0.f) atomicMax(reinterpret_cast<unsigned*>(a.amax), __float_as_uint(amax));
}

// Per token: the row's scale, the static one where the caller gives it (device data: replaced by 1 and flagged
// unless finite and positive), the tensor's dynamic one where the caller asks for it, else the row's own.
template <class T, bool kVec>
__device__ __forceinline__ float token_scale(const QuantArgs& a, const T* __restrict__ xrow, int groups,
                                             uint32_t& err) {
  if (a.amax) return group_scale(__uint_as_float(*reinterpret_cast<const unsigned*>(a.amax)), a.eps, a.ue8m0 != 0);
  if (!a.scale) return row_scale<T, kVec>(a, xrow, groups);
  const float s = *reinterpret_cast<const float*>(a.scale);
  if (isfinite(s) && s > 0.f) return s;
  err |= kErrBadStaticScale;
  return 1.f;
}

// Per token (per_row): one warp per row (Rows) or token (Gather), warp-uniform. The warp reads its row twice,
// once for the amax of all its columns and once to encode them (the second read mostly from L2), and writes one
// scale per output row.
template <class T, bool kVec>
__global__ void __launch_bounds__(32 * kWarps) quantize_rows_per_row_kernel(const QuantArgs a) {
  pdl::wait_for_prerequisites();  // every thread, first: none returns before
  pdl::launch_dependents();
  const int groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int64_t rows = rows_counted(a);
  const T* x = reinterpret_cast<const T*>(a.x);
  uint32_t err = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    if (!row_in_use(a, row)) continue;
    const T* xrow = x + row * a.x_stride;
    const float scale = token_scale<T, kVec>(a, xrow, groups, err);
    for (int g = 0; g < groups; ++g) {
      uint16_t raw[kPerLane];
      float v[kPerLane];
      load_slice<T, kVec>(a, xrow, g, raw, v);
      store_q<kVec>(a, row, g, encode_slice(raw, v, scale, err));
    }
    if (threadIdx.x % 32 == 0) reinterpret_cast<float*>(a.scales)[row] = scale;
  }
  report(a.status, err);
}

template <class T, bool kVec>
__global__ void __launch_bounds__(32 * kWarps) quantize_gather_per_row_kernel(const QuantArgs a) {
  pdl::wait_for_prerequisites();  // every thread, first: none returns before
  pdl::launch_dependents();
  const int groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int32_t* positions = reinterpret_cast<const int32_t*>(a.positions);
  const T* x = reinterpret_cast<const T*>(a.x);
  uint32_t err = 0;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < a.rows;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* xrow = x + t * a.x_stride;
    const float scale = token_scale<T, kVec>(a, xrow, groups, err);
    for (int g = 0; g < groups; ++g) {
      uint16_t raw[kPerLane];
      float v[kPerLane];
      load_slice<T, kVec>(a, xrow, g, raw, v);
      const uint32_t q = encode_slice(raw, v, scale, err);
      for (int j = 0; j < a.top_k; ++j) {
        const int64_t p = positions[t * a.top_k + j];
        if (p < 0 || p >= a.out_rows) continue;  // dropped; an overflow is reported once, below
        store_q<kVec>(a, p, g, q);
      }
    }
    for (int j = 0; j < a.top_k; ++j) {
      const int64_t p = positions[t * a.top_k + j];
      if (p < 0) continue;  // dropped: another device's expert, a bad id, past a masked capacity
      if (p >= a.out_rows) {
        err |= kErrCapacityOverflow;
        continue;
      }
      if (threadIdx.x % 32 == 0) reinterpret_cast<float*>(a.scales)[p] = scale;
    }
  }
  report(a.status, err);
}

template <class T, bool kVec>
void launch(const QuantArgs& a, unsigned blocks, cudaStream_t s) {
  if (a.per_row && a.amax) {
    // A memset node and two kernels: graph-capturable, nothing synchronises.
    if (cudaMemsetAsync(reinterpret_cast<void*>(a.amax), 0, sizeof(unsigned), s) != cudaSuccess) return;
    tensor_amax_kernel<T, kVec><<<blocks, 32 * kWarps, 0, s>>>(a);
  }
  auto kernel = a.per_row ? (a.source == QuantSource::Gather ? quantize_gather_per_row_kernel<T, kVec>
                                                              : quantize_rows_per_row_kernel<T, kVec>)
                          : (a.source == QuantSource::Gather ? quantize_gather_kernel<T, kVec>
                                                              : quantize_rows_kernel<T, kVec>);
  // A launch error is also the runtime's last error, which quantize_fp8 reads.
  (void)pdl::launch(true, dim3(blocks), dim3(32 * kWarps), 0, s, kernel, a);
}

template <class T>
void launch(const QuantArgs& a, bool vec, unsigned blocks, cudaStream_t s) {
  if (vec) {
    launch<T, true>(a, blocks, s);
  } else {
    launch<T, false>(a, blocks, s);
  }
}

constexpr int kWeightThreads = 256;
constexpr int kChunk = 8;                                   // columns of a thread: one 16-byte load of 16-bit w
constexpr int kChunksPerRow = kWeightBlock / kChunk;        // 16 threads per block row
constexpr int kRowStep = kWeightThreads / kChunksPerRow;    // 16 block rows per pass of the CTA
constexpr int kRowsPerThread = kWeightBlock / kRowStep;     // 8 passes
static_assert(kRowsPerThread * kRowStep == kWeightBlock && kWeightThreads % 32 == 0, "the CTA tiles one block");

// The 16-bit bits of element j of a thread's row i (two per word, little-endian).
__device__ __forceinline__ uint16_t half_bits(const uint32_t (&row)[kChunk / 2], int j) {
  return static_cast<uint16_t>(row[j / 2] >> (16 * (j % 2)));
}

// Block `task` = (expert e, block row br, block column bc) in row-major [experts, gn, gk] order, which is also the
// index of its scale. kVec: k % 8 == 0, w 16-byte and out 8-byte aligned, so a thread's 8 columns are one 16-byte
// load and one 8-byte store, wholly inside or wholly past the row. Elements past n or k read as 0 (no part in the
// amax) and are not stored. The loop over blocks is CTA-uniform, so every thread reaches both barriers.
template <class T, bool kVec>
__global__ void __launch_bounds__(kWeightThreads) quantize_weights_kernel(const WeightQuantArgs a) {
  __shared__ float warp_amax[kWeightThreads / 32];
  // Row and column indices in int64: n or k near INT32_MAX would overflow int32 past their last block.
  const int64_t gn = (static_cast<int64_t>(a.n) + kWeightBlock - 1) / kWeightBlock;
  const int64_t gk = (static_cast<int64_t>(a.k) + kWeightBlock - 1) / kWeightBlock;
  const int64_t tasks = a.experts * gn * gk;
  const T* w = reinterpret_cast<const T*>(a.w);
  uint8_t* out = reinterpret_cast<uint8_t*>(a.out);
  float* scales = reinterpret_cast<float*>(a.scales);
  const int col = kChunk * (threadIdx.x % kChunksPerRow);
  const int row0 = threadIdx.x / kChunksPerRow;
  uint32_t err = 0;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t rest = task / gk;
    const int64_t r0 = (rest % gn) * kWeightBlock + row0;  // this thread's first row in the expert
    const int64_t c0 = (task % gk) * kWeightBlock + col;
    const int64_t first_row = (rest / gn) * a.n;  // the expert's row 0 in [experts * n, k]
    uint32_t bits[kRowsPerThread][kChunk / 2];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t r = r0 + kRowStep * i;
      const int64_t off = (first_row + r) * a.k + c0;
#pragma unroll
      for (int j = 0; j < kChunk / 2; ++j) bits[i][j] = 0;
      if (r < a.n) {
        if (kVec) {
          if (c0 < a.k) {
            const uint4 v = *reinterpret_cast<const uint4*>(w + off);
            bits[i][0] = v.x;
            bits[i][1] = v.y;
            bits[i][2] = v.z;
            bits[i][3] = v.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < kChunk; ++j)
            if (c0 + j < a.k) bits[i][j / 2] |= static_cast<uint32_t>(raw_bits(w[off + j])) << (16 * (j % 2));
        }
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float v = element::f32(from_raw<T>(half_bits(bits[i], j)));
        if (isfinite(v)) amax = fmaxf(amax, fabsf(v));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kWeightThreads / 32; ++i) amax = fmaxf(amax, warp_amax[i]);
    __syncthreads();  // the next block's maxima overwrite warp_amax
    const float scale = block_scale(amax, a.ue8m0 != 0);
    if (threadIdx.x == 0) scales[task] = scale;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t r = r0 + kRowStep * i;
      if (r >= a.n || c0 >= a.k) continue;
      const int64_t off = (first_row + r) * a.k + c0;
      uint32_t q[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const uint16_t b = half_bits(bits[i], j);
        q[j / 4] |= encode(element::f32(from_raw<T>(b)), b, scale, err) << (8 * (j % 4));
      }
      if (kVec) {
        *reinterpret_cast<uint2*>(out + off) = make_uint2(q[0], q[1]);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j)
          if (c0 + j < a.k) out[off + j] = static_cast<uint8_t>(q[j / 4] >> (8 * (j % 4)));
      }
    }
  }
  report(a.status, err);
}

template <class T>
void launch_weights(const WeightQuantArgs& a, bool vec, unsigned blocks, cudaStream_t s) {
  if (vec) {
    quantize_weights_kernel<T, true><<<blocks, kWeightThreads, 0, s>>>(a);
  } else {
    quantize_weights_kernel<T, false><<<blocks, kWeightThreads, 0, s>>>(a);
  }
}

}  // namespace quant

Status quantize_weights_fp8(const WeightQuantArgs& a) {
  using namespace quant;
  if (a.experts <= 0 || a.n <= 0 || a.k <= 0) return {StatusCode::Ok, 0};
  const int64_t blocks_n = (static_cast<int64_t>(a.n) + kWeightBlock - 1) / kWeightBlock;
  const int64_t blocks_k = (static_cast<int64_t>(a.k) + kWeightBlock - 1) / kWeightBlock;
  const int64_t want = a.experts * blocks_n * blocks_k;
  const unsigned blocks = static_cast<unsigned>(want < kMaxBlocks ? want : kMaxBlocks);
  const bool vec = a.k % kChunk == 0 && a.w % 16 == 0 && a.out % 8 == 0;
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.dtype == DType::BF16) {
    launch_weights<__nv_bfloat16>(a, vec, blocks, s);
  } else {
    launch_weights<__half>(a, vec, blocks, s);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

Status quantize_fp8(const QuantArgs& a) {
  using namespace quant;
  if (a.rows <= 0 || a.k <= 0) return {StatusCode::Ok, 0};
  const int64_t groups = (a.k + kQuantGroup - 1) / kQuantGroup;
  const int64_t warps = a.per_row ? a.rows : a.rows * groups;  // per row: one warp per row or token
  const int64_t want = (warps + kWarps - 1) / kWarps;
  const unsigned blocks = static_cast<unsigned>(want < kMaxBlocks ? want : kMaxBlocks);
  // 8-byte loads of 4 columns and 4-byte stores of their e4m3 bytes where every row keeps that alignment.
  const bool vec = a.k % 4 == 0 && a.x_stride % 4 == 0 && a.x % 8 == 0 && a.out % 4 == 0;
  auto s = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.dtype == DType::BF16) {
    launch<__nv_bfloat16>(a, vec, blocks, s);
  } else {
    launch<__half>(a, vec, blocks, s);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
