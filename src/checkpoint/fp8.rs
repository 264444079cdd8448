//! Block-FP8 checkpoints: DeepSeek-V3 / V3.1 and Qwen3-FP8.
//!
//! * `config.json`'s `quantization_config` ([`Fp8Config::from_config_json`]): `quant_method: "fp8"`,
//!   `fmt: "e4m3"`, `weight_block_size: [128, 128]`, `activation_scheme: "dynamic"`, and DeepSeek-V3.1's
//!   `scale_fmt: "ue8m0"` (scales that are powers of two).
//! * Per weight `{name}` (F8_E4M3, `[N, K]`) a `{name}_scale_inv`, the **dequantisation multiplier** of each block
//!   (`w ≈ q · s`), `[ceil(N / bn), ceil(K / bk)]` with edge blocks, in F32 (DeepSeek) or BF16 / F16 (Qwen3-FP8
//!   checkpoints): [`Checkpoint::fp8_block_weight`]. Scales are read exactly (bf16 and f16 widen to f32 without
//!   rounding); under `scale_fmt: ue8m0` each one must be an exact power of two, never rounded.
//! * All experts of a layer packed into one [`PackedFp8Experts`]: `w13 = [gate; up]` `[E, 2I, H]` and `w2`
//!   `[E, H, I]`, each with its scale grids stacked the same way ([`Checkpoint::pack_fp8_experts`]). Stacking gate
//!   on up keeps every block whole only when `I` is a multiple of the block rows; otherwise a block of w13 would
//!   mix gate and up rows under one scale, and that is an error naming both tensors.
//!
//! Converting a bf16 checkpoint: [`PackedFp8Experts::quantize`] quantises packed experts on the host (per 128 ×
//! 128 block, [`BlockFp8::quantize`]), once, offline; the device quantises activations only
//! ([`crate::quant::device`]).
//!
//! The activations' epsilon is part of the checkpoint's format ([`Fp8Config::activation_eps`]): the floor on each
//! 128-column group's amax, `scale = max(amax, eps) / 448`, as the family's own inference code quantises:
//!
//! | family (`config.json`) | eps | source |
//! |---|---|---|
//! | DeepSeek-V3 / V3.1, Kimi-K2 (`model_type` `deepseek_v3`, `deepseek_v2`, `kimi_k2`; `Deepseek*` architectures) | 1e-4 ([`DEEPSEEK_EPS`]) | DeepSeek's `per_token_cast_to_fp8` / `act_quant`: `amax.clamp(1e-4)` (DeepSeek-V3 `inference/kernel.py`, DeepGEMM `utils/math.py`) |
//! | every other (Qwen3-MoE FP8, …) | 1e-10 ([`VLLM_EPS`]) | vLLM's fused MoE quantises them with `per_token_group_quant_fp8(A, block_k)`, default `eps=1e-10`, also a floor on amax (`fp8_utils.py`) |
//!
//! transformers' fine-grained FP8 `act_quant` (`integrations/finegrained_fp8.py`, the versions read:
//! `s = max|x| / 448`) has no floor at all: an all-zero group gets scale 0 and NaNs, which its `FP8Linear` turns
//! into zeros. vLLM's 1e-10 gives the same zeros there and the same scale for every group with amax ≥ 1e-10,
//! so it is the default for non-DeepSeek families. Every family read floors amax, not the scale; a floor `s0` on
//! the scale would equal the amax floor `448 · s0` up to one rounding of the division, and is not offered.

use std::path::Path;

use safetensors::tensor::Dtype;
use serde_json::Value;

use super::fp8_scheme::{Fp8Scheme, WeightScales};
use super::{bad, matrix_shape, widen, Checkpoint, ExpertNaming};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::experts::{activation_quant, ExpertFormat, PackedExperts, PackedFp8Experts};
use crate::quant::{
    BlockFp8, BlockShape, GroupQuant, ScaleFormat, ScaleRounding, Scales, Ue8m0, DEEPSEEK_EPS, F8E4M3, VLLM_EPS,
};

/// How activations are scaled at run time. Only dynamic (per-token, computed on the fly) scaling is read;
/// static input scales would come as a new variant: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationScheme {
    /// Scales computed per token per 128 columns at run time (DeepSeek-V3, Qwen3-FP8).
    Dynamic,
}

/// The typed `quantization_config` of a block-FP8 checkpoint, with the activation epsilon of its family (see
/// the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Config {
    block: BlockShape,
    activation: ActivationScheme,
    scale_format: ScaleFormat,
    /// The activations' amax floor, as f32 bits (so the config stays `Eq`); validated by [`GroupQuant::new`].
    act_eps_bits: u32,
}

pub(super) fn config_error(key: &str, problem: String) -> Error {
    Error::InvalidProblem(format!("config.json quantization_config.{key}: {problem}"))
}

/// `quantization_config.key` as a string, or `None` when absent or null.
pub(super) fn str_key<'a>(q: &'a Value, key: &str) -> Result<Option<&'a str>> {
    match q.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(config_error(key, format!("{v} is not a string"))),
    }
}

impl Fp8Config {
    /// DeepSeek-V3: 128 × 128 blocks, f32 scales, dynamic activations, amax floored at 1e-4 (DeepSeek's
    /// `per_token_cast_to_fp8`: `amax.clamp(1e-4)`).
    pub const DEEPSEEK_V3: Fp8Config = Fp8Config {
        block: BlockShape::DEEPSEEK,
        activation: ActivationScheme::Dynamic,
        scale_format: ScaleFormat::F32,
        act_eps_bits: DEEPSEEK_EPS.to_bits(),
    };
    /// DeepSeek-V3.1: as V3 with `scale_fmt: ue8m0`.
    pub const DEEPSEEK_V3_1: Fp8Config = Fp8Config { scale_format: ScaleFormat::Ue8m0, ..Fp8Config::DEEPSEEK_V3 };
    /// Qwen3-FP8 (and every non-DeepSeek block-FP8 checkpoint): as V3, amax floored at 1e-10 (vLLM's
    /// `per_token_group_quant_fp8` default, which its fused MoE serves them with).
    pub const QWEN3: Fp8Config = Fp8Config { act_eps_bits: VLLM_EPS.to_bits(), ..Fp8Config::DEEPSEEK_V3 };

    /// A config of DeepSeek's recipe (activation eps 1e-4; [`Self::with_activation_eps`] sets another).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a zero block dimension.
    pub fn new(block: BlockShape, activation: ActivationScheme, scale_format: ScaleFormat) -> Result<Fp8Config> {
        block.grid(0, 0)?;
        Ok(Fp8Config { block, activation, scale_format, act_eps_bits: DEEPSEEK_EPS.to_bits() })
    }

    /// The same config with activations' amax floored at `eps` (`scale = max(amax, eps) / 448`).
    ///
    /// # Errors
    /// As [`GroupQuant::new`]: `eps` finite with `eps / 448` a normal f32.
    pub fn with_activation_eps(self, eps: f32) -> Result<Fp8Config> {
        GroupQuant::new(eps, ScaleRounding::Exact)?;
        Ok(Fp8Config { act_eps_bits: eps.to_bits(), ..self })
    }

    /// The `quantization_config` of a `config.json`'s text: `None` when it has none (an unquantised model).
    /// Unknown keys (`modules_to_not_convert`, …) are ignored. The activation eps is the family's, from
    /// `model_type` or `architectures` (see the module docs): 1e-4 for DeepSeek's, vLLM's 1e-10 for the rest.
    ///
    /// # Errors
    /// As [`Fp8Scheme::from_config_json`]; and [`Error::InvalidProblem`] naming the scheme when it is not
    /// block-scaled (per-tensor or per-channel weights: read by [`Fp8Scheme`], not run by the layer yet).
    pub fn from_config_json(text: &str) -> Result<Option<Fp8Config>> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidProblem(format!("config.json is not valid JSON: {e}")))?;
        let Some(scheme) = Fp8Scheme::from_config(&v)? else {
            return Ok(None);
        };
        let WeightScales::Block(block) = scheme.weights() else {
            return Err(Error::InvalidProblem(format!(
                "config.json quantization_config declares {scheme}: an Fp8Config is block-scaled FP8, the scheme the \
                 layer runs; Fp8Scheme::from_config_json and Checkpoint::fp8_scaled_weight read this one, which \
                 the layer does not run yet"
            )));
        };
        let eps = if deepseek_family(&v) { DEEPSEEK_EPS } else { VLLM_EPS };
        Fp8Config::new(block, ActivationScheme::Dynamic, scheme.scale_format())?.with_activation_eps(eps).map(Some)
    }

    /// [`Fp8Config::from_config_json`] of the file at `path`.
    ///
    /// # Errors
    /// [`Error::CheckpointFile`] naming the file when it cannot be read; otherwise as `from_config_json`, the
    /// message prefixed with the file.
    pub fn from_config_file(path: &Path) -> Result<Option<Fp8Config>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::CheckpointFile { file: path.to_path_buf(), problem: e.to_string() })?;
        Fp8Config::from_config_json(&text).map_err(|e| match e {
            Error::InvalidProblem(m) => Error::InvalidProblem(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Elements of the weight under one scale (`weight_block_size`: rows of the `[N, K]` weight, then columns).
    pub fn block(&self) -> BlockShape {
        self.block
    }
    pub fn activation(&self) -> ActivationScheme {
        self.activation
    }
    /// `F32` scales, or `Ue8m0` (powers of two) under `scale_fmt: ue8m0`.
    pub fn scale_format(&self) -> ScaleFormat {
        self.scale_format
    }

    /// The floor on each activation group's amax (`scale = max(amax, eps) / 448`): the family's, see the
    /// module docs.
    pub fn activation_eps(&self) -> f32 {
        f32::from_bits(self.act_eps_bits)
    }

    /// How to quantise the activations of this checkpoint on the device and in the CPU reference: amax floored
    /// at [`Self::activation_eps`], scales rounded up to powers of two under `scale_fmt: ue8m0`.
    pub fn activation_quant(&self) -> GroupQuant {
        activation_quant(self.activation_eps(), self.scale_format)
    }
}

/// Whether `config.json` is of DeepSeek's family (DeepSeek-V2/V3/V3.1, Kimi-K2: DeepSeek's activation eps).
fn deepseek_family(config: &Value) -> bool {
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    let architectures = config.get("architectures").and_then(Value::as_array);
    model_type.starts_with("deepseek")
        || model_type.starts_with("kimi_k2")
        || architectures.is_some_and(|a| a.iter().filter_map(Value::as_str).any(|n| n.starts_with("Deepseek")))
}

/// Scales of `values` (row-major over a `[_, gc]` grid) in `format`: UE8M0 only for exact powers of two; f32
/// only for finite, non-negative values. The first offending block is named.
fn checked_scales(tensor: &str, values: Vec<f32>, gc: usize, format: ScaleFormat) -> Result<Scales> {
    let block = |i: usize| format!("block [{}, {}]", i / gc.max(1), i % gc.max(1));
    match format {
        ScaleFormat::Ue8m0 => values
            .iter()
            .enumerate()
            .map(|(i, &s)| match Ue8m0::from_f32_ceil(s) {
                Ok(u) if u.to_f32() == s => Ok(u),
                _ => Err(bad(
                    tensor,
                    format!(
                        "{} = {s:e} is not a power of two, but the checkpoint declares scale_fmt ue8m0 (scales are \
                         never rounded)",
                        block(i)
                    ),
                )),
            })
            .collect::<Result<Vec<Ue8m0>>>()
            .map(Scales::Ue8m0),
        _ => match values.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
            Some(i) => Err(bad(tensor, format!("{} = {:e} is not a finite, non-negative scale", block(i), values[i]))),
            None => Ok(Scales::F32(values)),
        },
    }
}

impl Checkpoint {
    /// Tensor `name`'s dtype, shape and bytes.
    fn raw(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let (info, bytes) = self.entry(name)?;
        Ok((info.dtype, &info.shape, bytes))
    }

    /// A block-FP8 weight: `name` (F8_E4M3, `[N, K]`) with `{name}_scale_inv` (F32, BF16 or F16,
    /// `[ceil(N / bn), ceil(K / bk)]` for `config`'s block), its scales in `config`'s format.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: missing; the weight not F8_E4M3 or not 2-D; the scales of another
    /// dtype; a scale grid whose shape does not match the weight's block grid (both tensors named); under
    /// `scale_fmt: ue8m0`, a scale that is not an exact power of two (the first such block named); otherwise a
    /// scale that is negative or not finite.
    pub fn fp8_block_weight(&self, name: &str, config: &Fp8Config) -> Result<BlockFp8> {
        self.fp8_block_weight_in_file(name, config).map_err(self.located(name))
    }

    fn fp8_block_weight_in_file(&self, name: &str, config: &Fp8Config) -> Result<BlockFp8> {
        let (dtype, shape, bytes) = self.raw(name)?;
        if dtype != Dtype::F8_E4M3 {
            return Err(bad(name, format!("dtype {dtype:?}, expected F8_E4M3")));
        }
        let (rows, cols) = matrix_shape(name, shape, "[out, in]")?;
        let sname = format!("{name}_scale_inv");
        let (sdtype, sshape, sbytes) = self.raw(&sname)?;
        let block = config.block;
        let (gr, gc) = block.grid(rows, cols).map_err(|e| bad(name, e.to_string()))?;
        if sshape != [gr, gc] {
            return Err(bad(
                &sname,
                format!(
                    "shape {sshape:?} does not match the block grid [{gr}, {gc}] of `{name}` [{rows}, {cols}] in \
                     {}x{} blocks",
                    block.rows, block.cols
                ),
            ));
        }
        let q: Vec<F8E4M3> = bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect();
        let values =
            widen(sdtype, sbytes).ok_or_else(|| bad(&sname, format!("dtype {sdtype:?}, expected F32, BF16 or F16")))?;
        if Some(values.len()) != gr.checked_mul(gc) || Some(q.len()) != rows.checked_mul(cols) {
            return Err(bad(
                name,
                format!("{} elements and {} scales for shape [{rows}, {cols}]", q.len(), values.len()),
            ));
        }
        let scales = checked_scales(&sname, values, gc, config.scale_format)?;
        BlockFp8::from_parts(rows, cols, block, q, scales).map_err(|e| bad(name, e.to_string()))
    }

    /// All `experts` experts under `prefix` packed into one value: `w13 = [gate; up]` and `w2`, weights and scale
    /// grids stacked over experts (see the module docs).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: as [`Checkpoint::fp8_block_weight`]; an up or down shape that does
    /// not fit the gate's, or a gate shape other than expert 0's; gate rows `I` not a multiple of the block rows
    /// (gate and up both named: one scale would cover rows of both); `experts = 0`.
    pub fn pack_fp8_experts(
        &self,
        prefix: &str,
        experts: usize,
        naming: ExpertNaming,
        config: &Fp8Config,
    ) -> Result<PackedFp8Experts> {
        // In a closure, so that every error of the reading is located in the file.
        let read = || -> Result<PackedFp8Experts> {
            // Grown as experts are read, not reserved: `experts` may come from an untrusted config.json.
            let mut per_expert = Vec::new();
            for e in 0..experts {
                let [gn, un, dn] = naming.names(prefix, e);
                let g = self.fp8_block_weight(&gn, config)?;
                let u = self.fp8_block_weight(&un, config)?;
                let d = self.fp8_block_weight(&dn, config)?;
                let (i, h) = (g.rows(), g.cols());
                if (u.rows(), u.cols()) != (i, h) {
                    return Err(bad(
                        &un,
                        format!("shape [{}, {}], expected [{i}, {h}] like `{gn}`", u.rows(), u.cols()),
                    ));
                }
                if (d.rows(), d.cols()) != (h, i) {
                    return Err(bad(&dn, format!("shape [{}, {}], expected [{h}, {i}]", d.rows(), d.cols())));
                }
                if let Some((w13, _)) = per_expert.first() {
                    let w13: &BlockFp8 = w13;
                    if (w13.rows(), w13.cols()) != (2 * i, h) {
                        return Err(bad(
                            &gn,
                            format!("shape [{i}, {h}], expert 0 has [{}, {}]", w13.rows() / 2, w13.cols()),
                        ));
                    }
                }
                per_expert.push((stack_gate_up(&g, &u, &gn, &un)?, d));
            }
            PackedFp8Experts::from_experts(per_expert)
                .and_then(|p| p.with_activation_eps(config.activation_eps()))
                .map_err(|e| bad(prefix, e.to_string()))
        };
        read().map_err(self.located(prefix))
    }
}

/// `[gate; up]`, or the error naming both tensors when a block would straddle them.
fn stack_gate_up(g: &BlockFp8, u: &BlockFp8, gate: &str, up: &str) -> Result<BlockFp8> {
    let block = g.block();
    if g.rows() % block.rows != 0 {
        return Err(bad(
            gate,
            format!(
                "{} rows is not a multiple of the {}-row blocks: stacked on `{up}` into w13, one block's scale would \
                 cover rows of both",
                g.rows(),
                block.rows
            ),
        ));
    }
    g.stack_rows(u).map_err(|e| bad(gate, format!("stacking on `{up}`: {e}")))
}

impl PackedFp8Experts {
    /// Quantises packed bf16 / f16 SwiGLU experts (`[gate | up]`, `[out, in]`, no biases) per `config`'s blocks on
    /// the host: gate and up separately (so no block mixes them), then stacked.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for another expert format, biases, tensors that do not hold `E · 2I · H` and
    /// `E · H · I` elements, `I` not a multiple of the block rows, or (UE8M0) a block whose scale has no
    /// power-of-two ceiling.
    pub fn quantize<T: Element>(p: &PackedExperts<T>, config: &Fp8Config) -> Result<PackedFp8Experts> {
        if p.format != ExpertFormat::SWIGLU || p.b13.is_some() || p.b2.is_some() {
            return Err(Error::InvalidProblem(format!(
                "FP8 packing takes concatenated [out, in] SwiGLU experts without biases; got {:?}",
                p.format
            )));
        }
        let (e, h, i) = (p.experts, p.hidden, p.inter);
        let per = i.checked_mul(h).filter(|&n| n > 0);
        let fits = |len: usize, mult: usize| per.and_then(|n| n.checked_mul(mult * e)) == Some(len);
        if !fits(p.w13.len(), 2) || !fits(p.w2.len(), 1) {
            return Err(Error::InvalidProblem(format!(
                "w13 has {} and w2 {} elements: E = {e}, H = {h}, I = {i} need E x 2I x H and E x H x I",
                p.w13.len(),
                p.w2.len()
            )));
        }
        let (block, format) = (config.block, config.scale_format);
        let f32s = |v: &[T]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let mut per_expert = Vec::with_capacity(e);
        for x in 0..e {
            let base = x * 2 * i * h;
            let g = BlockFp8::quantize(&f32s(&p.w13[base..base + i * h]), i, h, block, format)?;
            let u = BlockFp8::quantize(&f32s(&p.w13[base + i * h..base + 2 * i * h]), i, h, block, format)?;
            let d = BlockFp8::quantize(&f32s(&p.w2[x * h * i..(x + 1) * h * i]), h, i, block, format)?;
            let w13 =
                stack_gate_up(&g, &u, &format!("expert {x} gate"), &format!("expert {x} up")).map_err(|e| match e {
                    Error::Checkpoint { tensor, problem, .. } => Error::InvalidProblem(format!("{tensor}: {problem}")),
                    e => e,
                })?;
            per_expert.push((w13, d));
        }
        PackedFp8Experts::from_experts(per_expert)?.with_activation_eps(config.activation_eps())
    }
}
