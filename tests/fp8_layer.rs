//! The FP8 layer on the host: its sizing (the backends it runs, the constraints it names, the scratch it needs,
//! checked against formulas written here from the data flow) and `moe-gemm plan --dtype fp8`. No GPU needed.

use std::process::Command;

use moe_gemm::dtype::DType;
use moe_gemm::layer::{auto_backend_fp8, LayerShape as Shape, WeightFormat};
use moe_gemm::{Backend, Backends, Error, LayerSizing};

const SM: usize = 132;

fn shape(e: usize, k: usize, h: usize, i: usize) -> Shape {
    Shape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true }
}

fn fp8(s: Shape, t: usize, backend: Backend, backends: Option<Backends>) -> moe_gemm::Result<LayerSizing> {
    LayerSizing::new_fp8(s, t, backend, backends, None, false, SM)
}

fn invalid<T: std::fmt::Debug>(r: moe_gemm::Result<T>) -> String {
    match r {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

#[test]
fn auto_over_fp8_picks_batched_or_grouped_and_other_backends_are_refused_naming_fp8() {
    let s = shape(64, 8, 512, 256);
    for t in [1usize, 16, 4096] {
        let auto = fp8(s, t, Backend::Auto, None).unwrap();
        assert_eq!(auto.format(), WeightFormat::Fp8Block);
        assert_eq!(auto.backends(), Backends::FP8_AUTO, "T = {t}");
        // Each backend sized for the largest batch Auto sends it (at least one token).
        let last = |b: Backend| (1..=t).rfind(|&n| auto_backend_fp8(64, 8, 512, 256, n) == b).unwrap_or(1);
        assert_eq!(
            auto.pass_tokens(),
            vec![(Backend::Batched, last(Backend::Batched)), (Backend::Grouped, last(Backend::Grouped))]
        );
    }
    // Under expert parallelism Auto runs Grouped only.
    let ep = LayerSizing::new_fp8(s, 64, Backend::Auto, None, None, true, SM).unwrap();
    assert_eq!(ep.backends(), Backends::of(Backend::Grouped));
    let all = fp8(s, 64, Backend::Masked, Some(Backends::FP8)).unwrap();
    assert_eq!(all.backends().to_string(), "batched,grouped,contiguous,masked,fused");
    for r in [fp8(s, 64, Backend::Eager, None), fp8(s, 64, Backend::Auto, Some(Backends::FP8.with(Backend::Eager)))] {
        let m = invalid(r);
        assert!(m.contains("backend eager") && m.contains("FP8") && m.contains("Eager has no FP8 form"), "{m}");
    }
    // The FP8 Fused pass holds x quantised per token (T e4m3 rows) and h requantised at its layout positions.
    let fused = fp8(s, 64, Backend::Fused, None).unwrap();
    assert!(fused.needs().a_fp8_rows >= 64 && fused.needs().h_fp8_rows >= 64 * s.top_k, "{:?}", fused.needs());
    // Dense sizing of the same shape is untouched: Auto's three backends.
    let dense = LayerSizing::new(s, DType::BF16, 64, Backend::Auto, None, None, None, false, SM).unwrap();
    assert_eq!((dense.format(), dense.backends()), (WeightFormat::Dense, Backends::AUTO));
}

#[test]
fn fp8_sizing_names_the_blockwise_constraints() {
    let m = invalid(fp8(shape(128, 4, 2880, 2880), 64, Backend::Auto, None));
    assert!(m.contains("H = 2880") && m.contains("multiple of 128"), "{m}");
    let m = invalid(fp8(shape(128, 8, 2048, 192), 64, Backend::Auto, None));
    assert!(m.contains("I = 192") && m.contains("multiple of 128"), "{m}");
    let f16 = LayerSizing::for_format(
        shape(8, 2, 256, 128),
        DType::F16,
        WeightFormat::Fp8Block,
        8,
        Backend::Auto,
        None,
        None,
        None,
        false,
        SM,
    );
    assert!(invalid(f16).contains("bf16 activations"));
}

/// The scratch of FP8 layers from the data flow: no bf16 copy of x; x quantised at its layout positions and h
/// requantised (1 byte per element + an f32 per 128); d1, h, d2 in bf16 as for dense weights.
#[test]
fn fp8_scratch_footprint_matches_the_data_flow() {
    for (e, k, h, i) in [(256usize, 8usize, 7168usize, 2048usize), (128, 8, 2048, 768), (8, 2, 4096, 14336)] {
        let s = shape(e, k, h, i);
        for (t, backend, rows) in [
            (1usize, Backend::Grouped, k),
            (4096, Backend::Grouped, 4096 * k),
            (64, Backend::Masked, e * 64),
            (64, Backend::Contiguous, (64 * k + e.min(64 * k) * 127).div_ceil(128) * 128),
        ] {
            let sz = fp8(s, t, backend, None).unwrap();
            let n = sz.needs();
            let what = format!("E {e} k {k} H {h} I {i} T {t} {backend}");
            assert_eq!((n.a_rows, n.a_fp8_rows, n.h_fp8_rows, n.h_rows), (0, rows, rows, rows), "{what}");
            let fp = n.footprint();
            let part = |name: &str| fp.parts.iter().find(|(p, _)| p.starts_with(name)).map(|(_, b)| *b).unwrap();
            assert_eq!(part("a fp8"), rows * (h + 4 * h.div_ceil(128)), "{what}");
            assert_eq!(part("h fp8"), rows * (i + 4 * i.div_ceil(128)), "{what}");
            assert_eq!(part("a (permuted x)"), 0, "{what}");
            assert_eq!(part("d1") + part("h (activation)") + part("d2"), rows * (2 * i + i + h) * 2, "{what}");
            // The CUTLASS configurations' per-group arrays; where every batch the layer plans for has at most 2
            // rows per group it plans only the swap-AB decode kernel, which needs none.
            let decode_only = (t * k).div_ceil(e) <= 2;
            assert_eq!(n.workspace_bytes > 0, !decode_only, "{what}: the FP8 GEMMs' workspace");
            // The dense layer of the same shape holds a bf16 copy of x instead.
            let dense = LayerSizing::new(s, DType::BF16, t, backend, None, None, None, false, SM).unwrap();
            let dn = dense.needs();
            assert_eq!((dn.a_rows, dn.a_fp8_rows, dn.h_fp8_rows), (rows, 0, 0), "{what}");
            let plan = sz.plan_bytes(false);
            assert!(plan.host > 0 && plan.host < 1 << 20 && plan.device == 0, "{what}: {plan:?}");
        }
    }
}

/// A scratch serves a dense and an FP8 layer when sized for both; sized for the dense one alone, it is refused
/// for the FP8 one, naming the buffer.
#[test]
fn one_scratch_for_dense_and_fp8_layers() {
    let s = shape(64, 8, 1024, 512);
    let dense = *LayerSizing::new(s, DType::BF16, 128, Backend::Grouped, None, None, None, false, SM).unwrap().needs();
    let f = *fp8(s, 128, Backend::Grouped, None).unwrap().needs();
    let both = dense.max(f).unwrap();
    both.check_covers(&dense).unwrap();
    both.check_covers(&f).unwrap();
    let m = invalid(dense.check_covers(&f));
    assert!(m.contains("a_fp8_rows") && m.contains("for_layers"), "{m}");
    assert!(both.footprint().total() > dense.footprint().total().max(f.footprint().total()));
}

#[test]
fn fp8_weight_bytes_are_one_per_element_plus_block_scales() {
    let ds = shape(256, 8, 7168, 2048);
    // w13 [4096, 7168] + w2 [7168, 2048] e4m3, scales [32, 56] + [56, 16] f32.
    assert_eq!(ds.fp8_expert_bytes(), (4096 + 2048) * 7168 + 4 * (32 * 56 + 56 * 16));
    assert_eq!(ds.weight_bytes(WeightFormat::Fp8Block, DType::BF16), ds.fp8_expert_bytes());
    assert_eq!(ds.weight_bytes(WeightFormat::Dense, DType::BF16), ds.expert_bytes(DType::BF16));
    // Edge blocks count whole: I = 200 is one block and a partial one.
    assert_eq!(shape(1, 1, 256, 200).fp8_expert_bytes(), 600 * 256 + 4 * (4 * 2 + 2 * 2));
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-gemm")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// `moe-gemm plan --dtype fp8`: DeepSeek-V3's FP8 layers (weights at one byte and their scales; e4m3 x and h in
/// the scratch; Grouped under Auto), against the numbers of the host sizing.
#[test]
fn plan_prints_the_fp8_footprint() {
    let (ok, text) = cli(&["plan", "--model", "deepseek-v3", "--dtype", "fp8", "--max-tokens", "4096"]);
    assert!(ok, "{text}");
    let s = Shape { shared_groups: 1, ..shape(256, 8, 7168, 2048) };
    let sizing = fp8(s, 4096, Backend::Auto, None).unwrap();
    let fp = sizing.needs().footprint();
    assert!(text.contains("fp8 block 128x128") && text.contains("backends {batched,grouped}"), "{text}");
    assert!(text.contains(&format!("{:>14} B", fp.total())), "total {} missing:\n{text}", fp.total());
    assert!(text.contains("a fp8 (e4m3 x + scales)") && text.contains("h fp8 (e4m3 h + scales)"), "{text}");
    let weights = 257 * s.fp8_expert_bytes() * 58;
    assert!(text.contains(&moe_gemm::layer::sizing::mib(weights)), "weights {weights} B missing:\n{text}");
    // The dense plan still prints what it did, and a backend FP8 does not run is refused naming FP8.
    let (ok, dense) = cli(&["plan", "--model", "deepseek-v3"]);
    assert!(ok && dense.contains("bf16") && !dense.contains("a fp8"), "{dense}");
    let (ok, refused) = cli(&["plan", "--model", "deepseek-v3", "--dtype", "fp8", "--backends", "eager"]);
    assert!(
        !ok && refused.contains("FP8 expert weights run the Batched, Grouped, Contiguous, Masked and Fused"),
        "{refused}"
    );
    let (ok, fused) = cli(&["plan", "--model", "deepseek-v3", "--dtype", "fp8", "--backends", "fused"]);
    assert!(ok && fused.contains("backends {fused}"), "{fused}");
    let (ok, bad) = cli(&["plan", "--dtype", "fp4"]);
    assert!(!ok && bad.contains("bf16, f16, fp8 or mxfp4"), "{bad}");
}
