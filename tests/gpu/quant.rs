//! FP8 activation quantisation on the GPU: the device kernels against the host reference
//! (`quant::per_token_group_quant`) bit for bit, on real shapes (K = 7168, 2048) and a partial last group (K = 200),
//! with NaN, ±∞, zeros, huge and subnormal inputs, UE8M0 on and off; the gather-fused variant against gather then
//! quantise; rows not written left untouched; a wrong (MN-major) scale layout caught; a graph replay.
//!
//! 128 × 128 weight block quantisation (`quant::quantize_weights`, `Fp8BlockWeights::quantize_device`) against the
//! host quantiser `BlockFp8::quantize` bit for bit: edge blocks, subnormal-only, all-zero, huge, saturating and
//! tie-rounding blocks, both scale formats, bf16 and f16, the scalar path; the one block the host refuses (UE8M0
//! below 2^-127) and non-finite inputs flagged; a graph replay; bf16 experts converted on the device equal to the
//! host conversion of the same checkpoint (`PackedFp8Experts::quantize` + `Fp8ExpertWeights::upload`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use moe_gemm::checkpoint::{Fp8Config, PackedFp8Experts};
use moe_gemm::quant::{
    dequantize_groups, per_token_group_quant, quantize_gather, quantize_rows, quantize_weights, requantize_rows,
    BlockFp8, BlockShape, Fp8BlockWeights, Fp8Rows, GroupQuant, RowsInUse, ScaleFormat, ScaleRounding, ACT_GROUP,
    F8E4M3, VLLM_EPS,
};
use moe_gemm::random::topk_ids;
use moe_gemm::status::bits;
use moe_gemm::*;

use crate::common::*;

/// What rows no kernel may write hold: e4m3 bytes 0x5A and scale −7 (a kernel never writes a negative scale).
const SENTINEL_Q: u8 = 0x5A;
const SENTINEL_S: f32 = -7.0;

/// 16-bit special values by dtype: (+NaN, −NaN, +∞, −∞, max, −max, smallest subnormal, −0).
fn specials(d: DType) -> [u16; 8] {
    match d {
        DType::BF16 => [0x7FC0, 0xFFC0, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x0001, 0x8000],
        _ => [0x7E00, 0xFE00, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001, 0x8000],
    }
}

/// `[rows, k]` inputs: rows and groups of very different magnitudes, then special rows (where the rows exist):
/// row 0 zeros; row 1 ±NaN; row 2 ±∞; row 3 ±max (a huge scale) among small values; row 4 subnormals and −0.
/// With a single row, that row gets a NaN and a max.
fn inputs<T: Element>(rows: usize, k: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng(seed);
    let mut x: Vec<T> = (0..rows * k)
        .map(|i| {
            let mag = [1e-3f32, 1.0, 50.0, 1e4][(i / k + (i % k) / ACT_GROUP) % 4];
            T::from_f32(rng.unit() * mag)
        })
        .collect();
    let [nan, neg_nan, inf, neg_inf, max, neg_max, sub, neg_zero] = specials(T::DTYPE).map(T::from_bits);
    let mut put = |r: usize, c: usize, v: T| {
        if r < rows && c < k {
            x[r * k + c] = v;
        }
    };
    if rows == 1 {
        put(0, 1, nan);
        put(0, 2, max);
        return x;
    }
    for c in 0..k {
        put(0, c, T::from_f32(0.0));
        put(4, c, if c % 2 == 0 { sub } else { neg_zero });
    }
    put(1, 3, nan);
    put(1, k - 1, neg_nan);
    put(2, 0, inf);
    put(2, 130 % k, neg_inf);
    put(3, 5, max);
    put(3, 6, neg_max);
    put(3, k - 2, sub);
    x
}

fn f32s<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

fn has_nonfinite<T: Element>(x: &[T]) -> bool {
    x.iter().any(|v| !v.to_f32().is_finite())
}

/// `Ok` or the status word a check reported.
fn status_word(r: Result<()>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(Error::DeviceCheck { word, .. }) => word,
        Err(e) => panic!("{e}"),
    }
}

/// Fp8 rows filled with the sentinels.
fn sentinel_rows(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Fp8Rows {
    let mut out = Fp8Rows::alloc(stream, rows, k).unwrap();
    let g = out.groups();
    stream.memcpy_htod(&vec![F8E4M3::from_bits(SENTINEL_Q); rows * k], out.data_mut()).unwrap();
    stream.memcpy_htod(&vec![SENTINEL_S; rows * g], out.scales_mut()).unwrap();
    out
}

/// Row `r` of (q, scales) against the expected row, bit for bit: `Err` names the first difference.
fn same_row(got: (&[F8E4M3], &[f32]), want: (&[F8E4M3], &[f32]), r: usize) -> Result<(), String> {
    if let Some(g) = (0..want.1.len()).find(|&g| got.1[g].to_bits() != want.1[g].to_bits()) {
        return Err(format!("row {r} group {g}: scale {:e}, expected {:e}", got.1[g], want.1[g]));
    }
    if let Some(c) = (0..want.0.len()).find(|&c| got.0[c].to_bits() != want.0[c].to_bits()) {
        return Err(format!(
            "row {r} col {c}: e4m3 {:#04x}, expected {:#04x}",
            got.0[c].to_bits(),
            want.0[c].to_bits()
        ));
    }
    Ok(())
}

/// Row `r` of (`[_, k]` e4m3, K-major scales).
fn row<'a>((q, s): (&'a [F8E4M3], &'a [f32]), r: usize, k: usize) -> (&'a [F8E4M3], &'a [f32]) {
    let g = k.div_ceil(ACT_GROUP);
    (&q[r * k..(r + 1) * k], &s[r * g..(r + 1) * g])
}

/// Device output (`[≥ rows, k]`, K-major scales) against the host reference's `[rows, k]`, row by row.
fn same_rows(got: (&[F8E4M3], &[f32]), want: (&[F8E4M3], &[f32]), rows: usize, k: usize) -> Result<(), String> {
    for r in 0..rows {
        same_row(row(got, r, k), row(want, r, k), r)?;
    }
    Ok(())
}

/// Rows `r` of the output still hold the sentinels.
fn untouched(got: (&[F8E4M3], &[f32]), r: usize, k: usize) -> bool {
    let g = k.div_ceil(ACT_GROUP);
    got.0[r * k..(r + 1) * k].iter().all(|v| v.to_bits() == SENTINEL_Q)
        && got.1[r * g..(r + 1) * g].iter().all(|s| *s == SENTINEL_S)
}

fn options() -> [(&'static str, GroupQuant); 3] {
    [
        ("DeepSeek f32 scales", GroupQuant::DEEPSEEK),
        ("DeepSeek UE8M0 scales", GroupQuant::DEEPSEEK_UE8M0),
        ("vLLM eps", GroupQuant::new(VLLM_EPS, ScaleRounding::Exact).unwrap()),
    ]
}

fn rows_match_reference<T: Element>(stream: &Arc<CudaStream>) {
    let mut st = DeviceStatus::new(stream).unwrap();
    for rows in [1usize, 7, 129, 4100] {
        for k in [7168usize, 2048, 200] {
            let x = inputs::<T>(rows, k, (rows * 31 + k) as u64);
            let x_dev = stream.clone_htod(&x).unwrap();
            let view = MatrixView::new("x", x_dev.as_view(), rows, k).unwrap();
            for (name, opts) in options() {
                let ctx = format!("{} rows {rows} K {k} {name}", T::DTYPE);
                let spare = 3;
                let mut out = sentinel_rows(stream, rows + spare, k);
                quantize_rows(stream, &view, &mut out, &opts, &mut st).unwrap();
                let word = status_word(st.check(stream));
                assert_eq!(word, if has_nonfinite(&x) { bits::NONFINITE_INPUT } else { 0 }, "{ctx}: status");
                let (q, s) = out.to_host(stream).unwrap();
                let (wq, ws) = per_token_group_quant(&f32s(&x), rows, k, &opts).unwrap();
                same_rows((&q, &s), (&wq, &ws), rows, k).unwrap_or_else(|m| panic!("{ctx}: {m}"));
                for r in rows..rows + spare {
                    assert!(untouched((&q, &s), r, k), "{ctx}: row {r} past x was written");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn device_quantisation_matches_the_host_reference_bit_for_bit() {
    let (_ctx, stream) = gpu();
    rows_match_reference::<bf16>(&stream);
    rows_match_reference::<f16>(&stream);
}

/// The scalar path: an odd K, a row stride that breaks the 8-byte alignment of rows, a view starting one element
/// into its buffer. Same bits as the host reference of the same rows.
#[test]
#[ignore = "needs an SM90 GPU"]
fn strided_odd_and_misaligned_rows_take_the_scalar_path_with_the_same_bits() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    // (rows, k, stride, offset)
    for (rows, k, stride, offset) in
        [(9usize, 7usize, 7usize, 0usize), (33, 130, 131, 0), (17, 2048, 2048, 1), (5, 200, 204, 2)]
    {
        let buf = random_vec::<bf16>(rows * stride + offset, (rows + k) as u64, 30.0);
        let buf_dev = stream.clone_htod(&buf).unwrap();
        let view = MatrixView::with_stride("x", buf_dev.slice(offset..), rows, k, stride).unwrap();
        let compact: Vec<bf16> =
            (0..rows).flat_map(|r| buf[offset + r * stride..offset + r * stride + k].to_vec()).collect();
        for (name, opts) in options() {
            let ctx = format!("rows {rows} K {k} stride {stride} offset {offset} {name}");
            let mut out = sentinel_rows(&stream, rows, k);
            quantize_rows(&stream, &view, &mut out, &opts, &mut st).unwrap();
            st.check(&stream).unwrap();
            let (q, s) = out.to_host(&stream).unwrap();
            let (wq, ws) = per_token_group_quant(&f32s(&compact), rows, k, &opts).unwrap();
            same_rows((&q, &s), (&wq, &ws), rows, k).unwrap_or_else(|m| panic!("{ctx}: {m}"));
        }
    }
}

/// A layout over `tokens` tokens with a quarter of the experts remote (dropped slots), and the positions.
fn layout(
    stream: &Arc<CudaStream>,
    spec: LayoutSpec,
    tokens: usize,
    top_k: usize,
    experts: usize,
    seed: u64,
) -> (ExpertLayout, Vec<i32>) {
    let local = experts * 3 / 4;
    // Experts 0..local are ours (local ids 0..local), the rest on another device.
    let map: Vec<i32> = (0..experts).map(|e| if e < local { e as i32 } else { -1 }).collect();
    let dims = LayoutDims::new(spec, tokens, top_k, experts, local).unwrap();
    let mut layout = ExpertLayout::new(stream, dims).unwrap();
    let ids = stream.clone_htod(&topk_ids(tokens, top_k, experts, seed)).unwrap();
    let map_dev = stream.clone_htod(&map).unwrap();
    let mut st = DeviceStatus::new(stream).unwrap();
    layout.build(stream, tokens, &ids, Some(&map_dev.as_view()), &mut st).unwrap();
    let word = status_word(st.check(stream));
    assert_eq!(word & !bits::CAPACITY_OVERFLOW, 0, "layout build");
    let positions = stream.clone_dtoh(layout.positions()).unwrap()[..tokens * top_k].to_vec();
    (layout, positions)
}

/// The gather fused into the quantisation writes exactly what gathering the bf16 rows and then quantising them
/// writes, at every placed position; the host reference of each token agrees; positions no slot placed (padding,
/// dropped slots, past the total) keep the sentinels.
#[test]
#[ignore = "needs an SM90 GPU"]
fn gather_fused_quantisation_equals_gather_then_quantise() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (tokens, top_k, experts) = (300usize, 8usize, 32usize);
    for k in [2048usize, 200] {
        for spec in [LayoutSpec::Aligned { block_m: 128 }, LayoutSpec::Grouped, LayoutSpec::Masked { max_m: 120 }] {
            let (layout, positions) = layout(&stream, spec, tokens, top_k, experts, k as u64);
            assert!(positions.iter().any(|&p| p < 0), "{spec:?}: some slots are dropped (remote experts)");
            let cap = layout.dims().capacity();
            let x = inputs::<bf16>(tokens, k, 17 + k as u64);
            let x_dev = stream.clone_htod(&x).unwrap();
            let view = MatrixView::new("x", x_dev.as_view(), tokens, k).unwrap();
            for (name, opts) in options() {
                let ctx = format!("{spec:?} K {k} {name}");
                // Gather then quantise.
                let mut permuted = stream.alloc_zeros::<bf16>(cap * k).unwrap();
                layout.gather(&stream, tokens, k, &x_dev, &mut permuted, &mut st).unwrap();
                let pview = MatrixView::new("permuted", permuted.as_view(), cap, k).unwrap();
                let mut two_pass = sentinel_rows(&stream, cap, k);
                quantize_rows(&stream, &pview, &mut two_pass, &opts, &mut st).unwrap();
                let _ = st.check(&stream); // NaN rows: the bit is checked below, for the fused pass
                                           // Fused.
                let mut fused = sentinel_rows(&stream, cap, k);
                quantize_gather(&stream, &layout, &view, &mut fused, &opts, &mut st).unwrap();
                let word = status_word(st.check(&stream));
                assert_eq!(word, bits::NONFINITE_INPUT, "{ctx}: the NaN and infinite rows of x are reported");
                let (tq, ts) = two_pass.to_host(&stream).unwrap();
                let (fq, fs) = fused.to_host(&stream).unwrap();
                let (wq, ws) = per_token_group_quant(&f32s(&x), tokens, k, &opts).unwrap();
                let mut placed = vec![false; cap];
                for (slot, &p) in positions.iter().enumerate() {
                    if p < 0 {
                        continue;
                    }
                    let (p, t) = (p as usize, slot / top_k);
                    placed[p] = true;
                    same_row(row((&fq, &fs), p, k), row((&tq, &ts), p, k), p)
                        .unwrap_or_else(|m| panic!("{ctx}: vs two passes: {m}"));
                    same_row(row((&fq, &fs), p, k), row((&wq, &ws), t, k), p)
                        .unwrap_or_else(|m| panic!("{ctx}: vs host: {m}"));
                }
                for p in (0..cap).filter(|&p| !placed[p]) {
                    assert!(untouched((&fq, &fs), p, k), "{ctx}: position {p} has no slot but was written");
                }
                assert!(placed.iter().any(|&x| !x), "{ctx}: the layout has unplaced positions to check");
            }
        }
    }
}

/// Requantising the activation output touches only the rows in use: an expert in range (m_indices) and before
/// the total. The rows not in use hold NaN, so reading them would also set the status bit.
#[test]
#[ignore = "needs an SM90 GPU"]
fn requantisation_skips_rows_not_in_use() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (tokens, top_k, experts, inter) = (200usize, 8usize, 32usize, 768usize);
    let (layout, _) = layout(&stream, LayoutSpec::Aligned { block_m: 64 }, tokens, top_k, experts, 5);
    let cap = layout.dims().capacity();
    let m_indices = stream.clone_dtoh(layout.m_indices()).unwrap();
    let total = stream.clone_dtoh(layout.total()).unwrap()[0] as usize;
    let local = layout.dims().local_experts() as i32;
    let in_use = |p: usize, total: usize| p < total && (0..local).contains(&m_indices[p]);
    let mut h: Vec<bf16> = random_vec(cap * inter, 9, 4.0);
    for p in (0..cap).filter(|&p| !in_use(p, total)) {
        h[p * inter..(p + 1) * inter].fill(bf16::NAN);
    }
    let h_dev = stream.clone_htod(&h).unwrap();
    let view = MatrixView::new("h", h_dev.as_view(), cap, inter).unwrap();
    // The layout's own rule, then a total smaller than the layout's (rows past it skipped too).
    let short_total = stream.clone_htod(&[(total / 2) as i32]).unwrap();
    for (what, t_dev, t) in [("layout total", layout.total(), total), ("half the total", &short_total, total / 2)] {
        for (name, opts) in options() {
            let ctx = format!("{what}, {name}");
            let rows = RowsInUse::new(layout.m_indices().as_view(), local as usize, Some(t_dev));
            let mut out = sentinel_rows(&stream, cap, inter);
            requantize_rows(&stream, &view, &rows, &mut out, &opts, &mut st).unwrap();
            assert_eq!(status_word(st.check(&stream)), 0, "{ctx}: a row not in use (NaN) was read");
            let (q, s) = out.to_host(&stream).unwrap();
            let g = inter.div_ceil(ACT_GROUP);
            for p in 0..cap {
                if in_use(p, t) {
                    let (wq, ws) =
                        per_token_group_quant(&f32s(&h[p * inter..(p + 1) * inter]), 1, inter, &opts).unwrap();
                    same_row((&q[p * inter..(p + 1) * inter], &s[p * g..(p + 1) * g]), (&wq, &ws), p)
                        .unwrap_or_else(|m| panic!("{ctx}: {m}"));
                } else {
                    assert!(untouched((&q, &s), p, inter), "{ctx}: row {p} not in use was written");
                }
            }
        }
    }
    // RowsInUse::of_layout is the layout's rule.
    let mut a = sentinel_rows(&stream, cap, inter);
    let mut b = sentinel_rows(&stream, cap, inter);
    requantize_rows(&stream, &view, &RowsInUse::of_layout(&layout), &mut a, &GroupQuant::DEEPSEEK, &mut st).unwrap();
    let rows = RowsInUse::new(layout.m_indices().as_view(), local as usize, Some(layout.total()));
    requantize_rows(&stream, &view, &rows, &mut b, &GroupQuant::DEEPSEEK, &mut st).unwrap();
    st.check(&stream).unwrap();
    let host_bits = |o: &Fp8Rows| {
        let (q, s) = o.to_host(&stream).unwrap();
        (q.iter().map(|v| v.to_bits()).collect::<Vec<u8>>(), s.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
    };
    assert_eq!(host_bits(&a), host_bits(&b));
}

/// The scales the device writes are K-major: dequantised with them the rows are within e4m3 precision of x, and
/// read as MN-major (`[groups][rows]`, the layout a wrong kernel would write) both the bit comparison the tests
/// above make and the dequantised values fail: that mutation cannot pass.
#[test]
#[ignore = "needs an SM90 GPU"]
fn scales_are_k_major_and_an_mn_major_layout_is_caught() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (rows, k) = (129usize, 7168usize);
    let mut rng = Rng(3);
    // Every (row, group) its own magnitude, so a transposed scale is wrong almost everywhere.
    let x: Vec<bf16> = (0..rows * k)
        .map(|i| bf16::from_f32(rng.unit() * 2f32.powi(((i / k) * 7 + (i % k) / ACT_GROUP) as i32 % 24 - 12)))
        .collect();
    let x_dev = stream.clone_htod(&x).unwrap();
    let mut out = Fp8Rows::alloc(&stream, rows, k).unwrap();
    let opts = GroupQuant::DEEPSEEK;
    quantize_rows(&stream, &MatrixView::new("x", x_dev.as_view(), rows, k).unwrap(), &mut out, &opts, &mut st).unwrap();
    st.check(&stream).unwrap();
    let (q, s) = out.to_host(&stream).unwrap();
    let g = out.groups();
    assert_eq!((out.rows(), out.k(), g, s.len()), (rows, k, 56, rows * 56));
    let xf = f32s(&x);
    let within = |scales: &[f32]| {
        let d = dequantize_groups(&q, scales, rows, k).unwrap();
        (0..rows * k)
            .all(|i| (d[i] - xf[i]).abs() <= xf[i].abs() / 16.0 + s[(i / k) * g + (i % k) / ACT_GROUP] * 2f32.powi(-10))
    };
    assert!(within(&s), "K-major scales dequantise x");
    let mn_major: Vec<f32> = (0..rows * g).map(|i| s[(i % rows) * g + i / rows]).collect();
    assert!(!within(&mn_major), "MN-major scales must not dequantise x");
    let (wq, ws) = per_token_group_quant(&xf, rows, k, &opts).unwrap();
    assert!(same_rows((&q, &s), (&wq, &ws), rows, k).is_ok());
    assert!(same_rows((&q, &mn_major), (&wq, &ws), rows, k).is_err(), "the bit comparison catches MN-major scales");
}

/// The quantisation launches are graph-safe: the gather-fused pass and the requantisation captured once, replayed
/// with new inputs written into the same buffers, equal to the host reference each time.
#[test]
#[ignore = "needs an SM90 GPU"]
fn quantisation_replays_in_a_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (tokens, top_k, experts, k) = (64usize, 4usize, 16usize, 7168usize);
    let (layout, positions) = layout(&stream, LayoutSpec::Aligned { block_m: 128 }, tokens, top_k, experts, 11);
    let cap = layout.dims().capacity();
    let mut x_dev: CudaSlice<bf16> = stream.alloc_zeros(tokens * k).unwrap();
    let mut out = Fp8Rows::alloc(&stream, cap, k).unwrap();
    let mut out2 = Fp8Rows::alloc(&stream, tokens, k).unwrap();
    let opts = GroupQuant::DEEPSEEK_UE8M0;
    stream.synchronize().unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    {
        let view = MatrixView::new("x", x_dev.as_view(), tokens, k).unwrap();
        quantize_gather(&stream, &layout, &view, &mut out, &opts, &mut st).unwrap();
        quantize_rows(&stream, &view, &mut out2, &opts, &mut st).unwrap();
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
    for replay in 0..5u64 {
        let x: Vec<bf16> = random_vec(tokens * k, 100 + replay, 10.0);
        stream.memcpy_htod(&x, &mut x_dev).unwrap();
        graph.launch().unwrap();
        st.check(&stream).unwrap();
        let (wq, ws) = per_token_group_quant(&f32s(&x), tokens, k, &opts).unwrap();
        let (q, s) = out2.to_host(&stream).unwrap();
        same_rows((&q, &s), (&wq, &ws), tokens, k).unwrap_or_else(|m| panic!("replay {replay}, rows: {m}"));
        let (q, s) = out.to_host(&stream).unwrap();
        let g = k.div_ceil(ACT_GROUP);
        for (slot, &p) in positions.iter().enumerate().filter(|(_, p)| **p >= 0) {
            let (p, t) = (p as usize, slot / top_k);
            same_row(
                (&q[p * k..(p + 1) * k], &s[p * g..(p + 1) * g]),
                (&wq[t * k..(t + 1) * k], &ws[t * g..(t + 1) * g]),
                p,
            )
            .unwrap_or_else(|m| panic!("replay {replay}, gather: {m}"));
        }
    }
}

/// Shapes that do not fit are refused before anything is queued: another K, too few rows, too many tokens for
/// the layout.
#[test]
#[ignore = "needs an SM90 GPU"]
fn mismatched_shapes_are_refused_before_launch() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let x_dev = stream.clone_htod(&random_vec::<bf16>(8 * 256, 1, 1.0)).unwrap();
    let view = MatrixView::new("x", x_dev.as_view(), 8, 256).unwrap();
    let opts = GroupQuant::DEEPSEEK;
    let mut other_k = Fp8Rows::alloc(&stream, 8, 128).unwrap();
    let e = quantize_rows(&stream, &view, &mut other_k, &opts, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "x", detail } if detail.contains("256 columns")), "{e}");
    let mut few = Fp8Rows::alloc(&stream, 7, 256).unwrap();
    let e = quantize_rows(&stream, &view, &mut few, &opts, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "fp8 rows", .. }), "{e}");
    let (layout, _) = layout(&stream, LayoutSpec::Grouped, 4, 2, 8, 1);
    let mut out = Fp8Rows::alloc(&stream, layout.dims().capacity(), 256).unwrap();
    let e = quantize_gather(&stream, &layout, &view, &mut out, &opts, &mut st).unwrap_err();
    assert!(e.to_string().contains("exceeds the layout's max_tokens"), "{e}");
    let small = MatrixView::new("x", x_dev.as_view(), 4, 256).unwrap();
    let mut short = Fp8Rows::alloc(&stream, layout.dims().capacity() - 1, 256).unwrap();
    let e = quantize_gather(&stream, &layout, &small, &mut short, &opts, &mut st).unwrap_err();
    assert!(e.to_string().contains("capacity"), "{e}");
    assert!(Fp8Rows::alloc(&stream, 4, 0).is_err());
    st.check(&stream).unwrap();
}

// ---- 128 x 128 weight blocks ----

/// What fills one 128 x 128 block of a test weight (`corner`: the block's first element, where a kind pins its
/// amax).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Block {
    /// Uniform in ±3.
    Random,
    /// All +0: scale 1.
    Zero,
    /// All −0: scale 1, q 0x80.
    NegZero,
    /// Up to the dtype's largest finite value, which the corner holds.
    Huge,
    /// Magnitudes 2^-20 .. 2^20 (f16: .. 2^14, below its largest finite value; many e4m3 subnormals and zeros).
    Wide,
    /// The dtype's subnormals only, bits up to 0x40, which the corner holds: for bf16 amax = 2^-127, whose f32
    /// scale `amax / 448` is subnormal and rounds down, so the corner's `|w| / scale` is 448.01 and saturates.
    /// bf16 under UE8M0: the host refuses this block (its scale would be below 2^-127).
    Subnormal,
    /// bf16: below 2^-118 (corner 0.9 · 2^-118): a subnormal f32 scale in (2^-127, 2^-126), UE8M0 2^-126.
    TinyNormal,
    /// bf16: amax exactly 2^-119: f32 scale in (2^-128, 2^-127], UE8M0 2^-127, the smallest UE8M0.
    SmallestUe8m0,
    /// Integers in ±448, corner 448: scale 1 (both formats), so many quotients are e4m3 ties (17 → 16, 19 → 20).
    Ties,
}

const BLOCKS: [Block; 9] = [
    Block::Random,
    Block::Zero,
    Block::NegZero,
    Block::Huge,
    Block::Wide,
    Block::Subnormal,
    Block::TinyNormal,
    Block::SmallestUe8m0,
    Block::Ties,
];

fn block_value<T: Element>(kind: Block, rng: &mut Rng, corner: bool) -> T {
    let bf = T::DTYPE == DType::BF16;
    let u = rng.unit();
    let pin = |m: f32, at: f32| T::from_f32(if corner { at * m } else { u * m });
    match kind {
        Block::Random => T::from_f32(u * 3.0),
        Block::Zero => T::from_f32(0.0),
        Block::NegZero => T::from_bits(0x8000),
        Block::Huge => {
            let max = T::from_bits(if bf { 0x7F7F } else { 0x7BFF });
            if corner {
                max
            } else {
                T::from_f32(u * max.to_f32())
            }
        }
        // f16 tops out at 65504: its exponents stop at 2^14 (|u| < 3), bf16's at 2^20.
        Block::Wide => T::from_f32(u * 2f32.powi(rng.below(if bf { 41 } else { 35 }) as i32 - 20)),
        Block::Subnormal => {
            let bits = if corner { 0x40 } else { rng.below(0x41) as u16 };
            T::from_bits(bits | if u < 0.0 { 0x8000 } else { 0 })
        }
        Block::TinyNormal => pin(if bf { 2f32.powi(-118) } else { 2f32.powi(-14) }, 0.9),
        Block::SmallestUe8m0 => pin(if bf { 2f32.powi(-119) } else { 2f32.powi(-10) }, 1.0),
        Block::Ties => T::from_f32(if corner { 448.0 } else { (u * 448.0).round() }),
    }
}

/// Weights `[experts, n, k]`, block `b` (row-major over every expert's `[ceil(n/128), ceil(k/128)]` grid, expert
/// by expert) filled as `kind(b)` says.
fn block_weights<T: Element>(experts: usize, n: usize, k: usize, seed: u64, kind: impl Fn(usize) -> Block) -> Vec<T> {
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    let mut rng = Rng(seed);
    (0..experts * n * k)
        .map(|i| {
            let (e, r, c) = (i / (n * k), i / k % n, i % k);
            block_value(kind((e * gn + r / 128) * gk + c / 128), &mut rng, r % 128 == 0 && c % 128 == 0)
        })
        .collect()
}

/// The host quantiser's bits of each expert of `w [experts, n, k]`: (e4m3 bytes, f32 scale bits; UE8M0 as its
/// f32 value, as `Fp8BlockWeights` holds it).
fn host_weight_bits<T: Element>(
    w: &[T],
    experts: usize,
    n: usize,
    k: usize,
    format: ScaleFormat,
) -> Result<(Vec<u8>, Vec<u32>)> {
    let (mut q, mut s) = (Vec::new(), Vec::new());
    for e in 0..experts {
        let m = BlockFp8::quantize(&f32s(&w[e * n * k..(e + 1) * n * k]), n, k, BlockShape::DEEPSEEK, format)?;
        q.extend(m.q().iter().map(|v| v.to_bits()));
        s.extend((0..m.scales().len()).map(|i| m.scales().get(i).expect("in the grid").to_bits()));
    }
    Ok((q, s))
}

fn device_weight_bits(stream: &Arc<CudaStream>, w: &Fp8BlockWeights) -> (Vec<u8>, Vec<u32>) {
    let q = stream.clone_dtoh(&w.q()).unwrap().iter().map(|v| v.to_bits()).collect();
    let s = stream.clone_dtoh(&w.scales()).unwrap().iter().map(|v| v.to_bits()).collect();
    (q, s)
}

/// Device bits against expected bits of `[experts, n, k]` weights: `Err` names the first differing scale (expert,
/// block) or element (expert, row, column), skipping the elements `skip` names.
fn same_weight_bits(
    got: &(Vec<u8>, Vec<u32>),
    want: &(Vec<u8>, Vec<u32>),
    (n, k): (usize, usize),
    skip: impl Fn(usize) -> bool,
) -> Result<(), String> {
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    assert_eq!((got.0.len(), got.1.len()), (want.0.len(), want.1.len()), "lengths");
    if let Some(i) = (0..want.1.len()).find(|&i| got.1[i] != want.1[i]) {
        return Err(format!(
            "expert {} block [{}, {}]: scale {:e} ({:#010x}), expected {:e} ({:#010x})",
            i / (gn * gk),
            i / gk % gn,
            i % gk,
            f32::from_bits(got.1[i]),
            got.1[i],
            f32::from_bits(want.1[i]),
            want.1[i]
        ));
    }
    if let Some(i) = (0..want.0.len()).find(|&i| !skip(i) && got.0[i] != want.0[i]) {
        return Err(format!(
            "expert {} element [{}, {}]: e4m3 {:#04x}, expected {:#04x}",
            i / (n * k),
            i / k % n,
            i % k,
            got.0[i],
            want.0[i]
        ));
    }
    Ok(())
}

/// Bits of `w [experts, n, k]` quantised on the device in `format`, and the status word it left.
fn device_quantise<T: Element>(
    stream: &Arc<CudaStream>,
    w: &CudaSlice<T>,
    (experts, n, k): (usize, usize, usize),
    format: ScaleFormat,
) -> ((Vec<u8>, Vec<u32>), u32) {
    let mut st = DeviceStatus::new(stream).unwrap();
    let out = Fp8BlockWeights::quantize_device(stream, &w.as_view(), experts, n, k, format, &mut st).unwrap();
    assert_eq!((out.experts(), out.n(), out.k()), (experts, n, k));
    assert_eq!(out.scale_grid(), (n.div_ceil(128), k.div_ceil(128)));
    let word = status_word(st.check(stream));
    (device_weight_bits(stream, &out), word)
}

fn weights_match_host<T: Element>(stream: &Arc<CudaStream>) {
    // 2 experts of [200, 328]: 2 x 3 blocks each, the last row of blocks 72 rows, the last column 72 columns; every
    // kind lands on an edge block somewhere. (3, 130, 202): k % 8 != 0, the scalar path.
    for (experts, n, k) in [(2usize, 200usize, 328usize), (3, 130, 202), (1, 128, 128), (2, 1, 1)] {
        for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
            let ctx = format!("{} [{experts}, {n}, {k}] {format:?}", T::DTYPE);
            // bf16's subnormal-only blocks have no UE8M0 scale on the host: take tiny normal ones instead (the
            // refused block has its own test below).
            let refused = T::DTYPE == DType::BF16 && format == ScaleFormat::Ue8m0;
            let kind = |b: usize| match BLOCKS[b % BLOCKS.len()] {
                Block::Subnormal if refused => Block::TinyNormal,
                kind => kind,
            };
            let w = block_weights::<T>(experts, n, k, (experts * n + k) as u64, kind);
            let want = host_weight_bits(&w, experts, n, k, format).unwrap_or_else(|e| panic!("{ctx}: host: {e}"));
            let w_dev = stream.clone_htod(&w).unwrap();
            let (got, word) = device_quantise(stream, &w_dev, (experts, n, k), format);
            assert_eq!(word, 0, "{ctx}: finite weights set no status bit");
            same_weight_bits(&got, &want, (n, k), |_| false).unwrap_or_else(|m| panic!("{ctx}: {m}"));
            if (experts, n, k) != (2, 200, 328) {
                continue;
            }
            // What the comparison covered: subnormal f32 scales (bf16), saturation, the all-zero blocks.
            let wf = f32s(&w);
            let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
            let scale_of = |i: usize| {
                let (e, r, c) = (i / (n * k), i / k % n, i % k);
                f32::from_bits(got.1[(e * gn + r / 128) * gk + c / 128])
            };
            let saturated = (0..wf.len())
                .filter(|&i| (wf[i] as f64 / scale_of(i) as f64).abs() > 448.0 && got.0[i] & 0x7F == 0x7E)
                .count();
            // Scales of at most 2^-126: subnormal f32 ones, and UE8M0's 2^-126 and 2^-127 (0x400000).
            let tiny_scales = got.1.iter().filter(|&&b| b <= 0x0080_0000).count();
            assert!(got.1.iter().filter(|&&b| b == 1f32.to_bits()).count() >= 3, "{ctx}: zero blocks have scale 1");
            assert!(got.0.contains(&0x80), "{ctx}: -0 stays -0");
            if T::DTYPE == DType::BF16 {
                assert!(tiny_scales >= 3, "{ctx}: {tiny_scales} scales of at most 2^-126");
                if format == ScaleFormat::F32 {
                    assert!(saturated >= 1, "{ctx}: a subnormal block's corner saturates");
                } else {
                    assert!(got.1.contains(&0x0040_0000), "{ctx}: the smallest UE8M0 scale, 2^-127");
                }
            }
        }
    }
}

/// The device quantiser gives the host quantiser's bits, e4m3 and scales, on every kind of block and shape.
#[test]
#[ignore = "needs an SM90 GPU"]
fn weight_block_quantisation_matches_the_host_quantiser_bit_for_bit() {
    let (_ctx, stream) = gpu();
    weights_match_host::<bf16>(&stream);
    weights_match_host::<f16>(&stream);
}

/// `w` with every bf16 subnormal replaced by 1/64, so that the host quantises it under UE8M0 too (a block of
/// subnormals only has no UE8M0 scale there: `ue8m0_blocks_below_the_smallest_scale_take_2_pow_minus_127`).
fn no_subnormals(mut w: Vec<bf16>) -> Vec<bf16> {
    for v in w.iter_mut().filter(|v| v.to_bits() & 0x7F80 == 0 && v.to_bits() & 0x7F != 0) {
        *v = bf16::from_f32(1.0 / 64.0);
    }
    w
}

/// The scalar path on misaligned views: a view starting one element into its buffer (k % 8 == 0 but w not 16-byte
/// aligned), quantised into weights whose buffers are whole allocations. Same bits as the host.
#[test]
#[ignore = "needs an SM90 GPU"]
fn misaligned_weight_views_take_the_scalar_path_with_the_same_bits() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    let w = no_subnormals(block_weights::<bf16>(experts, n, k, 5, |b| BLOCKS[(b + 2) % BLOCKS.len()]));
    let padded = [vec![bf16::from_f32(9.0)], w.clone()].concat();
    let buf = stream.clone_htod(&padded).unwrap();
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let mut st = DeviceStatus::new(&stream).unwrap();
        let mut out = Fp8BlockWeights::zeros(&stream, experts, n, k).unwrap();
        quantize_weights(&stream, &buf.slice(1..), format, &mut out, &mut st).unwrap();
        st.check(&stream).unwrap();
        let want = host_weight_bits(&w, experts, n, k, format).unwrap();
        same_weight_bits(&device_weight_bits(&stream, &out), &want, (n, k), |_| false)
            .unwrap_or_else(|m| panic!("{format:?}: {m}"));
    }
}

/// bf16 blocks of subnormals only under UE8M0: the host refuses them (no UE8M0 ceiling of a scale below 2^-128);
/// the device takes 2^-127, the smallest UE8M0, and `e4m3(w / 2^-127)`. Every other block is the host's.
#[test]
#[ignore = "needs an SM90 GPU"]
fn ue8m0_blocks_below_the_smallest_scale_take_2_pow_minus_127() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    // Blocks 1, 5 and 9: an interior block and the corner block of expert 0, an edge-row block of expert 1.
    let sub = |b: usize| b % 4 == 1;
    let kind = |b: usize| match BLOCKS[b % BLOCKS.len()] {
        _ if sub(b) => Block::Subnormal,
        Block::Subnormal => Block::TinyNormal,
        kind => kind,
    };
    let w = block_weights::<bf16>(experts, n, k, 77, kind);
    let e = host_weight_bits(&w, experts, n, k, ScaleFormat::Ue8m0).unwrap_err().to_string();
    assert!(e.contains("outside 2^-127"), "the host refuses the block: {e}");
    let block_of = |i: usize| ((i / (n * k)) * gn + i / k % n / 128) * gk + i % k / 128;
    // The host's bits of every other block: the refused blocks zeroed, their expected bits put in by hand.
    let others: Vec<bf16> =
        w.iter().enumerate().map(|(i, &v)| if sub(block_of(i)) { bf16::from_f32(0.0) } else { v }).collect();
    let mut want = host_weight_bits(&others, experts, n, k, ScaleFormat::Ue8m0).unwrap();
    let smallest = 2f32.powi(-127);
    assert_eq!(smallest.to_bits(), 0x0040_0000);
    for (b, s) in want.1.iter_mut().enumerate().filter(|(b, _)| sub(*b)) {
        assert_eq!(*s, 1f32.to_bits(), "block {b} zeroed");
        *s = smallest.to_bits();
    }
    for (i, q) in want.0.iter_mut().enumerate().filter(|(i, _)| sub(block_of(*i))) {
        *q = F8E4M3::from_f32(w[i].to_f32() / smallest).to_bits();
    }
    let w_dev = stream.clone_htod(&w).unwrap();
    let (got, word) = device_quantise(&stream, &w_dev, (experts, n, k), ScaleFormat::Ue8m0);
    assert_eq!(word, 0, "a refused-on-the-host block is no device error");
    same_weight_bits(&got, &want, (n, k), |_| false).unwrap_or_else(|m| panic!("{m}"));
    // Nothing saturates at 2^-127: |w| <= 2^-127 gives quotients <= 1.
    assert!(got.0.iter().enumerate().filter(|(i, _)| sub(block_of(*i))).all(|(_, q)| q & 0x7F <= 0x38));
}

/// NaN and ±∞ weights, which the host refuses, set NONFINITE_INPUT; they become the e4m3 NaN with their sign,
/// the rest of their blocks is quantised by the scale of the finite elements (the host's bits of the same weights
/// with those elements zeroed), every other block as usual.
#[test]
#[ignore = "needs an SM90 GPU"]
fn non_finite_weights_are_flagged_and_become_e4m3_nan() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let w = no_subnormals(block_weights(experts, n, k, 13, |b| BLOCKS[(b * 5) % BLOCKS.len()]));
        // (expert, row, col): a NaN and a −NaN in an interior block, +∞ and −∞ in an edge block, a NaN alone in
        // the corner block of expert 1 (whose other elements keep their scale).
        let bad = [
            ((0usize, 3usize, 7usize), bf16::NAN),
            ((0, 100, 120), -bf16::NAN),
            ((0, 150, 300), bf16::INFINITY),
            ((0, 199, 327), bf16::NEG_INFINITY),
            ((1, 199, 327), bf16::NAN),
        ];
        let index = |(e, r, c): (usize, usize, usize)| (e * n + r) * k + c;
        let mut poisoned = w.clone();
        for (at, v) in bad {
            poisoned[index(at)] = v;
        }
        let e = host_weight_bits(&poisoned, experts, n, k, format).unwrap_err().to_string();
        assert!(e.contains("not finite"), "the host refuses non-finite weights: {e}");
        let mut zeroed = w.clone();
        for (at, _) in bad {
            zeroed[index(at)] = bf16::from_f32(0.0);
        }
        let want = host_weight_bits(&zeroed, experts, n, k, format).unwrap();
        let w_dev = stream.clone_htod(&poisoned).unwrap();
        let (got, word) = device_quantise(&stream, &w_dev, (experts, n, k), format);
        assert_eq!(word, bits::NONFINITE_INPUT, "{format:?}: the status names the non-finite input");
        let bad_at: Vec<usize> = bad.iter().map(|(at, _)| index(*at)).collect();
        same_weight_bits(&got, &want, (n, k), |i| bad_at.contains(&i)).unwrap_or_else(|m| panic!("{format:?}: {m}"));
        for (at, v) in bad {
            let nan = if v.is_sign_negative() { 0xFF } else { 0x7F };
            assert_eq!(got.0[index(at)], nan, "{format:?}: {at:?} = {v} becomes the e4m3 NaN with its sign");
        }
    }
}

/// The weight quantisation is graph-safe: captured once into preallocated weights, replayed with new bf16 weights
/// in the same buffer, equal to the host each time.
#[test]
#[ignore = "needs an SM90 GPU"]
fn weight_quantisation_replays_in_a_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (experts, n, k) = (3usize, 384usize, 256usize);
    let mut w_dev: CudaSlice<bf16> = stream.alloc_zeros(experts * n * k).unwrap();
    let mut out = Fp8BlockWeights::zeros(&stream, experts, n, k).unwrap();
    stream.synchronize().unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    quantize_weights(&stream, &w_dev.as_view(), ScaleFormat::Ue8m0, &mut out, &mut st).unwrap();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
    for replay in 0..4u64 {
        let w = block_weights::<bf16>(experts, n, k, 200 + replay, |b| {
            [Block::Random, Block::Wide, Block::Huge, Block::Ties][(b + replay as usize) % 4]
        });
        stream.memcpy_htod(&w, &mut w_dev).unwrap();
        graph.launch().unwrap();
        st.check(&stream).unwrap();
        let want = host_weight_bits(&w, experts, n, k, ScaleFormat::Ue8m0).unwrap();
        same_weight_bits(&device_weight_bits(&stream, &out), &want, (n, k), |_| false)
            .unwrap_or_else(|m| panic!("replay {replay}: {m}"));
    }
}

/// A bf16 checkpoint's experts converted on the device (w13 `[E, 2I, H]` and w2 `[E, H, I]`, each one call) give
/// the FP8 layer exactly the weights of the host conversion (`PackedFp8Experts::quantize`, gate and up quantised
/// apart, then `Fp8ExpertWeights::upload`), for both DeepSeek configurations.
#[test]
#[ignore = "needs an SM90 GPU"]
fn device_converted_experts_equal_the_host_conversion() {
    let (_ctx, stream) = gpu();
    let (e, h, i) = (3usize, 384usize, 256usize);
    let w13 = block_weights::<bf16>(e, 2 * i, h, 31, |b| [Block::Random, Block::Wide, Block::Ties][b % 3]);
    let w2 = block_weights::<bf16>(e, h, i, 32, |b| [Block::Wide, Block::Random][b % 2]);
    let dense = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13.clone(), w2.clone(), None, None).unwrap();
    let (w13_dev, w2_dev) = (stream.clone_htod(&w13).unwrap(), stream.clone_htod(&w2).unwrap());
    for config in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1] {
        let host = PackedFp8Experts::quantize(&dense, &config).unwrap();
        let format = host.scale_format();
        let uploaded = Fp8ExpertWeights::upload(&stream, &host, ExpertFormat::SWIGLU).unwrap();
        let mut st = DeviceStatus::new(&stream).unwrap();
        let q13 = Fp8BlockWeights::quantize_device(&stream, &w13_dev.as_view(), e, 2 * i, h, format, &mut st).unwrap();
        let q2 = Fp8BlockWeights::quantize_device(&stream, &w2_dev.as_view(), e, h, i, format, &mut st).unwrap();
        st.check(&stream).unwrap();
        let quant = if format == ScaleFormat::Ue8m0 { GroupQuant::DEEPSEEK_UE8M0 } else { GroupQuant::DEEPSEEK };
        let converted = Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, q13, q2, None, None)
            .unwrap()
            .with_activation_quant(quant);
        assert_eq!(converted.activation_quant(), uploaded.activation_quant(), "{format:?}");
        for (name, got, want) in [("w13", converted.w13(), uploaded.w13()), ("w2", converted.w2(), uploaded.w2())] {
            let (n, k) = (got.n(), got.k());
            same_weight_bits(&device_weight_bits(&stream, got), &device_weight_bits(&stream, want), (n, k), |_| false)
                .unwrap_or_else(|m| panic!("{format:?} {name}: {m}"));
        }
    }
}

/// Inputs that do not fit are refused before anything is queued (or allocated): a view of another length, zero
/// extents; the status word stays clear.
#[test]
#[ignore = "needs an SM90 GPU"]
fn mismatched_weight_inputs_are_refused_before_launch() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let w = stream.clone_htod(&vec![bf16::NAN; 2 * 200 * 328]).unwrap();
    let e =
        Fp8BlockWeights::quantize_device(&stream, &w.slice(1..), 2, 200, 328, ScaleFormat::F32, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "w", detail } if detail.contains("[2, 200, 328]")), "{e}");
    let e =
        Fp8BlockWeights::quantize_device(&stream, &w.as_view(), 0, 200, 328, ScaleFormat::F32, &mut st).unwrap_err();
    assert!(e.to_string().contains("positive"), "{e}");
    let mut other = Fp8BlockWeights::zeros(&stream, 2, 200, 320).unwrap();
    let e = quantize_weights(&stream, &w.as_view(), ScaleFormat::Ue8m0, &mut other, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "w", .. }), "{e}");
    assert!(Fp8BlockWeights::zeros(&stream, 2, 0, 320).is_err());
    st.check(&stream).unwrap(); // the NaN weights were never read
}
