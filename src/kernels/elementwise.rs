//! The layer's row-wise kernels in its own terms: the gated activation, the weighted combine with `b2`, and the
//! batched backend's whole decode layer: the layer's enums converted to `ffi`'s, and the plain descriptors `ffi`
//! launches re-exported as they are.

use crate::experts::{Activation, GateUp};
use crate::ffi;

variants_into!(Activation => ffi::Activation { SiluGated, GptOssSwiglu, Silu });

variants_into!(GateUp => ffi::GateUp { Concatenated, Interleaved });

/// The gated activation over the rows of a layout (`ffi`'s descriptor, filled by the layer).
pub(crate) use crate::ffi::elementwise::{launch_activate, ActivationLaunch};

/// The combine: `y[t] = Σ_j w[t, j] · (d[positions[t·k + j]] + b2[expert])` (its operands are plain buffers).
pub(crate) use crate::ffi::layouts::launch_combine;

/// The batched backend's decode kernels (16-bit and block-FP8 experts) and the shared-expert routing take plain
/// descriptors of buffers and sizes; the layer fills them (its enums converted above) and launches them as they are.
pub(crate) use crate::ffi::decode_fp8::{
    launch_decode_layer_fp8, ChannelActScale, DecodeFp8Scratch, DecodeFp8Weights, DecodeScales, DynamicScale,
};
pub(crate) use crate::ffi::elementwise::{launch_decode_layer, DecodeWeights};
pub(crate) use crate::ffi::routing::{launch_extend_routing, SharedRoutingDesc};
