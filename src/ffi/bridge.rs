//! The bridge of the MoE operations and the runtime: routers, layouts, activation, the decode layers, the FP8 and
//! MX quantisers, expert parallelism's gather (`cpp/common/moe_ops.h` and the headers beside it). Each GEMM family
//! has its own bridge in its launcher (`kernels/<family>/launch.rs`). The argument structs, their enums and
//! `Status` are the C++ types themselves: generated from the headers into `sys` (build/bindings.rs) and handed to
//! cxx as trivial extern types ([`trivial_extern_types`]), so that C++ reads what Rust wrote with no copy between
//! them. Everything here is private to `ffi`; its sibling modules wrap it in safe, checked calls.

use std::ffi::{c_char, CStr};

use super::sys;

/// Hands each `sys` type (`sys` as named where this is invoked: `ffi::sys`, or a family's own) to cxx as the C++
/// type of the same name in `moe_gemm`, a trivial one (passed and returned by value). Each type once in the crate:
/// by the bridge that owns it.
macro_rules! trivial_extern_types {
    ($($t:ident)*) => {$(
        // SAFETY: `sys::$t` is bindgen's translation of `moe_gemm::$t` (a plain struct of scalars, or an enum
        // with its C++ underlying type), whose size, alignment and field offsets `sys` asserts at compile time
        // to be the C++ ones; such a type is trivially movable and destructible on both sides.
        unsafe impl cxx::ExternType for sys::$t {
            type Id = cxx::type_id!(moe_gemm::$t);
            type Kind = cxx::kind::Trivial;
        }
    )*};
}
pub(crate) use trivial_extern_types;

trivial_extern_types! {
    Status DType Fp8KernelFacts RouterArgs SharedRoutingArgs LayoutArgs ActivationArgs DecodeArgs DecodeFp8Args QuantArgs
    WeightQuantArgs MxQuantArgs Fp4QuantArgs
}

/// A name C++ hands back as a C string literal (null for none) as Rust text, `""` for null.
///
/// # Safety
/// `name` is null or points to a NUL-terminated string that lives as long as the program (a literal).
pub(crate) unsafe fn static_name(name: *const c_char) -> &'static str {
    if name.is_null() {
        return "";
    }
    // SAFETY: non-null here; the caller promises a NUL-terminated string with static lifetime.
    unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("(not UTF-8)")
}

#[cxx::bridge(namespace = "moe_gemm")]
pub(crate) mod ffi {
    // The C++ declarations themselves, called as they are.
    unsafe extern "C++" {
        include!("moe-gemm/cpp/common/launch.h");
        include!("moe-gemm/cpp/common/moe_ops.h");
        include!("moe-gemm/cpp/common/runtime.h");
        include!("moe-gemm/cpp/moe_ops/decode_fp8.h");
        include!("moe-gemm/cpp/moe_ops/ep.h");
        include!("moe-gemm/cpp/moe_ops/quant.h");
        include!("moe-gemm/cpp/mx/mx_quant.h");

        type Status = crate::ffi::sys::Status;
        type DType = crate::ffi::sys::DType;
        type RouterArgs = crate::ffi::sys::RouterArgs;
        type SharedRoutingArgs = crate::ffi::sys::SharedRoutingArgs;
        type LayoutArgs = crate::ffi::sys::LayoutArgs;
        type ActivationArgs = crate::ffi::sys::ActivationArgs;
        type DecodeArgs = crate::ffi::sys::DecodeArgs;
        type DecodeFp8Args = crate::ffi::sys::DecodeFp8Args;
        type QuantArgs = crate::ffi::sys::QuantArgs;
        type WeightQuantArgs = crate::ffi::sys::WeightQuantArgs;
        type MxQuantArgs = crate::ffi::sys::MxQuantArgs;
        type Fp4QuantArgs = crate::ffi::sys::Fp4QuantArgs;

        fn cudart_version() -> i32;
        /// `cudaGetErrorName` of a cudaError_t (no device needed); null for none.
        fn cuda_error_name(code: i32) -> *const c_char;
        /// # Safety
        /// `stream` is a live stream of the current context.
        unsafe fn spin(ns: u64, stream: u64) -> i32;
        /// # Safety
        /// `ptr` holds `bytes` (a multiple of 16) and `sink` `blocks` u32, live on `stream`.
        unsafe fn read_sweep(ptr: u64, bytes: u64, sink: u64, blocks: i32, stream: u64) -> i32;

        /// # Safety
        /// Live device buffers of the sizes `RouterArgs` implies, on `stream`.
        unsafe fn route(args: &RouterArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `SharedRoutingArgs` documents, live on `stream`.
        unsafe fn extend_routing(args: &SharedRoutingArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `LayoutArgs` documents, live on `stream`.
        unsafe fn build_layout(args: &LayoutArgs) -> Status;
        fn layout_scratch_ints(rows: i64, local_experts: i64) -> i64;
        /// # Safety
        /// `x` [rows / top_k, hidden], `positions` [rows], `out` [out_rows, hidden] 16-bit, 16-byte aligned.
        #[allow(clippy::too_many_arguments)]
        unsafe fn gather_rows(
            rows: i32,
            top_k: i32,
            hidden: i32,
            x: u64,
            positions: u64,
            out: u64,
            out_rows: i64,
            status: u64,
            stream: u64,
        ) -> Status;
        /// # Safety
        /// `d` [d_rows, ld_d] (ld_d >= hidden), `positions`/`weights` [tokens * top_k], `y` [tokens, hidden],
        /// rows 16-byte aligned.
        #[allow(clippy::too_many_arguments)]
        unsafe fn combine_rows(
            dtype: DType,
            tokens: i32,
            top_k: i32,
            hidden: i32,
            d: u64,
            ld_d: i64,
            d_rows: i64,
            positions: u64,
            weights: u64,
            row_experts: u64,
            bias: u64,
            experts: i32,
            y: u64,
            stream: u64,
        ) -> Status;
        /// # Safety
        /// `d1` [rows, 2I or I], `h` [rows, I], `row_experts` [rows], `bias` [experts, 2I or I] or 0, `total`
        /// one int32 or 0; live on `stream`.
        unsafe fn activate(args: &ActivationArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `DecodeArgs` documents, live on `stream`.
        unsafe fn decode_layer(args: &DecodeArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `DecodeFp8Args` documents (`cpp/moe_ops/decode_fp8.h`), live on `stream`.
        unsafe fn decode_layer_fp8(args: &DecodeFp8Args) -> Status;
        /// # Safety
        /// `pairs` [tokens * top_k, hidden], `positions` [tokens * top_k], `y` [tokens, hidden], 16-byte aligned.
        #[allow(clippy::too_many_arguments)]
        unsafe fn sum_slots(
            dtype: DType,
            tokens: i32,
            top_k: i32,
            hidden: i32,
            pairs: u64,
            positions: u64,
            y: u64,
            stream: u64,
        ) -> Status;
        /// # Safety
        /// Buffers of the sizes `QuantArgs` documents for its source (`cpp/moe_ops/quant.h`), live on `stream`.
        unsafe fn quantize_fp8(args: &QuantArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `WeightQuantArgs` documents (`cpp/moe_ops/quant.h`), live on `stream`.
        unsafe fn quantize_weights_fp8(args: &WeightQuantArgs) -> Status;
        /// # Safety
        /// `sorted_ids` and `out` int32 [capacity], `ids` int32 [rows], live on `stream`.
        unsafe fn ep_gather_ids(
            capacity: i64,
            rows: i32,
            sorted_ids: u64,
            ids: u64,
            sentinel: i32,
            out: u64,
            stream: u64,
        ) -> Status;
        /// # Safety
        /// Buffers of the sizes `MxQuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_mxfp8_grouped(args: &MxQuantArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `Fp4QuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_fp4_grouped(args: &Fp4QuantArgs) -> Status;
    }
}
