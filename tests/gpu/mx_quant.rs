//! MXFP8 activations in the SM100 block-scale layout, built on the device per group (`quant::quantize_mxfp8_grouped`,
//! `cpp/mx_quant.cu`). The kernel is portable and runs here: each group's e4m3 rows must equal
//! `Mxfp8::quantize` of those rows and its scale bytes `to_sf_atoms_grouped` of their scales at
//! `sf_group_bases`, byte for byte (an off-by-one group base, a row read from the wrong group, an atom index
//! mixed up or a scale rounded the other way all fail it). Rows in no group stay untouched.

use crate::common::*;
use half::{bf16, f16};
use moe_gemm::quant::mx::{sf_group_bases, to_sf_atoms_grouped, Mxfp8};
use moe_gemm::quant::{quantize_mxfp8_grouped, Mxfp8Rows};
use moe_gemm::status::bits;
use moe_gemm::*;

/// Rows `[rows, k]`: random values, with an all-zero block, a tiny block and a large block on some rows.
fn rows<T: Element>(rows: usize, k: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng(seed);
    (0..rows * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let v = match (r % 7, c / 32) {
                (1, 0) => 0.0,
                (2, 1) => rng.unit() * 1e-6,
                (3, 2) => rng.unit() * 3000.0,
                _ => rng.unit() * 4.0,
            };
            T::from_f32(v)
        })
        .collect()
}

/// (start, rows) of each group, from the group description.
fn check<T: Element>(groups: &[(usize, usize)], max_rows: usize, k: usize, rows_of: GroupRowsHost, seed: u64) {
    let (_ctx, stream) = gpu();
    let x = rows::<T>(max_rows, k, seed);
    let xd = stream.clone_htod(&x).unwrap();
    let g = groups.len();
    let mut out = Mxfp8Rows::alloc(&stream, max_rows, k, g).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (first, counts) = rows_of.upload(&stream);
    let grows = match &rows_of {
        GroupRowsHost::Offsets(_) => GroupRows::Offsets(first.as_view()),
        GroupRowsHost::Masked { max_m, .. } => GroupRows::Masked { masked_m: first.as_view(), max_m: *max_m },
        GroupRowsHost::Padded { .. } => {
            GroupRows::Padded { offsets: first.as_view(), counts: counts.as_ref().unwrap().as_view() }
        }
    };
    let xv = MatrixView::of("x", &xd, k).unwrap();
    quantize_mxfp8_grouped(&stream, &xv, grows, &mut out, &mut st).unwrap();
    st.check(&stream).unwrap();
    let q = stream.clone_dtoh(out.q()).unwrap();
    let sf = stream.clone_dtoh(out.sf()).unwrap();
    let bases = stream.clone_dtoh(out.sf_bases()).unwrap();
    // Host: each group's rows quantised on their own, the grids stacked, laid out per group.
    let counts_h: Vec<usize> = groups.iter().map(|&(_, m)| m).collect();
    let (want_bases, total) = sf_group_bases(&counts_h, k / 32);
    let mut grid = Vec::new();
    for (gi, &(start, m)) in groups.iter().enumerate() {
        if m == 0 {
            continue;
        }
        let xs: Vec<f32> = x[start * k..(start + m) * k].iter().map(|v| v.to_f32()).collect();
        let host = Mxfp8::quantize(&xs, m, k).unwrap();
        let got = &q[start * k..(start + m) * k];
        if let Some(i) = (0..m * k).find(|&i| got[i].to_bits() != host.data()[i].to_bits()) {
            panic!(
                "group {gi} row {} col {}: e4m3 {:#04x}, host {:#04x}",
                i / k,
                i % k,
                got[i].to_bits(),
                host.data()[i].to_bits()
            );
        }
        grid.extend(host.scales().iter().map(|s| s.0));
    }
    let want_sf = to_sf_atoms_grouped(&grid, &counts_h, k / 32).unwrap();
    let got_bases: Vec<usize> = bases.iter().map(|&b| b as usize).collect();
    assert_eq!(&got_bases[..g], &want_bases[..], "group bases");
    assert_eq!(got_bases[g], total, "bytes in use");
    if let Some(i) = (0..total).find(|&i| sf[i] != want_sf[i]) {
        let gi = want_bases.iter().rposition(|&b| b <= i).unwrap();
        panic!("scale byte {i} (group {gi}, {} into it): {:#04x}, host {:#04x}", i - want_bases[gi], sf[i], want_sf[i]);
    }
    assert!(sf[total..].iter().all(|&b| b == 0), "bytes past the layout were written");
    // Rows in no group are untouched (zeros from the allocation).
    let owned = |r: usize| groups.iter().any(|&(s, m)| r >= s && r < s + m);
    if let Some(r) = (0..max_rows).find(|&r| !owned(r) && q[r * k..(r + 1) * k].iter().any(|v| v.to_bits() != 0)) {
        panic!("row {r} is in no group and was written");
    }
}

/// The device group arrays of a case.
enum GroupRowsHost {
    Offsets(Vec<i32>),
    Masked { counts: Vec<i32>, max_m: usize },
    Padded { offsets: Vec<i32>, counts: Vec<i32> },
}

impl GroupRowsHost {
    fn upload(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> (cudarc::driver::CudaSlice<i32>, Option<cudarc::driver::CudaSlice<i32>>) {
        match self {
            GroupRowsHost::Offsets(o) => (stream.clone_htod(o).unwrap(), None),
            GroupRowsHost::Masked { counts, .. } => (stream.clone_htod(counts).unwrap(), None),
            GroupRowsHost::Padded { offsets, counts } => {
                (stream.clone_htod(offsets).unwrap(), Some(stream.clone_htod(counts).unwrap()))
            }
        }
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn mxfp8_grouped_layout_matches_the_host_per_group() {
    // Groups of 0, 1, 5, 129 (one row past an atom) and 300 rows, then 3 rows in no group; K = 256 (8 scales:
    // two atom columns).
    let sizes = [0usize, 1, 5, 129, 300];
    let mut offsets = vec![0i32];
    let mut groups = Vec::new();
    for &s in &sizes {
        groups.push((*offsets.last().unwrap() as usize, s));
        offsets.push(offsets.last().unwrap() + s as i32);
    }
    let max_rows = *offsets.last().unwrap() as usize + 3;
    check::<bf16>(&groups, max_rows, 256, GroupRowsHost::Offsets(offsets.clone()), 1);
    check::<f16>(&groups, max_rows, 256, GroupRowsHost::Offsets(offsets), 2);
    // K = 96: three scales, one partial atom column.
    check::<bf16>(&[(0, 130), (130, 2)], 132, 96, GroupRowsHost::Offsets(vec![0, 130, 132]), 3);
    // DeepGEMM's masked layout and vLLM's padded one.
    let masked = [(0usize, 3usize), (160, 0), (320, 160)];
    check::<bf16>(&masked, 480, 128, GroupRowsHost::Masked { counts: vec![3, 0, 160], max_m: 160 }, 4);
    let padded = [(0usize, 5usize), (128, 128), (256, 1)];
    let host = GroupRowsHost::Padded { offsets: vec![0, 128, 256, 384], counts: vec![5, 128, 1] };
    check::<bf16>(&padded, 384, 64, host, 5);
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn mxfp8_non_finite_and_bad_counts_are_reported() {
    let (_ctx, stream) = gpu();
    let (m, k) = (8usize, 64usize);
    let mut x = rows::<bf16>(m, k, 9);
    x[3 * k + 5] = bf16::NAN;
    x[6 * k + 40] = bf16::NEG_INFINITY;
    let xd = stream.clone_htod(&x).unwrap();
    let mut out = Mxfp8Rows::alloc(&stream, m, k, 2).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let offsets = stream.clone_htod(&[0i32, 4, 8]).unwrap();
    let xv = MatrixView::of("x", &xd, k).unwrap();
    quantize_mxfp8_grouped(&stream, &xv, &offsets, &mut out, &mut st).unwrap();
    match st.check(&stream) {
        Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & bits::NONFINITE_INPUT, bits::NONFINITE_INPUT),
        other => panic!("expected the non-finite bit, got {other:?}"),
    }
    let q = stream.clone_dtoh(out.q()).unwrap();
    assert_eq!((q[3 * k + 5].to_bits(), q[6 * k + 40].to_bits()), (0x7F, 0xFF), "e4m3 NaN with the sign");
    let bad = stream.clone_htod(&[0i32, 6, 5]).unwrap();
    quantize_mxfp8_grouped(&stream, &xv, &bad, &mut out, &mut st).unwrap();
    match st.check(&stream) {
        Err(Error::DeviceCheck { word, .. }) => {
            assert_eq!(word & bits::OFFSETS_NOT_MONOTONE, bits::OFFSETS_NOT_MONOTONE, "word {word:#x}")
        }
        other => panic!("expected the offsets bit, got {other:?}"),
    }
    // Before any launch: K not a multiple of 32, x of another shape, groups of another count.
    assert!(Mxfp8Rows::alloc(&stream, m, 48, 2).unwrap_err().to_string().contains("multiple of 32"));
    let short = MatrixView::of("x", &xd, 2 * k).unwrap();
    let e = quantize_mxfp8_grouped(&stream, &short, &offsets, &mut out, &mut st).unwrap_err();
    assert!(e.to_string().contains("for rows of [8, 64]"), "{e}");
    let three = stream.clone_htod(&[0i32, 2, 4]).unwrap();
    let mut out3 = Mxfp8Rows::alloc(&stream, m, k, 3).unwrap();
    let e = quantize_mxfp8_grouped(&stream, &xv, &three, &mut out3, &mut st).unwrap_err();
    assert!(e.to_string().contains("offsets"), "{e}");
}
