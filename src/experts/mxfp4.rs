//! gpt-oss's MXFP4 experts on the host ([`GptOssMxfp4Experts`]): one layer's e2m1 weights with UE8M0 scales per
//! 32, as [`crate::checkpoint::Checkpoint::pack_gpt_oss_mxfp4`] reads them, and their exact dequantisation into
//! gpt-oss's bf16 [`PackedExperts`] (transposed, [`Storage::InOut`](super::Storage::InOut), as its bf16 checkpoint
//! stores them).

use super::{Activation, ExpertDims, ExpertFormat, GateUp, PackedExperts};
use crate::dtype::Element;
use crate::error::Result;
use crate::quant::Mxfp4;

/// One layer's gpt-oss experts in MXFP4: `gate_up` is `[E · 2I, H]` (rows interleaved gate/up per expert),
/// `down` `[E · H, I]`, both `[out, in]`; the biases in f32, `[E, 2I]` (interleaved) and `[E, H]`.
#[derive(Clone, Debug, PartialEq)]
pub struct GptOssMxfp4Experts {
    /// Interleaved gate/up, gpt-oss's clamped SwiGLU.
    pub(crate) dims: ExpertDims,
    pub(crate) gate_up: Mxfp4,
    pub(crate) down: Mxfp4,
    pub(crate) gate_up_bias: Vec<f32>,
    pub(crate) down_bias: Vec<f32>,
}

impl GptOssMxfp4Experts {
    /// gpt-oss's format for experts of `(E, H, I)`.
    pub(crate) const fn dims((experts, hidden, inter): (usize, usize, usize)) -> ExpertDims {
        ExpertDims::new((experts, hidden, inter), GateUp::Interleaved, Activation::GptOssSwiglu)
    }

    getters!(in dims; experts: usize, hidden: usize, inter: usize);
    /// `[E · 2I, H]`, expert `e`'s rows at `e · 2I ..`, even rows gate, odd rows up.
    pub fn gate_up(&self) -> &Mxfp4 {
        &self.gate_up
    }
    /// `[E · H, I]`.
    pub fn down(&self) -> &Mxfp4 {
        &self.down
    }
    /// `[E, 2I]`, interleaved like `gate_up`'s rows.
    pub fn gate_up_bias(&self) -> &[f32] {
        &self.gate_up_bias
    }
    /// `[E, H]`.
    pub fn down_bias(&self) -> &[f32] {
        &self.down_bias
    }

    /// The experts dequantised (exactly, for bf16: an e2m1 value times a power of two has at most 2 significant
    /// bits; f16 rounds values outside its range) into gpt-oss's bf16 format, [`ExpertFormat::GPT_OSS`]:
    /// `w13 [E, H, 2I]` (interleaved), `w2 [E, I, H]`, with the biases.
    ///
    /// # Errors
    /// [`crate::Error::InvalidProblem`] from [`PackedExperts::new`] (never, for a value this module made).
    pub fn dequantize<T: Element>(&self) -> Result<PackedExperts<T>> {
        let (e, h, i) = (self.dims.experts, self.dims.hidden, self.dims.inter);
        let w13 = transpose(&self.gate_up.dequantize(), e, 2 * i, h);
        let w2 = transpose(&self.down.dequantize(), e, h, i);
        PackedExperts::new(
            e,
            h,
            i,
            ExpertFormat::GPT_OSS,
            w13,
            w2,
            Some(self.gate_up_bias.clone()),
            Some(self.down_bias.clone()),
        )
    }
}

/// Per expert, f32 `[rows, cols]` → `T` `[cols, rows]`.
fn transpose<T: Element>(src: &[f32], experts: usize, rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for m in src.chunks_exact(rows * cols).take(experts) {
        for c in 0..cols {
            out.extend((0..rows).map(|r| T::from_f32(m[r * cols + c])));
        }
    }
    out
}
