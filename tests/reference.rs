//! CPU tests of the reference the GPU tests trust: hand-computed values, and the tolerance's teeth.

use half::bf16;
use moe_gemm::reference::{first_mismatch, grouped_gemm_rows, Tolerance};

fn b16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

#[test]
fn reference_uses_each_rows_own_group() {
    // Two groups, K = 2, N = 2. Group 0: identity; group 1: [[0, 1], [2, 0]] (rows of B are outputs).
    let a = b16(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]); // rows 0 | 1, 2
    let b = b16(&[1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 2.0, 0.0]);
    let d = grouped_gemm_rows(&a, &b, &[1, 2], 2, 2, &[0, 1, 2]);
    assert_eq!(d, vec![1.0, 2.0, 4.0, 6.0, 6.0, 10.0]);
}

#[test]
fn reference_skips_empty_groups() {
    // Group 0 and 2 are empty: row 0 belongs to group 1 (B = 2·I), row 1 to group 3 (B = 3·I).
    let a = b16(&[1.0, 1.0, 2.0, 2.0]);
    let eye = |s: f32| vec![s, 0.0, 0.0, s];
    let b = b16(&[eye(100.0), eye(2.0), eye(100.0), eye(3.0)].concat());
    let d = grouped_gemm_rows(&a, &b, &[0, 1, 0, 1], 2, 2, &[0, 1]);
    assert_eq!(d, vec![2.0, 2.0, 6.0, 6.0]);
}

#[test]
#[should_panic(expected = "past the last group")]
fn reference_refuses_rows_without_a_group() {
    let a = b16(&[1.0; 4]);
    let b = b16(&[1.0; 4]);
    grouped_gemm_rows(&a, &b, &[1], 2, 2, &[1]);
}

#[test]
fn tolerance_accepts_rounding_and_rejects_wrong_values() {
    let tol = Tolerance::for_output::<bf16>(100.0);
    let exact = 87.3f32;
    assert!(tol.accepts(bf16::from_f32(exact).to_f32(), exact), "one bf16 rounding must pass");
    assert!(!tol.accepts(exact * 1.02, exact), "a 2% error must fail");
    assert!(!tol.accepts(f32::NAN, exact), "NaN must fail");
    let got = [1.0, 2.0, 3.5];
    assert_eq!(first_mismatch(&got, &[1.0, 2.0, 3.0], tol), Some((2, 3.5, 3.0)));
    assert_eq!(first_mismatch(&got[..2], &[1.0, 2.0], tol), None);
}

mod blockwise_fp8 {
    use moe_gemm::quant::{BlockFp8, BlockShape, ScaleFormat, Scales, F8E4M3};
    use moe_gemm::reference::blockwise_fp8_rows;
    use moe_gemm::Error;

    fn ones(len: usize) -> Vec<F8E4M3> {
        vec![F8E4M3::from_f32(1.0); len]
    }

    /// A: one row of K = 256 (two K blocks), every element 1, scales [2, 3]. Expert 0: [128, 256] of ones with
    /// block scales [0.5, 0.25], expert 1 with [1, 1]: D = 128·2·0.5 + 128·3·0.25 = 224 and 128·2 + 128·3 = 640.
    #[test]
    fn hand_computed_scales_per_k_block_and_expert() {
        let a =
            BlockFp8::from_parts(1, 256, BlockShape::PER_TOKEN_128, ones(256), Scales::F32(vec![2.0, 3.0])).unwrap();
        let b0 = BlockFp8::from_parts(128, 256, BlockShape::DEEPSEEK, ones(128 * 256), Scales::F32(vec![0.5, 0.25]))
            .unwrap();
        let b1 =
            BlockFp8::from_parts(128, 256, BlockShape::DEEPSEEK, ones(128 * 256), Scales::F32(vec![1.0, 1.0])).unwrap();
        let d = blockwise_fp8_rows(&a, &[b0, b1], &[(0, 0), (0, 1)]).unwrap();
        assert!(d[..128].iter().all(|&x| x == 224.0), "{:?}", &d[..4]);
        assert!(d[128..].iter().all(|&x| x == 640.0), "{:?}", &d[128..132]);
    }

    /// N = 256 (two scale rows per expert) and K = 144 (a partial second K block of 16): output column j uses
    /// scale row j / 128, and the 16 columns of the partial block use the second K scale.
    #[test]
    fn scale_rows_of_n_and_a_partial_k_block() {
        let a = BlockFp8::from_parts(
            2,
            144,
            BlockShape::PER_TOKEN_128,
            ones(2 * 144),
            Scales::F32(vec![1.0, 10.0, 2.0, 0.0]),
        )
        .unwrap();
        // Grid [2, 2]: rows of blocks (N) x blocks of K.
        let b = BlockFp8::from_parts(
            256,
            144,
            BlockShape::DEEPSEEK,
            ones(256 * 144),
            Scales::F32(vec![1.0, 1.0, 3.0, 0.5]),
        )
        .unwrap();
        let d = blockwise_fp8_rows(&a, &[b], &[(0, 0), (1, 0)]).unwrap();
        // Row 0: columns < 128: 128·1·1 + 16·10·1 = 288; columns >= 128: 128·1·3 + 16·10·0.5 = 464.
        assert_eq!((d[0], d[127], d[128], d[255]), (288.0, 288.0, 464.0, 464.0));
        // Row 1: 128·2·1 + 0 = 256 and 128·2·3 = 768.
        assert_eq!((d[256], d[256 + 128]), (256.0, 768.0));
    }

    /// On random data the reference equals the f32 dequantisation of `moe_gemm::quant` multiplied out, to that
    /// dequantisation's own rounding.
    #[test]
    fn agrees_with_the_quantizers_dequantisation() {
        let (rows, n, k) = (3usize, 256usize, 384usize);
        let mut rng = moe_gemm::random::SplitMix64(5);
        let x: Vec<f32> = (0..rows * k).map(|i| rng.unit() * (1 + i % 7) as f32).collect();
        let w: Vec<f32> = (0..n * k).map(|i| rng.unit() * (1 + i % 5) as f32 * 0.01).collect();
        let a = BlockFp8::quantize(&x, rows, k, BlockShape::PER_TOKEN_128, ScaleFormat::F32).unwrap();
        let b = BlockFp8::quantize(&w, n, k, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap();
        let pairs: Vec<(usize, usize)> = (0..rows).map(|r| (r, 0)).collect();
        let d = blockwise_fp8_rows(&a, std::slice::from_ref(&b), &pairs).unwrap();
        let (xa, wb) = (a.dequantize(), b.dequantize());
        for r in 0..rows {
            for j in 0..n {
                let want: f64 = (0..k).map(|c| xa[r * k + c] as f64 * wb[j * k + c] as f64).sum();
                let mag: f64 = (0..k).map(|c| (xa[r * k + c] as f64 * wb[j * k + c] as f64).abs()).sum();
                assert!((d[r * n + j] - want).abs() <= 1e-6 * mag, "row {r} col {j}: {} vs {want}", d[r * n + j]);
            }
        }
    }

    #[test]
    fn refuses_mismatched_blocks_formats_and_ranges() {
        let a = BlockFp8::from_parts(1, 128, BlockShape::PER_TOKEN_128, ones(128), Scales::F32(vec![1.0])).unwrap();
        let b = BlockFp8::from_parts(128, 128, BlockShape::DEEPSEEK, ones(128 * 128), Scales::F32(vec![1.0])).unwrap();
        let msg = |r: moe_gemm::Result<Vec<f64>>| match r {
            Err(Error::InvalidProblem(m)) => m,
            other => panic!("expected InvalidProblem, got {other:?}"),
        };
        assert!(msg(blockwise_fp8_rows(&a, std::slice::from_ref(&b), &[(1, 0)])).contains("row 1"));
        assert!(msg(blockwise_fp8_rows(&a, std::slice::from_ref(&b), &[(0, 1)])).contains("group 1"));
        assert!(msg(blockwise_fp8_rows(&b, std::slice::from_ref(&b), &[(0, 0)])).contains("activations"));
        assert!(msg(blockwise_fp8_rows(&a, std::slice::from_ref(&a), &[(0, 0)])).contains("expert 0"));
        assert!(msg(blockwise_fp8_rows(&a, &[], &[])).contains("no experts"));
        let ue = BlockFp8::quantize(&[0.5; 128 * 128], 128, 128, BlockShape::DEEPSEEK, ScaleFormat::Ue8m0).unwrap();
        assert!(msg(blockwise_fp8_rows(&a, &[ue], &[(0, 0)])).contains("Ue8m0"));
    }
}
