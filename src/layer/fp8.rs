//! Block-FP8 expert weights for the layer ([`Fp8ExpertWeights`]): both GEMMs' e4m3 tensors and their 128 × 128
//! f32 scales in one value, so a scale grid cannot drift from its weights or be paired with another tensor's.
//!
//! The Batched backend runs the FP8 decode kernels (`cpp/moe_ops/decode_fp8.cu`): two kernels that quantise x and h per
//! 128 columns in shared memory by the same rules and stream the e4m3 weight rows into tensor-core MMAs.
//!
//! The layer's FP8 forward on the layout backends (Grouped, Contiguous and Masked), per pass:
//!
//! 1. the layout of the routed rows (as for dense weights);
//! 2. `quantize_gather`: each token's row of `x` (bf16) to e4m3 with one f32 scale per 128 columns, written at
//!    each of its layout positions (the gather and the quantisation in one kernel);
//! 3. GEMM1, the FP8 blockwise grouped GEMM over the layout's groups: `d1 = x_q · w13ᵀ` in bf16 (the SM90 or
//!    the SM100 plan, chosen by the device's arch when the layer is planned: `kernels::blockwise::BlockwiseFp8Gemm`);
//! 4. the activation (the dense path's kernel, bf16 in and out, with `b13`);
//! 5. `requantize_rows`: the rows of `h` in use to e4m3 and scales, by the same rules;
//! 6. GEMM2: `d2 = h_q · w2ᵀ` in bf16;
//! 7. the combine (the dense path's kernel: `b2`, router weights, the sum over k in f32, rounded once).
//!
//! The activation quantisation ([`GroupQuant`]) is the checkpoint's: its family's eps (DeepSeek's 1e-4, vLLM's
//! 1e-10 for Qwen3-FP8 and the rest: [`crate::checkpoint::Fp8Config::activation_eps`]), scales rounded up to
//! powers of two for `scale_fmt: ue8m0` checkpoints ([`Fp8ExpertWeights::with_activation_quant`] overrides it).
//! [`reference::moe_forward_fp8`](crate::reference::moe_forward_fp8) is the same computation on the host.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::weights::sealed::{Common, IsBf16, Parts, Sealed};
use super::weights::{LayerWeights, WeightFormat};
use crate::error::{Error, Result};
use crate::experts::{Activation, ExpertDims, ExpertFormat, GateUp, Storage};
use crate::experts::{PackedFp8Experts, SharedFp8Expert};
use crate::kernels::elementwise::{DecodeFp8Weights, DecodeScales, DynamicScale};
use crate::quant::{BlockShape, Fp8BlockWeights, GroupQuant, ScaleRounding, Scales, SCALE_BLOCK};

/// Block-FP8 expert weights on the device: `w13` e4m3 `[E, 2I, H]` (gate rows `0..I`, up rows `I..2I`; `[E, I,
/// H]` for a non-gated activation) and `w2` `[E, H, I]`, each with its f32 scales per 128 × 128 block (DeepSeek's
/// `weight_scale_inv`, stacked over experts), optional f32 biases, the activation, and how the layer quantises
/// the activations that meet them.
///
/// Constraints (checked when made, each named in the error): `H` and `I` multiples of 128 (w2's `N = H` and
/// w13's gate and up halves must be whole 128-row scale blocks, and the FP8 GEMM takes whole blocks of N);
/// gate and up concatenated (`GateUp::Concatenated`): interleaved rows would put gate and up rows under one
/// block's scale, which block-FP8 checkpoints never computed; `[out, in]` storage.
#[derive(Debug)]
pub struct Fp8ExpertWeights {
    /// The tensors hold `experts + shared_groups` ([`Fp8ExpertWeights::upload_with_shared`]).
    pub(crate) dims: ExpertDims,
    pub(crate) quant: GroupQuant,
    pub(crate) w13: Fp8BlockWeights,
    pub(crate) w2: Fp8BlockWeights,
    pub(crate) b13: Option<CudaSlice<f32>>,
    pub(crate) b2: Option<CudaSlice<f32>>,
}

/// Checks the format and the sizes FP8 experts take, naming the constraint.
fn check_fp8_format(format: ExpertFormat, hidden: usize, inter: usize) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidProblem(s));
    if format.storage != Storage::OutIn {
        return bad(format!(
            "FP8 experts: storage {:?}: block-FP8 weights are kept [out, in] (nn.Linear, as checkpoints hold them); \
             transposing would move their 128 x 128 scale blocks",
            format.storage
        ));
    }
    if format.gate_up != GateUp::Concatenated {
        return bad(format!(
            "FP8 experts: gate/up {:?}: block-FP8 experts take GateUp::Concatenated only; interleaved gate and up \
             rows would share one 128-row block's scale, which the checkpoint's per-matrix blocks never computed \
             (per-channel and per-tensor experts take them: Fp8ChannelExperts::from_gate_up)",
            format.gate_up
        ));
    }
    for (name, v, why) in [
        ("H", hidden, "w2's N = H must be whole 128-row weight-scale blocks for the blockwise FP8 GEMM"),
        ("I", inter, "w13's gate and up halves (N = 2I) must each be whole 128-row weight-scale blocks"),
    ] {
        if v == 0 || v % SCALE_BLOCK != 0 {
            return bad(format!("FP8 experts: {name} = {v} is not a positive multiple of {SCALE_BLOCK}: {why}"));
        }
    }
    Ok(())
}

/// f32 dequantisation multipliers of a checkpoint's scales (UE8M0 bytes are powers of two: exact).
fn f32_scales(s: &Scales) -> Vec<f32> {
    match s {
        Scales::F32(v) => v.clone(),
        other => (0..other.len()).map(|i| other.get(i).unwrap_or(f32::NAN)).collect(),
    }
}

impl Fp8ExpertWeights {
    /// Uploads packed block-FP8 experts (from a checkpoint, [`crate::checkpoint::Checkpoint::pack_fp8_experts`],
    /// or quantised from bf16, [`PackedFp8Experts::quantize`]). `format` names the activation; its gate/up
    /// order must be `Concatenated` and its storage `OutIn` (how `PackedFp8Experts` holds them). UE8M0 scales
    /// are widened to f32 (exactly); the activations are quantised as the checkpoint's format says
    /// ([`PackedFp8Experts::activation_quant`]: its family's eps, scales rounded up to powers of two for UE8M0).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: blocks other than 128 x 128, a non-gated activation
    /// (the packed w13 holds gate and up), interleaved gate/up, transposed storage, `H` or `I` not a multiple of
    /// 128; driver errors.
    pub fn upload(stream: &Arc<CudaStream>, p: &PackedFp8Experts, format: ExpertFormat) -> Result<Self> {
        if p.block() != BlockShape::DEEPSEEK {
            return Err(Error::InvalidProblem(format!(
                "FP8 experts in {} x {} blocks: the blockwise FP8 GEMM takes 128 x 128 weight blocks",
                p.block().rows,
                p.block().cols
            )));
        }
        if !format.activation.gated() {
            return Err(Error::InvalidProblem(format!(
                "FP8 experts: activation {:?} is not gated, but packed FP8 experts hold gate and up (w13 [E, 2I, H])",
                format.activation
            )));
        }
        check_fp8_format(format, p.hidden(), p.inter())?;
        let (e, h, i) = (p.experts(), p.hidden(), p.inter());
        let w13 = Fp8BlockWeights::new(
            stream.clone_htod(p.w13())?,
            stream.clone_htod(&f32_scales(p.w13_scales()))?,
            e,
            2 * i,
            h,
        )?;
        let w2 =
            Fp8BlockWeights::new(stream.clone_htod(p.w2())?, stream.clone_htod(&f32_scales(p.w2_scales()))?, e, h, i)?;
        let w = Self::from_device(format.activation, format.gate_up, w13, w2, None, None)?;
        Ok(w.with_activation_quant(p.activation_quant()))
    }

    /// Uploads routed block-FP8 experts with a block-FP8 shared expert (DeepSeek-V3, Kimi-K2: `shared_experts`
    /// in e4m3 with 128 x 128 scales) appended as `m = I_s / I` more experts of the routed width, which every
    /// token joins with weight 1 ([`MoeLayer::forward`](super::MoeLayer::forward)) or its own
    /// ([`MoeLayer::forward_with_shared_weights`](super::MoeLayer::forward_with_shared_weights)); the groups keep
    /// the checkpoint's scale blocks ([`PackedFp8Experts::with_shared_groups`]).
    ///
    /// # Errors
    /// As [`Self::upload`] and [`PackedFp8Experts::with_shared_groups`].
    pub fn upload_with_shared(
        stream: &Arc<CudaStream>,
        p: &PackedFp8Experts,
        shared: &SharedFp8Expert,
        format: ExpertFormat,
    ) -> Result<Self> {
        let (all, m) = p.with_shared_groups(shared)?;
        let mut w = Self::upload(stream, &all, format)?;
        w.dims.experts = p.experts();
        w.dims.shared_groups = m;
        Ok(w)
    }

    /// Wraps block-FP8 weights already on the device: `w13` `[E, 2I, H]` (`[E, I, H]` for a non-gated
    /// activation), `w2` `[E, H, I]`, biases f32 `[E, 2I or I]` and `[E, H]`; the activations quantised with
    /// [`GroupQuant::DEEPSEEK`] (see [`Self::with_activation_quant`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint (see the type's docs) or the tensor whose shape does not
    /// match the others.
    pub fn from_device(
        activation: Activation,
        gate_up: GateUp,
        w13: Fp8BlockWeights,
        w2: Fp8BlockWeights,
        b13: Option<CudaSlice<f32>>,
        b2: Option<CudaSlice<f32>>,
    ) -> Result<Self> {
        let (e, h, i) = (w13.experts(), w13.k(), w2.k());
        let format = ExpertFormat { gate_up, activation, storage: Storage::OutIn };
        check_fp8_format(format, h, i)?;
        let r13 = if activation.gated() { 2 * i } else { i };
        if w13.n() != r13 || (w2.experts(), w2.n()) != (e, h) {
            return Err(Error::InvalidProblem(format!(
                "FP8 experts: w13 [{}, {}, {}] and w2 [{}, {}, {}] are not [E, {}, H] and [E, H, I] (activation {activation:?})",
                w13.experts(),
                w13.n(),
                w13.k(),
                w2.experts(),
                w2.n(),
                w2.k(),
                if activation.gated() { "2I" } else { "I" }
            )));
        }
        for (name, len, want) in
            [("b13", b13.as_ref().map(CudaSlice::len), e * r13), ("b2", b2.as_ref().map(CudaSlice::len), e * h)]
        {
            if let Some(len) = len.filter(|&l| l != want) {
                return Err(Error::InvalidProblem(format!(
                    "FP8 experts: {name} has {len} elements, expected {want} for E = {e}, H = {h}, I = {i}"
                )));
            }
        }
        Ok(Fp8ExpertWeights {
            dims: ExpertDims::new((e, h, i), gate_up, activation),
            quant: GroupQuant::DEEPSEEK,
            w13,
            w2,
            b13,
            b2,
        })
    }

    /// The same weights with activations quantised by `quant` (eps, scale rounding) before each GEMM.
    pub fn with_activation_quant(mut self, quant: GroupQuant) -> Self {
        self.quant = quant;
        self
    }

    /// How the layer quantises activations before each GEMM.
    pub fn activation_quant(&self) -> GroupQuant {
        self.quant
    }
    routed_and_shared_getters!(pub);
    /// Gives the device buffers back, `(w13, w2, b13, b2)` (see [`ExpertWeights::into_device`](super::ExpertWeights::into_device)).
    #[allow(clippy::type_complexity)]
    pub fn into_device(self) -> (Fp8BlockWeights, Fp8BlockWeights, Option<CudaSlice<f32>>, Option<CudaSlice<f32>>) {
        (self.w13, self.w2, self.b13, self.b2)
    }
    /// GEMM1's weights and scales, `[E, 2I or I, H]`.
    pub fn w13(&self) -> &Fp8BlockWeights {
        &self.w13
    }
    /// GEMM2's weights and scales, `[E, H, I]`.
    pub fn w2(&self) -> &Fp8BlockWeights {
        &self.w2
    }
    /// What the batched backend's FP8 decode kernels read of these weights.
    pub(super) fn decode_experts(&self) -> DecodeFp8Weights<'_> {
        DecodeFp8Weights {
            act: self.dims.activation.into(),
            experts: self.groups(),
            hidden: self.dims.hidden,
            inter: self.dims.inter,
            w13: self.w13.q(),
            w2: self.w2.q(),
            scales: DecodeScales::Block128 {
                w13: self.w13.scales(),
                w2: self.w2.scales(),
                act: DynamicScale { eps: self.quant.eps(), ue8m0: self.quant.rounding() == ScaleRounding::Ue8m0Ceil },
            },
            b13: self.b13.as_ref(),
            b2: self.b2.as_ref(),
        }
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.w13.device()
    }
    /// Device bytes: e4m3 elements (1 byte each), f32 scales and biases.
    pub fn bytes(&self) -> usize {
        self.w13.bytes()
            + self.w2.bytes()
            + self.b13.as_ref().map_or(0, |b| b.num_bytes())
            + self.b2.as_ref().map_or(0, |b| b.num_bytes())
    }
}

pub(super) fn same(s: &mut CudaSlice<bf16>) -> &mut CudaSlice<bf16> {
    s
}

bf16_layer_weights!(Fp8ExpertWeights, WeightFormat::Fp8Block, Fp8, biases b13, b2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::invalid_problem as err;

    #[test]
    fn fp8_formats_name_their_constraint() {
        assert!(check_fp8_format(ExpertFormat::SWIGLU, 7168, 2048).is_ok());
        assert!(check_fp8_format(ExpertFormat::SWIGLU, 256, 128).is_ok());
        let interleaved = ExpertFormat { storage: Storage::OutIn, ..ExpertFormat::GPT_OSS };
        let m = err(check_fp8_format(interleaved, 256, 128));
        assert!(m.contains("Interleaved") && m.contains("Concatenated") && m.contains("128-row"), "{m}");
        let m = err(check_fp8_format(ExpertFormat::GPT_OSS, 256, 128));
        assert!(m.contains("InOut") && m.contains("[out, in]"), "{m}");
        let m = err(check_fp8_format(ExpertFormat::SWIGLU, 2880, 256));
        assert!(m.contains("H = 2880") && m.contains("multiple of 128") && m.contains("N = H"), "{m}");
        let m = err(check_fp8_format(ExpertFormat::SWIGLU, 256, 192));
        assert!(m.contains("I = 192") && m.contains("gate and up"), "{m}");
        let m = err(check_fp8_format(ExpertFormat::SWIGLU, 0, 128));
        assert!(m.contains("H = 0"), "{m}");
    }

    #[test]
    fn ue8m0_scales_widen_exactly() {
        let s = Scales::Ue8m0(vec![crate::quant::Ue8m0(127), crate::quant::Ue8m0(120), crate::quant::Ue8m0(130)]);
        assert_eq!(f32_scales(&s), vec![1.0, 2f32.powi(-7), 8.0]);
        assert_eq!(f32_scales(&Scales::F32(vec![0.25, 3.0])), vec![0.25, 3.0]);
    }
}
