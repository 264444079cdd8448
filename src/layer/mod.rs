//! The MoE expert layer: `y = Σ_j w[t,j] · W2[e] · act(W13[e] · x[t])` over each token's k routed experts, on
//! shared expert weights, with a backend switchable at run time.
//!
//! Three things, owned separately, as a serving stack holds them:
//!
//! * **weights** ([`ExpertWeights`], behind an `Arc`): uploaded once, shared by any number of plans and streams;
//! * **the plan** ([`MoeLayer`]): what is per layer and small (shapes, format, expert map, tile choices, GEMM
//!   plans); [`MoeLayer::plan_bytes`] reports it;
//! * **the scratch** ([`MoeScratch`]): every per-batch intermediate, owned by the caller and used in turn by every
//!   layer that fits it ([`MoeScratch::for_layers`]), allocated only for the enabled backends
//!   ([`ScratchNeeds::footprint`] says every byte without a GPU).
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
//! **FP8 experts** ([`Fp8ExpertWeights`]: e4m3 weights with 128 × 128 f32 scales, DeepSeek-V3's recipe) plan as
//! `MoeLayer<bf16, Fp8ExpertWeights>` with the same options, scratch and forward: the layer quantises `x` per
//! token per 128 columns at its layout positions, runs the FP8 blockwise grouped GEMM (bf16 out), the same
//! activation, requantises `h` and runs the second FP8 GEMM, then the same combine (see `fp8.rs`). They run the
//! Grouped, Contiguous and Masked backends ([`Backends::FP8`]); `Auto` runs Grouped (FP8 Batched and Fused
//! kernels are future work), and asking for another backend is an [`Error::InvalidProblem`] that says so.
//!
//! A shared expert (DeepSeek-V3, Kimi-K2, Qwen2-MoE; [`ExpertWeights::upload_with_shared`]) rides in the same
//! GEMMs as `I_s / I` more groups that every token joins with the shared weight `s_t`: see
//! [`MoeLayer::forward_with_shared_weights`] and `shared.rs`.
//!
//! A forward takes any number of tokens: batches larger than a backend's pass (see [`sizing`]) run as several
//! passes over the same scratch (chunked prefill). It validates every view and the scratch before it queues
//! its first kernel, allocates nothing and (except `Eager`) never synchronises, so it can be captured in a CUDA
//! graph, many layers back to back.

mod backends;
mod fp8;
pub mod reference;
mod scratch;
mod shared;
pub mod sizing;
mod weights;

pub use backends::{Backend, Backends};
pub use fp8::Fp8ExpertWeights;
pub use scratch::MoeScratch;
pub use sizing::{Footprint, LayerShape, LayerSizing, PlanBytes, ScratchNeeds, BATCHED_MAX_ROWS};
pub use weights::{
    Activation, ExpertFormat, ExpertWeights, GateUp, LayerWeights, PackedExperts, SharedExpert, Storage, WeightFormat,
};

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::device::DeviceInfo;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::elementwise;
use crate::kernels::fused::{self, FusedGemm, FusedTile};
use crate::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape, Workspace};
use crate::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};
use crate::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use crate::quant::{quantize_gather, requantize_rows, Fp8Rows, RowsInUse};
use crate::status::DeviceStatus;
use crate::view::{MatrixView, MatrixViewMut};

use sizing::{aligned_rows, auto_pick, fp8_backend_error, GemmSpec, CONTIGUOUS_BLOCK_M};
use weights::sealed::{Common, Parts};

/// Options of a [`MoeLayer`] plan ([`MoeLayerOptions::new`], then the builder methods).
#[non_exhaustive]
#[derive(Clone, Copy, Debug)]
pub struct MoeLayerOptions {
    /// Most tokens of one pass; a forward of more tokens runs in passes.
    pub max_tokens: usize,
    pub top_k: usize,
    /// Rows per expert of the masked layout (default `min(max_tokens, 256)`): the masked backend runs passes
    /// of at most this many tokens, which can never overflow it.
    pub masked_max_m: Option<usize>,
    pub backend: Backend,
    /// The backends the plan makes room for in the scratch (`None`: those `backend` runs, each for the batches
    /// it runs them at; `Some(set)`: each of `set` for `max_tokens` tokens).
    pub backends: Option<Backends>,
    /// The Fused backend's tile for every batch (`None`: [`FusedTile::for_rows`] per pass).
    pub fused_tile: Option<FusedTile>,
}

impl MoeLayerOptions {
    /// `Auto` over its default backends, `max_tokens` tokens per pass, top-`top_k` routing.
    pub fn new(max_tokens: usize, top_k: usize) -> Self {
        MoeLayerOptions {
            max_tokens,
            top_k,
            masked_max_m: None,
            backend: Backend::Auto,
            backends: None,
            fused_tile: None,
        }
    }
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }
    pub fn backends(mut self, backends: Backends) -> Self {
        self.backends = Some(backends);
        self
    }
    pub fn masked_max_m(mut self, max_m: usize) -> Self {
        self.masked_max_m = Some(max_m);
        self
    }
    pub fn fused_tile(mut self, tile: FusedTile) -> Self {
        self.fused_tile = Some(tile);
        self
    }
}

/// The plans of one GEMM of one layout: one per tile configuration the heuristic picks for some batch size
/// up to the layer's maximum, so each forward runs the configuration measured best for its own T·k.
#[derive(Debug)]
struct GemmPlans<T: Element> {
    plans: Vec<GroupedGemm<T>>,
    groups: usize,
    n: usize,
    sm_count: usize,
}

/// Host bytes of a layer plan with `plans` GEMM configurations (the same for every element type).
pub(crate) fn plan_host_bytes(sizing: &LayerSizing, plans: usize) -> usize {
    type L = MoeLayer<bf16>;
    let plan = match sizing.format {
        WeightFormat::Fp8Block => std::mem::size_of::<GroupedGemmFp8>(),
        _ => std::mem::size_of::<GroupedGemm<bf16>>(),
    };
    std::mem::size_of::<L>()
        + sizing.gemms.len() / 2 * std::mem::size_of::<GemmPair<bf16>>()
        + plans * plan
        + sizing.passes.len() * std::mem::size_of::<sizing::Pass>()
        + sizing.gemms.len() * std::mem::size_of::<GemmSpec>()
}

impl<T: Element> GemmPlans<T> {
    fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        let sm_count = device.sm_count.max(1) as usize;
        let shape = GroupedGemmShape::new(spec.groups, spec.n, spec.k, spec.max_rows)?;
        let plans = spec
            .configs(sm_count)
            .into_iter()
            .map(|(config, r)| {
                let opts = GroupedGemmOptions { config: Some(config), expected_rows: Some(r) };
                GroupedGemm::for_device(device.clone(), shape, opts)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(GemmPlans { plans, groups: spec.groups, n: spec.n, sm_count })
    }

    /// The plan for a batch of `rows` routed rows.
    fn for_rows(&self, rows: usize) -> &GroupedGemm<T> {
        let config = crate::kernels::TileConfig::heuristic(self.groups, self.n, rows, self.sm_count);
        self.plans.iter().find(|p| p.config() == config).unwrap_or(&self.plans[0])
    }
}

/// The FP8 blockwise GEMM's plans of one GEMM of one layout, one per configuration some batch size picks.
#[derive(Debug)]
struct Fp8Plans {
    plans: Vec<GroupedGemmFp8>,
    groups: usize,
}

impl Fp8Plans {
    fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        let shape = GroupedGemmFp8Shape::new(spec.groups, spec.n, spec.k, spec.max_rows)?;
        let plans = spec
            .fp8_configs()
            .into_iter()
            .map(|(config, r)| {
                let opts = GroupedGemmFp8Options { config: Some(config), expected_rows: Some(r) };
                GroupedGemmFp8::for_device(device.clone(), shape, opts)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Fp8Plans { plans, groups: spec.groups })
    }

    /// The plan for a batch of `rows` routed rows.
    fn for_rows(&self, rows: usize) -> &GroupedGemmFp8 {
        let config = Fp8TileConfig::heuristic(self.groups, rows);
        self.plans.iter().find(|p| p.config() == config).unwrap_or(&self.plans[0])
    }
}

/// GEMM1 (w13) and GEMM2 (w2) plans of one backend, for the weights' format.
#[derive(Debug)]
enum PairPlans<T: Element> {
    Dense(GemmPlans<T>, GemmPlans<T>),
    Fp8(Fp8Plans, Fp8Plans),
}

impl<T: Element> PairPlans<T> {
    fn len(&self) -> usize {
        match self {
            PairPlans::Dense(a, b) => a.plans.len() + b.plans.len(),
            PairPlans::Fp8(a, b) => a.plans.len() + b.plans.len(),
        }
    }
}

#[derive(Debug)]
struct GemmPair<T: Element> {
    backend: Backend,
    plans: PairPlans<T>,
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

/// The plan of one MoE expert layer on one device: shapes, format, expert map, tile choices and GEMM plans
/// over shared weights. Per-batch intermediates live in a [`MoeScratch`] the caller passes to [`Self::forward`].
///
/// `W` is the kind of expert weights: [`ExpertWeights<T>`] (the default: dense, in the element type) or
/// [`Fp8ExpertWeights`] (block FP8, `T = bf16`). Both plan, size their scratch and run through the same code;
/// what differs is the GEMMs (and the backends FP8 runs, see the module docs).
#[derive(Debug)]
pub struct MoeLayer<T: Element, W: LayerWeights<T> = ExpertWeights<T>> {
    weights: Arc<W>,
    sizing: LayerSizing,
    backend: Backend,
    device: DeviceInfo,
    /// The fused GEMMs' plan (device facts read once).
    fused: FusedGemm,
    /// Global expert -> local index or -1 (expert parallelism); `None`: all experts are local.
    expert_map: Option<CudaSlice<i32>>,
    gemms: Vec<GemmPair<T>>,
}

/// The tokens of one pass and the backend that runs them.
#[derive(Clone, Copy, Debug)]
struct Step {
    backend: Backend,
    lo: usize,
    hi: usize,
}

impl<T: Element, W: LayerWeights<T>> MoeLayer<T, W> {
    /// Plans the layer on `stream`'s device for `options.max_tokens` tokens per pass over `weights` (shared:
    /// pass an `Arc` clone to plan several layers, streams or micro-batches over one upload).
    ///
    /// # Errors
    /// Shape errors of the GEMMs and layouts (naming the constraint), weights on another device than the
    /// stream (naming both), arch and driver errors; over FP8 weights, a backend other than Grouped,
    /// Contiguous, Masked or Auto in the options (see the module docs).
    pub fn new(stream: &Arc<CudaStream>, weights: Arc<W>, options: MoeLayerOptions) -> Result<Self> {
        Self::build(stream, weights, options, None)
    }

    /// An expert-parallel slice: `weights` hold this device's experts; routing ids range over
    /// `expert_map.len()` global experts, and `expert_map[e]` is `e`'s local index or −1 (on another device).
    /// Rows of remote experts are dropped by the layout, so `y` holds this device's share of the sum over k
    /// (the caller reduces it across devices). The `Batched` backend does not take a map; `Auto` runs Grouped.
    ///
    /// A shared expert in `weights` is local: this slice adds it to every token (its groups follow the local
    /// experts, with ids past the map's, which the plan maps itself). Since the caller sums the slices, give
    /// the shared expert to one rank only, or split its groups between ranks
    /// ([`SharedExpert::slice_groups`]): each group must be added once.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the map's local ids do not cover exactly the `weights`' experts.
    pub fn with_expert_map(
        stream: &Arc<CudaStream>,
        weights: Arc<W>,
        options: MoeLayerOptions,
        expert_map: &[i32],
    ) -> Result<Self> {
        let mut local: Vec<i32> = expert_map.iter().copied().filter(|&l| l >= 0).collect();
        local.sort_unstable();
        let experts = weights.common().experts;
        if local != (0..experts as i32).collect::<Vec<_>>() {
            return Err(Error::InvalidProblem(format!(
                "expert_map must give each of the {experts} local experts exactly one global id (and -1 to the rest); it gives {local:?}"
            )));
        }
        if expert_map.iter().any(|&l| l < -1) {
            return Err(Error::InvalidProblem("expert_map entries must be a local id or -1".into()));
        }
        Self::build(stream, weights, options, Some(expert_map))
    }

    fn build(
        stream: &Arc<CudaStream>,
        weights: Arc<W>,
        options: MoeLayerOptions,
        expert_map: Option<&[i32]>,
    ) -> Result<Self> {
        let device = DeviceInfo::query(stream.context())?;
        let c = weights.common();
        same_device("the weights", c.device, device.ordinal)?;
        let shape = LayerShape {
            experts: c.experts,
            global_experts: expert_map.map_or(c.experts, <[i32]>::len),
            top_k: options.top_k,
            shared_groups: c.shared_groups,
            hidden: c.hidden,
            inter: c.inter,
            gated: c.activation.gated(),
        };
        let sizing = LayerSizing::for_format(
            shape,
            T::DTYPE,
            c.format,
            options.max_tokens,
            options.backend,
            options.backends,
            options.masked_max_m,
            options.fused_tile,
            expert_map.is_some(),
            device.sm_count.max(1) as usize,
        )?;
        let mut gemms: Vec<GemmPair<T>> = Vec::new();
        for pair in sizing.gemms.chunks(2) {
            let plans = if pair[0].fp8 {
                PairPlans::Fp8(Fp8Plans::new(&device, &pair[0])?, Fp8Plans::new(&device, &pair[1])?)
            } else {
                PairPlans::Dense(GemmPlans::new(&device, &pair[0])?, GemmPlans::new(&device, &pair[1])?)
            };
            gemms.push(GemmPair { backend: pair[0].backend, plans });
        }
        let expert_map = expert_map.map(|m| shared::extended_map(m, &shape));
        Ok(MoeLayer {
            expert_map: expert_map.map(|m| stream.clone_htod(&m)).transpose()?,
            fused: FusedGemm::new(stream)?,
            backend: options.backend,
            weights,
            sizing,
            device,
            gemms,
        })
    }

    pub fn weights(&self) -> &Arc<W> {
        &self.weights
    }
    /// How the layer's expert weights are stored.
    pub fn weight_format(&self) -> WeightFormat {
        self.sizing.format
    }
    pub fn backend(&self) -> Backend {
        self.backend
    }
    /// The backends this plan has scratch room for.
    pub fn backends(&self) -> Backends {
        self.sizing.backends
    }
    /// What this layer needs from a [`MoeScratch`].
    pub fn needs(&self) -> &ScratchNeeds {
        &self.sizing.needs
    }
    pub fn sizing(&self) -> &LayerSizing {
        &self.sizing
    }
    /// Bytes the plan holds: its expert map on the device, its GEMM plans and fields on the host.
    pub fn plan_bytes(&self) -> PlanBytes {
        let device = self.expert_map.as_ref().map_or(0, |m| m.len() * std::mem::size_of::<i32>());
        let plans: usize = self.gemms.iter().map(|g| g.plans.len()).sum();
        PlanBytes { device, host: plan_host_bytes(&self.sizing, plans) }
    }
    /// Fixes the `Fused` backend's tile (`None`: chosen per pass by [`FusedTile::for_rows`]). A pass whose
    /// 128-row layout would not fit the scratch runs fewer tokens.
    pub fn set_fused_tile(&mut self, tile: Option<FusedTile>) {
        self.sizing.fused_tile = tile;
    }
    /// Switches the backend of a live layer (no reload, no allocation).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the plan made no scratch room for `backend` (see
    /// [`MoeLayerOptions::backends`]), or, over FP8 weights, for a backend FP8 does not run (Eager, Batched,
    /// Fused: the message says so).
    pub fn set_backend(&mut self, backend: Backend) -> Result<()> {
        if self.sizing.format == WeightFormat::Fp8Block && backend != Backend::Auto && !Backends::FP8.contains(backend)
        {
            return Err(fp8_backend_error(backend));
        }
        if backend != Backend::Auto && !self.sizing.backends.contains(backend) {
            return Err(Error::InvalidProblem(format!(
                "backend {backend} has no scratch room in this plan (its backends: {{{}}}); plan the layer with MoeLayerOptions::backends including it",
                self.sizing.backends
            )));
        }
        self.backend = backend;
        Ok(())
    }

    /// The backend a pass of `tokens` tokens runs. `Auto` compares costs fitted to the H200 suite under
    /// uniform routing (`moe-gemm bench --layer --suite`, benches/results/h200-2026-11-29-s2): `Batched`
    /// streams one expert's weights per (token, slot) row at about 4.05 TB/s plus 12 µs; the layout backends
    /// stream each *active* expert once, at about 4.16 TB/s when 16 or more experts are active and 3.3 TB/s when
    /// fewer, plus about 50 µs of layout, activation and combine. Skewed routing activates fewer experts than
    /// uniform routing predicts, which only the layout backends profit from, so near-ties go to them. Where
    /// Batched loses, `Fused` (its persistent 64-row tile, no permuted copy) takes batches of at most 48 rows
    /// per active expert where it measured ahead of Grouped: up to 64 (token, slot) rows on any model (its fixed
    /// cost is the lower), and beyond that on narrow experts (I ≤ 1024) or few experts (E ≤ 16). On wide
    /// experts with many rows Grouped's TMA-fed GEMMs are ahead, and at prefill 1.2–1.5x: `Grouped` takes those.
    /// With an expert map, Auto runs Grouped; over FP8 weights too (the FP8 decode kernels that would compete
    /// at small batches are future work).
    pub fn backend_for(&self, tokens: usize) -> Backend {
        match self.backend {
            Backend::Auto => auto_pick(&self.sizing.shape, self.sizing.format, tokens, self.expert_map.is_some()),
            b => b,
        }
    }

    /// The passes of a forward of `tokens` tokens, in order (host only, allocation-free).
    fn steps(&self, tokens: usize) -> impl Iterator<Item = Result<Step>> + '_ {
        let max = self.sizing.max_tokens;
        let mut lo = 0usize;
        let mut chunk_end = 0usize;
        let mut chunk_backend = Backend::Auto;
        std::iter::from_fn(move || {
            if lo >= tokens {
                return None;
            }
            if lo >= chunk_end {
                chunk_end = (lo + max).min(tokens);
                chunk_backend = self.backend_for(chunk_end - lo);
            }
            let b = chunk_backend;
            if !self.sizing.backends.contains(b) {
                lo = tokens;
                return Some(Err(Error::InvalidProblem(format!(
                    "backend {b} has no scratch room in this plan (its backends: {{{}}})",
                    self.sizing.backends
                ))));
            }
            let n = match b {
                Backend::Fused => self.fused_pass(chunk_end - lo).1,
                _ => self.sizing.fitting_tokens(b, chunk_end - lo),
            };
            if n == 0 {
                lo = tokens;
                return Some(Err(Error::InvalidProblem(format!(
                    "scratch capacity: backend {b} cannot run one token in {} layout rows",
                    self.sizing.rows
                ))));
            }
            let step = Step { backend: b, lo, hi: lo + n };
            lo += n;
            Some(Ok(step))
        })
    }

    /// How many passes a forward of `tokens` tokens runs (1 when the batch fits the plan in one go).
    ///
    /// # Errors
    /// As [`Self::forward`] for a backend without room.
    pub fn passes(&self, tokens: usize) -> Result<usize> {
        self.steps(tokens).try_fold(0, |n, s| s.map(|_| n + 1))
    }

    /// The Fused tile and tokens of a pass of at most `want` tokens: the chosen (or fixed) tile if its layout
    /// fits the scratch rows, else the 64-row tile.
    fn fused_pass(&self, want: usize) -> (FusedTile, usize) {
        let s = &self.sizing.shape;
        let want = want.min(self.sizing.max_tokens);
        let n = self.sizing.fitting_tokens(Backend::Fused, want);
        let tile = self.sizing.fused_tile.unwrap_or_else(|| FusedTile::for_rows(n * s.slots(), s.groups()));
        if tile != FusedTile::M64N128K64 && aligned_rows(n * s.slots(), s.groups(), tile.block_m()) > self.sizing.rows {
            // The 128-row tile's padding does not fit: the largest pass that does, or the 64-row tile.
            let fits = |t: usize| aligned_rows(t * s.slots(), s.groups(), tile.block_m()) <= self.sizing.rows;
            let m = (1..=n).rev().find(|&t| fits(t)).unwrap_or(0);
            if m * 2 >= n && m > 0 {
                return (tile, m);
            }
            return (FusedTile::M64N128K64, n);
        }
        (tile, n)
    }

    /// `y [T, H] = MoE(x [T, H])` for the routing `topk_ids`, `topk_weights` (`[T, k]`), using `scratch` for
    /// every intermediate. Any `T`: batches larger than a pass run as several passes.
    ///
    /// Validates, before it queues anything: the stream's and the scratch's device against the plan's (naming
    /// both), the views' shapes (`x`, `y` `[T, H]`, ids and weights `[T, k]`, packed rows, 16-byte aligned
    /// bases), the scratch's capacity against [`Self::needs`], and that the backend of every pass has room.
    /// Device data (ids) is range-checked on the device and reported through the scratch's status word
    /// ([`MoeScratch::check`]).
    ///
    /// With a shared expert in the weights, every token adds it with weight 1 (DeepSeek-V3, Kimi-K2); for a
    /// per-token weight (Qwen2-MoE's gate) use [`Self::forward_with_shared_weights`].
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] / [`Error::Buffer`] naming the violated constraint; launch errors.
    pub fn forward(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        self.forward_passes(stream, scratch, x, topk_ids, topk_weights, None, y)
    }

    /// Validates, then runs the passes; `shared` is the shared expert's weight `[T, 1]` (`None`: 1).
    #[allow(clippy::too_many_arguments)]
    fn forward_passes(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        shared: Option<&MatrixView<'_, f32>>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        self.validate(stream, scratch, x, topk_ids, topk_weights, &mut *y)?;
        self.validate_shared(x.rows(), shared)?;
        let tokens = x.rows();
        for step in self.steps(tokens) {
            step?;
        }
        // The extended routing's buffers leave the scratch for the passes (no allocation), which then borrow the
        // rest of it, and return to it whatever the passes did.
        let mut routing = shared::TakenRouting::take(scratch);
        let out = self.run_passes(stream, scratch, &mut routing, x, topk_ids, topk_weights, shared, y);
        routing.restore(scratch);
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn run_passes(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        routing: &mut shared::TakenRouting,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        shared: Option<&MatrixView<'_, f32>>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        for step in self.steps(x.rows()) {
            let Step { backend, lo, hi } = step?;
            let (xs, ids, ws) = (x.row_range(lo, hi), topk_ids.row_range(lo, hi), topk_weights.row_range(lo, hi));
            let sw = shared.map(|s| s.row_range(lo, hi));
            let (ids, ws) = self.pass_routing(stream, &mut *routing, ids, ws, sw.as_ref())?;
            let mut ys = y.row_range_mut(lo, hi);
            let pass = PassIo { stream, scratch: &mut *scratch, x: &xs, ids: &ids, weights: &ws };
            match backend {
                Backend::Batched => self.forward_batched(pass, &mut ys)?,
                Backend::Eager => self.forward_eager(pass, &mut ys)?,
                Backend::Fused => self.forward_fused(pass, &mut ys)?,
                b => self.forward_layout(b, pass, &mut ys)?,
            }
        }
        Ok(())
    }

    fn validate(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &MoeScratch<T>,
        x: &MatrixView<'_, T>,
        ids: &MatrixView<'_, i32>,
        weights: &MatrixView<'_, f32>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        let d = self.device.ordinal;
        same_device("the stream", stream.context().ordinal(), d)?;
        same_device("the scratch", scratch.device(), d)?;
        scratch.needs().check_covers(self.needs())?;
        let (t, h, k) = (x.rows(), self.sizing.shape.hidden, self.sizing.shape.top_k);
        let shape_err = |name: &'static str, rows: usize, cols: usize, want_cols: usize| Error::Buffer {
            name,
            detail: format!("is [{rows}, {cols}], the layer needs [{t}, {want_cols}] (T = x's rows)"),
        };
        if x.cols() != h {
            return Err(Error::Buffer {
                name: "x",
                detail: format!("has {} columns, the layer's hidden size is {h}", x.cols()),
            });
        }
        for (name, rows, cols, want) in [
            ("topk_ids", ids.rows(), ids.cols(), k),
            ("topk_weights", weights.rows(), weights.cols(), k),
            ("y", y.rows(), y.cols(), h),
        ] {
            if rows != t || cols != want {
                return Err(shape_err(name, rows, cols, want));
            }
        }
        for (name, cols, stride) in [
            ("x", x.cols(), x.stride()),
            ("topk_ids", ids.cols(), ids.stride()),
            ("topk_weights", weights.cols(), weights.stride()),
            ("y", y.cols(), y.stride()),
        ] {
            if stride != cols && t > 1 {
                return Err(Error::Buffer {
                    name,
                    detail: format!(
                        "row stride {stride} != cols {cols}: the layer's kernels read packed rows (take a view of whole rows)"
                    ),
                });
            }
        }
        let (x_addr, y_addr) = (x.as_view().device_ptr(stream).0, view_addr_mut(y, stream));
        for (name, addr) in [("x", x_addr), ("y", y_addr)] {
            if addr % 16 != 0 {
                return Err(Error::Buffer {
                    name,
                    detail: format!("device address {addr:#x} is not 16-byte aligned (16-byte row loads)"),
                });
            }
        }
        Ok(())
    }

    fn gemm_pair(&self, backend: Backend) -> Result<&GemmPair<T>> {
        self.gemms
            .iter()
            .find(|g| g.backend == backend)
            .ok_or_else(|| Error::InvalidProblem(format!("backend {backend} has no GEMM plans in this layer")))
    }

    /// The dense weights of the backends that only multiply those (Eager, Batched, Fused).
    fn dense(&self, backend: Backend) -> Result<&ExpertWeights<T>> {
        match self.weights.parts() {
            Parts::Dense(w) => Ok(w),
            Parts::Fp8(..) => Err(fp8_backend_error(backend)),
        }
    }

    /// Re-targets the scratch's layout at `dims` and builds it from the pass's ids (one kernel).
    fn lay_out(
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

    fn layout_dims(&self, spec: LayoutSpec, tokens: usize) -> Result<LayoutDims> {
        let s = &self.sizing.shape;
        LayoutDims::new(spec, tokens, s.slots(), s.layout_experts(), s.groups())
    }

    fn forward_layout(&self, backend: Backend, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let spec = match backend {
            Backend::Grouped => LayoutSpec::Grouped,
            Backend::Contiguous => LayoutSpec::Aligned { block_m: CONTIGUOUS_BLOCK_M },
            _ => LayoutSpec::Masked { max_m: self.sizing.max_m },
        };
        let tokens = p.x.rows();
        let dims = self.layout_dims(spec, tokens)?;
        let gemms = self.gemm_pair(backend)?;
        let c = self.weights.common();
        let (h, i) = (c.hidden, c.inter);
        let rows = tokens * self.sizing.shape.slots();
        let Buffers { layout, a, a8, h8, d1, h: hbuf, d2, workspace, status, .. } = p.scratch.buffers()?;
        let (d1, d2) = (need(d1, "d1")?, need(d2, "d2")?);
        let (layout, workspace) = (need(layout, "layout")?, need(workspace, "GEMM workspace")?);
        self.lay_out(p.stream, layout, dims, p.ids, status)?;
        match (&gemms.plans, self.weights.parts()) {
            (PairPlans::Dense(g1, g2), Parts::Dense(w)) => {
                let a = need(a, "a")?;
                layout.gather(p.stream, tokens, h, &p.x.as_view(), a, status)?;
                g1.for_rows(rows).launch(p.stream, a, &w.w13, layout.group_rows(), d1, workspace, status)?;
                activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
                g2.for_rows(rows).launch(p.stream, hbuf, &w.w2, layout.group_rows(), d2, workspace, status)?;
            }
            (PairPlans::Fp8(g1, g2), Parts::Fp8(w, is_bf16)) => {
                // x -> e4m3 at its layout positions; GEMM1; activation; h -> e4m3 (rows in use); GEMM2.
                let (a8, h8) = (need(a8, "a fp8")?, need(h8, "h fp8")?);
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
            _ => {
                return Err(Error::InvalidProblem(format!(
                    "backend {backend}: the layer's GEMM plans are not for its weights' format ({})",
                    c.format
                )))
            }
        }
        combine_layout(
            p.stream,
            &c,
            self.sizing.shape.slots(),
            tokens,
            layout,
            d2,
            &p.weights.as_view(),
            &mut y.as_view_mut(),
        )
    }

    /// Aligned layout; GEMM1 gathers x's rows through `sorted_ids`; activation by position; GEMM2 weights,
    /// biases and scatters each row to its (token, slot) row; the combine sums the k rows of each token.
    fn forward_fused(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let w = self.dense(Backend::Fused)?;
        let c = self.weights.common();
        let (h, i, r13) = (w.hidden, w.inter, w.w13_rows());
        let tokens = p.x.rows();
        let (tile, _) = self.fused_pass(tokens);
        let dims = self.layout_dims(LayoutSpec::Aligned { block_m: tile.block_m() }, tokens)?;
        let Buffers { layout, d1, h: hbuf, d2, status, .. } = p.scratch.buffers()?;
        let (d1, d2, layout) = (need(d1, "d1")?, need(d2, "d2")?, need(layout, "layout")?);
        self.lay_out(p.stream, layout, dims, p.ids, status)?;
        self.fused.gemm1_gather(p.stream, tile, layout, tokens, &p.x.as_view(), &w.w13, r13, h, d1)?;
        activate_layout(p.stream, &c, layout, d1, hbuf, status)?;
        self.fused.gemm2_scatter(
            p.stream,
            tile,
            layout,
            tokens,
            hbuf,
            &w.w2,
            h,
            i,
            &p.weights.as_view(),
            w.b2.as_ref(),
            d2,
        )?;
        fused::sum_slots(p.stream, layout, tokens, h, d2, &mut y.as_view_mut())
    }

    /// Two kernels stream each (token, slot) row's expert weights with every SM: act(W13 x) per row, then
    /// W2 h per output with the router weights and the sum over k fused.
    fn forward_batched(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let tokens = p.x.rows();
        let Buffers { h, status, .. } = p.scratch.buffers()?;
        elementwise::launch_decode_layer(
            p.stream,
            self.dense(Backend::Batched)?,
            tokens,
            self.sizing.shape.slots(),
            &p.x.as_view(),
            &p.ids.as_view(),
            &p.weights.as_view(),
            h,
            &mut y.as_view_mut(),
            status.word_mut(),
        )
    }

    /// The oracle: the grouped layout, then one single-group GEMM per expert that received rows (the counts
    /// are read back: this synchronises).
    fn forward_eager(&self, p: PassIo<'_, '_, T>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let w = self.dense(Backend::Eager)?;
        let c = self.weights.common();
        let (h, i, r13) = (w.hidden, w.inter, w.w13_rows());
        let tokens = p.x.rows();
        let dims = self.layout_dims(LayoutSpec::Grouped, tokens)?;
        let PairPlans::Dense(g1, g2) = &self.gemm_pair(Backend::Eager)?.plans else {
            return Err(fp8_backend_error(Backend::Eager));
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
        combine_layout(
            p.stream,
            &c,
            self.sizing.shape.slots(),
            tokens,
            layout,
            d2,
            &p.weights.as_view(),
            &mut y.as_view_mut(),
        )
    }
}

/// The inputs of one pass.
struct PassIo<'s, 'v, T: Element> {
    stream: &'s Arc<CudaStream>,
    scratch: &'s mut MoeScratch<T>,
    x: &'s MatrixView<'v, T>,
    ids: &'s MatrixView<'v, i32>,
    weights: &'s MatrixView<'v, f32>,
}

/// The scratch's buffers, borrowed apart.
struct Buffers<'a, T> {
    layout: Option<&'a mut ExpertLayout>,
    a: Option<&'a mut CudaSlice<T>>,
    a8: Option<&'a mut Fp8Rows>,
    h8: Option<&'a mut Fp8Rows>,
    d1: Option<&'a mut CudaSlice<T>>,
    h: &'a mut CudaSlice<T>,
    d2: Option<&'a mut CudaSlice<T>>,
    workspace: Option<&'a mut Workspace>,
    single: Option<&'a mut CudaSlice<i32>>,
    status: &'a mut DeviceStatus,
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
            d1: self.d1.as_mut(),
            h: self.h.as_mut().ok_or_else(|| missing("h"))?,
            d2: self.d2.as_mut(),
            workspace: self.workspace.as_mut(),
            single: self.single.as_mut(),
            status: &mut self.status,
        })
    }
}

fn need<'a, U>(b: Option<&'a mut U>, name: &str) -> Result<&'a mut U> {
    b.ok_or_else(|| Error::InvalidProblem(format!("scratch capacity: the scratch holds no {name}")))
}

fn view_addr_mut<T>(y: &mut MatrixViewMut<'_, T>, stream: &Arc<CudaStream>) -> u64 {
    y.as_view_mut().device_ptr_mut(stream).0
}

fn same_device(what: &str, got: usize, plan: usize) -> Result<()> {
    if got != plan {
        return Err(Error::InvalidProblem(format!(
            "{what} is on device {got}, the layer was planned on device {plan}"
        )));
    }
    Ok(())
}

/// `h = act(d1 + b13)` for the positions `layout` placed (the rows of its capacity that have an expert).
fn activate_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &Common<'_>,
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
        experts: w.groups(),
        bias: w.b13,
    };
    elementwise::launch_activate(stream, &act, d1, h, status.word_mut())
}

/// `y = Σ_k weight · (d2 + b2)` over the rows `layout` placed, back in token order.
#[allow(clippy::too_many_arguments)]
fn combine_layout<T: Element>(
    stream: &Arc<CudaStream>,
    w: &Common<'_>,
    top_k: usize,
    tokens: usize,
    layout: &ExpertLayout,
    d2: &CudaSlice<T>,
    weights: &impl DevicePtr<f32>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let bias = w.b2.map(|b| (layout.m_indices().as_view(), b.as_view(), w.groups()));
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
    workspace: &'a mut Workspace,
    status: &'a mut DeviceStatus,
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
