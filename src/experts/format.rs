//! The vocabulary of expert weights: how gate and up share `w13`'s rows, the activation between the two GEMMs,
//! how the source tensors store each matrix, and the tensors' lengths those imply.

use crate::error::{Error, Result};

/// How gate and up share the rows of `w13` / `gate_up_proj`.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateUp {
    /// `[gate | up]`: rows `0..I` gate, `I..2I` up (Mixtral, Qwen, DeepSeek; vLLM's `w13_weight`).
    Concatenated,
    /// `[g0, u0, g1, u1, …]`: even rows gate, odd rows up (gpt-oss).
    Interleaved,
}

/// The activation between the two expert GEMMs.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    SiluGated,
    /// gpt-oss: `gate = min(gate, 7)`, `up = clamp(up, −7, 7)`, `(up + 1) · gate · sigmoid(1.702 · gate)`; the
    /// constants are fixed, as in gpt-oss's code.
    GptOssSwiglu,
    /// Not gated: `silu(x)`; `w13` then has `I` rows per expert.
    Silu,
}

impl Activation {
    pub fn gated(self) -> bool {
        self != Activation::Silu
    }
}

/// How each expert's matrices are stored in the source tensors.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// `nn.Linear`: `[out, in]`: `w13 [E, 2I, H]`, `w2 [E, H, I]`.
    OutIn,
    /// Transposed, as gpt-oss keeps them: `gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`. Transposed once,
    /// on upload, into the `[out, in]` layout the kernels read.
    InOut,
}

/// The format of a set of packed expert tensors: fixed when they are wrapped, so a layout cannot be read with
/// the wrong flag at call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertFormat {
    pub gate_up: GateUp,
    pub activation: Activation,
    pub storage: Storage,
}

impl ExpertFormat {
    /// Mixtral, Qwen3-MoE, DeepSeek-V3 as transformers packs them.
    pub const SWIGLU: ExpertFormat =
        ExpertFormat { gate_up: GateUp::Concatenated, activation: Activation::SiluGated, storage: Storage::OutIn };
    /// gpt-oss: interleaved gate/up, transposed storage, clamped SwiGLU (biases come with it).
    pub const GPT_OSS: ExpertFormat =
        ExpertFormat { gate_up: GateUp::Interleaved, activation: Activation::GptOssSwiglu, storage: Storage::InOut };
}

/// The extents and gate/up format of a set of expert weights: what every kind of weights (dense, FP8, MXFP4)
/// holds beside its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertDims {
    /// Routed experts (local ones under expert parallelism).
    pub experts: usize,
    /// Shared-expert groups appended after them in every tensor (`I_s / I`; 0 without a shared expert).
    pub shared_groups: usize,
    pub hidden: usize,
    pub inter: usize,
    pub gate_up: GateUp,
    pub activation: Activation,
}

impl ExpertDims {
    /// Routed experts of `(E, H, I)` in `gate_up` order with `activation`, without shared groups.
    pub(crate) const fn new(
        (experts, hidden, inter): (usize, usize, usize),
        gate_up: GateUp,
        activation: Activation,
    ) -> Self {
        ExpertDims { experts, shared_groups: 0, hidden, inter, gate_up, activation }
    }
    /// Experts every tensor holds: the routed ones and the shared groups.
    pub(crate) const fn groups(&self) -> usize {
        self.experts + self.shared_groups
    }
    /// `w13` rows per expert: `2I` gated, `I` otherwise.
    pub(crate) fn w13_rows(&self) -> usize {
        if self.activation.gated() {
            2 * self.inter
        } else {
            self.inter
        }
    }
}

/// Checks the element counts of packed expert tensors against `E`, `H`, `I` (and `2I` rows when gated), naming
/// the first tensor that does not fit.
pub(crate) fn check_lengths(
    experts: usize,
    hidden: usize,
    inter: usize,
    gated: bool,
    [w13, w2, b13, b2]: [(&str, Option<usize>); 4],
) -> Result<()> {
    let width = if gated { 2 * inter } else { inter };
    let want = [experts * width * hidden, experts * hidden * inter, experts * width, experts * hidden];
    for ((name, got), want) in [w13, w2, b13, b2].into_iter().zip(want) {
        if let Some(got) = got.filter(|&g| g != want) {
            return Err(Error::InvalidProblem(format!(
                "{name} has {got} elements, expected {want} for E = {experts}, H = {hidden}, I = {inter}"
            )));
        }
    }
    Ok(())
}

/// Per expert, `[rows, cols]` → `[cols, rows]`.
pub(crate) fn transpose_experts<T: Copy>(src: &[T], experts: usize, rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for e in 0..experts {
        let m = &src[e * rows * cols..(e + 1) * rows * cols];
        for c in 0..cols {
            out.extend((0..rows).map(|r| m[r * cols + c]));
        }
    }
    out
}
