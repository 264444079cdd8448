//! FP8 activation quantisation (`cpp/moe_ops/quant.cu`, rules in `cpp/moe_ops/quant.h`): 16-bit rows to e4m3 with one f32 scale
//! per token per 128 columns, stored K-major `[rows][ceil(K / 128)]`; either row by row (with an optional mask of
//! rows in use) or gathered to each token's layout positions.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};
use float8::F8E4M3;

use super::bridge::ffi;
use super::status::{check, Launched};
use super::sys;
use super::{dtype, need_len, to_i32, to_i64};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// Columns per scale (`kQuantGroup`).
pub(crate) const GROUP: usize = 128;

/// How to quantise (the scalars of `QuantArgs`): `k` columns, the amax floor `eps`, scales rounded up to powers
/// of two or not, one scale per 128 columns or (`per_row`) per row, with `per_row` optionally one static scale
/// (f32 `[1]` on the device) for every row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantDesc<'a> {
    pub k: usize,
    pub eps: f32,
    pub ue8m0: bool,
    pub per_row: bool,
    pub static_scale: Option<&'a CudaSlice<f32>>,
}

impl QuantDesc<'_> {
    /// Scales per row: one per 128 columns, or one.
    fn groups(&self) -> usize {
        if self.per_row {
            1
        } else {
            self.k.div_ceil(GROUP)
        }
    }
}

/// The source rows: `rows` rows of `k` columns, `stride` elements apart, in `x`.
pub(crate) struct QuantSrc<'a, T> {
    pub x: &'a CudaView<'a, T>,
    pub rows: usize,
    pub stride: usize,
}

/// Rows to skip (`QuantSource::Rows`): those whose expert in `row_experts` is outside `0..experts`, and those at
/// or after `*total`.
pub(crate) struct RowMask<'a> {
    pub row_experts: &'a CudaView<'a, i32>,
    pub experts: usize,
    pub total: Option<&'a CudaSlice<i32>>,
}

/// The destination: e4m3 `[rows, k]` and f32 scales `[rows, ceil(k / 128)]` (`[rows]` per row); with `amax` (per
/// row only), one dynamic scale for every row, the whole call's amax reduced into that word first.
pub(crate) struct QuantDst<'a> {
    pub data: &'a mut CudaSlice<F8E4M3>,
    pub scales: &'a mut CudaSlice<f32>,
    pub rows: usize,
    pub amax: Option<&'a mut CudaSlice<u32>>,
}

fn check_desc(d: &QuantDesc<'_>) -> Result<()> {
    if let Some(s) = d.static_scale {
        if !d.per_row {
            return Err(Error::InvalidProblem("a static scale is per token: per_row must be set".into()));
        }
        need_len("static scale", s.len(), 1, "one f32")?;
    }
    // eps / 448 normal: the UE8M0 rounding reads the exponent field of a normal f32, and no scale is 0.
    if !(d.eps.is_finite() && d.eps / 448.0 >= f32::MIN_POSITIVE) {
        return Err(Error::InvalidProblem(format!(
            "eps = {:e}: must be finite with eps / 448 a normal f32 (eps >= {:e})",
            d.eps,
            f32::MIN_POSITIVE * 448.0
        )));
    }
    if d.k == 0 {
        return Err(Error::InvalidProblem("k = 0: quantised rows need at least one column".into()));
    }
    Ok(())
}

fn check_src<T>(s: &QuantSrc<'_, T>, k: usize) -> Result<()> {
    if s.stride < k {
        return Err(Error::InvalidProblem(format!("x row stride = {} is less than k = {k}", s.stride)));
    }
    let need = match s.rows {
        0 => Some(0),
        r => (r - 1).checked_mul(s.stride).and_then(|n| n.checked_add(k)),
    };
    let need =
        need.ok_or_else(|| Error::InvalidProblem(format!("x: {} rows of stride {} overflow", s.rows, s.stride)))?;
    need_len("x", s.x.len(), need, "(rows - 1) x stride + k")
}

fn check_dst(d: &QuantDst<'_>, desc: &QuantDesc<'_>) -> Result<(usize, usize)> {
    let (k, groups) = (desc.k, desc.groups());
    let data = d.rows.checked_mul(k);
    let scales = d.rows.checked_mul(groups);
    let (Some(data), Some(scales)) = (data, scales) else {
        return Err(Error::InvalidProblem(format!("fp8 rows: {} rows of {k} columns overflow", d.rows)));
    };
    need_len("fp8 data", d.data.len(), data, "rows x k")?;
    need_len("fp8 scales", d.scales.len(), scales, if desc.per_row { "rows" } else { "rows x ceil(k / 128)" })?;
    if let Some(w) = &d.amax {
        if !desc.per_row || desc.static_scale.is_some() {
            return Err(Error::InvalidProblem(
                "a dynamic per-tensor scale is per row and excludes a static one: per_row set, no static scale".into(),
            ));
        }
        need_len("amax word", w.len(), 1, "one u32")?;
    }
    Ok((data, scales))
}

/// What both quantisers of rows check first: the description, the source rows and the destination.
fn check_rows<T>(d: &QuantDesc<'_>, src: &QuantSrc<'_, T>, dst: &QuantDst<'_>) -> Result<()> {
    check_desc(d)?;
    check_src(src, d.k)?;
    check_dst(dst, d).map(|_| ())
}

#[allow(clippy::too_many_arguments)]
fn quant_args(
    ty: sys::DType,
    source: sys::QuantSource,
    d: &QuantDesc<'_>,
    rows: usize,
    top_k: usize,
    stride: usize,
    out_rows: usize,
    experts: usize,
) -> Result<sys::QuantArgs> {
    Ok(sys::QuantArgs {
        dtype: ty,
        source,
        rows: to_i64("rows", rows)?,
        top_k: to_i32("top_k", top_k)?,
        k: to_i32("k", d.k)?,
        x_stride: to_i64("x row stride", stride)?,
        x: 0,
        positions: 0,
        out_rows: to_i64("fp8 rows", out_rows)?,
        total: 0,
        row_experts: 0,
        experts: to_i32("experts", experts)?,
        eps: d.eps,
        ue8m0: d.ue8m0 as i32,
        per_row: d.per_row as i32,
        scale: 0,
        amax: 0,
        out: 0,
        scales: 0,
        status: 0,
        stream: 0,
    })
}

/// The stream guards of the buffers [`bind_rows`] binds.
type RowGuards<'s> = [Option<SyncOnDrop<'s>>; 6];

/// Binds the stream's context to this thread and sets in `p` the stream and the addresses of the buffers both
/// quantisers of rows use: x, the static scale, the output rows and their scales, the amax word and the status.
/// Keep the guards, which order the buffers on `stream`, until the C++ call has returned.
fn bind_rows<'s, T>(
    stream: &'s CudaStream,
    p: &mut sys::QuantArgs,
    d: &QuantDesc<'s>,
    x: &'s CudaView<'s, T>,
    dst: QuantDst<'s>,
    status: &'s mut impl DevicePtrMut<u32>,
) -> Result<RowGuards<'s>> {
    super::bind(stream)?;
    let (x_ptr, gx) = x.device_ptr(stream);
    let (scale_ptr, gscale) = d.static_scale.map(|s| s.device_ptr(stream)).unzip();
    let (o_ptr, go) = dst.data.device_ptr_mut(stream);
    let (sc_ptr, gsc) = dst.scales.device_ptr_mut(stream);
    let (a_ptr, ga) = dst.amax.map(|w| w.device_ptr_mut(stream)).unzip();
    let (s_ptr, gs) = status.device_ptr_mut(stream);
    (p.x, p.scale, p.amax) = (x_ptr, scale_ptr.unwrap_or(0), a_ptr.unwrap_or(0));
    (p.out, p.scales, p.status) = (o_ptr, sc_ptr, s_ptr);
    p.stream = stream.cu_stream() as u64;
    Ok([Some(gx), gscale, Some(go), Some(gsc), ga, Some(gs)])
}

/// Queues `dst row r = quant(src row r)` for the `src.rows` rows (those `mask` keeps).
pub(crate) fn launch_quantize_rows<T: Element>(
    stream: &CudaStream,
    d: &QuantDesc<'_>,
    src: &QuantSrc<'_, T>,
    mask: Option<&RowMask<'_>>,
    dst: QuantDst<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    check_rows(d, src, &dst)?;
    if dst.rows < src.rows {
        return Err(Error::Buffer { name: "fp8 rows", detail: format!("has {} rows, x {}", dst.rows, src.rows) });
    }
    if let Some(m) = mask {
        need_len("row experts", m.row_experts.len(), src.rows, "rows")?;
        if let Some(t) = m.total {
            need_len("total", t.len(), 1, "one count")?;
        }
    }
    let experts = mask.map_or(0, |m| m.experts);
    let mut p = quant_args(dtype(T::DTYPE), sys::QuantSource::Rows, d, src.rows, 1, src.stride, dst.rows, experts)?;
    let _guards = bind_rows(stream, &mut p, d, src.x, dst, status)?;
    let (re_ptr, _re) = mask.map(|m| m.row_experts.device_ptr(stream)).unzip();
    let (t_ptr, _t) = mask.and_then(|m| m.total).map(|t| t.device_ptr(stream)).unzip();
    p.row_experts = re_ptr.unwrap_or(0);
    p.total = t_ptr.unwrap_or(0);
    // SAFETY: x holds (rows - 1) * stride + k elements (checked), so every row the kernel reads is inside it; out
    // holds dst.rows * k bytes and scales dst.rows * ceil(k / 128) floats (dst.rows per row) with dst.rows >= rows
    // (checked), and the kernel writes only rows < rows. row_experts holds `rows` ids (checked), which the kernel
    // range-checks against `experts` before use; total is one int32, clamped to [0, rows] on the device. Any
    // alignment works (the kernel picks its vector path from the addresses). eps / 448 is a normal f32, and a
    // static scale is one f32 the kernel reads as untrusted data (checked); the amax word is one u32 (checked),
    // zeroed and written on the stream before the rows read it. The stream's context is bound to this thread;
    // guards outlive the call.
    check(unsafe { ffi::quantize_fp8(&p) }, &Launched::typed("quantize_fp8", T::DTYPE))
}

/// Queues `dst row positions[t·top_k + j] = quant(src row t)` for the `src.rows` tokens and their `top_k` slots;
/// negative positions are dropped, positions at or past `dst.rows` dropped and reported (capacity overflow).
pub(crate) fn launch_quantize_gather<T: Element>(
    stream: &CudaStream,
    d: &QuantDesc<'_>,
    src: &QuantSrc<'_, T>,
    top_k: usize,
    positions: &impl DevicePtr<i32>,
    dst: QuantDst<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    check_rows(d, src, &dst)?;
    if top_k == 0 {
        return Err(Error::InvalidProblem("top_k = 0: every token has at least one slot".into()));
    }
    let slots = src
        .rows
        .checked_mul(top_k)
        .ok_or_else(|| Error::InvalidProblem(format!("{} tokens x top_k = {top_k} overflow", src.rows)))?;
    need_len("positions", positions.len(), slots, "tokens x top_k")?;
    to_i64("tokens x top_k", slots)?;
    let mut p = quant_args(dtype(T::DTYPE), sys::QuantSource::Gather, d, src.rows, top_k, src.stride, dst.rows, 0)?;
    let _guards = bind_rows(stream, &mut p, d, src.x, dst, status)?;
    let (pos_ptr, _pos) = positions.device_ptr(stream);
    p.positions = pos_ptr;
    // SAFETY: x holds (tokens - 1) * stride + k elements and positions tokens * top_k ids (checked); out holds
    // dst.rows * k bytes and scales dst.rows * ceil(k / 128) floats, dst.rows per row (checked), and the kernel
    // writes a row only at a position in [0, dst.rows): positions are device data it range-checks (others
    // dropped, overflow reported). Any alignment works. eps / 448 is a normal f32, a static scale is one f32 the
    // kernel reads as untrusted data (checked), and the amax word one u32 (checked), zeroed and written on the
    // stream before the rows read it. The stream's context is bound to this thread; guards outlive the call.
    check(unsafe { ffi::quantize_fp8(&p) }, &Launched::typed("quantize_fp8", T::DTYPE))
}

/// Block quantisation of `experts` weights `[n, k]` per 128 × 128 block (the scalars of `WeightQuantArgs`):
/// scales rounded up to powers of two or not.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WeightQuantDesc {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    pub ue8m0: bool,
}

/// Rows and columns per weight scale (`kWeightBlock`).
const WEIGHT_BLOCK: usize = 128;

/// `(experts·n·k, experts·ceil(n / 128)·ceil(k / 128))`: the elements and scales of `d`, or the error naming the
/// extent the kernel cannot take (every extent positive, `n` and `k` within int32, the element count within
/// int64). Host arithmetic only: callers check a shape with it before they allocate.
pub(crate) fn weight_quant_lengths(d: &WeightQuantDesc) -> Result<(usize, usize)> {
    let shape = format!("[experts, n, k] = [{}, {}, {}]", d.experts, d.n, d.k);
    if d.experts == 0 || d.n == 0 || d.k == 0 {
        return Err(Error::InvalidProblem(format!("weights {shape}: every extent must be positive")));
    }
    to_i32("n (rows per expert)", d.n)?;
    to_i32("k (columns)", d.k)?;
    let elements = d
        .experts
        .checked_mul(d.n)
        .and_then(|x| x.checked_mul(d.k))
        .ok_or_else(|| Error::InvalidProblem(format!("weights {shape}: experts x n x k overflows usize")))?;
    to_i64(&format!("experts x n x k of weights {shape}"), elements)?;
    // At most `elements`: no overflow.
    Ok((elements, d.experts * d.n.div_ceil(WEIGHT_BLOCK) * d.k.div_ceil(WEIGHT_BLOCK)))
}

/// The buffer checks of a weight quantisation: `w` and `q` hold at least `experts·n·k` elements, `scales` at
/// least one per block.
fn check_weight_buffers(d: &WeightQuantDesc, w: usize, q: usize, scales: usize) -> Result<()> {
    let (elements, blocks) = weight_quant_lengths(d)?;
    need_len("w", w, elements, "experts x n x k")?;
    need_len("fp8 weights", q, elements, "experts x n x k")?;
    need_len("fp8 weight scales", scales, blocks, "experts x ceil(n / 128) x ceil(k / 128)")
}

/// Queues the block quantisation of `w [experts, n, k]` into `q [experts, n, k]` and f32 `scales
/// [experts, ceil(n / 128), ceil(k / 128)]` (`cpp/moe_ops/quant.h` states the rules); non-finite elements become the
/// e4m3 NaN and are reported through `status`.
pub(crate) fn launch_quantize_weights<T: Element>(
    stream: &CudaStream,
    d: &WeightQuantDesc,
    w: &impl DevicePtr<T>,
    q: &mut impl DevicePtrMut<F8E4M3>,
    scales: &mut impl DevicePtrMut<f32>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    check_weight_buffers(d, w.len(), q.len(), scales.len())?;
    let mut p = sys::WeightQuantArgs {
        dtype: dtype(T::DTYPE),
        ue8m0: d.ue8m0 as i32,
        experts: to_i64("experts", d.experts)?,
        n: to_i32("n (rows per expert)", d.n)?,
        k: to_i32("k (columns)", d.k)?,
        w: 0,
        out: 0,
        scales: 0,
        status: 0,
        stream: 0,
    };
    super::bind(stream)?;
    let (w_ptr, _w) = w.device_ptr(stream);
    let (q_ptr, _q) = q.device_ptr_mut(stream);
    let (sc_ptr, _sc) = scales.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    p.w = w_ptr;
    p.out = q_ptr;
    p.scales = sc_ptr;
    p.status = s_ptr;
    p.stream = stream.cu_stream() as u64;
    // SAFETY: w and q hold at least experts * n * k elements and scales one float per 128 x 128 block (checked);
    // the kernel reads and writes only elements (e, r, c) with r < n, c < k and the scale of each block, at int64
    // offsets (experts * n * k is within int64, n and k within int32: checked). Any alignment works (the kernel
    // picks its vector path from k and the addresses). The stream's context is bound to this thread; the guards
    // outlive the call.
    check(unsafe { ffi::quantize_weights_fp8(&p) }, &Launched::typed("quantize_weights_fp8", T::DTYPE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::invalid_problem as invalid;

    fn desc(experts: usize, n: usize, k: usize) -> WeightQuantDesc {
        WeightQuantDesc { experts, n, k, ue8m0: false }
    }

    #[test]
    fn weight_quant_lengths_count_edge_blocks() {
        assert_eq!(weight_quant_lengths(&desc(2, 200, 328)).unwrap(), (2 * 200 * 328, 2 * 2 * 3));
        assert_eq!(weight_quant_lengths(&desc(256, 4096, 7168)).unwrap(), (256 * 4096 * 7168, 256 * 32 * 56));
        assert_eq!(weight_quant_lengths(&desc(1, 1, 1)).unwrap(), (1, 1));
    }

    #[test]
    fn weight_quant_extents_the_kernel_cannot_take_are_named() {
        for (e, n, k) in [(0, 128, 128), (2, 0, 128), (2, 128, 0)] {
            let m = invalid(weight_quant_lengths(&desc(e, n, k)));
            assert!(m.contains(&format!("[{e}, {n}, {k}]")) && m.contains("positive"), "{m}");
        }
        let m = invalid(weight_quant_lengths(&desc(1, 1 << 31, 128)));
        assert!(m.contains("n (rows per expert) = 2147483648") && m.contains("int32"), "{m}");
        let m = invalid(weight_quant_lengths(&desc(1, 128, 1 << 31)));
        assert!(m.contains("k (columns) = 2147483648") && m.contains("int32"), "{m}");
        let m = invalid(weight_quant_lengths(&desc(usize::MAX / 2, 1 << 20, 1 << 20)));
        assert!(m.contains("overflows usize"), "{m}");
        // 2^63 elements fit usize but not the kernel's int64 offsets.
        let m = invalid(weight_quant_lengths(&desc(1 << 33, 1 << 15, 1 << 15)));
        assert!(m.contains("experts x n x k") && m.contains("int64"), "{m}");
    }

    #[test]
    fn weight_buffers_shorter_than_the_shape_are_named() {
        let d = desc(2, 200, 328);
        let (e, s) = weight_quant_lengths(&d).unwrap();
        assert!(check_weight_buffers(&d, e, e, s).is_ok());
        assert!(check_weight_buffers(&d, e + 1, e + 7, s + 3).is_ok(), "longer buffers are fine at this floor");
        for (w, q, sc, name) in [(e - 1, e, s, "w"), (e, e - 1, s, "fp8 weights"), (e, e, s - 1, "fp8 weight scales")] {
            match check_weight_buffers(&d, w, q, sc) {
                Err(Error::Buffer { name: got, detail }) => {
                    assert_eq!(got, name);
                    assert!(detail.contains("needs"), "{detail}");
                }
                other => panic!("{name}: expected a buffer error, got {other:?}"),
            }
        }
        assert!(matches!(check_weight_buffers(&desc(0, 1, 1), 0, 0, 0), Err(Error::InvalidProblem(_))));
    }
}
