//! The second cxx bridge: the C++ surface of the FP8 rowwise GEMM, the FP8 fused GEMMs, the MXFP8 and FP4 quantisers,
//! the SM100 MX GEMMs and their portable twin, and the SM100 FP8 blockwise GEMM (`cpp/fp8/launch_fp8_rowwise.h`,
//! `launch_fused_fp8.h`, `mx_quant.h`, `launch_sm100_mx.h`, `launch_mx_portable.h`, `launch_fp8.h`). Its own file
//! so that neither bridge outgrows one reading; its types are `sys`'s, handed to cxx in `bridge.rs`. Private to
//! `ffi`, as that one.

#[cxx::bridge(namespace = "moe_gemm")]
pub(crate) mod ffi {
    // The C++ declarations themselves, called as they are.
    unsafe extern "C++" {
        include!("moe-gemm/cpp/bridge/bridge.h");

        type Status = crate::ffi::sys::Status;
        type Fp8TileConfig = crate::ffi::sys::Fp8TileConfig;
        type Fp8RowwiseConfig = crate::ffi::sys::Fp8RowwiseConfig;
        type Sm100MxConfig = crate::ffi::sys::Sm100MxConfig;
        type FusedFp8Tile = crate::ffi::sys::FusedFp8Tile;
        type Fp8KernelFacts = crate::ffi::sys::Fp8KernelFacts;
        type GroupedGemmFp8Args = crate::ffi::sys::GroupedGemmFp8Args;
        type GroupedGemmFp8RowwiseArgs = crate::ffi::sys::GroupedGemmFp8RowwiseArgs;
        type GroupedGemmMxArgs = crate::ffi::sys::GroupedGemmMxArgs;
        type FusedGemmFp8Args = crate::ffi::sys::FusedGemmFp8Args;
        type MxQuantArgs = crate::ffi::sys::MxQuantArgs;
        type Fp4QuantArgs = crate::ffi::sys::Fp4QuantArgs;

        fn grouped_gemm_sm90_fp8_rowwise_built(config: Fp8RowwiseConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm90_fp8_rowwise_workspace(
            config: Fp8RowwiseConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm90_fp8_rowwise_facts(config: Fp8RowwiseConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`, with the operands `GroupedGemmFp8RowwiseArgs` documents (e4m3 A and
        /// B, f32 per-row and per-channel scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_rowwise_run(args: &GroupedGemmFp8RowwiseArgs) -> Status;
        fn grouped_gemm_sm100_fp8_blockwise_built(config: Fp8TileConfig) -> bool;
        /// # Safety
        /// `bytes` points to a live u64, which the call writes.
        unsafe fn grouped_gemm_sm100_fp8_blockwise_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: *mut u64,
        ) -> Status;
        /// # Safety
        /// `facts` points to a live `Fp8KernelFacts`, which the call may write.
        unsafe fn grouped_gemm_sm100_fp8_blockwise_facts(config: Fp8TileConfig, facts: *mut Fp8KernelFacts) -> Status;
        /// # Safety
        /// As for `grouped_gemm_sm90_fp8_blockwise_run` (the same operands, `cpp/fp8/launch_fp8.h`), on an SM100
        /// device.
        unsafe fn grouped_gemm_sm100_fp8_blockwise_run(args: &GroupedGemmFp8Args) -> Status;
        /// # Safety
        /// As for `grouped_gemm_sm100_mx_run` (the same buffers), on any device the portable unit has SASS for.
        unsafe fn grouped_gemm_mx_portable_run(args: &GroupedGemmMxArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `FusedGemmFp8Args` documents for its mode, live on `stream`.
        unsafe fn fused_moe_gemm_fp8(args: &FusedGemmFp8Args) -> Status;
        /// Opts the FP8 fused kernel of `tile` into its dynamic shared memory on the current device.
        fn fused_moe_prepare_fp8(tile: FusedFp8Tile) -> Status;
        /// # Safety
        /// Buffers of the sizes `MxQuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_mxfp8_grouped(args: &MxQuantArgs) -> Status;
        /// # Safety
        /// Buffers of the sizes `Fp4QuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_fp4_grouped(args: &Fp4QuantArgs) -> Status;
    }

    // bridge.cc: dispatch over the unit that compiled a configuration, names as Rust strings.
    #[namespace = "moe_gemm::bridge"]
    unsafe extern "C++" {
        fn grouped_gemm_sm90_fp8_rowwise_schedule(config: Fp8RowwiseConfig) -> String;
        fn grouped_gemm_sm100_fp8_schedule(config: Fp8TileConfig) -> String;
        fn grouped_gemm_sm100_mx_built(config: Sm100MxConfig) -> bool;
        fn grouped_gemm_sm100_mx_workspace(
            config: Sm100MxConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> Status;
        /// # Safety
        /// Buffers of the sizes `GroupedGemmMxArgs` documents (`cpp/mx/launch_sm100_mx.h`), on an SM100 device.
        unsafe fn grouped_gemm_sm100_mx_run(args: &GroupedGemmMxArgs) -> Status;
    }
}
