//! The FP8 rowwise grouped GEMM on the host: what was compiled (read from the CUTLASS types), the plan-time
//! shape checks, the tile heuristic, and the reference's own checks. No GPU.

use moe_gemm::kernels::grouped_fp8_rowwise::*;
use moe_gemm::quant::{per_row_block, BlockFp8, BlockShape, ScaleFormat};
use moe_gemm::reference::scaled_fp8_rows;

#[test]
fn every_config_is_built_and_its_facts_say_how_it_accumulates() {
    for c in Fp8RowwiseConfig::ALL {
        assert!(c.is_built(), "{c}");
        assert_eq!(Fp8RowwiseConfig::from_name(c.name()), Some(c));
        let f = c.facts().unwrap();
        assert_eq!(f.tile, c.tile(), "{c}");
        assert_eq!((f.scale_block_a, f.scale_block_b), ((1, 0), (1, 0)), "{c}: per row and per channel, all of K");
        assert!(!f.two_level_accumulation, "{c}: scales are applied once, in the epilogue");
        match c.accumulation() {
            Fp8Accumulation::Fast => {
                assert!(f.fast_accumulation && f.promotion_k == 0, "{c}: {f:?}");
                assert!(f.schedule.ends_with("FP8FastAccum"), "{c}: {}", f.schedule);
            }
            Fp8Accumulation::Promoted => {
                assert!(!f.fast_accumulation && f.promotion_k == 128, "{c}: promoted every 128 of K: {f:?}");
                assert_eq!(f.schedule, "KernelPtrArrayTmaWarpSpecializedCooperative");
            }
        }
        assert!(f.stages >= 2, "{c}: {f:?}");
    }
}

#[test]
fn heuristic_picks_by_rows_per_group_and_accumulation() {
    use Fp8RowwiseConfig::*;
    assert_eq!(Fp8RowwiseConfig::heuristic(Fp8Accumulation::Fast, 128, 8 * 128), FastAccumPingpong64x128x128);
    assert_eq!(Fp8RowwiseConfig::heuristic(Fp8Accumulation::Fast, 8, 4096), FastAccumCooperative128x128x128);
    assert_eq!(Fp8RowwiseConfig::heuristic(Fp8Accumulation::Promoted, 128, 8), PromotedCooperative128x128x128);
    assert_eq!(Fp8Accumulation::default(), Fp8Accumulation::Fast, "plans default to FastAccum, as vLLM");
}

#[test]
fn shapes_name_their_constraint() {
    let err = |g, n, k, m| GroupedGemmFp8RowwiseShape::new(g, n, k, m).unwrap_err().to_string();
    assert!(GroupedGemmFp8RowwiseShape::new(8, 400, 256, 4096).is_ok(), "N need not be a multiple of 128");
    assert!(err(8, 392, 256, 64).contains("N = 392 is not a positive multiple of 16"));
    assert!(err(8, 256, 200, 64).contains("K = 200 is not a positive multiple of 16"));
    assert!(err(0, 256, 256, 64).contains("groups = 0"));
    assert!(err(8, 256, 256, 1 << 31).contains("max_rows"));
}

#[test]
fn the_reference_dequantises_per_row_and_per_tensor_scales() {
    // A = [[1, 2], ...] per row, B per tensor: D = (A·Bᵀ) scaled exactly as the blocks say.
    let a = BlockFp8::quantize(&[1.0, 2.0, -4.0, 8.0], 2, 2, per_row_block(2), ScaleFormat::F32).unwrap();
    let b =
        BlockFp8::quantize(&[0.5, 0.25, 1.0, -1.0], 2, 2, BlockShape { rows: 2, cols: 2 }, ScaleFormat::F32).unwrap();
    let d = scaled_fp8_rows(&a, std::slice::from_ref(&b), &[(0, 0), (1, 0)]).unwrap();
    let want = [1.0 * 0.5 + 2.0 * 0.25, 1.0 - 2.0, -4.0 * 0.5 + 8.0 * 0.25, -4.0 - 8.0];
    for (g, w) in d.iter().zip(want) {
        assert!((g - w).abs() < 1e-6 * w.abs().max(1.0), "{d:?} vs {want:?}");
    }
    let other = BlockFp8::quantize(&[1.0; 6], 2, 3, per_row_block(3), ScaleFormat::F32).unwrap();
    let e = scaled_fp8_rows(&a, &[b, other], &[(0, 1)]).unwrap_err().to_string();
    assert!(e.contains("expert 1 is [2, 3]"), "{e}");
}
