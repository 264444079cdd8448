//! The cxx bridge: the only declaration of the C++ surface (`cpp/bridge/bridge.h`, `cpp/common/launch.h`).
//! Everything here is private to `ffi`; its sibling modules wrap it in safe, checked calls.

#[cxx::bridge(namespace = "moe_gemm::bridge")]
pub(crate) mod ffi {
    // Extern enums: launch.h is the source of truth; cxx static_asserts these discriminants against it.
    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum DType {
        BF16 = 0,
        F16 = 1,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum TileConfig {
        Cooperative128x128x64 = 0,
        Cooperative128x256x64 = 1,
        Pingpong64x128x64 = 2,
        Pingpong128x128x64 = 3,
        Pingpong64x64x128 = 4,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Fp8TileConfig {
        Cooperative128x128x128 = 0,
        Pingpong64x128x128 = 1,
        Sm100Blockwise1Sm128x128x128 = 2,
        Sm100Blockwise2Sm256x128x128 = 3,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Sm100TileConfig {
        Mma1Sm128x256x64 = 0,
        Mma1Sm128x128x64 = 1,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum StatusCode {
        Ok = 0,
        NotBuilt = 1,
        WorkspaceTooSmall = 2,
        CutlassCannotImplement = 3,
        CutlassInitialize = 4,
        CutlassRun = 5,
        Cuda = 6,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum GroupMode {
        Offsets = 0,
        Padded = 1,
        Masked = 2,
        PerRow = 3,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum RouterKind {
        Softmax = 0,
        TopKSoftmax = 1,
        GroupedSigmoid = 2,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum LayoutKind {
        Packed = 0,
        Masked = 1,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum GateUp {
        Concatenated = 0,
        Interleaved = 1,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum Activation {
        SiluGated = 0,
        GptOssSwiglu = 1,
        Silu = 2,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum FusedTile {
        M64N128K64 = 0,
        M128N256K64 = 1,
        SwapAb16 = 2,
        SwapAb32 = 3,
        SwapAbMerged = 4,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum FusedMode {
        Gather = 0,
        Scatter = 1,
        GatherGated = 2,
    }

    #[namespace = "moe_gemm"]
    #[repr(u32)]
    #[derive(Debug)]
    enum QuantSource {
        Rows = 0,
        Gather = 1,
    }

    /// Mirrors `moe_gemm::QuantArgs` (`cpp/moe_ops/quant.h`).
    struct QuantParams {
        dtype: DType,
        source: QuantSource,
        rows: i64,
        top_k: i32,
        k: i32,
        x_stride: i64,
        x: u64,
        positions: u64,
        out_rows: i64,
        total: u64,
        row_experts: u64,
        experts: i32,
        eps: f32,
        ue8m0: i32,
        per_row: i32,
        scale: u64,
        amax: u64,
        out: u64,
        scales: u64,
        status: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::WeightQuantArgs` (`cpp/moe_ops/quant.h`).
    struct WeightQuantParams {
        dtype: DType,
        ue8m0: i32,
        experts: i64,
        n: i32,
        k: i32,
        w: u64,
        out: u64,
        scales: u64,
        status: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::FusedGemmArgs`.
    struct FusedGemmParams {
        dtype: DType,
        tile: FusedTile,
        mode: FusedMode,
        top_k: i32,
        experts: i32,
        n: i32,
        k: i32,
        rows: i32,
        sm_count: i32,
        capacity: i64,
        a: u64,
        b: u64,
        d: u64,
        sorted_ids: u64,
        expert_ids: u64,
        offsets: u64,
        /// The GEMM1 -> GEMM2 hand-off counters (`fused_decode_gemm`'s `ready`), or 0.
        ready: u64,
        /// The batch's topk_ids (`fused_decode_gemm`'s `topk`), or 0.
        topk_ids: u64,
        total: u64,
        weights: u64,
        bias: u64,
        act: Activation,
        gate_up: GateUp,
        stream: u64,
    }

    /// Mirrors `moe_gemm::ActivationArgs`.
    struct ActivationParams {
        dtype: DType,
        act: Activation,
        gate_up: GateUp,
        inter: i32,
        rows: i64,
        total: u64,
        row_experts: u64,
        experts: i32,
        bias: u64,
        d1: u64,
        h: u64,
        status: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::DecodeArgs`.
    struct DecodeParams {
        dtype: DType,
        act: Activation,
        gate_up: GateUp,
        tokens: i32,
        top_k: i32,
        experts: i32,
        hidden: i32,
        inter: i32,
        x: u64,
        ids: u64,
        weights: u64,
        w13: u64,
        w2: u64,
        b13: u64,
        b2: u64,
        h: u64,
        y: u64,
        status: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::DecodeFp8Args` (`cpp/moe_ops/decode_fp8.h`).
    struct DecodeFp8Params {
        act: Activation,
        tokens: i32,
        top_k: i32,
        experts: i32,
        hidden: i32,
        inter: i32,
        eps: f32,
        ue8m0: i32,
        x: u64,
        ids: u64,
        weights: u64,
        w13: u64,
        w13_scales: u64,
        w2: u64,
        w2_scales: u64,
        b13: u64,
        b2: u64,
        h: u64,
        y: u64,
        status: u64,
        stream: u64,
    }

    #[derive(Debug)]
    struct LaunchStatus {
        code: StatusCode,
        detail: i32,
    }

    /// Mirrors `moe_gemm::GroupedGemmArgs`; device addresses and the stream as u64.
    struct GroupedGemmParams {
        dtype: DType,
        config: TileConfig,
        mode: GroupMode,
        max_m: i32,
        a_div: i32,
        experts: i32,
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        b: u64,
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

    /// Mirrors `moe_gemm::GroupedGemmFp8Args` (`cpp/fp8/launch_fp8.h`); device addresses and the stream as u64.
    struct GroupedGemmFp8Params {
        config: Fp8TileConfig,
        mode: GroupMode,
        max_m: i32,
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        sfa: u64,
        b: u64,
        sfb: u64,
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

    /// Mirrors `moe_gemm::GroupedGemmSm100Args` (`cpp/dense/launch_sm100.h`); device addresses and the stream as u64.
    struct GroupedGemmSm100Params {
        dtype: DType,
        config: Sm100TileConfig,
        mode: GroupMode,
        max_m: i32,
        a_div: i32,
        experts: i32,
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        b: u64,
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

    /// Mirrors `moe_gemm::Sm100KernelFacts` (`cpp/dense/launch_sm100.h`): compile-time facts of a built configuration.
    #[derive(Debug, Default)]
    struct Sm100KernelFacts {
        tile_m: i32,
        tile_n: i32,
        tile_k: i32,
        cluster_m: i32,
        cluster_n: i32,
        atom_m: i32,
        stages: i32,
        umma_array_mainloop: bool,
        ptr_array_epilogue: bool,
    }

    /// Mirrors `moe_gemm::Fp8KernelFacts` (`cpp/fp8/launch_fp8.h`): compile-time facts of a built configuration.
    #[derive(Debug, Default)]
    struct Fp8KernelFacts {
        tile_m: i32,
        tile_n: i32,
        tile_k: i32,
        cluster_m: i32,
        cluster_n: i32,
        sms_per_mma: i32,
        scale_m: i32,
        scale_n: i32,
        scale_k: i32,
        sfa_k_major: bool,
        sfb_k_major: bool,
        blockwise_mainloop: bool,
        fast_accumulation: bool,
        promotion_k: i32,
        stages: i32,
    }

    /// Mirrors `moe_gemm::RouterArgs`.
    struct RouterParams {
        kind: RouterKind,
        tokens: i32,
        experts: i32,
        top_k: i32,
        n_group: i32,
        topk_group: i32,
        renormalize: i32,
        scaling: f32,
        logits: u64,
        bias: u64,
        ids: u64,
        weights: u64,
        status: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::SharedRoutingArgs`.
    struct SharedRoutingParams {
        tokens: i32,
        top_k: i32,
        shared: i32,
        first_shared: i32,
        ids: u64,
        weights: u64,
        shared_weights: u64,
        ids_out: u64,
        weights_out: u64,
        stream: u64,
    }

    /// Mirrors `moe_gemm::LayoutArgs`.
    struct LayoutParams {
        kind: LayoutKind,
        rows: i32,
        experts: i32,
        local_experts: i32,
        block_m: i32,
        max_m: i32,
        capacity: i64,
        topk_ids: u64,
        expert_map: u64,
        counts: u64,
        offsets: u64,
        sorted_ids: u64,
        expert_ids: u64,
        block_ready: u64,
        m_indices: u64,
        positions: u64,
        total: u64,
        scratch: u64,
        status: u64,
        stream: u64,
    }

    unsafe extern "C++" {
        include!("moe-gemm/cpp/bridge/bridge.h");

        #[namespace = "moe_gemm"]
        type DType;
        #[namespace = "moe_gemm"]
        type TileConfig;
        #[namespace = "moe_gemm"]
        type Fp8TileConfig;
        #[namespace = "moe_gemm"]
        type Sm100TileConfig;
        #[namespace = "moe_gemm"]
        type StatusCode;
        #[namespace = "moe_gemm"]
        type GroupMode;
        #[namespace = "moe_gemm"]
        type RouterKind;
        #[namespace = "moe_gemm"]
        type LayoutKind;
        #[namespace = "moe_gemm"]
        type GateUp;
        #[namespace = "moe_gemm"]
        type Activation;
        #[namespace = "moe_gemm"]
        type FusedTile;
        #[namespace = "moe_gemm"]
        type FusedMode;
        #[namespace = "moe_gemm"]
        type QuantSource;

        fn grouped_gemm_sm90_built(dtype: DType, config: TileConfig) -> bool;
        fn grouped_gemm_sm90_workspace(
            dtype: DType,
            config: TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        /// # Safety
        /// Every address in `params` must be a live device allocation of the size the params imply, on the
        /// device and stream given, and stay alive until the queued work completes.
        unsafe fn grouped_gemm_sm90_run(params: &GroupedGemmParams) -> LaunchStatus;
        fn grouped_gemm_sm90_fp8_built(config: Fp8TileConfig) -> bool;
        fn grouped_gemm_sm90_fp8_workspace(
            config: Fp8TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        /// Compile-time facts of `config` (NotBuilt and `facts` untouched when it was not compiled).
        fn grouped_gemm_sm90_fp8_facts(config: Fp8TileConfig, facts: &mut Fp8KernelFacts) -> LaunchStatus;
        /// The CUTLASS kernel schedule's type name of `config` ("" when not built).
        fn grouped_gemm_sm90_fp8_schedule(config: Fp8TileConfig) -> String;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`, with the operands `GroupedGemmFp8Args` documents (e4m3 A and B, f32
        /// scales, bf16 D).
        unsafe fn grouped_gemm_sm90_fp8_run(params: &GroupedGemmFp8Params) -> LaunchStatus;
        fn grouped_gemm_sm100_built(dtype: DType, config: Sm100TileConfig) -> bool;
        fn grouped_gemm_sm100_workspace(
            dtype: DType,
            config: Sm100TileConfig,
            groups: i32,
            sm_count: i32,
            bytes: &mut u64,
        ) -> LaunchStatus;
        /// Compile-time facts of (`dtype`, `config`) (NotBuilt and `facts` untouched when it was not compiled).
        fn grouped_gemm_sm100_facts(
            dtype: DType,
            config: Sm100TileConfig,
            facts: &mut Sm100KernelFacts,
        ) -> LaunchStatus;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`: every address a live device allocation of the size the params imply,
        /// on the device and stream given, alive until the queued work completes.
        unsafe fn grouped_gemm_sm100_run(params: &GroupedGemmSm100Params) -> LaunchStatus;
        fn cudart_version() -> i32;
        /// `cudaGetErrorName` of a cudaError_t (no device needed).
        fn cuda_error_name(code: i32) -> String;
        /// # Safety
        /// `stream` is a live stream of the current context.
        unsafe fn spin(ns: u64, stream: u64) -> i32;
        /// # Safety
        /// `ptr` holds `bytes` (a multiple of 16) and `sink` `blocks` u32, live on `stream`.
        unsafe fn read_sweep(ptr: u64, bytes: u64, sink: u64, blocks: i32, stream: u64) -> i32;

        /// # Safety
        /// As for `grouped_gemm_sm90_run`: live device buffers of the sizes the params imply, on `stream`.
        unsafe fn route(params: &RouterParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `SharedRoutingArgs` documents, live on `stream`.
        unsafe fn extend_routing(params: &SharedRoutingParams) -> LaunchStatus;
        /// # Safety
        /// As for `grouped_gemm_sm90_run`.
        unsafe fn build_layout(params: &LayoutParams) -> LaunchStatus;
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
        ) -> LaunchStatus;
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
        ) -> LaunchStatus;
        /// # Safety
        /// `d1` [rows, 2I or I], `h` [rows, I], `row_experts` [rows], `bias` [experts, 2I or I] or 0, `total`
        /// one int32 or 0; live on `stream`.
        unsafe fn activate(params: &ActivationParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `DecodeArgs` documents, live on `stream`.
        unsafe fn decode_layer(params: &DecodeParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `DecodeFp8Args` documents (`cpp/moe_ops/decode_fp8.h`), live on `stream`.
        unsafe fn decode_layer_fp8(params: &DecodeFp8Params) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `FusedGemmArgs` documents for its mode, live on `stream`.
        unsafe fn fused_moe_gemm(params: &FusedGemmParams) -> LaunchStatus;
        /// Opts the fused kernel of (`dtype`, `tile`) into its dynamic shared memory on the current device.
        fn fused_moe_prepare(dtype: DType, tile: FusedTile) -> LaunchStatus;
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
        ) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `QuantArgs` documents for its source (`cpp/moe_ops/quant.h`), live on `stream`.
        unsafe fn quantize_fp8(params: &QuantParams) -> LaunchStatus;
        /// # Safety
        /// Buffers of the sizes `WeightQuantArgs` documents (`cpp/moe_ops/quant.h`), live on `stream`.
        unsafe fn quantize_weights_fp8(params: &WeightQuantParams) -> LaunchStatus;
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
        ) -> LaunchStatus;
    }
}
