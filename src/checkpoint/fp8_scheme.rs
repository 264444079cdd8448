//! The FP8 scheme a checkpoint declares (`config.json`'s `quantization_config`): how its weights are scaled and how
//! its activations are to be scaled, in the two forms the FP8 checkpoints vLLM serves use.
//!
//! | `quantization_config` | weights | activations | e.g. |
//! |---|---|---|---|
//! | `quant_method: "fp8"`, `weight_block_size: [bn, bk]` | per `bn x bk` block (`weight_scale_inv`) | dynamic, per token per `bk` columns | DeepSeek-V3, Qwen3-FP8 |
//! | `quant_method: "fp8"`, no `weight_block_size`, `activation_scheme: "static"` / `"dynamic"` | per tensor (`weight_scale`) | static per tensor (`input_scale`) / dynamic per tensor | vLLM's per-tensor FP8 (Mixtral-8x7B-Instruct FP8) |
//! | `quant_method: "compressed-tensors"`, `format: "float-quantized"`, one `config_groups` scheme | `weights.strategy`: `tensor`, `channel` (`weight_scale` `[N, 1]`) or `block` (`block_structure`) | `input_activations`: `tensor` static or dynamic, `token` dynamic, `group` dynamic | llm-compressor's FP8 and FP8-dynamic releases, Llama-4-style rowwise FP8 |
//!
//! Every scale read is a dequantisation multiplier (`w ≈ q · s`). [`Fp8Scheme`] holds only the combinations
//! these forms can declare; anything else is an error naming the key. The block scheme is what
//! [`super::Fp8Config`] carries to the layer; per-tensor and per-channel weights are read by
//! [`super::Checkpoint::fp8_scaled_weight`] and [`super::Checkpoint::fp8_input_scale`].

use std::fmt;

use serde_json::Value;

use super::fp8::{config_error, str_key};
use crate::error::{Error, Result};
pub use crate::quant::{ActivationScales, WeightScales};
use crate::quant::{BlockShape, ScaleFormat};

/// Which form of `quantization_config` declared the scheme.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemeSource {
    /// `quant_method: "fp8"` (vLLM's and transformers' FP8 config).
    Fp8,
    /// `quant_method: "compressed-tensors"` (llm-compressor).
    CompressedTensors,
}

/// An FP8 checkpoint's declared scheme: weight scales, activation scales, the scales' format and the form it
/// came in. Only combinations a checkpoint can declare are constructed ([`Fp8Scheme::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Scheme {
    weights: WeightScales,
    activations: ActivationScales,
    scale_format: ScaleFormat,
    source: SchemeSource,
}

impl Fp8Scheme {
    /// A scheme of these parts.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the mix: block weights with activations other than dynamic groups of the
    /// block's columns; per-tensor or per-channel weights with group activations; a zero block or group; UE8M0
    /// scales on anything but blocks.
    pub fn new(
        weights: WeightScales,
        activations: ActivationScales,
        scale_format: ScaleFormat,
        source: SchemeSource,
    ) -> Result<Fp8Scheme> {
        let s = Fp8Scheme { weights, activations, scale_format, source };
        let ok = match (weights, activations) {
            (WeightScales::Block(b), ActivationScales::DynamicGroup { cols }) => {
                b.grid(0, 0)?;
                cols == b.cols
            }
            (WeightScales::Block(_), _) | (_, ActivationScales::DynamicGroup { .. }) => false,
            (WeightScales::Channel | WeightScales::Tensor, _) => true,
        };
        if !ok {
            return Err(Error::InvalidProblem(format!(
                "FP8 scheme {s}: block weights take dynamic activation groups of the block's columns, per-tensor \
                 and per-channel weights take per-tensor or per-token activations"
            )));
        }
        if scale_format == ScaleFormat::Ue8m0 && !matches!(weights, WeightScales::Block(_)) {
            return Err(Error::InvalidProblem(format!("FP8 scheme {s}: UE8M0 scales are read for block weights only")));
        }
        Ok(s)
    }

    pub fn weights(&self) -> WeightScales {
        self.weights
    }
    pub fn activations(&self) -> ActivationScales {
        self.activations
    }
    pub fn scale_format(&self) -> ScaleFormat {
        self.scale_format
    }
    pub fn source(&self) -> SchemeSource {
        self.source
    }

    /// The scheme of a `config.json`'s text: `None` when it has no `quantization_config` (an unquantised model).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming `config.json` and the key: not JSON; a `quant_method` other than `fp8` or
    /// `compressed-tensors`; any value of the table in the module docs that is absent where needed or outside it
    /// (`fmt` other than `e4m3`, `num_bits` other than 8, `type` other than `float`, asymmetric scales, dynamic
    /// weights, no `input_activations` (weight-only FP8), static per-token scales, groups of two schemes, …).
    pub fn from_config_json(text: &str) -> Result<Option<Fp8Scheme>> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidProblem(format!("config.json is not valid JSON: {e}")))?;
        Fp8Scheme::from_config(&v)
    }

    /// As [`Fp8Scheme::from_config_json`], from the parsed document.
    pub(super) fn from_config(v: &Value) -> Result<Option<Fp8Scheme>> {
        let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) else {
            return Ok(None);
        };
        if !q.is_object() {
            return Err(Error::InvalidProblem(format!("config.json quantization_config = {q}: not an object")));
        }
        match str_key(q, "quant_method")? {
            Some("fp8") => fp8_form(q).map(Some),
            Some("compressed-tensors") => compressed_tensors_form(q).map(Some),
            Some(m) => Err(config_error(
                "quant_method",
                format!("\"{m}\": only \"fp8\" and \"compressed-tensors\" FP8 checkpoints are read"),
            )),
            None => Err(config_error("quant_method", "missing".into())),
        }
    }
}

impl fmt::Display for Fp8Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.weights {
            WeightScales::Block(b) => write!(f, "{}x{}-block", b.rows, b.cols)?,
            WeightScales::Channel => f.write_str("per-channel")?,
            WeightScales::Tensor => f.write_str("per-tensor")?,
        }
        f.write_str(" weight scales, ")?;
        match self.activations {
            ActivationScales::DynamicGroup { cols } => {
                write!(f, "dynamic activation scales per token per {cols} columns")?
            }
            ActivationScales::DynamicToken => f.write_str("dynamic per-token activation scales")?,
            ActivationScales::DynamicTensor => f.write_str("dynamic per-tensor activation scales")?,
            ActivationScales::StaticTensor => f.write_str("static per-tensor activation scales (input_scale)")?,
        }
        if self.scale_format == ScaleFormat::Ue8m0 {
            f.write_str(", UE8M0 scales")?;
        }
        f.write_str(match self.source {
            SchemeSource::Fp8 => " (quant_method fp8)",
            SchemeSource::CompressedTensors => " (compressed-tensors)",
        })
    }
}

/// Two positive integers (`weight_block_size`, `block_structure`) under `key`.
fn block_of(key: &str, v: Option<&Value>) -> Result<BlockShape> {
    let dim = |v: &Value| v.as_u64().filter(|&d| d > 0).and_then(|d| usize::try_from(d).ok());
    match v {
        Some(Value::Array(a)) if a.len() == 2 => match (dim(&a[0]), dim(&a[1])) {
            (Some(rows), Some(cols)) => Ok(BlockShape { rows, cols }),
            _ => Err(config_error(key, format!("{}: not two positive integers", Value::Array(a.clone())))),
        },
        Some(v) => Err(config_error(key, format!("{v}: not two positive integers"))),
        None => Err(config_error(key, "missing".into())),
    }
}

/// `quant_method: "fp8"`: block weights with dynamic groups of the block's columns, or per-tensor weights with
/// static or dynamic per-tensor activations.
fn fp8_form(q: &Value) -> Result<Fp8Scheme> {
    match str_key(q, "fmt")? {
        None | Some("e4m3") => {}
        Some(f) => return Err(config_error("fmt", format!("\"{f}\": only \"e4m3\" is read"))),
    }
    let scale_format = match str_key(q, "scale_fmt")? {
        None => ScaleFormat::F32,
        Some("ue8m0") => ScaleFormat::Ue8m0,
        Some(s) => return Err(config_error("scale_fmt", format!("\"{s}\": only \"ue8m0\" is known"))),
    };
    let activation = str_key(q, "activation_scheme")?;
    let (weights, activations) = match q.get("weight_block_size").filter(|b| !b.is_null()) {
        Some(b) => {
            let block = block_of("weight_block_size", Some(b))?;
            match activation {
                None | Some("dynamic") => {
                    (WeightScales::Block(block), ActivationScales::DynamicGroup { cols: block.cols })
                }
                Some(s) => {
                    return Err(config_error(
                        "activation_scheme",
                        format!("\"{s}\": block-scaled weights take \"dynamic\" activations (per token per block)"),
                    ))
                }
            }
        }
        None => {
            let a = match activation {
                Some("static") => ActivationScales::StaticTensor,
                None | Some("dynamic") => ActivationScales::DynamicTensor,
                Some(s) => {
                    return Err(config_error("activation_scheme", format!("\"{s}\": \"static\" or \"dynamic\"")))
                }
            };
            (WeightScales::Tensor, a)
        }
    };
    Fp8Scheme::new(weights, activations, scale_format, SchemeSource::Fp8)
        .map_err(|e| config_error("scale_fmt", e.to_string()))
}

/// One `config_groups` argument block (`weights` or `input_activations`): 8-bit floats, symmetric; its
/// `strategy` and `dynamic`.
fn float8_args<'a>(key: &str, a: &'a Value) -> Result<(&'a str, bool)> {
    if !a.is_object() {
        return Err(config_error(key, format!("{a}: not an object")));
    }
    let sub = |k: &str| format!("{key}.{k}");
    match a.get("num_bits").and_then(Value::as_u64) {
        Some(8) => {}
        _ => return Err(config_error(&sub("num_bits"), format!("{}: only 8-bit FP8 is read", a["num_bits"]))),
    }
    if a.get("type").and_then(Value::as_str) != Some("float") {
        return Err(config_error(&sub("type"), format!("{}: only \"float\" (FP8 e4m3) is read", a["type"])));
    }
    match a.get("symmetric") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(s) => {
            return Err(config_error(&sub("symmetric"), format!("{s}: FP8 scales are symmetric (no zero point)")))
        }
    }
    let strategy = match a.get("strategy") {
        Some(Value::String(s)) => s.as_str(),
        _ => return Err(config_error(&sub("strategy"), format!("{}: missing or not a string", a["strategy"]))),
    };
    let dynamic = match a.get("dynamic") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(d) => return Err(config_error(&sub("dynamic"), format!("{d}: true or false"))),
    };
    Ok((strategy, dynamic))
}

/// One group of `config_groups`.
fn group_scheme(name: &str, g: &Value) -> Result<Fp8Scheme> {
    let key = |k: &str| format!("config_groups.{name}.{k}");
    let w = g.get("weights").filter(|w| !w.is_null()).ok_or_else(|| config_error(&key("weights"), "missing".into()))?;
    let (ws, wdyn) = float8_args(&key("weights"), w)?;
    if wdyn {
        return Err(config_error(&key("weights.dynamic"), "true: weights are stored quantised, not dynamic".into()));
    }
    let weights = match ws {
        "tensor" => WeightScales::Tensor,
        "channel" => WeightScales::Channel,
        "block" => WeightScales::Block(block_of(&key("weights.block_structure"), w.get("block_structure"))?),
        s => {
            return Err(config_error(
                &key("weights.strategy"),
                format!("\"{s}\": \"tensor\", \"channel\" or \"block\" FP8 weights are read"),
            ))
        }
    };
    let a = g.get("input_activations").filter(|a| !a.is_null()).ok_or_else(|| {
        config_error(
            &key("input_activations"),
            "missing: weight-only FP8 (W8A16) is not run; the crate's FP8 GEMMs take FP8 activations".into(),
        )
    })?;
    let (strategy, dynamic) = float8_args(&key("input_activations"), a)?;
    let activations = match (strategy, dynamic) {
        ("tensor", false) => ActivationScales::StaticTensor,
        ("tensor", true) => ActivationScales::DynamicTensor,
        ("token", true) => ActivationScales::DynamicToken,
        ("group", true) => match a.get("group_size").and_then(Value::as_u64).and_then(|g| usize::try_from(g).ok()) {
            Some(cols) if cols > 0 => ActivationScales::DynamicGroup { cols },
            _ => {
                return Err(config_error(
                    &key("input_activations.group_size"),
                    format!("{}: a positive integer", a["group_size"]),
                ))
            }
        },
        (s, d) => {
            return Err(config_error(
                &key("input_activations"),
                format!(
                    "strategy \"{s}\" with dynamic {d}: read are \"tensor\" (static or dynamic), \"token\" and \
                     \"group\" (dynamic)"
                ),
            ))
        }
    };
    Fp8Scheme::new(weights, activations, ScaleFormat::F32, SchemeSource::CompressedTensors)
        .map_err(|e| config_error(&key("input_activations"), e.to_string()))
}

/// `quant_method: "compressed-tensors"` with FP8 `config_groups`, all of one scheme.
fn compressed_tensors_form(q: &Value) -> Result<Fp8Scheme> {
    match str_key(q, "format")? {
        None | Some("float-quantized") | Some("naive-quantized") => {}
        Some(f) => {
            return Err(config_error(
                "format",
                format!("\"{f}\": only \"float-quantized\" (FP8) compressed-tensors checkpoints are read"),
            ))
        }
    }
    let groups = match q.get("config_groups") {
        Some(Value::Object(m)) if !m.is_empty() => m,
        _ => {
            let g = q.get("config_groups").map_or("missing".into(), Value::to_string);
            return Err(config_error("config_groups", format!("{g}: a non-empty object of scheme groups")));
        }
    };
    let mut scheme: Option<(String, Fp8Scheme)> = None;
    for (name, g) in groups {
        let s = group_scheme(name, g)?;
        match &scheme {
            None => scheme = Some((name.clone(), s)),
            Some((_, prev)) if *prev == s => {}
            Some((first, prev)) => {
                return Err(config_error(
                    "config_groups",
                    format!("{first} declares {prev}, {name} declares {s}: one FP8 scheme per checkpoint is read"),
                ))
            }
        }
    }
    scheme.map(|(_, s)| s).ok_or_else(|| config_error("config_groups", "empty".into()))
}
