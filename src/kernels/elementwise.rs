//! The layer's row-wise kernels in its own terms: the gated activation, the weighted combine with `b2`, and the
//! batched backend's whole decode layer: the layer's enums converted to `ffi`'s, and the plain descriptors `ffi`
//! launches re-exported as they are.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::dtype::Element;
use crate::error::Result;
use crate::experts::{Activation, GateUp};
use crate::ffi;

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

/// The combine: `y[t] = Σ_j w[t, j] · (d[positions[t·k + j]] + b2[expert])` (its operands are plain buffers).
pub(crate) use crate::ffi::layouts::launch_combine;

/// The batched backend's decode kernels (16-bit and block-FP8 experts) and the shared-expert routing take plain
/// descriptors of buffers and sizes; the layer fills them (its enums converted above) and launches them as they are.
pub(crate) use crate::ffi::decode_fp8::{launch_decode_layer_fp8, DecodeFp8Weights};
pub(crate) use crate::ffi::elementwise::{launch_decode_layer, DecodeWeights};
pub(crate) use crate::ffi::routing::{launch_extend_routing, SharedRoutingDesc};
