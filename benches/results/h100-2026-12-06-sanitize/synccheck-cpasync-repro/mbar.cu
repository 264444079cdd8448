// Minimal producer/consumer mbarrier pipeline, four ways to signal "stage full", to see which ones
// compute-sanitizer's synccheck reports as "Missing wait".
#include <cstdio>
#include <cstdint>
#include <cstdlib>
constexpr int kStages = 2, kIters = 16, kP = 32, kC = 32;

__device__ __forceinline__ uint32_t sa(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mb_init(uint64_t* b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n)); }
__device__ __forceinline__ void mb_arrive(uint64_t* b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory"); }
__device__ __forceinline__ void mb_wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(sa(b)), "r"(parity) : "memory");
}
__device__ __forceinline__ void cp16(void* s, const void* g) { asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(s)), "l"(g) : "memory"); }

__global__ void pipe(const int4* in, long long* out, int variant) {
  __shared__ int4 buf[kStages][kP];
  __shared__ uint64_t full[kStages], empty[kStages];
  const int t = threadIdx.x;
  if (t == 0) for (int s = 0; s < kStages; ++s) { mb_init(&full[s], kP); mb_init(&empty[s], kC); }
  __syncthreads();
  if (t < kP) {  // producer warp
    for (int i = 0; i < kIters; ++i) {
      const int s = i % kStages, n = i / kStages;
      if (i >= kStages) mb_wait(&empty[s], (n - 1) & 1);
      const int4* src = in + i * kP + t;
      switch (variant) {
        case 0: cp16(&buf[s][t], src); asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(sa(&full[s])) : "memory"); mb_arrive(&full[s]); break;
        case 1: cp16(&buf[s][t], src); asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(sa(&full[s])) : "memory"); break;
        case 2: cp16(&buf[s][t], src); asm volatile("cp.async.wait_all;" ::: "memory"); mb_arrive(&full[s]); break;
        default: buf[s][t] = *src; mb_arrive(&full[s]); break;
      }
    }
  } else {  // consumer warp
    const int c = t - kP;
    long long acc = 0;
    for (int i = 0; i < kIters; ++i) {
      const int s = i % kStages, n = i / kStages;
      mb_wait(&full[s], n & 1);
      acc += buf[s][c].x + buf[s][c].w;
      mb_arrive(&empty[s]);
    }
    out[c] = acc;
  }
}

int main(int argc, char** argv) {
  const int variant = argc > 1 ? atoi(argv[1]) : 0;
  const int n = kIters * kP;
  int4* h = (int4*)malloc(n * sizeof(int4));
  for (int i = 0; i < n; ++i) h[i] = make_int4(i, 0, 0, 2 * i);
  int4* d; long long* o; cudaMalloc(&d, n * sizeof(int4)); cudaMalloc(&o, kC * sizeof(long long));
  cudaMemcpy(d, h, n * sizeof(int4), cudaMemcpyHostToDevice);
  pipe<<<1, kP + kC>>>(d, o, variant);
  long long r[kC]; cudaError_t e = cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int c = 0; c < kC; ++c) { long long want = 0; for (int i = 0; i < kIters; ++i) want += 3LL * (i * kP + c); bad += r[c] != want; }
  printf("variant %d: %s, %d wrong sums\n", variant, cudaGetErrorString(e), bad);
  return bad != 0 || e != cudaSuccess;
}
