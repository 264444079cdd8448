//! The experts of a per-tensor or per-channel FP8 checkpoint on the host ([`Fp8ChannelExperts`]): every weight
//! with one f32 scale per output row, what the rowwise-scaled grouped GEMM reads
//! ([`crate::quant::Fp8ChannelWeights`]).
//!
//! A per-tensor weight becomes per-row by repeating its scale over its rows, which dequantises to the same values,
//! so gate and up, stored with a scale each, stack into `w13 = [gate; up]` exactly (vLLM instead requantises both
//! to the larger of the two scales, which moves the smaller-scaled one by an e4m3 rounding).
//!
//! Activations are scaled as the checkpoint declares ([`ActivationScales`]): per token or per tensor at run time,
//! amax floored at [`CHANNEL_ACT_EPS`], or by the checkpoint's static `input_scale`s. Like vLLM's fused MoE, which
//! warns "Found input_scales that are not equal for fp8 MoE layer. Using the maximum across experts for each
//! layer.", a layer applies one static scale per GEMM: the largest over the experts ([`StaticInputScales`]).
//!
//! Fused `w13`s whose gate and up rows are interleaved (gpt-oss's order) are accepted
//! ([`Fp8ChannelExperts::from_gate_up`]): with one scale per row, the rows move with their scales into
//! `[gate; up]`, an exact permutation, so the kernels run the concatenated layout only.

use super::GateUp;
use crate::error::{Error, Result};
use crate::quant::{per_row_block, to_per_row, ActivationScales, BlockFp8, GroupQuant, ScaleRounding, Scales};

/// The amax floor of run-time (dynamic) per-token and per-tensor activation scales: 1/512, i.e. a smallest scale
/// of `1 / (448 · 512)`, the minimum scaling factor of vLLM's dynamic per-token FP8 quantiser.
pub const CHANNEL_ACT_EPS: f32 = 1.0 / 512.0;

/// The static activation scales of a checkpoint (`input_scale` beside each weight), per expert: GEMM1's (the
/// larger of gate's and up's: they read the same input) and GEMM2's.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticInputScales {
    w13: Vec<f32>,
    w2: Vec<f32>,
}

impl StaticInputScales {
    /// Per-expert scales of GEMM1's and GEMM2's inputs.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for lengths that differ or a scale that is not finite and positive (the expert
    /// named).
    pub fn new(w13: Vec<f32>, w2: Vec<f32>) -> Result<StaticInputScales> {
        if w13.len() != w2.len() {
            return Err(Error::InvalidProblem(format!(
                "static input scales of {} experts for GEMM1 and {} for GEMM2",
                w13.len(),
                w2.len()
            )));
        }
        for (what, v) in [("GEMM1 (w13)", &w13), ("GEMM2 (w2)", &w2)] {
            if let Some(e) = v.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
                return Err(Error::InvalidProblem(format!(
                    "expert {e}: {what} input_scale = {}: must be finite and positive",
                    v[e]
                )));
            }
        }
        Ok(StaticInputScales { w13, w2 })
    }
    /// Per expert, GEMM1's input scale.
    pub fn w13(&self) -> &[f32] {
        &self.w13
    }
    /// Per expert, GEMM2's input scale.
    pub fn w2(&self) -> &[f32] {
        &self.w2
    }
    /// The layer's two static scales: the largest of the experts' for each GEMM.
    pub fn layer_scales(&self) -> (f32, f32) {
        let max = |v: &[f32]| v.iter().fold(0f32, |m, s| m.max(*s));
        (max(&self.w13), max(&self.w2))
    }
}

/// All experts of a layer from a per-tensor or per-channel FP8 checkpoint: per expert `w13 [2I, H]` (gate rows,
/// then up rows) and `w2 [H, I]`, e4m3 with one f32 scale per row, and how activations are scaled.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8ChannelExperts {
    hidden: usize,
    inter: usize,
    w13: Vec<BlockFp8>,
    w2: Vec<BlockFp8>,
    activations: ActivationScales,
    static_scales: Option<StaticInputScales>,
}

impl Fp8ChannelExperts {
    /// Per-expert `(gate [I, H], up [I, H], down [H, I])`, each per-tensor or per-row, and the activations'
    /// scaling, with the static scales where it is [`ActivationScales::StaticTensor`].
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the expert and matrix: no experts; shapes that differ from expert 0's or
    /// do not chain (`gate`, `up` `[I, H]`, `down` `[H, I]`); blocks other than whole rows or the whole matrix,
    /// scales other than finite, non-negative F32; group activations (block checkpoints are
    /// [`super::PackedFp8Experts`]); static scales missing, present for dynamic activations, or of another
    /// expert count.
    pub fn new(
        experts: Vec<(BlockFp8, BlockFp8, BlockFp8)>,
        activations: ActivationScales,
        static_scales: Option<StaticInputScales>,
    ) -> Result<Fp8ChannelExperts> {
        let Some((g0, _, _)) = experts.first() else {
            return Err(Error::InvalidProblem("per-channel FP8 experts: none given".into()));
        };
        let (inter, hidden) = (g0.rows(), g0.cols());
        match (activations, &static_scales) {
            (ActivationScales::StaticTensor, None) => {
                return Err(Error::InvalidProblem("static per-tensor activations without their input scales".into()))
            }
            (ActivationScales::StaticTensor, Some(s)) if s.w13.len() != experts.len() => {
                return Err(Error::InvalidProblem(format!(
                    "static input scales of {} experts for {} experts",
                    s.w13.len(),
                    experts.len()
                )))
            }
            (ActivationScales::StaticTensor, Some(_)) => {}
            (ActivationScales::DynamicToken | ActivationScales::DynamicTensor, None) => {}
            (ActivationScales::DynamicToken | ActivationScales::DynamicTensor, Some(_)) => {
                return Err(Error::InvalidProblem(format!(
                    "{activations:?} activations are scaled at run time: static input scales given"
                )))
            }
            (a, _) => {
                return Err(Error::InvalidProblem(format!(
                    "{a:?} activations: per-channel FP8 experts take per-token or per-tensor activation scales"
                )))
            }
        }
        let mut w13 = Vec::with_capacity(experts.len());
        let mut w2 = Vec::with_capacity(experts.len());
        for (e, (gate, up, down)) in experts.iter().enumerate() {
            for (what, m, want) in
                [("gate", gate, (inter, hidden)), ("up", up, (inter, hidden)), ("down", down, (hidden, inter))]
            {
                if (m.rows(), m.cols()) != want {
                    return Err(Error::InvalidProblem(format!(
                        "expert {e}: {what} is [{}, {}], expected [{}, {}] (expert 0's gate is [{inter}, {hidden}])",
                        m.rows(),
                        m.cols(),
                        want.0,
                        want.1
                    )));
                }
            }
            let g = to_per_row(gate, &format!("expert {e} gate"))?;
            let u = to_per_row(up, &format!("expert {e} up"))?;
            w13.push(g.stack_rows(&u)?);
            w2.push(to_per_row(down, &format!("expert {e} down"))?);
        }
        debug_assert!(w13.iter().all(|m| m.block() == per_row_block(hidden)));
        Ok(Fp8ChannelExperts { hidden, inter, w13, w2, activations, static_scales })
    }

    /// Per-expert `(w13 [2I, H], down [H, I])` with gate and up sharing `w13`'s rows as `gate_up` orders them,
    /// each matrix per-tensor or per-row, reordered exactly into `[gate; up]` (rows with their scales); then as
    /// [`Self::new`].
    ///
    /// # Errors
    /// As [`Self::new`], and [`Error::InvalidProblem`] naming the expert: `w13` with an odd or zero row count, or
    /// interleaved with scale blocks of several rows short of the whole matrix (a 128-row block would mix gate
    /// and up rows under one scale).
    pub fn from_gate_up(
        experts: Vec<(BlockFp8, BlockFp8)>,
        gate_up: GateUp,
        activations: ActivationScales,
        static_scales: Option<StaticInputScales>,
    ) -> Result<Fp8ChannelExperts> {
        let mut per = Vec::with_capacity(experts.len());
        for (e, (w13, down)) in experts.into_iter().enumerate() {
            let (rows, b) = (w13.rows(), w13.block());
            if rows == 0 || rows % 2 != 0 {
                return Err(Error::InvalidProblem(format!(
                    "expert {e}: w13 has {rows} rows: gate and up take 2I, a positive even count"
                )));
            }
            if gate_up == GateUp::Interleaved && b.rows > 1 && b.rows < rows {
                return Err(Error::InvalidProblem(format!(
                    "expert {e}: w13 GateUp::Interleaved in {}-row scale blocks: a block would mix gate and up rows \
                     under one scale; interleaved gate/up takes one scale per row or per tensor",
                    b.rows
                )));
            }
            let (gate, up) = split_gate_up(&to_per_row(&w13, &format!("expert {e} w13"))?, gate_up)?;
            per.push((gate, up, down));
        }
        Fp8ChannelExperts::new(per, activations, static_scales)
    }

    pub fn experts(&self) -> usize {
        self.w13.len()
    }
    getters!(hidden: usize, inter: usize);
    /// Per expert, `[2I, H]` with one scale per row.
    pub fn w13(&self) -> &[BlockFp8] {
        &self.w13
    }
    /// Per expert, `[H, I]` with one scale per row.
    pub fn w2(&self) -> &[BlockFp8] {
        &self.w2
    }
    pub fn activations(&self) -> ActivationScales {
        self.activations
    }
    /// The checkpoint's static input scales, for [`ActivationScales::StaticTensor`].
    pub fn static_scales(&self) -> Option<&StaticInputScales> {
        self.static_scales.as_ref()
    }
    /// How run-time activation scales are computed: amax over the token's row (or the whole tensor) floored at
    /// [`CHANNEL_ACT_EPS`], divided by 448, unrounded.
    pub fn dynamic_quant(&self) -> GroupQuant {
        GroupQuant::new(CHANNEL_ACT_EPS, ScaleRounding::Exact).expect("1/512 is a valid eps")
    }
}

/// Gate's and up's rows of a per-row `w13 [2I, K]` in `gate_up`'s order, each row with its own scale: moved,
/// never requantised.
fn split_gate_up(w13: &BlockFp8, gate_up: GateUp) -> Result<(BlockFp8, BlockFp8)> {
    let (i, k) = (w13.rows() / 2, w13.cols());
    let Scales::F32(s) = w13.scales() else { unreachable!("to_per_row gives F32 scales") };
    let rows = |first: usize, step: usize| {
        let idx = (0..i).map(|n| first + n * step);
        let q = idx.clone().flat_map(|r| w13.q()[r * k..(r + 1) * k].iter().copied()).collect();
        BlockFp8::from_parts(i, k, per_row_block(k), q, Scales::F32(idx.map(|r| s[r]).collect()))
    };
    match gate_up {
        GateUp::Concatenated => Ok((rows(0, 1)?, rows(i, 1)?)),
        GateUp::Interleaved => Ok((rows(0, 2)?, rows(1, 2)?)),
    }
}
