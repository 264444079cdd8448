//! Per-token, per-128-column FP8 quantisation of activations (DeepSeek-V3's 1 × 128 activation blocks): the
//! options, the rules and the exact host reference of the device kernels ([`super::device`]).
//!
//! For each row and each group of [`ACT_GROUP`] columns (the last group of a row may be partial: it covers the
//! columns it has):
//!
//! * `amax = max |x|` over the group's **finite** elements (NaN and ±∞ do not take part);
//! * `scale = max(amax, eps) / 448` (IEEE f32 division); with [`ScaleRounding::Ue8m0Ceil`] rounded **up** to a
//!   power of two, [`Ue8m0::from_f32_ceil`] (DeepGEMM's `ceil_to_ue8m0`: exponent + (mantissa ≠ 0)), so that
//!   `|x| / scale <= 448` still holds and the scale is exact as a UE8M0 byte;
//! * `q = e4m3(x / scale)` (IEEE f32 division, then round to nearest even, saturating to ±448);
//! * a NaN or ±∞ element becomes the e4m3 NaN with the element's sign (`0x7F` / `0xFF`; E4M3FN has no
//!   infinity, and saturating an infinity to ±448 would hide it): the device kernels also set
//!   [`crate::status::bits::NONFINITE_INPUT`].
//!
//! `eps` ([`GroupQuant::new`]): [`DEEPSEEK_EPS`] = 1e-4 is the clamp of DeepSeek's `per_token_cast_to_fp8`
//! (DeepGEMM `deep_gemm/utils/math.py`, and DeepSeek-V3's `inference/kernel.py` `act_quant`), the default and the
//! one to use with DeepSeek checkpoints; [`VLLM_EPS`] = 1e-10 is the default of vLLM's `per_token_group_quant_fp8`.
//! An all-zero group gets `scale = eps / 448` and zeros.
//!
//! DeepSeek's torch code computes `x · (448 / amax)` rather than `x / (amax / 448)`; the two can differ by one
//! e4m3 step in rare rounding cases for f32 scales (never for UE8M0 scales, whose reciprocal is exact). We divide,
//! as [`super::BlockFp8::quantize`] does, so `q · scale` is the correctly rounded approximation of `x`.

use super::{Ue8m0, E4M3_MAX, F8E4M3};
use crate::error::{Error, Result};

/// Columns per activation scale.
pub const ACT_GROUP: usize = 128;

/// The amax floor of DeepSeek's `per_token_cast_to_fp8` (`amax.clamp(1e-4)`): the default.
pub const DEEPSEEK_EPS: f32 = 1e-4;

/// The default `eps` of vLLM's `per_token_group_quant_fp8`.
pub const VLLM_EPS: f32 = 1e-10;

/// How an activation scale is rounded. More may come: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScaleRounding {
    /// `max(amax, eps) / 448` as computed (DeepSeek-V3).
    #[default]
    Exact,
    /// Rounded up to a power of two (DeepSeek-V3.1's `scale_fmt: ue8m0`, Blackwell MX scales).
    Ue8m0Ceil,
}

/// Options of the per-token-group quantisation: the amax floor `eps` and the scale rounding. Validated when made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupQuant {
    eps: f32,
    rounding: ScaleRounding,
}

impl Default for GroupQuant {
    fn default() -> Self {
        GroupQuant::DEEPSEEK
    }
}

impl GroupQuant {
    /// DeepSeek-V3: eps 1e-4, f32 scales.
    pub const DEEPSEEK: GroupQuant = GroupQuant { eps: DEEPSEEK_EPS, rounding: ScaleRounding::Exact };
    /// DeepSeek-V3.1 (`scale_fmt: ue8m0`): eps 1e-4, scales rounded up to powers of two.
    pub const DEEPSEEK_UE8M0: GroupQuant = GroupQuant { eps: DEEPSEEK_EPS, rounding: ScaleRounding::Ue8m0Ceil };

    /// # Errors
    /// [`Error::InvalidProblem`] unless `eps` is finite and `eps / 448` a normal f32 (`eps >= 448 · 2^-126`): no
    /// scale is then 0 or subnormal, and every scale has a UE8M0 ceiling.
    pub fn new(eps: f32, rounding: ScaleRounding) -> Result<GroupQuant> {
        if !(eps.is_finite() && eps / E4M3_MAX >= f32::MIN_POSITIVE) {
            return Err(Error::InvalidProblem(format!(
                "eps = {eps:e}: must be finite with eps / 448 a normal f32 (eps >= {:e})",
                f32::MIN_POSITIVE * E4M3_MAX
            )));
        }
        Ok(GroupQuant { eps, rounding })
    }

    pub fn eps(&self) -> f32 {
        self.eps
    }
    pub fn rounding(&self) -> ScaleRounding {
        self.rounding
    }
    /// The same options with another rounding.
    pub fn with_rounding(self, rounding: ScaleRounding) -> GroupQuant {
        GroupQuant { rounding, ..self }
    }

    /// The scale of a group whose finite elements have `amax` (`>= 0`, finite).
    pub fn scale(&self, amax: f32) -> f32 {
        let s = amax.max(self.eps) / E4M3_MAX;
        match self.rounding {
            ScaleRounding::Exact => s,
            // s is within [2^-126, f32::MAX / 448] (eps checked), where the ceiling always exists; NaN, were it
            // not, would be loud.
            ScaleRounding::Ue8m0Ceil => Ue8m0::from_f32_ceil(s).map_or(f32::NAN, Ue8m0::to_f32),
        }
    }
}

/// One element under `scale`: `e4m3(x / scale)` (nearest even, saturating), or the e4m3 NaN with `x`'s sign for
/// a NaN or infinite `x`.
pub fn quantize_element(x: f32, scale: f32) -> F8E4M3 {
    if !x.is_finite() {
        return F8E4M3::from_bits(if x.is_sign_negative() { 0xFF } else { 0x7F });
    }
    F8E4M3::from_f32(x / scale)
}

/// Elements of a `[rows, k]` matrix, or the error naming the shape.
fn elements(what: &str, rows: usize, k: usize) -> Result<usize> {
    rows.checked_mul(k).ok_or_else(|| Error::InvalidProblem(format!("{what}: [{rows}, {k}] overflows usize")))
}

/// The host reference of the device quantisation: `x [rows, k]` row-major to e4m3 `[rows, k]` and f32 scales
/// K-major `[rows, ceil(k / 128)]`, by the rules of this module.
///
/// # Errors
/// [`Error::InvalidProblem`] for `k = 0` or `x.len() != rows · k`.
pub fn per_token_group_quant(x: &[f32], rows: usize, k: usize, opts: &GroupQuant) -> Result<(Vec<F8E4M3>, Vec<f32>)> {
    if k == 0 || x.len() != elements("activations", rows, k)? {
        return Err(Error::InvalidProblem(format!("{} elements for [{rows}, {k}] activations (k positive)", x.len())));
    }
    let groups = k.div_ceil(ACT_GROUP);
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(rows * groups);
    for row in x.chunks_exact(k) {
        for group in row.chunks(ACT_GROUP) {
            let amax = group.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
            let s = opts.scale(amax);
            scales.push(s);
            q.extend(group.iter().map(|&v| quantize_element(v, s)));
        }
    }
    Ok((q, scales))
}

/// `x ≈ q · scale` of quantised rows: `q [rows, k]`, scales K-major `[rows, ceil(k / 128)]`.
///
/// # Errors
/// [`Error::InvalidProblem`] for `k = 0` or lengths that do not fit `[rows, k]`.
pub fn dequantize_groups(q: &[F8E4M3], scales: &[f32], rows: usize, k: usize) -> Result<Vec<f32>> {
    let groups = k.div_ceil(ACT_GROUP);
    if k == 0 || q.len() != elements("fp8 rows", rows, k)? || scales.len() != elements("scales", rows, groups)? {
        return Err(Error::InvalidProblem(format!(
            "{} elements and {} scales for [{rows}, {k}] rows: expected rows x k and rows x {groups} (k positive)",
            q.len(),
            scales.len()
        )));
    }
    Ok(q.iter().enumerate().map(|(i, v)| v.to_f32() * scales[(i / k) * groups + (i % k) / ACT_GROUP]).collect())
}
