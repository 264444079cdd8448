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
