//! CPU tests of the FP8 blockwise grouped GEMM's host side: plan-time validation naming each constraint, the
//! configurations and their compiled facts (two-level accumulation, never FastAccum), the heuristic, and the
//! workspace query. No GPU needed: plans are made for a described device.

use moe_gemm::device::Arch;
use moe_gemm::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};
use moe_gemm::*;

fn h200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA H200", (9, 0), 132)
}

fn invalid(r: Result<GroupedGemmFp8Shape>) -> String {
    match r {
        Err(Error::InvalidProblem(msg)) => msg,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

#[test]
fn k_must_be_a_multiple_of_16_for_tma() {
    let msg = invalid(GroupedGemmFp8Shape::new(8, 4096, 7160, 1024));
    assert!(msg.contains("K = 7160") && msg.contains("multiple of 16") && msg.contains("TMA"), "{msg}");
    // A partial last 128-block of K is allowed.
    assert_eq!(GroupedGemmFp8Shape::new(8, 4096, 912, 1024).unwrap().scale_grid(), (32, 8));
}

#[test]
fn n_must_be_whole_weight_scale_blocks() {
    for n in [200, 4095, 64] {
        let msg = invalid(GroupedGemmFp8Shape::new(8, n, 7168, 1024));
        assert!(msg.contains(&format!("N = {n}")) && msg.contains("multiple of 128") && msg.contains("scale"), "{msg}");
    }
}

#[test]
fn zero_and_oversized_extents_are_rejected() {
    assert!(invalid(GroupedGemmFp8Shape::new(0, 128, 128, 8)).contains("groups = 0"));
    assert!(invalid(GroupedGemmFp8Shape::new(70_000, 128, 128, 8)).contains("groups = 70000"));
    assert!(invalid(GroupedGemmFp8Shape::new(4, 0, 128, 8)).contains("N = 0"));
    assert!(invalid(GroupedGemmFp8Shape::new(4, 128, 0, 8)).contains("K = 0"));
    assert!(invalid(GroupedGemmFp8Shape::new(4, 128, 128, 1 << 31)).contains("max_rows"));
    assert!(invalid(GroupedGemmFp8Shape::new(4, 1 << 32, 128, 8)).contains("i32::MAX"));
    assert!(invalid(GroupedGemmFp8Shape::new(65536, 1 << 30, 1 << 30, 8)).contains("address space"));
}

#[test]
fn deepseek_shapes_are_valid() {
    // w13 and w2 of DeepSeek-V3 (256 routed experts, H 7168, I 2048).
    for (n, k) in [(4096, 7168), (7168, 2048)] {
        let s = GroupedGemmFp8Shape::new(256, n, k, 32768).unwrap();
        assert_eq!((s.groups(), s.n(), s.k(), s.max_rows()), (256, n, k, 32768));
        assert_eq!(s.scale_grid(), (n / 128, k / 128));
    }
}

#[test]
fn non_sm90_devices_are_refused() {
    let shape = GroupedGemmFp8Shape::new(8, 256, 256, 64).unwrap();
    for (major, minor, name) in [(8, 0, "NVIDIA A100"), (10, 0, "NVIDIA B200")] {
        let mut dev = h200();
        dev.name = name.into();
        dev.compute_capability = (major, minor);
        dev.arch = Arch::from_compute_capability(major, minor);
        let err = GroupedGemmFp8::for_device(dev, shape, Default::default()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::UnsupportedArch { .. }), "{err:?}");
        assert!(msg.contains("sm_90a") && msg.contains(name) && msg.contains("grouped_gemm_sm90_fp8"), "{msg}");
    }
}

#[test]
fn every_config_is_built_and_plans() {
    let shape = GroupedGemmFp8Shape::new(256, 4096, 7168, 8192).unwrap();
    for c in Fp8TileConfig::ALL {
        assert!(c.is_built(), "{c} was not compiled");
        let plan =
            GroupedGemmFp8::for_device(h200(), shape, GroupedGemmFp8Options { config: Some(c), ..Default::default() })
                .unwrap();
        assert_eq!(plan.config(), c);
        // The CUTLASS kernels' per-group arrays live in the workspace; the swap-AB kernel reads the offsets itself.
        assert_eq!(plan.workspace_bytes() == 0, c == Fp8TileConfig::SwapAb16, "{c}");
        assert_eq!(plan.flops(10), 2.0 * 10.0 * 4096.0 * 7168.0);
    }
}

#[test]
fn workspace_grows_with_groups() {
    // A CUTLASS configuration (the swap-AB one needs no workspace at any G).
    let opts = GroupedGemmFp8Options { config: Some(Fp8TileConfig::Pingpong64x128x128), ..Default::default() };
    let plan = |g| GroupedGemmFp8::for_device(h200(), GroupedGemmFp8Shape::new(g, 256, 256, 64).unwrap(), opts);
    let (small, big) = (plan(8).unwrap().workspace_bytes(), plan(256).unwrap().workspace_bytes());
    assert!(big > small, "{small} {big}");
}

/// What was compiled is the two-level blockwise kernel of DeepSeek's recipe, read from the CUTLASS types (and
/// stated by the swap-AB kernel): never a FastAccum schedule, a promotion every 128 of K (= TileK), 1x128 /
/// 128x128 K-major scales.
#[test]
fn compiled_kernels_are_blockwise_and_never_fast_accumulation() {
    for c in Fp8TileConfig::ALL {
        let f = c.facts().unwrap();
        assert!(f.schedule.contains("FP8Blockwise") && !f.schedule.contains("FastAccum"), "{c}: {}", f.schedule);
        let (prefix, expected_schedule) = match c.schedule() {
            kernels::Schedule::Cooperative => ("KernelPtrArrayTmaWarpSpecialized", "Cooperative"),
            kernels::Schedule::Pingpong => ("KernelPtrArrayTmaWarpSpecialized", "Pingpong"),
            kernels::Schedule::SwapAb => ("SwapAbMmaSync", "SwapAb"),
        };
        assert!(f.schedule.starts_with(prefix), "{c}: {}", f.schedule);
        assert!(f.schedule.contains(expected_schedule), "{c}: {}", f.schedule);
        assert!(f.two_level_accumulation && !f.fast_accumulation, "{c}: {f:?}");
        assert_eq!(f.promotion_k, 128, "{c}");
        assert_eq!(f.tile, c.tile(), "{c}: the Rust enum and the compiled tile disagree");
        assert_eq!(f.tile.2, f.promotion_k, "{c}: TileK = the scale block of K");
        assert_eq!((f.scale_block_a, f.scale_block_b), ((1, 128), (128, 128)), "{c}");
        assert_eq!(f.scales_k_major, (true, true), "{c}");
        assert!(f.stages >= 2, "{c}: {} stages", f.stages);
    }
}

/// Whatever the heuristic picks, for decode and prefill of DeepSeek-V3 and small models, is one of those
/// blockwise kernels: the blockwise launch never reaches a FastAccum schedule.
#[test]
fn heuristic_picks_decode_tiles_for_small_groups_and_never_fast_accumulation() {
    assert_eq!(Fp8TileConfig::heuristic(256, 8 * 8), Fp8TileConfig::SwapAb16);
    assert_eq!(Fp8TileConfig::heuristic(256, 256 * 2), Fp8TileConfig::SwapAb16);
    assert_eq!(Fp8TileConfig::heuristic(256, 256 * 2 + 1), Fp8TileConfig::Pingpong64x128x128);
    assert_eq!(Fp8TileConfig::heuristic(256, 256 * 64), Fp8TileConfig::Pingpong64x128x128);
    assert_eq!(Fp8TileConfig::heuristic(256, 256 * 65), Fp8TileConfig::Cooperative128x128x128);
    assert_eq!(Fp8TileConfig::heuristic(8, 8192), Fp8TileConfig::Cooperative128x128x128);
    assert_eq!(Fp8TileConfig::heuristic(0, 0), Fp8TileConfig::SwapAb16);
    for groups in [1usize, 8, 64, 256] {
        for rows in [0usize, 1, 63, 64, 65, 512, 4096, 65536] {
            let shape = GroupedGemmFp8Shape::new(groups, 4096, 7168, rows).unwrap();
            let plan = GroupedGemmFp8::for_device(h200(), shape, Default::default()).unwrap();
            let f = plan.config().facts().unwrap();
            assert!(f.two_level_accumulation && !f.fast_accumulation, "G {groups} rows {rows}: {f:?}");
        }
    }
}

#[test]
fn config_names_round_trip() {
    for c in Fp8TileConfig::ALL {
        assert_eq!(Fp8TileConfig::from_name(c.name()), Some(c));
        assert_eq!(c.to_string(), c.name());
        assert_eq!(c.cluster(), (1, 1));
    }
}
