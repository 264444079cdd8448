// The SwapAb decode tiles' asynchronous copies (fused_decode.cu, fused_decode_wgmma.cuh): bulk prefetches to L2
// and the mbarriers of the shared rings (their cp.async is common/cp_async.cuh's).
#pragma once

#include <cstdint>

#include "common/cp_async.cuh"  // cp_async_cg, cp_async_ca, cp_async_commit, cp_async_wait

namespace moe_gemm {
namespace fused_decode {

// Sends `bytes` (a multiple of 16, 16-byte aligned) from `src` towards L2, without waiting.
__device__ __forceinline__ void prefetch_l2(const void* src, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// mbarriers of the shared ring (SharedRing): `full` counts the threads' cp.async completions of a step, `empty`
// the threads that have read a stage into registers.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on `bar` once every cp.async this thread has issued so far has landed (counts as this thread's arrival).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT;\n}" ::"r"(
          smem_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace fused_decode
}  // namespace moe_gemm
