// Programmatic dependent launch (SM90+), shared by the decode-path kernels. A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled once every CTA of the kernel before it in
// the stream has called launch_dependents() (or exited); it must call wait_for_prerequisites() before it reads
// anything that kernel writes: the wait returns when that kernel has completed and its memory is visible.
// Without the launch attribute both are no-ops, so a kernel may call them whatever launched it.
#pragma once

namespace moe_gemm {
namespace pdl {

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace pdl
}  // namespace moe_gemm
