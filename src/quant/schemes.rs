//! The scale schemes of FP8 operands, as checkpoints declare them
//! ([`crate::checkpoint::Fp8Scheme`] reads them from `config.json`).

use super::BlockShape;

/// How a checkpoint scales its FP8 weights (`[N, K]`, N output channels). New schemes arrive as new variants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightScales {
    /// One scale per `rows x cols` block (DeepSeek-V3's 128 x 128).
    Block(BlockShape),
    /// One scale per output channel (row).
    Channel,
    /// One scale per weight tensor.
    Tensor,
}

/// How a checkpoint's activations are scaled when they are quantised to FP8. New schemes arrive as new variants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationScales {
    /// Per token per `cols` columns, computed at run time.
    DynamicGroup { cols: usize },
    /// Per token, computed at run time.
    DynamicToken,
    /// One per tensor, computed at run time.
    DynamicTensor,
    /// One per tensor, fixed by the checkpoint (`input_scale` beside each weight).
    StaticTensor,
}
