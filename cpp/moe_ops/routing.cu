// moe-gemm unit: family=routing targets=portable seconds=1
// Routers: one warp per token, the token's scores in shared memory. See src/routing/mod.rs for the semantics
// of each RouterKind; the CPU reference (src/routing/reference.rs) is written independently from those.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "common/moe_ops.h"

namespace moe_gemm {
namespace routing {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;

// Preference order of every selection: higher score, then lower index.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int off = 16; off; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, off);
    const int oi = __shfl_xor_sync(kFull, i, off);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// "Taken" marks an expert already selected: a NaN key, which no comparison prefers. No key is NaN before the
// selection (NaN logits become -inf on load, and every score computed from them is made finite or -inf), so
// each round of the top-k has an untaken key, and (-inf, e) beats the (-inf, INT_MAX) start: ids stay in 0..E.
__device__ __forceinline__ bool taken(float key) { return key != key; }

__global__ void route_kernel(const RouterArgs a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= a.tokens) return;
  const int E = a.experts;
  float* key = smem + warp * 2 * E;  // selection key
  float* score = key + E;            // weight source (softmax / sigmoid / raw logit)
  const float* logits = reinterpret_cast<const float*>(a.logits) + static_cast<int64_t>(t) * E;
  const float* bias = reinterpret_cast<const float*>(a.bias);

  bool nonfinite = false;
  float lmax = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    float x = logits[e];
    if (!isfinite(x)) {
      nonfinite = true;
      x = x == INFINITY ? FLT_MAX : -INFINITY;  // NaN counts as -inf
    }
    score[e] = x;
    lmax = fmaxf(lmax, x);
  }
  if (__any_sync(kFull, nonfinite) && lane == 0) atomicOr(reinterpret_cast<uint32_t*>(a.status), kErrNonfiniteLogits);

  if (a.kind == RouterKind::Softmax) {
    // A -inf logit has probability 0; a token with no other (m = -inf) has none anywhere, not 0/0.
    const float m = warp_max(lmax);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += score[e] == -INFINITY ? 0.f : __expf(score[e] - m);
    const float total = warp_sum(sum);
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int e = lane; e < E; e += 32) key[e] = score[e] = score[e] == -INFINITY ? 0.f : __expf(score[e] - m) * inv;
  } else if (a.kind == RouterKind::TopKSoftmax) {
    for (int e = lane; e < E; e += 32) key[e] = score[e];
  } else {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.f / (1.f + __expf(-score[e]));  // 0 at -inf
      score[e] = s;
      const float c = s + bias[e];  // the correction bias steers selection only
      key[e] = c == c ? c : -INFINITY;  // a NaN bias counts as -inf
    }
  }
  __syncwarp();

  if (a.kind == RouterKind::GroupedSigmoid && a.n_group > 1) {
    const int size = E / a.n_group;
    // Group score: the sum of the group's two best biased scores, found by the whole warp per group (lanes
    // stride through the group, then a top-2 merge across lanes), so no lane walks a group alone.
    float gscore = -INFINITY;
    for (int g = 0; g < a.n_group; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int j = lane; j < size; j += 32) {
        const float v = key[g * size + j];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      for (int off = 16; off; off >>= 1) {
        const float o1 = __shfl_xor_sync(kFull, b1, off);
        const float o2 = __shfl_xor_sync(kFull, b2, off);
        const float hi = fmaxf(b1, o1);
        b2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
        b1 = hi;
      }
      const float sum2 = b1 + b2;  // -inf for a group of -inf scores; NaN (+inf and -inf) counts as -inf
      if (lane == g) gscore = sum2 == sum2 ? sum2 : -INFINITY;
    }
    unsigned kept = 0;
    for (int r = 0; r < a.topk_group; ++r) {
      const bool candidate = lane < a.n_group && !((kept >> lane) & 1u);
      float v = candidate ? gscore : -INFINITY;
      int i = candidate ? lane : INT_MAX;
      warp_best(v, i);
      kept |= 1u << i;
    }
    // Each lane masks the keys it read above (same index stride), so no lane writes a key another lane read
    // without a barrier between; the __syncwarp publishes the masks to the top-k loop's other stride.
    for (int g = 0; g < a.n_group; ++g)
      if (!((kept >> g) & 1u))
        for (int j = lane; j < size; j += 32) key[g * size + j] = -INFINITY;
    __syncwarp();
  }

  int my_id = -1;  // lane r holds the r-th choice
  for (int r = 0; r < a.top_k; ++r) {
    float v = -INFINITY;
    int i = INT_MAX;
    for (int e = lane; e < E; e += 32) {
      const float kv = key[e];
      if (!taken(kv) && better(kv, e, v, i)) {
        v = kv;
        i = e;
      }
    }
    warp_best(v, i);
    if (lane == r) my_id = i;
    // The lane that owns key[i] (it read it this round, and alone reads it next round) marks it taken: lanes
    // exchange the choice through shuffles only, never through shared memory.
#ifdef MOE_GEMM_PLANT_WARP_RACE  // scripts/sanitize.py --planted: the cross-lane write racecheck must report
    if (lane == 0) key[i] = NAN;
#else
    if (lane == i % 32) key[i] = NAN;
#endif
  }

  const bool mine = lane < a.top_k;
  float w = 0.f;
  if (a.kind == RouterKind::TopKSoftmax) {
    // Chosen -inf logits weigh 0; k of them (no finite logit in the token) weigh 0 each, not 0/0.
    const float x = mine ? score[my_id] : -INFINITY;
    const float m = warp_max(x);
    const float ex = x == -INFINITY ? 0.f : __expf(x - m);
    const float s = warp_sum(ex);
    w = s > 0.f ? ex / s : 0.f;
  } else {
    w = mine ? score[my_id] : 0.f;
    if (a.renormalize) {
      const float s = warp_sum(w);
      if (a.kind == RouterKind::GroupedSigmoid)
        w = w / (s + 1e-20f);
      else
        w = s > 0.f ? w / s : 0.f;  // softmax: s = 0 only for a token without any finite logit
    }
    if (a.kind == RouterKind::GroupedSigmoid) w *= a.scaling;
  }
  if (mine) {
#ifdef MOE_GEMM_PLANT_ROW_STORE  // scripts/sanitize.py --planted: the last token's row stored one row down
    const int64_t o = static_cast<int64_t>(t + (t == a.tokens - 1)) * a.top_k + lane;
#else
    const int64_t o = static_cast<int64_t>(t) * a.top_k + lane;
#endif
    reinterpret_cast<int32_t*>(a.ids)[o] = my_id;
    reinterpret_cast<float*>(a.weights)[o] = w;
  }
}

// One thread per (token, slot) of the extended routing.
__global__ void extend_routing_kernel(const SharedRoutingArgs a) {
  const int slots = a.top_k + a.shared;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(a.tokens) * slots) return;
  const int64_t t = i / slots;
  const int j = static_cast<int>(i - t * slots);
  int32_t id;
  float w;
  if (j < a.top_k) {
    const int64_t r = t * a.top_k + j;
    id = reinterpret_cast<const int32_t*>(a.ids)[r];
    w = reinterpret_cast<const float*>(a.weights)[r];
  } else {
    id = a.first_shared + (j - a.top_k);
    w = a.shared_weights ? reinterpret_cast<const float*>(a.shared_weights)[t] : 1.f;
  }
  reinterpret_cast<int32_t*>(a.ids_out)[i] = id;
  reinterpret_cast<float*>(a.weights_out)[i] = w;
}

}  // namespace routing

Status extend_routing(const SharedRoutingArgs& a) {
  const int64_t n = static_cast<int64_t>(a.tokens) * (a.top_k + a.shared);
  if (n == 0) return {StatusCode::Ok, 0};
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  routing::extend_routing_kernel<<<blocks, kThreads, 0, reinterpret_cast<cudaStream_t>(a.stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

Status route(const RouterArgs& a) {
  if (a.tokens == 0) return {StatusCode::Ok, 0};
  const size_t smem = sizeof(float) * 2 * a.experts * routing::kWarps;
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  cudaError_t e = cudaSuccess;
  if (smem > 48 * 1024) {
    e = cudaFuncSetAttribute(routing::route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return {StatusCode::Cuda, static_cast<int32_t>(e)};
  }
  const int blocks = (a.tokens + routing::kWarps - 1) / routing::kWarps;
  routing::route_kernel<<<blocks, 32 * routing::kWarps, smem, stream>>>(a);
  e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
