//! Per-tensor and per-channel FP8 checkpoints (vLLM's per-tensor `fp8`, compressed-tensors' `tensor` and
//! `channel` weights): per weight `{name}` (F8_E4M3, `[N, K]`) a `{name}_scale` (`weight_scale`: F32, BF16 or
//! F16; `[]` or `[1]` per tensor, `[N]` or `[N, 1]` per channel), and where activations are static, an
//! `input_scale` (`[]` or `[1]`) beside it. All experts of a layer pack into [`Fp8ChannelExperts`].

use safetensors::tensor::Dtype;

use super::fp8_scheme::Fp8Scheme;
use super::{bad, matrix_shape, widen, Checkpoint, ExpertNaming};
use crate::error::{Error, Result};
use crate::experts::{Fp8ChannelExperts, StaticInputScales};
use crate::quant::{per_row_block, ActivationScales, BlockFp8, BlockShape, Scales, WeightScales, F8E4M3};

/// The `input_scale` tensor beside weight `name` (`….weight` → `….input_scale`).
fn input_scale_name(name: &str) -> String {
    format!("{}.input_scale", name.strip_suffix(".weight").unwrap_or(name))
}

impl Checkpoint {
    /// An FP8 weight scaled per tensor or per output channel (see the module docs), as stored: one scale over
    /// `[N, K]` (block `N x K`) or one per row (block `1 x K`), F32.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: missing; the weight not F8_E4M3 or not 2-D; the scale of another
    /// dtype or a shape other than the scheme's; a scale that is negative or not finite (the row named); block
    /// scales (`weight_scale_inv`: [`Checkpoint::fp8_block_weight`]).
    pub fn fp8_scaled_weight(&self, name: &str, scales: WeightScales) -> Result<BlockFp8> {
        self.fp8_scaled_weight_in_file(name, scales).map_err(self.located(name))
    }

    fn fp8_scaled_weight_in_file(&self, name: &str, scales: WeightScales) -> Result<BlockFp8> {
        let (info, bytes) = self.entry(name)?;
        if info.dtype != Dtype::F8_E4M3 {
            return Err(bad(name, format!("dtype {:?}, expected F8_E4M3", info.dtype)));
        }
        let (rows, cols) = matrix_shape(name, &info.shape, "[out, in]")?;
        let sname = format!("{name}_scale");
        let (sinfo, sbytes) = self.entry(&sname)?;
        let sshape = sinfo.shape.as_slice();
        let (block, count) = match scales {
            WeightScales::Tensor if matches!(sshape, [] | [1]) => (BlockShape { rows, cols }, 1),
            WeightScales::Channel if sshape == [rows] || sshape == [rows, 1] => (per_row_block(cols), rows),
            WeightScales::Tensor | WeightScales::Channel => {
                let want = if scales == WeightScales::Tensor {
                    "[] or [1] (per tensor)".to_string()
                } else {
                    format!("[{rows}] or [{rows}, 1] (per output channel of `{name}` [{rows}, {cols}])")
                };
                return Err(bad(&sname, format!("shape {sshape:?}, expected {want}")));
            }
            other => {
                return Err(bad(
                    name,
                    format!("{other:?} weight scales are read by fp8_block_weight, not as per-tensor or per-channel"),
                ))
            }
        };
        let values = widen(sinfo.dtype, sbytes)
            .ok_or_else(|| bad(&sname, format!("dtype {:?}, expected F32, BF16 or F16", sinfo.dtype)))?;
        if values.len() != count || Some(bytes.len()) != rows.checked_mul(cols) {
            return Err(bad(
                name,
                format!("{} elements and {} scales for [{rows}, {cols}]", bytes.len(), values.len()),
            ));
        }
        if let Some(r) = values.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
            let at = if count == 1 { "the tensor's scale".to_string() } else { format!("row {r}'s scale") };
            return Err(bad(&sname, format!("{at} = {:e} is not a finite, non-negative scale", values[r])));
        }
        let q: Vec<F8E4M3> = bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect();
        BlockFp8::from_parts(rows, cols, block, q, Scales::F32(values)).map_err(|e| bad(name, e.to_string()))
    }

    /// The static activation scale of the layer whose weight is `weight` (`{prefix}.weight`):
    /// `{prefix}.input_scale`, one finite, positive F32, BF16 or F16 value of shape `[]` or `[1]`.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the scale tensor: missing, of another dtype or shape, or not finite and
    /// positive.
    pub fn fp8_input_scale(&self, weight: &str) -> Result<f32> {
        let name = input_scale_name(weight);
        self.fp8_input_scale_in_file(&name).map_err(self.located(&name))
    }

    fn fp8_input_scale_in_file(&self, name: &str) -> Result<f32> {
        let (info, bytes) = self.entry(name)?;
        if !matches!(info.shape.as_slice(), [] | [1]) {
            return Err(bad(name, format!("shape {:?}, expected [] or [1] (one scale per tensor)", info.shape)));
        }
        let v = widen(info.dtype, bytes)
            .ok_or_else(|| bad(name, format!("dtype {:?}, expected F32, BF16 or F16", info.dtype)))?;
        match v[..] {
            [s] if s.is_finite() && s > 0.0 => Ok(s),
            [s] => Err(bad(name, format!("{s:e} is not a finite, positive scale"))),
            _ => Err(bad(name, format!("{} values for one scale", v.len()))),
        }
    }

    /// All `experts` experts under `prefix` of a per-tensor or per-channel checkpoint declared by `scheme`, with
    /// their static input scales where its activations are static (per expert, GEMM1's the larger of gate's and
    /// up's).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor, as [`Checkpoint::fp8_scaled_weight`] and
    /// [`Checkpoint::fp8_input_scale`], or naming `prefix`: a block scheme ([`Checkpoint::pack_fp8_experts`]
    /// reads those); shapes that do not chain or differ between experts; `experts = 0`.
    pub fn pack_fp8_channel_experts(
        &self,
        prefix: &str,
        experts: usize,
        naming: ExpertNaming,
        scheme: &Fp8Scheme,
    ) -> Result<Fp8ChannelExperts> {
        // In a closure, so that every error of the reading is located in the file.
        let read = || -> Result<Fp8ChannelExperts> {
            if matches!(scheme.weights(), WeightScales::Block(_)) {
                return Err(bad(prefix, format!("{scheme}: block-scaled experts are read by pack_fp8_experts")));
            }
            let is_static = scheme.activations() == ActivationScales::StaticTensor;
            // Grown as the tensors are read: `experts` may come from an untrusted config.json.
            let mut per = Vec::new();
            let (mut s13, mut s2) = (Vec::new(), Vec::new());
            for e in 0..experts {
                let [g, u, d] = naming.names(prefix, e);
                let w = |n: &str| self.fp8_scaled_weight(n, scheme.weights());
                per.push((w(&g)?, w(&u)?, w(&d)?));
                if is_static {
                    s13.push(self.fp8_input_scale(&g)?.max(self.fp8_input_scale(&u)?));
                    s2.push(self.fp8_input_scale(&d)?);
                }
            }
            let statics = if is_static { Some(StaticInputScales::new(s13, s2)?) } else { None };
            Fp8ChannelExperts::new(per, scheme.activations(), statics).map_err(|e| match e {
                Error::InvalidProblem(m) => bad(prefix, m),
                e => e,
            })
        };
        read().map_err(self.located(prefix))
    }
}
