//! The routers (`cpp/moe_ops/routing.cu`): logits `[tokens, experts]` f32 → `topk_ids`, `topk_weights` `[tokens, k]`.

use cudarc::driver::{CudaStream, CudaView, DevicePtr, DevicePtrMut};

use super::bridge::ffi;
use super::status::{check, Launched};
use super::sys;
use super::{need_len, to_i32};
use crate::error::{Error, Result};

pub(crate) use sys::RouterKind;

/// Most experts the router kernel handles (one row of scores per warp in shared memory).
pub(crate) const MAX_EXPERTS: usize = 1024;
/// Most choices per token (one lane per choice).
pub(crate) const MAX_TOP_K: usize = 32;

/// A router (mirrors `RouterArgs` without its buffers). `n_group`, `topk_group` and `scaling` are read by the
/// grouped sigmoid router only, which alone takes a correction bias.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RouterDesc {
    pub kind: RouterKind,
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub scaling: f32,
}

/// Queues the router on `stream` for `tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_router(
    stream: &CudaStream,
    r: &RouterDesc,
    tokens: usize,
    logits: &impl DevicePtr<f32>,
    bias: Option<&CudaView<'_, f32>>,
    ids: &mut impl DevicePtrMut<i32>,
    weights: &mut impl DevicePtrMut<f32>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let (e, k) = (r.experts, r.top_k);
    if e == 0 || e > MAX_EXPERTS || k == 0 || k > e.min(MAX_TOP_K) {
        return Err(Error::InvalidProblem(format!(
            "router: experts = {e} must be in 1..={MAX_EXPERTS} and top_k = {k} in 1..=min(experts, {MAX_TOP_K})"
        )));
    }
    let grouped = r.kind == RouterKind::GroupedSigmoid;
    if grouped && !(1 <= r.topk_group && r.topk_group <= r.n_group && r.n_group <= e.min(32)) {
        return Err(Error::InvalidProblem(format!(
            "grouped sigmoid router: needs 1 <= topk_group ({}) <= n_group ({}) <= min(experts, 32)",
            r.topk_group, r.n_group
        )));
    }
    need_len("logits", logits.len(), tokens * e, "tokens x experts")?;
    need_len("topk_ids", ids.len(), tokens * k, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), tokens * k, "tokens x top_k")?;
    match (grouped, bias) {
        (true, Some(b)) => need_len("bias", b.len(), e, "experts")?,
        (true, None) => {
            return Err(Error::Buffer {
                name: "bias",
                detail: "the grouped sigmoid router (DeepSeek-V3) needs e_score_correction_bias [experts]".into(),
            })
        }
        (false, Some(_)) => {
            return Err(Error::Buffer { name: "bias", detail: "this router takes no correction bias".into() })
        }
        (false, None) => {}
    }
    let tokens = to_i32("tokens", tokens)?;
    let (n_group, topk_group) = (to_i32("n_group", r.n_group)?, to_i32("topk_group", r.topk_group)?);
    super::bind(stream)?;
    let (l_ptr, _l) = logits.device_ptr(stream);
    let (b_ptr, _b) = bias.map(|b| b.device_ptr(stream)).unzip();
    let (i_ptr, _i) = ids.device_ptr_mut(stream);
    let (w_ptr, _w) = weights.device_ptr_mut(stream);
    let (s_ptr, _s) = status.device_ptr_mut(stream);
    let args = sys::RouterArgs {
        kind: r.kind,
        tokens,
        experts: e as i32,
        top_k: k as i32,
        n_group,
        topk_group,
        renormalize: r.renormalize as i32,
        scaling: r.scaling,
        logits: l_ptr,
        bias: b_ptr.unwrap_or(0),
        ids: i_ptr,
        weights: w_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: logits hold tokens*E f32, ids/weights tokens*k, bias E where the kind reads it (checked above);
    // E <= 1024, k <= 32 and n_group <= 32 (checked), which the kernel's shared memory, lane-per-choice and
    // lane-per-group rely on. The stream's context is bound to this thread; the guards order every buffer on
    // `stream` and outlive the call that queues the kernel.
    check(unsafe { ffi::route(&args) }, &Launched::op("route"))
}

/// Routing extended by shared-expert groups (mirrors `SharedRoutingArgs` without its buffers): `top_k` routed
/// slots per token, then `shared` slots with the ids `first_shared ..`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedRoutingDesc {
    pub top_k: usize,
    pub shared: usize,
    pub first_shared: usize,
}

/// Queues `ids_out [tokens, top_k + shared]` and `weights_out` (likewise): each token's routed pairs, then the
/// shared ids with `shared_weights[t]` (f32 `[tokens]`) or 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_extend_routing(
    stream: &CudaStream,
    d: &SharedRoutingDesc,
    tokens: usize,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    shared_weights: Option<&CudaView<'_, f32>>,
    ids_out: &mut impl DevicePtrMut<i32>,
    weights_out: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    if d.top_k == 0 || d.shared == 0 {
        return Err(Error::InvalidProblem(format!(
            "shared routing: top_k = {} and shared groups = {} must be positive",
            d.top_k, d.shared
        )));
    }
    let slots = d.top_k + d.shared;
    let last_id = d.first_shared.checked_add(d.shared).filter(|&l| l <= i32::MAX as usize);
    if last_id.is_none() || tokens.checked_mul(slots).is_none_or(|n| n > i32::MAX as usize) {
        return Err(Error::InvalidProblem(format!(
            "shared routing: {tokens} tokens x {slots} slots and ids up to {} + {} exceed int32",
            d.first_shared, d.shared
        )));
    }
    need_len("topk_ids", ids.len(), tokens * d.top_k, "tokens x top_k")?;
    need_len("topk_weights", weights.len(), tokens * d.top_k, "tokens x top_k")?;
    if let Some(s) = shared_weights {
        need_len("shared_weights", s.len(), tokens, "tokens")?;
    }
    need_len("shared routing ids", ids_out.len(), tokens * slots, "tokens x (top_k + shared groups)")?;
    need_len("shared routing weights", weights_out.len(), tokens * slots, "tokens x (top_k + shared groups)")?;
    let tokens = to_i32("tokens", tokens)?;
    super::bind(stream)?;
    let (i_ptr, _i) = ids.device_ptr(stream);
    let (w_ptr, _w) = weights.device_ptr(stream);
    let (s_ptr, _s) = shared_weights.map(|s| s.device_ptr(stream)).unzip();
    let (io_ptr, _io) = ids_out.device_ptr_mut(stream);
    let (wo_ptr, _wo) = weights_out.device_ptr_mut(stream);
    let args = sys::SharedRoutingArgs {
        tokens,
        top_k: d.top_k as i32,
        shared: d.shared as i32,
        first_shared: d.first_shared as i32,
        ids: i_ptr,
        weights: w_ptr,
        shared_weights: s_ptr.unwrap_or(0),
        ids_out: io_ptr,
        weights_out: wo_ptr,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: ids and weights hold tokens*top_k, shared_weights tokens (when given), ids_out and weights_out
    // tokens*(top_k + shared) elements (checked above), and every index the kernel forms is below those counts
    // (tokens*(top_k + shared) and first_shared + shared fit int32, checked). Ids are copied, not used as indices.
    // The stream's context is bound to this thread; the guards order every buffer on `stream` and outlive the
    // call that queues the kernel.
    check(unsafe { ffi::extend_routing(&args) }, &Launched::op("extend_routing"))
}
