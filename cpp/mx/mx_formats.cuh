// The SM100 block-scaled operands' byte rules as device functions, shared by the code that writes them (the
// device quantisers, mx_quant.cu) and the code that reads them (the portable grouped GEMM,
// grouped_mx_portable.cu): the 128 x 4 scale-factor atom layout and the values of the scale codes.
// The host's copies are src/quant/sf_atoms.rs and src/quant/mx.rs.
#pragma once

#include <cstdint>

namespace moe_gemm {
namespace mx_formats {

// Bytes of one scale-factor atom: 128 rows x 4 one-byte scales.
constexpr int64_t kAtomBytes = 512;

// The byte offset of row m's scale for K-block kb in one matrix's (or group's) atoms, k_atoms = ceil(K-blocks / 4)
// atoms per 128 rows: atoms K-fastest, and within an atom 16 * (m % 32) + 4 * ((m / 32) % 4) + kb % 4
// (sf_atoms.rs's sf_offset).
__device__ __forceinline__ int64_t sf_offset(int64_t m, int kb, int k_atoms) {
  return (m / 128 * k_atoms + kb / 4) * kAtomBytes + 16 * (m % 32) + 4 * (m / 32 % 4) + kb % 4;
}

// The value of a UE4M3 byte (0x00 ..= 0x7E), exactly: m * 2^-9, or (8 + m) * 2^(e - 10).
__device__ __forceinline__ float ue4m3_value(uint32_t b) {
  const uint32_t e = b >> 3, m = b & 7u;
  // 2^(e - 10) for e in 1 ..= 15 is normal: its exponent field is e + 117.
  return e == 0u ? static_cast<float>(m) * 0x1p-9f : static_cast<float>(8u + m) * __uint_as_float((e + 117u) << 23);
}

// The value of a UE8M0 byte: 2^(b - 127), the subnormal 2^-127 for 0 (0xFF, NaN, is never written).
__device__ __forceinline__ float ue8m0_value(uint32_t b) {
  return __uint_as_float(b == 0u ? 0x400000u : b << 23);
}

}  // namespace mx_formats
}  // namespace moe_gemm
