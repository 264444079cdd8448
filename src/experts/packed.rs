//! Host tensors of 16-bit experts ([`PackedExperts`]) and of a dense shared expert ([`SharedExpert`]), packed
//! and validated: what a checkpoint yields and a layer uploads.

use super::format::{check_lengths, transpose_experts};
use super::{Activation, ExpertFormat, GateUp, Storage};
use crate::dtype::Element;
use crate::error::{Error, Result};

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
    /// [`crate::ExpertWeights::upload_with_shared`] puts on the device (which copies no routed tensor on the
    /// host).
    ///
    /// # Errors
    /// As [`crate::ExpertWeights::upload_with_shared`].
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
pub(crate) fn shared_groups_beside<T: Element>(p: &PackedExperts<T>, shared: &SharedExpert<T>) -> Result<usize> {
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
/// On upload ([`crate::ExpertWeights::upload_with_shared`]) it becomes `m = I_s / I` more experts of the routed
/// width `I`, appended after the routed ones: a SwiGLU MLP is separable along its intermediate dimension
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
    /// ([`MoeLayer::forward_with_shared_weights`](crate::layer::MoeLayer::forward_with_shared_weights)) and does not
    /// compute it; [`reference::shared_gate_weights`](crate::reference::shared_gate_weights) does on the host.
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
    /// [`MoeLayer::with_expert_map`](crate::layer::MoeLayer::with_expert_map)).
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
    pub(crate) fn group(&self, inter: usize, j: usize, gate_up: GateUp, storage: Storage) -> (Vec<T>, Vec<T>) {
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
