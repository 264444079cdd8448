//! Row-wise kernels around the GEMMs: the gated activation (`cpp/moe_ops/activation.cu`), the fused backend's sum over
//! slots (`cpp/moe_ops/layouts.cu`) and the batched backend's whole decode layer (`cpp/moe_ops/decode.cu`).

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::bridge::ffi;
use super::status::{check, Launched};
use super::sys;
use super::{dtype, need_aligned, need_len, need_row_len, to_i32};
use crate::dtype::Element;
use crate::error::{Error, Result};

pub(crate) use sys::{Activation, GateUp};

/// Columns of `d1` (and of its bias) per row: `2I` gated, `I` for the plain SiLU.
fn d1_width(act: Activation, inter: usize) -> usize {
    if act == Activation::Silu {
        inter
    } else {
        2 * inter
    }
}

/// Gated activation (mirrors `ActivationArgs`): `rows` rows of `d1`, each with its expert in `row_experts`.
pub(crate) struct ActivationLaunch<'a> {
    pub act: Activation,
    pub gate_up: GateUp,
    pub inter: usize,
    pub rows: usize,
    pub total: Option<&'a CudaSlice<i32>>,
    pub row_experts: &'a CudaView<'a, i32>,
    pub experts: usize,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Queues `h = act(d1 (+ bias))` for the rows of `d1 [rows, 2I or I]` that have an expert.
pub(crate) fn launch_activate<T: Element>(
    stream: &CudaStream,
    p: &ActivationLaunch<'_>,
    d1: &impl DevicePtr<T>,
    h: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let width = d1_width(p.act, p.inter);
    need_len("d1", d1.len(), p.rows * width, "rows x (2I or I)")?;
    need_len("h", h.len(), p.rows * p.inter, "rows x I")?;
    need_len("row experts", p.row_experts.len(), p.rows, "rows")?;
    if let Some(b) = p.bias {
        need_len("b13 bias", b.len(), p.experts * width, "experts x (2I or I)")?;
    }
    // The kernel moves 8 elements per 16-byte vector: whole vectors per row, rows on 16-byte boundaries.
    need_row_len::<T>("I (activation)", p.inter)?;
    if p.rows > u32::MAX as usize {
        return Err(Error::InvalidProblem(format!("activation over {} rows of {} exceeds the grid", p.rows, p.inter)));
    }
    let experts = to_i32("experts", p.experts)?;
    super::bind(stream)?;
    let (d_ptr, _d) = d1.device_ptr(stream);
    let (h_ptr, _h) = h.device_ptr_mut(stream);
    need_aligned("d1", d_ptr)?;
    need_aligned("h", h_ptr)?;
    let (re_ptr, _re) = p.row_experts.device_ptr(stream);
    let (t_ptr, _t) = p.total.map(|t| t.device_ptr(stream)).unzip();
    let (b_ptr, _b) = p.bias.map(|b| b.device_ptr(stream)).unzip();
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let args = sys::ActivationArgs {
        dtype: dtype(T::DTYPE),
        act: p.act,
        gate_up: p.gate_up,
        inter: p.inter as i32,
        rows: p.rows as i64,
        total: t_ptr.unwrap_or(0),
        row_experts: re_ptr,
        experts,
        bias: b_ptr.unwrap_or(0),
        d1: d_ptr,
        h: h_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: d1 holds rows*(2I or I), h rows*I, row_experts rows, bias experts*(2I or I), I a multiple of 8, d1
    // and h 16-byte aligned (checked above); the kernel skips rows whose expert is outside [0, experts) and rows
    // at or past *total. The stream's context is bound to this thread; guards outlive the call.
    check(unsafe { ffi::activate(&args) }, &Launched::typed("activate", T::DTYPE))
}

/// Queues `y[t] = Σ_j pairs[t·k + j]` over the slots the layout placed (the Fused backend's combine).
pub(crate) fn launch_sum_slots<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    pairs: &impl DevicePtr<T>,
    positions: &CudaSlice<i32>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    need_row_len::<T>("hidden", hidden)?;
    need_len("pairs", pairs.len(), tokens * top_k * hidden, "tokens x top_k x hidden")?;
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    need_len("y", y.len(), tokens * hidden, "tokens x hidden")?;
    let (t, k) = (to_i32("tokens", tokens)?, to_i32("top_k", top_k)?);
    super::bind(stream)?;
    let (p_ptr, _p) = pairs.device_ptr(stream);
    let (pos_ptr, _pos) = positions.device_ptr(stream);
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    for (name, ptr) in [("pairs", p_ptr), ("y", y_ptr)] {
        need_aligned(name, ptr)?;
    }
    // SAFETY: pairs holds tokens*k*hidden, positions tokens*k, y tokens*hidden elements (checked), 16-byte
    // aligned rows (hidden a multiple of the element type's alignment, aligned bases). The stream's context is
    // bound to this thread; guards outlive the call.
    let s = unsafe {
        ffi::sum_slots(dtype(T::DTYPE), t, k, hidden as i32, p_ptr, pos_ptr, y_ptr, stream.cu_stream() as u64)
    };
    check(s, &Launched::typed("sum_slots", T::DTYPE))
}

/// The batched backend's layer (mirrors `DecodeArgs` without its activations): `experts` experts'
/// `w13 [E, 2I or I, H]`, `w2 [E, H, I]` and f32 biases `b13 [E, 2I or I]`, `b2 [E, H]`.
pub(crate) struct DecodeWeights<'a, T> {
    pub act: Activation,
    pub gate_up: GateUp,
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub w13: &'a CudaSlice<T>,
    pub w2: &'a CudaSlice<T>,
    pub b13: Option<&'a CudaSlice<f32>>,
    pub b2: Option<&'a CudaSlice<f32>>,
}

/// The per-token buffers of a decode pass (both decode layers take them): checked against `tokens`, `top_k`, `H`
/// and `I`, resolved to 16-byte-aligned device addresses on the bound stream, their guards held until drop.
pub(crate) struct DecodeIo<'a> {
    pub x: u64,
    pub ids: u64,
    pub weights: u64,
    pub h: u64,
    pub y: u64,
    pub status: u64,
    _sync: [SyncOnDrop<'a>; 6],
}

impl<'a> DecodeIo<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new<T: Element>(
        stream: &'a CudaStream,
        (tokens, top_k, hidden, inter): (usize, usize, usize, usize),
        x: &'a impl DevicePtr<T>,
        ids: &'a impl DevicePtr<i32>,
        weights: &'a impl DevicePtr<f32>,
        h: &'a mut CudaSlice<T>,
        y: &'a mut impl DevicePtrMut<T>,
        status: &'a mut impl DevicePtrMut<u32>,
    ) -> Result<DecodeIo<'a>> {
        let rows = tokens * top_k;
        need_len("x", x.len(), tokens * hidden, "tokens x hidden")?;
        need_len("topk_ids", ids.len(), rows, "tokens x top_k")?;
        need_len("topk_weights", weights.len(), rows, "tokens x top_k")?;
        need_len("h", h.len(), rows * inter, "rows x I")?;
        need_len("y", y.len(), tokens * hidden, "tokens x hidden")?;
        super::bind(stream)?;
        let (x, sx) = x.device_ptr(stream);
        let (ids, si) = ids.device_ptr(stream);
        let (weights, sw) = weights.device_ptr(stream);
        let (h, sh) = h.device_ptr_mut(stream);
        let (y, sy) = y.device_ptr_mut(stream);
        let (status, ss) = status.device_ptr_mut(stream);
        for (name, p) in [("x", x), ("h", h), ("y", y)] {
            need_aligned(name, p)?;
        }
        Ok(DecodeIo { x, ids, weights, h, y, status, _sync: [sx, si, sw, sh, sy, ss] })
    }
}

/// Queues the two decode kernels of the batched backend: the whole layer for `tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_decode_layer<T: Element>(
    stream: &CudaStream,
    w: &DecodeWeights<'_, T>,
    tokens: usize,
    top_k: usize,
    x: &impl DevicePtr<T>,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    h: &mut CudaSlice<T>,
    y: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let (hid, inter, e) = (w.hidden, w.inter, w.experts);
    need_row_len::<T>("hidden", hid)?;
    need_row_len::<T>("inter", inter)?;
    let width = d1_width(w.act, inter);
    need_len("w13", w.w13.len(), e * width * hid, "experts x (2I or I) x H")?;
    need_len("w2", w.w2.len(), e * hid * inter, "experts x H x I")?;
    if let Some(b) = w.b13 {
        need_len("b13", b.len(), e * width, "experts x (2I or I)")?;
    }
    if let Some(b) = w.b2 {
        need_len("b2", b.len(), e * hid, "experts x H")?;
    }
    let rows = tokens * top_k;
    if rows > u16::MAX as usize {
        return Err(Error::InvalidProblem(format!("decode path: {rows} rows exceed the grid's 65535")));
    }
    let io = DecodeIo::new(stream, (tokens, top_k, hid, inter), x, ids, weights, h, y, status)?;
    let (tokens, top_k, experts) = (to_i32("tokens", tokens)?, to_i32("top_k", top_k)?, to_i32("experts", e)?);
    let (w13_ptr, _w13) = w.w13.device_ptr(stream);
    let (w2_ptr, _w2) = w.w2.device_ptr(stream);
    let (b13_ptr, _b13) = w.b13.map(|b| b.device_ptr(stream)).unzip();
    let (b2_ptr, _b2) = w.b2.map(|b| b.device_ptr(stream)).unzip();
    for (name, p) in [("w13", w13_ptr), ("w2", w2_ptr)] {
        need_aligned(name, p)?;
    }
    let args = sys::DecodeArgs {
        dtype: dtype(T::DTYPE),
        act: w.act,
        gate_up: w.gate_up,
        tokens,
        top_k,
        experts,
        hidden: hid as i32,
        inter: inter as i32,
        x: io.x,
        ids: io.ids,
        weights: io.weights,
        w13: w13_ptr,
        w2: w2_ptr,
        b13: b13_ptr.unwrap_or(0),
        b2: b2_ptr.unwrap_or(0),
        h: io.h,
        y: io.y,
        status: io.status,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: x holds tokens*H, ids/weights tokens*k, h rows*I, y tokens*H, the weights E*(2I or I)*H and E*H*I
    // with biases E*(2I or I) and E*H (all checked above); H and I are multiples of the element type's alignment
    // (checked) and the bases 16-byte aligned, so every row is. Expert ids are device data the kernels
    // range-check. The stream's context is bound to this thread; guards outlive the call.
    check(unsafe { ffi::decode_layer(&args) }, &Launched::typed("decode_layer", T::DTYPE))
}
