// moe-gemm unit: family=layouts targets=portable seconds=1
// Expert parallelism: the one kernel the dispatch needs beyond the layout build and the row gather (ep.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_ops/ep.h"

namespace moe_gemm {
namespace ep {

__global__ void gather_ids_kernel(int64_t capacity, int32_t rows, const int32_t* __restrict__ sorted_ids,
                                  const int32_t* __restrict__ ids, int32_t sentinel, int32_t* __restrict__ out) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < capacity;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t r = sorted_ids[p];
    out[p] = (r >= 0 && r < rows) ? ids[r] : sentinel;
  }
}

}  // namespace ep

Status ep_gather_ids(int64_t capacity, int32_t rows, uint64_t sorted_ids, uint64_t ids, int32_t sentinel, uint64_t out,
                     uint64_t stream) {
  if (capacity <= 0) return {StatusCode::Ok, 0};
  const int64_t blocks64 = (capacity + 255) / 256;
  const int blocks = static_cast<int>(blocks64 < 4096 ? blocks64 : 4096);
  ep::gather_ids_kernel<<<blocks, 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      capacity, rows, reinterpret_cast<const int32_t*>(sorted_ids), reinterpret_cast<const int32_t*>(ids), sentinel,
      reinterpret_cast<int32_t*>(out));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

}  // namespace moe_gemm
