//! The CLI on a machine without a GPU: clean messages and exit code 0, never a panic.

use std::process::Command;

fn cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-gemm")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn info_lists_toolchain_and_every_kernel() {
    let (ok, text) = cli(&["info"]);
    assert!(ok, "{text}");
    assert!(text.contains("CUTLASS") && text.contains("sm_90a"), "{text}");
    for c in moe_gemm::kernels::TileConfig::ALL {
        assert!(text.contains(c.name()), "{} missing:\n{text}", c.name());
    }
    for c in moe_gemm::kernels::grouped_fp8_sm100::Fp8Sm100Config::ALL {
        let line = text.lines().find(|l| l.contains(c.name())).unwrap_or_else(|| panic!("{c} missing:\n{text}"));
        assert!(line.contains("built,") && line.contains("promoted every 128 of K"), "{line}");
        assert!(line.contains(&format!("{}SM UMMA", c.sms_per_mma())), "{line}");
    }
    for c in moe_gemm::kernels::grouped_mx::MxConfig::ALL {
        let line =
            text.lines().find(|l| l.contains(c.name())).unwrap_or_else(|| panic!("{} missing:\n{text}", c.name()));
        let (cm, cn) = c.cluster();
        assert!(line.contains("built (") && line.contains(&format!("cluster {cm}x{cn}x1")), "{line}");
    }
    if !moe_gemm::device::driver_present() {
        assert!(text.contains("no CUDA device"), "{text}");
    }
}

#[test]
fn bench_without_gpu_says_so() {
    if moe_gemm::device::driver_present() {
        return; // measured on the GPU host instead
    }
    let (ok, text) = cli(&["bench", "--models", "qwen3-30b-a3b", "--tokens", "1"]);
    assert!(ok, "{text}");
    assert!(text.contains("no CUDA device"), "{text}");
}

/// `bench --dtype fp8`: the flag parses (bf16 or fp8), the FP8 mode's own checks run before any device is
/// touched, and without a GPU it says so and exits 0.
#[test]
fn bench_dtype_fp8_parses_and_fails_cleanly_without_a_gpu() {
    let (ok, text) = cli(&["bench", "--help"]);
    assert!(ok && text.contains("--dtype") && text.contains("fp8"), "{text}");
    let (ok, text) = cli(&["bench", "--dtype", "fp4"]);
    assert!(!ok && text.contains("possible values") && text.contains("bf16") && text.contains("fp8"), "{text}");
    let (ok, text) = cli(&["bench", "--dtype", "fp8", "--config", "coop-128x128x64"]);
    assert!(!ok && text.contains("fp8-coop-128x128x128") && text.contains("fp8-pingpong-64x128x128"), "{text}");
    if moe_gemm::device::driver_present() {
        return; // measured on the GPU host instead
    }
    for args in [
        &["bench", "--dtype", "fp8"][..],
        &["bench", "--dtype", "fp8", "--config", "fp8-pingpong-64x128x128", "--peer", "none", "--reps", "5"],
        &["bench", "--dtype", "fp8", "--config", "all", "--no-flush", "--no-ceilings"],
    ] {
        let (ok, text) = cli(args);
        assert!(ok && text.contains("no CUDA device"), "{args:?}: {text}");
    }
}

/// `bench --layer --dtype fp8`: the FP8 layer's backend list is checked before any device is touched (at least
/// one of batched, grouped, contiguous, masked, fused, auto; names known), and a valid run without a GPU says so
/// and exits 0.
#[test]
fn bench_layer_fp8_checks_its_backends_and_fails_cleanly_without_a_gpu() {
    let (ok, text) = cli(&["bench", "--layer", "--dtype", "fp8", "--backends", "eager"]);
    assert!(
        !ok && text.contains("--backends eager") && text.contains("batched, grouped, contiguous, masked, fused"),
        "{text}"
    );
    let (ok, text) = cli(&["bench", "--layer", "--dtype", "fp8", "--backends", "grouped,tiled"]);
    assert!(!ok && text.contains("unknown backend \"tiled\""), "{text}");
    let (ok, text) = cli(&["bench", "--help"]);
    assert!(ok && text.contains("bf16 layer's Auto"), "{text}");
    if moe_gemm::device::driver_present() {
        return; // measured on the GPU host instead
    }
    for args in [
        &["bench", "--layer", "--dtype", "fp8"][..],
        &["bench", "--layer", "--suite", "--dtype", "fp8"],
        &["bench", "--layer", "--dtype", "fp8", "--models", "gpt-oss-120b", "--layer-tokens", "1,64"],
        &["bench", "--layer", "--dtype", "fp8", "--backends", "auto", "--routing", "uniform,zipf", "--peer", "none"],
        &["bench", "--layer", "--dtype", "fp8", "--backends", "batched,grouped", "--csv", "/dev/null", "--no-ceilings"],
        &["bench", "--layer", "--dtype", "bf16", "--backends", "batched,fused"],
    ] {
        let (ok, text) = cli(args);
        assert!(ok && text.contains("no CUDA device"), "{args:?}: {text}");
    }
}

/// `tune`: its arguments are checked before any device is touched; a valid run without a GPU says so and exits 0.
#[test]
fn tune_checks_its_arguments_and_fails_cleanly_without_a_gpu() {
    let (ok, text) = cli(&["tune", "--model", "nope"]);
    assert!(!ok && text.contains("--model nope: not a suite model") && text.contains("deepseek-v3"), "{text}");
    let (ok, text) = cli(&["tune", "--model", "mixtral-8x7b", "--tokens", "1,0"]);
    assert!(!ok && text.contains("at least 1"), "{text}");
    let (ok, text) = cli(&["tune", "--model", "mixtral-8x7b", "--fp8-only"]);
    assert!(!ok && text.contains("--fp8-only with --dtype bf16"), "{text}");
    // bench's switch under it: a quantised --layer only.
    for args in [&["bench", "--layer", "--quant-only"][..], &["bench", "--dtype", "fp8", "--quant-only"]] {
        let (ok, text) = cli(args);
        assert!(!ok && text.contains("--quant-only") && text.contains("--dtype fp8, mxfp4 or fp8-channel"), "{text}");
    }
    let (ok, text) = cli(&["bench", "--layer", "--merge-configs"]);
    assert!(!ok && text.contains("--merge-configs") && text.contains("needs --write-configs DIR"), "{text}");
    let (ok, text) = cli(&["tune", "--help"]);
    assert!(ok && text.contains("--out") && text.contains("Token buckets") && text.contains("--fp8-only"), "{text}");
    if moe_gemm::device::driver_present() {
        return; // measured on the GPU host instead
    }
    let (ok, text) = cli(&["tune", "--model", "mixtral-8x7b", "--tokens", "1,64", "--out", "/tmp/moe-gemm-tune-test"]);
    assert!(ok && text.contains("no CUDA device"), "{text}");
    let args = ["tune", "--model", "mixtral-8x7b", "--tokens", "1", "--dtype", "fp8", "--fp8-only", "--out", "/tmp/t"];
    let (ok, text) = cli(&args);
    assert!(ok && text.contains("no CUDA device"), "{text}");
}

/// `moe-gemm plan --gpu-name`: the layer's Auto on that GPU, with the shipped tuned table's backends given room
/// (what `MoeLayer::new` allocates there), or the cost model where no table matches.
#[test]
fn plan_sizes_auto_with_the_shipped_table_of_a_named_gpu() {
    let (ok, h200) = cli(&["plan", "--model", "mixtral-8x7b", "--gpu-name", "NVIDIA H200"]);
    assert!(ok && h200.contains("Auto from the table shipped for NVIDIA H200"), "{h200}");
    // The table picks Contiguous at some prefill buckets (and, since the re-tune that named Fused tiles, Masked
    // nowhere): the plan gives room to exactly the backends the table names, not the cost model's set.
    assert!(h200.contains("backends {batched,grouped,contiguous,fused}"), "{h200}");
    let (ok, plain) = cli(&["plan", "--model", "mixtral-8x7b"]);
    assert!(ok && plain.contains("backends {batched,grouped,fused}") && !plain.contains("shipped"), "{plain}");
    let (ok, h100) = cli(&["plan", "--model", "mixtral-8x7b", "--gpu-name", "NVIDIA H100 80GB HBM3"]);
    let file = "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json";
    assert!(ok && h100.contains(&format!("Auto from the table shipped for NVIDIA H100 80GB HBM3: {file}")), "{h100}");
    let args = ["plan", "--model", "mixtral-8x7b", "--dtype", "fp8", "--gpu-name", "NVIDIA H100 80GB HBM3"];
    let (ok, fp8) = cli(&args);
    assert!(ok && fp8.contains("dtype=fp8_w8a8,block_shape=[128, 128].json"), "{fp8}");
    let (ok, a100) = cli(&["plan", "--model", "mixtral-8x7b", "--gpu-name", "NVIDIA A100-SXM4-80GB"]);
    assert!(ok && a100.contains("no table shipped for NVIDIA A100-SXM4-80GB and dense weights"), "{a100}");
}

/// `moe-gemm plan --compute-capability`: the FP8 layer planned for a described B200 takes the SM100 blockwise GEMM
/// (and its workspace) under Grouped; a dense bf16 layer there takes the SM100 bf16 GEMM, Fused is refused there
/// naming the backend and both arches; 9.0 plans as the default does; a malformed capability is refused.
#[test]
fn plan_for_a_described_compute_capability() {
    let args = ["plan", "--model", "deepseek-v3", "--dtype", "fp8", "--sm-count", "148"];
    let (ok, b200) = cli(&[&args[..], &["--compute-capability", "10.0", "--gpu-name", "NVIDIA B200"]].concat());
    assert!(ok && b200.contains("layout backends' GEMM grouped_gemm_sm100_fp8_blockwise"), "{b200}");
    assert!(b200.contains("backends {grouped}") && b200.contains("GEMM workspace"), "{b200}");
    let (ok, h200) = cli(&[&args[..], &["--compute-capability", "9.0"]].concat());
    assert!(ok && h200.contains("layout backends' GEMM grouped_gemm_sm90_fp8_blockwise"), "{h200}");
    let (ok, default) = cli(&args);
    let body = |t: &str| t.lines().filter(|l| !l.contains("planned for")).collect::<Vec<_>>().join("\n");
    assert!(ok && body(&default) == body(&h200), "9.0 differs from the default plan:\n{default}\n---\n{h200}");
    let (ok, dense) = cli(&["plan", "--model", "mixtral-8x7b", "--compute-capability", "10.0"]);
    assert!(ok && dense.contains("layout backends' GEMM grouped_gemm_sm100\n"), "{dense}");
    assert!(dense.contains("backends {grouped}") && dense.contains("GEMM workspace"), "{dense}");
    let (ok, fused) = cli(&["plan", "--model", "mixtral-8x7b", "--compute-capability", "10.0", "--backends", "fused"]);
    assert!(!ok && fused.contains("needs an sm_90a GPU") && fused.contains("compute capability 10.0"), "{fused}");
    let (ok, bad) = cli(&["plan", "--model", "mixtral-8x7b", "--compute-capability", "10"]);
    assert!(!ok && bad.contains("expected MAJOR.MINOR"), "{bad}");
}

/// `moe-gemm plan --dtype mxfp4`: gpt-oss-120b's experts in four bits (the GEMMs' padded extents), the MX GEMM
/// of the arch (the portable kernel on SM90, CUTLASS's on SM100), Auto = Grouped, the MXFP8 rows in the scratch;
/// a backend without an MXFP4 form refused by name.
#[test]
fn plan_sizes_an_mxfp4_layer_per_arch() {
    let args = ["plan", "--model", "gpt-oss-120b", "--dtype", "mxfp4"];
    let (ok, h200) = cli(&[&args[..], &["--compute-capability", "9.0"]].concat());
    assert!(ok && h200.contains("layout backends' GEMM grouped_gemm_mx_portable (mxfp8 x mxfp4)"), "{h200}");
    assert!(h200.contains("backends {grouped}") && h200.contains("a mxfp8") && h200.contains("h mxfp8"), "{h200}");
    let (ok, b200) = cli(&[&args[..], &["--compute-capability", "10.0", "--sm-count", "148"]].concat());
    assert!(ok && b200.contains("grouped_gemm_sm100_mx (mxfp8 x mxfp4)") && b200.contains("GEMM workspace"), "{b200}");
    let (ok, fused) = cli(&[&args[..], &["--backends", "fused"]].concat());
    assert!(!ok && fused.contains("MXFP4 expert weights run the Grouped, Contiguous and Masked"), "{fused}");
}

/// `compare`: two runs of a base and one of a new binary, merged by the lower median, give the per-point ratios and
/// their geomean; a missing file or a table without the bench's columns is an error, not a panic.
#[test]
fn compare_reports_ratios_and_geomean_of_bench_tables() {
    let dir = std::env::temp_dir().join(format!("moe-gemm-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let head = "model,tokens,routing,backend,ran,auto,median_us,p10_us,p90_us,floor_us,x_floor,peer_us,x_peer,dtype,\
                bf16_auto_us,x_bf16";
    let table = |name: &str, t1: f64, t64: f64| {
        let path = dir.join(name);
        let text = format!(
            "{head}\nmixtral-8x7b,1,uniform,Auto,Batched,Batched,{t1},0,0,0,0,,,bf16,0,1\n\
             mixtral-8x7b,64,zipf,Auto,Fused,Fused,{t64},0,0,0,0,,,bf16,0,1\n"
        );
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().to_string()
    };
    let (a1, a2, b) = (table("a-1.csv", 200.0, 800.0), table("a-2.csv", 190.0, 810.0), table("b-1.csv", 190.0, 720.0));
    let (ok, text) = cli(&["compare", &format!("{a1},{a2}"), &b]);
    assert!(ok, "{text}");
    // Lower medians: A = 190 and 800; B/A = 1.000 and 0.900; geomean sqrt(0.9).
    assert!(text.contains("0.900") && text.contains("1.000"), "{text}");
    assert!(text.contains(&format!("geomean {:.4} over 2 points; 1 faster and 0 slower", 0.9f64.sqrt())), "{text}");
    let (ok, text) = cli(&["compare", &a1, &dir.join("none.csv").to_string_lossy()]);
    assert!(!ok && text.contains("cannot read"), "{text}");
    std::fs::write(dir.join("bad.csv"), "a,b\n1,2\n").unwrap();
    let (ok, text) = cli(&["compare", &a1, &dir.join("bad.csv").to_string_lossy()]);
    assert!(!ok && text.contains("no `model` column"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
