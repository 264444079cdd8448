// Programmatic dependent launch (SM90+), shared by the decode-path kernels. A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled once every CTA of the kernel before it in
// the stream has called launch_dependents() (or exited); it must call wait_for_prerequisites() before it reads
// anything that kernel writes: the wait returns when that kernel has completed and its memory is visible.
// Without the launch attribute both are no-ops, so a kernel may call them whatever launched it.
#pragma once

#include <cuda_runtime.h>

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

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace pdl
}  // namespace moe_gemm
