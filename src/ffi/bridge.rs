//! The cxx bridge: the only declaration of the C++ surface (`cpp/bridge/bridge.h` and the headers of
//! `cpp/bridge/sys.h`). The argument structs, their enums and `Status` are the C++ types themselves: generated
//! from the headers into `sys` (scripts/bindgen.sh) and handed to cxx below as trivial extern types, so that C++
//! reads what Rust wrote with no copy between them. Everything here is private to `ffi`; its sibling modules wrap
//! it in safe, checked calls.

use super::sys;

/// Hands each `sys` type to cxx as the C++ type of the same name in `moe_gemm`, a trivial one (passed and
/// returned by value).
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

trivial_extern_types! {
    Status DType TileConfig Fp8TileConfig Sm100TileConfig Fp8RowwiseConfig Sm100MxConfig FusedTile FusedFp8Tile
    GroupedGemmArgs GroupedGemmSm100Args GroupedGemmFp8Args GroupedGemmFp8RowwiseArgs GroupedGemmMxArgs
    Fp8KernelFacts Sm100KernelFacts RouterArgs SharedRoutingArgs LayoutArgs ActivationArgs DecodeArgs DecodeFp8Args
    FusedGemmArgs FusedGemmFp8Args QuantArgs WeightQuantArgs MxQuantArgs Fp4QuantArgs
}

#[cxx::bridge(namespace = "moe_gemm")]
pub(crate) mod ffi {
    // The C++ declarations themselves (launch.h and its siblings), called as they are.
    unsafe extern "C++" {
        include!("moe-gemm/cpp/bridge/bridge.h");

        type Status = crate::ffi::sys::Status;
        type DType = crate::ffi::sys::DType;
        type TileConfig = crate::ffi::sys::TileConfig;
        type Fp8TileConfig = crate::ffi::sys::Fp8TileConfig;
        type Sm100TileConfig = crate::ffi::sys::Sm100TileConfig;
        type FusedTile = crate::ffi::sys::FusedTile;
        type GroupedGemmArgs = crate::ffi::sys::GroupedGemmArgs;
        type GroupedGemmSm100Args = crate::ffi::sys::GroupedGemmSm100Args;
        type GroupedGemmFp8Args = crate::ffi::sys::GroupedGemmFp8Args;
        type Fp8KernelFacts = crate::ffi::sys::Fp8KernelFacts;
        type Sm100KernelFacts = crate::ffi::sys::Sm100KernelFacts;
        type RouterArgs = crate::ffi::sys::RouterArgs;
        type SharedRoutingArgs = crate::ffi::sys::SharedRoutingArgs;
        type LayoutArgs = crate::ffi::sys::LayoutArgs;
        type ActivationArgs = crate::ffi::sys::ActivationArgs;
        type DecodeArgs = crate::ffi::sys::DecodeArgs;
        type DecodeFp8Args = crate::ffi::sys::DecodeFp8Args;
        type FusedGemmArgs = crate::ffi::sys::FusedGemmArgs;
        type QuantArgs = crate::ffi::sys::QuantArgs;
        type WeightQuantArgs = crate::ffi::sys::WeightQuantArgs;

        fn grouped_gemm_sm90_fp8_blockwise_built(config: Fp8TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm90_fp8_blockwise_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// Compile-time facts of `config` (NotBuilt and `facts` untouched when it was not compiled).
        ///
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm90_fp8_blockwise_facts(config: Fp8TileConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// # Safety
        /// Every address in `args` must be a live device allocation of the size the args imply, on the device and
        /// stream given, and stay alive until the queued work completes, with the operands `GroupedGemmFp8Args`
        /// documents (e4m3 A and B, f32 scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_blockwise_run(args: &GroupedGemmFp8Args) -> Status;

        fn cudart_version() -> i32;
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
    }

    // bridge.cc: dispatch over the element type or tile family, names as Rust strings.
    #[namespace = "moe_gemm::bridge"]
    unsafe extern "C++" {
        fn grouped_gemm_sm90_built(dtype: DType, config: TileConfig) -> bool;
        fn grouped_gemm_sm90_workspace(
            dtype: DType,
            config: TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> Status;
        /// # Safety
        /// Every address in `args` must be a live device allocation of the size the args imply, on the device
        /// and stream given, and stay alive until the queued work completes.
        unsafe fn grouped_gemm_sm90_run(args: &GroupedGemmArgs) -> Status;
        /// The CUTLASS kernel schedule's type name of `config` ("" when not built).
        fn grouped_gemm_sm90_fp8_schedule(config: Fp8TileConfig) -> String;
        fn grouped_gemm_sm100_built(dtype: DType, config: Sm100TileConfig) -> bool;
        fn grouped_gemm_sm100_workspace(
            dtype: DType,
            config: Sm100TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> Status;
        /// Compile-time facts of (`dtype`, `config`) (NotBuilt and `facts` untouched when it was not compiled).
        fn grouped_gemm_sm100_facts(dtype: DType, config: Sm100TileConfig, facts: &mut Sm100KernelFacts) -> Status;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`: every address a live device allocation of the size the args imply,
        /// on the device and stream given, alive until the queued work completes.
        unsafe fn grouped_gemm_sm100_run(args: &GroupedGemmSm100Args) -> Status;
        /// `cudaGetErrorName` of a cudaError_t (no device needed).
        fn cuda_error_name(code: i32) -> String;
        /// # Safety
        /// Buffers of the sizes `FusedGemmArgs` documents for its mode, live on `stream`; `offsets`, `ready` and
        /// `topk_ids` as `fused_decode_gemm` (`cpp/common/moe_ops.h`) reads them, or 0.
        unsafe fn fused_moe_gemm(args: &FusedGemmArgs, offsets: u64, ready: u64, topk_ids: u64) -> Status;
        /// Opts the fused kernel of (`dtype`, `tile`) into its dynamic shared memory on the current device.
        fn fused_moe_prepare(dtype: DType, tile: FusedTile) -> Status;
    }
}
