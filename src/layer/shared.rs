//! Shared experts in the layer: `y = Σ_j w[t,j] · expert_j(x) + s_t · shared(x)` (DeepSeek-V3, Kimi-K2: `s_t = 1`;
//! Qwen2-MoE: `s_t = sigmoid(x_t · shared_expert_gate)`, given by the caller).
//!
//! The weights hold the shared MLP as `m = I_s / I` more experts after the routed ones
//! ([`ExpertWeights::upload_with_shared`](super::ExpertWeights::upload_with_shared)). Per pass, one small kernel
//! writes the extended routing into the scratch: each token's k routed (id, weight) pairs, then the `m` shared
//! ids with weight `s_t`, `[T, k + m]`. Every backend then runs with `k' = k + m` slots over `E + m` groups,
//! unchanged: the layouts place the shared rows like routed ones, the GEMMs multiply them with the shared
//! groups' weights and the combine sums the `k + m` contributions in f32. The router's `routed_scaling_factor`
//! is already in the routed weights and never touches `s_t`.
//!
//! Ids: the shared groups take the ids right after the router's experts (`E_global + j`; `E + j` without
//! expert parallelism). With an expert map, the plan extends the map by `m` entries `E_global + j → E_local + j`,
//! so the layouts need no change.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::{LayerShape, LayerWeights, MoeLayer, MoeScratch, Routed};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::elementwise;
use crate::view::{MatrixView, MatrixViewMut};

/// The expert map of a layer with shared groups: `map`, then `E_global + j → E_local + j` for each group `j`.
pub(super) fn extended_map(map: &[i32], shape: &LayerShape) -> Vec<i32> {
    let shared = (0..shape.shared_groups).map(|j| (shape.experts + j) as i32);
    map.iter().copied().chain(shared).collect()
}

/// The scratch's extended-routing buffers, out of the scratch while the passes borrow the rest of it.
pub(super) struct TakenRouting {
    ids: Option<CudaSlice<i32>>,
    weights: Option<CudaSlice<f32>>,
}

impl TakenRouting {
    pub(super) fn take<T: Element>(scratch: &mut MoeScratch<T>) -> Self {
        TakenRouting { ids: scratch.ids.take(), weights: scratch.weights.take() }
    }
    pub(super) fn restore<T: Element>(self, scratch: &mut MoeScratch<T>) {
        scratch.ids = self.ids;
        scratch.weights = self.weights;
    }
}

impl<T: Element, W: LayerWeights<T>> MoeLayer<T, W> {
    /// As [`Self::forward`], for a layer with a shared expert whose weight differs per token (Qwen2-MoE:
    /// `s_t = sigmoid(x_t · shared_expert_gate)`, computed by the caller, e.g. as one more output column of its
    /// router GEMM): `y = Σ_j w[t,j] · expert_j(x) + shared_weights[t] · shared(x)`. [`Self::forward`] adds the
    /// shared expert with weight 1 (DeepSeek-V3, Kimi-K2).
    ///
    /// # Errors
    /// As [`Self::forward`]; [`Error::InvalidProblem`] if the layer's weights hold no shared expert;
    /// [`Error::Buffer`] unless `shared_weights` is `[T, 1]` with packed rows.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_shared_weights(
        &self,
        stream: &Arc<CudaStream>,
        scratch: &mut MoeScratch<T>,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        shared_weights: &MatrixView<'_, f32>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        let r = Routed { x, ids: topk_ids, weights: topk_weights, shared: Some(shared_weights) };
        self.forward_passes(stream, scratch, r, y)
    }

    /// The shared weights' view against `tokens` and the layer (host only, before any kernel).
    pub(super) fn validate_shared(&self, tokens: usize, shared: Option<&MatrixView<'_, f32>>) -> Result<()> {
        let Some(s) = shared else { return Ok(()) };
        if self.sizing.shape.shared_groups == 0 {
            return Err(Error::InvalidProblem(
                "shared_weights given, but the layer's weights hold no shared expert (upload them with \
                 ExpertWeights::upload_with_shared)"
                    .into(),
            ));
        }
        if s.rows() != tokens || s.cols() != 1 {
            return Err(Error::Buffer {
                name: "shared_weights",
                detail: format!("is [{}, {}], the layer needs [{tokens}, 1] (T = x's rows)", s.rows(), s.cols()),
            });
        }
        if s.stride() != 1 && tokens > 1 {
            return Err(Error::Buffer {
                name: "shared_weights",
                detail: format!("row stride {} != 1: the kernel reads one weight per token, packed", s.stride()),
            });
        }
        Ok(())
    }

    /// The routing a pass runs: `ids`, `weights` as given without shared experts; with them, `[T, k + m]` written
    /// into the scratch's routing buffers (one kernel).
    pub(super) fn pass_routing<'r>(
        &self,
        stream: &Arc<CudaStream>,
        routing: &'r mut TakenRouting,
        ids: MatrixView<'r, i32>,
        weights: MatrixView<'r, f32>,
        shared: Option<&MatrixView<'_, f32>>,
    ) -> Result<(MatrixView<'r, i32>, MatrixView<'r, f32>)> {
        let s = &self.sizing.shape;
        if s.shared_groups == 0 {
            return Ok((ids, weights));
        }
        let missing = || Error::InvalidProblem("scratch capacity: the scratch holds no shared-expert routing".into());
        let ids_out = routing.ids.as_mut().ok_or_else(missing)?;
        let weights_out = routing.weights.as_mut().ok_or_else(missing)?;
        let (tokens, slots) = (ids.rows(), s.slots());
        let n = tokens * slots;
        if ids_out.len() < n || weights_out.len() < n {
            return Err(Error::InvalidProblem(format!(
                "scratch capacity: shared-expert routing holds {} slots, the pass needs {n}",
                ids_out.len().min(weights_out.len())
            )));
        }
        let r =
            elementwise::SharedRoutingDesc { top_k: s.top_k, shared: s.shared_groups, first_shared: s.global_experts };
        let sv = shared.map(|v| v.as_view());
        elementwise::launch_extend_routing(
            stream,
            &r,
            tokens,
            &ids.as_view(),
            &weights.as_view(),
            sv.as_ref(),
            &mut ids_out.slice_mut(0..n),
            &mut weights_out.slice_mut(0..n),
        )?;
        let (ids_out, weights_out): (&'r CudaSlice<i32>, &'r CudaSlice<f32>) = (ids_out, weights_out);
        Ok((
            MatrixView::new("shared routing ids", ids_out.slice(0..n), tokens, slots)?,
            MatrixView::new("shared routing weights", weights_out.slice(0..n), tokens, slots)?,
        ))
    }
}
