//! Expert weights on the host, in the vocabulary every floor above shares: the format of a set of experts
//! ([`ExpertFormat`]: [`GateUp`], [`Activation`], [`Storage`]) and the packed, validated tensors of each kind of
//! weights that checkpoints produce and layers upload: 16-bit ([`PackedExperts`], the dense [`SharedExpert`]),
//! block FP8 ([`PackedFp8Experts`], [`SharedFp8Expert`]), per-tensor and per-channel FP8
//! ([`Fp8ChannelExperts`]) and MXFP4 ([`GptOssMxfp4Experts`]).
//!
//! This module names nothing above `quant`: checkpoints, kernels, tuning and the layer all build on it.

mod format;
mod fp8;
mod fp8_channel;
mod mxfp4;
mod packed;

pub(crate) use format::{check_lengths, transpose_experts, ExpertDims};
pub use format::{Activation, ExpertFormat, GateUp, Storage};
pub(crate) use fp8::activation_quant;
pub use fp8::{PackedFp8Experts, SharedFp8Expert};
pub use fp8_channel::{Fp8ChannelExperts, StaticInputScales, CHANNEL_ACT_EPS};
pub use mxfp4::GptOssMxfp4Experts;
pub(crate) use packed::shared_groups_beside;
pub use packed::{PackedExperts, SharedExpert};
