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
//! Grouped, Contiguous, Masked and Fused backends, and Batched over the FP8 decode kernels ([`Backends::FP8`]); `Auto`
//! picks Batched or Grouped ([`auto_backend_fp8`]). Eager has no FP8 form: asking for it is an
//! [`Error::InvalidProblem`] that says so.
//!
//! **Per-channel FP8 experts** ([`Fp8ChannelExpertWeights`]: e4m3 with one f32 scale per output row, a
//! per-tensor scale as its special case; activations per token, per tensor or by the checkpoint's static scale)
//! run the FP8 rowwise grouped GEMM on the layout backends, the FP8 decode kernels (Batched) and the FP8 fused
//! GEMMs (Fused) with per-row scale grids, the latter two where H and I are multiples of 128
//! ([`Backends::FP8_CHANNEL`]); `Auto` picks Batched or Grouped by the FP8 cost model (see `fp8_channel.rs`).
//!
//! **MXFP4 experts** ([`Mxfp4ExpertWeights`]: gpt-oss's e2m1 weights with UE8M0 scales per 32, kept in four
//! bits) plan as `MoeLayer<bf16, Mxfp4ExpertWeights>` and run Grouped, Contiguous and Masked ([`Backends::MX`];
//! `Auto`: Grouped): the gathered `x` and the activation `h` are quantised to MXFP8 per group on the device and
//! the block-scaled grouped GEMM of the arch multiplies them (on SM90 the portable kernel, on SM100 CUTLASS's),
//! K and GEMM2's N zero-padded to 128 (see `mx.rs`). [`crate::reference::moe_forward_mx`] is the host computation.
//!
//! **The device's arch** picks the layout backends' GEMM once, when the layer is planned ([`LayerGemm`],
//! `arch.rs`): on SM90 the SM90 FP8 blockwise GEMM, on SM100 [`crate::kernels::grouped_fp8_sm100::GroupedGemmFp8Sm100`] over the same
//! operands, group offsets and activation quantisation; the passes launch whichever the plan holds. On SM100
//! the FP8 layer runs Grouped, Contiguous, Masked and Batched (plain CUDA decode kernels); Fused, whose
//! gather/scatter GEMMs are SM90 wgmma kernels, is refused with [`Error::UnsupportedArch`] naming the backend,
//! `sm_90a` and the device; `Auto` runs Grouped (its cost model was fitted on an H200). Dense bf16 layers
//! run [`crate::kernels::grouped_sm100::GroupedGemmSm100`] there under the same backends (Eager too; f16 has no SM100 kernel and is
//! refused by name), Fused refused alike. The SM100 layer path is compiled and
//! its planning, sizing and refusals tested on the CPU; it has never run on an SM100 GPU.
//!
//! A shared expert (DeepSeek-V3, Kimi-K2, Qwen2-MoE; [`ExpertWeights::upload_with_shared`]) rides in the same
//! GEMMs as `I_s / I` more groups that every token joins with the shared weight `s_t`: see
//! [`MoeLayer::forward_with_shared_weights`] and `shared.rs`.
//!
//! A forward takes any number of tokens: batches larger than a backend's pass (see [`sizing`]) run as several
//! passes over the same scratch (chunked prefill). It validates every view and the scratch before it queues
//! its first kernel, allocates nothing and (except `Eager`) never synchronises, so it can be captured in a CUDA
//! graph, many layers back to back.

/// The [`weights::sealed::Common`] facts of a weights type with `dims` (its extents and gate/up format),
/// `device()` and `bytes()`, with its `format`; biases (none unless given) as `field: value` overrides.
macro_rules! weights_common {
    ($w:expr, $format:expr $(, $field:ident: $value:expr)* $(,)?) => {{
        #[allow(unused_mut)]
        let mut c = Common { format: $format, dims: $w.dims, b13: None, b2: None, device: $w.device(), bytes: $w.bytes() };
        $(c.$field = $value;)*
        c
    }};
}

/// `Sealed<bf16>` and `LayerWeights<bf16>` for a kind of quantised weights (bf16 activations): its `format`, its
/// [`weights::sealed::Parts`] variant and, if it has them, its bias fields.
macro_rules! bf16_layer_weights {
    ($ty:ty, $format:expr, $part:ident $(, biases $b13:ident, $b2:ident)?) => {
        impl Sealed<bf16> for $ty {
            fn common(&self) -> Common<'_> {
                weights_common!(self, $format $(, $b13: self.$b13.as_ref(), $b2: self.$b2.as_ref())?)
            }
            fn parts(&self) -> Parts<'_, bf16> {
                Parts::$part(self, IsBf16(same))
            }
        }

        impl LayerWeights<bf16> for $ty {}
    };
}

/// The getters of a weights type that may hold a shared expert after its routed experts (its `dims`), with
/// `groups()` of visibility `$vis`.
macro_rules! routed_and_shared_getters {
    ($vis:vis) => {
        getters!(in dims;
            /// Routed experts (without the shared-expert groups).
            experts: usize,
            /// Shared-expert groups appended after the routed experts (`I_s / I`; 0 without a shared expert).
            shared_groups: usize,
            hidden: usize,
            inter: usize,
            gate_up: GateUp,
            activation: Activation,
        );
        /// Experts every tensor holds: the routed ones and the shared groups.
        $vis fn groups(&self) -> usize {
            self.dims.groups()
        }
    };
}

mod arch;
mod fp8;
mod fp8_channel;
mod gemm_spec;
mod mx;
mod needs;
mod passes;
mod pick;
pub use pick::AutoSource;
mod plans;

use passes::{same_device, view_addr_mut, PassIo};
use plans::{mx_plan, plan_host_bytes, Fp8Plans, GemmPair, GemmPlans, PairPlans, RowwisePlans};
mod scratch;
mod shape;
mod shared;
pub mod sizing;
mod steps;
mod weights;

pub use crate::backend::{Backend, Backends};
pub use arch::LayerGemm;
pub use fp8::Fp8ExpertWeights;
pub use fp8_channel::Fp8ChannelExpertWeights;
pub use mx::Mxfp4ExpertWeights;
pub use scratch::MoeScratch;
pub use sizing::{Footprint, LayerShape, LayerSizing, PlanBytes, ScratchNeeds, BATCHED_MAX_ROWS};
pub use weights::{ExpertWeights, LayerWeights, WeightFormat};
// The host-side vocabulary lives in `crate::experts`; its names stay reachable here, where the layer takes them.
pub use crate::experts::{Activation, ExpertFormat, GateUp, PackedExperts, SharedExpert, Storage};

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::device::DeviceInfo;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::fused::{FusedGemm, FusedTile};
use crate::tuning::TunedBackends;
use crate::view::{MatrixView, MatrixViewMut};

use sizing::format_backend_error;
use steps::Step;

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
    /// The Fused backend's tile for every batch (`None`: per pass, the tuned table's tile of the batch's bucket
    /// where it names one, else [`FusedTile::for_rows`]).
    pub fused_tile: Option<FusedTile>,
    /// `Auto`'s measured choice per token bucket ([`TunedBackends`]; `None`: the cost model alone).
    pub tuned: Option<TunedBackends>,
    /// Where `tuned` is `None`, take the table this crate ships for the layer's `E`, `N`, weight format and GPU
    /// ([`TunedBackends::shipped`]: 16-bit and block-FP8 weights; with `backends` given, its buckets of those
    /// backends only); `false` keeps the cost model alone.
    pub shipped_tuning: bool,
}

/// Builder setters that store `Some(value)` in the option field of the same name.
macro_rules! some_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = Some(value);
            self
        }
    )*};
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
            tuned: None,
            shipped_tuning: true,
        }
    }
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }
    some_setters! {
        /// Room in the scratch for each backend of `backends`, for full passes of `max_tokens` tokens (Masked:
        /// `masked_max_m`; Batched: 4096 (token, slot) rows), whatever `Auto` would send it. Name a backend here to
        /// force it later ([`MoeLayer::set_backend`]) without small passes. `Auto` then picks among `backends` only
        /// (a tuned table's buckets of other backends are dropped).
        backends: Backends;
        masked_max_m: usize;
        fused_tile: FusedTile;
        /// `Auto` picks per batch from `tuned` (a file `moe-gemm bench --layer --write-configs` wrote on the target
        /// GPU), falling back to its cost model where the tuned backend cannot run the batch; the plan makes room
        /// for the tuned backends too. Its `E` and `N` must be the layer's global experts and intermediate size, its
        /// format the weights' ([`TunedBackends::format`]).
        tuned: TunedBackends;
    }
    /// `Auto` by its cost model alone: no shipped table (a `tuned` one given still applies).
    pub fn cost_model_only(mut self) -> Self {
        self.shipped_tuning = false;
        self
    }
}

/// `Auto`'s choice for `tokens` tokens of a layer of `experts` experts of `[hidden, inter]` with top-`top_k`
/// routing (see [`MoeLayer::backend_for`]): a pure function, so the policy can be checked without a GPU.
pub fn auto_backend(experts: usize, top_k: usize, hidden: usize, inter: usize, tokens: usize) -> Backend {
    pick::dense_cost_pick(Backends::AUTO, (experts, top_k, hidden, inter), tokens)
}

/// `Auto`'s choice over block-FP8 experts (see [`MoeLayer::backend_for`]): Batched (the FP8 decode kernels) or
/// Grouped, by costs fitted to the H200 under uniform routing (`moe-gemm bench --layer --dtype fp8`,
/// benches/results/h200-2026-12-06-fp8-decode-grid-order, T = 1 to 16): Batched streams each active expert's e4m3
/// weights once and half of them again for every further row that repeats an expert, at about 3.3 TB/s plus
/// 18 µs (DeepSeek-V3, Qwen3-235B, Mixtral and Qwen3-30B fit within 9%); Grouped streams each active expert once
/// at the dense layout path's 3.3 / 4.16 TB/s plus about 44 µs of layout, quantisation, activation and combine. A
/// pure function, so the policy can be checked without a GPU.
pub fn auto_backend_fp8(experts: usize, top_k: usize, hidden: usize, inter: usize, tokens: usize) -> Backend {
    pick::fp8_cost_pick(Backends::FP8_AUTO, (experts, top_k, hidden, inter), tokens)
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
    /// The fused GEMMs' plan (device facts read once), where the Fused backend is enabled (SM90 only).
    fused: Option<FusedGemm>,
    /// Global expert -> local index or -1 (expert parallelism); `None`: all experts are local.
    expert_map: Option<CudaSlice<i32>>,
    gemms: Vec<GemmPair<T>>,
}

/// A forward's routed inputs as the caller gave them: `x [T, H]`, the router's `topk_ids` and `topk_weights`
/// `[T, k]`, and the shared expert's weight per token `[T, 1]` (`None`: 1).
struct Routed<'v, 'a, T> {
    x: &'v MatrixView<'a, T>,
    ids: &'v MatrixView<'a, i32>,
    weights: &'v MatrixView<'a, f32>,
    shared: Option<&'v MatrixView<'a, f32>>,
}

impl<T: Element, W: LayerWeights<T>> MoeLayer<T, W> {
    /// Plans the layer on `stream`'s device for `options.max_tokens` tokens per pass over `weights` (shared:
    /// pass an `Arc` clone to plan several layers, streams or micro-batches over one upload).
    ///
    /// # Errors
    /// Shape errors of the GEMMs and layouts (naming the constraint), weights on another device than the
    /// stream (naming both), driver errors; [`Error::UnsupportedArch`] for a backend whose kernels have no SASS
    /// for the device (on SM100: Fused, and the dense GEMM backends), naming the backend and both arches; over
    /// FP8 weights, Eager (see the module docs).
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
        let experts = weights.common().dims.experts;
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
            experts: c.dims.experts,
            global_experts: expert_map.map_or(c.dims.experts, <[i32]>::len),
            top_k: options.top_k,
            shared_groups: c.dims.shared_groups,
            hidden: c.dims.hidden,
            inter: c.dims.inter,
            gated: c.dims.activation.gated(),
        };
        let shipped = (options.tuned.is_none() && options.shipped_tuning)
            .then(|| TunedBackends::shipped(&device.name, c.format, shape.global_experts, shape.inter))
            .flatten()
            .and_then(|t| options.backends.map_or(Some(t), |set| t.restricted_to(set)));
        let sizing = LayerSizing::for_device(
            &device,
            shape,
            T::DTYPE,
            c.format,
            options.max_tokens,
            options.backend,
            options.backends,
            options.masked_max_m,
            options.fused_tile,
            expert_map.is_some(),
            options.tuned.or(shipped),
        )?;
        let mut gemms: Vec<GemmPair<T>> = Vec::new();
        for pair in sizing.gemms.chunks(2) {
            let plans = if pair[0].gemm.is_fp8() {
                PairPlans::Fp8(Fp8Plans::new(&device, &pair[0])?, Fp8Plans::new(&device, &pair[1])?)
            } else if pair[0].gemm.is_fp8_channel() {
                PairPlans::Fp8Rowwise(RowwisePlans::new(&device, &pair[0])?, RowwisePlans::new(&device, &pair[1])?)
            } else if pair[0].gemm.is_mx() {
                PairPlans::Mx(mx_plan(&device, &pair[0])?, mx_plan(&device, &pair[1])?)
            } else {
                PairPlans::Dense(GemmPlans::new(&device, &pair[0])?, GemmPlans::new(&device, &pair[1])?)
            };
            gemms.push(GemmPair { backend: pair[0].backend, plans });
        }
        let expert_map = expert_map.map(|m| shared::extended_map(m, &shape));
        Ok(MoeLayer {
            expert_map: expert_map.map(|m| stream.clone_htod(&m)).transpose()?,
            fused: sizing.backends.contains(Backend::Fused).then(|| FusedGemm::new(stream)).transpose()?,
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
    /// Fixes the `Fused` backend's tile (`None`: chosen per pass, from the tuned table's bucket where it names
    /// a tile, else by [`FusedTile::for_rows`]). A pass whose
    /// 128-row layout would not fit the scratch runs fewer tokens.
    pub fn set_fused_tile(&mut self, tile: Option<FusedTile>) {
        self.sizing.fused_tile = tile;
    }
    /// Switches the backend of a live layer (no reload, no allocation). `Auto` picks among the backends the
    /// plan made room for ([`Self::backends`]). A concrete backend must have room for full passes
    /// ([`LayerSizing::check_full_passes`]): a plan sized for `Auto` gives each backend only the batches Auto sends
    /// it, so a forced backend would run a large batch as many small passes; plan it with
    /// [`MoeLayerOptions::backends`] (each of the set gets room for `max_tokens`), or accept the passes with
    /// [`Self::set_backend_with_passes`].
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the plan made no scratch room for `backend` (see
    /// [`MoeLayerOptions::backends`]) or less than full passes (naming its tokens per pass and `max_tokens`), or,
    /// over FP8 weights, for Eager (no FP8 form: the message says so); [`Error::UnsupportedArch`] for a backend
    /// without SASS for the layer's device (SM100: Fused).
    pub fn set_backend(&mut self, backend: Backend) -> Result<()> {
        self.check_backend(backend)?;
        self.sizing.check_full_passes(backend)?;
        self.backend = backend;
        Ok(())
    }

    /// [`Self::set_backend`] that accepts a backend whose room in this plan is less than full passes: a batch
    /// then runs in [`Self::passes`] passes of [`LayerSizing::tokens_per_pass`] tokens.
    ///
    /// # Errors
    /// As [`Self::set_backend`], less the full-pass check.
    pub fn set_backend_with_passes(&mut self, backend: Backend) -> Result<()> {
        self.check_backend(backend)?;
        self.backend = backend;
        Ok(())
    }

    /// Whether `backend` runs over the weights' format on the device and has room in the plan.
    fn check_backend(&self, backend: Backend) -> Result<()> {
        if backend != Backend::Auto && !self.sizing.format.backends().contains(backend) {
            return Err(format_backend_error(self.sizing.format, backend));
        }
        arch::check_backend(&self.device, backend, self.sizing.gemm)?;
        if backend != Backend::Auto && !self.sizing.backends.contains(backend) {
            return Err(Error::InvalidProblem(format!(
                "backend {backend} has no scratch room in this plan (its backends: {{{}}}); plan the layer with MoeLayerOptions::backends including it",
                self.sizing.backends
            )));
        }
        Ok(())
    }

    /// The table `Auto` picks from, if any: the one given ([`MoeLayerOptions::tuned`]) or the shipped one for
    /// this layer's shape and GPU ([`TunedBackends::shipped`]). `None`: the cost model alone.
    pub fn tuned(&self) -> Option<&TunedBackends> {
        self.sizing.tuned.as_ref()
    }

    /// Where `Auto`'s choices come from on this layer: the table given or shipped, the cost model, or Grouped
    /// alone (its `Display` is a line for a server's log).
    pub fn auto_source(&self) -> AutoSource {
        self.sizing.auto_source()
    }

    /// The backend a pass of `tokens` tokens runs. `Auto` takes the nearest bucket of its tuned table
    /// ([`Self::tuned`]) where that backend can run the batch; otherwise (or with no table) it compares costs fitted to the H200 suite under
    /// uniform routing (`moe-gemm bench --layer --suite`, benches/results/h200-2026-11-29-layer-suite): `Batched`
    /// streams one expert's weights per (token, slot) row at about 4.05 TB/s plus 12 µs; the layout backends
    /// stream each *active* expert once, at about 4.16 TB/s when 16 or more experts are active and 3.3 TB/s when
    /// fewer, plus about 50 µs of layout, activation and combine. Skewed routing activates fewer experts than
    /// uniform routing predicts, which only the layout backends profit from, so near-ties go to them. Where
    /// Batched loses, `Fused` (its persistent 64-row tile, no permuted copy) takes batches of at most 48 rows
    /// per active expert where it measured ahead of Grouped: up to 64 (token, slot) rows on any model (its fixed
    /// cost is the lower), and beyond that on narrow experts (I ≤ 1024) or few experts (E ≤ 16). On wide
    /// experts with many rows Grouped's TMA-fed GEMMs are ahead, and at prefill 1.2–1.5x: `Grouped` takes those.
    /// With an expert map, Auto runs Grouped. Over FP8 weights it picks Batched or Grouped by
    /// [`auto_backend_fp8`]. Auto only ever picks a backend the plan made room for ([`Self::backends`]): where the
    /// one it prefers has none, it takes the nearest planned one (Fused for Grouped and back, then Contiguous,
    /// Masked; Batched only where it is cheaper or nothing else is planned) — see [`LayerSizing::backend_for`].
    pub fn backend_for(&self, tokens: usize) -> Backend {
        self.sizing.backend_for(self.backend, tokens)
    }

    /// The passes of a forward of `tokens` tokens, in order (host only, allocation-free).
    fn steps(&self, tokens: usize) -> impl Iterator<Item = Result<Step>> + '_ {
        self.sizing.steps(self.backend, tokens)
    }

    /// How many passes a forward of `tokens` tokens runs (1 when the batch fits the plan in one go).
    ///
    /// # Errors
    /// As [`Self::forward`] for a backend without room.
    pub fn passes(&self, tokens: usize) -> Result<usize> {
        self.sizing.passes(self.backend, tokens)
    }

    /// The tile a Fused pass of `tokens` tokens runs (its first pass, where the batch takes several): the fixed
    /// tile, the tuned table's for the nearest bucket, or [`FusedTile::for_rows`], where its padded layout fits
    /// the scratch rows (else the 64-row tile).
    pub fn fused_tile_for(&self, tokens: usize) -> FusedTile {
        self.fused_pass(tokens).0
    }

    fn fused_pass(&self, want: usize) -> (FusedTile, usize) {
        self.sizing.fused_pass(want)
    }

    /// `y [T, H] = MoE(x [T, H])` for the routing `topk_ids`, `topk_weights` (`[T, k]`), using `scratch` for
    /// every intermediate. Any `T`: batches larger than a pass run as several passes.
    ///
    /// Validates, before it queues anything: the stream's and the scratch's device against the plan's (naming
    /// both), the scratch's stream against `stream` ([`MoeScratch::hand_over`]), the views' shapes (`x`, `y` `[T, H]`, ids and weights `[T, k]`, packed rows, 16-byte aligned
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
        self.forward_passes(stream, scratch, Routed { x, ids: topk_ids, weights: topk_weights, shared: None }, y)
    }

    /// Validates, then runs the passes.
    fn forward_passes(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        r: Routed<'_, '_, T>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        self.validate(stream, scratch, r.x, r.ids, r.weights, &mut *y)?;
        self.validate_shared(r.x.rows(), r.shared)?;
        let tokens = r.x.rows();
        for step in self.steps(tokens) {
            step?;
        }
        // The extended routing's buffers leave the scratch for the passes (no allocation), which then borrow the
        // rest of it, and return to it whatever the passes did.
        let mut routing = shared::TakenRouting::take(scratch);
        let out = self.run_passes(stream, scratch, &mut routing, r, y);
        routing.restore(scratch);
        out
    }

    fn run_passes(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        routing: &mut shared::TakenRouting,
        r: Routed<'_, '_, T>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        for step in self.steps(r.x.rows()) {
            let Step { backend, lo, hi } = step?;
            let (xs, ids, ws) = (r.x.row_range(lo, hi), r.ids.row_range(lo, hi), r.weights.row_range(lo, hi));
            let sw = r.shared.map(|s| s.row_range(lo, hi));
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
        scratch.check_stream(stream)?;
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
}
