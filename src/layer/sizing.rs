//! What a layer's forward needs from the shared scratch, computed on the host from shapes alone: the same code
//! sizes [`MoeScratch`](super::MoeScratch) allocations and answers `moe-gemm plan` without a GPU.
//!
//! One forward uses one backend and one layout at a time, so the scratch holds one set of intermediates (the
//! permuted rows `a`, GEMM1's `d1`, the activation `h`, GEMM2's `d2`), one layout and one GEMM workspace, each
//! sized to the largest pass of any enabled backend of any layer that uses it. A pass is the most tokens a
//! backend runs at once: a fixed backend's pass is `max_tokens`; under `Auto` (with the default backends) each
//! backend's pass is the largest batch Auto sends it, so the padded layouts of Fused never size the scratch past
//! what Auto runs them at. Bigger batches are chunked into passes by the layer.

use crate::device::{Arch, DeviceInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::fused::FusedTile;
use crate::layouts::build_scratch_ints;
use crate::quant::SCALE_BLOCK;
use crate::tuning::TunedBackends;

pub(crate) use super::gemm_spec::GemmSpec;
pub use super::needs::{mib, Footprint, PlanBytes, ScratchNeeds};
pub use super::shape::LayerShape;

use super::arch::{check_backend, LayerGemm};
use super::pick::{auto_pick, fused_tile_for, tuned_runs};
use super::weights::WeightFormat;
use crate::backend::{Backend, Backends};

/// Rows per tile of the contiguous layout (DeepGEMM's; also the Fused 128-row tile's layout).
pub(crate) const CONTIGUOUS_BLOCK_M: usize = FusedTile::M128N256K64.block_m();
pub use crate::backend::BATCHED_MAX_ROWS;

/// Rows of an aligned layout (every expert padded to a multiple of `block_m`) for `slots` rows over `groups`
/// experts: at most `min(groups, slots)` experts receive rows, each wasting at most `block_m − 1`.
pub(crate) fn aligned_rows(slots: usize, groups: usize, block_m: usize) -> usize {
    (slots + groups.min(slots) * (block_m - 1)).next_multiple_of(block_m)
}

/// How many tokens of each backend run in one pass, and the layout rows that takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    pub backend: Backend,
    pub tokens: usize,
}

/// The per-layer facts a plan derives from its shape and options (no device needed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSizing {
    pub(crate) shape: LayerShape,
    /// How the expert weights are stored (which GEMMs the plan makes).
    pub(crate) format: WeightFormat,
    /// The grouped GEMM of the layout backends, chosen from the format and the device's arch.
    pub(crate) gemm: LayerGemm,
    pub(crate) max_tokens: usize,
    pub(crate) max_m: usize,
    pub(crate) backends: Backends,
    /// Whether the layer has an expert map (Auto then runs Grouped, or the nearest planned backend).
    pub(crate) expert_parallel: bool,
    pub(crate) fused_tile: Option<FusedTile>,
    pub(crate) sm_count: usize,
    /// Sizing pass per enabled backend.
    pub(crate) passes: Vec<Pass>,
    /// Rows of `h`: the largest pass's (each GEMM plan's `max_rows` is its own pass's rows).
    pub(crate) rows: usize,
    pub(crate) needs: ScratchNeeds,
    /// The GEMM plans the layer makes: (family, w13 or w2, groups, n, k, max_rows, candidate rows).
    pub(crate) gemms: Vec<GemmSpec>,
    /// `Auto`'s measured choices, where given (with `backends` given, the buckets of those backends only).
    pub(crate) tuned: Option<TunedBackends>,
}

/// The error of a backend that FP8 expert weights do not run (yet).
/// The error for a backend `format`'s weights do not run.
pub(crate) fn format_backend_error(format: WeightFormat, backend: Backend) -> Error {
    match format {
        WeightFormat::Fp8Channel => Error::InvalidProblem(format!(
            "backend {backend}: per-channel FP8 expert weights run the Batched and Fused backends (the FP8 decode \
             kernels and fused GEMMs) and the Grouped, Contiguous and Masked backends (the FP8 rowwise grouped GEMM \
             over a layout); Eager has no FP8 form"
        )),
        WeightFormat::Mxfp4 => Error::InvalidProblem(format!(
            "backend {backend}: MXFP4 expert weights run the Grouped, Contiguous and Masked backends (the block-scaled \
             grouped GEMM over a layout); no decode or fused kernel reads MXFP4, and Eager has no MXFP4 form"
        )),
        _ => fp8_backend_error(backend),
    }
}

pub(crate) fn fp8_backend_error(backend: Backend) -> Error {
    Error::InvalidProblem(format!(
        "backend {backend}: FP8 expert weights run the Batched, Grouped, Contiguous, Masked and Fused backends (the \
         FP8 decode kernels, the FP8 blockwise grouped GEMM over a layout, the FP8 fused GEMMs); Eager has no FP8 \
         form"
    ))
}

impl LayerSizing {
    /// Sizes a layer of `shape` for `max_tokens` tokens per pass.
    ///
    /// `backend` is the backend the layer starts with; `backends` the ones it gets room for (`None`: those
    /// `backend` can run, each for the batches it runs; `Some(set)`: each of `set` for `max_tokens` tokens).
    /// `max_m` is the masked layout's rows per expert; `sm_count` the device's SMs (the GEMM workspaces
    /// depend on it); `expert_parallel` whether the layer has an expert map (Auto then runs Grouped only).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: zero sizes, `top_k > global_experts`, a backend set
    /// that is empty or holds Batched with an expert map, capacities past int32, workspace queries failing.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shape: LayerShape,
        dtype: DType,
        max_tokens: usize,
        backend: Backend,
        backends: Option<Backends>,
        max_m: Option<usize>,
        fused_tile: Option<FusedTile>,
        expert_parallel: bool,
        sm_count: usize,
    ) -> Result<Self> {
        let format = WeightFormat::Dense;
        Self::for_format(
            shape,
            dtype,
            format,
            max_tokens,
            backend,
            backends,
            max_m,
            fused_tile,
            expert_parallel,
            sm_count,
        )
    }

    /// Sizes a layer of `shape` over block-FP8 expert weights
    /// ([`Fp8ExpertWeights`](super::Fp8ExpertWeights)): bf16 activations, e4m3 copies of the GEMMs' inputs and
    /// their scales in the scratch ([`ScratchNeeds::a_fp8_rows`], [`ScratchNeeds::h_fp8_rows`]), the FP8 GEMMs'
    /// plans and workspace, for the SM90 kernels ([`Self::for_device`] sizes for a given device). The arguments
    /// are [`Self::new`]'s; the backends are those of [`Backends::FP8`] (`Auto`: Batched or Grouped).
    ///
    /// # Errors
    /// As [`Self::new`]; [`Error::InvalidProblem`] naming the constraint: Eager (in `backend` or `backends`),
    /// `H` or `I` not a multiple of 128, the FP8 GEMM shapes
    /// ([`GroupedGemmFp8Shape::new`](crate::kernels::grouped_fp8::GroupedGemmFp8Shape::new)).
    #[allow(clippy::too_many_arguments)]
    pub fn new_fp8(
        shape: LayerShape,
        max_tokens: usize,
        backend: Backend,
        backends: Option<Backends>,
        max_m: Option<usize>,
        expert_parallel: bool,
        sm_count: usize,
    ) -> Result<Self> {
        let (dtype, format) = (DType::BF16, WeightFormat::Fp8Block);
        Self::for_format(shape, dtype, format, max_tokens, backend, backends, max_m, None, expert_parallel, sm_count)
    }

    /// Sizes a layer of `shape` whose weights are stored as `format` (what [`MoeLayer`](super::MoeLayer)
    /// plans with): [`Self::new`] for dense weights, [`Self::new_fp8`] for block FP8.
    ///
    /// # Errors
    /// As those two.
    #[allow(clippy::too_many_arguments)]
    pub fn for_format(
        shape: LayerShape,
        dtype: DType,
        format: WeightFormat,
        max_tokens: usize,
        backend: Backend,
        backends: Option<Backends>,
        max_m: Option<usize>,
        fused_tile: Option<FusedTile>,
        expert_parallel: bool,
        sm_count: usize,
    ) -> Result<Self> {
        Self::for_format_tuned(
            shape,
            dtype,
            format,
            max_tokens,
            backend,
            backends,
            max_m,
            fused_tile,
            expert_parallel,
            sm_count,
            None,
        )
    }

    /// [`Self::for_format`] with `Auto` choosing from `tuned` where it can (what a `MoeLayer` planned with
    /// [`MoeLayerOptions::tuned`](super::MoeLayerOptions::tuned) sizes with): the tuned backends get room too.
    ///
    /// # Errors
    /// As [`Self::for_format`].
    #[allow(clippy::too_many_arguments)]
    pub fn for_format_tuned(
        shape: LayerShape,
        dtype: DType,
        format: WeightFormat,
        max_tokens: usize,
        backend: Backend,
        backends: Option<Backends>,
        max_m: Option<usize>,
        fused_tile: Option<FusedTile>,
        expert_parallel: bool,
        sm_count: usize,
        tuned: Option<TunedBackends>,
    ) -> Result<Self> {
        let opts = SizingOptions {
            max_tokens,
            backend,
            backends,
            max_m,
            fused_tile,
            expert_parallel,
            sm_count,
            tuned,
            device: None,
        };
        Self::build(shape, dtype, format, opts)
    }

    /// [`Self::for_format_tuned`] for `device` (what [`MoeLayer`](super::MoeLayer) plans with): its SM count,
    /// and its arch's GEMM ([`LayerGemm::for_arch`]). On SM100, FP8 weights run the SM100 FP8 blockwise GEMM,
    /// dense bf16 weights the SM100 bf16 GEMM, and `Auto` runs Grouped; the other constructors size for the SM90
    /// kernels.
    ///
    /// # Errors
    /// As [`Self::for_format`]; [`Error::UnsupportedArch`] naming the backend, the target its kernels were
    /// built for and the device, for a backend (in `backend` or `backends`) without SASS for the device: on
    /// SM100, Fused (SM90 wgmma gather/scatter GEMMs); [`Error::KernelNotBuilt`] for f16 on SM100.
    #[allow(clippy::too_many_arguments)]
    pub fn for_device(
        device: &DeviceInfo,
        shape: LayerShape,
        dtype: DType,
        format: WeightFormat,
        max_tokens: usize,
        backend: Backend,
        backends: Option<Backends>,
        max_m: Option<usize>,
        fused_tile: Option<FusedTile>,
        expert_parallel: bool,
        tuned: Option<TunedBackends>,
    ) -> Result<Self> {
        let sm_count = device.sm_count.max(1) as usize;
        let device = Some(device);
        let opts = SizingOptions {
            max_tokens,
            backend,
            backends,
            max_m,
            fused_tile,
            expert_parallel,
            sm_count,
            tuned,
            device,
        };
        Self::build(shape, dtype, format, opts)
    }

    /// Where `Auto`'s choices come from on a layer so sized ([`MoeLayer::auto_source`](super::MoeLayer::auto_source)).
    pub fn auto_source(&self) -> super::AutoSource {
        super::pick::auto_source(self)
    }

    fn build(shape: LayerShape, dtype: DType, format: WeightFormat, o: SizingOptions) -> Result<Self> {
        let SizingOptions {
            max_tokens,
            backend,
            backends,
            max_m,
            fused_tile,
            expert_parallel,
            sm_count,
            tuned,
            device,
        } = o;
        let fp8 = format == WeightFormat::Fp8Block;
        let mx = format == WeightFormat::Mxfp4;
        let channel = format == WeightFormat::Fp8Channel;
        // Without a device: the SM90 kernels. An unknown arch keeps them too, and the check below refuses it.
        let arch = device.map_or(Some(Arch::Sm90), |d| d.arch).unwrap_or(Arch::Sm90);
        let gemm = LayerGemm::for_arch(format, arch);
        let bad = |s: String| Err(Error::InvalidProblem(s));
        let s = shape;
        if max_tokens == 0 || s.top_k == 0 || s.experts == 0 || s.hidden == 0 || s.inter == 0 {
            return bad(format!(
                "max_tokens = {max_tokens}, top_k = {}, experts = {}, hidden = {}, inter = {}: all must be positive",
                s.top_k, s.experts, s.hidden, s.inter
            ));
        }
        if s.top_k > s.global_experts || s.experts > s.global_experts {
            return bad(format!(
                "top_k = {} and local experts = {} must not exceed the router's experts = {}",
                s.top_k, s.experts, s.global_experts
            ));
        }
        if let Some(t) = &tuned {
            if t.format() != format {
                return bad(format!(
                    "tuned backends measured over {} experts: this layer's experts are {format}",
                    t.format()
                ));
            }
            if t.shape() != (s.global_experts, s.inter) {
                return bad(format!(
                    "tuned backends for E = {}, N = {}: this layer has E = {} experts (global), I = {}",
                    t.shape().0,
                    t.shape().1,
                    s.global_experts,
                    s.inter
                ));
            }
        }
        let max_m = max_m.unwrap_or(max_tokens.min(256));
        if max_m == 0 {
            return bad("masked_max_m = 0: must be >= 1".into());
        }
        let auto_set = gemm.auto_backends(expert_parallel);
        // Per-channel layers whose H or I the decode kernels do not take run Grouped alone.
        let auto_set =
            if channel && super::fp8_channel::check_backend_shape(Backend::Batched, s.hidden, s.inter).is_err() {
                auto_set.without(Backend::Batched)
            } else {
                auto_set
            };
        // The tuned backends Auto may run get room too.
        let auto_set = match (&tuned, expert_parallel) {
            (Some(t), false) => t
                .buckets()
                .iter()
                .map(|b| b.1)
                .filter(|&b| tuned_runs(&shape, gemm, b, 1))
                .fold(auto_set, |set, b| set.union(Backends::of(b))),
            _ => auto_set,
        };
        let enabled = match (backends, backend) {
            (Some(set), _) => set,
            (None, Backend::Auto) => auto_set,
            (None, b) => Backends::of(b),
        };
        // Auto picks among the planned backends only: a tuned bucket of another backend has no room.
        let tuned = match backends {
            Some(set) => tuned.and_then(|t| t.restricted_to(set)),
            None => tuned,
        };
        if enabled.is_empty() {
            return bad("the layer's backend set is empty: enable at least one backend".into());
        }
        if (fp8 || mx || channel) && dtype != DType::BF16 {
            return bad(format!("{format} expert weights take bf16 activations (their GEMMs write bf16), not {dtype}"));
        }
        if let Some(b) = enabled.iter().chain([backend]).find(|&b| b != Backend::Auto && !format.backends().contains(b))
        {
            return Err(format_backend_error(format, b));
        }
        if mx {
            super::mx::check_mx_shape(s.hidden, s.inter)?;
        }
        if channel {
            super::fp8_channel::check_channel_shape(s.hidden, s.inter)?;
            for b in enabled.iter().chain([backend]) {
                super::fp8_channel::check_backend_shape(b, s.hidden, s.inter)?;
            }
        }
        if fp8 {
            for (name, v, why) in [
                ("H", s.hidden, "w2's N = H must be whole 128-row weight-scale blocks for the blockwise FP8 GEMM"),
                ("I", s.inter, "w13's gate and up halves must each be whole 128-row weight-scale blocks"),
            ] {
                if v % SCALE_BLOCK != 0 {
                    return bad(format!("FP8 experts: {name} = {v} is not a multiple of {SCALE_BLOCK}: {why}"));
                }
            }
        }
        if let Some(d) = device {
            for b in enabled.iter().chain([backend]) {
                check_backend(d, b, gemm)?;
            }
        }
        if expert_parallel && enabled.contains(Backend::Batched) {
            return bad(
                "the Batched backend takes no expert map (expert parallelism): leave it out of the backends".into()
            );
        }
        if backend != Backend::Auto && !enabled.contains(backend) {
            return bad(format!("backend {backend} is not among the layer's backends {{{enabled}}}"));
        }
        let slots = |t: usize| t * s.slots();
        let batched_max = (BATCHED_MAX_ROWS / s.slots()).max(1);
        // Each enabled backend's sizing pass.
        let passes: Vec<Pass> = enabled
            .iter()
            .map(|b| {
                let full = match b {
                    Backend::Masked => max_tokens.min(max_m),
                    Backend::Batched => max_tokens.min(batched_max),
                    _ => max_tokens,
                };
                let tokens = if backends.is_none() && backend == Backend::Auto {
                    // The largest batch Auto sends to b (at least one token, so a forced switch still runs).
                    (1..=max_tokens)
                        .rfind(|&t| auto_pick(&s, gemm, t, expert_parallel, tuned.as_ref(), enabled) == b)
                        .unwrap_or(1)
                        .min(full)
                } else {
                    full
                };
                Pass { backend: b, tokens }
            })
            .collect();
        let fused_bm = |t: usize| fused_tile_for(fused_tile, tuned.as_ref(), format, t, &s).block_m();
        // (d1/h rows, a rows, d2 rows, layout rows, layout tiles) of a pass.
        let rows_of = |p: &Pass| -> (usize, usize, usize, usize, usize) {
            let (t, g) = (p.tokens, s.groups());
            match p.backend {
                Backend::Batched => (slots(t), 0, 0, 0, 0),
                Backend::Grouped => (slots(t), slots(t), slots(t), slots(t), slots(t)),
                Backend::Eager => {
                    // The per-expert slices start anywhere below T·k and span up to max_tokens rows.
                    let r = slots(t) + t;
                    (r, r, r, slots(t), slots(t))
                }
                Backend::Masked => {
                    let r = g * max_m;
                    (r, r, r, r, r)
                }
                Backend::Contiguous => {
                    let r = aligned_rows(slots(t), g, CONTIGUOUS_BLOCK_M);
                    (r, r, r, r, r / CONTIGUOUS_BLOCK_M)
                }
                Backend::Fused => {
                    // Room for the 64-row tile at least (a pass whose own tile does not fit falls back to it).
                    let r = aligned_rows(slots(t), g, fused_bm(t).max(FusedTile::M64N128K64.block_m()));
                    // One expert id per block of the smallest tile a pass may take.
                    let tiles = FusedTile::ALL.iter().map(|f| aligned_rows(slots(t), g, f.block_m()) / f.block_m());
                    // Over FP8 weights GEMM1 gathers x quantised per token: `a` holds T e4m3 rows.
                    (r, if fp8 { t } else { 0 }, slots(t), r, tiles.max().unwrap_or(0))
                }
                Backend::Auto => unreachable!("passes hold concrete backends"),
            }
        };
        let mut rows = 0;
        let (mut a_rows, mut d2_rows, mut layout_rows, mut layout_tiles) = (0, 0, 0, 0);
        for p in &passes {
            let (r, a, d2, l, tiles) = rows_of(p);
            rows = rows.max(r);
            a_rows = a_rows.max(a);
            d2_rows = d2_rows.max(d2);
            layout_rows = layout_rows.max(l);
            layout_tiles = layout_tiles.max(tiles);
        }
        if rows > i32::MAX as usize {
            return bad(format!("{rows} layout rows overflow int32 positions (lower max_tokens)"));
        }
        let batched_only = passes.iter().all(|p| p.backend == Backend::Batched);
        let mut gemms = Vec::new();
        for p in &passes {
            // A GEMM reads its own pass's layout (the rows its `a` holds), not the largest of all passes: a
            // Fused pass's padded layout may exceed the Grouped pass's rows, which `a` is sized by.
            let own = rows_of(p).0;
            let (groups, max_rows, cand) = match p.backend {
                Backend::Grouped | Backend::Contiguous => (s.groups(), own, slots(p.tokens)),
                Backend::Masked => (s.groups(), own, slots(p.tokens).min(s.groups() * max_m)),
                Backend::Eager => (1, max_tokens, max_tokens),
                _ => continue,
            };
            // The MX GEMMs take K and N in whole 128s: K padded (zero columns), GEMM2's N padded (zero rows).
            let pad = |v: usize| if mx { super::mx::mx_padded(v) } else { v };
            for (second, n, k) in [(false, s.w13_rows(), pad(s.hidden)), (true, pad(s.hidden), pad(s.inter))] {
                gemms.push(GemmSpec { backend: p.backend, second, groups, n, k, max_rows, rows: cand, gemm });
            }
        }
        let mut workspace_bytes = 0usize;
        for g in &gemms {
            workspace_bytes = workspace_bytes.max(g.workspace_bytes(dtype, sm_count)?);
        }
        let layout = !batched_only;
        // d1 (and h in e4m3): the GEMM backends' rows; Batched keeps them in registers and shared memory.
        let gemm_rows =
            passes.iter().filter(|p| p.backend != Backend::Batched).map(|p| rows_of(p).0).max().unwrap_or(0);
        // Block-FP8 weights on Batched: h quantised once (e4m3 rows and scales) and its groups' arrival counters.
        let batched_rows = passes.iter().filter(|p| p.backend == Backend::Batched).map(|p| slots(p.tokens)).max();
        let batched_rows = if fp8 { batched_rows.unwrap_or(0) } else { 0 };
        let positions = slots(max_tokens);
        let needs = ScratchNeeds {
            dtype,
            tokens: max_tokens,
            slots: positions,
            hidden: s.hidden,
            w13_cols: s.w13_rows(),
            inter: s.inter,
            // FP8 weights: GEMM1 reads x quantised at the layout positions, not a bf16 copy; GEMM2 reads h
            // requantised (every layout row the GEMM plans may read: `rows`).
            a_rows: if fp8 || channel { 0 } else { a_rows },
            a_fp8_rows: if fp8 { a_rows } else { 0 },
            h_fp8_rows: if fp8 { gemm_rows.max(batched_rows) } else { 0 },
            // Per-channel FP8 weights: x quantised per token at its layout positions, h per row (one scale each).
            a_token_rows: if channel { a_rows } else { 0 },
            h_token_rows: if channel { gemm_rows } else { 0 },
            // MXFP4 weights: x gathered in bf16 (`a`), then quantised per group; h likewise.
            a_mx_rows: if mx { a_rows } else { 0 },
            h_mx_rows: if mx { gemm_rows } else { 0 },
            d2_cols: if mx { super::mx::mx_padded(s.hidden) } else { s.hidden },
            d1_rows: gemm_rows,
            h_rows: rows,
            d2_rows,
            groups: if layout { s.groups() } else { 0 },
            layout_rows,
            layout_tiles,
            layout_positions: if layout { positions } else { 0 },
            layout_scratch_ints: if layout { build_scratch_ints(positions, s.groups()) } else { 0 },
            workspace_bytes,
            routing_slots: if s.shared_groups > 0 { positions } else { 0 },
            // Per-channel FP8 on Batched: x's and h's per-tensor amax (whatever the activation scheme: the
            // sizing does not know it, and two words do not matter).
            amax_words: if channel && enabled.contains(Backend::Batched) { 2 } else { 0 },
            arrival_words: batched_rows * s.inter.div_ceil(128),
            eager: enabled.contains(Backend::Eager),
        };
        Ok(LayerSizing {
            shape,
            format,
            gemm,
            max_tokens,
            max_m,
            backends: enabled,
            expert_parallel,
            fused_tile,
            sm_count,
            passes,
            rows,
            needs,
            gemms,
            tuned,
        })
    }

    /// What the layer needs from a scratch.
    pub fn needs(&self) -> &ScratchNeeds {
        &self.needs
    }
    pub fn shape(&self) -> &LayerShape {
        &self.shape
    }
    /// How the layer's expert weights are stored.
    pub fn format(&self) -> WeightFormat {
        self.format
    }
    /// The grouped GEMM the layout backends run (the device's arch picks it: [`Self::for_device`]).
    pub fn gemm(&self) -> LayerGemm {
        self.gemm
    }
    pub fn backends(&self) -> Backends {
        self.backends
    }
    /// The tile a Fused pass of `tokens` tokens asks for: the fixed tile, else (16-bit weights) the tuned
    /// table's of the nearest bucket where it names one, else [`FusedTile::for_rows`]. (A pass whose padded
    /// layout would not fit the scratch rows runs fewer tokens or the 64-row tile.)
    pub fn fused_tile(&self, tokens: usize) -> FusedTile {
        fused_tile_for(self.fused_tile, self.tuned.as_ref(), self.format, tokens, &self.shape)
    }
    /// Tokens per pass of each enabled backend, as sized: the largest batch the plan expects to send it (under
    /// `Auto`, the largest Auto sends it). [`Self::tokens_per_pass`] says what a pass of it can hold.
    pub fn pass_tokens(&self) -> Vec<(Backend, usize)> {
        self.passes.iter().map(|p| (p.backend, p.tokens)).collect()
    }

    /// The most tokens `backend` runs in one pass within `rows` rows of scratch (at least 1 when it fits one
    /// token at all; 0 when it does not).
    /// The GEMM backends run at most their own pass's tokens: their GEMM plans and layout were sized for it.
    pub(crate) fn fitting_tokens(&self, backend: Backend, want: usize) -> usize {
        let s = &self.shape;
        let want = want.min(self.max_tokens);
        let own = self.passes.iter().find(|p| p.backend == backend).map_or(0, |p| p.tokens);
        let fits = |t: usize| -> bool {
            let st = t * s.slots();
            match backend {
                Backend::Batched => st <= BATCHED_MAX_ROWS.max(s.slots()) && st <= self.needs.h_rows,
                Backend::Grouped | Backend::Eager | Backend::Masked | Backend::Contiguous => t <= own,
                Backend::Fused => {
                    aligned_rows(st, s.groups(), FusedTile::M64N128K64.block_m()) <= self.rows
                        && st <= self.needs.d2_rows
                }
                Backend::Auto => false,
            }
        };
        // Every condition is monotone in t: the largest fitting t by bisection.
        let (mut lo, mut hi) = (0usize, want);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// [`LayerSizing`]'s options, in one value for its constructors.
#[derive(Clone, Copy, Debug)]
struct SizingOptions<'d> {
    max_tokens: usize,
    backend: Backend,
    backends: Option<Backends>,
    max_m: Option<usize>,
    fused_tile: Option<FusedTile>,
    expert_parallel: bool,
    sm_count: usize,
    tuned: Option<TunedBackends>,
    /// The device planned for (`None`: an SM90 device of `sm_count` SMs, unchecked).
    device: Option<&'d DeviceInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every GEMM plan reads at most the rows its pass's buffers hold. With Fused and Grouped enabled and no
    /// Masked, Fused's padded layout is the largest pass: GEMM plans sized by it overran Grouped's `a`.
    #[test]
    fn gemm_plans_read_no_more_rows_than_their_buffers_hold() {
        let deepseek = LayerShape {
            experts: 256,
            global_experts: 256,
            top_k: 8,
            shared_groups: 0,
            hidden: 7168,
            inter: 2048,
            gated: true,
        };
        let mixtral = LayerShape {
            experts: 8,
            global_experts: 8,
            top_k: 2,
            shared_groups: 0,
            hidden: 4096,
            inter: 14336,
            gated: true,
        };
        let sets = [
            Backends::of(Backend::Grouped).union(Backends::of(Backend::Fused)),
            Backends::of(Backend::Batched).union(Backends::of(Backend::Grouped)).union(Backends::of(Backend::Fused)),
            Backends::of(Backend::Grouped).union(Backends::of(Backend::Contiguous)),
            Backends::ALL,
        ];
        for shape in [deepseek, mixtral] {
            for t in [1usize, 8, 128, 4096] {
                for set in sets.iter().map(|&s| Some(s)).chain([None]) {
                    let s =
                        LayerSizing::new(shape, DType::BF16, t, Backend::Auto, set, None, None, false, 132).unwrap();
                    for g in &s.gemms {
                        // The largest pass the layer would run on this backend stays within the plan.
                        let fit = s.fitting_tokens(g.backend, t);
                        let rows = match g.backend {
                            Backend::Contiguous => {
                                aligned_rows(fit * shape.slots(), shape.groups(), CONTIGUOUS_BLOCK_M)
                            }
                            Backend::Masked if fit <= s.max_m => shape.groups() * s.max_m,
                            Backend::Masked => usize::MAX,
                            Backend::Eager => fit,
                            _ => fit * shape.slots(),
                        };
                        assert!(
                            fit >= 1 && rows <= g.max_rows,
                            "T = {t}, {set:?}, {:?}: a pass of {fit} tokens needs {rows} rows, the plan {}",
                            g.backend,
                            g.max_rows
                        );
                        let n = &s.needs;
                        let a = if g.second { n.h_rows } else { n.a_rows };
                        assert!(
                            g.max_rows <= a && g.max_rows <= n.d1_rows && g.max_rows <= n.d2_rows,
                            "T = {t}, {set:?}, {:?} (second {}): max_rows {} vs a {}, d1 {}, d2 {}",
                            g.backend,
                            g.second,
                            g.max_rows,
                            n.a_rows,
                            n.d1_rows,
                            n.d2_rows
                        );
                    }
                }
                let fp8 = Backends::FP8;
                let s = LayerSizing::new_fp8(shape, t, Backend::Auto, Some(fp8), None, false, 132).unwrap();
                for g in &s.gemms {
                    let rows = if g.second { s.needs.h_fp8_rows } else { s.needs.a_fp8_rows };
                    assert!(g.max_rows <= rows, "FP8 T = {t}: {:?} max_rows {} vs {rows}", g.backend, g.max_rows);
                }
            }
        }
    }
}
