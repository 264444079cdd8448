//! CPU tests of every host-side constraint: each error names what was violated. No GPU needed: plans can be
//! made for a described device, and the workspace size is a host computation.

use moe_gemm::device::Arch;
use moe_gemm::dtype::DType;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};
use moe_gemm::kernels::TileConfig;
use moe_gemm::layouts::{offsets_from_sizes, sizes_from_offsets};
use moe_gemm::status::{bits as error_bits, describe as describe_error_word};
use moe_gemm::*;

fn h200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA H200", (9, 0), 132)
}

fn invalid(r: Result<GroupedGemmShape>) -> String {
    match r {
        Err(Error::InvalidProblem(msg)) => msg,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

#[test]
fn k_not_multiple_of_8_names_tma_alignment() {
    let msg = invalid(GroupedGemmShape::new(8, 4096, 4100, 1024));
    assert!(msg.contains("K = 4100") && msg.contains("multiple of 8") && msg.contains("TMA"), "{msg}");
}

#[test]
fn n_not_multiple_of_8_is_rejected() {
    let msg = invalid(GroupedGemmShape::new(8, 4090, 4096, 1024));
    assert!(msg.contains("N = 4090") && msg.contains("multiple of 8"), "{msg}");
}

#[test]
fn zero_extents_are_rejected() {
    assert!(invalid(GroupedGemmShape::new(0, 64, 64, 8)).contains("groups = 0"));
    assert!(invalid(GroupedGemmShape::new(4, 0, 64, 8)).contains("N = 0"));
    assert!(invalid(GroupedGemmShape::new(4, 64, 0, 8)).contains("K = 0"));
}

#[test]
fn oversized_extents_are_rejected() {
    assert!(invalid(GroupedGemmShape::new(70_000, 64, 64, 8)).contains("groups = 70000"));
    assert!(invalid(GroupedGemmShape::new(4, 64, 64, 1 << 31)).contains("max_rows"));
    assert!(invalid(GroupedGemmShape::new(4, 1 << 32, 64, 8)).contains("i32::MAX"));
}

#[test]
fn valid_shape_keeps_its_extents_and_zero_rows_is_allowed() {
    let s = GroupedGemmShape::new(256, 4096, 7168, 0).unwrap();
    assert_eq!((s.groups(), s.n(), s.k(), s.max_rows()), (256, 4096, 7168, 0));
}

#[test]
fn non_sm90_device_is_an_error_naming_both_archs() {
    let mut dev = h200();
    dev.name = "NVIDIA A100".into();
    dev.compute_capability = (8, 0);
    dev.arch = Arch::from_compute_capability(8, 0);
    let shape = GroupedGemmShape::new(8, 256, 256, 64).unwrap();
    let err = GroupedGemm::<half::bf16>::for_device(dev, shape, Default::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnsupportedArch { major: 8, minor: 0, .. }), "{err:?}");
    assert!(msg.contains("sm_90a") && msg.contains("8.0") && msg.contains("A100"), "{msg}");
}

#[test]
fn blackwell_is_not_mistaken_for_hopper() {
    // sm_90a SASS does not run on 10.0: the plan must refuse, not launch.
    let mut dev = h200();
    dev.compute_capability = (10, 0);
    dev.arch = Arch::from_compute_capability(10, 0);
    let shape = GroupedGemmShape::new(8, 256, 256, 64).unwrap();
    assert!(matches!(
        GroupedGemm::<half::bf16>::for_device(dev, shape, Default::default()),
        Err(Error::UnsupportedArch { major: 10, .. })
    ));
    assert_eq!(Arch::from_compute_capability(9, 0), Some(Arch::Sm90));
    assert_eq!(Arch::from_compute_capability(8, 9), None);
}

#[test]
fn plans_for_sm90_every_dtype_and_config() {
    for config in TileConfig::ALL {
        let shape = GroupedGemmShape::new(256, 4096, 7168, 32768).unwrap();
        let opts = GroupedGemmOptions { config: Some(config), ..Default::default() };
        let p = GroupedGemm::<half::bf16>::for_device(h200(), shape, opts).unwrap();
        assert_eq!(p.config(), config);
        // Header + 7 per-group arrays + CUTLASS's per-SM tensor maps: more than the arrays alone.
        assert!(p.workspace_bytes() > 256 + 256 * 12, "{config}: {}", p.workspace_bytes());
        GroupedGemm::<half::f16>::for_device(h200(), shape, opts).unwrap();
    }
}

#[test]
fn workspace_grows_with_groups() {
    let plan = |g| {
        let shape = GroupedGemmShape::new(g, 256, 256, 1024).unwrap();
        GroupedGemm::<half::bf16>::for_device(h200(), shape, Default::default()).unwrap().workspace_bytes()
    };
    assert!(plan(1024) > plan(8));
}

#[test]
fn heuristic_follows_the_measured_regimes() {
    use TileConfig::*;
    // DeepSeek-V3 w13 (E 256, N 4096): decode, balanced prefill, large prefill.
    assert_eq!(TileConfig::heuristic(256, 4096, 8, 132), Pingpong64x128x64);
    assert_eq!(TileConfig::heuristic(256, 4096, 4096 * 8, 132), Cooperative128x256x64);
    assert_eq!(TileConfig::heuristic(8, 28672, 16384 * 2, 132), Cooperative128x256x64);
    // Mixtral w2 at T=1: two experts x 32 N tiles <= half of 132 SMs -> 64-wide N tiles; Qwen3 w13 at T=1
    // (8 experts x 12 tiles) keeps 128-wide ones.
    assert_eq!(TileConfig::heuristic(8, 4096, 2, 132), Pingpong64x64x128);
    assert_eq!(TileConfig::heuristic(128, 1536, 8, 132), Pingpong64x128x64);
    for c in TileConfig::ALL {
        assert_eq!(TileConfig::from_name(c.name()), Some(c));
    }
}

#[test]
fn offsets_round_trip_with_sizes() {
    let sizes = [0, 1, 7, 63, 64, 65, 127, 128, 129, 0];
    let offsets = offsets_from_sizes(&sizes).unwrap();
    assert_eq!(offsets.len(), sizes.len() + 1);
    assert_eq!(offsets[0], 0);
    assert_eq!(*offsets.last().unwrap() as usize, sizes.iter().sum::<usize>());
    assert_eq!(sizes_from_offsets(&offsets, 584).unwrap(), sizes);
}

#[test]
fn offsets_overflowing_int32_are_rejected() {
    let err = offsets_from_sizes(&[1 << 30, 1 << 30, 1 << 30]).unwrap_err();
    assert!(err.to_string().contains("overflow int32"), "{err}");
}

#[test]
fn offsets_contract_violations_are_named() {
    let msg = |o: &[i32], max| sizes_from_offsets(o, max).unwrap_err().to_string();
    assert!(msg(&[0], 10).contains("G + 1 >= 2"));
    assert!(msg(&[1, 4], 10).contains("offsets[0] = 1"));
    assert!(msg(&[0, 4, 3], 10).contains("offsets[2] = 3 < offsets[1] = 4"));
    assert!(msg(&[0, 4, 11], 10).contains("exceeds max_rows = 10"));
}

#[test]
fn device_error_word_is_described_bit_by_bit() {
    assert_eq!(describe_error_word(0), "");
    let all = describe_error_word(
        error_bits::OFFSETS_NOT_ZERO_BASED | error_bits::OFFSETS_NOT_MONOTONE | error_bits::OFFSETS_OUT_OF_RANGE,
    );
    assert!(all.contains("offsets[0] != 0") && all.contains("decrease") && all.contains("max_rows"), "{all}");
    assert!(describe_error_word(1 << 20).contains("unknown"));
}

#[test]
fn dtype_facts() {
    assert_eq!(DType::BF16.tma_alignment(), 8);
    assert_eq!(DType::F16.size_bytes(), 2);
    assert_eq!(format!("{:<5}|", DType::BF16), "bf16 |");
}

/// Auto's choices at the points of the H200 suite where the measured best backend was clear (2026-11-29).
#[test]
fn auto_policy_matches_the_measured_suite() {
    use moe_gemm::layer::auto_backend;
    use moe_gemm::Backend::*;
    // (E, k, H, I, T, the pick): measured best among Batched, Fused, Grouped under uniform routing in
    // benches/results/h200-2026-11-29-layer-suite, except where noted (near-ties go to the layout backends, which
    // skewed routing favours).
    let cases = [
        (8, 2, 4096, 14336, 1, Batched),      // 191 vs Fused 259, Grouped 283 us
        (8, 2, 4096, 14336, 2, Batched),      // 342 vs 413, 427
        (8, 2, 4096, 14336, 4, Fused),        // 586 vs Grouped 629, Batched 657
        (8, 2, 4096, 14336, 64, Fused),       // 748 vs Grouped 768
        (8, 2, 4096, 14336, 256, Grouped),    // 813 vs Fused 1034 (64-row tile)
        (128, 8, 2048, 768, 1, Batched),      // 43 vs Fused 69
        (128, 8, 2048, 768, 8, Batched),      // 152 vs Fused 178, Grouped 195
        (128, 8, 2048, 768, 16, Fused),       // 272 vs Grouped 284, Batched 286
        (128, 8, 2048, 768, 64, Fused),       // 355 vs Grouped 365
        (128, 8, 2048, 768, 4096, Grouped),   // 781 vs Fused 908
        (128, 8, 4096, 1536, 4, Batched),     // 294 vs 319, 345
        (128, 8, 4096, 1536, 8, Fused),       // 522 vs Grouped 536, Batched 561
        (256, 8, 7168, 2048, 1, Batched),     // 178 vs 232, 269
        (256, 8, 7168, 2048, 2, Batched),     // 343 vs 405, 435
        (256, 8, 7168, 2048, 4, Fused),       // near-tie: Batched 657, Fused 696 (zipf: Fused 576, Batched 654)
        (256, 8, 7168, 2048, 8, Fused),       // 1197 vs Grouped 1202, Batched 1263
        (256, 8, 7168, 2048, 64, Grouped),    // 4649 vs Fused 4784
        (128, 4, 2880, 2880, 256, Grouped),   // 1589 vs Fused 1634
        (128, 8, 4096, 1536, 32, Grouped),    // 1045 vs Fused 1052
        (256, 8, 7168, 2048, 16384, Grouped), // 22147 vs Fused 28565 (batched row limit)
        (128, 4, 2880, 2880, 1, Batched),     // 89 vs 96, 124
        (128, 4, 2880, 2880, 4, Batched),     // 228 vs Fused 228
        (128, 4, 2880, 2880, 8, Fused),       // 391 vs Grouped 402, Batched 412 (zipf: 237 vs 404)
    ];
    for (e, k, h, i, t, want) in cases {
        assert_eq!(auto_backend(e, k, h, i, t), want, "E={e} k={k} H={h} I={i} T={t}");
    }
}

#[test]
fn fp8_auto_policy_matches_the_measured_decode_points() {
    use moe_gemm::layer::auto_backend_fp8;
    use moe_gemm::Backend::*;
    // (E, k, H, I, T, the pick): the faster of FP8 Batched and Grouped under uniform routing, the rows-in-x runs of
    // benches/results/h200-2026-12-06-fp8-decode-grid-order/compare.txt (lower median µs, Batched vs Grouped).
    let cases = [
        (256, 8, 7168, 2048, 1, Batched),    // 133.1 vs 143.6
        (256, 8, 7168, 2048, 4, Grouped),    // 420.2 vs 389.3
        (256, 8, 7168, 2048, 8, Grouped),    // 766.0 vs 627.3
        (128, 8, 4096, 1536, 1, Batched),    // 67.1 vs 85.4
        (128, 8, 4096, 1536, 2, Batched),    // 112.2 vs 124.2
        (128, 8, 4096, 1536, 4, Grouped),    // 189.3 vs 182.0
        (8, 2, 4096, 14336, 1, Batched),     // 130.1 vs 155.2
        (8, 2, 4096, 14336, 2, Batched),     // 226.7 vs 230.6
        (8, 2, 4096, 14336, 4, Grouped),     // 366.8 vs 338.1
        (128, 8, 2048, 768, 1, Batched),     // 28.0 vs 47.8
        (128, 8, 2048, 768, 4, Batched),     // 60.5 vs 77.5
        (128, 8, 2048, 768, 8, Batched),     // 105.0 vs 105.0 (tie)
        (128, 8, 2048, 768, 16, Grouped),    // 182.3 vs 152.7
        (256, 8, 7168, 2048, 4096, Grouped), // past Batched's 4096 rows
    ];
    for (e, k, h, i, t, want) in cases {
        assert_eq!(auto_backend_fp8(e, k, h, i, t), want, "E={e} k={k} H={h} I={i} T={t}");
    }
    // The one measured miss: DeepSeek-V3 at T = 2 (Batched 237.9 vs Grouped 234.4) is predicted Batched.
    assert_eq!(auto_backend_fp8(256, 8, 7168, 2048, 2), Batched);
}

/// The fused backend's tile follows rows per active expert (thresholds measured on the H200: see
/// `FusedTile::for_rows`).
#[test]
fn fused_tile_follows_rows_per_expert() {
    use moe_gemm::kernels::fused::FusedTile::{self, *};
    let cases: [(usize, usize, FusedTile, FusedTile); 14] = [
        (2, 8, Decode16, M64N128K64),            // T = 1 on Mixtral
        (256, 256, Decode16, M64N128K64),        // DeepSeek-V3 T = 32: 1 row per expert
        (512, 256, DecodeMerged, M64N128K64),    // DeepSeek-V3 T = 64: 2 rows per expert
        (1024, 128, DecodeMerged, M64N128K64),   // 8 rows per expert
        (32, 8, Decode16, M64N128K64),           // Mixtral T = 16: 4 rows per expert, 8 experts
        (64, 8, DecodeMerged, M64N128K64),       // Mixtral T = 32: 8 rows per expert
        (128, 8, DecodeMerged, M64N128K64),      // Mixtral T = 64: 16 rows per expert
        (2048, 128, DecodeMerged, M64N128K64),   // Qwen3 T = 256: 16 rows per expert
        (136, 8, M64N128K64, M64N128K64),        // 17 rows per expert
        (4096, 128, M64N128K64, M64N128K64),     // 32 rows per expert
        (8192, 128, M128N256K64, M128N256K64),   // 64 rows per expert
        (512, 8, M128N256K64, M128N256K64),      // Mixtral T = 256
        (131072, 256, M128N256K64, M128N256K64), // DeepSeek-V3 prefill
        (63, 1, M64N128K64, M64N128K64),
    ];
    for (rows, experts, want, want_fp8) in cases {
        assert_eq!(FusedTile::for_rows(rows, experts), want, "rows {rows}, experts {experts}");
        assert_eq!(FusedTile::for_rows_fp8(rows, experts), want_fp8, "FP8: rows {rows}, experts {experts}");
        assert!(want_fp8.has_fp8() && want_fp8.fp8_tile().is_some());
    }
    let bms: Vec<usize> = FusedTile::ALL.iter().map(|t| t.block_m()).collect();
    assert_eq!(bms, [16, 32, 16, 64, 128]);
    assert!(!Decode16.has_fp8() && !Decode32.has_fp8() && Decode16.fp8_tile().is_none());
}
