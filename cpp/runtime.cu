// Facts about the CUDA runtime linked into the library.
#include <cuda_runtime.h>

#include "launch.h"

namespace moe_gemm {
int32_t cudart_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

namespace runtime_detail {
__global__ void spin_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
}  // namespace runtime_detail

int32_t spin(uint64_t ns, uint64_t stream) {
  runtime_detail::spin_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int32_t>(cudaGetLastError());
}
}  // namespace moe_gemm
