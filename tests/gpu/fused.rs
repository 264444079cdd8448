//! The fused MoE GEMMs (gather in GEMM1's loads, weight + bias + scatter in GEMM2's epilogue) against an f64
//! CPU reference, row by row, for every tile (the wgmma and the decode ones): padding rows, N and K residues, hot and empty experts, expert
//! parallelism, and a layout of the wrong block size refused.

use half::{bf16, f16};
use moe_gemm::dtype::Element;
use moe_gemm::kernels::fused::{FusedBatch, FusedGemm, FusedTile};
use moe_gemm::layer::GateUp;
use moe_gemm::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use moe_gemm::reference::{first_mismatch, Tolerance};
use moe_gemm::*;

use crate::common::*;

struct Case {
    name: &'static str,
    tokens: usize,
    top_k: usize,
    experts: usize,
    /// GEMM1: n1 x k1 (n1 = 2I, k1 = H); GEMM2: n2 x k2 (n2 = H, k2 = I).
    n1: usize,
    k1: usize,
    ids: Vec<i32>,
    map: Option<Vec<i32>>,
}

fn dot<T: Element>(a: &[T], b: &[T]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.to_f32() as f64 * y.to_f32() as f64).sum()
}

fn run_case<T: Element>(c: &Case, tile: FusedTile) {
    let (_ctx, stream) = gpu();
    let (t, k) = (c.tokens, c.top_k);
    let rows = t * k;
    let local = c.map.as_ref().map_or(c.experts, |m| m.iter().filter(|&&l| l >= 0).count());
    let (n1, k1) = (c.n1, c.k1);
    let (n2, k2) = (k1, n1 / 2);
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: tile.block_m() }, t, k, c.experts, local).unwrap();
    let cap = dims.capacity();
    let mut layout = ExpertLayout::new(&stream, dims).unwrap();
    let mut status = DeviceStatus::new(&stream).unwrap();
    let ids_d = stream.clone_htod(&c.ids).unwrap();
    let map_d = c.map.as_ref().map(|m| stream.clone_htod(m).unwrap());
    layout.build(&stream, t, &ids_d, map_d.as_ref().map(|m| m.as_view()).as_ref(), &mut status).unwrap();

    let x = random_vec::<T>(t * k1, 1, 1.0);
    let w1 = random_vec::<T>(local * n1 * k1, 2, 0.2);
    let h = random_vec::<T>(cap * k2, 3, 1.0);
    let w2 = random_vec::<T>(local * n2 * k2, 4, 0.2);
    let mut rng = Rng(5);
    let weights: Vec<f32> = (0..rows).map(|_| rng.unit().abs() + 0.1).collect();
    let bias: Vec<f32> = (0..local * n2).map(|_| rng.unit()).collect();
    let (xd, w1d, hd, w2d) = (
        stream.clone_htod(&x).unwrap(),
        stream.clone_htod(&w1).unwrap(),
        stream.clone_htod(&h).unwrap(),
        stream.clone_htod(&w2).unwrap(),
    );
    let (wd, bd) = (stream.clone_htod(&weights).unwrap(), stream.clone_htod(&bias).unwrap());
    let mut d1 = stream.clone_htod(&vec![T::nan(); cap * n1]).unwrap();
    let mut pairs = stream.clone_htod(&vec![T::nan(); rows * n2]).unwrap();
    let fused = FusedGemm::new(&stream).unwrap();
    // A wrong routing hint (every id moved to the next expert, the first out of range) moves no result: the
    // GEMMs read the built layout, the hint only the Decode16 GEMM1's L2 prefetch (batches of at most 32 rows).
    let hint: Vec<i32> =
        c.ids.iter().enumerate().map(|(i, &g)| if i == 0 { -7 } else { (g + 1) % c.experts as i32 }).collect();
    let hint_d = stream.clone_htod(&hint).unwrap();
    let hint_v = hint_d.as_view();
    let b = FusedBatch::new(&stream, tile, &layout, t);
    let b = if c.map.is_none() { b.routed_by(&hint_v) } else { b };
    fused.gemm1_gather(b, &xd, &w1d, (n1, k1), &mut d1).unwrap();
    fused.gemm2_scatter(b, &hd, &w2d, (n2, k2), (&wd.as_view(), Some(&bd)), &mut pairs).unwrap();
    status.check(&stream).unwrap();
    let d1 = stream.clone_dtoh(&d1).unwrap();
    let pairs = stream.clone_dtoh(&pairs).unwrap();
    let sorted = stream.clone_dtoh(layout.sorted_ids()).unwrap();
    let experts_of_tile = stream.clone_dtoh(layout.expert_ids()).unwrap();
    let total = stream.clone_dtoh(layout.total()).unwrap()[0] as usize;
    let positions = stream.clone_dtoh(layout.positions()).unwrap();
    let bm = tile.block_m();
    let tol = Tolerance { atol: 2e-2, rtol: 1.0 / 128.0 };
    let what = format!("{} [{}, {:?}]", c.name, tile.name(), T::DTYPE);

    // GEMM1: every used position holds its token's row times its tile's expert; padding rows are zeros.
    let mut want1 = vec![0f32; total * n1];
    for p in 0..total {
        let r = sorted[p];
        if r < 0 || r as usize >= rows {
            continue;
        }
        let e = experts_of_tile[p / bm] as usize;
        let xr = &x[(r as usize / k) * k1..][..k1];
        for n in 0..n1 {
            want1[p * n1 + n] = dot(xr, &w1[(e * n1 + n) * k1..][..k1]) as f32;
        }
    }
    let got1: Vec<f32> = d1[..total * n1].iter().map(|v| v.to_f32()).collect();
    if let Some((i, g, w)) = first_mismatch(&got1, &want1, tol) {
        panic!("{what}: GEMM1 position {} column {}: got {g}, reference {w}", i / n1, i % n1);
    }
    // GEMM2: each placed (token, slot) row holds w * (round(h[p] . W2[e]) + b2[e]); remote rows stay unwritten.
    let mut placed = 0;
    for r in 0..rows {
        let got = &pairs[r * n2..][..n2];
        let p = positions[r];
        if p < 0 {
            assert!(got.iter().all(|v| v.to_f32().is_nan()), "{what}: row {r} of a remote expert was written");
            continue;
        }
        placed += 1;
        let p = p as usize;
        assert_eq!(sorted[p] as usize, r, "{what}: layout maps position {p} back to another row");
        let e = experts_of_tile[p / bm] as usize;
        let hr = &h[p * k2..][..k2];
        let want: Vec<f32> = (0..n2)
            .map(|n| {
                let d = T::from_f32(dot(hr, &w2[(e * n2 + n) * k2..][..k2]) as f32).to_f32() as f64;
                ((d + bias[e * n2 + n] as f64) * weights[r] as f64) as f32
            })
            .collect();
        let got: Vec<f32> = got.iter().map(|v| v.to_f32()).collect();
        if let Some((i, g, w)) = first_mismatch(&got, &want, tol) {
            panic!("{what}: GEMM2 row {r} column {i}: got {g}, reference {w}");
        }
    }
    let expect_placed = c.ids.iter().filter(|&&g| c.map.as_ref().is_none_or(|m| m[g as usize] >= 0)).count();
    assert_eq!(placed, expect_placed, "{what}: placed rows");
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn fused_gemms_match_the_reference_for_every_tile() {
    let hot: Vec<i32> =
        random::topk_ids(300, 1, 15, 7).iter().flat_map(|&x| [4, if x >= 4 { x + 1 } else { x }]).collect();
    let map: Vec<i32> = (0..16i32).map(|g| if g % 2 == 1 { g / 2 } else { -1 }).collect();
    let cases = [
        Case { name: "T=1", tokens: 1, top_k: 2, experts: 8, n1: 256, k1: 128, ids: vec![6, 1], map: None },
        // N = 2 x 136 and K = 200 leave partial tiles in both dimensions.
        Case {
            name: "N and K residues",
            tokens: 70,
            top_k: 2,
            experts: 8,
            n1: 272,
            k1: 200,
            ids: random::topk_ids(70, 2, 8, 8),
            map: None,
        },
        // The decode tiles' GEMM1 splits K = 1000 over 2 warps (16 steps, the last one partial); GEMM2 (K = 1024)
        // does not split.
        Case {
            name: "split K",
            tokens: 5,
            top_k: 2,
            experts: 8,
            n1: 2048,
            k1: 1000,
            ids: random::topk_ids(5, 2, 8, 10),
            map: None,
        },
        // Few blocks and long K in both GEMMs: the decode tiles split GEMM1 (K = 2056, 33 steps) over 4 warps, and
        // GEMM2 (K = I = 4104, 65 steps; 65 weight-row tasks x 8 blocks x 2 < 1056 resident warps) over 4 too;
        // both end in a partial step.
        Case {
            name: "split K over 4 warps",
            tokens: 5,
            top_k: 2,
            experts: 8,
            n1: 8208,
            k1: 2056,
            ids: random::topk_ids(5, 2, 8, 12),
            map: None,
        },
        // More tasks than the SMs hold warps at once: several waves of decode tasks.
        Case {
            name: "many tasks per warp",
            tokens: 256,
            top_k: 4,
            experts: 32,
            n1: 3072,
            k1: 192,
            ids: random::topk_ids(256, 4, 32, 11),
            map: None,
        },
        Case {
            name: "one hot expert, 300 rows on it (several tiles), expert 0 empty",
            tokens: 300,
            top_k: 2,
            experts: 16,
            n1: 128,
            k1: 136,
            ids: hot.iter().map(|&e| if e == 0 { 3 } else { e }).collect(),
            map: None,
        },
        // A hot expert (100 rows: the merged tile's 64-position run, then 48) with long K in GEMM1 (1096: 18
        // steps, the last of 8 elements) and partial weight-row chunks in both GEMMs (400 = 3 x 128 + 16).
        Case {
            name: "one hot expert, long K",
            tokens: 100,
            top_k: 2,
            experts: 8,
            n1: 400,
            k1: 1096,
            ids: random::topk_ids(100, 1, 7, 13).iter().flat_map(|&x| [4, if x >= 4 { x + 1 } else { x }]).collect(),
            map: None,
        },
        Case {
            name: "expert-parallel slice (odd experts of 16)",
            tokens: 90,
            top_k: 4,
            experts: 16,
            n1: 256,
            k1: 128,
            ids: random::topk_ids(90, 4, 16, 9),
            map: Some(map),
        },
    ];
    for tile in FusedTile::ALL {
        for c in &cases {
            run_case::<bf16>(c, tile);
        }
        run_case::<f16>(&cases[1], tile);
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn fused_gemm_refuses_a_layout_of_another_block_size() {
    let (_ctx, stream) = gpu();
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 128 }, 4, 2, 8, 8).unwrap();
    let layout = ExpertLayout::new(&stream, dims).unwrap();
    let x = stream.alloc_zeros::<bf16>(4 * 64).unwrap();
    let w = stream.alloc_zeros::<bf16>(8 * 128 * 64).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(dims.capacity() * 128).unwrap();
    let fused = FusedGemm::new(&stream).unwrap();
    let b = FusedBatch::new(&stream, FusedTile::M64N128K64, &layout, 4);
    let err = fused.gemm1_gather(b, &x, &w, (128, 64), &mut d).unwrap_err();
    assert!(err.to_string().contains("block_m = 64"), "{err}");
    let b = FusedBatch::new(&stream, FusedTile::M128N256K64, &layout, 4);
    let err = fused.gemm1_gather(b, &x, &w, (128, 60), &mut d).unwrap_err();
    assert!(err.to_string().contains("multiples of 8"), "{err}");
    // A routing hint shorter than the batch's tokens x top_k rows.
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 16 }, 4, 2, 8, 8).unwrap();
    let layout = ExpertLayout::new(&stream, dims).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(dims.capacity() * 128).unwrap();
    let short = stream.alloc_zeros::<i32>(7).unwrap();
    let short = short.as_view();
    let b = FusedBatch::new(&stream, FusedTile::Decode16, &layout, 4).routed_by(&short);
    let err = fused.gemm1_gather(b, &x, &w, (128, 64), &mut d).unwrap_err();
    assert!(err.to_string().contains("topk_ids"), "{err}");
}

/// The decode tiles' gated epilogue: `h` against the activation, computed on the host from the same tile's plain
/// GEMM1 output `d1` (so that only the epilogue is under test), for both gated activations and both gate/up
/// orders, with `b13`; padding positions stay unwritten; the warpgroup tiles and the plain SiLU are refused.
#[test]
#[ignore = "needs an SM90 GPU"]
fn gated_epilogue_matches_the_activation_of_gemm1() {
    let (_ctx, stream) = gpu();
    let (t, k, e, inter, kdim) = (40usize, 2usize, 8usize, 136usize, 200usize);
    let n = 2 * inter;
    let ids = random::topk_ids(t, k, e, 12);
    let ids_d = stream.clone_htod(&ids).unwrap();
    let x = random_vec::<bf16>(t * kdim, 13, 1.0);
    let w = random_vec::<bf16>(e * n * kdim, 14, 0.2);
    let mut rng = Rng(15);
    let bias: Vec<f32> = (0..e * n).map(|_| rng.unit()).collect();
    let (xd, wd, bd) =
        (stream.clone_htod(&x).unwrap(), stream.clone_htod(&w).unwrap(), stream.clone_htod(&bias).unwrap());
    let fused = FusedGemm::new(&stream).unwrap();
    let silu = |v: f64| v / (1.0 + (-v).exp());
    for tile in [FusedTile::Decode16, FusedTile::Decode32, FusedTile::DecodeMerged] {
        let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: tile.block_m() }, t, k, e, e).unwrap();
        let cap = dims.capacity();
        let mut layout = ExpertLayout::new(&stream, dims).unwrap();
        let mut status = DeviceStatus::new(&stream).unwrap();
        layout.build(&stream, t, &ids_d, None, &mut status).unwrap();
        let mut d1 = stream.clone_htod(&vec![bf16::NAN; cap * n]).unwrap();
        let b = FusedBatch::new(&stream, tile, &layout, t);
        fused.gemm1_gather(b, &xd, &wd, (n, kdim), &mut d1).unwrap();
        let d1 = stream.clone_dtoh(&d1).unwrap();
        let sorted = stream.clone_dtoh(layout.sorted_ids()).unwrap();
        let experts_of_block = stream.clone_dtoh(layout.expert_ids()).unwrap();
        let total = stream.clone_dtoh(layout.total()).unwrap()[0] as usize;
        for act in [Activation::SiluGated, Activation::GptOssSwiglu] {
            for gate_up in [GateUp::Concatenated, GateUp::Interleaved] {
                let what = format!("{} {act:?} {gate_up:?}", tile.name());
                let mut h = stream.clone_htod(&vec![bf16::NAN; cap * inter]).unwrap();
                fused.gemm1_gather_gated(b, (&xd, &wd, Some(&bd)), (n, kdim), (act, gate_up), &mut h).unwrap();
                status.check(&stream).unwrap();
                let h = stream.clone_dtoh(&h).unwrap();
                for p in 0..cap {
                    let r = if p < total { sorted[p] } else { -1 };
                    let row = &h[p * inter..][..inter];
                    if r < 0 || r as usize >= t * k {
                        assert!(row.iter().all(|v| v.is_nan()), "{what}: padding position {p} was written");
                        continue;
                    }
                    let ex = experts_of_block[p / tile.block_m()] as usize;
                    let want: Vec<f32> = (0..inter)
                        .map(|i| {
                            let (gi, ui) = match gate_up {
                                GateUp::Concatenated => (i, inter + i),
                                _ => (2 * i, 2 * i + 1),
                            };
                            let g = d1[p * n + gi].to_f32() as f64 + bias[ex * n + gi] as f64;
                            let u = d1[p * n + ui].to_f32() as f64 + bias[ex * n + ui] as f64;
                            (match act {
                                Activation::SiluGated => silu(g) * u,
                                _ => {
                                    let (g, u) = (g.min(7.0), u.clamp(-7.0, 7.0));
                                    (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
                                }
                            }) as f32
                        })
                        .collect();
                    let got: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
                    if let Some((i, g, w)) = first_mismatch(&got, &want, Tolerance { atol: 1e-3, rtol: 1.0 / 128.0 }) {
                        panic!("{what}: position {p} output {i}: got {g}, reference {w}");
                    }
                }
            }
        }
        let mut h = stream.alloc_zeros::<bf16>(cap * inter).unwrap();
        let act = (Activation::Silu, GateUp::Concatenated);
        let err = fused.gemm1_gather_gated(b, (&xd, &wd, None), (n, kdim), act, &mut h).unwrap_err();
        assert!(err.to_string().contains("gated activation"), "{err}");
    }
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 64 }, t, k, e, e).unwrap();
    let layout = ExpertLayout::new(&stream, dims).unwrap();
    let mut h = stream.alloc_zeros::<bf16>(dims.capacity() * inter).unwrap();
    let act = (Activation::SiluGated, GateUp::Concatenated);
    let b = FusedBatch::new(&stream, FusedTile::M64N128K64, &layout, t);
    let err = fused.gemm1_gather_gated(b, (&xd, &wd, None), (n, kdim), act, &mut h).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("fused-64x128x64") && msg.contains("decode tiles"), "{msg}");
}

/// The gated pair's hand-off (the merged tile, GEMM2 launched early): h and the pairs equal those of the two
/// GEMMs launched apart, bit for bit; each run's first block counted exactly I written h columns (I = 136: a
/// last task of 8 columns) and every other block none; the next layout build zeroes the counts. A hot expert
/// (10 blocks: an 8-block run on the 128-position path and a 2-block one), an empty one and spread rows.
#[test]
#[ignore = "needs an SM90 GPU"]
fn the_gated_pair_hands_off_per_block_and_a_build_zeroes_the_counts() {
    let (_ctx, stream) = gpu();
    let (t, k, e, inter, hidden) = (150usize, 2usize, 8usize, 136usize, 200usize);
    let n = 2 * inter;
    // Slot 0: expert 0 (150 rows, ten blocks of 16); slot 1: experts 1-6 in turn (25 rows each); expert 7 empty.
    let ids: Vec<i32> = (0..t).flat_map(|i| [0, 1 + (i % 6) as i32]).collect();
    let ids_d = stream.clone_htod(&ids).unwrap();
    let x = stream.clone_htod(&random_vec::<bf16>(t * hidden, 21, 1.0)).unwrap();
    let w13 = stream.clone_htod(&random_vec::<bf16>(e * n * hidden, 22, 0.2)).unwrap();
    let w2 = stream.clone_htod(&random_vec::<bf16>(e * hidden * inter, 23, 0.2)).unwrap();
    let mut rng = Rng(24);
    let weights: Vec<f32> = (0..t * k).map(|_| rng.unit().abs() + 0.1).collect();
    let weights = stream.clone_htod(&weights).unwrap();
    let tile = FusedTile::DecodeMerged;
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: tile.block_m() }, t, k, e, e).unwrap();
    let cap = dims.capacity();
    let mut layout = ExpertLayout::new(&stream, dims).unwrap();
    let mut status = DeviceStatus::new(&stream).unwrap();
    layout.build(&stream, t, &ids_d, None, &mut status).unwrap();
    let fused = FusedGemm::new(&stream).unwrap();
    let act = (Activation::SiluGated, GateUp::Concatenated);
    let mut h_apart = stream.clone_htod(&vec![bf16::ZERO; cap * inter]).unwrap();
    let mut pairs_apart = stream.clone_htod(&vec![bf16::ZERO; t * k * hidden]).unwrap();
    let b = FusedBatch::new(&stream, tile, &layout, t);
    fused.gemm1_gather_gated(b, (&x, &w13, None), (n, hidden), act, &mut h_apart).unwrap();
    let wv = weights.as_view();
    fused.gemm2_scatter(b, &h_apart, &w2, (hidden, inter), (&wv, None), &mut pairs_apart).unwrap();
    let mut h = stream.clone_htod(&vec![bf16::ZERO; cap * inter]).unwrap();
    let mut pairs = stream.clone_htod(&vec![bf16::ZERO; t * k * hidden]).unwrap();
    fused.gated_pair(b, (&x, &w13, None), (hidden, inter), act, &mut h, (&w2, &wv, None), &mut pairs).unwrap();
    status.check(&stream).unwrap();
    let bits = |s: &cudarc::driver::CudaSlice<bf16>| -> Vec<u16> {
        stream.clone_dtoh(s).unwrap().iter().map(|v| v.to_bits()).collect()
    };
    assert!(bits(&h) == bits(&h_apart), "h of the pair differs from GEMM1's alone");
    assert!(bits(&pairs) == bits(&pairs_apart), "the pair's GEMM2 output differs from GEMM2's alone");

    let counts = stream.clone_dtoh(layout.block_ready()).unwrap();
    let offsets = stream.clone_dtoh(layout.offsets()).unwrap();
    let experts_of_block = stream.clone_dtoh(layout.expert_ids()).unwrap();
    let total = stream.clone_dtoh(layout.total()).unwrap()[0] as usize;
    let mut runs = 0;
    for (b, &c) in counts.iter().enumerate() {
        let first = b * 16 < total && {
            let ex = experts_of_block[b] as usize;
            (b - offsets[ex] as usize / 16) % 8 == 0
        };
        runs += first as usize;
        assert_eq!(c, if first { inter as i32 } else { 0 }, "block {b}: h columns counted");
    }
    assert_eq!(runs, 8, "expert 0's two runs and one run per expert 1-6");
    layout.build(&stream, t, &ids_d, None, &mut status).unwrap();
    assert!(stream.clone_dtoh(layout.block_ready()).unwrap().iter().all(|&c| c == 0), "a build left counts");
}
