//! The cxx bridge: the only declaration of the C++ surface (`cpp/bridge.h`, `cpp/launch.h`).
//! Everything here is crate-private; `super` wraps it in safe, validated calls.

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
    enum StatusCode {
        Ok = 0,
        NotBuilt = 1,
        WorkspaceTooSmall = 2,
        CutlassCannotImplement = 3,
        CutlassInitialize = 4,
        CutlassRun = 5,
        Cuda = 6,
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
        groups: i32,
        n: i32,
        k: i32,
        max_rows: i64,
        a: u64,
        b: u64,
        d: u64,
        offsets: u64,
        workspace: u64,
        workspace_bytes: u64,
        status: u64,
        device: i32,
        sm_count: i32,
        stream: u64,
    }

    unsafe extern "C++" {
        include!("moe-gemm/cpp/bridge.h");

        #[namespace = "moe_gemm"]
        type DType;
        #[namespace = "moe_gemm"]
        type TileConfig;
        #[namespace = "moe_gemm"]
        type StatusCode;

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
        fn cudart_version() -> i32;
    }
}
