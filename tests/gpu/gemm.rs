//! Grouped GEMM on the GPU. Each case poisons D with NaN, launches, then compares every checked row token by token with the CPU
//! reference (f32 over the same 16-bit inputs), and checks that rows past `offsets[G]` and a guard region past
//! D are still poisoned (nothing written out of place).

use std::sync::Arc;

use crate::common::*;
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use moe_gemm::dtype::Element;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};
use moe_gemm::kernels::TileConfig;
use moe_gemm::layouts::offsets_from_sizes;
use moe_gemm::layouts::GroupRows;
use moe_gemm::reference::{first_mismatch, grouped_gemm_rows, Tolerance};
use moe_gemm::status::bits as error_bits;
use moe_gemm::*;

const GUARD: usize = 4096;

/// Which rows to compare with the reference.
#[derive(Clone, Copy)]
enum Check {
    All,
    /// First, last and one random row of every non-empty group.
    Sampled,
}

struct Case<'a> {
    name: &'a str,
    sizes: Vec<usize>,
    n: usize,
    k: usize,
    /// Rows of capacity past the groups' total, which must stay unwritten.
    spare_rows: usize,
    check: Check,
}

struct Device<T: Element> {
    a: CudaSlice<T>,
    b: CudaSlice<T>,
    d: CudaSlice<T>,
    offsets: CudaSlice<i32>,
}

fn rows_to_check(sizes: &[usize], check: Check, seed: u64) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    match check {
        Check::All => (0..total).collect(),
        Check::Sampled => {
            let mut rng = Rng(seed);
            let mut rows = Vec::new();
            let mut start = 0;
            for &s in sizes {
                if s > 0 {
                    rows.extend([start, start + s - 1, start + rng.below(s)]);
                }
                start += s;
            }
            rows.sort_unstable();
            rows.dedup();
            rows
        }
    }
}

fn upload<T: Element>(stream: &Arc<CudaStream>, case: &Case, a: &[T], b: &[T]) -> Device<T> {
    let max_rows = case.sizes.iter().sum::<usize>() + case.spare_rows;
    let d_host = vec![T::nan(); max_rows * case.n + GUARD];
    Device {
        a: stream.clone_htod(a).unwrap(),
        b: stream.clone_htod(b).unwrap(),
        d: stream.clone_htod(&d_host).unwrap(),
        offsets: stream.clone_htod(&offsets_from_sizes(&case.sizes).unwrap()).unwrap(),
    }
}

/// Compares D (downloaded) with the reference on the checked rows and verifies the poison past the groups.
fn verify<T: Element>(case: &Case, config: TileConfig, a: &[T], b: &[T], d: &[T]) {
    let total: usize = case.sizes.iter().sum();
    let max_rows = total + case.spare_rows;
    let rows = rows_to_check(&case.sizes, case.check, 7);
    let reference = grouped_gemm_rows(a, b, &case.sizes, case.n, case.k, &rows);
    let max_abs = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    let tol = Tolerance::for_output::<T>(max_abs);
    let got: Vec<f32> = rows.iter().flat_map(|&r| d[r * case.n..(r + 1) * case.n].iter().map(|x| x.to_f32())).collect();
    if let Some((i, g, r)) = first_mismatch(&got, &reference, tol) {
        panic!(
            "{} [{} {config}]: row {} col {}: got {g}, reference {r} (tolerance {:?})",
            case.name,
            T::DTYPE,
            rows[i / case.n],
            i % case.n,
            tol
        );
    }
    let untouched = d[total * case.n..].iter().position(|x| !x.to_f32().is_nan());
    if let Some(i) = untouched {
        let idx = total * case.n + i;
        let where_ = if idx < max_rows * case.n { "a row past offsets[G]" } else { "the guard region past D" };
        panic!("{} [{} {config}]: {where_} was written (element {idx})", case.name, T::DTYPE);
    }
}

fn run_case<T: Element>(case: &Case, configs: &[TileConfig]) {
    let (_ctx, stream) = gpu();
    let total: usize = case.sizes.iter().sum();
    let max_rows = total + case.spare_rows;
    let g = case.sizes.len();
    let a = random_vec::<T>(max_rows * case.k, 1, 1.0);
    let b = random_vec::<T>(g * case.n * case.k, 2, 1.0);
    let mut dev = upload(&stream, case, &a, &b);
    let shape = GroupedGemmShape::new(g, case.n, case.k, max_rows).unwrap();
    for &config in configs {
        let plan =
            GroupedGemm::<T>::new(&stream, shape, GroupedGemmOptions { config: Some(config), ..Default::default() })
                .unwrap();
        let mut ws = plan.alloc_workspace(&stream).unwrap();
        let mut st = DeviceStatus::new(&stream).unwrap();
        stream.memcpy_htod(&vec![T::nan(); max_rows * case.n + GUARD], &mut dev.d).unwrap();
        let mut d_view = dev.d.slice_mut(0..max_rows * case.n);
        plan.launch(&stream, &dev.a, &dev.b, &dev.offsets, &mut d_view, &mut ws, &mut st).unwrap();
        st.check(&stream).unwrap();
        let d = stream.clone_dtoh(&dev.d).unwrap();
        verify(case, config, &a, &b, &d);
    }
}

fn boundary_case(name: &str) -> Case<'_> {
    Case { name, sizes: vec![0, 1, 7, 63, 64, 65, 127, 128, 129], n: 256, k: 512, spare_rows: 5, check: Check::All }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn boundary_group_sizes_bf16_every_config() {
    run_case::<bf16>(&boundary_case("sizes 0,1,7,63,64,65,127,128,129"), &TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn boundary_group_sizes_f16_every_config() {
    run_case::<f16>(&boundary_case("sizes 0,1,7,63,64,65,127,128,129"), &TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn one_group_holds_every_row() {
    let case = Case {
        name: "one group",
        sizes: vec![0, 0, 0, 300, 0, 0, 0, 0],
        n: 128,
        k: 256,
        spare_rows: 3,
        check: Check::All,
    };
    run_case::<bf16>(&case, &TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn all_groups_empty_write_nothing() {
    let case = Case { name: "all empty", sizes: vec![0; 16], n: 128, k: 128, spare_rows: 64, check: Check::All };
    run_case::<bf16>(&case, &TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn unaligned_k_and_odd_n_tiles() {
    // N and K multiples of 8 but not of the tiles: partial tiles on both edges.
    let case =
        Case { name: "partial tiles", sizes: vec![3, 130, 0, 77], n: 200, k: 136, spare_rows: 0, check: Check::All };
    run_case::<bf16>(&case, &TileConfig::ALL);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn real_shape_mixtral_w1_uniform_routing() {
    // Mixtral-8x7B GEMM1 (w13): E 8, N = 2 x 14336, K 4096; 512 tokens x top-2.
    let case = Case {
        name: "mixtral w13",
        sizes: uniform_sizes(8, 1024, 3),
        n: 28672,
        k: 4096,
        spare_rows: 0,
        check: Check::Sampled,
    };
    run_case::<bf16>(&case, &[TileConfig::heuristic(8, 28672, 1024, 132), TileConfig::Pingpong64x64x128]);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn real_shape_deepseek_v3_w13_uniform_routing() {
    // DeepSeek-V3 GEMM1: E 256, N = 2 x 2048, K 7168; 512 tokens x top-8, uniform routing.
    let case = Case {
        name: "deepseek-v3 w13",
        sizes: uniform_sizes(256, 4096, 4),
        n: 4096,
        k: 7168,
        spare_rows: 0,
        check: Check::Sampled,
    };
    run_case::<bf16>(&case, &[TileConfig::Pingpong64x128x64, TileConfig::Cooperative128x256x64]);
}

/// Offsets that break the contract are clamped on the device and reported, never followed out of bounds.
#[test]
#[ignore = "needs an SM90 GPU"]
fn invalid_offsets_are_reported_and_contained() {
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (3usize, 64usize, 64usize, 20usize);
    let shape = GroupedGemmShape::new(g, n, k, max_rows).unwrap();
    let plan = GroupedGemm::<bf16>::new(&stream, shape, Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = stream.clone_htod(&random_vec::<bf16>(max_rows * k, 5, 1.0)).unwrap();
    let b = stream.clone_htod(&random_vec::<bf16>(g * n * k, 6, 1.0)).unwrap();
    let cases: [(&[i32], u32); 4] = [
        (&[0, 10, 5, 20], error_bits::OFFSETS_NOT_MONOTONE),
        (&[0, 10, 15, 4000], error_bits::OFFSETS_OUT_OF_RANGE),
        (&[3, 10, 15, 20], error_bits::OFFSETS_NOT_ZERO_BASED),
        (&[0, -8, 15, 20], error_bits::OFFSETS_NOT_MONOTONE | error_bits::OFFSETS_OUT_OF_RANGE),
    ];
    for (offsets, want) in cases {
        let offsets_dev = stream.clone_htod(offsets).unwrap();
        let mut d = stream.clone_htod(&vec![bf16::NAN; max_rows * n + GUARD]).unwrap();
        let mut d_view = d.slice_mut(0..max_rows * n);
        plan.launch(&stream, &a, &b, &offsets_dev, &mut d_view, &mut ws, &mut st).unwrap();
        match st.check(&stream) {
            Err(Error::DeviceCheck { word, .. }) => {
                assert_eq!(word & want, want, "offsets {offsets:?}: word {word:#x}")
            }
            other => panic!("offsets {offsets:?}: expected a device check error, got {other:?}"),
        }
        let d_host = stream.clone_dtoh(&d).unwrap();
        assert!(d_host[max_rows * n..].iter().all(|x| x.is_nan()), "offsets {offsets:?}: guard past D was written");
        // The word was cleared by the check: a valid launch afterwards is clean.
        let ok = stream.clone_htod(&[0i32, 5, 10, 20]).unwrap();
        plan.launch(&stream, &a, &b, &ok, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
        st.check(&stream).unwrap();
    }
}

/// The launch path is graph-safe: captured once, replayed with new offsets written into the same buffer.
#[test]
#[ignore = "needs an SM90 GPU"]
fn graph_capture_replays_with_new_offsets() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (8usize, 256usize, 256usize, 600usize);
    let a_host = random_vec::<bf16>(max_rows * k, 8, 1.0);
    let b_host = random_vec::<bf16>(g * n * k, 9, 1.0);
    let a = stream.clone_htod(&a_host).unwrap();
    let b = stream.clone_htod(&b_host).unwrap();
    let mut offsets = stream.alloc_zeros::<i32>(g + 1).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n).unwrap();
    let plan = GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(g, n, k, max_rows).unwrap(), Default::default())
        .unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    stream.synchronize().unwrap();

    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    plan.launch(&stream, &a, &b, &offsets, &mut d, &mut ws, &mut st).unwrap();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");

    for replay in 0..10u64 {
        let rows = 100 + 50 * replay as usize;
        let sizes = uniform_sizes(g, rows, 100 + replay);
        stream.memcpy_htod(&offsets_from_sizes(&sizes).unwrap(), &mut offsets).unwrap();
        stream.memcpy_htod(&vec![bf16::NAN; max_rows * n], &mut d).unwrap();
        graph.launch().unwrap();
        st.check(&stream).unwrap();
        let d_host = stream.clone_dtoh(&d).unwrap();
        let case = Case { name: "graph replay", sizes, n, k, spare_rows: max_rows - rows, check: Check::All };
        // verify() expects a guard region; give it an empty one by checking only up to max_rows.
        let mut padded = d_host;
        padded.extend(std::iter::repeat_n(bf16::NAN, GUARD));
        verify(&case, plan.config(), &a_host, &b_host, &padded);
    }
}

/// Launch-time checks: every buffer that does not fit the plan is refused with an error naming it.
#[test]
#[ignore = "needs an SM90 GPU"]
fn launch_rejects_buffers_that_do_not_fit_the_plan() {
    let (_ctx, stream) = gpu();
    let (g, n, k, max_rows) = (4usize, 64usize, 64usize, 32usize);
    let plan = GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(g, n, k, max_rows).unwrap(), Default::default())
        .unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = stream.alloc_zeros::<bf16>(max_rows * k).unwrap();
    let b = stream.alloc_zeros::<bf16>(g * n * k).unwrap();
    let offsets = stream.clone_htod(&[0i32, 8, 16, 24, 32]).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n + 8).unwrap();
    let name_of = |r: Result<()>| match r {
        Err(Error::Buffer { name, detail }) => format!("{name}: {detail}"),
        other => panic!("expected a buffer error, got {other:?}"),
    };
    let short_a = stream.alloc_zeros::<bf16>(max_rows * k - 1).unwrap();
    assert!(name_of(plan.launch(&stream, &short_a, &b, &offsets, &mut d, &mut ws, &mut st)).starts_with("a: "));
    let short_b = stream.alloc_zeros::<bf16>(g * n * k - 8).unwrap();
    assert!(name_of(plan.launch(&stream, &a, &short_b, &offsets, &mut d, &mut ws, &mut st)).starts_with("b: "));
    let short_offsets = stream.clone_htod(&[0i32, 8, 16, 24]).unwrap();
    let msg = name_of(plan.launch(&stream, &a, &b, &short_offsets, &mut d, &mut ws, &mut st));
    assert!(msg.starts_with("offsets: ") && msg.contains("G + 1"), "{msg}");
    let msg = name_of(plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(0..max_rows * n - 1), &mut ws, &mut st));
    assert!(msg.starts_with("d: "), "{msg}");
    // A view one element in: 2-byte aligned, not 16.
    let msg = name_of(plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(1..max_rows * n + 1), &mut ws, &mut st));
    assert!(msg.starts_with("d: ") && msg.contains("16-byte"), "{msg}");
    // The workspace of a plan with fewer groups is too small for one with many.
    let big_g = 256;
    let big =
        GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(big_g, n, k, max_rows).unwrap(), Default::default())
            .unwrap();
    assert!(big.workspace_bytes() > plan.workspace_bytes());
    let big_b = stream.alloc_zeros::<bf16>(big_g * n * k).unwrap();
    let big_offsets = stream.alloc_zeros::<i32>(big_g + 1).unwrap();
    match big.launch(&stream, &a, &big_b, &big_offsets, &mut d, &mut ws, &mut st) {
        Err(Error::WorkspaceTooSmall { needed, got, .. }) => {
            assert_eq!((needed, got), (big.workspace_bytes() as u64, plan.workspace_bytes() as u64))
        }
        other => panic!("expected WorkspaceTooSmall, got {other:?}"),
    }
    // And the correct call works.
    plan.launch(&stream, &a, &b, &offsets, &mut d, &mut ws, &mut st).unwrap();
    st.check(&stream).unwrap();
}

/// One group per output row, B picked by expert id, A rows shared by the k slots of a token.
#[test]
#[ignore = "needs an SM90 GPU"]
fn per_row_groups_pick_their_expert() {
    let (_ctx, stream) = gpu();
    let (e, n, k_dim, tokens, top_k) = (6usize, 128usize, 256usize, 5usize, 3usize);
    let rows = tokens * top_k;
    let x = random_vec::<bf16>(tokens * k_dim, 61, 1.0);
    let w = random_vec::<bf16>(e * n * k_dim, 62, 1.0);
    let ids: Vec<i32> = (0..rows).map(|r| ((r * 5 + r / 3) % e) as i32).collect();
    let shape = GroupedGemmShape::new(rows, n, k_dim, rows).unwrap();
    let plan = GroupedGemm::<bf16>::new(&stream, shape, Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (xd, wd, idd) =
        (stream.clone_htod(&x).unwrap(), stream.clone_htod(&w).unwrap(), stream.clone_htod(&ids).unwrap());
    let mut d = stream.clone_htod(&vec![bf16::NAN; rows * n]).unwrap();
    let rows_desc = GroupRows::PerRow { experts: idd.as_view(), rows, a_div: top_k, num_experts: e };
    plan.launch(&stream, &xd, &wd, rows_desc, &mut d, &mut ws, &mut st).unwrap();
    st.check(&stream).unwrap();
    let got: Vec<f32> = stream.clone_dtoh(&d).unwrap().iter().map(|v| v.to_f32()).collect();
    let want: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let (t, ex) = (r / top_k, ids[r] as usize);
            let (x, w) = (&x, &w);
            (0..n).map(move |c| {
                (0..k_dim).map(|i| x[t * k_dim + i].to_f32() * w[(ex * n + c) * k_dim + i].to_f32()).sum::<f32>()
            })
        })
        .collect();
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(first_mismatch(&got, &want, Tolerance::for_output::<bf16>(max)), None);
    // An expert id out of range computes nothing for that row and is reported.
    let mut bad = ids.clone();
    bad[4] = 99;
    let badd = stream.clone_htod(&bad).unwrap();
    let rows_desc = GroupRows::PerRow { experts: badd.as_view(), rows, a_div: top_k, num_experts: e };
    plan.launch(&stream, &xd, &wd, rows_desc, &mut d, &mut ws, &mut st).unwrap();
    assert!(
        matches!(st.check(&stream), Err(Error::DeviceCheck { word, .. }) if word & moe_gemm::status::bits::GROUP_COUNT_OUT_OF_RANGE != 0)
    );
}
