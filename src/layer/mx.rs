//! MXFP4 expert weights for the layer ([`Mxfp4ExpertWeights`]): gpt-oss's e2m1 experts with UE8M0 scales per
//! 32, kept in 4 bits on the device and multiplied by the block-scaled grouped GEMM of the device's arch.
//!
//! The layer's MXFP4 forward on the layout backends (Grouped, Contiguous, Masked), per pass:
//!
//! 1. the layout of the routed rows and the gather of `x` (bf16) into them (as for dense weights);
//! 2. `quantize_mxfp8_grouped`: the gathered rows to MXFP8 (e4m3, one UE8M0 scale per 32, rounded up),
//!    zero-padded from `H` to `K1 = H` rounded up to 128, the scales in each group's 128 × 4 atoms;
//! 3. GEMM1, MXFP8 × MXFP4 over the layout's groups: `d1 = x_q · w13ᵀ` in bf16, `N = 2I` (gate and up rows as the
//!    checkpoint has them: gpt-oss interleaves);
//! 4. the activation (the dense path's kernel, with `b13`);
//! 5. `h` to MXFP8 the same way, padded from `I` to `K2`;
//! 6. GEMM2: `d2 = h_q · w2ᵀ` in bf16 over `N2 = H` rounded up to 128 (w2's pad rows are zero: their
//!    columns of `d2` are 0 and never read);
//! 7. the combine (the dense path's kernel: `b2`, router weights, the sum over k in f32), reading `H` columns of
//!    `d2`'s `N2`-wide rows.
//!
//! The GEMM ([`LayerGemm`](super::LayerGemm)): on SM100 CUTLASS's MXF8F6F4 kernel
//! ([`GroupedGemmMx`](crate::kernels::grouped_mx::GroupedGemmMx), compiled and SASS-checked, never run: no SM100
//! GPU exists to this project); on SM90 the portable kernel over the same operands
//! ([`GroupedGemmMxPortable`](crate::kernels::grouped_mx_portable::GroupedGemmMxPortable)), which is what runs
//! on the H200 and what the layer's GPU tests check against [`crate::reference::moe_forward_mx`]. The padding
//! (zero nibbles, neutral scales, zero columns of `x` and `h`) is exact.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::fp8::same;
use super::weights::sealed::{Common, IsBf16, Parts, Sealed};
use super::weights::{LayerWeights, WeightFormat};
use crate::error::{Error, Result};
use crate::experts::GptOssMxfp4Experts;
use crate::experts::{Activation, ExpertDims, GateUp};
use crate::kernels::grouped_mx::MX_K_MULTIPLE;
use crate::quant::{Mxfp4, Mxfp4Weights, Ue8m0, MX_BLOCK};

/// `v` rounded up to the MX GEMMs' multiple of 128 (their K, and GEMM2's N).
pub(crate) const fn mx_padded(v: usize) -> usize {
    v.div_ceil(MX_K_MULTIPLE) * MX_K_MULTIPLE
}

/// MXFP4 expert weights on the device: `w13` e2m1 `[E, 2I, K1]` and `w2` `[E, N2, K2]` (`[out, in]`, `K1`, `N2`
/// and `K2` the padded `H`, `H` and `I`), each with its UE8M0 scales per 32 in SM100's 128 × 4 atoms, the f32
/// biases `b13 [E, 2I]` (gate/up ordered as `w13`'s rows) and `b2 [E, H]`, and the activation.
///
/// Constraints (checked when made, each named in the error): a gated activation; `H` and `I` multiples of 32
/// (whole scale blocks); `2I` a multiple of 128 (GEMM1's N in whole MMA tiles).
#[derive(Debug)]
pub struct Mxfp4ExpertWeights {
    /// No shared groups.
    pub(crate) dims: ExpertDims,
    pub(crate) w13: Mxfp4Weights,
    pub(crate) w2: Mxfp4Weights,
    pub(crate) b13: Option<CudaSlice<f32>>,
    pub(crate) b2: Option<CudaSlice<f32>>,
}

/// Checks the shape MXFP4 experts take, naming the constraint.
pub(crate) fn check_mx_shape(hidden: usize, inter: usize) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidProblem(s));
    for (name, v) in [("H", hidden), ("I", inter)] {
        if v == 0 || v % MX_BLOCK != 0 {
            return bad(format!(
                "MXFP4 experts: {name} = {v} is not a positive multiple of {MX_BLOCK} (whole scale blocks)"
            ));
        }
    }
    if (2 * inter) % MX_K_MULTIPLE != 0 {
        return bad(format!(
            "MXFP4 experts: GEMM1's N = 2I = {} is not a multiple of {MX_K_MULTIPLE} (whole MMA tiles; I a multiple of 64)",
            2 * inter
        ));
    }
    Ok(())
}

/// Expert `e`'s rows `[e · rows, (e + 1) · rows)` of `m` (logical columns), followed by `rows_out − rows` zero rows,
/// stored in rows of `k_out` columns: zero nibbles and neutral scales in every pad, so the result is exact.
fn expert_rows(m: &Mxfp4, e: usize, rows: usize, rows_out: usize, k_out: usize) -> Result<Mxfp4> {
    let (k, kp) = (m.k(), m.k_padded());
    let (row_bytes, row_scales) = (kp / 2, kp / MX_BLOCK);
    let mut data = Vec::with_capacity(rows_out * k / 2);
    let mut scales = Vec::with_capacity(rows_out * k / MX_BLOCK);
    for r in e * rows..(e + 1) * rows {
        data.extend_from_slice(&m.data()[r * row_bytes..r * row_bytes + k / 2]);
        scales.extend_from_slice(&m.scales()[r * row_scales..r * row_scales + k / MX_BLOCK]);
    }
    data.resize(rows_out * k / 2, 0);
    scales.resize(rows_out * k / MX_BLOCK, Ue8m0::ONE);
    Mxfp4::from_parts(rows_out, k, data, scales)?.pad_k(k_out)
}

impl Mxfp4ExpertWeights {
    /// Uploads one layer of gpt-oss's MXFP4 experts ([`crate::checkpoint::Checkpoint::pack_gpt_oss_mxfp4`]):
    /// interleaved gate/up, the clamped SwiGLU, the biases; `K` and GEMM2's `N` zero-padded to whole 128s.
    ///
    /// # Errors
    /// As [`Self::upload`].
    pub fn upload_gpt_oss(stream: &Arc<CudaStream>, e: &GptOssMxfp4Experts) -> Result<Self> {
        let biases = (Some(e.gate_up_bias()), Some(e.down_bias()));
        let d = e.dims;
        Self::upload(stream, (d.experts, d.hidden, d.inter), d.gate_up, d.activation, e.gate_up(), e.down(), biases)
    }

    /// Uploads MXFP4 experts of `(E, H, I)`: `gate_up` `[E · 2I, H]` (each expert's `2I` rows in `gate_up`'s
    /// order), `down` `[E · H, I]`, both `[out, in]` (stored padded or not), optional f32 biases `[E, 2I]`,
    /// `[E, H]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint (see the type) or the tensor whose shape does not fit;
    /// driver errors of the copies.
    #[allow(clippy::too_many_arguments)]
    pub fn upload(
        stream: &Arc<CudaStream>,
        (experts, hidden, inter): (usize, usize, usize),
        gate_up: GateUp,
        activation: Activation,
        w13: &Mxfp4,
        w2: &Mxfp4,
        (b13, b2): (Option<&[f32]>, Option<&[f32]>),
    ) -> Result<Self> {
        if !activation.gated() {
            return Err(Error::InvalidProblem(format!(
                "MXFP4 experts: activation {activation:?} is not gated, but w13 holds gate and up ([E, 2I, H])"
            )));
        }
        check_mx_shape(hidden, inter)?;
        let (r13, k1, n2, k2) = (2 * inter, mx_padded(hidden), mx_padded(hidden), mx_padded(inter));
        for (name, m, rows, k) in
            [("w13 (gate_up_proj)", w13, experts * r13, hidden), ("w2 (down_proj)", w2, experts * hidden, inter)]
        {
            if (m.rows(), m.k()) != (rows, k) {
                return Err(Error::InvalidProblem(format!(
                    "MXFP4 experts: {name} is [{}, {}], expected [{rows}, {k}] for E = {experts}, H = {hidden}, I = {inter}",
                    m.rows(),
                    m.k()
                )));
            }
        }
        for (name, b, want) in [("b13", b13, experts * r13), ("b2", b2, experts * hidden)] {
            if let Some(len) = b.map(<[f32]>::len).filter(|&l| l != want) {
                return Err(Error::InvalidProblem(format!(
                    "MXFP4 experts: {name} has {len} elements, expected {want} for E = {experts}, H = {hidden}, I = {inter}"
                )));
            }
        }
        let per_expert = |m: &Mxfp4, rows: usize, rows_out: usize, k_out: usize| -> Result<Mxfp4Weights> {
            let parts = (0..experts).map(|e| expert_rows(m, e, rows, rows_out, k_out)).collect::<Result<Vec<_>>>()?;
            Mxfp4Weights::from_host(stream, &parts)
        };
        Ok(Mxfp4ExpertWeights {
            dims: ExpertDims::new((experts, hidden, inter), gate_up, activation),
            w13: per_expert(w13, r13, r13, k1)?,
            w2: per_expert(w2, hidden, n2, k2)?,
            b13: b13.map(|b| stream.clone_htod(b)).transpose()?,
            b2: b2.map(|b| stream.clone_htod(b)).transpose()?,
        })
    }

    /// Whether experts of `[hidden, inter]` fit the MXFP4 layer (see the type's constraints).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint.
    pub fn check_shape(hidden: usize, inter: usize) -> Result<()> {
        check_mx_shape(hidden, inter)
    }

    getters!(in dims; experts: usize, hidden: usize, inter: usize);
    /// `w13` on the device: `[E, 2I, K1]`.
    pub fn w13(&self) -> &Mxfp4Weights {
        &self.w13
    }
    /// `w2` on the device: `[E, N2, K2]`.
    pub fn w2(&self) -> &Mxfp4Weights {
        &self.w2
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.w13.q().context().ordinal()
    }
    /// Device bytes of the weights, their scale atoms and the biases.
    pub fn bytes(&self) -> usize {
        self.w13.bytes()
            + self.w2.bytes()
            + self.b13.as_ref().map_or(0, |b| b.num_bytes())
            + self.b2.as_ref().map_or(0, |b| b.num_bytes())
    }
}

bf16_layer_weights!(Mxfp4ExpertWeights, WeightFormat::Mxfp4, Mx, biases b13, b2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mx_shapes_name_their_constraint() {
        assert!(check_mx_shape(2880, 2880).is_ok());
        let m = check_mx_shape(2880, 2848).unwrap_err().to_string();
        assert!(m.contains("2I = 5696") && m.contains("multiple of 64"), "{m}");
        let m = check_mx_shape(2890, 2880).unwrap_err().to_string();
        assert!(m.contains("H = 2890") && m.contains("multiple of 32"), "{m}");
        assert_eq!((mx_padded(2880), mx_padded(2944), mx_padded(1)), (2944, 2944, 128));
    }

    fn device(name: &str, major: i32, sm_count: i32) -> crate::device::DeviceInfo {
        crate::device::DeviceInfo::described(name, (major, 0), sm_count)
    }

    /// gpt-oss-120b's experts plan the arch's MX GEMM over padded extents (GEMM1 `[5760, 2944]`, GEMM2 `[2944,
    /// 2944]`), the scratch's `d2` rows 2944 wide and its MXFP8 rows counted; the SM100 plan's workspace is the
    /// CUTLASS query's, the portable one needs none; Auto runs Grouped; other backends and f16 are refused.
    #[test]
    fn gpt_oss_plans_the_arch_mx_gemm_over_padded_extents() {
        use crate::dtype::DType;
        use crate::layer::plans::mx_plan;
        use crate::layer::{Backend, Backends, LayerGemm, LayerShape, LayerSizing};
        let s = LayerShape {
            experts: 128,
            global_experts: 128,
            top_k: 4,
            shared_groups: 0,
            hidden: 2880,
            inter: 2880,
            gated: true,
        };
        let size = |dev: &crate::device::DeviceInfo, dtype: DType, b: Backend, set: Option<Backends>| {
            LayerSizing::for_device(dev, s, dtype, WeightFormat::Mxfp4, 256, b, set, None, None, false, None)
        };
        for (dev, gemm) in [
            (device("NVIDIA B200", 10, 148), LayerGemm::Sm100Mxf8f4),
            (device("NVIDIA H200", 9, 132), LayerGemm::PortableMxf8f4),
        ] {
            let z = size(&dev, DType::BF16, Backend::Auto, None).unwrap();
            assert_eq!((z.gemm(), z.backends()), (gemm, Backends::of(Backend::Grouped)), "{}", dev.name);
            let extents: Vec<(usize, usize)> = z.gemms.iter().map(|g| (g.n, g.k)).collect();
            assert_eq!(extents, [(5760, 2944), (2944, 2944)], "{}", dev.name);
            let n = z.needs();
            assert_eq!((n.d2_cols, n.a_mx_rows, n.h_mx_rows, n.a_fp8_rows), (2944, 1024, 1024, 0), "{}", dev.name);
            let mut workspace = 0;
            for spec in &z.gemms {
                let plan = mx_plan(&dev, spec).unwrap();
                assert_eq!(!plan.is_portable(), gemm == LayerGemm::Sm100Mxf8f4);
                assert_eq!(plan.max_rows(), spec.max_rows);
                workspace = workspace.max(plan.workspace_bytes());
            }
            assert_eq!(n.workspace_bytes, workspace, "{}: sized vs planned workspace", dev.name);
            assert_eq!(workspace > 0, gemm == LayerGemm::Sm100Mxf8f4);
            let f = n.footprint();
            assert!(f.parts.iter().any(|(name, b)| name.starts_with("a mxfp8") && *b > 1024 * 2944), "{f}");
            let all = Backends::MX;
            assert_eq!(size(&dev, DType::BF16, Backend::Masked, Some(all)).unwrap().backends(), all);
            for b in [Backend::Batched, Backend::Fused, Backend::Eager] {
                let e = size(&dev, DType::BF16, b, None).unwrap_err().to_string();
                assert!(e.contains("MXFP4") && e.contains(b.name()), "{b}: {e}");
            }
            let e = size(&dev, DType::F16, Backend::Grouped, None).unwrap_err().to_string();
            assert!(e.contains("bf16 activations"), "{e}");
        }
    }

    /// An expert's rows come out of the stacked tensor with its own scales, then the zero rows and pad columns:
    /// dequantised, the rows are the expert's, the rest zeros (a wrong row offset or scale stride shows here).
    #[test]
    fn expert_rows_take_the_experts_rows_and_pad_exactly() {
        let (e, rows, k) = (3usize, 4usize, 64usize);
        let w: Vec<f32> =
            (0..e * rows * k).map(|v| ((v * 7 % 23) as f32 - 11.0) * 0.25 * (1 + v / 97) as f32).collect();
        let m = Mxfp4::quantize(&w, e * rows, k).unwrap();
        let full = m.dequantize();
        let got = expert_rows(&m, 1, rows, 6, 128).unwrap();
        assert_eq!((got.rows(), got.k(), got.k_padded()), (6, k, 128));
        let d = got.dequantize_padded();
        for r in 0..6 {
            for c in 0..128 {
                let want = if r < rows && c < k { full[(rows + r) * k + c] } else { 0.0 };
                assert_eq!(d[r * 128 + c], want, "row {r} col {c}");
            }
        }
        // Re-padding an already padded matrix reads its logical columns.
        let again = expert_rows(&got, 0, 6, 6, 256).unwrap();
        assert_eq!(again.dequantize(), got.dequantize());
    }
}
