//! What a batch runs, chosen on the host per pass: `Auto`'s backend (the tuned table's bucket, else the cost
//! model) and the Fused backend's tile (the fixed one, the tuned bucket's, else the rows-per-expert rule).

use crate::kernels::fused::FusedTile;
use crate::tuning::TunedBackends;

use super::arch::LayerGemm;
use super::shape::LayerShape;
use super::sizing::LayerSizing;
use super::weights::WeightFormat;
use crate::backend::{Backend, Backends, BATCHED_MAX_ROWS};

/// Whether a tuned bucket's backend `b` can run `tokens` tokens of `shape` with `gemm`: not Eager (it
/// synchronises), one whose kernels run over the format on the GEMM's arch, Batched within its rows.
pub(crate) fn tuned_runs(shape: &LayerShape, gemm: LayerGemm, b: Backend, tokens: usize) -> bool {
    b != Backend::Eager
        && gemm.runnable().contains(b)
        && (b != Backend::Batched || tokens * shape.slots() <= BATCHED_MAX_ROWS.max(shape.slots()))
}

/// Auto's choice for `tokens` tokens of `shape` whose layout backends run `gemm`, among `set` only (the backends
/// the plan made room for: a backend outside it would fail every forward): the tuned bucket's backend where it is
/// in `set` and can run the batch, else [`super::auto_backend`] and, for FP8 weights, [`super::auto_backend_fp8`]
/// restricted to `set`; Grouped under expert parallelism, and where no cost model was fitted on the GEMM's arch
/// (SM100). Where the backend Auto prefers is not in `set`, it takes the nearest one that is ([`first_in`]).
pub(crate) fn auto_pick(
    shape: &LayerShape,
    gemm: LayerGemm,
    tokens: usize,
    expert_parallel: bool,
    tuned: Option<&TunedBackends>,
    set: Backends,
) -> Backend {
    if expert_parallel {
        return first_in(set, &GROUPED_FIRST);
    }
    if let Some(b) = tuned.map(|t| t.pick(tokens)).filter(|&b| set.contains(b) && tuned_runs(shape, gemm, b, tokens)) {
        return b;
    }
    if !gemm.auto_cost_model_fits() {
        return first_in(set, &GROUPED_FIRST);
    }
    // Shared groups count as experts every token picks: k' = k + m of E + m.
    let dims = (shape.groups(), shape.slots(), shape.hidden, shape.inter);
    if gemm.is_fp8() || gemm.is_fp8_channel() {
        fp8_cost_pick(set, dims, tokens)
    } else {
        dense_cost_pick(set, dims, tokens)
    }
}

/// Where a layer's `Auto` takes its choices from ([`MoeLayer::auto_source`](super::MoeLayer::auto_source)).
/// `Display` writes a line for a server's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoSource {
    /// A tuned table the caller gave ([`MoeLayerOptions::tuned`](super::MoeLayerOptions::tuned)).
    GivenTable,
    /// The table this crate ships for the layer's shape, weight format and GPU: its file under `configs/`.
    ShippedTable(&'static str),
    /// The cost model fitted to the H200 suite: no table for this GPU, shape and format (or the plan asked for
    /// the cost model alone).
    CostModel,
    /// Grouped, or the nearest planned backend: under expert parallelism, over weights whose only backends are
    /// the layout ones (MXFP4), or on an arch no cost model was measured on (SM100).
    GroupedOnly,
}

impl std::fmt::Display for AutoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AutoSource::GivenTable => f.write_str("Auto from the tuned table given"),
            AutoSource::ShippedTable(file) => write!(f, "Auto from the shipped table {file}"),
            AutoSource::CostModel => {
                f.write_str("Auto from the cost model (no table shipped for this GPU, shape and weight format)")
            }
            AutoSource::GroupedOnly => {
                f.write_str("Auto runs Grouped (no cost model for this layer's weights, arch or expert map)")
            }
        }
    }
}

/// Where `Auto` takes its choices from for a layer so sized, in the order [`auto_pick`] consults them.
pub(crate) fn auto_source(sizing: &LayerSizing) -> AutoSource {
    if sizing.expert_parallel {
        return AutoSource::GroupedOnly;
    }
    match &sizing.tuned {
        Some(t) => t.shipped_file().map_or(AutoSource::GivenTable, AutoSource::ShippedTable),
        None if sizing.gemm.auto_cost_model_fits() => AutoSource::CostModel,
        None => AutoSource::GroupedOnly,
    }
}

/// The layout backends in the order Auto substitutes them when the one it prefers has no room: the other
/// persistent-tile backend first, then the padded layouts.
const FUSED_FIRST: [Backend; 4] = [Backend::Fused, Backend::Grouped, Backend::Contiguous, Backend::Masked];
const GROUPED_FIRST: [Backend; 4] = [Backend::Grouped, Backend::Fused, Backend::Contiguous, Backend::Masked];

/// The first of `order` that `set` holds; else any backend of `set` but Eager (it synchronises); else Eager.
pub(crate) fn first_in(set: Backends, order: &[Backend]) -> Backend {
    order
        .iter()
        .copied()
        .find(|&b| set.contains(b))
        .or_else(|| set.iter().find(|&b| b != Backend::Eager))
        .or_else(|| set.iter().next())
        .unwrap_or(Backend::Grouped)
}

/// Experts a batch of `tokens` tokens activates under uniform top-`top_k` routing over `experts`.
fn active_experts(experts: usize, top_k: usize, tokens: usize) -> f64 {
    let (e, k) = (experts as f64, top_k as f64);
    e * (1.0 - (1.0 - k / e).powf(tokens as f64))
}

/// Layout backends' streaming rate: lower with few active experts (fewer SMs busy per expert).
fn layout_bandwidth(active: f64) -> f64 {
    if active < 16.0 {
        3.3e12
    } else {
        4.16e12
    }
}

/// The cost model's constants for one weight format: bytes per weight, Batched's streaming rate and fixed cost,
/// the share of a repeated expert's bytes Batched reads again (1: every (token, slot) row streams its expert; the
/// FP8 decode kernels run a tile's rows side by side, so a row whose expert another row has read finds about half
/// of it in L2), the layout backends' fixed cost (their rate is [`layout_bandwidth`]).
struct Costs {
    weight_bytes: f64,
    batched_bw: f64,
    batched_us: f64,
    repeat_share: f64,
    layout_us: f64,
}

const DENSE_COSTS: Costs =
    Costs { weight_bytes: 2.0, batched_bw: 4.05e12, batched_us: 12.0, repeat_share: 1.0, layout_us: 50.0 };
const FP8_COSTS: Costs =
    Costs { weight_bytes: 1.0, batched_bw: 3.3e12, batched_us: 18.0, repeat_share: 0.5, layout_us: 44.0 };

/// Whether `set` holds Batched, the batch fits it, and it streams cheaper than the layout backends; with the
/// batch's (token, slot) rows and active experts.
fn batched_wins(c: &Costs, set: Backends, s: (usize, usize, usize, usize), tokens: usize) -> (bool, f64, f64) {
    let (experts, top_k, hidden, inter) = s;
    let rows = (tokens * top_k) as f64;
    let active = active_experts(experts, top_k, tokens);
    let expert_bytes = 3.0 * (hidden * inter) as f64 * c.weight_bytes;
    let streamed = active + c.repeat_share * (rows - active).max(0.0);
    let batched_us = streamed * expert_bytes / c.batched_bw * 1e6 + c.batched_us;
    let layout_us = active * expert_bytes / layout_bandwidth(active) * 1e6 + c.layout_us;
    let wins = set.contains(Backend::Batched) && tokens * top_k <= BATCHED_MAX_ROWS && batched_us <= layout_us;
    (wins, rows, active)
}

/// [`super::auto_backend`] among `set` for a layer of `(experts, top_k, hidden, inter)` (its docs give the costs).
pub(crate) fn dense_cost_pick(set: Backends, dims: (usize, usize, usize, usize), tokens: usize) -> Backend {
    let (experts, _, _, inter) = dims;
    let (batched, rows, active) = batched_wins(&DENSE_COSTS, set, dims, tokens);
    if batched {
        return Backend::Batched;
    }
    let fused = rows / active.max(1.0) <= 48.0 && (rows <= 64.0 || inter <= 1024 || experts <= 16);
    first_in(set, if fused { &FUSED_FIRST } else { &GROUPED_FIRST })
}

/// [`super::auto_backend_fp8`] among `set` for a layer of `(experts, top_k, hidden, inter)` (its docs give the
/// costs).
pub(crate) fn fp8_cost_pick(set: Backends, dims: (usize, usize, usize, usize), tokens: usize) -> Backend {
    if batched_wins(&FP8_COSTS, set, dims, tokens).0 {
        return Backend::Batched;
    }
    first_in(set, &GROUPED_FIRST)
}

/// The Fused tile of a pass of `tokens` tokens: the layer's fixed tile; else, over 16-bit weights, the tuned
/// table's for the nearest bucket (where it names one); else [`FusedTile::for_rows`] (FP8:
/// [`FusedTile::for_rows_fp8`]).
pub(crate) fn fused_tile_for(
    fixed: Option<FusedTile>,
    tuned: Option<&TunedBackends>,
    format: WeightFormat,
    tokens: usize,
    shape: &LayerShape,
) -> FusedTile {
    let (rows, groups) = (tokens * shape.slots(), shape.groups());
    let dense = format == WeightFormat::Dense;
    fixed.or_else(|| tuned.filter(|_| dense).and_then(|t| t.fused_tile(tokens))).unwrap_or_else(|| {
        if dense {
            FusedTile::for_rows(rows, groups)
        } else {
            FusedTile::for_rows_fp8(rows, groups)
        }
    })
}
