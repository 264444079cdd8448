//! Packed expert weights with the layout flags real checkpoints need.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::dtype::Element;
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

/// Checks the element counts of packed expert tensors against `E`, `H`, `I` (and `2I` rows when gated), naming
/// the first tensor that does not fit.
fn check_lengths(
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

/// Host tensors of all experts, packed and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedExperts<T: Element> {
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub format: ExpertFormat,
    /// `[E, 2I, H]` (gated) or `[E, I, H]` for `Storage::OutIn`; `[E, H, 2I]` / `[E, H, I]` for `InOut`.
    pub w13: Vec<T>,
    /// `[E, H, I]` for `OutIn`, `[E, I, H]` for `InOut`.
    pub w2: Vec<T>,
    /// `[E, 2I]` (or `[E, I]`), in the same gate/up order as `w13`'s output rows.
    pub b13: Option<Vec<f32>>,
    /// `[E, H]`.
    pub b2: Option<Vec<f32>>,
}

impl<T: Element> PackedExperts<T> {
    /// # Errors
    /// [`Error::InvalidProblem`] naming the tensor whose length does not match `experts`, `hidden`, `inter`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        experts: usize,
        hidden: usize,
        inter: usize,
        format: ExpertFormat,
        w13: Vec<T>,
        w2: Vec<T>,
        b13: Option<Vec<f32>>,
        b2: Option<Vec<f32>>,
    ) -> Result<Self> {
        if experts == 0 || hidden == 0 || inter == 0 {
            return Err(Error::InvalidProblem(format!(
                "E = {experts}, H = {hidden}, I = {inter}: all must be positive"
            )));
        }
        check_lengths(
            experts,
            hidden,
            inter,
            format.activation.gated(),
            [
                ("w13 (gate_up_proj)", Some(w13.len())),
                ("w2 (down_proj)", Some(w2.len())),
                ("b13 (gate_up_proj_bias)", b13.as_ref().map(Vec::len)),
                ("b2 (down_proj_bias)", b2.as_ref().map(Vec::len)),
            ],
        )?;
        Ok(PackedExperts { experts, hidden, inter, format, w13, w2, b13, b2 })
    }

    /// `w13` rows per expert: `2I` gated, `I` otherwise.
    pub fn w13_rows(&self) -> usize {
        if self.format.activation.gated() {
            2 * self.inter
        } else {
            self.inter
        }
    }
}

/// Per expert, `[rows, cols]` → `[cols, rows]`.
fn transpose_experts<T: Copy>(src: &[T], experts: usize, rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for e in 0..experts {
        let m = &src[e * rows * cols..(e + 1) * rows * cols];
        for c in 0..cols {
            out.extend((0..rows).map(|r| m[r * cols + c]));
        }
    }
    out
}

/// Expert weights on the device, in the `[out, in]` layout the kernels read.
#[derive(Debug)]
pub struct ExpertWeights<T: Element> {
    pub(crate) experts: usize,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
    pub(crate) gate_up: GateUp,
    pub(crate) activation: Activation,
    pub(crate) w13: CudaSlice<T>,
    pub(crate) w2: CudaSlice<T>,
    pub(crate) b13: Option<CudaSlice<f32>>,
    pub(crate) b2: Option<CudaSlice<f32>>,
}

impl<T: Element> ExpertWeights<T> {
    /// Uploads packed experts (transposing `InOut` storage once). Wrap the result in an `Arc` to share it
    /// between layer plans.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] unless `H` and `I` are multiples of 8 (16-byte rows for TMA); driver errors.
    pub fn upload(stream: &Arc<CudaStream>, p: &PackedExperts<T>) -> Result<Self> {
        let rows13 = p.w13_rows();
        let (w13, w2) = match p.format.storage {
            Storage::OutIn => (stream.clone_htod(&p.w13)?, stream.clone_htod(&p.w2)?),
            Storage::InOut => (
                stream.clone_htod(&transpose_experts(&p.w13, p.experts, p.hidden, rows13))?,
                stream.clone_htod(&transpose_experts(&p.w2, p.experts, p.inter, p.hidden))?,
            ),
        };
        Self::from_device(
            p.experts,
            p.hidden,
            p.inter,
            p.format.gate_up,
            p.format.activation,
            w13,
            w2,
            p.b13.as_ref().map(|b| stream.clone_htod(b)).transpose()?,
            p.b2.as_ref().map(|b| stream.clone_htod(b)).transpose()?,
        )
    }

    /// Wraps weights already on the device, in the kernels' `[out, in]` layout: `w13 [E, 2I or I, H]`,
    /// `w2 [E, H, I]`, biases f32 `[E, 2I or I]` and `[E, H]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the buffer whose length does not match, or `H`, `I` not multiples of 8.
    #[allow(clippy::too_many_arguments)]
    pub fn from_device(
        experts: usize,
        hidden: usize,
        inter: usize,
        gate_up: GateUp,
        activation: Activation,
        w13: CudaSlice<T>,
        w2: CudaSlice<T>,
        b13: Option<CudaSlice<f32>>,
        b2: Option<CudaSlice<f32>>,
    ) -> Result<Self> {
        for (name, v) in [("hidden", hidden), ("inter", inter)] {
            if v == 0 || v % 8 != 0 {
                return Err(Error::InvalidProblem(format!(
                    "{name} = {v} is not a positive multiple of 8: rows of 16-bit elements must be 16-byte aligned for TMA"
                )));
            }
        }
        check_lengths(
            experts,
            hidden,
            inter,
            activation.gated(),
            [
                ("w13", Some(w13.len())),
                ("w2", Some(w2.len())),
                ("b13", b13.as_ref().map(CudaSlice::len)),
                ("b2", b2.as_ref().map(CudaSlice::len)),
            ],
        )?;
        Ok(ExpertWeights { experts, hidden, inter, gate_up, activation, w13, w2, b13, b2 })
    }

    pub fn experts(&self) -> usize {
        self.experts
    }
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    pub fn inter(&self) -> usize {
        self.inter
    }
    pub fn gate_up(&self) -> GateUp {
        self.gate_up
    }
    pub fn activation(&self) -> Activation {
        self.activation
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.w13.context().ordinal()
    }
    /// Device bytes of the weights and biases.
    pub fn bytes(&self) -> usize {
        self.w13.num_bytes()
            + self.w2.num_bytes()
            + self.b13.as_ref().map_or(0, |b| b.num_bytes())
            + self.b2.as_ref().map_or(0, |b| b.num_bytes())
    }
    pub(crate) fn w13_rows(&self) -> usize {
        if self.activation.gated() {
            2 * self.inter
        } else {
            self.inter
        }
    }
}
