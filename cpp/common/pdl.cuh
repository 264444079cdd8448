// Programmatic dependent launch (SM90+) of the crate's own kernels (`launch` below). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled once every CTA of the kernel before it in
// the stream has called launch_dependents() (or exited); it must call wait_for_prerequisites() before it reads
// anything that kernel writes: the wait returns when that kernel has completed and its memory is visible.
// Without the launch attribute both are no-ops, so a kernel may call them whatever launched it.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.h"

namespace moe_gemm {
namespace pdl {

// Host side: lets the kernel of `cfg` be scheduled before the one before it in the stream has ended. `attr` holds
// the attribute and must live until cudaLaunchKernelEx has returned.
inline void allow_early_start(cudaLaunchConfig_t& cfg, cudaLaunchAttribute (&attr)[1]) {
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
}

// kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx, allowed to start early where
// `early`: every PDL launch of the crate's own kernels goes through here.
template <class... Params, class... Args>
Status launch(bool early, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*kernel)(Params...),
              Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (early) allow_early_start(cfg, attr);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  return e == cudaSuccess ? Status{StatusCode::Ok, 0} : Status{StatusCode::Cuda, static_cast<int32_t>(e)};
}

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace pdl
}  // namespace moe_gemm
