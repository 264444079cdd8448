// moe-gemm: the plain C++17 surface of the portable block-scaled grouped GEMM (grouped_mx_portable.cu). No CUDA or
// cxx headers. A header of its own, so that declaring it does not recompile the SM100 units.
#pragma once

#include "mx/launch_sm100_mx.h"

namespace moe_gemm {

// The SM100 block-scaled grouped GEMMs' function over their operand buffers, exactly as grouped_gemm_sm100_mx_run
// takes them (GroupedGemmMxArgs, launch_sm100_mx.h), on any GPU with bf16 tensor cores (the sm_90 and sm_100
// SASS built here): the operands are dequantised exactly into bf16 and multiplied with f32 accumulation. `config`
// picks the format pair only (a 2-SM configuration computes its pair; N need be whole 128s for every
// configuration); the workspace fields and sm_count are not read. Requires what _run requires of the shape, the
// alignments and the tensor scales; refuses PerRow. Each group's clamp bits (group_rows::resolve) are ORed into
// the status word once per group.
Status grouped_gemm_mx_portable_run(const GroupedGemmMxArgs& args);

}  // namespace moe_gemm
