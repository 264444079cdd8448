// Host-compiler side of the cxx bridge: converts the bridge's shared structs to launch.h's PODs and dispatches
// over dtype. Never includes CUDA or CUTLASS headers.
#pragma once

#include <cstdint>

#include "moe_ops/decode_fp8.h"
#include "moe_ops/ep.h"
#include "common/launch.h"
#include "fp8/launch_fp8.h"
#include "fp8/launch_fp8_rowwise.h"
#include "fused/launch_fused_fp8.h"
#include "mx/mx_quant.h"
#include "mx/launch_sm100_mx.h"
#include "mx/launch_mx_portable.h"
#include "dense/launch_sm100.h"
#include "common/moe_ops.h"
#include "moe_ops/quant.h"
#include "common/runtime.h"
#include "rust/cxx.h"

namespace moe_gemm {
namespace bridge {

struct LaunchStatus;
struct GroupedGemmParams;
struct GroupedGemmFp8Params;
struct GroupedGemmFp8RowwiseParams;
struct Fp8KernelFacts;
struct GroupedGemmSm100Params;
struct Sm100KernelFacts;
struct RouterParams;
struct SharedRoutingParams;
struct LayoutParams;
struct ActivationParams;
struct DecodeParams;
struct DecodeFp8Params;
struct FusedGemmParams;
struct FusedGemmFp8Params;
struct MxQuantParams;
struct GroupedGemmMxParams;
struct Fp4QuantParams;
struct QuantParams;
struct WeightQuantParams;

bool grouped_gemm_sm90_built(DType dtype, TileConfig config);
LaunchStatus grouped_gemm_sm90_workspace(DType dtype, TileConfig config, int32_t groups, int32_t sm_count,
                                         uint64_t& bytes);
LaunchStatus grouped_gemm_sm90_run(const GroupedGemmParams& params);
bool grouped_gemm_sm90_fp8_built(Fp8TileConfig config);
LaunchStatus grouped_gemm_sm90_fp8_workspace(Fp8TileConfig config, int32_t groups, int32_t sm_count, uint64_t& bytes);
LaunchStatus grouped_gemm_sm90_fp8_facts(Fp8TileConfig config, Fp8KernelFacts& facts);
rust::String grouped_gemm_sm90_fp8_schedule(Fp8TileConfig config);
LaunchStatus grouped_gemm_sm90_fp8_run(const GroupedGemmFp8Params& params);
bool grouped_gemm_sm100_fp8_built(Fp8TileConfig config);
LaunchStatus grouped_gemm_sm100_fp8_workspace(Fp8TileConfig config, int32_t groups, int32_t sm_count, uint64_t& bytes);
LaunchStatus grouped_gemm_sm100_fp8_facts(Fp8TileConfig config, Fp8KernelFacts& facts);
rust::String grouped_gemm_sm100_fp8_schedule(Fp8TileConfig config);
LaunchStatus grouped_gemm_sm100_fp8_run(const GroupedGemmFp8Params& params);
bool grouped_gemm_sm90_fp8_rowwise_built(Fp8RowwiseConfig config);
LaunchStatus grouped_gemm_sm90_fp8_rowwise_workspace(Fp8RowwiseConfig config, int32_t groups, int32_t sm_count,
                                                     uint64_t& bytes);
LaunchStatus grouped_gemm_sm90_fp8_rowwise_facts(Fp8RowwiseConfig config, Fp8KernelFacts& facts);
rust::String grouped_gemm_sm90_fp8_rowwise_schedule(Fp8RowwiseConfig config);
LaunchStatus grouped_gemm_sm90_fp8_rowwise_run(const GroupedGemmFp8RowwiseParams& params);
bool grouped_gemm_sm100_built(DType dtype, Sm100TileConfig config);
LaunchStatus grouped_gemm_sm100_workspace(DType dtype, Sm100TileConfig config, int32_t groups, int32_t sm_count,
                                          uint64_t& bytes);
LaunchStatus grouped_gemm_sm100_facts(DType dtype, Sm100TileConfig config, Sm100KernelFacts& facts);
LaunchStatus grouped_gemm_sm100_run(const GroupedGemmSm100Params& params);
int32_t cudart_version();
rust::String cuda_error_name(int32_t code);
int32_t spin(uint64_t ns, uint64_t stream);
int32_t read_sweep(uint64_t ptr, uint64_t bytes, uint64_t sink, int32_t blocks, uint64_t stream);
LaunchStatus route(const RouterParams& params);
LaunchStatus extend_routing(const SharedRoutingParams& params);
LaunchStatus build_layout(const LayoutParams& params);
int64_t layout_scratch_ints(int64_t rows, int64_t local_experts);
LaunchStatus gather_rows(int32_t rows, int32_t top_k, int32_t hidden, uint64_t x, uint64_t positions, uint64_t out,
                         int64_t out_rows, uint64_t status, uint64_t stream);
LaunchStatus combine_rows(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t d, int64_t ld_d,
                          int64_t d_rows,
                          uint64_t positions, uint64_t weights, uint64_t row_experts, uint64_t bias,
                          int32_t experts, uint64_t y, uint64_t stream);
LaunchStatus activate(const ActivationParams& params);
LaunchStatus decode_layer(const DecodeParams& params);
LaunchStatus decode_layer_fp8(const DecodeFp8Params& params);
LaunchStatus fused_moe_gemm(const FusedGemmParams& params);
LaunchStatus fused_moe_prepare(DType dtype, FusedTile tile);
LaunchStatus fused_moe_gemm_fp8(const FusedGemmFp8Params& params);
LaunchStatus fused_moe_prepare_fp8(FusedFp8Tile tile);
LaunchStatus quantize_mxfp8_grouped(const MxQuantParams& params);
LaunchStatus quantize_fp4_grouped(const Fp4QuantParams& params);
bool grouped_gemm_sm100_mx_built(Sm100MxConfig config);
LaunchStatus grouped_gemm_sm100_mx_workspace(Sm100MxConfig config, int32_t groups, int32_t sm_count, uint64_t& bytes);
LaunchStatus grouped_gemm_sm100_mx_run(const GroupedGemmMxParams& params);
LaunchStatus grouped_gemm_mx_portable_run(const GroupedGemmMxParams& params);
LaunchStatus sum_slots(DType dtype, int32_t tokens, int32_t top_k, int32_t hidden, uint64_t pairs, uint64_t positions,
                       uint64_t y, uint64_t stream);
LaunchStatus quantize_fp8(const QuantParams& params);
LaunchStatus quantize_weights_fp8(const WeightQuantParams& params);
LaunchStatus ep_gather_ids(int64_t capacity, int32_t rows, uint64_t sorted_ids, uint64_t ids, int32_t sentinel,
                           uint64_t out, uint64_t stream);

}  // namespace bridge
}  // namespace moe_gemm
