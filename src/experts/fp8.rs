//! Block-FP8 experts on the host: all experts of a layer in one value ([`PackedFp8Experts`]), and a block-FP8
//! shared expert ([`SharedFp8Expert`]) appended to them as `m = I_s / I` groups of the routed width, the FP8 form
//! of what [`PackedExperts::with_shared_groups`](super::PackedExperts::with_shared_groups) does for 16-bit
//! weights.
//!
//! Group `j` of a shared expert is gate rows `j·I .. (j+1)·I` stacked on the same up rows (its w13 `[2I, H]`) and
//! down columns `j·I .. (j+1)·I` (its w2 `[H, I]`). With `I` a multiple of the block, every group keeps the
//! checkpoint's own scale blocks: nothing is requantised. The layer then sums the groups' GEMM2 outputs (each
//! rounded to bf16) where the full-width MLP would round once, and quantises the activation per 128 columns of
//! each group, which are the full-width MLP's own 128-column groups.

use crate::error::{Error, Result};
use crate::quant::{BlockFp8, BlockShape, GroupQuant, ScaleFormat, ScaleRounding, Scales, DEEPSEEK_EPS, F8E4M3};

/// Activations quantised with amax floored at `eps`, scales rounded as `format` stores the weights'.
pub(crate) fn activation_quant(eps: f32, format: ScaleFormat) -> GroupQuant {
    let rounding = match format {
        ScaleFormat::Ue8m0 => ScaleRounding::Ue8m0Ceil,
        _ => ScaleRounding::Exact,
    };
    GroupQuant::new(eps, rounding).expect("eps validated when the config was made")
}

/// The block-FP8 experts of one layer in one value: `w13 [E, 2I, H]` (gate rows, then up rows) and `w2 [E, H, I]`
/// as e4m3, each with its scale grids `[E, ceil(2I / bn), ceil(H / bk)]` and `[E, ceil(H / bn), ceil(I / bk)]`
/// (row-major, DeepSeek's `weight_scale_inv` per expert), all in one [`ScaleFormat`].
#[derive(Clone, Debug, PartialEq)]
pub struct PackedFp8Experts {
    experts: usize,
    hidden: usize,
    inter: usize,
    block: BlockShape,
    w13: Vec<F8E4M3>,
    w13_scales: Scales,
    w2: Vec<F8E4M3>,
    w2_scales: Scales,
    /// The activations' amax floor of the checkpoint's family ([`crate::checkpoint::Fp8Config::activation_eps`]).
    act_eps: f32,
}

fn concat_scales(parts: &[&Scales]) -> Result<Scales> {
    let mut f = Vec::new();
    let mut u = Vec::new();
    for s in parts {
        match s {
            Scales::F32(v) => f.extend_from_slice(v),
            Scales::Ue8m0(v) => u.extend_from_slice(v),
        }
    }
    match (f.is_empty(), u.is_empty()) {
        (_, true) => Ok(Scales::F32(f)),
        (true, false) => Ok(Scales::Ue8m0(u)),
        _ => Err(Error::InvalidProblem("experts with both F32 and UE8M0 scales".into())),
    }
}

impl PackedFp8Experts {
    /// Packs per-expert `(w13 [2I, H], w2 [H, I])` pairs, activations to be quantised with DeepSeek's eps
    /// ([`Self::with_activation_eps`] sets another).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts, or experts whose shapes, blocks or scale formats differ.
    pub fn from_experts(per_expert: Vec<(BlockFp8, BlockFp8)>) -> Result<PackedFp8Experts> {
        let Some((w13, w2)) = per_expert.first() else {
            return Err(Error::InvalidProblem("experts = 0".into()));
        };
        let (two_i, h, block, format) = (w13.rows(), w13.cols(), w13.block(), w13.scales().format());
        if two_i % 2 != 0 || (w2.rows(), w2.cols()) != (h, two_i / 2) {
            return Err(Error::InvalidProblem(format!(
                "expert 0: w13 [{two_i}, {h}] and w2 [{}, {}] are not [2I, H] and [H, I]",
                w2.rows(),
                w2.cols()
            )));
        }
        for (e, (a, b)) in per_expert.iter().enumerate() {
            let same =
                |m: &BlockFp8, r, c| (m.rows(), m.cols(), m.block(), m.scales().format()) == (r, c, block, format);
            if !same(a, two_i, h) || !same(b, h, two_i / 2) {
                return Err(Error::InvalidProblem(format!(
                    "expert {e}: w13 [{}, {}] {:?} {:?} and w2 [{}, {}] {:?} {:?} differ from expert 0's",
                    a.rows(),
                    a.cols(),
                    a.block(),
                    a.scales().format(),
                    b.rows(),
                    b.cols(),
                    b.block(),
                    b.scales().format()
                )));
            }
        }
        let w13_scales = concat_scales(&per_expert.iter().map(|(a, _)| a.scales()).collect::<Vec<_>>())?;
        let w2_scales = concat_scales(&per_expert.iter().map(|(_, b)| b.scales()).collect::<Vec<_>>())?;
        let experts = per_expert.len();
        let (mut q13, mut q2) = (Vec::new(), Vec::new());
        for (a, b) in &per_expert {
            q13.extend_from_slice(a.q());
            q2.extend_from_slice(b.q());
        }
        let (inter, act_eps) = (two_i / 2, DEEPSEEK_EPS);
        Ok(PackedFp8Experts { experts, hidden: h, inter, block, w13: q13, w13_scales, w2: q2, w2_scales, act_eps })
    }

    /// The same experts with activations' amax floored at `eps` (what a layer over them quantises with).
    ///
    /// # Errors
    /// As [`GroupQuant::new`].
    pub fn with_activation_eps(self, eps: f32) -> Result<PackedFp8Experts> {
        GroupQuant::new(eps, ScaleRounding::Exact)?;
        Ok(PackedFp8Experts { act_eps: eps, ..self })
    }

    /// How a layer over these experts quantises its activations: the checkpoint family's eps
    /// ([`crate::checkpoint::Fp8Config::activation_eps`]), scales rounded up to powers of two for UE8M0 weight
    /// scales.
    pub fn activation_quant(&self) -> GroupQuant {
        activation_quant(self.act_eps, self.scale_format())
    }

    getters!(experts: usize, hidden: usize, inter: usize);
    pub fn block(&self) -> BlockShape {
        self.block
    }
    pub fn scale_format(&self) -> ScaleFormat {
        self.w13_scales.format()
    }
    /// e4m3 `[E, 2I, H]`, gate rows then up rows per expert.
    pub fn w13(&self) -> &[F8E4M3] {
        &self.w13
    }
    /// `[E, ceil(2I / bn), ceil(H / bk)]`.
    pub fn w13_scales(&self) -> &Scales {
        &self.w13_scales
    }
    /// e4m3 `[E, H, I]`.
    pub fn w2(&self) -> &[F8E4M3] {
        &self.w2
    }
    /// `[E, ceil(H / bn), ceil(I / bk)]`.
    pub fn w2_scales(&self) -> &Scales {
        &self.w2_scales
    }
    /// The scale grid of one expert's w13 and w2: `(rows, cols)` each.
    pub fn grids(&self) -> ((usize, usize), (usize, usize)) {
        let g = |r: usize, c: usize| (r.div_ceil(self.block.rows), c.div_ceil(self.block.cols));
        (g(2 * self.inter, self.hidden), g(self.hidden, self.inter))
    }

    /// Expert `e`'s `(w13, w2)` as block-FP8 matrices.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `e >= experts`.
    pub fn expert(&self, e: usize) -> Result<(BlockFp8, BlockFp8)> {
        if e >= self.experts {
            return Err(Error::InvalidProblem(format!("expert {e} of {}", self.experts)));
        }
        let ((r13, c13), (r2, c2)) = self.grids();
        let (h, i) = (self.hidden, self.inter);
        let pick = |s: &Scales, n: usize| match s {
            Scales::F32(v) => Scales::F32(v[e * n..(e + 1) * n].to_vec()),
            Scales::Ue8m0(v) => Scales::Ue8m0(v[e * n..(e + 1) * n].to_vec()),
        };
        let w13 = BlockFp8::from_parts(
            2 * i,
            h,
            self.block,
            self.w13[e * 2 * i * h..(e + 1) * 2 * i * h].to_vec(),
            pick(&self.w13_scales, r13 * c13),
        )?;
        let w2 = BlockFp8::from_parts(
            h,
            i,
            self.block,
            self.w2[e * h * i..(e + 1) * h * i].to_vec(),
            pick(&self.w2_scales, r2 * c2),
        )?;
        Ok((w13, w2))
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
