//! `moe-gemm info`.

use moe_gemm::device::KernelFamily;
use moe_gemm::dtype::DType;
use moe_gemm::kernels::grouped_fp8::Fp8TileConfig;
use moe_gemm::kernels::grouped_mx::MxConfig;
use moe_gemm::kernels::grouped_sm100::Sm100TileConfig;
use moe_gemm::kernels::TileConfig;
use moe_gemm::{build_info, device, DeviceInfo};

pub fn run() -> moe_gemm::Result<()> {
    println!("moe-gemm {}", env!("CARGO_PKG_VERSION"));
    println!("toolchain");
    println!("  nvcc      {} (CUDA {})", build_info::NVCC, build_info::NVCC_RELEASE);
    println!("  CUTLASS   {} ({})", build_info::CUTLASS_VERSION, build_info::CUTLASS_DIR);
    let v = build_info::cudart_version();
    println!("  cudart    {}.{} (static)", v / 1000, (v % 1000) / 10);
    println!("targets (per kernel family; SASS runs on its GPU only, PTX is JIT-compiled by newer drivers)");
    for f in KernelFamily::ALL {
        let ptx: Vec<String> = f.ptx_targets().iter().map(|t| format!("{t} (PTX)")).collect();
        let all: Vec<&str> = f.sass_targets().iter().copied().chain(ptx.iter().map(String::as_str)).collect();
        println!("  {:<24} {}", f.name(), all.join(", "));
    }
    println!("kernels");
    for dtype in [DType::BF16, DType::F16] {
        for c in TileConfig::ALL {
            let (m, n, k) = c.tile();
            let (cm, cn) = c.cluster();
            println!(
                "  grouped_gemm_sm90  {dtype:<4}  {:<22}  {:<11} tile {m}x{n}x{k}, cluster {cm}x{cn}x1  {}",
                c.name(),
                format!("{:?},", c.schedule()),
                if c.is_built(dtype) { "built" } else { "not built" }
            );
        }
    }
    for c in Fp8TileConfig::ALL {
        let (m, n, k) = c.tile();
        let (cm, cn) = c.cluster();
        let detail = match c.facts() {
            Ok(f) => format!("built, {} stages, promoted every {} of K", f.stages, f.promotion_k),
            Err(_) => "not built".into(),
        };
        println!(
            "  grouped_gemm_sm90  fp8   {:<23} {:<11} tile {m}x{n}x{k}, cluster {cm}x{cn}x1  e4m3 1x128/128x128 f32 scales -> bf16, {detail}",
            c.name(),
            format!("{:?},", c.schedule()),
        );
    }
    for c in Sm100TileConfig::ALL {
        let (m, n, k) = c.tile();
        let (cm, cn) = c.cluster();
        let detail = match c.facts(DType::BF16) {
            Ok(f) => format!("built, {} stages (compiled and SASS-checked; not yet run on hardware)", f.stages),
            Err(_) => "not built".into(),
        };
        println!(
            "  grouped_gemm_sm100 bf16  {:<22} 1SM UMMA,   tile {m}x{n}x{k}, cluster {cm}x{cn}x1  {detail}",
            c.name()
        );
    }
    for c in moe_gemm::kernels::grouped_fp8_sm100::Fp8Sm100Config::ALL {
        let (m, n, k) = c.tile();
        let (cm, cn) = c.cluster();
        let detail = match c.facts() {
            Ok(f) => format!(
                "built, {} stages, promoted every {} of K (compiled and SASS-checked; not yet run on hardware)",
                f.stages, f.promotion_k
            ),
            Err(_) => "not built".into(),
        };
        println!(
            "  grouped_gemm_sm100 fp8   {:<22} {}SM UMMA,   tile {m}x{n}x{k}, cluster {cm}x{cn}x1  e4m3 1x128/128x128 f32 scales -> bf16, {detail}",
            c.name(),
            c.sms_per_mma()
        );
    }
    for c in MxConfig::ALL {
        let (m, n, k) = c.tile();
        let (cm, cn) = c.cluster();
        let (a, b) = c.formats();
        let built =
            if c.is_built() { "built (compiled and SASS-checked; not yet run on hardware)" } else { "not built" };
        println!(
            "  grouped_gemm_sm100 mx    {:<22} {}SM UMMA,   tile {m}x{n}x{k}, cluster {cm}x{cn}x1  {a:?} x {b:?} -> bf16, {built}",
            c.name(),
            c.sms_per_mma()
        );
    }
    println!(
        "  routers           f32 logits  softmax top-k, top-k softmax, DeepSeek grouped sigmoid (E <= 1024, k <= 32)"
    );
    println!("  expert layouts    int32 ids   grouped, aligned (vLLM / DeepGEMM contiguous), masked; gather, combine");
    println!("  activation        bf16, f16   SwiGLU, gpt-oss clamped SwiGLU, SiLU; concatenated or interleaved");
    println!("  decode layer      bf16, f16   two streaming kernels (the Batched backend)");
    for t in moe_gemm::kernels::fused::FusedTile::ALL {
        let (m, n, k) = t.tile();
        if t.has_fp8() {
            println!(
                "  fused_moe_sm90    bf16, f16   {:<18} tile {m}x{n}x{k}, persistent, A gathered by cp.async, B by TMA",
                t.name()
            );
        } else {
            println!(
                "  decode (fused)    bf16, f16   {:<18} {m} positions x {n} weight rows x {k} per warp step, mma.sync, \
                 weights on M, per-warp cp.async ring",
                t.name()
            );
        }
    }
    println!("devices");
    if !device::driver_present() {
        println!("  no CUDA device: libcuda.so could not be loaded (no NVIDIA driver on this machine)");
        return Ok(());
    }
    let count = match cudarc::driver::CudaContext::device_count() {
        Ok(c) => c,
        Err(e) => {
            println!("  no CUDA device: the driver reports {e}");
            return Ok(());
        }
    };
    let driver = device::driver_version()?;
    println!("  driver supports CUDA {}.{}", driver / 1000, (driver % 1000) / 10);
    if count == 0 {
        println!("  no CUDA device: the driver found none");
    }
    for i in 0..count as usize {
        let ctx = device::open(i)?;
        let d = DeviceInfo::query(&ctx)?;
        let (maj, min) = d.compute_capability;
        let (free, total) = ctx.mem_get_info()?;
        let here = match d.arch {
            Some(arch) => {
                KernelFamily::ALL.iter().filter(|f| f.runs_on(arch)).map(|f| f.name()).collect::<Vec<_>>().join(", ")
            }
            None => "none (moe-gemm's kernels are built for SM90 and SM100: sm_90a, sm_100a, sm_90, sm_100)".into(),
        };
        println!(
            "  {i}: {}, compute capability {maj}.{min}, {} SMs, {} MiB L2, {:.1}/{:.1} GiB free, {} KiB smem/block; kernels here: {}",
            d.name,
            d.sm_count,
            d.l2_bytes >> 20,
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            d.max_smem_per_block_optin >> 10,
            here
        );
    }
    Ok(())
}
