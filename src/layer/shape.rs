//! [`LayerShape`]: one MoE layer's extents as the kernels see them, and the bytes its experts take per format.

use crate::dtype::DType;
use crate::quant::scale_blocks;

use super::weights::WeightFormat;

/// The shape of one MoE layer as the kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerShape {
    /// Experts whose weights this layer holds (local experts under expert parallelism).
    pub experts: usize,
    /// The range of the router's ids (`experts` without expert parallelism).
    pub global_experts: usize,
    pub top_k: usize,
    /// Shared-expert groups every token joins, with the shared weight `s_t` (each `inter` wide: a shared
    /// expert of intermediate size `I_s` is `I_s / inter` groups; 0 without one).
    pub shared_groups: usize,
    pub hidden: usize,
    pub inter: usize,
    /// Gated activation: `w13` has `2·inter` rows per expert.
    pub gated: bool,
}

impl LayerShape {
    /// Rows per token in the layout: the routed slots plus the shared groups.
    pub const fn slots(&self) -> usize {
        self.top_k + self.shared_groups
    }
    /// GEMM groups: the local experts plus the shared groups.
    pub const fn groups(&self) -> usize {
        self.experts + self.shared_groups
    }
    /// The range of the layout's ids: the router's experts, then the shared groups (ids `global_experts ..`).
    pub const fn layout_experts(&self) -> usize {
        self.global_experts + self.shared_groups
    }
    /// `w13` rows per expert: `2·inter` gated, `inter` otherwise.
    pub const fn w13_rows(&self) -> usize {
        if self.gated {
            2 * self.inter
        } else {
            self.inter
        }
    }
    /// Bytes of one expert's `w13` and `w2` in `dtype`.
    pub const fn expert_bytes(&self, dtype: DType) -> usize {
        (self.w13_rows() + self.inter) * self.hidden * dtype.size_bytes()
    }
    /// Bytes of one expert's `w13` and `w2` as block FP8: one byte per e4m3 element and an f32 scale per
    /// 128 x 128 block of each (edge blocks counted whole).
    pub const fn fp8_expert_bytes(&self) -> usize {
        let (r13, h, i) = (self.w13_rows(), self.hidden, self.inter);
        (r13 + i) * h + 4 * (scale_blocks(r13) * scale_blocks(h) + scale_blocks(h) * scale_blocks(i))
    }
    /// Bytes of one expert's `w13` and `w2` as MXFP4 for the block-scaled GEMMs: half a byte per e2m1 element
    /// of the padded extents (`[2I, K1]`, `[N2, K2]`) and their UE8M0 scales in 128 x 4 atoms.
    pub const fn mxfp4_expert_bytes(&self) -> usize {
        const fn pad(v: usize) -> usize {
            v.div_ceil(128) * 128
        }
        const fn part(n: usize, k: usize) -> usize {
            n * k / 2 + 512 * n.div_ceil(128) * k.div_ceil(128)
        }
        let (r13, h, i) = (self.w13_rows(), pad(self.hidden), pad(self.inter));
        part(r13, h) + part(h, i)
    }
    /// Bytes of one expert's weights stored as `format` (element type `dtype` for dense weights).
    pub const fn weight_bytes(&self, format: WeightFormat, dtype: DType) -> usize {
        match format {
            WeightFormat::Fp8Block => self.fp8_expert_bytes(),
            WeightFormat::Mxfp4 => self.mxfp4_expert_bytes(),
            _ => self.expert_bytes(dtype),
        }
    }
}
