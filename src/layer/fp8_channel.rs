//! Per-channel and per-tensor FP8 expert weights for the layer ([`Fp8ChannelExpertWeights`]): the checkpoints
//! vLLM serves besides DeepSeek's blocks (compressed-tensors `channel` / `tensor` weight strategies, `fp8` with
//! `weight_scale` per expert), every weight with one f32 scale per output row.
//!
//! The layer's forward on the layout backends (Grouped, Contiguous, Masked), per pass:
//!
//! 1. the layout of the routed rows (as for dense weights);
//! 2. [`Fp8TokenRows::quantize_gather`]: each token's row of `x` to e4m3 with one f32 scale per token (dynamic
//!    per token: `max(amax, 1/512) / 448` of the row; dynamic per tensor: the same of the pass's whole `x`, a
//!    reduction kernel first; static: the checkpoint's largest `input_scale` of GEMM1), written at its layout
//!    positions;
//! 3. GEMM1, the FP8 rowwise grouped GEMM: `d1 = (x_q · w13ᵀ) · s_x[row] · s_w13[channel]` in bf16;
//! 4. the activation (the dense path's kernel);
//! 5. [`Fp8TokenRows::requantize`]: the rows of `h` in use, by the same rules (per tensor: over those rows;
//!    static: GEMM2's scale);
//! 6. GEMM2: `d2 = (h_q · w2ᵀ) · s_h[row] · s_w2[channel]`;
//! 7. the combine (router weights, the sum over k).
//!
//! [`reference::moe_forward_fp8_channel`](crate::reference::moe_forward_fp8_channel) is the same computation on
//! the host. A dynamic per-tensor scale is the amax of one pass's rows: of the whole batch where the layer's room
//! holds it in one pass (a forward of more tokens than the room is several passes, each with its own scale).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::fp8::same;
use super::weights::sealed::{Common, IsBf16, Parts, Sealed};
use super::weights::{LayerWeights, WeightFormat};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::experts::{Activation, ExpertDims, Fp8ChannelExperts, GateUp};
use crate::kernels::elementwise::{ChannelActScale, DecodeFp8Weights, DecodeScales, DynamicScale};
use crate::kernels::grouped_fp8_rowwise::ROWWISE_ALIGN;
use crate::quant::{ActivationScales, Fp8ChannelWeights, GroupQuant, ScaleRounding, TokenScale};

/// How the layer scales the activations that meet per-channel FP8 weights.
#[derive(Debug)]
pub(crate) enum ChannelActivations {
    /// Per token, at run time.
    Dynamic(GroupQuant),
    /// Per tensor (one pass's rows), at run time.
    DynamicTensor(GroupQuant),
    /// One scale per GEMM fixed by the checkpoint (`[1]` on the device each): GEMM1's and GEMM2's.
    Static { w13: CudaSlice<f32>, w2: CudaSlice<f32> },
}

/// Per-channel FP8 expert weights on the device: `w13` e4m3 `[E, 2I, H]` (gate rows, then up rows) and `w2`
/// `[E, H, I]`, each with one f32 scale per output row, and how the activations are scaled
/// ([`ActivationScales::DynamicToken`], [`ActivationScales::DynamicTensor`] or [`ActivationScales::StaticTensor`]).
///
/// Constraints (checked when made): `H` and `I` multiples of 16 (the rowwise GEMM's 16-byte e4m3 rows and
/// aligned channel scales); a gated activation (w13 holds gate and up).
#[derive(Debug)]
pub struct Fp8ChannelExpertWeights {
    /// Gate rows then up rows (`Concatenated`; interleaved experts are reordered on the host,
    /// [`Fp8ChannelExperts::from_gate_up`]), no shared groups.
    pub(crate) dims: ExpertDims,
    pub(crate) w13: Fp8ChannelWeights,
    pub(crate) w2: Fp8ChannelWeights,
    pub(crate) activations: ChannelActivations,
    declared: ActivationScales,
}

impl Fp8ChannelExpertWeights {
    /// Uploads a checkpoint's per-channel (or per-tensor) experts ([`crate::Checkpoint::pack_fp8_channel_experts`])
    /// with their gated `activation`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: a non-gated activation, `H` or `I` not a multiple of 16;
    /// driver errors.
    pub fn upload(stream: &Arc<CudaStream>, p: &Fp8ChannelExperts, activation: Activation) -> Result<Self> {
        check_channel_shape(p.hidden(), p.inter())?;
        if !activation.gated() {
            return Err(Error::InvalidProblem(format!(
                "per-channel FP8 experts: activation {activation:?}: their w13 holds gate and up, a gated activation"
            )));
        }
        let activations = match (p.activations(), p.static_scales()) {
            (ActivationScales::DynamicToken, _) => ChannelActivations::Dynamic(p.dynamic_quant()),
            (ActivationScales::DynamicTensor, _) => ChannelActivations::DynamicTensor(p.dynamic_quant()),
            (ActivationScales::StaticTensor, Some(s)) => {
                let (a13, a2) = s.layer_scales();
                ChannelActivations::Static { w13: stream.clone_htod(&[a13])?, w2: stream.clone_htod(&[a2])? }
            }
            (a, _) => {
                return Err(Error::InvalidProblem(format!(
                    "per-channel FP8 experts with {a:?} activation scales: the layer runs dynamic per-token, dynamic \
                     per-tensor and static per-tensor activation scales (static ones with their input scales)"
                )))
            }
        };
        Ok(Fp8ChannelExpertWeights {
            dims: ExpertDims::new((p.experts(), p.hidden(), p.inter()), GateUp::Concatenated, activation),
            w13: Fp8ChannelWeights::from_host(stream, p.w13())?,
            w2: Fp8ChannelWeights::from_host(stream, p.w2())?,
            activations,
            declared: p.activations(),
        })
    }

    /// Experts already on the device, `w13 [E, 2I, H]` (gate rows, then up rows) and `w2 [E, H, I]`, with run-time
    /// activation scales (`DynamicToken` or `DynamicTensor`; static scales come with a checkpoint's input scales:
    /// [`Self::upload`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: shapes that do not chain (`w13`'s `N = 2 · w2's K`, `w2`'s
    /// `N = w13's K`, the same expert count), a non-gated activation, `H` or `I` not a multiple of 16, static
    /// or per-group activation scales.
    pub fn from_device(
        w13: Fp8ChannelWeights,
        w2: Fp8ChannelWeights,
        activation: Activation,
        scales: ActivationScales,
    ) -> Result<Self> {
        let (experts, hidden, inter) = (w13.experts(), w13.k(), w2.k());
        if w2.experts() != experts || w13.n() != 2 * inter || w2.n() != hidden {
            return Err(Error::InvalidProblem(format!(
                "per-channel FP8 experts: w13 [{}, {}, {}] and w2 [{}, {}, {}] do not chain (w13 [E, 2I, H], w2 [E, H, I])",
                w13.experts(),
                w13.n(),
                w13.k(),
                w2.experts(),
                w2.n(),
                w2.k()
            )));
        }
        check_channel_shape(hidden, inter)?;
        if !activation.gated() {
            return Err(Error::InvalidProblem(format!(
                "per-channel FP8 experts: activation {activation:?}: their w13 holds gate and up, a gated activation"
            )));
        }
        let quant = crate::quant::GroupQuant::new(crate::experts::CHANNEL_ACT_EPS, crate::quant::ScaleRounding::Exact)?;
        let activations = match scales {
            ActivationScales::DynamicToken => ChannelActivations::Dynamic(quant),
            ActivationScales::DynamicTensor => ChannelActivations::DynamicTensor(quant),
            other => {
                return Err(Error::InvalidProblem(format!(
                    "per-channel FP8 experts from the device with {other:?} activation scales: from_device takes \
                     run-time (dynamic per-token or per-tensor) scales; static ones come with a checkpoint (upload)"
                )))
            }
        };
        let dims = ExpertDims::new((experts, hidden, inter), GateUp::Concatenated, activation);
        Ok(Fp8ChannelExpertWeights { dims, w13, w2, activations, declared: scales })
    }

    /// Whether a layer `[H, I]` can hold per-channel FP8 experts (what [`Self::upload`] checks first).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `H` or `I` not a positive multiple of 16, naming it.
    pub fn check_shape(hidden: usize, inter: usize) -> Result<()> {
        check_channel_shape(hidden, inter)
    }

    /// Whether `backend` runs a layer `[H, I]` of these weights beyond [`Self::check_shape`]: Batched and Fused
    /// take H and I in multiples of 128 (what the plan checks).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the backend, the dimension and the multiple.
    pub fn check_backend_shape(backend: Backend, hidden: usize, inter: usize) -> Result<()> {
        check_backend_shape(backend, hidden, inter)
    }

    getters!(in dims; experts: usize, hidden: usize, inter: usize, activation: Activation);
    /// How the checkpoint scales the activations (per token at run time, or static per tensor).
    pub fn activation_scales(&self) -> ActivationScales {
        self.declared
    }
    /// GEMM1's weights and per-channel scales, `[E, 2I, H]` and `[E, 2I]`.
    pub fn w13(&self) -> &Fp8ChannelWeights {
        &self.w13
    }
    /// GEMM2's weights and per-channel scales, `[E, H, I]` and `[E, H]`.
    pub fn w2(&self) -> &Fp8ChannelWeights {
        &self.w2
    }
    /// The static activation scales on the device, GEMM1's input (x) and GEMM2's (h), one f32 each, for a caller
    /// that sets them after the upload (a run-time calibration); `None` unless the scales are `StaticTensor`. They
    /// are device data and not trusted: a scale that is not finite and positive is replaced by 1 in every kernel
    /// that reads it and sets [`crate::status::bits::BAD_STATIC_SCALE`], reported at the next check.
    pub fn static_input_scales_mut(&mut self) -> Option<(&mut CudaSlice<f32>, &mut CudaSlice<f32>)> {
        match &mut self.activations {
            ChannelActivations::Static { w13, w2 } => Some((w13, w2)),
            _ => None,
        }
    }
    /// The scale rule of GEMM1's (`second == false`) or GEMM2's activations.
    pub(crate) fn token_scale(&self, second: bool) -> TokenScale<'_> {
        match &self.activations {
            ChannelActivations::Dynamic(q) => TokenScale::Dynamic(*q),
            ChannelActivations::DynamicTensor(q) => TokenScale::DynamicTensor(*q),
            ChannelActivations::Static { w13, w2 } => TokenScale::Static(if second { w2 } else { w13 }),
        }
    }
    /// What the batched backend's FP8 decode kernels read of these weights.
    pub(super) fn decode_experts(&self) -> DecodeFp8Weights<'_> {
        let dynamic = |q: &GroupQuant| DynamicScale { eps: q.eps(), ue8m0: q.rounding() == ScaleRounding::Ue8m0Ceil };
        let act = match &self.activations {
            ChannelActivations::Dynamic(q) => ChannelActScale::Token(dynamic(q)),
            ChannelActivations::DynamicTensor(q) => ChannelActScale::Tensor(dynamic(q)),
            ChannelActivations::Static { w13, w2 } => ChannelActScale::Static { x: w13, h: w2 },
        };
        DecodeFp8Weights {
            act: self.dims.activation.into(),
            experts: self.dims.experts,
            hidden: self.dims.hidden,
            inter: self.dims.inter,
            w13: self.w13.q(),
            w2: self.w2.q(),
            scales: DecodeScales::Channel { w13: self.w13.scales(), w2: self.w2.scales(), act },
            b13: None,
            b2: None,
        }
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.w13.device()
    }
    /// Device bytes: e4m3 elements, f32 channel scales, the static activation scales.
    pub fn bytes(&self) -> usize {
        let statics = match &self.activations {
            ChannelActivations::Static { .. } => 8,
            ChannelActivations::Dynamic(_) | ChannelActivations::DynamicTensor(_) => 0,
        };
        self.w13.bytes() + self.w2.bytes() + statics
    }
}

/// `H` and `I` as the rowwise GEMM takes them (both are some GEMM's N and K).
pub(crate) fn check_channel_shape(hidden: usize, inter: usize) -> Result<()> {
    for (name, v) in [("H", hidden), ("I", inter)] {
        if v == 0 || v % ROWWISE_ALIGN != 0 {
            return Err(Error::InvalidProblem(format!(
                "per-channel FP8 experts: {name} = {v} is not a positive multiple of {ROWWISE_ALIGN}: the rowwise \
                 GEMM reads 16-byte e4m3 rows and 16-byte aligned channel scales"
            )));
        }
    }
    Ok(())
}

/// `H` and `I` as `backend`'s kernels take them: the FP8 decode kernels (Batched) and the FP8 fused GEMMs (Fused)
/// work in whole 128-column blocks (what they quantise and stream by; the fused GEMMs' N tiles); the layout
/// backends' rowwise GEMM takes multiples of 16.
pub(crate) fn check_backend_shape(backend: Backend, hidden: usize, inter: usize) -> Result<()> {
    let what = match backend {
        Backend::Batched => "the FP8 decode kernels",
        Backend::Fused => "the FP8 fused GEMMs",
        _ => return Ok(()),
    };
    for (name, v) in [("H", hidden), ("I", inter)] {
        if v % BLOCK != 0 {
            return Err(Error::InvalidProblem(format!(
                "backend {backend}: per-channel FP8 experts with {name} = {v}: {what} take H and I in multiples of \
                 {BLOCK} (run Grouped, Contiguous or Masked)"
            )));
        }
    }
    Ok(())
}

/// The column block of the decode kernels and the fused GEMMs' widest N tile.
const BLOCK: usize = 128;

bf16_layer_weights!(Fp8ChannelExpertWeights, WeightFormat::Fp8Channel, Fp8Channel);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceInfo;
    use crate::dtype::DType;
    use crate::layer::plans::RowwisePlans;
    use crate::layer::{Backend, Backends, LayerGemm, LayerShape, LayerSizing};

    fn mixtral(hidden: usize, inter: usize) -> LayerShape {
        LayerShape { experts: 8, global_experts: 8, top_k: 2, shared_groups: 0, hidden, inter, gated: true }
    }

    fn size(dev: &DeviceInfo, s: LayerShape, dtype: DType, b: Backend, set: Option<Backends>) -> Result<LayerSizing> {
        LayerSizing::for_device(dev, s, dtype, WeightFormat::Fp8Channel, 256, b, set, None, None, false, None)
    }

    #[test]
    fn mixtral_fp8_channel_plans_the_rowwise_gemm_with_per_token_rows() {
        let h200 = DeviceInfo::described("NVIDIA H200", (9, 0), 132);
        let z = size(&h200, mixtral(4096, 14336), DType::BF16, Backend::Auto, None).unwrap();
        assert_eq!((z.gemm(), z.backends()), (LayerGemm::Sm90Fp8Rowwise, Backends::FP8_AUTO));
        let extents: Vec<(usize, usize)> = z.gemms.iter().map(|g| (g.n, g.k)).collect();
        assert_eq!(extents, [(28672, 4096), (4096, 14336)]);
        let n = z.needs();
        // Grouped's 256 tokens x 2 slots (Auto sends it every batch past Batched's): x per token at its positions,
        // h per row; nothing of the block-FP8 or bf16 rows; Batched's two per-tensor amax words.
        let grouped = z.passes.iter().find(|p| p.backend == Backend::Grouped).unwrap().tokens;
        assert_eq!(grouped, 256);
        assert_eq!((n.a_token_rows, n.h_token_rows, n.a_fp8_rows, n.h_fp8_rows, n.a_rows), (512, 512, 0, 0, 0));
        assert_eq!(n.amax_words, 2);
        let mut workspace = 0;
        for spec in &z.gemms {
            let plans = RowwisePlans::new(&h200, spec).unwrap();
            for p in &plans.plans {
                assert_eq!((p.shape().n(), p.shape().k(), p.shape().max_rows()), (spec.n, spec.k, spec.max_rows));
                workspace = workspace.max(p.workspace_bytes());
            }
            // 512 rows over 8 experts never pass 64 rows per expert: the 64-row ping-pong tile is the one plan.
            assert_eq!(plans.plans.len(), 1);
            assert_eq!(plans.for_rows(512).config().tile().0, 64);
        }
        assert_eq!(n.workspace_bytes, workspace, "sized vs planned workspace");
        assert!(workspace > 0, "the ptr-array GEMM's arguments live in the workspace: the passes require one");
        let f = n.footprint();
        assert!(f.parts.iter().any(|(name, b)| name.starts_with("a fp8 per token") && *b == 512 * 4100 + 4), "{f}");
        let all = Backends::FP8_CHANNEL;
        assert_eq!(size(&h200, mixtral(4096, 14336), DType::BF16, Backend::Masked, Some(all)).unwrap().backends(), all);
        // Without Batched, no amax words.
        let g = size(&h200, mixtral(4096, 14336), DType::BF16, Backend::Grouped, None).unwrap();
        assert_eq!(g.needs().amax_words, 0);
    }

    #[test]
    fn auto_runs_batched_where_the_decode_kernels_take_the_shape() {
        let h200 = DeviceInfo::described("NVIDIA H200", (9, 0), 132);
        let z = size(&h200, mixtral(4096, 14336), DType::BF16, Backend::Auto, None).unwrap();
        assert_eq!(z.auto_source(), crate::layer::AutoSource::CostModel);
        // H = 4096 + 16: the rowwise GEMM takes it, the decode kernels do not: Auto plans Grouped alone.
        let z = size(&h200, mixtral(4112, 14336), DType::BF16, Backend::Auto, None).unwrap();
        assert_eq!(z.backends(), Backends::of(Backend::Grouped));
        assert_eq!(z.needs().amax_words, 0);
    }

    #[test]
    fn fp8_channel_refusals_name_their_constraint() {
        let h200 = DeviceInfo::described("NVIDIA H200", (9, 0), 132);
        let s = mixtral(4096, 14336);
        let e = size(&h200, s, DType::BF16, Backend::Eager, None).unwrap_err().to_string();
        assert!(e.contains("per-channel FP8") && e.contains("eager"), "{e}");
        for b in [Backend::Batched, Backend::Fused] {
            let e = size(&h200, mixtral(4096, 14352), DType::BF16, b, None).unwrap_err().to_string();
            assert!(e.contains(b.name()) && e.contains("I = 14352") && e.contains("multiples of 128"), "{e}");
        }
        let e = size(&h200, s, DType::F16, Backend::Grouped, None).unwrap_err().to_string();
        assert!(e.contains("bf16 activations"), "{e}");
        let e = size(&h200, mixtral(4100, 14336), DType::BF16, Backend::Auto, None).unwrap_err().to_string();
        assert!(e.contains("H = 4100") && e.contains("multiple of 16"), "{e}");
        // SM90 only: a B200 is refused naming the family, not planned with a kernel it has no SASS for.
        let b200 = DeviceInfo::described("NVIDIA B200", (10, 0), 148);
        let e = size(&b200, s, DType::BF16, Backend::Grouped, None).unwrap_err().to_string();
        assert!(e.contains("sm_90a") && e.contains("B200"), "{e}");
    }
}
