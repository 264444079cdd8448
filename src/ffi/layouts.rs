//! The expert layouts (`cpp/moe_ops/layouts.cu`): the build from `topk_ids`, the gather of token rows to their
//! positions and the weighted combine back in token order.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use super::bridge::ffi;
use super::status::{check, Launched};
use super::sys;
use super::{dtype, need_aligned, need_len, need_row_len, to_i32, to_i64};
use crate::dtype::Element;
use crate::error::{Error, Result};

pub(crate) use sys::LayoutKind;

/// Most local experts the build kernel handles (per-expert counters in shared memory).
pub(crate) const MAX_EXPERTS: usize = 1024;

/// A layout's dimensions (mirrors `LayoutArgs` without its buffers): `Packed` experts padded to multiples of
/// `block_m` (1: none), or `Masked` with `max_m` rows each; `capacity` positions in all.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayoutDesc {
    pub kind: LayoutKind,
    pub max_tokens: usize,
    pub top_k: usize,
    pub experts: usize,
    pub local_experts: usize,
    pub block_m: usize,
    pub max_m: usize,
    pub capacity: usize,
}

/// Buffers a layout build writes.
pub(crate) struct LayoutOut<'a> {
    pub counts: &'a mut CudaSlice<i32>,
    pub offsets: &'a mut CudaSlice<i32>,
    pub sorted_ids: &'a mut CudaSlice<i32>,
    pub expert_ids: &'a mut CudaSlice<i32>,
    /// Zeroed per tile (the fused decode GEMMs' hand-off counters).
    pub block_ready: &'a mut CudaSlice<i32>,
    pub m_indices: &'a mut CudaSlice<i32>,
    pub positions: &'a mut CudaSlice<i32>,
    pub total: &'a mut CudaSlice<i32>,
    pub scratch: &'a mut CudaSlice<i32>,
}

/// int32 elements of scratch the layout build needs for `rows` rows (0 for the single-CTA path).
pub(crate) fn layout_scratch_ints(rows: usize, local_experts: usize) -> usize {
    ffi::layout_scratch_ints(rows as i64, local_experts as i64) as usize
}

/// Queues the layout build for `tokens` tokens.
pub(crate) fn launch_build_layout(
    stream: &CudaStream,
    dims: &LayoutDesc,
    tokens: usize,
    topk_ids: &impl DevicePtr<i32>,
    expert_map: Option<&CudaView<'_, i32>>,
    out: LayoutOut<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let rows = tokens * dims.top_k;
    if tokens > dims.max_tokens {
        return Err(Error::InvalidProblem(format!(
            "tokens = {tokens} exceeds the layout's max_tokens = {}",
            dims.max_tokens
        )));
    }
    if dims.local_experts == 0 || dims.local_experts > MAX_EXPERTS.min(dims.experts) || dims.block_m == 0 {
        return Err(Error::InvalidProblem(format!(
            "layout: local_experts = {} must be in 1..=min(experts = {}, {MAX_EXPERTS}) and block_m = {} positive",
            dims.local_experts, dims.experts, dims.block_m
        )));
    }
    need_len("topk_ids", topk_ids.len(), rows, "tokens x top_k")?;
    if let Some(m) = expert_map {
        need_len("expert_map", m.len(), dims.experts, "experts")?;
    }
    let cap = dims.capacity;
    need_len("counts", out.counts.len(), dims.local_experts, "local experts")?;
    need_len("offsets", out.offsets.len(), dims.local_experts + 1, "local experts + 1")?;
    need_len("sorted_ids", out.sorted_ids.len(), cap, "capacity")?;
    need_len("expert_ids", out.expert_ids.len(), cap / dims.block_m, "capacity / block_m")?;
    need_len("block_ready", out.block_ready.len(), cap / dims.block_m, "capacity / block_m")?;
    need_len("m_indices", out.m_indices.len(), cap, "capacity")?;
    need_len("positions", out.positions.len(), dims.max_tokens * dims.top_k, "max_tokens x top_k")?;
    need_len("scratch", out.scratch.len(), layout_scratch_ints(rows, dims.local_experts), "chunks x experts x 2")?;
    let (rows, experts, local_experts) =
        (to_i32("rows", rows)?, to_i32("experts", dims.experts)?, dims.local_experts as i32);
    let (block_m, max_m, capacity) =
        (to_i32("block_m", dims.block_m)?, to_i32("max_m", dims.max_m)?, to_i64("capacity", cap)?);
    super::bind(stream)?;
    let (t_ptr, _t) = topk_ids.device_ptr(stream);
    let (m_ptr, _m) = expert_map.map(|m| m.device_ptr(stream)).unzip();
    let (c_ptr, _c) = out.counts.device_ptr_mut(stream);
    let (o_ptr, _o) = out.offsets.device_ptr_mut(stream);
    let (si_ptr, _si) = out.sorted_ids.device_ptr_mut(stream);
    let (ei_ptr, _ei) = out.expert_ids.device_ptr_mut(stream);
    let (br_ptr, _br) = out.block_ready.device_ptr_mut(stream);
    let (mi_ptr, _mi) = out.m_indices.device_ptr_mut(stream);
    let (p_ptr, _p) = out.positions.device_ptr_mut(stream);
    let (tot_ptr, _tot) = out.total.device_ptr_mut(stream);
    let (sc_ptr, _sc) = out.scratch.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let args = sys::LayoutArgs {
        kind: dims.kind,
        rows,
        experts,
        local_experts,
        block_m,
        max_m,
        capacity,
        topk_ids: t_ptr,
        expert_map: m_ptr.unwrap_or(0),
        counts: c_ptr,
        offsets: o_ptr,
        sorted_ids: si_ptr,
        expert_ids: ei_ptr,
        block_ready: br_ptr,
        m_indices: mi_ptr,
        positions: p_ptr,
        total: tot_ptr,
        scratch: sc_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: every buffer holds what the dimensions imply (checked above: ids `rows`, map `experts`, counts and
    // offsets per local expert, the position-indexed arrays `capacity`, expert_ids and block_ready capacity / block_m, positions
    // max_tokens*k, scratch what C++ asks for these rows). Ids and map entries are device data the kernel
    // range-checks before indexing; positions past `capacity` are dropped. Local experts <= 1024 (checked) bounds
    // the kernel's shared memory. The stream's context is bound to this thread; guards outlive the call.
    check(unsafe { ffi::build_layout(&args) }, &Launched::op("build_layout"))
}

/// Queues `out[positions[r]] = x[r / top_k]` for `tokens * top_k` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_gather<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    x: &impl DevicePtr<T>,
    positions: &CudaSlice<i32>,
    out: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    need_row_len::<T>("hidden", hidden)?;
    need_len("x", x.len(), tokens * hidden, "tokens x hidden")?;
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    let out_rows = to_i64("out rows", out.len() / hidden)?;
    let (rows, k, h) = (to_i32("tokens x top_k", tokens * top_k)?, to_i32("top_k", top_k)?, hidden as i32);
    super::bind(stream)?;
    let (x_ptr, _x) = x.device_ptr(stream);
    let (p_ptr, _p) = positions.device_ptr(stream);
    let (o_ptr, _o) = out.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    for (name, p) in [("x", x_ptr), ("out", o_ptr)] {
        need_aligned(name, p)?;
    }
    // SAFETY: x holds tokens*hidden, positions tokens*top_k, out out_rows*hidden elements of 2 bytes, both
    // 16-byte aligned with 16-byte rows (hidden a multiple of the element type's alignment, checked); positions
    // are device data the kernel checks against out_rows before writing. The stream's context is bound to this
    // thread; guards outlive the call.
    let s = unsafe { ffi::gather_rows(rows, k, h, x_ptr, p_ptr, o_ptr, out_rows, s_ptr, stream.cu_stream() as u64) };
    check(s, &Launched::typed("gather_rows", T::DTYPE))
}

/// Queues `y[t] = Σ_j w[t, j] · (d[positions[t·k + j]] + bias[expert])`; `bias` is (the expert of each row of
/// `d`, f32 `[experts, hidden]`, experts).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_combine<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    d: &impl DevicePtr<T>,
    ld_d: usize,
    positions: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    bias: Option<(&CudaView<'_, i32>, &CudaView<'_, f32>, usize)>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    need_row_len::<T>("hidden", hidden)?;
    need_row_len::<T>("d's row stride", ld_d)?;
    if ld_d < hidden {
        return Err(Error::InvalidProblem(format!("combine: d's row stride {ld_d} is below hidden = {hidden}")));
    }
    need_len("positions", positions.len(), tokens * top_k, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), tokens * top_k, "tokens x top_k")?;
    need_len("y", y.len(), tokens * hidden, "tokens x hidden")?;
    // With a bias the kernel reads the expert of every row it combines: only rows that have one are valid.
    let d_rows = match bias {
        Some((re, _, _)) => (d.len() / ld_d).min(re.len()),
        None => d.len() / ld_d,
    };
    if let Some((_, b, experts)) = bias {
        need_len("b2 bias", b.len(), experts * hidden, "experts x hidden")?;
    }
    let experts = to_i32("experts", bias.map(|(_, _, e)| e).unwrap_or(0))?;
    let (t, k, h) = (to_i32("tokens", tokens)?, to_i32("top_k", top_k)?, hidden as i32);
    let d_rows = to_i64("d rows", d_rows)?;
    super::bind(stream)?;
    let (d_ptr, _d) = d.device_ptr(stream);
    let (p_ptr, _p) = positions.device_ptr(stream);
    let (w_ptr, _w) = weights.device_ptr(stream);
    let (re_ptr, _re) = bias.map(|(re, _, _)| re.device_ptr(stream)).unzip();
    let (b_ptr, _b) = bias.map(|(_, b, _)| b.device_ptr(stream)).unzip();
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    for (name, p) in [("d", d_ptr), ("y", y_ptr)] {
        need_aligned(name, p)?;
    }
    // SAFETY: d holds d_rows rows of ld_d >= hidden elements, y tokens*hidden elements, positions and weights tokens*top_k (checked);
    // rows are 16-byte aligned (hidden a multiple of the element type's alignment, aligned bases); the kernel
    // skips positions outside [0, d_rows) and bias rows of experts outside [0, experts); row experts cover d_rows
    // (d_rows is clamped to them), bias experts*hidden. The stream's context is bound to this thread; guards
    // outlive the call.
    let s = unsafe {
        ffi::combine_rows(
            dtype(T::DTYPE),
            t,
            k,
            h,
            d_ptr,
            to_i64("d row stride", ld_d)?,
            d_rows,
            p_ptr,
            w_ptr,
            re_ptr.unwrap_or(0),
            b_ptr.unwrap_or(0),
            experts,
            y_ptr,
            stream.cu_stream() as u64,
        )
    };
    check(s, &Launched::typed("combine_rows", T::DTYPE))
}
