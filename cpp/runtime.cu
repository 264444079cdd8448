// Facts about the CUDA runtime linked into the library.
#include <cuda_runtime.h>

#include "launch.h"

namespace moe_gemm {
int32_t cudart_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}
}  // namespace moe_gemm
