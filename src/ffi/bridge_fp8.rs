//! The second cxx bridge: the C++ surface of the FP8 rowwise GEMM, the FP8 fused GEMMs, the MXFP8 and FP4 quantisers,
//! the SM100 MX GEMMs and their portable twin, and the SM100 FP8 blockwise GEMM (`cpp/fp8/launch_fp8_rowwise.h`,
//! `launch_fused_fp8.h`, `mx_quant.h`, `launch_sm100_mx.h`, `launch_mx_portable.h`, `launch_fp8.h`). Its
//! own file so that neither bridge outgrows one reading; the types both use are the first bridge's (`bridge.rs`),
//! aliased here. Private to `ffi`, as that one.

#[cxx::bridge(namespace = "moe_gemm::bridge")]
pub(crate) mod ffi {
    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Fp8RowwiseConfig {
        FastAccumPingpong64x128x128 = 0,
        FastAccumCooperative128x128x128 = 1,
        PromotedCooperative128x128x128 = 2,
    }
    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Sm100MxConfig {
        Mxf8Mma1Sm128x128x128 = 0,
        Mxf8f4Mma1Sm128x128x128 = 1,
        Mxf4Mma1Sm128x128x256 = 2,
        Nvf4Mma1Sm128x128x256 = 3,
        Mxf8Mma2Sm256x256x128 = 4,
    }
    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Fp4Format {
        Mxfp4 = 0,
        Nvfp4 = 1,
    }
    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum FusedFp8Tile {
        M64N64K128 = 0,
        M128N128K128 = 1,
    }

    /// Mirrors `moe_gemm::MxQuantArgs` (`cpp/mx/mx_quant.h`).
    struct MxQuantParams {
        dtype: DType,
        mode: GroupMode,
        groups: i32,
        max_m: i32,
        k: i32,
        /// Columns of x (<= k); the blocks past it are the zero pad.
        k_in: i32,
        max_rows: i64,
        x_stride: i64,
        x: u64,
        offsets: u64,
        counts: u64,
        out: u64,
        sf: u64,
        sf_bytes: u64,
        sf_bases: u64,
        status: u64,
        stream: u64,
    }
    /// Mirrors `moe_gemm::Fp4QuantArgs` (`cpp/mx/mx_quant.h`).
    struct Fp4QuantParams {
        format: Fp4Format,
        dtype: DType,
        mode: GroupMode,
        groups: i32,
        max_m: i32,
        k: i32,
        /// As `MxQuantParams::k_in`.
        k_in: i32,
        max_rows: i64,
        x_stride: i64,
        x: u64,
        offsets: u64,
        counts: u64,
        out: u64,
        sf: u64,
        sf_bytes: u64,
        sf_bases: u64,
        tensor_scale: f32,
        tensor: u64,
        status: u64,
        stream: u64,
    }
    /// Mirrors `moe_gemm::FusedGemmFp8Args` (`cpp/fused/launch_fused_fp8.h`).
    struct FusedGemmFp8Params {
        tile: FusedFp8Tile,
        mode: FusedMode,
        top_k: i32,
        experts: i32,
        n: i32,
        k: i32,
        rows: i32,
        sm_count: i32,
        capacity: i64,
        a: u64,
        sfa: u64,
        b: u64,
        sfb: u64,
        d: u64,
        sorted_ids: u64,
        expert_ids: u64,
        total: u64,
        weights: u64,
        bias: u64,
        stream: u64,
    }
    /// Mirrors `moe_gemm::GroupedGemmFp8RowwiseArgs` (`cpp/fp8/launch_fp8_rowwise.h`).
    struct GroupedGemmFp8RowwiseParams {
        config: Fp8RowwiseConfig,
        mode: GroupMode,
        max_m: i32,
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        sa: u64,
        b: u64,
        sb: u64,
        d: u64,
        offsets: u64,
        counts: u64,
        workspace: u64,
        workspace_bytes: u64,
        status: u64,
        device: i32,
        sm_count: i32,
        stream: u64,
    }
    /// Mirrors `moe_gemm::GroupedGemmMxArgs` (`cpp/mx/launch_sm100_mx.h`).
    struct GroupedGemmMxParams {
        config: Sm100MxConfig,
        mode: GroupMode,
        max_m: i32,
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        sfa: u64,
        sfa_bases: u64,
        b: u64,
        sfb: u64,
        a_tensor_scale: u64,
        b_tensor_scales: u64,
        d: u64,
        offsets: u64,
        counts: u64,
        workspace: u64,
        workspace_bytes: u64,
        status: u64,
        device: i32,
        sm_count: i32,
        stream: u64,
    }

    unsafe extern "C++" {
        include!("moe-gemm/cpp/bridge/bridge.h");
        include!("moe-gemm/src/ffi/bridge.rs.h");

        #[namespace = "moe_gemm"]
        type DType = crate::ffi::bridge::ffi::DType;
        #[namespace = "moe_gemm"]
        type GroupMode = crate::ffi::bridge::ffi::GroupMode;
        #[namespace = "moe_gemm"]
        type FusedMode = crate::ffi::bridge::ffi::FusedMode;
        type LaunchStatus = crate::ffi::bridge::ffi::LaunchStatus;
        type Fp8KernelFacts = crate::ffi::bridge::ffi::Fp8KernelFacts;
        #[namespace = "moe_gemm"]
        type Fp8TileConfig = crate::ffi::bridge::ffi::Fp8TileConfig;
        type GroupedGemmFp8Params = crate::ffi::bridge::ffi::GroupedGemmFp8Params;
        #[namespace = "moe_gemm"]
        type Fp8RowwiseConfig;
        #[namespace = "moe_gemm"]
        type Sm100MxConfig;
        #[namespace = "moe_gemm"]
        type FusedFp8Tile;
        #[namespace = "moe_gemm"]
        type Fp4Format;

        fn grouped_gemm_sm90_fp8_rowwise_built(config: Fp8RowwiseConfig) -> bool;
        fn grouped_gemm_sm90_fp8_rowwise_workspace(
            config: Fp8RowwiseConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        fn grouped_gemm_sm90_fp8_rowwise_facts(config: Fp8RowwiseConfig, facts: &mut Fp8KernelFacts) -> LaunchStatus;
        fn grouped_gemm_sm90_fp8_rowwise_schedule(config: Fp8RowwiseConfig) -> String;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`, with the operands `GroupedGemmFp8RowwiseArgs` documents (e4m3 A and
        /// B, f32 per-row and per-channel scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_rowwise_run(params: &GroupedGemmFp8RowwiseParams) -> LaunchStatus;
        fn grouped_gemm_sm100_fp8_built(config: Fp8TileConfig) -> bool;
        fn grouped_gemm_sm100_fp8_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        fn grouped_gemm_sm100_fp8_facts(config: Fp8TileConfig, facts: &mut Fp8KernelFacts) -> LaunchStatus;
        fn grouped_gemm_sm100_fp8_schedule(config: Fp8TileConfig) -> String;
        /// # Safety
        /// As for `grouped_gemm_sm90_fp8_run` (the same operands, `cpp/fp8/launch_fp8.h`), on an SM100 device.
        unsafe fn grouped_gemm_sm100_fp8_run(params: &GroupedGemmFp8Params) -> LaunchStatus;
        fn grouped_gemm_sm100_mx_built(config: Sm100MxConfig) -> bool;
        fn grouped_gemm_sm100_mx_workspace(
            config: Sm100MxConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `GroupedGemmMxArgs` documents (`cpp/mx/launch_sm100_mx.h`), on an SM100 device.
        unsafe fn grouped_gemm_sm100_mx_run(params: &GroupedGemmMxParams) -> LaunchStatus;
        /// # Safety
        /// As for `grouped_gemm_sm100_mx_run` (the same buffers), on any device the portable unit has SASS for.
        unsafe fn grouped_gemm_mx_portable_run(params: &GroupedGemmMxParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `FusedGemmFp8Args` documents for its mode, live on `stream`.
        unsafe fn fused_moe_gemm_fp8(params: &FusedGemmFp8Params) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `MxQuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_mxfp8_grouped(params: &MxQuantParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `Fp4QuantArgs` documents (`cpp/mx/mx_quant.h`), live on `stream`.
        unsafe fn quantize_fp4_grouped(params: &Fp4QuantParams) -> LaunchStatus;
        /// Opts the FP8 fused kernel of `tile` into its dynamic shared memory on the current device.
        fn fused_moe_prepare_fp8(tile: FusedFp8Tile) -> LaunchStatus;
    }
}
