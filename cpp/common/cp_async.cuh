// cp.async into shared memory (SM80+), shared by the crate's own streaming kernels: the fused decode tiles and
// the FP8 swap-AB decode GEMM.
#pragma once

#include <cstdint>

namespace moe_gemm {

// 16 bytes global -> shared, zero-filled where `bytes` is 0: .cg (L2 only) for streamed weights, .ca for rows
// that the block's warps share.
__device__ __forceinline__ void cp_async_cg(void* dst, const void* src, int bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src, int bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}
// 4 bytes (a scale), zero-filled where `bytes` is 0.
__device__ __forceinline__ void cp_async_ca4(void* dst, const void* src, int bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

}  // namespace moe_gemm
