//! Routers: router logits `[T, E]` (f32) → `topk_ids [T, k]` (int32) and `topk_weights [T, k]` (f32), on the
//! device, graph-safe, with a CPU reference ([`crate::reference::routing`]) for each.
//!
//! | [`RouterKind`] | models | computation |
//! |---|---|---|
//! | `Softmax { renormalize }` | Mixtral (`true`), Qwen3-MoE (`norm_topk_prob`) | `p = softmax(l)`; ids = top-k of `p`; `w = p[ids]`, `/ Σ` if renormalize |
//! | `TopKSoftmax` | gpt-oss | ids = top-k of `l`; `w = softmax(l[ids])` over the k only |
//! | `GroupedSigmoid { .. }` | DeepSeek-V3, Kimi-K2 | `s = sigmoid(l)`; `c = s + bias` (selection only); group score = sum of the top-2 `c` of each of `n_group` consecutive groups; keep `topk_group` groups; ids = top-k of `c` in them; `w = s[ids]`, `/ (Σ + 1e-20)` if renormalize, `× routed_scaling_factor` |
//!
//! Ties are broken towards the lowest expert id, everywhere (expert and group selection). Ids come out in
//! descending order of the selection score, and are always in `0..E`. Non-finite logits are a data error: they
//! set [`bits::NONFINITE_LOGITS`](crate::status::bits::NONFINITE_LOGITS); NaN and −∞ count as −∞ (never
//! preferred over a finite logit, probability and weight 0) and +∞ as f32::MAX. A token without a finite logit
//! still gets k ids in range — experts `0..k` by the tie rule for the softmax kinds, the best biases for
//! `GroupedSigmoid` (σ(−∞) = 0) — and weights 0, never NaN. For `GroupedSigmoid`, a NaN biased score (a NaN
//! correction bias) counts as −∞ as well, and so does a group whose scores are all −∞; a NaN bias sets no status
//! bit (it is a weight of the checkpoint, to be checked when loaded, not data of the step).
//! Weights are f32 for every family (Qwen3 and gpt-oss round them to bf16 in transformers; the layer multiplies
//! in f32, which differs from them by at most one bf16 rounding of the weight).

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView};

use crate::device::{DeviceInfo, KernelFamily};
use crate::error::{Error, Result};
use crate::status::DeviceStatus;
use crate::view::{MatrixView, MatrixViewMut, ViewShape};

/// The routing function of a model family. New families arrive as new variants: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterKind {
    /// Softmax over all experts, then top-k; optionally renormalise the k weights to sum to 1.
    Softmax { renormalize: bool },
    /// Top-k of the logits, then softmax over the k chosen (gpt-oss).
    TopKSoftmax,
    /// DeepSeek-V3 / Kimi-K2: sigmoid scores, a per-expert correction bias for selection only, group-limited
    /// top-k, weights from the unbiased scores.
    GroupedSigmoid { n_group: usize, topk_group: usize, renormalize: bool, routed_scaling_factor: f32 },
}

/// A validated router configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterConfig {
    experts: usize,
    top_k: usize,
    kind: RouterKind,
}

/// Most experts the router kernels handle (their per-warp shared memory holds one row of scores).
pub const MAX_EXPERTS: usize = 1024;

impl RouterConfig {
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: `1 <= top_k <= min(experts, 32)`, `experts <= 1024`; for
    /// `GroupedSigmoid`: `experts % n_group == 0`, `1 <= topk_group <= n_group <= 32`, groups of at least 2
    /// experts when `n_group > 1` (a group scores its top 2), `top_k <= topk_group · experts / n_group`
    /// (enough experts in the kept groups), and a finite scaling factor.
    pub fn new(experts: usize, top_k: usize, kind: RouterKind) -> Result<Self> {
        let bad = |s: String| Err(Error::InvalidProblem(s));
        if experts == 0 || experts > MAX_EXPERTS {
            return bad(format!("experts = {experts}: must be in 1..={MAX_EXPERTS}"));
        }
        if top_k == 0 || top_k > experts || top_k > 32 {
            return bad(format!("top_k = {top_k}: must be in 1..=min(experts, 32) (experts = {experts})"));
        }
        if let RouterKind::GroupedSigmoid { n_group, topk_group, routed_scaling_factor, .. } = kind {
            if n_group == 0 || n_group > 32 {
                return bad(format!("n_group = {n_group}: must be in 1..=32"));
            }
            if experts % n_group != 0 {
                return bad(format!("experts = {experts} is not a multiple of n_group = {n_group}"));
            }
            if topk_group == 0 || topk_group > n_group {
                return bad(format!("topk_group = {topk_group}: must be in 1..=n_group ({n_group})"));
            }
            let group = experts / n_group;
            if n_group > 1 && group < 2 {
                return bad(format!("groups of {group} expert: a group scores the sum of its top 2, needs >= 2"));
            }
            if top_k > topk_group * group {
                return bad(format!(
                    "top_k = {top_k} exceeds the {} experts of the topk_group = {topk_group} kept groups",
                    topk_group * group
                ));
            }
            if !routed_scaling_factor.is_finite() {
                return bad(format!("routed_scaling_factor = {routed_scaling_factor} is not finite"));
            }
        }
        Ok(RouterConfig { experts, top_k, kind })
    }

    /// Mixtral-8x7B: 8 experts, top-2, softmax, renormalised.
    pub fn mixtral() -> Self {
        Self::new(8, 2, RouterKind::Softmax { renormalize: true }).unwrap()
    }
    /// DeepSeek-V3: 256 experts, top-8, 8 groups keep 4, renormalised, scaled by 2.5.
    pub fn deepseek_v3() -> Self {
        let kind =
            RouterKind::GroupedSigmoid { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 };
        Self::new(256, 8, kind).unwrap()
    }

    pub fn experts(&self) -> usize {
        self.experts
    }
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    pub fn kind(&self) -> RouterKind {
        self.kind
    }
    /// Whether the router takes a per-expert correction bias.
    pub fn takes_bias(&self) -> bool {
        matches!(self.kind, RouterKind::GroupedSigmoid { .. })
    }

    /// The tokens of a launch over views of these shapes: `logits [T, E]`, `bias [E]` (its length; required by
    /// the grouped sigmoid router, refused by the others), `topk_ids` and `topk_weights [T, k]`, every view with
    /// packed rows (the kernel reads `T · E` and writes `T · k` adjacent elements). `T` is the logits' rows.
    /// What [`Router::launch`] checks before it queues anything; a pure function, so it is tested without a GPU.
    ///
    /// # Errors
    /// [`Error::Buffer`] naming the view and both shapes: a view whose rows are not the logits', logits whose
    /// columns are not the config's experts, ids or weights whose columns are not `top_k`, a bias whose length
    /// is not the experts (or a missing / unexpected bias), a view with a row stride.
    pub fn check_shapes(
        &self,
        logits: ViewShape,
        bias: Option<usize>,
        topk_ids: ViewShape,
        topk_weights: ViewShape,
    ) -> Result<usize> {
        let (e, k, t) = (self.experts, self.top_k, logits.rows);
        if logits.cols != e {
            return Err(Error::Buffer {
                name: "logits",
                detail: format!("is {logits}, the router needs [T, {e}] (E = the config's experts)"),
            });
        }
        for (name, v) in [("topk_ids", topk_ids), ("topk_weights", topk_weights)] {
            if v.rows != t || v.cols != k {
                return Err(Error::Buffer {
                    name,
                    detail: format!(
                        "is {v}, logits are {logits}: the router needs [{t}, {k}] (T = logits' rows, k = top_k)"
                    ),
                });
            }
        }
        for (name, v) in [("logits", logits), ("topk_ids", topk_ids), ("topk_weights", topk_weights)] {
            if !v.is_packed() {
                return Err(Error::Buffer {
                    name,
                    detail: format!(
                        "is {v}: the router kernel reads and writes packed rows (take a view of whole rows)"
                    ),
                });
            }
        }
        match (self.takes_bias(), bias) {
            (true, Some(n)) if n != e => Err(Error::Buffer {
                name: "bias",
                detail: format!("has {n} elements, logits are {logits}: e_score_correction_bias needs [{e}] (E)"),
            }),
            (true, None) => Err(Error::Buffer {
                name: "bias",
                detail: "the grouped sigmoid router (DeepSeek-V3) needs e_score_correction_bias [experts]".into(),
            }),
            (false, Some(_)) => {
                Err(Error::Buffer { name: "bias", detail: "this router takes no correction bias".into() })
            }
            _ => Ok(t),
        }
    }
}

impl RouterConfig {
    /// The router kernel's descriptor.
    fn to_ffi(self) -> crate::ffi::routing::RouterDesc {
        use crate::ffi::RouterKind as K;
        let (kind, n_group, topk_group, renormalize, scaling) = match self.kind {
            RouterKind::Softmax { renormalize } => (K::Softmax, 1, 1, renormalize, 1.0),
            RouterKind::TopKSoftmax => (K::TopKSoftmax, 1, 1, false, 1.0),
            RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, routed_scaling_factor } => {
                (K::GroupedSigmoid, n_group, topk_group, renormalize, routed_scaling_factor)
            }
        };
        crate::ffi::routing::RouterDesc {
            kind,
            experts: self.experts,
            top_k: self.top_k,
            n_group,
            topk_group,
            renormalize,
            scaling,
        }
    }
}

/// A router planned for a device.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
}

impl Router {
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the routers were built for the device of `stream` (SM90, SM100).
    pub fn new(stream: &Arc<CudaStream>, config: RouterConfig) -> Result<Self> {
        DeviceInfo::query(stream.context())?.require("router", KernelFamily::Routing)?;
        Ok(Router { config })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Routes `logits [T, E]` (f32) into `topk_ids [T, k]` and `topk_weights [T, k]`, `T` the views' rows.
    /// `bias [E]` (f32) is DeepSeek's `e_score_correction_bias`: required by the grouped sigmoid router and
    /// refused by the others. The views' shapes are checked before anything is queued
    /// ([`RouterConfig::check_shapes`]).
    ///
    /// # Errors
    /// [`Error::Buffer`] naming the view and both shapes ([`RouterConfig::check_shapes`]); launch errors.
    /// Non-finite logits are reported through `status`.
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        logits: &MatrixView<'_, f32>,
        bias: Option<&CudaView<'_, f32>>,
        topk_ids: &mut MatrixViewMut<'_, i32>,
        topk_weights: &mut MatrixViewMut<'_, f32>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let tokens =
            self.config.check_shapes(logits.shape(), bias.map(|b| b.len()), topk_ids.shape(), topk_weights.shape())?;
        let desc = self.config.to_ffi();
        crate::ffi::routing::launch_router(
            stream,
            &desc,
            tokens,
            &logits.as_view(),
            bias,
            &mut topk_ids.as_view_mut(),
            &mut topk_weights.as_view_mut(),
            status.word_mut(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_limits_agree_with_the_kernel() {
        assert_eq!(MAX_EXPERTS, crate::ffi::routing::MAX_EXPERTS);
        assert!(RouterConfig::new(64, crate::ffi::routing::MAX_TOP_K + 1, RouterKind::TopKSoftmax).is_err());
        let d = RouterConfig::deepseek_v3().to_ffi();
        assert_eq!(
            (d.kind, d.experts, d.top_k, d.n_group, d.topk_group),
            (crate::ffi::RouterKind::GroupedSigmoid, 256, 8, 8, 4)
        );
        assert!(d.renormalize && d.scaling == 2.5);
    }
}
