//! A block-FP8 shared expert (DeepSeek-V3, Kimi-K2 ship it in e4m3 with 128 x 128 `weight_scale_inv` like the
//! routed experts): read from a checkpoint, and appended to packed FP8 experts as `m = I_s / I` groups of the
//! routed width, the FP8 form of what `ExpertWeights::upload_with_shared` does for dense weights.
//!
//! Group `j` is gate rows `j·I .. (j+1)·I` stacked on the same up rows (its w13 `[2I, H]`) and down columns
//! `j·I .. (j+1)·I` (its w2 `[H, I]`). With `I` a multiple of the block, every group keeps the checkpoint's own
//! scale blocks: nothing is requantised. The layer then sums the groups' GEMM2 outputs (each rounded to bf16)
//! where the full-width MLP would round once, and quantises the activation per 128 columns of each group, which
//! are the full-width MLP's own 128-column groups.

use super::fp8::Fp8Config;
use super::{bad, Checkpoint, PackedFp8Experts, SharedNaming};
use crate::error::{Error, Result};
use crate::quant::BlockFp8;

/// The shared expert's three block-FP8 matrices: `gate_proj` and `up_proj` `[I_s, H]`, `down_proj` `[H, I_s]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedFp8Expert {
    gate: BlockFp8,
    up: BlockFp8,
    down: BlockFp8,
}

impl SharedFp8Expert {
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: `up` not `gate`'s shape, `down` not its transpose's, or
    /// blocks / scale formats that differ.
    pub fn new(gate: BlockFp8, up: BlockFp8, down: BlockFp8) -> Result<SharedFp8Expert> {
        let (i, h) = (gate.rows(), gate.cols());
        let shape = |w: &BlockFp8| (w.rows(), w.cols());
        if shape(&up) != (i, h) || shape(&down) != (h, i) {
            return Err(Error::InvalidProblem(format!(
                "shared FP8 expert: gate [{i}, {h}], up [{}, {}], down [{}, {}]: up must be [I_s, H] like gate and \
                 down [H, I_s]",
                up.rows(),
                up.cols(),
                down.rows(),
                down.cols()
            )));
        }
        let same = |w: &BlockFp8| w.block() == gate.block() && w.scales().format() == gate.scales().format();
        if !same(&up) || !same(&down) {
            return Err(Error::InvalidProblem(
                "shared FP8 expert: gate, up and down must share one block shape and scale format".into(),
            ));
        }
        Ok(SharedFp8Expert { gate, up, down })
    }

    pub fn hidden(&self) -> usize {
        self.gate.cols()
    }
    /// `gate_proj` `[I_s, H]`.
    pub fn gate(&self) -> &BlockFp8 {
        &self.gate
    }
    /// `up_proj` `[I_s, H]`.
    pub fn up(&self) -> &BlockFp8 {
        &self.up
    }
    /// `down_proj` `[H, I_s]`.
    pub fn down(&self) -> &BlockFp8 {
        &self.down
    }
    /// `I_s`.
    pub fn inter(&self) -> usize {
        self.gate.rows()
    }

    /// The groups of routed width `inter` it splits into: `I_s / inter`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] unless `inter` divides `I_s` and is a multiple of the block rows and columns
    /// (a group must start on a scale block).
    pub fn groups(&self, inter: usize) -> Result<usize> {
        let b = self.gate.block();
        if inter == 0 || self.inter() % inter != 0 || inter % b.rows != 0 || inter % b.cols != 0 {
            return Err(Error::InvalidProblem(format!(
                "shared FP8 expert: I_s = {} in groups of the routed I = {inter}: I must divide I_s and be a \
                 multiple of the {} x {} scale blocks, so that every group keeps its own blocks",
                self.inter(),
                b.rows,
                b.cols
            )));
        }
        Ok(self.inter() / inter)
    }

    /// Group `j` of width `inter`: (w13 `[2·inter, H]` = gate rows on up rows, w2 `[H, inter]`).
    ///
    /// # Errors
    /// As [`Self::groups`]; `j` past the last group.
    pub fn group(&self, inter: usize, j: usize) -> Result<(BlockFp8, BlockFp8)> {
        let m = self.groups(inter)?;
        if j >= m {
            return Err(Error::InvalidProblem(format!("shared FP8 expert: group {j} of {m}")));
        }
        let (r0, r1) = (j * inter, (j + 1) * inter);
        let w13 = self.gate.slice_rows(r0, r1)?.stack_rows(&self.up.slice_rows(r0, r1)?)?;
        Ok((w13, self.down.slice_cols(r0, r1)?))
    }
}

impl PackedFp8Experts {
    /// These experts with `shared`'s `m = I_s / I` groups appended as experts `E .. E + m`, and `m`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: a hidden size, block or scale format other than the
    /// routed experts', or `I_s` not in whole groups ([`SharedFp8Expert::groups`]).
    pub fn with_shared_groups(&self, shared: &SharedFp8Expert) -> Result<(PackedFp8Experts, usize)> {
        if shared.hidden() != self.hidden()
            || shared.gate.block() != self.block()
            || shared.gate.scales().format() != self.scale_format()
        {
            return Err(Error::InvalidProblem(format!(
                "shared FP8 expert: H = {} in {:?} blocks with {:?} scales beside routed experts of H = {} in {:?} \
                 blocks with {:?} scales: all three must agree",
                shared.hidden(),
                shared.gate.block(),
                shared.gate.scales().format(),
                self.hidden(),
                self.block(),
                self.scale_format()
            )));
        }
        let m = shared.groups(self.inter())?;
        let mut per: Vec<(BlockFp8, BlockFp8)> = (0..self.experts()).map(|e| self.expert(e)).collect::<Result<_>>()?;
        for j in 0..m {
            per.push(shared.group(self.inter(), j)?);
        }
        let all = PackedFp8Experts::from_experts(per)?.with_activation_eps(self.activation_quant().eps())?;
        Ok((all, m))
    }
}

impl Checkpoint {
    /// Reads the block-FP8 shared expert of the MoE block under `prefix` (`model.layers.L.mlp`), named as
    /// `naming` does, each matrix with its `weight_scale_inv` (as [`Checkpoint::fp8_block_weight`]). Qwen2-MoE's
    /// per-token gate (`shared_expert_gate`) is not part of it: the caller computes `s_t` and passes it to
    /// [`MoeLayer::forward_with_shared_weights`](crate::MoeLayer::forward_with_shared_weights).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: as [`Checkpoint::fp8_block_weight`], or shapes that do not fit.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{BlockShape, ScaleFormat};

    fn block(rows: usize, cols: usize, seed: u32) -> BlockFp8 {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                // Each 128 x 128 block at its own scale, so a group reading another's blocks is seen.
                let s = 1.0 + ((r / 128) * 7 + (c / 128) * 3 + seed as usize) as f32 % 5.0;
                s * (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0 - 0.5)
            })
            .collect();
        BlockFp8::quantize(&w, rows, cols, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap()
    }

    #[test]
    fn groups_keep_the_checkpoints_blocks() {
        let (h, is, i) = (256usize, 512usize, 128usize);
        let s = SharedFp8Expert::new(block(is, h, 1), block(is, h, 2), block(h, is, 3)).unwrap();
        assert_eq!(s.groups(i).unwrap(), 4);
        let (gate, up, down) = (s.gate.dequantize(), s.up.dequantize(), s.down.dequantize());
        for j in 0..4 {
            let (w13, w2) = s.group(i, j).unwrap();
            assert_eq!((w13.rows(), w13.cols(), w2.rows(), w2.cols()), (2 * i, h, h, i));
            let (a, b) = (w13.dequantize(), w2.dequantize());
            for r in 0..i {
                for c in 0..h {
                    assert_eq!(a[r * h + c], gate[(j * i + r) * h + c], "gate j {j} r {r}");
                    assert_eq!(a[(i + r) * h + c], up[(j * i + r) * h + c], "up j {j} r {r}");
                    assert_eq!(b[c * i + r], down[c * is + j * i + r], "down j {j} c {c}");
                }
            }
        }
    }

    #[test]
    fn bad_shapes_and_widths_name_the_constraint() {
        let (h, is) = (256usize, 384usize);
        let m = SharedFp8Expert::new(block(is, h, 1), block(is, h, 2), block(is, h, 3)).unwrap_err().to_string();
        assert!(m.contains("down [H, I_s]"), "{m}");
        let s = SharedFp8Expert::new(block(is, h, 1), block(is, h, 2), block(h, is, 3)).unwrap();
        assert_eq!(s.groups(128).unwrap(), 3);
        let m = s.groups(256).unwrap_err().to_string();
        assert!(m.contains("I_s = 384") && m.contains("I = 256"), "{m}");
        let m = s.groups(192).unwrap_err().to_string();
        assert!(m.contains("128 x 128"), "{m}");
        assert!(s.group(128, 3).unwrap_err().to_string().contains("group 3 of 3"));
        let routed = PackedFp8Experts::from_experts(vec![(block(256, 512, 4), block(512, 128, 5))]).unwrap();
        let m = routed.with_shared_groups(&s).unwrap_err().to_string();
        assert!(m.contains("H = 256") && m.contains("H = 512"), "{m}");
    }

    #[test]
    fn appended_groups_follow_the_routed_experts() {
        let (h, i) = (256usize, 128usize);
        let routed =
            PackedFp8Experts::from_experts((0..3).map(|e| (block(2 * i, h, 10 + e), block(h, i, 20 + e))).collect())
                .unwrap();
        let s = SharedFp8Expert::new(block(2 * i, h, 1), block(2 * i, h, 2), block(h, 2 * i, 3)).unwrap();
        let (all, m) = routed.with_shared_groups(&s).unwrap();
        assert_eq!((m, all.experts()), (2, 5));
        for e in 0..3 {
            assert_eq!(all.expert(e).unwrap(), routed.expert(e).unwrap());
        }
        for j in 0..2 {
            assert_eq!(all.expert(3 + j).unwrap(), s.group(i, j).unwrap());
        }
    }
}
