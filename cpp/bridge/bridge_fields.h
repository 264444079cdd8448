// moe-gemm: what the cxx bridge's C++ side shares between its translation units (bridge.cc, bridge_quant.cc):
// the status conversion and the field-count guard of every copy from a cxx params struct into its launch struct.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "moe-gemm/cpp/bridge/bridge.h"
#include "moe-gemm/src/ffi/bridge.rs.h"

namespace moe_gemm {
namespace bridge {
namespace detail {
inline LaunchStatus wrap(Status s) { return LaunchStatus{s.code, s.detail}; }

// Field counting of an aggregate (the number of initialisers it accepts), for the guards below: each copy from a
// cxx params struct into its launch.h / moe_ops.h argument struct assigns every field by name, and a guard
// states how many fields the copy assigns, so that a field added on either side without its assignment fails to
// compile instead of launching with a zero.
struct AnyField {
  template <class T>
  operator T() const;  // declared only: used in unevaluated contexts
};
template <class T, class... A>
constexpr auto accepts(int) -> decltype(T{std::declval<A>()...}, true) {
  return true;
}
template <class T, class... A>
constexpr bool accepts(...) {
  return false;
}
template <class T, class... A>
constexpr std::size_t field_count() {
  if constexpr (accepts<T, A..., AnyField>(0)) {
    return field_count<T, A..., AnyField>();
  } else {
    return sizeof...(A);
  }
}
// Both structs of a pair have `n` fields (the number of assignments in the copy) and the same size.
template <class Params, class Args>
constexpr bool same_fields(std::size_t n) {
  return std::is_aggregate_v<Params> && std::is_aggregate_v<Args> && field_count<Params>() == n &&
         field_count<Args>() == n && sizeof(Params) == sizeof(Args);
}
}  // namespace detail
}  // namespace bridge
}  // namespace moe_gemm
