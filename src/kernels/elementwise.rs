//! The layer's row-wise kernels in its own terms: the gated activation, the weighted combine with `b2`, and the
//! batched backend's whole decode layer. Each converts the layer's descriptors into `ffi`'s and launches.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::dtype::Element;
use crate::error::Result;
use crate::experts::{Activation, GateUp};
use crate::ffi;
use crate::quant::{Fp8BlockWeights, GroupQuant, ScaleRounding};

impl From<Activation> for ffi::Activation {
    fn from(a: Activation) -> Self {
        match a {
            Activation::SiluGated => ffi::Activation::SiluGated,
            Activation::GptOssSwiglu => ffi::Activation::GptOssSwiglu,
            Activation::Silu => ffi::Activation::Silu,
        }
    }
}

impl From<GateUp> for ffi::GateUp {
    fn from(g: GateUp) -> Self {
        match g {
            GateUp::Concatenated => ffi::GateUp::Concatenated,
            GateUp::Interleaved => ffi::GateUp::Interleaved,
        }
    }
}

/// Gated activation of the layer over `rows` rows of `d1`, each with its expert in `row_experts` (−1: none,
/// skipped), rows at or past `*total` skipped; `bias` f32 `[experts, 2I or I]`.
pub(crate) struct ActivationLaunch<'a> {
    pub act: Activation,
    pub gate_up: GateUp,
    pub inter: usize,
    pub rows: usize,
    pub total: Option<&'a CudaSlice<i32>>,
    pub row_experts: CudaView<'a, i32>,
    pub experts: usize,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Queues `h = act(d1 (+ bias))` for the rows of `d1 [rows, 2I or I]` that have an expert.
pub(crate) fn launch_activate<T: Element>(
    stream: &CudaStream,
    p: &ActivationLaunch<'_>,
    d1: &impl DevicePtr<T>,
    h: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let launch = ffi::elementwise::ActivationLaunch {
        act: p.act.into(),
        gate_up: p.gate_up.into(),
        inter: p.inter,
        rows: p.rows,
        total: p.total,
        row_experts: &p.row_experts,
        experts: p.experts,
        bias: p.bias,
    };
    ffi::elementwise::launch_activate(stream, &launch, d1, h, status)
}

/// Queues `y[t] = Σ_j w[t, j] · (d[positions[t·k + j]] + b2[expert])`; `bias` is (the expert of each row of
/// `d`, `b2` f32 `[experts, hidden]`, experts).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_combine<T: Element>(
    stream: &CudaStream,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    d: &impl DevicePtr<T>,
    ld_d: usize,
    positions: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    bias: Option<(&CudaView<'_, i32>, &CudaView<'_, f32>, usize)>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    ffi::layouts::launch_combine(stream, tokens, top_k, hidden, d, ld_d, positions, weights, bias, y)
}

/// The 16-bit experts the batched decode kernels read: `w13 [groups, 2I or I, H]` (gate and up rows as
/// `gate_up` orders them), `w2 [groups, H, I]`, biases f32 `[groups, 2I or I]` and `[groups, H]`.
pub(crate) struct DecodeExperts<'a, T> {
    pub activation: Activation,
    pub gate_up: GateUp,
    /// Every group the tensors hold (routed experts and shared-expert groups).
    pub groups: usize,
    pub hidden: usize,
    pub inter: usize,
    pub w13: &'a CudaSlice<T>,
    pub w2: &'a CudaSlice<T>,
    pub b13: Option<&'a CudaSlice<f32>>,
    pub b2: Option<&'a CudaSlice<f32>>,
}

/// The block-FP8 experts the batched FP8 decode kernels read: gate and up concatenated, `w13 [groups, 2I, H]`
/// and `w2 [groups, H, I]` with their scales, f32 biases, and how the kernels quantise x and h.
pub(crate) struct DecodeFp8Experts<'a> {
    pub activation: Activation,
    /// Every group the tensors hold (routed experts and shared-expert groups).
    pub groups: usize,
    pub hidden: usize,
    pub inter: usize,
    pub w13: &'a Fp8BlockWeights,
    pub w2: &'a Fp8BlockWeights,
    pub b13: Option<&'a CudaSlice<f32>>,
    pub b2: Option<&'a CudaSlice<f32>>,
    pub quant: GroupQuant,
}

/// Queues the two decode kernels of the batched backend: the whole layer of `w` for `tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_decode_layer<T: Element>(
    stream: &CudaStream,
    w: &DecodeExperts<'_, T>,
    tokens: usize,
    top_k: usize,
    x: &impl DevicePtr<T>,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    h: &mut CudaSlice<T>,
    y: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let layer = ffi::elementwise::DecodeWeights {
        act: w.activation.into(),
        gate_up: w.gate_up.into(),
        experts: w.groups,
        hidden: w.hidden,
        inter: w.inter,
        w13: w.w13,
        w2: w.w2,
        b13: w.b13,
        b2: w.b2,
    };
    ffi::elementwise::launch_decode_layer(stream, &layer, tokens, top_k, x, ids, weights, h, y, status)
}

/// Queues the two FP8 decode kernels of the batched backend over block-FP8 experts: x and h quantised as
/// `w.quant` says, inside the kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_decode_layer_fp8<T: Element>(
    stream: &CudaStream,
    w: &DecodeFp8Experts<'_>,
    tokens: usize,
    top_k: usize,
    x: &impl DevicePtr<T>,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    h: &mut CudaSlice<T>,
    y: &mut impl DevicePtrMut<T>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let q = w.quant;
    let layer = ffi::decode_fp8::DecodeFp8Weights {
        act: w.activation.into(),
        experts: w.groups,
        hidden: w.hidden,
        inter: w.inter,
        w13: w.w13.q(),
        w13_scales: w.w13.scales(),
        w2: w.w2.q(),
        w2_scales: w.w2.scales(),
        b13: w.b13,
        b2: w.b2,
        eps: q.eps(),
        ue8m0: q.rounding() == ScaleRounding::Ue8m0Ceil,
    };
    ffi::decode_fp8::launch_decode_layer_fp8(stream, &layer, tokens, top_k, x, ids, weights, h, y, status)
}

/// The routing of a layer with shared experts: which groups every token joins besides its routed ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedRouting {
    pub top_k: usize,
    /// Shared-expert groups (`I_s / I`).
    pub groups: usize,
    /// The id of the first shared group in the layout's id range (the router's experts: ids past them).
    pub first_id: usize,
}

/// Queues `ids' = [ids | first_id .. first_id + groups]` and `weights' = [weights | s_t …]` (`[tokens, k + m]`),
/// with `s_t = shared_weights[t]` or 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_extend_routing(
    stream: &CudaStream,
    r: &SharedRouting,
    tokens: usize,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    shared_weights: Option<&CudaView<'_, f32>>,
    ids_out: &mut impl DevicePtrMut<i32>,
    weights_out: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let desc = ffi::routing::SharedRoutingDesc { top_k: r.top_k, shared: r.groups, first_shared: r.first_id };
    ffi::routing::launch_extend_routing(stream, &desc, tokens, ids, weights, shared_weights, ids_out, weights_out)
}
