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
    for c in moe_gemm::TileConfig::ALL {
        assert!(text.contains(c.name()), "{} missing:\n{text}", c.name());
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
