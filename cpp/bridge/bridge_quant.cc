// The cxx bridge's C++ side for the quantisation kernels (quant.h, mx_quant.h): each params struct copied field by
// field into its launch struct, under the field-count guard of bridge_fields.h.
#include "moe-gemm/cpp/bridge/bridge.h"

#include "moe-gemm/cpp/bridge/bridge_fields.h"
#include "moe-gemm/src/ffi/bridge.rs.h"
#include "moe-gemm/src/ffi/bridge_fp8.rs.h"

namespace moe_gemm {
namespace bridge {
using detail::same_fields;
using detail::wrap;

LaunchStatus quantize_fp8(const QuantParams& p) {
  QuantArgs a{};
  a.dtype = p.dtype;
  a.source = p.source;
  a.rows = p.rows;
  a.top_k = p.top_k;
  a.k = p.k;
  a.x_stride = p.x_stride;
  a.x = p.x;
  a.positions = p.positions;
  a.out_rows = p.out_rows;
  a.total = p.total;
  a.row_experts = p.row_experts;
  a.experts = p.experts;
  a.eps = p.eps;
  a.ue8m0 = p.ue8m0;
  a.per_row = p.per_row;
  a.scale = p.scale;
  a.amax = p.amax;
  a.out = p.out;
  a.scales = p.scales;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<QuantParams, QuantArgs>(21), "assign every QuantArgs field above");
  return wrap(moe_gemm::quantize_fp8(a));
}

LaunchStatus quantize_weights_fp8(const WeightQuantParams& p) {
  WeightQuantArgs a{};
  a.dtype = p.dtype;
  a.ue8m0 = p.ue8m0;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.w = p.w;
  a.out = p.out;
  a.scales = p.scales;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<WeightQuantParams, WeightQuantArgs>(10), "assign every WeightQuantArgs field above");
  return wrap(moe_gemm::quantize_weights_fp8(a));
}

LaunchStatus quantize_mxfp8_grouped(const MxQuantParams& p) {
  MxQuantArgs a{};
  a.dtype = p.dtype;
  a.mode = p.mode;
  a.groups = p.groups;
  a.max_m = p.max_m;
  a.k = p.k;
  a.k_in = p.k_in;
  a.max_rows = p.max_rows;
  a.x_stride = p.x_stride;
  a.x = p.x;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.out = p.out;
  a.sf = p.sf;
  a.sf_bytes = p.sf_bytes;
  a.sf_bases = p.sf_bases;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<MxQuantParams, MxQuantArgs>(17), "assign every MxQuantArgs field above");
  return wrap(moe_gemm::quantize_mxfp8_grouped(a));
}

LaunchStatus quantize_fp4_grouped(const Fp4QuantParams& p) {
  Fp4QuantArgs a{};
  a.format = p.format;
  a.dtype = p.dtype;
  a.mode = p.mode;
  a.groups = p.groups;
  a.max_m = p.max_m;
  a.k = p.k;
  a.k_in = p.k_in;
  a.max_rows = p.max_rows;
  a.x_stride = p.x_stride;
  a.x = p.x;
  a.offsets = p.offsets;
  a.counts = p.counts;
  a.out = p.out;
  a.sf = p.sf;
  a.sf_bytes = p.sf_bytes;
  a.sf_bases = p.sf_bases;
  a.tensor_scale = p.tensor_scale;
  a.tensor = p.tensor;
  a.status = p.status;
  a.stream = p.stream;
  static_assert(same_fields<Fp4QuantParams, Fp4QuantArgs>(20), "assign every Fp4QuantArgs field above");
  return wrap(moe_gemm::quantize_fp4_grouped(a));
}

}  // namespace bridge
}  // namespace moe_gemm
