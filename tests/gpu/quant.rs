//! FP8 activation quantisation on the GPU: the device kernels against the host reference
//! (`quant::per_token_group_quant`; per token, the same rules per row) bit for bit, on real shapes (K = 7168, 2048) and a partial last group (K = 200),
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
use moe_gemm::dtype::{DType, Element};
use moe_gemm::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use moe_gemm::quant::{
    dequantize_groups, per_token_group_quant, quantize_element, quantize_gather, quantize_rows, requantize_rows,
    Fp8Rows, Fp8TokenRows, GroupQuant, RowsInUse, ScaleRounding, TokenScale, ACT_GROUP, F8E4M3, VLLM_EPS,
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

pub(crate) fn f32s<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

fn has_nonfinite<T: Element>(x: &[T]) -> bool {
    x.iter().any(|v| !v.to_f32().is_finite())
}

/// `Ok` or the status word a check reported.
pub(crate) fn status_word(r: Result<()>) -> u32 {
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

/// Token rows filled with the sentinels.
fn sentinel_token_rows(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Fp8TokenRows {
    let q = stream.clone_htod(&vec![F8E4M3::from_bits(SENTINEL_Q); rows * k]).unwrap();
    let s = stream.clone_htod(&vec![SENTINEL_S; rows]).unwrap();
    Fp8TokenRows::new(q, s, rows, k).unwrap()
}

/// Token rows on the host: e4m3 `[rows, k]` and one scale per row.
fn token_rows_host(stream: &Arc<CudaStream>, out: &Fp8TokenRows) -> (Vec<F8E4M3>, Vec<f32>) {
    (stream.clone_dtoh(&out.q()).unwrap(), stream.clone_dtoh(&out.scales()).unwrap())
}

/// The host rules' scale of one row: `opts.scale` of its finite elements' amax.
fn token_scale_of(opts: &GroupQuant, row: &[f32]) -> f32 {
    opts.scale(row.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs())))
}

/// A device row (e4m3 `q`, scale `s`) against `row` quantised by the host rules under scale `want`, bit for bit:
/// `Err` names the first difference.
fn same_token_row(q: &[F8E4M3], s: f32, row: &[f32], want: f32) -> Result<(), String> {
    if s.to_bits() != want.to_bits() {
        return Err(format!("scale {s:e}, expected {want:e}"));
    }
    match row.iter().enumerate().find(|(c, &v)| q[*c].to_bits() != quantize_element(v, want).to_bits()) {
        Some((c, &v)) => {
            Err(format!("col {c}: e4m3 {:#04x}, expected {:#04x}", q[c].to_bits(), quantize_element(v, want).to_bits()))
        }
        None => Ok(()),
    }
}

/// A device row still holds the sentinels.
fn token_row_untouched(q: &[F8E4M3], s: f32) -> bool {
    q.iter().all(|v| v.to_bits() == SENTINEL_Q) && s == SENTINEL_S
}

/// Per-token quantisation (`Fp8TokenRows::quantize`, one scale per row: the rowwise GEMM's activations) against
/// the host rules per row (`GroupQuant::scale` of the row's amax, `quantize_element`) bit for bit: real and partial
/// K, special rows (zeros, NaN, ±∞, max among small values, subnormals), every option, bf16 and f16, the vector
/// and (a strided, misaligned view) the scalar path; rows past x untouched; non-finite inputs flagged.
fn token_rows_match_the_host_rules<T: Element>(stream: &Arc<CudaStream>) {
    let mut st = DeviceStatus::new(stream).unwrap();
    for (rows, k, stride, offset) in [
        (1usize, 7168usize, 7168usize, 0usize),
        (7, 2048, 2048, 0),
        (129, 200, 200, 0),
        (9, 200, 203, 1),
        (5, 13, 13, 0),
    ] {
        let x = inputs::<T>(rows, k, (rows * 17 + k) as u64);
        // x's rows `stride` apart, `offset` elements into the buffer (stride != k or offset != 0: scalar loads).
        let mut buf = vec![T::from_f32(0.0); offset + rows * stride];
        for r in 0..rows {
            buf[offset + r * stride..offset + r * stride + k].copy_from_slice(&x[r * k..(r + 1) * k]);
        }
        let x_dev = stream.clone_htod(&buf).unwrap();
        let view = MatrixView::with_stride("x", x_dev.slice(offset..offset + (rows - 1) * stride + k), rows, k, stride)
            .unwrap();
        for (name, opts) in options() {
            let ctx = format!("{} rows {rows} K {k} stride {stride} {name}", T::DTYPE);
            let spare = 2;
            let mut out = sentinel_token_rows(stream, rows + spare, k);
            out.quantize(stream, &view, &TokenScale::Dynamic(opts), &mut st).unwrap();
            let word = status_word(st.check(stream));
            assert_eq!(word, if has_nonfinite(&x) { bits::NONFINITE_INPUT } else { 0 }, "{ctx}: status");
            let (q, sc) = token_rows_host(stream, &out);
            for r in 0..rows {
                let xr = f32s(&x[r * k..(r + 1) * k]);
                same_token_row(&q[r * k..(r + 1) * k], sc[r], &xr, token_scale_of(&opts, &xr))
                    .unwrap_or_else(|m| panic!("{ctx}: row {r}: {m}"));
            }
            for r in rows..rows + spare {
                assert!(token_row_untouched(&q[r * k..(r + 1) * k], sc[r]), "{ctx}: row {r} past x was written");
            }
        }
    }
    // A view of another K, or more rows than the token rows hold, is refused before any launch.
    let x = stream.clone_htod(&vec![T::from_f32(1.0); 4 * 64]).unwrap();
    let mut out = Fp8TokenRows::zeros(stream, 3, 64).unwrap();
    let dynamic = TokenScale::Dynamic(GroupQuant::DEEPSEEK);
    let four = MatrixView::new("x", x.as_view(), 4, 64).unwrap();
    assert!(matches!(out.quantize(stream, &four, &dynamic, &mut st), Err(Error::Buffer { .. })));
    let wide = MatrixView::new("x", x.as_view(), 2, 128).unwrap();
    assert!(matches!(out.quantize(stream, &wide, &dynamic, &mut st), Err(Error::Buffer { .. })));
}

/// A static scale (a checkpoint's `input_scale` on the device) quantises every row by it as given, saturating
/// elements past 448 · scale; one that is 0, negative, NaN or infinite is replaced by 1 and reported.
#[test]
#[ignore = "needs an SM90 GPU"]
fn per_token_quantisation_with_a_static_scale() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (rows, k) = (33usize, 2048usize);
    let x: Vec<bf16> = random_vec(rows * k, 21, 8.0);
    let x_dev = stream.clone_htod(&x).unwrap();
    let view = MatrixView::new("x", x_dev.as_view(), rows, k).unwrap();
    // A calibrated scale, one too small (elements saturate to ±448) and the invalid ones.
    for (given, used, flagged) in [
        (8.0f32 / 448.0, 8.0f32 / 448.0, false),
        (1.0 / 448.0, 1.0 / 448.0, false),
        (0.0, 1.0, true),
        (-0.5, 1.0, true),
        (f32::NAN, 1.0, true),
        (f32::INFINITY, 1.0, true),
    ] {
        let scale = stream.clone_htod(&[given]).unwrap();
        let mut out = Fp8TokenRows::zeros(&stream, rows, k).unwrap();
        out.quantize(&stream, &view, &TokenScale::Static(&scale), &mut st).unwrap();
        let word = status_word(st.check(&stream));
        assert_eq!(word, if flagged { bits::BAD_STATIC_SCALE } else { 0 }, "scale {given}: status");
        let (q, sc) = token_rows_host(&stream, &out);
        for r in 0..rows {
            same_token_row(&q[r * k..(r + 1) * k], sc[r], &f32s(&x[r * k..(r + 1) * k]), used)
                .unwrap_or_else(|m| panic!("scale {given}: row {r}: {m}"));
        }
    }
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn per_token_quantisation_matches_the_host_rules_bit_for_bit() {
    let (_ctx, stream) = gpu();
    token_rows_match_the_host_rules::<bf16>(&stream);
    token_rows_match_the_host_rules::<f16>(&stream);
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

/// The per-token gather (`Fp8TokenRows::quantize_gather`) writes at every placed position the token's row quantised
/// by the host rules with one scale per row; positions no slot placed keep the sentinels; non-finite rows reported.
#[test]
#[ignore = "needs an SM90 GPU"]
fn per_token_gather_quantisation_writes_each_placed_position() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (tokens, top_k, experts) = (300usize, 8usize, 32usize);
    for k in [2048usize, 200] {
        for spec in [LayoutSpec::Aligned { block_m: 128 }, LayoutSpec::Grouped, LayoutSpec::Masked { max_m: 120 }] {
            let (layout, positions) = layout(&stream, spec, tokens, top_k, experts, 5 + k as u64);
            let cap = layout.dims().capacity();
            let x = inputs::<bf16>(tokens, k, 23 + k as u64);
            let x_dev = stream.clone_htod(&x).unwrap();
            let view = MatrixView::new("x", x_dev.as_view(), tokens, k).unwrap();
            let opts = GroupQuant::new(VLLM_EPS, ScaleRounding::Exact).unwrap();
            let ctx = format!("{spec:?} K {k}");
            let mut out = sentinel_token_rows(&stream, cap, k);
            out.quantize_gather(&stream, &layout, &view, &TokenScale::Dynamic(opts), &mut st).unwrap();
            let word = status_word(st.check(&stream));
            assert_eq!(word, bits::NONFINITE_INPUT, "{ctx}: the NaN and infinite rows of x are reported");
            let (q, sc) = token_rows_host(&stream, &out);
            let mut placed = vec![false; cap];
            for (slot, &p) in positions.iter().enumerate() {
                if p < 0 {
                    continue;
                }
                let (p, t) = (p as usize, slot / top_k);
                placed[p] = true;
                let xr = f32s(&x[t * k..(t + 1) * k]);
                same_token_row(&q[p * k..(p + 1) * k], sc[p], &xr, token_scale_of(&opts, &xr))
                    .unwrap_or_else(|m| panic!("{ctx}: position {p} (token {t}): {m}"));
            }
            for p in (0..cap).filter(|&p| !placed[p]) {
                let untouched = token_row_untouched(&q[p * k..(p + 1) * k], sc[p]);
                assert!(untouched, "{ctx}: position {p} has no slot but was written");
            }
            assert!(placed.iter().any(|&x| !x), "{ctx}: the layout has unplaced positions to check");
        }
    }
}

/// An activation output `h [capacity, inter]` over an aligned layout of 200 tokens (top-8 of 32 experts, a quarter
/// of them remote): random where a row is in use (an expert in range, before the layout's total), NaN elsewhere, so
/// that a kernel reading a row not in use sets the status bit.
struct ActivationRows {
    layout: ExpertLayout,
    m_indices: Vec<i32>,
    total: usize,
    local: i32,
    h: Vec<bf16>,
}

impl ActivationRows {
    /// Whether position `p` is in use with `total` rows counted.
    fn in_use(&self, p: usize, total: usize) -> bool {
        p < total && (0..self.local).contains(&self.m_indices[p])
    }
}

fn activation_rows(stream: &Arc<CudaStream>, layout_seed: u64, h_seed: u64, inter: usize) -> ActivationRows {
    let (layout, _) = layout(stream, LayoutSpec::Aligned { block_m: 64 }, 200, 8, 32, layout_seed);
    let cap = layout.dims().capacity();
    let m_indices = stream.clone_dtoh(layout.m_indices()).unwrap();
    let total = stream.clone_dtoh(layout.total()).unwrap()[0] as usize;
    let local = layout.dims().local_experts() as i32;
    let mut rows = ActivationRows { layout, m_indices, total, local, h: random_vec(cap * inter, h_seed, 4.0) };
    for p in 0..cap {
        if !rows.in_use(p, total) {
            rows.h[p * inter..(p + 1) * inter].fill(bf16::NAN);
        }
    }
    rows
}

/// Requantising the activation output touches only the rows in use: an expert in range (m_indices) and before
/// the total. The rows not in use hold NaN, so reading them would also set the status bit.
#[test]
#[ignore = "needs an SM90 GPU"]
fn requantisation_skips_rows_not_in_use() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let inter = 768usize;
    let act = activation_rows(&stream, 5, 9, inter);
    let (layout, h, total, local) = (&act.layout, &act.h, act.total, act.local);
    let cap = layout.dims().capacity();
    let h_dev = stream.clone_htod(h).unwrap();
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
                if act.in_use(p, t) {
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
    requantize_rows(&stream, &view, &RowsInUse::of_layout(layout), &mut a, &GroupQuant::DEEPSEEK, &mut st).unwrap();
    let rows = RowsInUse::new(layout.m_indices().as_view(), local as usize, Some(layout.total()));
    requantize_rows(&stream, &view, &rows, &mut b, &GroupQuant::DEEPSEEK, &mut st).unwrap();
    st.check(&stream).unwrap();
    let host_bits = |o: &Fp8Rows| {
        let (q, s) = o.to_host(&stream).unwrap();
        (q.iter().map(|v| v.to_bits()).collect::<Vec<u8>>(), s.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
    };
    assert_eq!(host_bits(&a), host_bits(&b));
}

/// Per-token requantisation (`Fp8TokenRows::requantize`) touches only the rows in use (those not in use hold NaN,
/// so reading one would set the status bit) and writes them by the host rules with one scale per row.
#[test]
#[ignore = "needs an SM90 GPU"]
fn per_token_requantisation_skips_rows_not_in_use() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let inter = 768usize;
    let act = activation_rows(&stream, 7, 11, inter);
    let (layout, h) = (&act.layout, &act.h);
    let cap = layout.dims().capacity();
    let h_dev = stream.clone_htod(h).unwrap();
    let view = MatrixView::new("h", h_dev.as_view(), cap, inter).unwrap();
    for (name, opts) in options() {
        let mut out = sentinel_token_rows(&stream, cap, inter);
        out.requantize(&stream, &view, &RowsInUse::of_layout(layout), &TokenScale::Dynamic(opts), &mut st).unwrap();
        assert_eq!(status_word(st.check(&stream)), 0, "{name}: a row not in use (NaN) was read");
        let (q, sc) = token_rows_host(&stream, &out);
        for p in 0..cap {
            let (qr, s) = (&q[p * inter..(p + 1) * inter], sc[p]);
            if !act.in_use(p, act.total) {
                assert!(token_row_untouched(qr, s), "{name}: row {p} not in use was written");
                continue;
            }
            let hr = f32s(&h[p * inter..(p + 1) * inter]);
            same_token_row(qr, s, &hr, token_scale_of(&opts, &hr)).unwrap_or_else(|m| panic!("{name}: row {p}: {m}"));
        }
    }
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
