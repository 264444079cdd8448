//! One pass of each backend: the kernels a forward queues for a chunk of tokens, over the scratch's buffers.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use half::bf16;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::block_scaled::MxGemm;
use crate::kernels::elementwise;
use crate::kernels::fused::{self, FusedBatch};
use crate::kernels::grouped::Workspace;
use crate::kernels::grouped_mx::{MxRows, MxWeights};
use crate::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use crate::quant::{
    quantize_gather, quantize_mxfp8_grouped, quantize_rows, requantize_rows, Fp8Rows, Fp8TokenRows, Mxfp4Weights,
    Mxfp8Rows, RowsInUse,
};
use crate::status::DeviceStatus;
use crate::view::{MatrixView, MatrixViewMut};

use super::mx::mx_padded;
use super::plans::{GemmPair, GemmPlans, PairPlans};
use super::sizing::{format_backend_error, CONTIGUOUS_BLOCK_M};
use super::weights::sealed::{Common, Parts};
use super::{Backend, ExpertWeights, LayerWeights, MoeLayer, MoeScratch, WeightFormat};

impl<T: Element, W: LayerWeights<T>> MoeLayer<T, W> {
    pub(super) fn gemm_pair(&self, backend: Backend) -> Result<&GemmPair<T>> {
        self.gemms
            .iter()
            .find(|g| g.backend == backend)
            .ok_or_else(|| Error::InvalidProblem(format!("backend {backend} has no GEMM plans in this layer")))
    }

    /// The dense weights of the backends that only multiply those (Eager, Batched, Fused).
    pub(super) fn dense(&self, backend: Backend) -> Result<&ExpertWeights<T>> {
        match self.weights.parts() {
            Parts::Dense(w) => Ok(w),
            Parts::Fp8(..) => Err(format_backend_error(WeightFormat::Fp8Block, backend)),
            Parts::Mx(..) => Err(format_backend_error(WeightFormat::Mxfp4, backend)),
            Parts::Fp8Channel(..) => Err(format_backend_error(WeightFormat::Fp8Channel, backend)),
        }
    }

    /// Re-targets the scratch's layout at `dims` and builds it from the pass's ids (one kernel).
    pub(super) fn lay_out(
        &self,
        stream: &Arc<CudaStream>,
        layout: &mut ExpertLayout,
        dims: LayoutDims,
        ids: &MatrixView<'_, i32>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        layout.reshape(dims)?;
        let map = self.expert_map.as_ref().map(|m| m.as_view());
        layout.build(stream, dims.max_tokens(), &ids.as_view(), map.as_ref(), status)
    }

    pub(super) fn layout_dims(&self, spec: LayoutSpec, tokens: usize) -> Result<LayoutDims> {
        let s = &self.sizing.shape;
        LayoutDims::new(spec, tokens, s.slots(), s.layout_experts(), s.groups())
    }

    pub(super) fn forward_layout(
        &self,
        backend: Backend,
        p: PassIo<'_, '_, T>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        let spec = match backend {
            Backend::Grouped => LayoutSpec::Grouped,
            Backend::Contiguous => LayoutSpec::Aligned { block_m: CONTIGUOUS_BLOCK_M },
            _ => LayoutSpec::Masked { max_m: self.sizing.max_m },
        };
        let tokens = p.x.rows();
        let dims = self.layout_dims(spec, tokens)?;
        let gemms = self.gemm_pair(backend)?;
        let c = self.weights.common();
        let (h, i) = (c.dims.hidden, c.dims.inter);
        let rows = tokens * self.sizing.shape.slots();
        let Buffers {
            layout, a, a8, h8, a8_token, h8_token, a_mx, h_mx, d1, h: hbuf, d2, mut workspace, status, ..
        } = p.scratch.buffers()?;
        let (d1, d2, layout) = (need(d1, "d1")?, need(d2, "d2")?, need(layout, "layout")?);
        self.lay_out(p.stream, layout, dims, p.ids, status)?;
        let mut ld_d2 = h;
        match (&gemms.plans, self.weights.parts()) {
            (PairPlans::Dense(g1, g2), Parts::Dense(w)) => {
                let (a, workspace) = (need(a, "a")?, need(workspace, "GEMM workspace")?);
                layout.gather(p.stream, tokens, h, &p.x.as_view(), a, status)?;
                g1.for_rows(rows).launch(p.stream, a, &w.w13, layout.group_rows(), d1, workspace, status)?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                g2.for_rows(rows).launch(p.stream, hbuf, &w.w2, layout.group_rows(), d2, workspace, status)?;
            }
            (PairPlans::Mx(g1, g2), Parts::Mx(w, is_bf16)) => {
                // x gathered, to MXFP8 per group (K padded); GEMM1; activation; h to MXFP8; GEMM2 (N padded).
                let (a, a_mx, h_mx) = (need(a, "a")?, need(a_mx, "a mxfp8")?, need(h_mx, "h mxfp8")?);
                let groups = c.groups();
                layout.gather(p.stream, tokens, h, &p.x.as_view(), a, status)?;
                let gemm1 = (g1, &w.w13, is_bf16.cast(d1));
                mx_gemm(p.stream, layout, ("a", &*a, h), (a_mx, groups), gemm1, workspace.as_deref_mut(), status)?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                let gemm2 = (g2, &w.w2, is_bf16.cast(d2));
                mx_gemm(p.stream, layout, ("h", &*hbuf, i), (h_mx, groups), gemm2, workspace.as_deref_mut(), status)?;
                ld_d2 = mx_padded(h);
            }
            (PairPlans::Fp8(g1, g2), Parts::Fp8(w, is_bf16)) => {
                // x -> e4m3 at its layout positions; GEMM1; activation; h -> e4m3 (rows in use); GEMM2.
                let (a8, h8) = (need(a8, "a fp8")?, need(h8, "h fp8")?);
                let workspace = need(workspace, "GEMM workspace")?;
                let (g1, g2) = (g1.for_rows(rows), g2.for_rows(rows));
                a8.reshape(g1.shape().max_rows(), h)?;
                quantize_gather(p.stream, layout, p.x, a8, &w.quant, status)?;
                g1.launch(p.stream, a8, &w.w13, layout.group_rows(), is_bf16.cast(d1), workspace, status)?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                let cap = dims.capacity();
                let h_view = MatrixView::new("h", hbuf.slice(0..cap * i), cap, i)?;
                h8.reshape(g2.shape().max_rows(), i)?;
                requantize_rows(p.stream, &h_view, &RowsInUse::of_layout(layout), h8, &w.quant, status)?;
                g2.launch(p.stream, h8, &w.w2, layout.group_rows(), is_bf16.cast(d2), workspace, status)?;
            }
            (PairPlans::Fp8Rowwise(g1, g2), Parts::Fp8Channel(w, is_bf16)) => {
                // x -> e4m3 per token at its layout positions; GEMM1 (rowwise); activation; h -> e4m3 per row in
                // use; GEMM2 (rowwise).
                let (a8, h8) = (need(a8_token, "a fp8 per token")?, need(h8_token, "h fp8 per row")?);
                let workspace = need(workspace, "GEMM workspace")?;
                let (g1, g2) = (g1.for_rows(rows), g2.for_rows(rows));
                a8.quantize_gather(p.stream, layout, p.x, &w.token_scale(false), status)?;
                g1.launch(p.stream, a8, &w.w13, layout.group_rows(), is_bf16.cast(d1), workspace, status)?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                let cap = dims.capacity();
                let h_view = MatrixView::new("h", hbuf.slice(0..cap * i), cap, i)?;
                h8.requantize(p.stream, &h_view, &RowsInUse::of_layout(layout), &w.token_scale(true), status)?;
                g2.launch(p.stream, h8, &w.w2, layout.group_rows(), is_bf16.cast(d2), workspace, status)?;
            }
            _ => {
                return Err(Error::InvalidProblem(format!(
                    "backend {backend}: the layer's GEMM plans are not for its weights' format ({})",
                    c.format
                )))
            }
        }
        combine_layout(p.stream, &c, (tokens, self.sizing.shape.slots()), layout, (d2, ld_d2), p.weights, y)
    }

    /// Aligned layout; GEMM1 gathers x's rows through `sorted_ids`; activation by position; GEMM2 weights,
    /// biases and scatters each row to its (token, slot) row; the combine sums the k rows of each token.
    pub(super) fn forward_fused(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let fused = self.fused.as_ref().ok_or_else(|| {
            Error::InvalidProblem("backend fused: the layer was planned without it (no fused GEMM plan)".into())
        })?;
        let c = self.weights.common();
        let (h, i) = (c.dims.hidden, c.dims.inter);
        let tokens = p.x.rows();
        let (tile, _) = self.fused_pass(tokens);
        let dims = self.layout_dims(LayoutSpec::Aligned { block_m: tile.block_m() }, tokens)?;
        let Buffers { layout, a8, h8, a8_token, h8_token, d1, h: hbuf, d2, status, .. } = p.scratch.buffers()?;
        let (d1, d2, layout) = (need(d1, "d1")?, need(d2, "d2")?, need(layout, "layout")?);
        self.lay_out(p.stream, layout, dims, p.ids, status)?;
        let ids = p.ids.as_view();
        let b = FusedBatch::new(p.stream, tile, layout, tokens);
        // The ids name global experts; under an expert map the layout's are local: no hint then.
        let b = if self.expert_map.is_none() { b.routed_by(&ids) } else { b };
        match self.weights.parts() {
            Parts::Dense(w) => {
                let r13 = w.w13_rows();
                let x = &p.x.as_view();
                let weights = p.weights.as_view();
                let b2 = w.b2.as_ref();
                if !tile.has_fp8() && c.dims.activation.gated() {
                    // The SwapAb tiles apply the gated activation in GEMM1's epilogue: no d1, no activation kernel.
                    let act = (c.dims.activation, c.dims.gate_up);
                    let (gemm1, gemm2) = ((x, &w.w13, c.b13), (&w.w2, &weights, b2));
                    fused.gated_pair(b, gemm1, (h, i), act, hbuf, gemm2, d2)?;
                } else {
                    fused.gemm1_gather(b, x, &w.w13, (r13, h), d1)?;
                    activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                    fused.gemm2_scatter(b, hbuf, &w.w2, (h, i), (&weights, b2), d2)?;
                }
            }
            Parts::Mx(..) => return Err(format_backend_error(WeightFormat::Mxfp4, Backend::Fused)),
            Parts::Fp8Channel(w, is_bf16) => {
                // x -> e4m3 per token (the gather reads token rows); GEMM1; activation; h -> e4m3 per row in use.
                let (a8, h8) = (need(a8_token, "a fp8 per token")?, need(h8_token, "h fp8 per row")?);
                a8.quantize(p.stream, p.x, &w.token_scale(false), status)?;
                fused.gemm1_gather_fp8_channel(b, a8, &w.w13, is_bf16.cast(d1))?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                let cap = dims.capacity();
                let h_view = MatrixView::new("h", hbuf.slice(0..cap * i), cap, i)?;
                h8.requantize(p.stream, &h_view, &RowsInUse::of_layout(layout), &w.token_scale(true), status)?;
                let weights = p.weights.as_view();
                fused.gemm2_scatter_fp8_channel(b, h8, &w.w2, &weights, is_bf16.cast(d2))?;
            }
            Parts::Fp8(w, is_bf16) => {
                // x -> e4m3 per token (the gather reads token rows); GEMM1; activation; h -> e4m3 by position.
                let (a8, h8) = (need(a8, "a fp8")?, need(h8, "h fp8")?);
                a8.reshape(tokens, h)?;
                quantize_rows(p.stream, p.x, a8, &w.quant, status)?;
                fused.gemm1_gather_fp8(b, a8, &w.w13, is_bf16.cast(d1))?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                let cap = dims.capacity();
                let h_view = MatrixView::new("h", hbuf.slice(0..cap * i), cap, i)?;
                h8.reshape(cap, i)?;
                requantize_rows(p.stream, &h_view, &RowsInUse::of_layout(layout), h8, &w.quant, status)?;
                let weights = p.weights.as_view();
                let pairs = is_bf16.cast(d2);
                fused.gemm2_scatter_fp8(b, h8, &w.w2, (&weights, w.b2.as_ref()), pairs)?;
            }
        }
        fused::sum_slots(p.stream, layout, tokens, h, d2, &mut y.as_view_mut())
    }

    /// Two kernels stream each (token, slot) row's expert weights with every SM: act(W13 x) per row, then
    /// W2 h per output with the router weights and the sum over k fused.
    /// Over FP8 weights the kernels quantise x and h themselves, by the layout path's rules: per 128 columns for
    /// block scales, per row (or per tensor, or by the checkpoint's scales) for per-channel ones.
    pub(super) fn forward_batched(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let tokens = p.x.rows();
        let Buffers { h, h8, amax, arrivals, status, .. } = p.scratch.buffers()?;
        let (slots, x, ids, weights) = (self.sizing.shape.slots(), p.x.as_view(), p.ids.as_view(), p.weights.as_view());
        let (y, word) = (&mut y.as_view_mut(), status.word_mut());
        let fp8 = match self.weights.parts() {
            Parts::Fp8(w, _) => Some(w.decode_experts()),
            Parts::Fp8Channel(w, _) => Some(w.decode_experts()),
            _ => None,
        };
        if let Some(w) = fp8 {
            let (x, ids, weights) = (&x, &ids, &weights);
            let scratch = elementwise::DecodeFp8Scratch { amax, h_q: h8.map(|r| r.parts_mut()), arrivals };
            return elementwise::launch_decode_layer_fp8(
                p.stream, &w, tokens, slots, x, ids, weights, h, y, scratch, word,
            );
        }
        let w = self.dense(Backend::Batched)?.decode_experts();
        elementwise::launch_decode_layer(p.stream, &w, tokens, slots, &x, &ids, &weights, h, y, word)
    }

    /// The oracle: the grouped layout, then one single-group GEMM per expert that received rows (the counts
    /// are read back: this synchronises).
    pub(super) fn forward_eager(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let w = self.dense(Backend::Eager)?;
        let c = self.weights.common();
        let (h, i, r13) = (w.dims.hidden, w.dims.inter, w.w13_rows());
        let tokens = p.x.rows();
        let dims = self.layout_dims(LayoutSpec::Grouped, tokens)?;
        let PairPlans::Dense(g1, g2) = &self.gemm_pair(Backend::Eager)?.plans else {
            return Err(format_backend_error(c.format, Backend::Eager));
        };
        let Buffers { layout, a, d1, h: hbuf, d2, workspace, single, status, .. } = p.scratch.buffers()?;
        let (a, d1, d2, single) = (need(a, "a")?, need(d1, "d1")?, need(d2, "d2")?, need(single, "eager offsets")?);
        let (layout, workspace) = (need(layout, "layout")?, need(workspace, "GEMM workspace")?);
        self.lay_out(p.stream, layout, dims, p.ids, status)?;
        layout.gather(p.stream, tokens, h, &p.x.as_view(), a, status)?;
        let offsets = p.stream.clone_dtoh(layout.offsets())?;
        let offsets = &offsets[..=dims.local_experts()];
        let mut one = PerExpert {
            stream: p.stream,
            offsets,
            single: &mut *single,
            workspace: &mut *workspace,
            status: &mut *status,
        };
        one.gemms(g1, a, h, &w.w13, r13, d1)?;
        activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
        let mut one = PerExpert { stream: p.stream, offsets, single, workspace, status: &mut *status };
        one.gemms(g2, hbuf, i, &w.w2, h, d2)?;
        combine_layout(p.stream, &c, (tokens, self.sizing.shape.slots()), layout, (d2, h), p.weights, y)
    }
}

/// The inputs of one pass.
pub(super) struct PassIo<'s, 'v, T: Element> {
    pub(super) stream: &'s Arc<CudaStream>,
    pub(super) scratch: &'s mut MoeScratch<T>,
    pub(super) x: &'s MatrixView<'v, T>,
    pub(super) ids: &'s MatrixView<'v, i32>,
    pub(super) weights: &'s MatrixView<'v, f32>,
}

/// The scratch's buffers, borrowed apart.
pub(super) struct Buffers<'a, T> {
    pub(super) layout: Option<&'a mut ExpertLayout>,
    pub(super) a: Option<&'a mut CudaSlice<T>>,
    pub(super) a8: Option<&'a mut Fp8Rows>,
    pub(super) h8: Option<&'a mut Fp8Rows>,
    pub(super) a8_token: Option<&'a mut Fp8TokenRows>,
    pub(super) h8_token: Option<&'a mut Fp8TokenRows>,
    pub(super) a_mx: Option<&'a mut Mxfp8Rows>,
    pub(super) h_mx: Option<&'a mut Mxfp8Rows>,
    pub(super) d1: Option<&'a mut CudaSlice<T>>,
    pub(super) h: &'a mut CudaSlice<T>,
    pub(super) d2: Option<&'a mut CudaSlice<T>>,
    pub(super) workspace: Option<&'a mut Workspace>,
    pub(super) single: Option<&'a mut CudaSlice<i32>>,
    pub(super) amax: Option<&'a mut CudaSlice<u32>>,
    pub(super) arrivals: Option<&'a mut CudaSlice<u32>>,
    pub(super) status: &'a mut DeviceStatus,
}

impl<T: Element> MoeScratch<T> {
    /// Every buffer at once (disjoint borrows); the layout and workspace only exist where a layout backend is
    /// enabled, which `check_covers` has established before any pass runs.
    fn buffers(&mut self) -> Result<Buffers<'_, T>> {
        let missing = |name: &str| Error::InvalidProblem(format!("scratch capacity: the scratch holds no {name}"));
        Ok(Buffers {
            layout: self.layout.as_mut(),
            a: self.a.as_mut(),
            a8: self.a8.as_mut(),
            h8: self.h8.as_mut(),
            a8_token: self.a8_token.as_mut(),
            h8_token: self.h8_token.as_mut(),
            a_mx: self.a_mx.as_mut(),
            h_mx: self.h_mx.as_mut(),
            amax: self.amax.as_mut(),
            arrivals: self.arrivals.as_mut(),
            d1: self.d1.as_mut(),
            h: self.h.as_mut().ok_or_else(|| missing("h"))?,
            d2: self.d2.as_mut(),
            workspace: self.workspace.as_mut(),
            single: self.single.as_mut(),
            status: &mut self.status,
        })
    }
}

pub(super) fn need<'a, U>(b: Option<&'a mut U>, name: &str) -> Result<&'a mut U> {
    b.ok_or_else(|| Error::InvalidProblem(format!("scratch capacity: the scratch holds no {name}")))
}

pub(super) fn view_addr_mut<T>(y: &mut MatrixViewMut<'_, T>, stream: &Arc<CudaStream>) -> u64 {
    y.as_view_mut().device_ptr_mut(stream).0
}

pub(super) fn same_device(what: &str, got: usize, plan: usize) -> Result<()> {
    if got != plan {
        return Err(Error::InvalidProblem(format!(
            "{what} is on device {got}, the layer was planned on device {plan}"
        )));
    }
    Ok(())
}

/// `h = act(d1 + b13)` for the positions `layout` placed (the rows of its capacity that have an expert).
pub(super) fn activate_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &Common<'_>,
    layout: &ExpertLayout,
    d1: &CudaSlice<T>,
    h: &mut CudaSlice<T>,
    status: &mut DeviceStatus,
) -> Result<()> {
    let row_experts = layout.m_indices().as_view();
    let act = elementwise::ActivationLaunch {
        act: w.dims.activation.into(),
        gate_up: w.dims.gate_up.into(),
        inter: w.dims.inter,
        rows: layout.dims().capacity(),
        total: Some(layout.total()),
        row_experts: &row_experts,
        experts: w.groups(),
        bias: w.b13,
    };
    elementwise::launch_activate(stream, &act, d1, h, status.word_mut())
}

/// `y = Σ_k weight · (d2 + b2)` over the rows `layout` placed, back in token order; `d2`'s rows are `ld_d2`
/// apart (`H`, or the MX GEMM's padded N).
#[allow(clippy::too_many_arguments)]
pub(super) fn combine_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &Common<'_>,
    (tokens, top_k): (usize, usize),
    layout: &ExpertLayout,
    (d2, ld_d2): (&CudaSlice<T>, usize),
    weights: &MatrixView<'_, f32>,
    y: &mut MatrixViewMut<'_, T>,
) -> Result<()> {
    let bias = w.b2.map(|b| (layout.m_indices().as_view(), b.as_view(), w.groups()));
    elementwise::launch_combine(
        stream,
        tokens,
        top_k,
        w.dims.hidden,
        d2,
        ld_d2,
        layout.positions(),
        &weights.as_view(),
        bias.as_ref().map(|(a, b, c)| (a, b, *c)),
        &mut y.as_view_mut(),
    )
}

/// The eager backend's loop: one single-group GEMM per expert that received rows.
pub(super) struct PerExpert<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    /// Host copy of the grouped layout's offsets `[E + 1]`.
    pub(super) offsets: &'a [i32],
    /// Device `[0, rows]` of the current expert.
    pub(super) single: &'a mut CudaSlice<i32>,
    pub(super) workspace: &'a mut Workspace,
    pub(super) status: &'a mut DeviceStatus,
}

impl PerExpert<'_> {
    /// `out[rows of e] = inp[rows of e] · W[e]ᵀ` for every expert `e` with rows; `W` is `[E, n, k]`.
    fn gemms<T: Element>(
        &mut self,
        plans: &GemmPlans<T>,
        inp: &CudaSlice<T>,
        k: usize,
        w: &CudaSlice<T>,
        n: usize,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        for e in 0..self.offsets.len() - 1 {
            let (lo, hi) = (self.offsets[e] as usize, self.offsets[e + 1] as usize);
            if hi == lo {
                continue;
            }
            self.stream.memcpy_htod(&[0i32, (hi - lo) as i32], self.single)?;
            let plan = plans.for_rows(hi - lo);
            let (a, b, mut d) = (inp.slice(lo * k..), w.slice(e * n * k..(e + 1) * n * k), out.slice_mut(lo * n..));
            plan.launch(self.stream, &a, &b, &*self.single, &mut d, self.workspace, self.status)?;
        }
        Ok(())
    }
}

/// One MXFP4 GEMM of a layout pass: the GEMM's rows of `src` (`cols` wide) to MXFP8 per group (K padded), then
/// `g` of them with the weights `w` into `d`.
fn mx_gemm<T: Element>(
    stream: &Arc<CudaStream>,
    layout: &ExpertLayout,
    (name, src, cols): (&'static str, &CudaSlice<T>, usize),
    (mx, groups): (&mut Mxfp8Rows, usize),
    (g, w, d): (&MxGemm, &Mxfp4Weights, &mut CudaSlice<bf16>),
    workspace: Option<&mut Workspace>,
    status: &mut DeviceStatus,
) -> Result<()> {
    let m = g.max_rows();
    let view = MatrixView::new(name, src.slice(0..m * cols), m, cols)?;
    mx.reshape(m, mx_padded(cols), groups)?;
    quantize_mxfp8_grouped(stream, &view, layout.group_rows(), mx, status)?;
    g.launch(stream, MxRows::Mxfp8(mx), MxWeights::Mxfp4(w), layout.group_rows(), d, workspace, status)
}
