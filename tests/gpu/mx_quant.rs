//! MXFP8, MXFP4 and NVFP4 activations in the SM100 block-scale layout, built on the device per group
//! (`quant::quantize_{mxfp8,mxfp4,nvfp4}_grouped`, `cpp/mx/mx_quant.cu`). The kernels are portable and run here:
//! each group's elements must equal the host quantiser's (`Mxfp8::quantize`, `Mxfp4::quantize` of those rows;
//! `Nvfp4::quantize` / `quantize_with_tensor_scale` of all grouped rows together, one tensor scale) and its
//! scale bytes `to_sf_atoms_grouped` of their scales at `sf_group_bases`, byte for byte (an off-by-one group
//! base, a row read from the wrong group, an atom index mixed up, a nibble swapped or a scale rounded the other
//! way all fail it). Rows in no group stay untouched.

use crate::common::*;
use half::{bf16, f16};
use moe_gemm::dtype::Element;
use moe_gemm::layouts::GroupRows;
use moe_gemm::quant::mx::{sf_group_bases, to_sf_atoms_grouped, Mxfp4, Mxfp8, Nvfp4};
use moe_gemm::quant::{
    quantize_mxfp4_grouped, quantize_mxfp8_grouped, quantize_nvfp4_grouped, Mxfp4Rows, Mxfp8Rows, NvTensorScale,
    Nvfp4Rows,
};
use moe_gemm::status::bits;
use moe_gemm::*;

/// e2m1's rounding midpoints and their neighbours at a block scale of 1 (a block whose amax is 6): ties go to
/// the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), -0 keeps its sign.
const E2M1_TIES: [f32; 16] =
    [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -5.0, -0.0, 0.1, 5.5, -6.0];

/// Rows `[rows, k]`: random values, with an all-zero block, a tiny block and a large block on some rows, and
/// (FP4) e2m1's ties at scale 1 in the first 16 elements of the fourth 32-block.
fn rows<T: Element>(rows: usize, k: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng(seed);
    (0..rows * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let v = match (r % 7, c / 32) {
                (1, 0) => 0.0,
                (2, 1) => rng.unit() * 1e-6,
                (3, 2) => rng.unit() * 3000.0,
                (4, 3) if c % 32 < 16 => E2M1_TIES[c % 16],
                (4, 3) => 0.0,
                _ => rng.unit() * 4.0,
            };
            T::from_f32(v)
        })
        .collect()
}

/// `x [rows, x_cols]` zero-padded to `k` columns.
fn zero_pad<T: Element>(x: &[T], x_cols: usize, k: usize) -> Vec<T> {
    x.chunks_exact(x_cols).flat_map(|r| r.iter().copied().chain((x_cols..k).map(|_| T::from_f32(0.0)))).collect()
}

/// (start, rows) of each group, from the group description.
fn check<T: Element>(groups: &[(usize, usize)], max_rows: usize, k: usize, rows_of: GroupRowsHost, seed: u64) {
    check_padded::<T>(groups, max_rows, k, k, rows_of, seed)
}

/// As [`check`], x holding `x_cols <= k` columns: the device writes rows of `k`, the host quantises the rows
/// zero-padded to `k`.
fn check_padded<T: Element>(
    groups: &[(usize, usize)],
    max_rows: usize,
    x_cols: usize,
    k: usize,
    rows_of: GroupRowsHost,
    seed: u64,
) {
    let (_ctx, stream) = gpu();
    let x_in = rows::<T>(max_rows, x_cols, seed);
    let xd = stream.clone_htod(&x_in).unwrap();
    let x = zero_pad(&x_in, x_cols, k);
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
    let xv = MatrixView::of("x", &xd, x_cols).unwrap();
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

/// The device group arrays of a case (the portable GEMM's tests use them too).
pub(crate) enum GroupRowsHost {
    Offsets(Vec<i32>),
    Masked { counts: Vec<i32>, max_m: usize },
    Padded { offsets: Vec<i32>, counts: Vec<i32> },
}

impl GroupRowsHost {
    pub(crate) fn upload(
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

impl GroupRowsHost {
    /// The library's view of the uploaded arrays.
    pub(crate) fn view<'a>(
        &self,
        first: &'a cudarc::driver::CudaSlice<i32>,
        counts: &'a Option<cudarc::driver::CudaSlice<i32>>,
    ) -> GroupRows<'a> {
        match self {
            GroupRowsHost::Offsets(_) => GroupRows::Offsets(first.as_view()),
            GroupRowsHost::Masked { max_m, .. } => GroupRows::Masked { masked_m: first.as_view(), max_m: *max_m },
            GroupRowsHost::Padded { .. } => {
                GroupRows::Padded { offsets: first.as_view(), counts: counts.as_ref().unwrap().as_view() }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Fp4 {
    Mx,
    Nv(NvTensorScale),
}

/// The FP4 kernels against the host: packed bytes per group, scale atoms per group, bases, the tensor scale.
fn check_fp4<T: Element>(
    fmt: Fp4,
    groups: &[(usize, usize)],
    max_rows: usize,
    k: usize,
    host: GroupRowsHost,
    seed: u64,
) {
    check_fp4_padded::<T>(fmt, groups, max_rows, k, k, host, seed)
}

/// As [`check_fp4`], x holding `x_cols <= k` columns: MXFP4 against `Mxfp4::quantize_padded` of the rows,
/// NVFP4 against `Nvfp4::quantize*` of the rows zero-padded to `k`.
fn check_fp4_padded<T: Element>(
    fmt: Fp4,
    groups: &[(usize, usize)],
    max_rows: usize,
    x_cols: usize,
    k: usize,
    host: GroupRowsHost,
    seed: u64,
) {
    let (_ctx, stream) = gpu();
    let x_in = rows::<T>(max_rows, x_cols, seed);
    let xd = stream.clone_htod(&x_in).unwrap();
    let x = zero_pad(&x_in, x_cols, k);
    let g = groups.len();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (first, counts) = host.upload(&stream);
    let xv = MatrixView::of("x", &xd, x_cols).unwrap();
    let (q, sf, bases, tensor) = match fmt {
        Fp4::Mx => {
            let mut out = Mxfp4Rows::alloc(&stream, max_rows, k, g).unwrap();
            quantize_mxfp4_grouped(&stream, &xv, host.view(&first, &counts), &mut out, &mut st).unwrap();
            let d = |s| stream.clone_dtoh(s).unwrap();
            (d(out.q()), d(out.sf()), stream.clone_dtoh(out.sf_bases()).unwrap(), None)
        }
        Fp4::Nv(scale) => {
            let mut out = Nvfp4Rows::alloc(&stream, max_rows, k, g).unwrap();
            quantize_nvfp4_grouped(&stream, &xv, host.view(&first, &counts), scale, &mut out, &mut st).unwrap();
            let d = |s| stream.clone_dtoh(s).unwrap();
            let t = stream.clone_dtoh(out.tensor_scale()).unwrap()[0];
            (d(out.q()), d(out.sf()), stream.clone_dtoh(out.sf_bases()).unwrap(), Some(t))
        }
    };
    st.check(&stream).unwrap();
    let vec = if matches!(fmt, Fp4::Mx) { 32 } else { 16 };
    let counts_h: Vec<usize> = groups.iter().map(|&(_, m)| m).collect();
    let (want_bases, total) = sf_group_bases(&counts_h, k / vec);
    let f32_rows =
        |start: usize, m: usize| -> Vec<f32> { x[start * k..(start + m) * k].iter().map(|v| v.to_f32()).collect() };
    // Host: (packed bytes, scale bytes) of each group's rows.
    let per_group: Vec<(Vec<u8>, Vec<u8>)> = match fmt {
        Fp4::Mx => groups
            .iter()
            .map(|&(start, m)| {
                let unpadded: Vec<f32> =
                    x_in[start * x_cols..(start + m) * x_cols].iter().map(|v| v.to_f32()).collect();
                let h = Mxfp4::quantize_padded(&unpadded, m, x_cols, k).unwrap();
                (h.data().to_vec(), h.scales().iter().map(|s| s.0).collect())
            })
            .collect(),
        Fp4::Nv(scale) => {
            // One tensor for all grouped rows: one tensor scale, as on the device.
            let all: Vec<f32> = groups.iter().flat_map(|&(s, m)| f32_rows(s, m)).collect();
            let n = all.len() / k;
            let h = match scale {
                NvTensorScale::FromAmax => Nvfp4::quantize(&all, n, k).unwrap(),
                NvTensorScale::Given(t) => Nvfp4::quantize_with_tensor_scale(&all, n, k, t).unwrap(),
            };
            let t = tensor.unwrap();
            assert_eq!(t.to_bits(), h.tensor_scale().to_bits(), "tensor scale {t:e}, host {:e}", h.tensor_scale());
            let mut row = 0;
            groups
                .iter()
                .map(|&(_, m)| {
                    let d = h.data()[row * k / 2..(row + m) * k / 2].to_vec();
                    let s = h.scales()[row * k / 16..(row + m) * k / 16].iter().map(|s| s.to_bits()).collect();
                    row += m;
                    (d, s)
                })
                .collect()
        }
    };
    let mut grid = Vec::new();
    for (gi, (&(start, m), (data, scales))) in groups.iter().zip(&per_group).enumerate() {
        let got = &q[start * k / 2..(start + m) * k / 2];
        if let Some(i) = (0..got.len()).find(|&i| got[i] != data[i]) {
            panic!(
                "{fmt:?} group {gi} row {} byte {}: {:#04x}, host {:#04x}",
                i / (k / 2),
                i % (k / 2),
                got[i],
                data[i]
            );
        }
        grid.extend_from_slice(scales);
    }
    let want_sf = to_sf_atoms_grouped(&grid, &counts_h, k / vec).unwrap();
    let got_bases: Vec<usize> = bases.iter().map(|&b| b as usize).collect();
    assert_eq!(&got_bases[..g], &want_bases[..], "{fmt:?}: group bases");
    assert_eq!(got_bases[g], total, "{fmt:?}: bytes in use");
    if let Some(i) = (0..total).find(|&i| sf[i] != want_sf[i]) {
        let gi = want_bases.iter().rposition(|&b| b <= i).unwrap();
        panic!(
            "{fmt:?}: scale byte {i} (group {gi}, {} in): {:#04x}, host {:#04x}",
            i - want_bases[gi],
            sf[i],
            want_sf[i]
        );
    }
    assert!(sf[total..].iter().all(|&b| b == 0), "{fmt:?}: bytes past the layout were written");
    let owned = |r: usize| groups.iter().any(|&(s, m)| r >= s && r < s + m);
    if let Some(r) = (0..max_rows).find(|&r| !owned(r) && q[r * k / 2..(r + 1) * k / 2].iter().any(|&b| b != 0)) {
        panic!("{fmt:?}: row {r} is in no group and was written");
    }
}

/// Every FP4 form over the group descriptions of the MXFP8 test: groups of 0, 1, 5, 129 and 300 rows and rows
/// in no group; masked and padded groups; several K (one partial atom column among them).
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp4_grouped_layouts_match_the_host_per_group() {
    let sizes = [0usize, 1, 5, 129, 300];
    let mut offsets = vec![0i32];
    let mut groups = Vec::new();
    for &s in &sizes {
        groups.push((*offsets.last().unwrap() as usize, s));
        offsets.push(offsets.last().unwrap() + s as i32);
    }
    let max_rows = *offsets.last().unwrap() as usize + 3;
    let masked = [(0usize, 3usize), (160, 0), (320, 160)];
    let padded = [(0usize, 5usize), (128, 128), (256, 1)];
    for fmt in [Fp4::Mx, Fp4::Nv(NvTensorScale::FromAmax), Fp4::Nv(NvTensorScale::Given(2.0))] {
        check_fp4::<bf16>(fmt, &groups, max_rows, 256, GroupRowsHost::Offsets(offsets.clone()), 11);
        check_fp4::<f16>(fmt, &groups, max_rows, 256, GroupRowsHost::Offsets(offsets.clone()), 12);
        // K = 160: five 32-blocks (MXFP4: two atom columns, the second partial; NVFP4: ten 16-blocks).
        check_fp4::<bf16>(fmt, &[(0, 130), (130, 2)], 132, 160, GroupRowsHost::Offsets(vec![0, 130, 132]), 13);
        let host = GroupRowsHost::Masked { counts: vec![3, 0, 160], max_m: 160 };
        check_fp4::<bf16>(fmt, &masked, 480, 128, host, 14);
        let host = GroupRowsHost::Padded { offsets: vec![0, 128, 256, 384], counts: vec![5, 128, 1] };
        check_fp4::<bf16>(fmt, &padded, 384, 64, host, 15);
    }
    // NVFP4 alone: K = 48, three 16-blocks (not a multiple of 32).
    for scale in [NvTensorScale::FromAmax, NvTensorScale::Given(0.75)] {
        check_fp4::<bf16>(Fp4::Nv(scale), &[(0, 7), (7, 129)], 140, 48, GroupRowsHost::Offsets(vec![0, 7, 136]), 16);
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn fp4_non_finite_overflow_and_bad_offsets_are_reported() {
    let (_ctx, stream) = gpu();
    let (m, k) = (8usize, 64usize);
    let mut x = rows::<bf16>(m, k, 19);
    x[3 * k + 4] = bf16::NAN;
    x[6 * k + 41] = bf16::NEG_INFINITY;
    let xd = stream.clone_htod(&x).unwrap();
    let xv = MatrixView::of("x", &xd, k).unwrap();
    let offsets = stream.clone_htod(&[0i32, 4, 8]).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let expect = |st: &mut DeviceStatus, bit: u32, what: &str| match st.check(&stream) {
        Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & bit, bit, "{what}: word {word:#x}"),
        other => panic!("{what}: expected bit {bit:#x}, got {other:?}"),
    };
    let mut mx = Mxfp4Rows::alloc(&stream, m, k, 2).unwrap();
    quantize_mxfp4_grouped(&stream, &xv, &offsets, &mut mx, &mut st).unwrap();
    expect(&mut st, bits::NONFINITE_INPUT, "MXFP4 NaN / -inf");
    let q = stream.clone_dtoh(mx.q()).unwrap();
    // Element 4 is byte 2's low nibble, element 41 byte 20's high one: NaN -> +6 (0x7), -inf -> -6 (0xF).
    assert_eq!((q[3 * k / 2 + 2] & 0xF, q[6 * k / 2 + 20] >> 4), (0x7, 0xF), "e2m1 of NaN and -inf");
    let mut nv = Nvfp4Rows::alloc(&stream, m, k, 2).unwrap();
    quantize_nvfp4_grouped(&stream, &xv, &offsets, NvTensorScale::FromAmax, &mut nv, &mut st).unwrap();
    expect(&mut st, bits::NONFINITE_INPUT, "NVFP4 NaN / -inf");
    // A tensor scale far too small for the data: every non-zero block saturates, reported.
    let clean = rows::<bf16>(m, k, 20);
    let cd = stream.clone_htod(&clean).unwrap();
    let cv = MatrixView::of("x", &cd, k).unwrap();
    quantize_nvfp4_grouped(&stream, &cv, &offsets, NvTensorScale::Given(1e-6), &mut nv, &mut st).unwrap();
    expect(&mut st, bits::SCALE_OVERFLOW, "NVFP4 tensor scale too small");
    quantize_nvfp4_grouped(&stream, &cv, &offsets, NvTensorScale::FromAmax, &mut nv, &mut st).unwrap();
    st.check(&stream).unwrap();
    let bad = stream.clone_htod(&[0i32, 6, 5]).unwrap();
    quantize_mxfp4_grouped(&stream, &cv, &bad, &mut mx, &mut st).unwrap();
    expect(&mut st, bits::OFFSETS_NOT_MONOTONE, "MXFP4 offsets");
    quantize_nvfp4_grouped(&stream, &cv, &bad, NvTensorScale::FromAmax, &mut nv, &mut st).unwrap();
    expect(&mut st, bits::OFFSETS_NOT_MONOTONE, "NVFP4 offsets");
    // Before any launch: K not a multiple of the block, a tensor scale that is not a scale, x of another shape.
    assert!(Mxfp4Rows::alloc(&stream, m, 48, 2).unwrap_err().to_string().contains("multiple of 32"));
    assert!(Nvfp4Rows::alloc(&stream, m, 40, 2).unwrap_err().to_string().contains("multiple of 16"));
    for t in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = quantize_nvfp4_grouped(&stream, &cv, &offsets, NvTensorScale::Given(t), &mut nv, &mut st).unwrap_err();
        assert!(e.to_string().contains("finite and positive"), "{t}: {e}");
    }
    let wide = MatrixView::of("x", &cd, 2 * k).unwrap();
    let e = quantize_mxfp4_grouped(&stream, &wide, &offsets, &mut mx, &mut st).unwrap_err();
    assert!(e.to_string().contains("for rows of [8, 64]"), "{e}");
    // Device bytes reported: data, worst-case atoms, bases (and NVFP4's two f32).
    assert_eq!(mx.bytes(), m * k / 2 + 512 * (1 + 2) + 8 * 3);
    assert_eq!(nv.bytes(), m * k / 2 + 512 * (1 + 2) + 8 * 3 + 8);
}

/// gpt-oss's K = 2880 written as rows of 2944 for the SM100 GEMMs: x holds 2880 columns, the kernels write
/// the 64 pad columns as all-zero blocks (codes 0, scale 1) without reading past x's rows; bit for bit the host
/// (`Mxfp4::quantize_padded`; MXFP8 and NVFP4 of the zero-padded rows, the NVFP4 tensor scale unchanged by the
/// pad), groups of 0, 1, 5, 129 and 300 rows with rows in no group.
#[test]
#[ignore = "needs an SM90 GPU"]
fn k_2880_padded_to_2944_matches_the_host_bit_for_bit() {
    let sizes = [0usize, 1, 5, 129, 300];
    let mut offsets = vec![0i32];
    let mut groups = Vec::new();
    for &s in &sizes {
        groups.push((*offsets.last().unwrap() as usize, s));
        offsets.push(offsets.last().unwrap() + s as i32);
    }
    let max_rows = *offsets.last().unwrap() as usize + 3;
    check_padded::<bf16>(&groups, max_rows, 2880, 2944, GroupRowsHost::Offsets(offsets.clone()), 21);
    for fmt in [Fp4::Mx, Fp4::Nv(NvTensorScale::FromAmax), Fp4::Nv(NvTensorScale::Given(2.0))] {
        check_fp4_padded::<bf16>(fmt, &groups, max_rows, 2880, 2944, GroupRowsHost::Offsets(offsets.clone()), 22);
    }
    // x wider than the rows, or off the block, is refused by name before anything is queued.
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let off = stream.clone_htod(&[0i32, 4]).unwrap();
    let mut out = Mxfp4Rows::alloc(&stream, 4, 2944, 1).unwrap();
    for cols in [2976usize, 2890] {
        let xd = stream.clone_htod(&vec![bf16::ZERO; 4 * cols]).unwrap();
        let xv = MatrixView::of("x", &xd, cols).unwrap();
        let m = quantize_mxfp4_grouped(&stream, &xv, GroupRows::Offsets(off.as_view()), &mut out, &mut st)
            .unwrap_err()
            .to_string();
        assert!(m.contains(&cols.to_string()) && (m.contains("at most K") || m.contains("multiple of 32")), "{m}");
    }
}
