//! A block-FP8 shared expert (DeepSeek-V3, Kimi-K2 ship it in e4m3 with 128 x 128 `weight_scale_inv` like the
//! routed experts), read from a checkpoint into a [`SharedFp8Expert`], which appends it to packed FP8 experts as
//! `m = I_s / I` groups of the routed width ([`crate::experts::PackedFp8Experts::with_shared_groups`]).

use super::fp8::Fp8Config;
use super::{bad, Checkpoint, SharedNaming};
use crate::error::Result;
use crate::experts::SharedFp8Expert;

impl Checkpoint {
    /// Reads the block-FP8 shared expert of the MoE block under `prefix` (`model.layers.L.mlp`), named as
    /// `naming` does, each matrix with its `weight_scale_inv` (as [`Checkpoint::fp8_block_weight`]). Qwen2-MoE's
    /// per-token gate (`shared_expert_gate`) is not part of it: the caller computes `s_t` and passes it to
    /// [`MoeLayer::forward_with_shared_weights`](crate::MoeLayer::forward_with_shared_weights).
    ///
    /// # Errors
    /// [`crate::Error::Checkpoint`] naming the tensor: as [`Checkpoint::fp8_block_weight`], or shapes that do not fit.
    pub fn pack_fp8_shared_expert(
        &self,
        prefix: &str,
        naming: SharedNaming,
        config: &Fp8Config,
    ) -> Result<SharedFp8Expert> {
        let [g, u, d] = naming.names(prefix);
        let (gate, up, down) = (
            self.fp8_block_weight(&g, config)?,
            self.fp8_block_weight(&u, config)?,
            self.fp8_block_weight(&d, config)?,
        );
        SharedFp8Expert::new(gate, up, down).map_err(|e| bad(&g, e.to_string())).map_err(self.located(&g))
    }
}
