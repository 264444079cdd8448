// moe-gemm: facts about the CUDA runtime that the bridge needs and launch.h does not declare (runtime.cu). Kept
// apart from launch.h so that adding to it recompiles no CUTLASS translation unit.
#pragma once

#include <cstdint>

namespace moe_gemm {

// cudaGetErrorName of a cudaError_t code ("cudaErrorInvalidValue"), or nullptr when the runtime knows no such
// code. Needs no device and no driver: a table lookup in the statically linked runtime.
const char* cuda_error_name(int32_t code);

}  // namespace moe_gemm
