//! The portable block-scaled grouped GEMM (`GroupedGemmMxPortable`, `cpp/mx/grouped_mx_portable.cu`) on the device, for
//! the four format pairs of the SM100 kernels, against an f64 host reference of the dequantised operands.
//!
//! A is quantised on the device by the grouped quantisers (`quantize_{mxfp8,mxfp4,nvfp4}_grouped`: the scale atoms
//! at per-group bases the SM100 kernels take) and first compared with the host quantiser of the same rows (bytes
//! and scale grid; `tests/gpu/mx_quant.rs` checks that bit for bit, so a failure there is the quantiser's, not
//! the GEMM's). B is quantised on the host and uploaded (`*Weights::from_host`). The reference multiplies the
//! host's dequantised values, computed from the plain `[rows, K / V]` scale grids, never from the atom layout: a
//! wrong atom offset, group base or expert stride in the kernel reads another block's scale and fails here.
//!
//! Tolerance, token by token: 2^-8 of the row's largest |D| (twice the bf16 rounding of D; the dequantisation
//! is exact and f32 accumulation adds orders of magnitude less) plus 2^-60. Every block of the data has its own
//! magnitude, so a scale taken from a neighbouring block, row or expert moves the result by a factor of two or
//! more. D starts as NaN: rows in no group, past a group's count and past `max_rows` must stay NaN.

use crate::common::*;
use crate::mx_quant::GroupRowsHost;
use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::kernels::grouped_mx::{MxFormat, MxRows, MxWeights};
use moe_gemm::kernels::grouped_mx_portable::GroupedGemmMxPortable;
use moe_gemm::layouts::GroupRows;
use moe_gemm::quant::mx::{from_sf_atoms_grouped, sf_group_bases, Mxfp4, Mxfp8, Nvfp4};
use moe_gemm::quant::{
    quantize_mxfp4_grouped, quantize_mxfp8_grouped, quantize_nvfp4_grouped, Mxfp4Rows, Mxfp4Weights, Mxfp8Rows,
    Mxfp8Weights, NvTensorScale, Nvfp4Rows, Nvfp4Weights,
};
use moe_gemm::status::bits;
use moe_gemm::*;
use std::sync::Arc;

use MxFormat::{Mxfp4 as Mx4, Mxfp8 as Mx8, Nvfp4 as Nv4};

/// The pairs the SM100 configurations compute (activations, weights).
const PAIRS: [(MxFormat, MxFormat); 4] = [(Mx8, Mx8), (Mx8, Mx4), (Mx4, Mx4), (Nv4, Nv4)];

/// `[rows, k]` values whose blocks of 16 have magnitudes from 2^-4 to 2^4 by row and block (so neighbouring
/// scales differ), and an all-zero first block of 32 on every eleventh row (scale 1, codes 0).
fn values(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let v = rng.unit() * 2f32.powi(((3 * r + c / 16) % 9) as i32 - 4);
            if r % 11 == 1 && c < 32 {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// A on the device.
enum Rows {
    Mxfp8(Mxfp8Rows),
    Mxfp4(Mxfp4Rows),
    Nvfp4(Nvfp4Rows),
}

impl Rows {
    fn view(&self) -> MxRows<'_> {
        match self {
            Rows::Mxfp8(a) => MxRows::Mxfp8(a),
            Rows::Mxfp4(a) => MxRows::Mxfp4(a),
            Rows::Nvfp4(a) => MxRows::Nvfp4(a),
        }
    }
}

/// The host quantiser's form of some rows: element bytes (e2m1 packed), the plain scale grid, the dequantised
/// values without NVFP4's tensor scale, and that tensor scale (1 for MX).
struct HostQuant {
    bytes: Vec<u8>,
    grid: Vec<u8>,
    deq: Vec<f32>,
    tensor: f32,
}

fn host_quant(fmt: MxFormat, w: &[f32], rows: usize, k: usize) -> HostQuant {
    match fmt {
        Mx8 => {
            let h = Mxfp8::quantize(w, rows, k).unwrap();
            let bytes = h.data().iter().map(|q| q.to_bits()).collect();
            HostQuant { bytes, grid: h.scales().iter().map(|s| s.0).collect(), deq: h.dequantize(), tensor: 1.0 }
        }
        Mx4 => {
            let h = Mxfp4::quantize(w, rows, k).unwrap();
            let grid = h.scales().iter().map(|s| s.0).collect();
            HostQuant { bytes: h.data().to_vec(), grid, deq: h.dequantize(), tensor: 1.0 }
        }
        Nv4 => {
            let h = Nvfp4::quantize(w, rows, k).unwrap();
            // q · s_block exactly: the same codes and scales under a tensor scale of 1.
            let deq = Nvfp4::from_parts(rows, k, h.data().to_vec(), h.scales().to_vec(), 1.0).unwrap().dequantize();
            let grid = h.scales().iter().map(|s| s.to_bits()).collect();
            HostQuant { bytes: h.data().to_vec(), grid, deq, tensor: h.tensor_scale() }
        }
    }
}

/// Quantises `x` on the device over the groups of `host` (`spans`: each group's first row and rows) and checks
/// it against the host quantiser: the device A, the host's dequantised rows `[max_rows, k]` (0 outside the
/// groups; without NVFP4's tensor scale) and A's tensor scale.
fn activations(
    stream: &Arc<CudaStream>,
    fmt: MxFormat,
    x: &[bf16],
    k: usize,
    host: &GroupRowsHost,
    spans: &[(usize, usize)],
) -> (Rows, Vec<f32>, f32) {
    let (g, max_rows) = (spans.len(), x.len() / k);
    let xd = stream.clone_htod(x).unwrap();
    let xv = MatrixView::of("x", &xd, k).unwrap();
    let (first, counts) = host.upload(stream);
    let grows = host.view(&first, &counts);
    let mut st = DeviceStatus::new(stream).unwrap();
    let rows = match fmt {
        Mx8 => {
            let mut a = Mxfp8Rows::alloc(stream, max_rows, k, g).unwrap();
            quantize_mxfp8_grouped(stream, &xv, grows, &mut a, &mut st).unwrap();
            Rows::Mxfp8(a)
        }
        Mx4 => {
            let mut a = Mxfp4Rows::alloc(stream, max_rows, k, g).unwrap();
            quantize_mxfp4_grouped(stream, &xv, grows, &mut a, &mut st).unwrap();
            Rows::Mxfp4(a)
        }
        Nv4 => {
            let mut a = Nvfp4Rows::alloc(stream, max_rows, k, g).unwrap();
            quantize_nvfp4_grouped(stream, &xv, grows, NvTensorScale::FromAmax, &mut a, &mut st).unwrap();
            Rows::Nvfp4(a)
        }
    };
    st.check(stream).unwrap();
    let (q, sf, tensor) = match &rows {
        Rows::Mxfp8(a) => {
            let q = stream.clone_dtoh(a.q()).unwrap().iter().map(|v| v.to_bits()).collect();
            (q, stream.clone_dtoh(a.sf()).unwrap(), 1.0)
        }
        Rows::Mxfp4(a) => (stream.clone_dtoh(a.q()).unwrap(), stream.clone_dtoh(a.sf()).unwrap(), 1.0),
        Rows::Nvfp4(a) => {
            let t = stream.clone_dtoh(a.tensor_scale()).unwrap()[0];
            (stream.clone_dtoh(a.q()).unwrap(), stream.clone_dtoh(a.sf()).unwrap(), t)
        }
    };
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let group_rows = |&(s, m): &(usize, usize)| xf[s * k..(s + m) * k].to_vec();
    // MX: each group's rows on their own (the device quantises per group); NVFP4: all grouped rows together, one
    // tensor scale (as the device derives it). Empty groups hold nothing.
    let parts: Vec<HostQuant> = match fmt {
        Nv4 => {
            let all: Vec<f32> = spans.iter().flat_map(group_rows).collect();
            vec![host_quant(fmt, &all, all.len() / k, k)]
        }
        _ => spans.iter().filter(|s| s.1 > 0).map(|s| host_quant(fmt, &group_rows(s), s.1, k)).collect(),
    };
    assert_eq!(tensor.to_bits(), parts[0].tensor.to_bits(), "{fmt:?}: A's tensor scale {tensor:e}");
    let (bytes, grid, deq): (Vec<u8>, Vec<u8>, Vec<f32>) = parts.iter().fold(Default::default(), |mut acc, p| {
        acc.0.extend(&p.bytes);
        acc.1.extend(&p.grid);
        acc.2.extend(&p.deq);
        acc
    });
    let (row_bytes, vec) = (k * fmt.bits() / 8, fmt.block());
    let counts_h: Vec<usize> = spans.iter().map(|s| s.1).collect();
    let device_bytes: Vec<u8> =
        spans.iter().flat_map(|&(s, m)| q[s * row_bytes..(s + m) * row_bytes].to_vec()).collect();
    assert!(device_bytes == bytes, "{fmt:?}: the device quantiser's elements differ from the host's (see mx_quant)");
    let used = sf_group_bases(&counts_h, k / vec).1;
    let device_grid = from_sf_atoms_grouped(&sf[..used], &counts_h, k / vec).unwrap();
    assert!(device_grid == grid, "{fmt:?}: the device quantiser's scales differ from the host's (see mx_quant)");
    // The dequantised rows in place, zeros elsewhere.
    let mut full = vec![0f32; max_rows * k];
    let mut at = 0;
    for &(s, m) in spans {
        full[s * k..(s + m) * k].copy_from_slice(&deq[at..at + m * k]);
        at += m * k;
    }
    (rows, full, tensor)
}

/// B on the device.
enum Weights {
    Mxfp8(Mxfp8Weights),
    Mxfp4(Mxfp4Weights),
    Nvfp4(Nvfp4Weights),
}

impl Weights {
    fn view(&self) -> MxWeights<'_> {
        match self {
            Weights::Mxfp8(w) => MxWeights::Mxfp8(w),
            Weights::Mxfp4(w) => MxWeights::Mxfp4(w),
            Weights::Nvfp4(w) => MxWeights::Nvfp4(w),
        }
    }
}

/// `g` experts of `[n, k]` quantised on the host and uploaded: the device weights, the dequantised `[g, n, k]`
/// (without NVFP4's tensor scales) and each expert's tensor scale.
fn weights(
    stream: &Arc<CudaStream>,
    fmt: MxFormat,
    g: usize,
    n: usize,
    k: usize,
    seed: u64,
) -> (Weights, Vec<f32>, Vec<f32>) {
    // Each expert its own magnitudes: a wrong expert stride reads another's data or scales.
    let w: Vec<Vec<f32>> = (0..g).map(|e| values(n, k, seed + 7 * e as u64)).collect();
    let dev = match fmt {
        Mx8 => {
            let h: Vec<Mxfp8> = w.iter().map(|w| Mxfp8::quantize(w, n, k).unwrap()).collect();
            Weights::Mxfp8(Mxfp8Weights::from_host(stream, &h).unwrap())
        }
        Mx4 => {
            let h: Vec<Mxfp4> = w.iter().map(|w| Mxfp4::quantize(w, n, k).unwrap()).collect();
            Weights::Mxfp4(Mxfp4Weights::from_host(stream, &h).unwrap())
        }
        Nv4 => {
            let h: Vec<Nvfp4> = w.iter().map(|w| Nvfp4::quantize(w, n, k).unwrap()).collect();
            Weights::Nvfp4(Nvfp4Weights::from_host(stream, &h).unwrap())
        }
    };
    let host: Vec<HostQuant> = w.iter().map(|w| host_quant(fmt, w, n, k)).collect();
    (dev, host.iter().flat_map(|h| h.deq.iter().copied()).collect(), host.iter().map(|h| h.tensor).collect())
}

/// D against `alpha_g · A_g · B_gᵀ` of the dequantised operands, token by token; NaN (unwritten) everywhere
/// else, the guard past `max_rows` rows included.
#[allow(clippy::too_many_arguments)]
fn check_d(
    what: &str,
    got: &[bf16],
    a: &[f32],
    b: &[f32],
    alpha: &[f64],
    spans: &[(usize, usize)],
    n: usize,
    k: usize,
) {
    let max_rows = a.len() / k;
    for (g, &(start, m)) in spans.iter().enumerate() {
        let bg = &b[g * n * k..(g + 1) * n * k];
        for r in start..start + m {
            let ar = &a[r * k..(r + 1) * k];
            let want: Vec<f64> = (0..n)
                .map(|c| {
                    alpha[g] * ar.iter().zip(&bg[c * k..(c + 1) * k]).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>()
                })
                .collect();
            let tol = want.iter().fold(0f64, |t, w| t.max(w.abs())) / 256.0 + 2f64.powi(-60);
            for (c, w) in want.iter().enumerate() {
                let d = got[r * n + c].to_f64();
                assert!(
                    (d - w).abs() <= tol,
                    "{what}: group {g}, token {r} (its row {}), column {c}: {d}, reference {w} (tolerance {tol:e})",
                    r - start
                );
            }
        }
    }
    let owned = |r: usize| spans.iter().any(|&(s, m)| r >= s && r < s + m);
    if let Some(r) = (0..got.len() / n).find(|&r| !owned(r) && got[r * n..(r + 1) * n].iter().any(|x| !x.is_nan())) {
        panic!("{what}: row {r} is in no group{} and was written", if r >= max_rows { " (past max_rows)" } else { "" });
    }
}

/// Quantises, launches and checks one case: `fmts` over the groups `host` describes (`spans`), B `[G, n, k]`.
#[allow(clippy::too_many_arguments)]
fn check_case(
    what: &str,
    fmts: (MxFormat, MxFormat),
    host: &GroupRowsHost,
    spans: &[(usize, usize)],
    max_rows: usize,
    n: usize,
    k: usize,
    seed: u64,
) {
    let (_ctx, stream) = gpu();
    let g = spans.len();
    let x: Vec<bf16> = values(max_rows, k, seed).into_iter().map(bf16::from_f32).collect();
    let (rows, a, a_t) = activations(&stream, fmts.0, &x, k, host, spans);
    let (w, b, b_t) = weights(&stream, fmts.1, g, n, k, seed + 1);
    let plan = GroupedGemmMxPortable::new(&stream, fmts.0, fmts.1, g, n, k, max_rows).unwrap();
    // Two guard rows past max_rows.
    let mut d = stream.clone_htod(&vec![bf16::NAN; (max_rows + 2) * n]).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (first, counts) = host.upload(&stream);
    plan.launch(&stream, rows.view(), w.view(), host.view(&first, &counts), &mut d, &mut st).unwrap();
    st.check(&stream).unwrap();
    let got = stream.clone_dtoh(&d).unwrap();
    // alpha_g as the kernel forms it: the f32 product of the tensor scales (1 for MX).
    let alpha: Vec<f64> = b_t.iter().map(|t| (a_t * t) as f64).collect();
    check_d(&format!("{what}, {:?} x {:?}", fmts.0, fmts.1), &got, &a, &b, &alpha, spans, n, k);
    println!(
        "{what}, {:?} x {:?}: {} groups of {spans:?} over {max_rows} rows, N = {n}, K = {k}: ok",
        fmts.0, fmts.1, g
    );
}

/// Offsets over sizes, then `extra` rows in no group: (offsets, spans, max_rows).
fn offsets_of(sizes: &[usize], extra: usize) -> (Vec<i32>, Vec<(usize, usize)>, usize) {
    let mut offsets = vec![0i32];
    let mut spans = Vec::new();
    for &s in sizes {
        spans.push((*offsets.last().unwrap() as usize, s));
        offsets.push(offsets.last().unwrap() + s as i32);
    }
    let max_rows = *offsets.last().unwrap() as usize + extra;
    (offsets, spans, max_rows)
}

/// The four pairs over uneven groups: 3, 0 (an empty group: no CTA may write), 300 (three scale-atom rows of A,
/// five 64-row tiles over the two row splits this shape gets, the last partial), 1 and 70 rows, then 3 rows in no
/// group; N = 256 (two atom rows of B, four column tiles), K = 256 (MX: two atom columns; NVFP4: four; four K
/// steps, so the prefetch of the next step is used). Five experts: a group base of A taken from the wrong group,
/// or an expert stride of B's data or scales off by one, gives another block's scale to every element of a group
/// and fails the reference by a factor of two or more; a wrong atom offset within a group (row m % 32, m / 32 % 4
/// or the K-block mixed up) likewise from the first row or block it touches.
#[test]
#[ignore = "needs an SM90 GPU"]
fn four_pairs_match_the_host_over_uneven_groups() {
    let (offsets, spans, max_rows) = offsets_of(&[3, 0, 300, 1, 70], 3);
    for (i, fmts) in PAIRS.into_iter().enumerate() {
        let host = GroupRowsHost::Offsets(offsets.clone());
        check_case("offsets", fmts, &host, &spans, max_rows, 256, 256, 100 + 10 * i as u64);
    }
}

/// MXFP8 x MXFP4 (gpt-oss's pair) over DeepGEMM's masked and vLLM's padded groups: the padding rows of a padded
/// group and the room past a masked count must stay unwritten (a kernel storing whole 64-row tiles fails), and
/// the rows of group g must be found at g · max_m (masked) or offsets[g] (padded), with their scales at the
/// base the quantiser computed from the counts, not from the room. The masked room of 160 rows gives three row
/// splits, one per tile of the 150-row group.
#[test]
#[ignore = "needs an SM90 GPU"]
fn padded_and_masked_groups_mxfp8_x_mxfp4() {
    let fmts = (Mx8, Mx4);
    let host = GroupRowsHost::Padded { offsets: vec![0, 8, 144, 208, 216], counts: vec![5, 130, 0, 8] };
    check_case("padded", fmts, &host, &[(0, 5), (8, 130), (144, 0), (208, 8)], 216, 256, 384, 21);
    let host = GroupRowsHost::Masked { counts: vec![3, 0, 150], max_m: 160 };
    check_case("masked", fmts, &host, &[(0, 3), (160, 0), (320, 150)], 480, 128, 256, 22);
}

/// Bad group arrays at the GEMM (A quantised over good offsets, its status clean): offsets that go down, past
/// max_rows, or a masked count above max_m are clamped and reported in the status word (the bits of the other
/// grouped GEMMs), and nothing is written past D's `max_rows` rows. A kernel that ignored `resolve`'s error
/// bits fails the bit checks; one that did not clamp writes the guard rows.
#[test]
#[ignore = "needs an SM90 GPU"]
fn bad_group_arrays_set_the_status_and_stay_in_bounds() {
    let (_ctx, stream) = gpu();
    let (g, max_rows, n, k) = (2usize, 8usize, 128usize, 128usize);
    let fmts = (Mx8, Mx8);
    let x: Vec<bf16> = values(max_rows, k, 31).into_iter().map(bf16::from_f32).collect();
    let (rows, ..) = activations(&stream, fmts.0, &x, k, &GroupRowsHost::Offsets(vec![0, 4, 8]), &[(0, 4), (4, 4)]);
    let (w, ..) = weights(&stream, fmts.1, g, n, k, 32);
    let plan = GroupedGemmMxPortable::new(&stream, fmts.0, fmts.1, g, n, k, max_rows).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let cases = [
        ("offsets going down", GroupRowsHost::Offsets(vec![0, 6, 5]), bits::OFFSETS_NOT_MONOTONE),
        ("an offset past max_rows", GroupRowsHost::Offsets(vec![0, 4, 100]), bits::OFFSETS_OUT_OF_RANGE),
        (
            "a masked count above max_m",
            GroupRowsHost::Masked { counts: vec![2, 9], max_m: 4 },
            bits::GROUP_COUNT_OUT_OF_RANGE,
        ),
    ];
    for (what, host, bit) in cases {
        let mut d = stream.clone_htod(&vec![bf16::NAN; (max_rows + 2) * n]).unwrap();
        let (first, counts) = host.upload(&stream);
        plan.launch(&stream, rows.view(), w.view(), host.view(&first, &counts), &mut d, &mut st).unwrap();
        match st.check(&stream) {
            Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & bit, bit, "{what}: word {word:#x}"),
            other => panic!("{what}: expected bit {bit:#x}, got {other:?}"),
        }
        let got = stream.clone_dtoh(&d).unwrap();
        assert!(got[max_rows * n..].iter().all(|v| v.is_nan()), "{what}: the guard past D was written");
    }
}

/// The launch's host checks, before anything is queued: per-row groups (which the SM100 launch refuses too), A of
/// another format than the plan's, a short D.
#[test]
#[ignore = "needs an SM90 GPU"]
fn launch_refuses_per_row_groups_other_formats_and_short_d() {
    let (_ctx, stream) = gpu();
    let (g, max_rows, n, k) = (2usize, 8usize, 128usize, 128usize);
    let plan = GroupedGemmMxPortable::new(&stream, Mx8, Mx4, g, n, k, max_rows).unwrap();
    let (w, ..) = weights(&stream, Mx4, g, n, k, 41);
    let a8 = Mxfp8Rows::alloc(&stream, max_rows, k, g).unwrap();
    let a4 = Mxfp4Rows::alloc(&stream, max_rows, k, g).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n).unwrap();
    let experts = stream.clone_htod(&[0i32, 1]).unwrap();
    let per_row = GroupRows::PerRow { experts: experts.as_view(), rows: 2, a_div: 1, num_experts: g };
    let e = plan.launch(&stream, MxRows::Mxfp8(&a8), w.view(), per_row, &mut d, &mut st).unwrap_err();
    assert!(e.to_string().contains("per-row groups are not offered"), "{e}");
    let offsets = stream.clone_htod(&[0i32, 4, 8]).unwrap();
    let e = plan.launch(&stream, MxRows::Mxfp4(&a4), w.view(), &offsets, &mut d, &mut st).unwrap_err();
    assert!(e.to_string().contains("planned for Mxfp8 x Mxfp4, launched with Mxfp4 x Mxfp4"), "{e}");
    let mut short = stream.alloc_zeros::<bf16>(max_rows * n - 1).unwrap();
    let e = plan.launch(&stream, MxRows::Mxfp8(&a8), w.view(), &offsets, &mut short, &mut st);
    assert!(matches!(e, Err(Error::Buffer { name: "d", .. })), "{e:?}");
    st.check(&stream).unwrap();
}
