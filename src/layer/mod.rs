//! The MoE expert layer: `y = Σ_j w[t,j] · W2[e] · act(W13[e] · x[t])` over each token's k routed experts, on
//! packed weights, with a backend switchable at run time.
//!
//! | [`Backend`] | how | when |
//! |---|---|---|
//! | `Eager` | loop over the experts that received rows, one GEMM each; reads the counts back (synchronises) | correctness oracle |
//! | `Batched` | two kernels: every SM streams the experts' weight rows for each (token, slot) with 16-byte loads; activation and the weighted sum over k fused; no layout | decode, T·k < E |
//! | `Grouped` | grouped layout: permute, persistent grouped GEMMs over device offsets, inverse permutation | prefill |
//! | `Contiguous` | DeepGEMM contiguous layout (experts padded to 128 rows), GEMMs over the padded groups | prefill |
//! | `Masked` | DeepGEMM masked layout `[E, max_m]`, CUDA-graph friendly | decode |
//! | `Fused` | vLLM's design: aligned layout, GEMM1 gathers x's rows in its loads, GEMM2 applies bias and router weight in its epilogue and scatters to the (token, slot) row, combine sums over k; no permuted copy | decode past Batched (≤ 48 rows per expert) |
//!
//! All compute the same function: GEMM1 (fp32 accumulation, rounded to the element type), the activation in
//! f32 with optional `b13`, rounded; GEMM2 likewise; the combine adds `b2`, weights by the router and sums the
//! k contributions in f32, rounding once. `Fused` rounds once more: GEMM2's epilogue stores the weighted
//! `(d2 + b2)` of each (token, slot) in the element type before the sum over k (as vLLM does).
//!
//! The layer is planned for `max_tokens`; it owns every intermediate buffer, so `forward` allocates nothing and
//! (except `Eager`) never synchronises: it can be captured in a CUDA graph.

pub mod reference;
mod weights;

pub use weights::{Activation, ExpertFormat, ExpertWeights, GateUp, PackedExperts, Storage};

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::device::DeviceInfo;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::elementwise;
use crate::kernels::fused::{self, FusedGemm, FusedTile};
use crate::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape, Workspace};
use crate::kernels::TileConfig;
use crate::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use crate::status::DeviceStatus;

/// How the layer lays out and multiplies the routed rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    Eager,
    Batched,
    Grouped,
    Contiguous,
    Masked,
    Fused,
    /// Picks per call: see [`MoeLayer::backend_for`].
    Auto,
}

impl Backend {
    pub const CONCRETE: [Backend; 6] =
        [Backend::Eager, Backend::Batched, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];
}

/// Options of a [`MoeLayer`].
#[derive(Clone, Copy, Debug)]
pub struct MoeLayerOptions {
    /// Most tokens a forward takes.
    pub max_tokens: usize,
    pub top_k: usize,
    /// Rows per expert of the masked layout (default `min(max_tokens, 256)`): a batch of at most this many
    /// tokens can never overflow it.
    pub masked_max_m: Option<usize>,
    pub backend: Backend,
}

/// The plans of one GEMM of one layout: one per tile configuration the heuristic picks for some batch size
/// up to the layer's maximum, so each forward runs the configuration measured best for its own T·k.
#[derive(Debug)]
struct GemmPlans<T: Element> {
    plans: Vec<(GroupedGemm<T>, Workspace)>,
    groups: usize,
    n: usize,
    sm_count: usize,
}

impl<T: Element> GemmPlans<T> {
    fn new(
        stream: &Arc<CudaStream>,
        groups: usize,
        n: usize,
        k: usize,
        max_rows: usize,
        rows: usize,
        sm_count: usize,
    ) -> Result<Self> {
        let shape = GroupedGemmShape::new(groups, n, k, max_rows)?;
        let mut plans: Vec<(GroupedGemm<T>, Workspace)> = Vec::new();
        let candidates = (0..).map(|s| 1usize << s).take_while(|&r| r < rows).chain([rows]);
        for r in candidates {
            let config = TileConfig::heuristic(groups, n, r, sm_count);
            if plans.iter().any(|(p, _)| p.config() == config) {
                continue;
            }
            let plan =
                GroupedGemm::new(stream, shape, GroupedGemmOptions { config: Some(config), expected_rows: Some(r) })?;
            let ws = plan.alloc_workspace(stream)?;
            plans.push((plan, ws));
        }
        Ok(GemmPlans { plans, groups, n, sm_count })
    }

    /// The plan for a batch of `rows` routed rows.
    fn for_rows(&mut self, rows: usize) -> (&GroupedGemm<T>, &mut Workspace) {
        let config = TileConfig::heuristic(self.groups, self.n, rows, self.sm_count);
        let i = self.plans.iter().position(|(p, _)| p.config() == config).unwrap_or(0);
        let (p, w) = &mut self.plans[i];
        (p, w)
    }
}

/// GEMM1 (w13) and GEMM2 (w2) plans of one layout.
#[derive(Debug)]
struct GemmPair<T: Element> {
    g1: GemmPlans<T>,
    g2: GemmPlans<T>,
}

impl<T: Element> GemmPair<T> {
    fn new(
        stream: &Arc<CudaStream>,
        w: &ExpertWeights<T>,
        groups: usize,
        max_rows: usize,
        rows: usize,
        sm: usize,
    ) -> Result<Self> {
        Ok(GemmPair {
            g1: GemmPlans::new(stream, groups, w.w13_rows(), w.hidden, max_rows, rows, sm)?,
            g2: GemmPlans::new(stream, groups, w.hidden, w.inter, max_rows, rows, sm)?,
        })
    }
}

/// `Auto`'s choice for `tokens` tokens of a layer of `experts` experts of `[hidden, inter]` with top-`top_k`
/// routing (see [`MoeLayer::backend_for`]): a pure function, so the policy can be checked without a GPU.
pub fn auto_backend(experts: usize, top_k: usize, hidden: usize, inter: usize, tokens: usize) -> Backend {
    let (e, k) = (experts as f64, top_k as f64);
    let rows = tokens as f64 * k;
    let active = e * (1.0 - (1.0 - k / e).powf(tokens as f64));
    let expert_bytes = 3.0 * (hidden * inter) as f64 * 2.0;
    let batched_us = rows * expert_bytes / 4.05e12 * 1e6 + 12.0;
    let layout_bw = if active < 16.0 { 3.3e12 } else { 4.16e12 };
    let layout_us = active * expert_bytes / layout_bw * 1e6 + 50.0;
    if tokens * top_k <= BATCHED_MAX_ROWS && batched_us <= layout_us {
        Backend::Batched
    } else if rows / active.max(1.0) <= 48.0 && (rows <= 64.0 || inter <= 1024 || experts <= 16) {
        Backend::Fused
    } else {
        Backend::Grouped
    }
}

/// An MoE expert layer on the device.
#[derive(Debug)]
pub struct MoeLayer<T: Element> {
    weights: ExpertWeights<T>,
    backend: Backend,
    max_tokens: usize,
    top_k: usize,
    max_m: usize,
    grouped: ExpertLayout,
    contiguous: ExpertLayout,
    masked: ExpertLayout,
    /// The fused backend's aligned layout for 64-row tiles (128-row tiles share `contiguous`).
    fused64: ExpertLayout,
    /// The fused backend's tile for every batch, or `None`: [`FusedTile::for_rows`] per batch.
    fused_tile: Option<FusedTile>,
    fused: FusedGemm,
    gemm_grouped: GemmPair<T>,
    gemm_contiguous: GemmPair<T>,
    gemm_masked: GemmPair<T>,
    gemm_single: GemmPair<T>,
    /// `[0, n]` offsets of the eager backend's one-group launches.
    single_offsets: CudaSlice<i32>,
    /// Global expert -> local index or -1 (expert parallelism); `None`: all experts are local.
    expert_map: Option<CudaSlice<i32>>,
    a: CudaSlice<T>,
    d1: CudaSlice<T>,
    h: CudaSlice<T>,
    d2: CudaSlice<T>,
    status: DeviceStatus,
}

// The contiguous layout doubles as the fused backend's layout for its 128-row tile.
const CONTIGUOUS_BLOCK_M: usize = FusedTile::M128N256K64.block_m();
/// Most (token, slot) rows the batched backend takes: one GEMM group per row is a decode strategy.
pub const BATCHED_MAX_ROWS: usize = 4096;

impl<T: Element> MoeLayer<T> {
    /// Plans the layer for `options.max_tokens` tokens and allocates every buffer it will use.
    ///
    /// # Errors
    /// Shape errors of the GEMMs and layouts (naming the constraint), arch and driver errors.
    pub fn new(stream: &Arc<CudaStream>, weights: ExpertWeights<T>, options: MoeLayerOptions) -> Result<Self> {
        Self::build(stream, weights, options, None)
    }

    /// An expert-parallel slice: `weights` hold this device's experts; routing ids range over
    /// `expert_map.len()` global experts, and `expert_map[e]` is `e`'s local index or −1 (on another device).
    /// Rows of remote experts are dropped by the layout, so `y` holds this device's share of the sum over k
    /// (the caller reduces it across devices). The `Batched` backend does not take a map; `Auto` picks among
    /// the layout backends.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the map's local ids do not cover exactly the `weights`' experts.
    pub fn with_expert_map(
        stream: &Arc<CudaStream>,
        weights: ExpertWeights<T>,
        options: MoeLayerOptions,
        expert_map: &[i32],
    ) -> Result<Self> {
        let mut local: Vec<i32> = expert_map.iter().copied().filter(|&l| l >= 0).collect();
        local.sort_unstable();
        if local != (0..weights.experts as i32).collect::<Vec<_>>() {
            return Err(Error::InvalidProblem(format!(
                "expert_map must give each of the {} local experts exactly one global id (and -1 to the rest); it gives {:?}",
                weights.experts, local
            )));
        }
        if expert_map.iter().any(|&l| l < -1) {
            return Err(Error::InvalidProblem("expert_map entries must be a local id or -1".into()));
        }
        Self::build(stream, weights, options, Some(expert_map))
    }

    fn build(
        stream: &Arc<CudaStream>,
        weights: ExpertWeights<T>,
        options: MoeLayerOptions,
        expert_map: Option<&[i32]>,
    ) -> Result<Self> {
        let (e, k, t) = (weights.experts, options.top_k, options.max_tokens);
        let global = expert_map.map_or(e, <[i32]>::len);
        let max_m = options.masked_max_m.unwrap_or(t.min(256));
        let dims = |spec| LayoutDims::new(spec, t, k, global, e);
        let (dg, dc, dm, df) = (
            dims(LayoutSpec::Grouped)?,
            dims(LayoutSpec::Aligned { block_m: CONTIGUOUS_BLOCK_M })?,
            dims(LayoutSpec::Masked { max_m })?,
            dims(LayoutSpec::Aligned { block_m: FusedTile::M64N128K64.block_m() })?,
        );
        // Room for every layout, plus max_tokens rows so that the eager backend's per-expert slices (which
        // start anywhere below the capacity) always hold a single-group plan's max_rows.
        let cap = dg.capacity().max(dc.capacity()).max(dm.capacity()).max(df.capacity()) + t;
        let rows = t * k;
        let zeros = |n: usize| stream.alloc_zeros::<T>(n);
        let sm = DeviceInfo::query(stream.context())?.sm_count.max(1) as usize;
        Ok(MoeLayer {
            gemm_grouped: GemmPair::new(stream, &weights, e, dg.capacity(), rows, sm)?,
            gemm_contiguous: GemmPair::new(stream, &weights, e, dc.capacity(), rows, sm)?,
            gemm_masked: GemmPair::new(stream, &weights, e, dm.capacity(), rows.min(e * max_m), sm)?,
            gemm_single: GemmPair::new(stream, &weights, 1, t, t, sm)?,
            single_offsets: stream.alloc_zeros(2)?,
            grouped: ExpertLayout::new(stream, dg)?,
            contiguous: ExpertLayout::new(stream, dc)?,
            masked: ExpertLayout::new(stream, dm)?,
            fused64: ExpertLayout::new(stream, df)?,
            fused_tile: None,
            fused: FusedGemm::new(stream)?,
            a: zeros(cap * weights.hidden)?,
            d1: zeros(cap * weights.w13_rows())?,
            h: zeros(cap * weights.inter)?,
            d2: zeros(cap * weights.hidden)?,
            status: DeviceStatus::new(stream)?,
            expert_map: expert_map.map(|m| stream.clone_htod(m)).transpose()?,
            backend: options.backend,
            max_tokens: t,
            top_k: k,
            max_m,
            weights,
        })
    }

    pub fn weights(&self) -> &ExpertWeights<T> {
        &self.weights
    }
    pub fn backend(&self) -> Backend {
        self.backend
    }
    /// Fixes the `Fused` backend's tile (`None`: chosen per batch by [`FusedTile::for_rows`]).
    pub fn set_fused_tile(&mut self, tile: Option<FusedTile>) {
        self.fused_tile = tile;
    }
    /// Switches the backend of a live layer (no reload, no allocation).
    pub fn set_backend(&mut self, backend: Backend) {
        self.backend = backend;
    }

    /// The backend a forward of `tokens` tokens runs. `Auto` compares costs fitted to the H200 suite under
    /// uniform routing (`moe-gemm bench --layer --suite`, benches/results/h200-2026-11-29-s2): `Batched`
    /// streams one expert's weights per (token, slot) row at about 4.05 TB/s plus 12 µs; the layout backends
    /// stream each *active* expert once, at about 4.16 TB/s when 16 or more experts are active and 3.3 TB/s when
    /// fewer, plus about 50 µs of layout, activation and combine. Skewed routing activates fewer experts than
    /// uniform routing predicts, which only the layout backends profit from, so near-ties go to them. Where
    /// Batched loses, `Fused` (its persistent 64-row tile, no permuted copy) takes batches of at most 48 rows
    /// per active expert where it measured ahead of Grouped: up to 64 (token, slot) rows on any model (its fixed
    /// cost is the lower), and beyond that on narrow experts (I ≤ 1024: Qwen3-30B T=64 355 vs 365 µs) or few
    /// experts (E ≤ 16: Mixtral T=64 748 vs 768). On wide experts with many rows (DeepSeek-V3, gpt-oss,
    /// Qwen3-235B at T = 16–256) Grouped's TMA-fed GEMMs are 1–4% ahead, and at prefill 1.2–1.5x: `Grouped`
    /// takes those. Masked and Contiguous stay for callers who want their layouts (within 2% of Grouped).
    pub fn backend_for(&self, tokens: usize) -> Backend {
        match self.backend {
            // An expert map rules out Batched, which reads global ids as weight indices.
            Backend::Auto if self.expert_map.is_some() => Backend::Grouped,
            Backend::Auto => {
                auto_backend(self.weights.experts, self.top_k, self.weights.hidden, self.weights.inter, tokens)
            }
            b => b,
        }
    }

    /// Reads and clears the layer's device status word (synchronises): reports invalid expert ids, capacity
    /// overflow and any other device-side check of the last forwards.
    pub fn check(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.status.check(stream)
    }

    /// `y [tokens, H] = MoE(x [tokens, H])` for the routing `topk_ids`, `topk_weights` (`[tokens, k]`).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `tokens > max_tokens`, the `Masked` backend is asked for more tokens than
    /// its capacity `max_m` guarantees, or `Batched` for more than [`BATCHED_MAX_ROWS`] rows; buffer and launch
    /// errors.
    pub fn forward(
        &mut self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        x: &impl DevicePtr<T>,
        topk_ids: &CudaSlice<i32>,
        topk_weights: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        if tokens > self.max_tokens {
            return Err(Error::InvalidProblem(format!("tokens = {tokens} exceeds max_tokens = {}", self.max_tokens)));
        }
        if tokens == 0 {
            return Ok(());
        }
        match self.backend_for(tokens) {
            Backend::Batched => self.forward_batched(stream, tokens, x, topk_ids, topk_weights, y),
            Backend::Eager => self.forward_eager(stream, tokens, x, topk_ids, topk_weights, y),
            Backend::Fused => self.forward_fused(stream, tokens, x, topk_ids, topk_weights, y),
            b => self.forward_layout(stream, b, tokens, x, topk_ids, topk_weights, y),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_layout(
        &mut self,
        stream: &Arc<CudaStream>,
        backend: Backend,
        tokens: usize,
        x: &impl DevicePtr<T>,
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        if backend == Backend::Masked && tokens > self.max_m {
            return Err(Error::InvalidProblem(format!(
                "the Masked backend holds max_m = {} rows per expert; {tokens} tokens could overflow it (raise masked_max_m or use another backend)",
                self.max_m
            )));
        }
        let (layout, gemms) = match backend {
            Backend::Grouped => (&mut self.grouped, &mut self.gemm_grouped),
            Backend::Contiguous => (&mut self.contiguous, &mut self.gemm_contiguous),
            _ => (&mut self.masked, &mut self.gemm_masked),
        };
        let w = &self.weights;
        let h = w.hidden;
        layout.build(stream, tokens, ids, self.expert_map.as_ref().map(|m| m.as_view()).as_ref(), &mut self.status)?;
        layout.gather(stream, tokens, h, x, &mut self.a, &mut self.status)?;
        let rows = tokens * self.top_k;
        let (g1, ws1) = gemms.g1.for_rows(rows);
        g1.launch(stream, &self.a, &w.w13, layout.group_rows(), &mut self.d1, ws1, &mut self.status)?;
        activate_layout(stream, w, layout, &self.d1, &mut self.h, &mut self.status)?;
        let (g2, ws2) = gemms.g2.for_rows(rows);
        g2.launch(stream, &self.h, &w.w2, layout.group_rows(), &mut self.d2, ws2, &mut self.status)?;
        combine_layout(stream, w, self.top_k, tokens, layout, &self.d2, weights, y)
    }

    /// Aligned layout; GEMM1 gathers x's rows through `sorted_ids`; activation by position; GEMM2 weights,
    /// biases and scatters each row to its (token, slot) row; the combine sums the k rows of each token.
    fn forward_fused(
        &mut self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        x: &impl DevicePtr<T>,
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let (w, plan) = (&self.weights, &self.fused);
        let (h, i, r13) = (w.hidden, w.inter, w.w13_rows());
        let tile = self.fused_tile.unwrap_or_else(|| FusedTile::for_rows(tokens * self.top_k, w.experts));
        let layout = match tile {
            FusedTile::M64N128K64 => &mut self.fused64,
            FusedTile::M128N256K64 => &mut self.contiguous,
        };
        layout.build(stream, tokens, ids, self.expert_map.as_ref().map(|m| m.as_view()).as_ref(), &mut self.status)?;
        plan.gemm1_gather(stream, tile, layout, tokens, x, &w.w13, r13, h, &mut self.d1)?;
        activate_layout(stream, w, layout, &self.d1, &mut self.h, &mut self.status)?;
        plan.gemm2_scatter(stream, tile, layout, tokens, &self.h, &w.w2, h, i, weights, w.b2.as_ref(), &mut self.d2)?;
        fused::sum_slots(stream, layout, tokens, h, &self.d2, y)
    }

    /// Two kernels stream each (token, slot) row's expert weights with every SM: act(W13 x) per row, then
    /// W2 h per output with the router weights and the sum over k fused.
    fn forward_batched(
        &mut self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        x: &impl DevicePtr<T>,
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let rows = tokens * self.top_k;
        if self.expert_map.is_some() {
            return Err(Error::InvalidProblem(
                "the Batched backend takes no expert map (expert parallelism): use a layout backend".into(),
            ));
        }
        if rows > BATCHED_MAX_ROWS {
            return Err(Error::InvalidProblem(format!(
                "the Batched backend takes at most {BATCHED_MAX_ROWS} (token, slot) rows; {tokens} tokens x top-{} = {rows} (use another backend)",
                self.top_k
            )));
        }
        elementwise::launch_decode_layer(
            stream,
            &self.weights,
            tokens,
            self.top_k,
            x,
            ids,
            weights,
            &mut self.h,
            y,
            self.status.word_mut(),
        )
    }

    /// The oracle: the grouped layout, then one single-group GEMM per expert that received rows (the counts
    /// are read back: this synchronises).
    fn forward_eager(
        &mut self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        x: &impl DevicePtr<T>,
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let w = &self.weights;
        let (h, i, r13) = (w.hidden, w.inter, w.w13_rows());
        let layout = &mut self.grouped;
        layout.build(stream, tokens, ids, self.expert_map.as_ref().map(|m| m.as_view()).as_ref(), &mut self.status)?;
        layout.gather(stream, tokens, h, x, &mut self.a, &mut self.status)?;
        let offsets = stream.clone_dtoh(layout.offsets())?;
        let g = &mut self.gemm_single;
        let mut one =
            PerExpert { stream, offsets: &offsets, single: &mut self.single_offsets, status: &mut self.status };
        one.gemms(&mut g.g1, &self.a, h, &w.w13, r13, &mut self.d1)?;
        activate_layout(stream, w, layout, &self.d1, &mut self.h, &mut self.status)?;
        let mut one =
            PerExpert { stream, offsets: &offsets, single: &mut self.single_offsets, status: &mut self.status };
        one.gemms(&mut g.g2, &self.h, i, &w.w2, h, &mut self.d2)?;
        combine_layout(stream, w, self.top_k, tokens, layout, &self.d2, weights, y)
    }
}

/// `h = act(d1 + b13)` for the positions `layout` placed (the rows of its capacity that have an expert).
fn activate_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &ExpertWeights<T>,
    layout: &ExpertLayout,
    d1: &CudaSlice<T>,
    h: &mut CudaSlice<T>,
    status: &mut DeviceStatus,
) -> Result<()> {
    let act = elementwise::ActivationLaunch {
        act: w.activation,
        gate_up: w.gate_up,
        inter: w.inter,
        rows: layout.dims().capacity(),
        total: Some(layout.total()),
        row_experts: layout.m_indices().as_view(),
        experts: w.experts,
        bias: w.b13.as_ref(),
    };
    elementwise::launch_activate(stream, &act, d1, h, status.word_mut())
}

/// `y = Σ_k weight · (d2 + b2)` over the rows `layout` placed, back in token order.
#[allow(clippy::too_many_arguments)]
fn combine_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &ExpertWeights<T>,
    top_k: usize,
    tokens: usize,
    layout: &ExpertLayout,
    d2: &CudaSlice<T>,
    weights: &CudaSlice<f32>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let bias = w.b2.as_ref().map(|b| (layout.m_indices().as_view(), b.as_view(), w.experts));
    elementwise::launch_combine(
        stream,
        tokens,
        top_k,
        w.hidden,
        d2,
        layout.positions(),
        weights,
        bias.as_ref().map(|(a, b, c)| (a, b, *c)),
        y,
    )
}

/// The eager backend's loop: one single-group GEMM per expert that received rows.
struct PerExpert<'a> {
    stream: &'a Arc<CudaStream>,
    /// Host copy of the grouped layout's offsets `[E + 1]`.
    offsets: &'a [i32],
    /// Device `[0, rows]` of the current expert.
    single: &'a mut CudaSlice<i32>,
    status: &'a mut DeviceStatus,
}

impl PerExpert<'_> {
    /// `out[rows of e] = inp[rows of e] · W[e]ᵀ` for every expert `e` with rows; `W` is `[E, n, k]`.
    fn gemms<T: Element>(
        &mut self,
        plans: &mut GemmPlans<T>,
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
            let (plan, ws) = plans.for_rows(hi - lo);
            let (a, b, mut d) = (inp.slice(lo * k..), w.slice(e * n * k..(e + 1) * n * k), out.slice_mut(lo * n..));
            plan.launch(self.stream, &a, &b, &*self.single, &mut d, ws, self.status)?;
        }
        Ok(())
    }
}
