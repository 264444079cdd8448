//! Layout builds on the GPU against the CPU reference, on adversarial routing.

use moe_gemm::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use moe_gemm::reference::layouts::{self as reference, LayoutRef};
use moe_gemm::status::bits;
use moe_gemm::*;

use crate::common::*;

struct Built {
    got: LayoutRef,
    status: Result<()>,
}

fn gpu_layout(dims: LayoutDims, tokens: usize, ids: &[i32], map: Option<&[i32]>) -> Built {
    let (_ctx, stream) = gpu();
    let mut layout = ExpertLayout::new(&stream, dims).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let ids_dev = stream.clone_htod(ids).unwrap();
    let map_dev = map.map(|m| stream.clone_htod(m).unwrap());
    layout.build(&stream, tokens, &ids_dev, map_dev.as_ref().map(|m| m.as_view()).as_ref(), &mut st).unwrap();
    let status = st.check(&stream);
    let rows = tokens * dims.top_k();
    let dl = |s: &cudarc::driver::CudaSlice<i32>| stream.clone_dtoh(s).unwrap();
    let got = LayoutRef {
        counts: dl(layout.counts()),
        offsets: dl(layout.offsets()),
        sorted_ids: dl(layout.sorted_ids()),
        expert_ids: dl(layout.expert_ids()),
        m_indices: dl(layout.m_indices()),
        positions: dl(layout.positions())[..rows].to_vec(),
        total: dl(layout.total())[0],
        bad_id: false,
        overflow: false,
    };
    Built { got, status }
}

fn check(name: &str, dims: LayoutDims, tokens: usize, ids: &[i32], map: Option<&[i32]>) {
    let want = reference::build(&dims, tokens, ids, map);
    let Built { got, status } = gpu_layout(dims, tokens, ids, map);
    let ctx = format!("{name} ({:?}, T={tokens})", dims.spec());
    assert_eq!(got.counts, want.counts, "{ctx}: counts");
    assert_eq!(got.offsets, want.offsets, "{ctx}: offsets");
    assert_eq!(got.total, want.total, "{ctx}: total");
    assert_eq!(got.positions, want.positions, "{ctx}: positions");
    assert_eq!(got.sorted_ids, want.sorted_ids, "{ctx}: sorted_ids");
    assert_eq!(got.m_indices, want.m_indices, "{ctx}: m_indices");
    assert_eq!(got.expert_ids, want.expert_ids, "{ctx}: expert_ids");
    let word = match status {
        Ok(()) => 0,
        Err(Error::DeviceCheck { word, .. }) => word,
        Err(e) => panic!("{ctx}: {e}"),
    };
    assert_eq!(word & bits::EXPERT_ID_OUT_OF_RANGE != 0, want.bad_id, "{ctx}: bad-id report");
    assert_eq!(word & bits::CAPACITY_OVERFLOW != 0, want.overflow, "{ctx}: overflow report");
}

/// vLLM's `moe_align_block_size` docstring example, exactly.
#[test]
#[ignore = "needs an SM90 GPU"]
fn vllm_align_worked_example() {
    let ids = [2, 3, 4, 1, 2, 4, 1, 3, 4, 1, 2, 3];
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 4 }, 4, 3, 5, 5).unwrap();
    let Built { got, status } = gpu_layout(dims, 4, &ids, None);
    status.unwrap();
    assert_eq!(&got.sorted_ids[..16], &[3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]);
    assert_eq!(&got.expert_ids[..4], &[1, 2, 3, 4]);
    assert_eq!(got.total, 16);
    check("vllm example", dims, 4, &ids, None);
}

/// Routing that stresses the layouts: a cold expert, one hot expert, one expert taking every token, exact
/// multiples of BLOCK_M and one off, T = 1, T·k < E.
fn adversarial(e: usize, k: usize, block: usize) -> Vec<(&'static str, usize, Vec<i32>)> {
    let distinct = |first: usize| -> Vec<i32> { (0..k).map(|j| ((first + j) % e) as i32).collect() };
    let mut cases = Vec::new();
    // every token picks experts 1.. : expert 0 has zero rows, expert 1 takes every token
    let t = 3 * block + 1;
    cases.push(("expert 0 cold, expert 1 takes every token", t, (0..t).flat_map(|_| distinct(1)).collect()));
    // one hot expert (3) in slot 0, others spread
    let t = 200;
    let mut rng = Rng(11);
    cases.push((
        "one hot expert",
        t,
        (0..t)
            .flat_map(|_| {
                let mut v = vec![3i32];
                while v.len() < k {
                    let x = rng.below(e) as i32;
                    if !v.contains(&x) {
                        v.push(x);
                    }
                }
                v
            })
            .collect(),
    ));
    for (name, rows_per_expert) in
        [("BLOCK_M - 1 rows each", block - 1), ("BLOCK_M rows each", block), ("BLOCK_M + 1 rows each", block + 1)]
    {
        // rows_per_expert * e rows in all, each token picking k consecutive experts
        let t = rows_per_expert * e / k;
        if t > 0 {
            cases.push((name, t, (0..t).flat_map(|i| distinct(i * k)).collect()));
        }
    }
    cases.push(("T = 1", 1, distinct(5)));
    cases.push(("T·k < E", 2, (0..2).flat_map(|i| distinct(i * 7)).collect()));
    cases.push(("uniform", 513, (0..513).flat_map(|i| distinct(i * 31 + i / 3)).collect()));
    cases
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn layouts_match_the_reference_on_adversarial_routing() {
    let (e, k) = (32usize, 4usize);
    for block in [4usize, 16, 128] {
        for (name, t, ids) in adversarial(e, k, block) {
            for spec in
                [LayoutSpec::Grouped, LayoutSpec::Aligned { block_m: block }, LayoutSpec::Masked { max_m: t.max(1) }]
            {
                let dims = LayoutDims::new(spec, t.max(4), k, e, e).unwrap();
                check(name, dims, t, &ids, None);
            }
        }
    }
}

/// Batches of 33-1024 rows take the single-CTA build (each warp ranks a contiguous segment of up to two 32-row
/// steps: 1016 rows give every warp two steps, the last one partial; 1024 rows, the limit, two full ones), larger
/// ones the three-pass build over 256-row chunks (2040 rows: eight chunks, the last partial): the same arrays,
/// stable across warps and chunks.
#[test]
#[ignore = "needs an SM90 GPU"]
fn large_batches_match_the_reference() {
    let (e, k) = (256usize, 8usize);
    for t in [127usize, 128, 255, 512, 513, 4096, 5000] {
        let mut rng = Rng(t as u64);
        let mut ids: Vec<i32> = (0..t)
            .flat_map(|i| {
                // a skewed mix: expert 7 in every token, others uniform
                let mut v = vec![7i32];
                while v.len() < k {
                    let x = if i % 3 == 0 { rng.below(16) } else { rng.below(e) } as i32;
                    if !v.contains(&x) {
                        v.push(x);
                    }
                }
                v
            })
            .collect();
        if t == 127 || t == 255 {
            // out-of-range ids in two warps' segments (single CTA) or two chunks: dropped and reported
            ids[5] = e as i32;
            ids[if t == 127 { 900 } else { 1900 }] = -1;
        }
        for spec in [LayoutSpec::Grouped, LayoutSpec::Aligned { block_m: 128 }, LayoutSpec::Masked { max_m: t / 2 }] {
            let dims = LayoutDims::new(spec, t, k, e, e).unwrap();
            check("large", dims, t, &ids, None);
        }
        let map: Vec<i32> = (0..e).map(|x| if x % 4 == 0 { (x / 4) as i32 } else { -1 }).collect();
        check("large + map", LayoutDims::new(LayoutSpec::Grouped, t, k, e, e / 4).unwrap(), t, &ids, Some(&map));
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn half_the_experts_remote_via_expert_map() {
    let (e, k, t) = (32usize, 4usize, 300usize);
    // This device holds the odd experts, as local ids 0..16; even experts are remote (-1).
    let map: Vec<i32> = (0..e).map(|x| if x % 2 == 1 { (x / 2) as i32 } else { -1 }).collect();
    let mut rng = Rng(21);
    let ids: Vec<i32> = (0..t)
        .flat_map(|_| {
            let mut v: Vec<i32> = Vec::new();
            while v.len() < k {
                let x = rng.below(e) as i32;
                if !v.contains(&x) {
                    v.push(x);
                }
            }
            v
        })
        .collect();
    for spec in [LayoutSpec::Grouped, LayoutSpec::Aligned { block_m: 16 }, LayoutSpec::Masked { max_m: t }] {
        let dims = LayoutDims::new(spec, t, k, e, e / 2).unwrap();
        check("expert_map", dims, t, &ids, Some(&map));
    }
    let want = reference::build(&LayoutDims::new(LayoutSpec::Grouped, t, k, e, e / 2).unwrap(), t, &ids, Some(&map));
    assert!(want.positions.iter().filter(|&&p| p < 0).count() > t, "about half the rows are remote");
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn masked_capacity_overflow_is_reported_not_silent() {
    let (e, k, t) = (8usize, 2usize, 64usize);
    let ids: Vec<i32> = (0..t).flat_map(|i| [0, 1 + (i % 7) as i32]).collect(); // expert 0 gets 64 rows
    let dims = LayoutDims::new(LayoutSpec::Masked { max_m: 16 }, t, k, e, e).unwrap();
    check("overflow", dims, t, &ids, None);
    let Built { got, status } = gpu_layout(dims, t, &ids, None);
    assert_eq!(got.counts[0], 16, "masked_m is clamped to the capacity");
    assert!(matches!(status, Err(Error::DeviceCheck { word, .. }) if word & bits::CAPACITY_OVERFLOW != 0));
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn out_of_range_ids_are_dropped_and_reported() {
    let ids = [0, 1, 9, 2, -1, 3];
    let dims = LayoutDims::new(LayoutSpec::Aligned { block_m: 4 }, 3, 2, 8, 8).unwrap();
    check("bad ids", dims, 3, &ids, None);
}

/// Batches of at most 32 rows take the one-warp build (`build_layout_warp_kernel`), larger ones the 512-thread
/// one: both against the reference for every spec, with experts repeated (drawn from 6) or spread, a bad id, an
/// expert map, masked overflow and up to the 1024 experts a layout takes.
#[test]
#[ignore = "needs an SM90 GPU"]
fn tiny_batches_match_the_reference() {
    let mut rng = Rng(77);
    for (e, k) in [(8usize, 2usize), (128, 4), (128, 8), (1024, 8)] {
        for t in [1usize, 2, 3, 32 / k, 32 / k + 1] {
            for draw in [e.min(6), e] {
                let mut ids: Vec<i32> = (0..t * k).map(|_| rng.below(draw) as i32).collect();
                if t * k > 2 {
                    ids[1] = e as i32; // out of range: dropped and reported
                }
                let name = format!("E = {e}, {} rows from {draw} experts", t * k);
                // The odd experts local (as 0..E/2), the even ones remote.
                let map: Vec<i32> = (0..e).map(|x| if x % 2 == 1 { (x / 2) as i32 } else { -1 }).collect();
                for spec in [
                    LayoutSpec::Grouped,
                    LayoutSpec::Aligned { block_m: 16 },
                    LayoutSpec::Aligned { block_m: 128 },
                    LayoutSpec::Masked { max_m: 2 },
                ] {
                    check(&name, LayoutDims::new(spec, t, k, e, e).unwrap(), t, &ids, None);
                    let dims = LayoutDims::new(spec, t, k, e, e / 2).unwrap();
                    check(&format!("{name}, expert map"), dims, t, &ids, Some(&map));
                }
            }
        }
    }
}
