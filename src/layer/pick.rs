//! What a batch runs, chosen on the host per pass: `Auto`'s backend (the tuned table's bucket, else the cost
//! model) and the Fused backend's tile (the fixed one, the tuned bucket's, else the rows-per-expert rule).

use crate::kernels::fused::FusedTile;
use crate::tuning::TunedBackends;

use super::arch::LayerGemm;
use super::backends::Backend;
use super::shape::LayerShape;
use super::sizing::BATCHED_MAX_ROWS;
use super::weights::WeightFormat;

/// Whether a tuned bucket's backend `b` can run `tokens` tokens of `shape` with `gemm`: not Eager (it
/// synchronises), one whose kernels run over the format on the GEMM's arch, Batched within its rows.
pub(crate) fn tuned_runs(shape: &LayerShape, gemm: LayerGemm, b: Backend, tokens: usize) -> bool {
    b != Backend::Eager
        && gemm.runnable().contains(b)
        && (b != Backend::Batched || tokens * shape.slots() <= BATCHED_MAX_ROWS.max(shape.slots()))
}

/// Auto's choice for `tokens` tokens of `shape` whose layout backends run `gemm`: the tuned bucket's backend
/// where it can run the batch, else [`super::auto_backend`] and, for FP8 weights, [`super::auto_backend_fp8`];
/// Grouped under expert parallelism, and where no cost model was fitted on the GEMM's arch (SM100).
pub(crate) fn auto_pick(
    shape: &LayerShape,
    gemm: LayerGemm,
    tokens: usize,
    expert_parallel: bool,
    tuned: Option<&TunedBackends>,
) -> Backend {
    if expert_parallel {
        return Backend::Grouped;
    }
    if let Some(b) = tuned.map(|t| t.pick(tokens)).filter(|&b| tuned_runs(shape, gemm, b, tokens)) {
        return b;
    }
    if !gemm.auto_cost_model_fits() {
        return Backend::Grouped;
    }
    if gemm.is_fp8() {
        return super::auto_backend_fp8(shape.groups(), shape.slots(), shape.hidden, shape.inter, tokens);
    }
    // Shared groups count as experts every token picks: k' = k + m of E + m.
    super::auto_backend(shape.groups(), shape.slots(), shape.hidden, shape.inter, tokens)
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
