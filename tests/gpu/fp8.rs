//! FP8 blockwise-scaled grouped GEMM on the GPU (DeepSeek-V3 recipe), against the f64 reference of the
//! dequantised operands (`moe_gemm::reference::blockwise_fp8_rows`).
//!
//! Operands are random e4m3 values over the whole format (448·u, u uniform in [-1, 1)) with random,
//! **non-uniform** f32 scales, log-uniform over 2^-12 .. 2^-4, different for every row and 128-block of K of A
//! and every 128 × 128 block of every expert. A scale read from the wrong group or block is then wrong by a factor
//! of up to 256, so a per-group offset bug shows as later groups failing while group 0 passes: failures are
//! reported per group.
//!
//! Bound, per output element of row `r`: `|got − ref| ≤ 2^-9 · max_j |ref[r, j]| + 2^-7 · |ref|`
//! (`Tolerance::for_output::<bf16>` of the row's largest reference value). The `2^-7 · |ref|` term is two
//! half-ulps of the bf16 output; the `2^-9 · max` term covers the accumulation, whose error the blockwise kernel
//! keeps near the tensor cores' own precision (DeepSeek-V3 reports about 14 bits, i.e. ~2^-13 of a 128-element
//! partial sum) because each partial sum spans only 128 of K before it is promoted into f32 with FFMA. The
//! bound does not grow with K; without promotion (FastAccum) the error grows with K, which the K = 16384 case is
//! there to expose.
//!
//! D is poisoned with NaN (plus a guard region past it) before each launch: every row of every group must be
//! written and finite, every other row and the guard must still be NaN.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;

use crate::common::*;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};
use moe_gemm::layouts::offsets_from_sizes;
use moe_gemm::layouts::GroupRows;
use moe_gemm::quant::{scale_blocks, BlockFp8, BlockShape, Fp8BlockWeights, Fp8Rows, Scales, F8E4M3};
use moe_gemm::reference::{blockwise_fp8_rows, Tolerance};
use moe_gemm::status::bits as error_bits;
use moe_gemm::*;

pub(crate) const GUARD: usize = 4096;

/// `len` e4m3 values `448·u`, `u` uniform in [-1, 1), on all cores (seeded).
pub(crate) fn random_q(len: usize, seed: u64) -> Vec<F8E4M3> {
    let mut v = vec![F8E4M3::from_f32(0.0); len];
    let chunk = len.div_ceil(thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1 << 16);
    thread::scope(|s| {
        for (i, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = Rng(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                for x in part {
                    *x = F8E4M3::from_f32(448.0 * rng.unit());
                }
            });
        }
    });
    v
}

/// `len` scales log-uniform in `2^-12 .. 2^-4` (seeded).
pub(crate) fn random_scales(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len).map(|_| (2f32).powf(-8.0 + 4.0 * rng.unit())).collect()
}

/// Activations `[rows, k]` quantized per row per 128 of K, with random scales.
fn activations(rows: usize, k: usize, seed: u64) -> BlockFp8 {
    let scales = Scales::F32(random_scales(rows * scale_blocks(k), seed + 1));
    BlockFp8::from_parts(rows, k, BlockShape::PER_TOKEN_128, random_q(rows * k, seed), scales).unwrap()
}

/// `g` experts `[n, k]` in 128 × 128 blocks, with random scales.
fn experts(g: usize, n: usize, k: usize, seed: u64) -> Vec<BlockFp8> {
    (0..g as u64)
        .map(|e| {
            let s = seed + 1000 * (e + 1);
            let scales = Scales::F32(random_scales(scale_blocks(n) * scale_blocks(k), s + 1));
            BlockFp8::from_parts(n, k, BlockShape::DEEPSEEK, random_q(n * k, s), scales).unwrap()
        })
        .collect()
}

/// How the groups are described on the device.
#[derive(Clone, Debug)]
pub(crate) enum Groups {
    /// Exclusive prefix sums of the sizes; `spare` unowned rows at the end.
    Offsets { sizes: Vec<usize>, spare: usize },
    /// Each group starts at a multiple of `align` and holds `counts[g]` rows.
    Padded { counts: Vec<usize>, align: usize },
    /// Group g owns rows `g·max_m .. g·max_m + counts[g]`.
    Masked { counts: Vec<usize>, max_m: usize },
}

impl Groups {
    /// (start, rows) of every group, and the rows of A and D.
    pub(crate) fn extents(&self) -> (Vec<(usize, usize)>, usize) {
        match self {
            Groups::Offsets { sizes, spare } => {
                let mut start = 0;
                let ext = sizes
                    .iter()
                    .map(|&s| {
                        start += s;
                        (start - s, s)
                    })
                    .collect();
                (ext, start + spare)
            }
            Groups::Padded { counts, align } => {
                let mut start = 0;
                let ext = counts
                    .iter()
                    .map(|&c| {
                        let at = start;
                        start += c.div_ceil(*align) * align;
                        (at, c)
                    })
                    .collect();
                (ext, start)
            }
            Groups::Masked { counts, max_m } => {
                (counts.iter().enumerate().map(|(g, &c)| (g * max_m, c)).collect(), counts.len() * max_m)
            }
        }
    }

    /// The device arrays: (offsets or masked_m, counts).
    pub(crate) fn upload(&self, stream: &Arc<CudaStream>) -> (CudaSlice<i32>, Option<CudaSlice<i32>>) {
        let (ext, max_rows) = self.extents();
        let i32s = |v: Vec<usize>| -> Vec<i32> { v.into_iter().map(|x| x as i32).collect() };
        match self {
            Groups::Offsets { sizes, .. } => (stream.clone_htod(&offsets_from_sizes(sizes).unwrap()).unwrap(), None),
            Groups::Padded { counts, .. } => {
                let mut offsets: Vec<usize> = ext.iter().map(|&(start, _)| start).collect();
                offsets.push(max_rows);
                (stream.clone_htod(&i32s(offsets)).unwrap(), Some(stream.clone_htod(&i32s(counts.clone())).unwrap()))
            }
            Groups::Masked { counts, .. } => (stream.clone_htod(&i32s(counts.clone())).unwrap(), None),
        }
    }

    pub(crate) fn rows<'a>(&self, first: &'a CudaSlice<i32>, counts: &'a Option<CudaSlice<i32>>) -> GroupRows<'a> {
        match self {
            Groups::Offsets { .. } => GroupRows::Offsets(first.as_view()),
            Groups::Padded { .. } => {
                GroupRows::Padded { offsets: first.as_view(), counts: counts.as_ref().unwrap().as_view() }
            }
            Groups::Masked { max_m, .. } => GroupRows::Masked { masked_m: first.as_view(), max_m: *max_m },
        }
    }
}

/// The rows of each group compared with the reference: every row of a group of up to 300 rows; of larger
/// groups the first 130 (the first tile and the next tile's first rows), the last 70 and 16 random ones.
pub(crate) fn checked_rows(ext: &[(usize, usize)], seed: u64) -> Vec<(usize, usize)> {
    let mut rng = Rng(seed);
    let mut pairs = Vec::new();
    for (g, &(start, count)) in ext.iter().enumerate() {
        let mut rows: Vec<usize> = if count <= 300 {
            (0..count).collect()
        } else {
            (0..130).chain(count - 70..count).chain((0..16).map(|_| rng.below(count))).collect()
        };
        rows.sort_unstable();
        rows.dedup();
        pairs.extend(rows.into_iter().map(|r| (start + r, g)));
    }
    pairs
}

/// What a launch got wrong: the first mismatch of each failing group, and writes in the wrong places.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) failing: BTreeMap<usize, String>,
    unwritten: Option<String>,
    written_outside: Option<String>,
}

impl Report {
    pub(crate) fn is_clean(&self) -> bool {
        self.failing.is_empty() && self.unwritten.is_none() && self.written_outside.is_none()
    }
}

/// Compares D (downloaded, `max_rows·n` plus the guard) with the reference on `pairs` and checks the poison.
pub(crate) fn compare(
    ext: &[(usize, usize)],
    n: usize,
    pairs: &[(usize, usize)],
    reference: &[f64],
    d: &[bf16],
) -> Report {
    let mut report = Report::default();
    for (i, &(row, g)) in pairs.iter().enumerate() {
        if report.failing.contains_key(&g) {
            continue;
        }
        let want = &reference[i * n..(i + 1) * n];
        let max = want.iter().fold(0f64, |m, x| m.max(x.abs())) as f32;
        let tol = Tolerance::for_output::<bf16>(max);
        for (j, (&w, got)) in want.iter().zip(&d[row * n..(row + 1) * n]).enumerate() {
            if !tol.accepts(got.to_f32(), w as f32) {
                let at = row - ext[g].0;
                report.failing.insert(
                    g,
                    format!("group {g} row {row} ({at} of {}) col {j}: got {got}, reference {w} ({tol:?})", ext[g].1),
                );
                break;
            }
        }
    }
    let owned = |r: usize| ext.iter().any(|&(start, count)| r >= start && r < start + count);
    let rows = (d.len() - GUARD) / n;
    for r in 0..rows {
        let row = &d[r * n..(r + 1) * n];
        if owned(r) {
            if report.unwritten.is_none() && row.iter().any(|x| !x.to_f32().is_finite()) {
                report.unwritten = Some(format!("row {r} of a group holds NaN or infinity (unwritten?)"));
            }
        } else if report.written_outside.is_none() && row.iter().any(|x| !x.is_nan()) {
            report.written_outside = Some(format!("row {r}, owned by no group, was written"));
        }
    }
    if report.written_outside.is_none() && d[rows * n..].iter().any(|x| !x.is_nan()) {
        report.written_outside = Some("the guard region past D was written".into());
    }
    report
}

struct Case {
    name: &'static str,
    groups: Groups,
    n: usize,
    k: usize,
    seed: u64,
}

/// Host operands, their device copies and the reference of one case.
struct Prepared {
    ext: Vec<(usize, usize)>,
    max_rows: usize,
    a: BlockFp8,
    b: Vec<BlockFp8>,
    pairs: Vec<(usize, usize)>,
    reference: Vec<f64>,
}

fn prepare(case: &Case) -> Prepared {
    let (ext, max_rows) = case.groups.extents();
    let a = activations(max_rows, case.k, case.seed);
    let b = experts(ext.len(), case.n, case.k, case.seed + 7);
    let pairs = checked_rows(&ext, case.seed + 3);
    let reference = blockwise_fp8_rows(&a, &b, &pairs).unwrap();
    Prepared { ext, max_rows, a, b, pairs, reference }
}

/// Launches `case` with `config` on the device operands `a`, `b` and compares with `p`'s reference.
fn launch_and_compare(
    stream: &Arc<CudaStream>,
    case: &Case,
    p: &Prepared,
    config: Fp8TileConfig,
    a: &Fp8Rows,
    b: &Fp8BlockWeights,
) -> Report {
    let shape = GroupedGemmFp8Shape::new(p.ext.len(), case.n, case.k, p.max_rows).unwrap();
    let plan = GroupedGemmFp8::new(stream, shape, GroupedGemmFp8Options { config: Some(config), ..Default::default() })
        .unwrap();
    let mut ws = plan.alloc_workspace(stream).unwrap();
    let mut st = DeviceStatus::new(stream).unwrap();
    let (first, counts) = case.groups.upload(stream);
    let mut d = stream.clone_htod(&vec![bf16::NAN; p.max_rows * case.n + GUARD]).unwrap();
    let mut d_view = d.slice_mut(0..p.max_rows * case.n);
    plan.launch(stream, a, b, case.groups.rows(&first, &counts), &mut d_view, &mut ws, &mut st).unwrap();
    st.check(stream).unwrap();
    let d_host = stream.clone_dtoh(&d).unwrap();
    compare(&p.ext, case.n, &p.pairs, &p.reference, &d_host)
}

fn run_case(case: &Case, configs: &[Fp8TileConfig]) {
    let (_ctx, stream) = gpu();
    let p = prepare(case);
    let a = Fp8Rows::from_host(&stream, &p.a).unwrap();
    let b = Fp8BlockWeights::from_host(&stream, &p.b).unwrap();
    for &config in configs {
        let report = launch_and_compare(&stream, case, &p, config, &a, &b);
        assert!(report.is_clean(), "{} [{config}]: {report:#?}", case.name);
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_w13_unequal_groups_every_config() {
    // DeepSeek-V3 GEMM1 (w13): N = 2I = 4096, K = H = 7168. Groups of 0, 1, 5, 129 and 4133 rows (past 4096:
    // many M tiles, and the group after it starts past row 4096), then 2, with 7 unowned rows at the end.
    let case = Case {
        name: "w13 N 4096 K 7168, groups 0,1,5,129,4133,2",
        groups: Groups::Offsets { sizes: vec![0, 1, 5, 129, 4133, 2], spare: 7 },
        n: 4096,
        k: 7168,
        seed: 11,
    };
    run_case(&case, &Fp8TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn deepseek_w2_shape() {
    // DeepSeek-V3 GEMM2 (w2): N = H = 7168, K = I = 2048.
    let case = Case {
        name: "w2 N 7168 K 2048",
        groups: Groups::Offsets { sizes: vec![2, 130, 0, 9, 64], spare: 0 },
        n: 7168,
        k: 2048,
        seed: 21,
    };
    run_case(&case, &Fp8TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn long_k_16384_stays_within_the_same_bound() {
    // 128 promotions per output: the two-level accumulation keeps the error at the bound of the module docs.
    let case = Case {
        name: "K 16384",
        groups: Groups::Offsets { sizes: vec![3, 0, 257, 64, 1], spare: 2 },
        n: 1024,
        k: 16384,
        seed: 31,
    };
    run_case(&case, &Fp8TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn partial_last_block_of_k() {
    // K = 7·128 + 16: the eighth K block holds 16 columns, zero-filled by TMA, with its own scale.
    let case = Case {
        name: "K 912",
        groups: Groups::Offsets { sizes: vec![1, 130, 0, 17, 64], spare: 3 },
        n: 256,
        k: 912,
        seed: 41,
    };
    // The configurations that take such a K (the swap-AB kernel steps through whole 128-blocks: refused at plan
    // time, tests/fp8_plan.rs).
    let configs: Vec<Fp8TileConfig> = Fp8TileConfig::ALL.into_iter().filter(|c| c.takes_k(case.k)).collect();
    assert_eq!(configs.len(), Fp8TileConfig::ALL.len() - 1);
    run_case(&case, &configs);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn padded_groups_leave_the_padding_unwritten() {
    // vLLM / DeepGEMM contiguous layout: each group starts at a multiple of 128, padding rows are not owned.
    let case = Case {
        name: "padded to 128",
        groups: Groups::Padded { counts: vec![5, 0, 130, 1, 64], align: 128 },
        n: 256,
        k: 384,
        seed: 51,
    };
    run_case(&case, &Fp8TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn masked_groups() {
    // DeepGEMM masked layout: [G, max_m] rows, group g owns its first masked_m[g].
    let case = Case {
        name: "masked, max_m 160",
        groups: Groups::Masked { counts: vec![160, 0, 7, 129], max_m: 160 },
        n: 384,
        k: 256,
        seed: 61,
    };
    run_case(&case, &Fp8TileConfig::ALL);
}

/// The comparison has teeth: with the scale grids of experts 1 and 2 swapped on the device (elements in
/// place), exactly groups 1 and 2 fail; with the activation scales of the first row of groups 0 and 3
/// swapped, exactly groups 0 and 3 fail.
#[test]
#[ignore = "needs an SM90 GPU"]
fn swapped_scales_are_caught_in_exactly_the_groups_they_touch() {
    let (_ctx, stream) = gpu();
    let case = Case {
        name: "mutations",
        groups: Groups::Offsets { sizes: vec![40, 70, 90, 30], spare: 0 },
        n: 256,
        k: 1024,
        seed: 71,
    };
    let p = prepare(&case);
    let good_a = Fp8Rows::from_host(&stream, &p.a).unwrap();
    let good_b = Fp8BlockWeights::from_host(&stream, &p.b).unwrap();
    for config in Fp8TileConfig::ALL {
        let clean = launch_and_compare(&stream, &case, &p, config, &good_a, &good_b);
        assert!(clean.is_clean(), "{config}: unmutated operands must pass: {clean:#?}");

        let mut swapped = p.b.clone();
        let (q1, s1) = swapped[1].clone().into_parts();
        let (q2, s2) = swapped[2].clone().into_parts();
        swapped[1] = BlockFp8::from_parts(case.n, case.k, BlockShape::DEEPSEEK, q1, s2).unwrap();
        swapped[2] = BlockFp8::from_parts(case.n, case.k, BlockShape::DEEPSEEK, q2, s1).unwrap();
        let bad_b = Fp8BlockWeights::from_host(&stream, &swapped).unwrap();
        let report = launch_and_compare(&stream, &case, &p, config, &good_a, &bad_b);
        assert_eq!(report.failing.keys().copied().collect::<Vec<_>>(), vec![1, 2], "{config}: {report:#?}");

        let kb = scale_blocks(case.k);
        let (q, scales) = p.a.clone().into_parts();
        let mut s = match scales {
            Scales::F32(s) => s,
            other => panic!("activation scales are F32, got {:?}", other.format()),
        };
        let (row0, row3) = (p.ext[0].0, p.ext[3].0);
        for j in 0..kb {
            s.swap(row0 * kb + j, row3 * kb + j);
        }
        let bad_a_host =
            BlockFp8::from_parts(p.max_rows, case.k, BlockShape::PER_TOKEN_128, q, Scales::F32(s)).unwrap();
        let bad_a = Fp8Rows::from_host(&stream, &bad_a_host).unwrap();
        let report = launch_and_compare(&stream, &case, &p, config, &bad_a, &good_b);
        assert_eq!(report.failing.keys().copied().collect::<Vec<_>>(), vec![0, 3], "{config}: {report:#?}");
    }
}

/// Offsets and counts that break the contract are clamped on the device and reported, never followed out of
/// bounds; a valid launch afterwards is clean.
#[test]
#[ignore = "needs an SM90 GPU"]
fn invalid_offsets_and_counts_are_reported_and_contained() {
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (3usize, 128usize, 256usize, 20usize);
    let shape = GroupedGemmFp8Shape::new(g, n, k, max_rows).unwrap();
    let plan = GroupedGemmFp8::new(&stream, shape, Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = Fp8Rows::from_host(&stream, &activations(max_rows, k, 81)).unwrap();
    let b = Fp8BlockWeights::from_host(&stream, &experts(g, n, k, 82)).unwrap();
    let mut d = stream.clone_htod(&vec![bf16::NAN; max_rows * n + GUARD]).unwrap();
    let guard_intact = |d: &CudaSlice<bf16>| stream.clone_dtoh(d).unwrap()[max_rows * n..].iter().all(|x| x.is_nan());
    let expect_bits = |st: &mut DeviceStatus, want: u32, what: &str| match st.check(&stream) {
        Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & want, want, "{what}: word {word:#x}"),
        other => panic!("{what}: expected a device check error, got {other:?}"),
    };
    let offsets_cases: [(&[i32], u32); 4] = [
        (&[0, 10, 5, 20], error_bits::OFFSETS_NOT_MONOTONE),
        (&[0, 10, 15, 4000], error_bits::OFFSETS_OUT_OF_RANGE),
        (&[3, 10, 15, 20], error_bits::OFFSETS_NOT_ZERO_BASED),
        (&[0, -8, 15, 20], error_bits::OFFSETS_NOT_MONOTONE | error_bits::OFFSETS_OUT_OF_RANGE),
    ];
    let ok = stream.clone_htod(&[0i32, 5, 10, 20]).unwrap();
    for (offsets, want) in offsets_cases {
        let o = stream.clone_htod(offsets).unwrap();
        plan.launch(&stream, &a, &b, &o, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
        expect_bits(&mut st, want, &format!("offsets {offsets:?}"));
        assert!(guard_intact(&d), "offsets {offsets:?}: the guard past D was written");
        plan.launch(&stream, &a, &b, &ok, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
        st.check(&stream).unwrap();
    }
    // Padded: a count past its group's room; masked: a count past max_m and a negative one.
    let counts = stream.clone_htod(&[5i32, 9, 2]).unwrap();
    let rows = GroupRows::Padded { offsets: ok.as_view(), counts: counts.as_view() };
    plan.launch(&stream, &a, &b, rows, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
    expect_bits(&mut st, error_bits::GROUP_COUNT_OUT_OF_RANGE, "padded counts [5, 9, 2] in rooms [5, 5, 10]");
    let masked = stream.clone_htod(&[7i32, -1, 3]).unwrap();
    let rows = GroupRows::Masked { masked_m: masked.as_view(), max_m: 6 };
    plan.launch(&stream, &a, &b, rows, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
    expect_bits(&mut st, error_bits::GROUP_COUNT_OUT_OF_RANGE, "masked_m [7, -1, 3] with max_m 6");
    assert!(guard_intact(&d), "invalid counts: the guard past D was written");
}

/// Launch-time checks: operands and buffers that do not fit the plan are refused before anything is queued.
#[test]
#[ignore = "needs an SM90 GPU"]
fn launch_rejects_operands_that_do_not_fit_the_plan() {
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (4usize, 128usize, 256usize, 32usize);
    // A CUTLASS configuration, whose workspace grows with G (the swap-AB decode kernel needs none).
    let opts = GroupedGemmFp8Options { config: Some(Fp8TileConfig::Pingpong64x128x128), ..Default::default() };
    let plan = GroupedGemmFp8::new(&stream, GroupedGemmFp8Shape::new(g, n, k, max_rows).unwrap(), opts).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = Fp8Rows::zeros(&stream, max_rows, k).unwrap();
    let b = Fp8BlockWeights::from_host(&stream, &experts(g, n, k, 91)).unwrap();
    let offsets = stream.clone_htod(&[0i32, 8, 16, 24, 32]).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n + 8).unwrap();
    let invalid = |r: Result<()>| match r {
        Err(Error::InvalidProblem(msg)) => msg,
        other => panic!("expected InvalidProblem, got {other:?}"),
    };
    let buffer = |r: Result<()>| match r {
        Err(Error::Buffer { name, detail }) => format!("{name}: {detail}"),
        other => panic!("expected a buffer error, got {other:?}"),
    };
    let short_a = Fp8Rows::zeros(&stream, max_rows - 1, k).unwrap();
    let msg = invalid(plan.launch(&stream, &short_a, &b, &offsets, &mut d, &mut ws, &mut st));
    assert!(msg.contains("max_rows"), "{msg}");
    let other_k = Fp8Rows::zeros(&stream, max_rows, k + 16).unwrap();
    assert!(invalid(plan.launch(&stream, &other_k, &b, &offsets, &mut d, &mut ws, &mut st)).contains("K = 256"));
    let fewer_experts = Fp8BlockWeights::from_host(&stream, &experts(g - 1, n, k, 92)).unwrap();
    let msg = invalid(plan.launch(&stream, &a, &fewer_experts, &offsets, &mut d, &mut ws, &mut st));
    assert!(msg.contains("[3, 128, 256]") && msg.contains("[4, 128, 256]"), "{msg}");
    let ids = stream.clone_htod(&[0i32; 4]).unwrap();
    let per_row = GroupRows::PerRow { experts: ids.as_view(), rows: 4, a_div: 1, num_experts: g };
    assert!(invalid(plan.launch(&stream, &a, &b, per_row, &mut d, &mut ws, &mut st)).contains("per-row"));
    let short_offsets = stream.clone_htod(&[0i32, 8, 16, 24]).unwrap();
    let msg = buffer(plan.launch(&stream, &a, &b, &short_offsets, &mut d, &mut ws, &mut st));
    assert!(msg.starts_with("offsets: ") && msg.contains("G + 1"), "{msg}");
    let msg = buffer(plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(0..max_rows * n - 1), &mut ws, &mut st));
    assert!(msg.starts_with("d: "), "{msg}");
    let msg = buffer(plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(1..max_rows * n + 1), &mut ws, &mut st));
    assert!(msg.starts_with("d: ") && msg.contains("16-byte"), "{msg}");
    let big_g = 256;
    let big = GroupedGemmFp8::new(&stream, GroupedGemmFp8Shape::new(big_g, n, k, max_rows).unwrap(), opts).unwrap();
    assert!(big.workspace_bytes() > plan.workspace_bytes());
    let big_b = Fp8BlockWeights::new(
        stream.alloc_zeros::<F8E4M3>(big_g * n * k).unwrap(),
        stream.alloc_zeros::<f32>(big_g * scale_blocks(n) * scale_blocks(k)).unwrap(),
        big_g,
        n,
        k,
    )
    .unwrap();
    let big_offsets = stream.alloc_zeros::<i32>(big_g + 1).unwrap();
    match big.launch(&stream, &a, &big_b, &big_offsets, &mut d, &mut ws, &mut st) {
        Err(Error::WorkspaceTooSmall { needed, got, .. }) => {
            assert_eq!((needed, got), (big.workspace_bytes() as u64, plan.workspace_bytes() as u64))
        }
        other => panic!("expected WorkspaceTooSmall, got {other:?}"),
    }
    // And the correct call works (zero activations: D is all zeros).
    plan.launch(&stream, &a, &b, &offsets, &mut d, &mut ws, &mut st).unwrap();
    st.check(&stream).unwrap();
    assert!(stream.clone_dtoh(&d).unwrap()[..max_rows * n].iter().all(|x| x.to_f32() == 0.0));
}

/// The launch path is graph-safe: captured once, replayed with new offsets written into the same buffer.
#[test]
#[ignore = "needs an SM90 GPU"]
fn graph_capture_replays_with_new_offsets() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (6usize, 256usize, 512usize, 600usize);
    let a_host = activations(max_rows, k, 101);
    let b_host = experts(g, n, k, 102);
    let a = Fp8Rows::from_host(&stream, &a_host).unwrap();
    let b = Fp8BlockWeights::from_host(&stream, &b_host).unwrap();
    let mut offsets = stream.alloc_zeros::<i32>(g + 1).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n + GUARD).unwrap();
    let plan =
        GroupedGemmFp8::new(&stream, GroupedGemmFp8Shape::new(g, n, k, max_rows).unwrap(), Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    stream.synchronize().unwrap();

    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");

    for replay in 0..6u64 {
        let total = 100 + 90 * replay as usize;
        let sizes = uniform_sizes(g, total, 200 + replay);
        stream.memcpy_htod(&offsets_from_sizes(&sizes).unwrap(), &mut offsets).unwrap();
        stream.memcpy_htod(&vec![bf16::NAN; max_rows * n + GUARD], &mut d).unwrap();
        graph.launch().unwrap();
        st.check(&stream).unwrap();
        let groups = Groups::Offsets { sizes, spare: max_rows - total };
        let (ext, _) = groups.extents();
        let pairs = checked_rows(&ext, replay);
        let reference = blockwise_fp8_rows(&a_host, &b_host, &pairs).unwrap();
        let report = compare(&ext, n, &pairs, &reference, &stream.clone_dtoh(&d).unwrap());
        assert!(report.is_clean(), "replay {replay} [{}]: {report:#?}", plan.config());
    }
}
