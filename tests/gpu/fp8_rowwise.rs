//! FP8 rowwise-scaled grouped GEMM on the GPU (per-token x per-channel f32 scales, per-tensor as a special
//! case), against the f64 reference of the dequantised operands (`moe_gemm::reference::scaled_fp8_rows`).
//!
//! Operands as in `fp8.rs`: random e4m3 values over the whole format and random, non-uniform f32 scales
//! (log-uniform over 2^-12 .. 2^-4), here one per row of A and one per output channel of every expert, so a
//! scale vector read at the wrong group's offset is wrong by up to 256x. Bound for K <= 2048: as `fp8.rs`
//! (`Tolerance::for_output::<bf16>` of each row's largest reference value). The long-K test measures each
//! accumulation's error instead and states the bound it holds it to.

use std::sync::Arc;

use crate::common::*;
use crate::fp8::{checked_rows, compare, random_q, random_scales, Groups, Report, GUARD};
use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::kernels::grouped_fp8_rowwise::*;
use moe_gemm::quant::{per_row_block, BlockFp8, BlockShape, Fp8ChannelWeights, Fp8TokenRows, Scales};
use moe_gemm::reference::scaled_fp8_rows;
use moe_gemm::status::bits as error_bits;
use moe_gemm::*;

/// `[rows, k]` e4m3 with one random scale per row.
fn per_row(rows: usize, k: usize, seed: u64) -> BlockFp8 {
    let scales = Scales::F32(random_scales(rows, seed + 1));
    BlockFp8::from_parts(rows, k, per_row_block(k), random_q(rows * k, seed), scales).unwrap()
}

/// `[rows, k]` e4m3 with one random scale for all of it.
fn per_tensor(rows: usize, k: usize, seed: u64) -> BlockFp8 {
    let scales = Scales::F32(random_scales(1, seed + 1));
    BlockFp8::from_parts(rows, k, BlockShape { rows, cols: k }, random_q(rows * k, seed), scales).unwrap()
}

struct Prepared {
    ext: Vec<(usize, usize)>,
    max_rows: usize,
    n: usize,
    k: usize,
    a: BlockFp8,
    b: Vec<BlockFp8>,
    pairs: Vec<(usize, usize)>,
    reference: Vec<f64>,
}

fn prepare(groups: &Groups, n: usize, k: usize, seed: u64, tensorwise: bool) -> Prepared {
    let (ext, max_rows) = groups.extents();
    let a = if tensorwise { per_tensor(max_rows, k, seed) } else { per_row(max_rows, k, seed) };
    let b: Vec<BlockFp8> = (0..ext.len() as u64)
        .map(|e| {
            let s = seed + 1000 * (e + 1);
            if tensorwise {
                per_tensor(n, k, s)
            } else {
                per_row(n, k, s)
            }
        })
        .collect();
    let pairs = checked_rows(&ext, seed + 3);
    let reference = scaled_fp8_rows(&a, &b, &pairs).unwrap();
    Prepared { ext, max_rows, n, k, a, b, pairs, reference }
}

/// Launches `config` over `p`'s groups on the device operands and downloads D (plus the guard).
fn launch(
    stream: &Arc<CudaStream>,
    groups: &Groups,
    p: &Prepared,
    config: Fp8RowwiseConfig,
    a: &Fp8TokenRows,
    b: &Fp8ChannelWeights,
) -> Vec<bf16> {
    let shape = GroupedGemmFp8RowwiseShape::new(p.ext.len(), p.n, p.k, p.max_rows).unwrap();
    let opts = GroupedGemmFp8RowwiseOptions { config: Some(config), ..Default::default() };
    let plan = GroupedGemmFp8Rowwise::new(stream, shape, opts).unwrap();
    assert_eq!(plan.config(), config);
    let mut ws = plan.alloc_workspace(stream).unwrap();
    let mut st = DeviceStatus::new(stream).unwrap();
    let (first, counts) = groups.upload(stream);
    let mut d = stream.clone_htod(&vec![bf16::NAN; p.max_rows * p.n + GUARD]).unwrap();
    let mut d_view = d.slice_mut(0..p.max_rows * p.n);
    plan.launch(stream, a, b, groups.rows(&first, &counts), &mut d_view, &mut ws, &mut st).unwrap();
    st.check(stream).unwrap();
    stream.clone_dtoh(&d).unwrap()
}

fn run(groups: Groups, n: usize, k: usize, seed: u64, tensorwise: bool) {
    let (_ctx, stream) = gpu();
    let p = prepare(&groups, n, k, seed, tensorwise);
    let a = Fp8TokenRows::from_host(&stream, &p.a).unwrap();
    let b = Fp8ChannelWeights::from_host(&stream, &p.b).unwrap();
    for config in Fp8RowwiseConfig::ALL {
        let d = launch(&stream, &groups, &p, config, &a, &b);
        let report: Report = compare(&p.ext, n, &p.pairs, &p.reference, &d);
        assert!(report.is_clean(), "{groups:?} N {n} K {k} [{config}]: {report:#?}");
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn rowwise_unequal_groups_every_config() {
    // Groups of 0, 1, 5, 129 and 4133 rows (past 4096), then 2, and 7 unowned rows; Qwen3-30B's w13 width.
    run(Groups::Offsets { sizes: vec![0, 1, 5, 129, 4133, 2], spare: 7 }, 1536, 2048, 111, false);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn per_tensor_scales_padded_and_masked_groups() {
    // Per-tensor activations and experts (vLLM's static fp8 w8a8), padded groups (unowned padding stays NaN).
    run(Groups::Padded { counts: vec![5, 0, 130, 1, 64], align: 128 }, 256, 384, 121, true);
    // Per-row scales over DeepGEMM's masked layout; N not a multiple of 128 (a partial N tile).
    run(Groups::Masked { counts: vec![160, 0, 7, 129], max_m: 160 }, 400, 256, 131, false);
}

/// The comparison has teeth: with the channel scales of experts 1 and 3 swapped, exactly groups 1 and 3 fail;
/// with the scales of the first rows of groups 0 and 2 swapped, exactly groups 0 and 2 fail.
#[test]
#[ignore = "needs an SM90 GPU"]
fn swapped_scales_are_caught_in_exactly_the_groups_they_touch() {
    let (_ctx, stream) = gpu();
    let groups = Groups::Offsets { sizes: vec![40, 70, 90, 30], spare: 0 };
    let (n, k) = (256usize, 1024usize);
    let p = prepare(&groups, n, k, 141, false);
    let good_a = Fp8TokenRows::from_host(&stream, &p.a).unwrap();
    let good_b = Fp8ChannelWeights::from_host(&stream, &p.b).unwrap();
    let mut swapped = p.b.clone();
    let (q1, s1) = swapped[1].clone().into_parts();
    let (q3, s3) = swapped[3].clone().into_parts();
    swapped[1] = BlockFp8::from_parts(n, k, per_row_block(k), q1, s3).unwrap();
    swapped[3] = BlockFp8::from_parts(n, k, per_row_block(k), q3, s1).unwrap();
    let bad_b = Fp8ChannelWeights::from_host(&stream, &swapped).unwrap();
    let (q, scales) = p.a.clone().into_parts();
    let Scales::F32(mut s) = scales else { panic!("F32 scales") };
    s.swap(p.ext[0].0, p.ext[2].0);
    let bad_a = Fp8TokenRows::from_host(
        &stream,
        &BlockFp8::from_parts(p.max_rows, k, per_row_block(k), q, Scales::F32(s)).unwrap(),
    )
    .unwrap();
    for config in Fp8RowwiseConfig::ALL {
        let failing = |a: &Fp8TokenRows, b: &Fp8ChannelWeights| {
            let d = launch(&stream, &groups, &p, config, a, b);
            compare(&p.ext, n, &p.pairs, &p.reference, &d).failing.keys().copied().collect::<Vec<_>>()
        };
        assert_eq!(failing(&good_a, &good_b), Vec::<usize>::new(), "{config}: unmutated operands must pass");
        assert_eq!(failing(&good_a, &bad_b), vec![1, 3], "{config}: channel scales of experts 1 and 3 swapped");
        assert_eq!(failing(&bad_a, &good_b), vec![0, 2], "{config}: row scales of groups 0 and 2 swapped");
    }
}

/// Accumulation over long K: the largest error of each configuration relative to its row's largest reference
/// value, at DeepSeek-V3's K = 7168 and at 16384. Promoted accumulation is held to the blockwise family's bound
/// (2^-9 of the row's largest value, plus the bf16 output rounding); FastAccum, which keeps all of K in the
/// tensor cores' accumulators, to 2^-5. Both figures are printed.
#[test]
#[ignore = "needs an SM90 GPU"]
fn long_k_error_of_each_accumulation() {
    let (_ctx, stream) = gpu();
    for k in [7168usize, 16384] {
        let groups = Groups::Offsets { sizes: vec![3, 64, 130], spare: 0 };
        let n = 256;
        let p = prepare(&groups, n, k, 151 + k as u64, false);
        let a = Fp8TokenRows::from_host(&stream, &p.a).unwrap();
        let b = Fp8ChannelWeights::from_host(&stream, &p.b).unwrap();
        for config in Fp8RowwiseConfig::ALL {
            let d = launch(&stream, &groups, &p, config, &a, &b);
            let mut worst = 0f64;
            for (i, &(row, _)) in p.pairs.iter().enumerate() {
                let want = &p.reference[i * n..(i + 1) * n];
                let max = want.iter().fold(0f64, |m, x| m.max(x.abs()));
                for (j, w) in want.iter().enumerate() {
                    let got = d[row * n + j].to_f64();
                    // The output's own rounding (half a bf16 step of the value) is not the accumulation's.
                    let err = ((got - w).abs() - w.abs() / 256.0).max(0.0);
                    worst = worst.max(err / max);
                }
            }
            let bound = match config.accumulation() {
                Fp8Accumulation::Promoted => 1.0 / 512.0,
                Fp8Accumulation::Fast => 1.0 / 32.0,
            };
            println!("K {k} [{config}]: largest error / row max = {worst:.3e} (bound {bound:.3e})");
            assert!(worst <= bound, "K {k} [{config}]: error {worst:.3e} above {bound:.3e}");
        }
    }
}

/// Offsets and counts that break the contract are clamped and reported, never followed out of bounds.
#[test]
#[ignore = "needs an SM90 GPU"]
fn invalid_offsets_and_counts_are_reported_and_contained() {
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (3usize, 128usize, 256usize, 20usize);
    let shape = GroupedGemmFp8RowwiseShape::new(g, n, k, max_rows).unwrap();
    let plan = GroupedGemmFp8Rowwise::new(&stream, shape, Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = Fp8TokenRows::from_host(&stream, &per_row(max_rows, k, 161)).unwrap();
    let experts: Vec<BlockFp8> = (0..g as u64).map(|e| per_row(n, k, 170 + 10 * e)).collect();
    let b = Fp8ChannelWeights::from_host(&stream, &experts).unwrap();
    let mut d = stream.clone_htod(&vec![bf16::NAN; max_rows * n + GUARD]).unwrap();
    let ok = stream.clone_htod(&[0i32, 5, 10, 20]).unwrap();
    for (offsets, want) in [
        (&[0i32, 10, 5, 20][..], error_bits::OFFSETS_NOT_MONOTONE),
        (&[0, 10, 15, 4000], error_bits::OFFSETS_OUT_OF_RANGE),
        (&[3, 10, 15, 20], error_bits::OFFSETS_NOT_ZERO_BASED),
    ] {
        let o = stream.clone_htod(offsets).unwrap();
        plan.launch(&stream, &a, &b, &o, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
        match st.check(&stream) {
            Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & want, want, "{offsets:?}: word {word:#x}"),
            other => panic!("{offsets:?}: expected a device check error, got {other:?}"),
        }
        assert!(stream.clone_dtoh(&d).unwrap()[max_rows * n..].iter().all(|x| x.is_nan()), "{offsets:?}: guard");
        plan.launch(&stream, &a, &b, &ok, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
        st.check(&stream).unwrap();
    }
    // Operands that do not fit the plan are refused before anything is queued.
    let small = Fp8TokenRows::from_host(&stream, &per_row(max_rows - 1, k, 181)).unwrap();
    let e = plan.launch(&stream, &small, &b, &ok, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap_err();
    assert!(e.to_string().contains("at least max_rows rows"), "{e}");
    let e = plan.launch(&stream, &a, &b, &ok, &mut d.slice_mut(0..max_rows * n - 1), &mut ws, &mut st).unwrap_err();
    assert!(e.to_string().contains("max_rows x N"), "{e}");
}
