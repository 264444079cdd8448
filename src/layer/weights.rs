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

    /// These experts with `shared`'s `m = I_s / I` groups appended as experts `E .. E + m`, in this format's
    /// gate/up order and storage, biases (if any) with zero rows for them: on the host, what
    /// [`ExpertWeights::upload_with_shared`] puts on the device (which copies no routed tensor on the host).
    ///
    /// # Errors
    /// As [`ExpertWeights::upload_with_shared`].
    pub fn with_shared_groups(&self, shared: &SharedExpert<T>) -> Result<PackedExperts<T>> {
        let m = shared_groups_beside(self, shared)?;
        let mut out = self.clone();
        for j in 0..m {
            let (w13, w2) = shared.group(self.inter, j, self.format.gate_up, self.format.storage);
            out.w13.extend(w13);
            out.w2.extend(w2);
        }
        let zeros = |b: &mut Option<Vec<f32>>, width: usize| {
            if let Some(b) = b {
                b.resize(b.len() + m * width, 0.0);
            }
        };
        zeros(&mut out.b13, self.w13_rows());
        zeros(&mut out.b2, self.hidden);
        out.experts += m;
        Ok(out)
    }
}

/// The groups `shared` takes beside the routed experts `p`, after checking that it fits them: SwiGLU routed
/// experts, the same hidden size, `I_s` a multiple of `I`, every tensor of the right length.
fn shared_groups_beside<T: Element>(p: &PackedExperts<T>, shared: &SharedExpert<T>) -> Result<usize> {
    if p.format.activation != Activation::SiluGated {
        return Err(Error::InvalidProblem(format!(
            "the shared expert is a SwiGLU MLP: its groups need routed experts of Activation::SiluGated, not {:?}",
            p.format.activation
        )));
    }
    if shared.hidden != p.hidden {
        return Err(Error::InvalidProblem(format!(
            "the shared expert's hidden size {} differs from the routed experts' {}",
            shared.hidden, p.hidden
        )));
    }
    shared.check()?;
    let m = shared.groups(p.inter)?;
    check_lengths(
        p.experts,
        p.hidden,
        p.inter,
        true,
        [
            ("w13 (gate_up_proj)", Some(p.w13.len())),
            ("w2 (down_proj)", Some(p.w2.len())),
            ("b13 (gate_up_proj_bias)", p.b13.as_ref().map(Vec::len)),
            ("b2 (down_proj_bias)", p.b2.as_ref().map(Vec::len)),
        ],
    )?;
    Ok(m)
}

/// A dense shared-expert SwiGLU MLP, `y_s = down · (silu(gate · x) ⊙ (up · x))`, added to every token's routed
/// sum with a weight `s_t`: DeepSeek-V3 / Kimi-K2's `shared_experts` (`s_t = 1`; `I_s = moe_intermediate_size ·
/// n_shared_experts`) and Qwen2-MoE's `shared_expert` (`s_t = sigmoid(x_t · shared_expert_gate)`; `I_s =
/// shared_expert_intermediate_size`). Tensors `[out, in]` as `nn.Linear` stores them; no biases (none of these
/// models has any).
///
/// On upload ([`ExpertWeights::upload_with_shared`]) it becomes `m = I_s / I` more experts of the routed width
/// `I`, appended after the routed ones: a SwiGLU MLP is separable along its intermediate dimension
/// (`down(act(gate x, up x)) = Σ_j down[:, j·I..(j+1)·I] · act(gate[j·I..] x, up[j·I..] x)`), so the layer's
/// grouped and fused GEMMs run it with no change, every token joining all `m` groups.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedExpert<T: Element> {
    pub hidden: usize,
    /// `I_s`, the MLP's intermediate size.
    pub inter: usize,
    /// `gate_proj` `[I_s, H]`.
    pub gate_proj: Vec<T>,
    /// `up_proj` `[I_s, H]`.
    pub up_proj: Vec<T>,
    /// `down_proj` `[H, I_s]`.
    pub down_proj: Vec<T>,
    /// Qwen2-MoE's `shared_expert_gate.weight` `[1, H]`, kept for the caller: the layer takes `s_t` per token
    /// ([`MoeLayer::forward_with_shared_weights`](super::MoeLayer::forward_with_shared_weights)) and does not
    /// compute it; [`reference::shared_gate_weights`](super::reference::shared_gate_weights) does on the host.
    pub expert_gate: Option<Vec<T>>,
}

impl<T: Element> SharedExpert<T> {
    /// # Errors
    /// [`Error::InvalidProblem`] naming the tensor whose length does not match `hidden` and `inter`, or zero sizes.
    pub fn new(
        hidden: usize,
        inter: usize,
        gate_proj: Vec<T>,
        up_proj: Vec<T>,
        down_proj: Vec<T>,
        expert_gate: Option<Vec<T>>,
    ) -> Result<Self> {
        let shared = SharedExpert { hidden, inter, gate_proj, up_proj, down_proj, expert_gate };
        shared.check()?;
        Ok(shared)
    }

    /// Checks the tensors' lengths against `hidden` and `inter` (the fields are public).
    fn check(&self) -> Result<()> {
        let (h, i) = (self.hidden, self.inter);
        if h == 0 || i == 0 {
            return Err(Error::InvalidProblem(format!("shared expert: H = {h}, I_s = {i}: both must be positive")));
        }
        let n = h.checked_mul(i);
        for (name, len, want) in [
            ("shared gate_proj", Some(self.gate_proj.len()), n),
            ("shared up_proj", Some(self.up_proj.len()), n),
            ("shared down_proj", Some(self.down_proj.len()), n),
            ("shared_expert_gate", self.expert_gate.as_ref().map(Vec::len), Some(h)),
        ] {
            if let Some(len) = len.filter(|&l| Some(l) != want) {
                return Err(Error::InvalidProblem(format!(
                    "{name} has {len} elements, expected {} for H = {h}, I_s = {i}",
                    want.map_or("more than usize".into(), |w| w.to_string())
                )));
            }
        }
        Ok(())
    }

    /// The number of routed-width groups the MLP splits into: `I_s / inter`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] unless `inter` divides `I_s` (the groups ride in GEMMs of the routed width).
    pub fn groups(&self, inter: usize) -> Result<usize> {
        if inter == 0 || self.inter % inter != 0 {
            return Err(Error::InvalidProblem(format!(
                "the shared expert's intermediate size I_s = {} is not a multiple of the routed experts' I = {inter}: \
                 its I_s / I groups must have the routed width",
                self.inter
            )));
        }
        Ok(self.inter / inter)
    }

    /// Groups `groups` (of width `inter`) of the MLP as an MLP of their own: gate and up rows
    /// `lo·I..hi·I`, down columns likewise. The groups of an MLP sum to it, so an expert-parallel deployment
    /// may split the shared expert between ranks, each rank holding some of its groups (see
    /// [`MoeLayer::with_expert_map`](super::MoeLayer::with_expert_map)).
    ///
    /// # Errors
    /// As [`Self::groups`]; [`Error::InvalidProblem`] for an empty range or one past the last group.
    pub fn slice_groups(&self, inter: usize, groups: std::ops::Range<usize>) -> Result<Self> {
        let m = self.groups(inter)?;
        if groups.start >= groups.end || groups.end > m {
            return Err(Error::InvalidProblem(format!(
                "shared expert groups {groups:?}: must be a non-empty range within its {m} groups"
            )));
        }
        self.check()?;
        let (h, is) = (self.hidden, self.inter);
        let (lo, hi) = (groups.start * inter, groups.end * inter);
        let rows = |w: &[T]| w[lo * h..hi * h].to_vec();
        let down = (0..h).flat_map(|o| self.down_proj[o * is + lo..o * is + hi].iter().copied()).collect();
        SharedExpert::new(h, hi - lo, rows(&self.gate_proj), rows(&self.up_proj), down, self.expert_gate.clone())
    }

    /// Group `j`'s `w13` (`[2I, H]`, gate and up rows as `gate_up` orders them) and `w2` (`[H, I]`), transposed
    /// for `Storage::InOut`.
    fn group(&self, inter: usize, j: usize, gate_up: GateUp, storage: Storage) -> (Vec<T>, Vec<T>) {
        let (h, is) = (self.hidden, self.inter);
        let row = |w: &[T], r: usize| w[(j * inter + r) * h..(j * inter + r + 1) * h].to_vec();
        let w13: Vec<T> = match gate_up {
            GateUp::Concatenated => (0..inter)
                .flat_map(|r| row(&self.gate_proj, r))
                .chain((0..inter).flat_map(|r| row(&self.up_proj, r)))
                .collect(),
            GateUp::Interleaved => {
                (0..inter).flat_map(|r| row(&self.gate_proj, r).into_iter().chain(row(&self.up_proj, r))).collect()
            }
        };
        let w2: Vec<T> =
            (0..h).flat_map(|o| self.down_proj[o * is + j * inter..o * is + (j + 1) * inter].iter().copied()).collect();
        match storage {
            Storage::OutIn => (w13, w2),
            Storage::InOut => (transpose_experts(&w13, 1, 2 * inter, h), transpose_experts(&w2, 1, h, inter)),
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
    /// Routed experts (local ones under expert parallelism).
    pub(crate) experts: usize,
    /// Shared-expert groups appended after them in every tensor (0 without a shared expert).
    pub(crate) shared_groups: usize,
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

    /// Uploads routed experts with a shared expert appended as `m = I_s / I` more experts of the routed width:
    /// every tensor on the device holds `E + m` experts (routed `0..E`, shared groups `E..E + m`), which the
    /// layer's GEMMs read like any other, and [`Self::shared_groups`] records `m`. Biases of the routed experts
    /// (if any) get zero rows for the shared groups.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: routed experts not SwiGLU (the shared MLP is), another
    /// hidden size, `I_s` not a multiple of `I`, tensor lengths (see [`SharedExpert::new`]); as [`Self::upload`].
    pub fn upload_with_shared(
        stream: &Arc<CudaStream>,
        p: &PackedExperts<T>,
        shared: &SharedExpert<T>,
    ) -> Result<Self> {
        let m = shared_groups_beside(p, shared)?;
        let (e, h, i, rows13) = (p.experts, p.hidden, p.inter, p.w13_rows());
        let (w13, w2) = match p.format.storage {
            Storage::OutIn => (std::borrow::Cow::Borrowed(&p.w13[..]), std::borrow::Cow::Borrowed(&p.w2[..])),
            Storage::InOut => (
                std::borrow::Cow::Owned(transpose_experts(&p.w13, e, h, rows13)),
                std::borrow::Cow::Owned(transpose_experts(&p.w2, e, i, h)),
            ),
        };
        let groups: Vec<(Vec<T>, Vec<T>)> =
            (0..m).map(|j| shared.group(i, j, p.format.gate_up, Storage::OutIn)).collect();
        let w13 =
            upload_parts(stream, (e + m) * rows13 * h, [&w13[..]].into_iter().chain(groups.iter().map(|g| &g.0[..])))?;
        let w2 = upload_parts(stream, (e + m) * h * i, [&w2[..]].into_iter().chain(groups.iter().map(|g| &g.1[..])))?;
        let zero_rows = |b: &Option<Vec<f32>>, width: usize| {
            b.as_ref().map(|b| upload_parts(stream, (e + m) * width, [&b[..]].into_iter())).transpose()
        };
        let mut w = Self::from_device(
            e + m,
            h,
            i,
            p.format.gate_up,
            p.format.activation,
            w13,
            w2,
            zero_rows(&p.b13, rows13)?,
            zero_rows(&p.b2, h)?,
        )?;
        w.experts = e;
        w.shared_groups = m;
        Ok(w)
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
        Ok(ExpertWeights { experts, shared_groups: 0, hidden, inter, gate_up, activation, w13, w2, b13, b2 })
    }

    /// Routed experts (without the shared-expert groups).
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// Shared-expert groups appended after the routed experts (`I_s / I`; 0 without a shared expert).
    pub fn shared_groups(&self) -> usize {
        self.shared_groups
    }
    /// Experts every tensor holds: the routed ones and the shared groups.
    pub(crate) fn groups(&self) -> usize {
        self.experts + self.shared_groups
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

/// A device buffer of `len` elements holding `parts` back to back from its start (zeros after them).
fn upload_parts<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + 'a>(
    stream: &Arc<CudaStream>,
    len: usize,
    parts: impl Iterator<Item = &'a [T]>,
) -> Result<CudaSlice<T>> {
    let mut d = stream.alloc_zeros::<T>(len)?;
    let mut at = 0;
    for part in parts {
        stream.memcpy_htod(part, &mut d.slice_mut(at..at + part.len()))?;
        at += part.len();
    }
    Ok(d)
}

/// How a layer's expert weights are stored, and so which GEMMs multiply them. More may come (FP4, MXFP8):
/// match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// In the layer's element type (bf16 or f16): [`ExpertWeights`], the bf16/f16 grouped and fused GEMMs.
    Dense,
    /// e4m3 with one f32 scale per 128 × 128 block (DeepSeek-V3's recipe), the activations quantised per token
    /// per 128 columns on the device before each GEMM: [`Fp8ExpertWeights`](super::Fp8ExpertWeights), the FP8
    /// blockwise grouped GEMM of the device's arch (SM90 or SM100), or the FP8 decode kernels. Runs the Batched,
    /// Grouped, Contiguous, Masked and (SM90 only) Fused backends (`Auto`: Batched or Grouped; Grouped on SM100).
    Fp8Block,
    /// e2m1 with one UE8M0 scale per 32 (gpt-oss's MXFP4), the activations quantised to MXFP8 on the device
    /// before each GEMM: [`Mxfp4ExpertWeights`](super::Mxfp4ExpertWeights), the block-scaled grouped GEMM of the
    /// device's arch (SM100 CUTLASS, or the portable kernel). Runs Grouped, Contiguous and Masked (`Auto`:
    /// Grouped).
    Mxfp4,
}

impl WeightFormat {
    pub const fn name(self) -> &'static str {
        match self {
            WeightFormat::Dense => "dense",
            WeightFormat::Fp8Block => "fp8 block 128x128",
            WeightFormat::Mxfp4 => "mxfp4 (e2m1, ue8m0 per 32)",
        }
    }

    /// The backends a layer over weights of this format runs (on an arch that has their kernels).
    pub const fn backends(self) -> super::Backends {
        match self {
            WeightFormat::Dense => super::Backends::ALL,
            WeightFormat::Fp8Block => super::Backends::FP8,
            WeightFormat::Mxfp4 => super::Backends::MX,
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Expert weights a [`MoeLayer`](super::MoeLayer) computes with, for activations of element type `T`:
/// [`ExpertWeights<T>`] (dense, any element type), [`Fp8ExpertWeights`](super::Fp8ExpertWeights) (block FP8,
/// bf16 activations) or [`Mxfp4ExpertWeights`](super::Mxfp4ExpertWeights) (MXFP4, bf16 activations). Sealed: the layer knows how to multiply each of them.
pub trait LayerWeights<T: Element>: sealed::Sealed<T> + std::fmt::Debug + Send + Sync {
    /// How the weights are stored.
    fn format(&self) -> WeightFormat {
        self.common().format
    }
    /// Routed experts (without the shared-expert groups).
    fn experts(&self) -> usize {
        self.common().experts
    }
    /// Shared-expert groups appended after the routed experts (0 without a shared expert).
    fn shared_groups(&self) -> usize {
        self.common().shared_groups
    }
    fn hidden(&self) -> usize {
        self.common().hidden
    }
    fn inter(&self) -> usize {
        self.common().inter
    }
    fn gate_up(&self) -> GateUp {
        self.common().gate_up
    }
    fn activation(&self) -> Activation {
        self.common().activation
    }
    /// The ordinal of the device the weights live on.
    fn device(&self) -> usize {
        self.common().device
    }
    /// Device bytes of the weights, their scales and biases.
    fn bytes(&self) -> usize {
        self.common().bytes
    }
}

/// The sealed half of [`LayerWeights`]: what the layer reads of each kind of weights.
pub(super) mod sealed {
    use cudarc::driver::CudaSlice;
    use half::bf16;

    use super::{Activation, ExpertWeights, GateUp, WeightFormat};
    use crate::dtype::Element;
    use crate::layer::{Fp8ExpertWeights, Mxfp4ExpertWeights};

    /// The facts every kind of weights has.
    #[derive(Clone, Copy, Debug)]
    pub struct Common<'a> {
        pub format: WeightFormat,
        pub experts: usize,
        pub shared_groups: usize,
        pub hidden: usize,
        pub inter: usize,
        pub gate_up: GateUp,
        pub activation: Activation,
        pub b13: Option<&'a CudaSlice<f32>>,
        pub b2: Option<&'a CudaSlice<f32>>,
        pub device: usize,
        pub bytes: usize,
    }

    impl Common<'_> {
        /// Experts every tensor holds: the routed ones and the shared groups.
        pub fn groups(&self) -> usize {
            self.experts + self.shared_groups
        }
    }

    /// The layer's element type is bf16, which is what the FP8 GEMM writes: a proof the layer can use on its
    /// `T` buffers, made only where `T` is bf16.
    #[derive(Clone, Copy)]
    pub struct IsBf16<T>(pub(crate) for<'x> fn(&'x mut CudaSlice<T>) -> &'x mut CudaSlice<bf16>);

    impl<T> std::fmt::Debug for IsBf16<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("IsBf16")
        }
    }

    impl<T> IsBf16<T> {
        pub fn cast<'x>(&self, s: &'x mut CudaSlice<T>) -> &'x mut CudaSlice<bf16> {
            (self.0)(s)
        }
    }

    /// The weights, by kind.
    #[derive(Debug)]
    pub enum Parts<'a, T: Element> {
        Dense(&'a ExpertWeights<T>),
        Fp8(&'a Fp8ExpertWeights, IsBf16<T>),
        Mx(&'a Mxfp4ExpertWeights, IsBf16<T>),
    }

    pub trait Sealed<T: Element> {
        fn common(&self) -> Common<'_>;
        fn parts(&self) -> Parts<'_, T>;
    }

    impl<T: Element> Sealed<T> for ExpertWeights<T> {
        fn common(&self) -> Common<'_> {
            Common {
                format: WeightFormat::Dense,
                experts: self.experts,
                shared_groups: self.shared_groups,
                hidden: self.hidden,
                inter: self.inter,
                gate_up: self.gate_up,
                activation: self.activation,
                b13: self.b13.as_ref(),
                b2: self.b2.as_ref(),
                device: self.device(),
                bytes: self.bytes(),
            }
        }
        fn parts(&self) -> Parts<'_, T> {
            Parts::Dense(self)
        }
    }
}

impl<T: Element> LayerWeights<T> for ExpertWeights<T> {}
