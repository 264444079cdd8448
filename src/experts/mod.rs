//! Expert weights on the host, in the vocabulary every floor above shares: the format of a set of experts
//! ([`ExpertFormat`]: [`GateUp`], [`Activation`], [`Storage`]) and the packed, validated tensors of each kind of
//! weights ([`PackedExperts`], the dense [`SharedExpert`]) that checkpoints produce, kernels are told about and
//! layers upload.
//!
//! This module names nothing above `quant`: checkpoints, kernels, tuning and the layer all build on it.

mod format;
mod packed;

pub(crate) use format::{check_lengths, transpose_experts};
pub use format::{Activation, ExpertFormat, GateUp, Storage};
pub(crate) use packed::shared_groups_beside;
pub use packed::{PackedExperts, SharedExpert};
