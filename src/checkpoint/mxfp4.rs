//! gpt-oss's MXFP4 experts (the released `openai/gpt-oss-{20b,120b}` checkpoints, HF names), read into
//! [`Mxfp4`] values per GEMM and dequantised into the bf16 [`PackedExperts`] the Hopper layer runs.
//!
//! Under `{prefix}.experts.` (`prefix` = `model.layers.L.mlp`):
//!
//! | tensor | dtype | shape | meaning |
//! |---|---|---|---|
//! | `gate_up_proj_blocks` | U8 | `[E, 2I, H / 32, 16]` | e2m1 pairs, element `2j` in the low nibble; rows `[out, in]`, gate/up interleaved (even rows gate) |
//! | `gate_up_proj_scales` | U8 | `[E, 2I, H / 32]` | UE8M0, `2^(s − 127)` |
//! | `gate_up_proj_bias` | BF16 / F32 / F16 | `[E, 2I]` | interleaved like the rows |
//! | `down_proj_blocks` | U8 | `[E, H, I / 32, 16]` | `[out, in]` |
//! | `down_proj_scales` | U8 | `[E, H, I / 32]` | |
//! | `down_proj_bias` | BF16 / F32 / F16 | `[E, H]` | |
//!
//! Element value `FP4_LUT[nibble] · 2^(scale − 127)` (`openai/gpt-oss` `gpt_oss/torch/weights.py`). The MXFP4
//! storage is `[out, in]` (K-major, as SM100's MXF4 MMA wants it); gpt-oss's bf16 form, which
//! [`Checkpoint::pack_gpt_oss`] reads, is transposed (`gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`,
//! [`Storage::InOut`](crate::experts::Storage::InOut)), so [`GptOssMxfp4Experts::dequantize`] transposes: its
//! result is exactly what `pack_gpt_oss` returns for the dequantised checkpoint, and the bf16 layer runs it.

use safetensors::tensor::Dtype;

use super::{bad, Checkpoint};
use crate::dtype::Element;
use crate::error::Result;
use crate::experts::{GptOssMxfp4Experts, PackedExperts};
use crate::kernels::grouped_mx::MX_K_MULTIPLE;
use crate::quant::{Mxfp4, Ue8m0, MX_BLOCK};

impl GptOssMxfp4Experts {
    /// The same experts for the SM100 block-scaled GEMMs ([`crate::kernels::grouped_mx::GroupedGemmMx`]):
    /// both weights' K (gate_up's H, down's I) zero-padded to the next multiple of
    /// [`MX_K_MULTIPLE`] ([`Mxfp4::pad_k`]: zero nibbles, neutral
    /// scales, exact): gpt-oss's 2880 is stored as 2944. The shape, biases and dequantisation are unchanged.
    ///
    /// # Errors
    /// As [`Mxfp4::pad_k`] (never, for a value this module made).
    pub fn padded_for_sm100(self) -> Result<Self> {
        let pad = |w: Mxfp4| {
            let k = w.k().next_multiple_of(MX_K_MULTIPLE);
            w.pad_k(k)
        };
        Ok(GptOssMxfp4Experts { gate_up: pad(self.gate_up)?, down: pad(self.down)?, ..self })
    }
}

impl Checkpoint {
    /// A U8 tensor's shape and bytes.
    fn u8_tensor(&self, name: &str) -> Result<(Vec<usize>, &[u8])> {
        let (info, bytes) = self.entry(name)?;
        if info.dtype != Dtype::U8 {
            return Err(bad(name, format!("dtype {:?}, expected U8", info.dtype)));
        }
        Ok((info.shape.clone(), bytes))
    }

    /// One gpt-oss MXFP4 weight `{name}_blocks` (U8 `[E, N, K / 32, 16]`) with `{name}_scales` (U8
    /// `[E, N, K / 32]`): `(E, N, K)` and the weight as an [`Mxfp4`] `[E · N, K]`.
    ///
    /// # Errors
    /// [`crate::Error::Checkpoint`] naming the tensor: missing; not U8; blocks not 4-D with 16 bytes per block;
    /// scales whose shape is not the blocks' `[E, N, K / 32]`; a scale byte `0xFF` (the UE8M0 NaN, its position
    /// named).
    pub fn mxfp4_weight(&self, name: &str) -> Result<((usize, usize, usize), Mxfp4)> {
        self.mxfp4_weight_in_file(name).map_err(self.located(&format!("{name}_blocks")))
    }

    fn mxfp4_weight_in_file(&self, name: &str) -> Result<((usize, usize, usize), Mxfp4)> {
        let bname = format!("{name}_blocks");
        let sname = format!("{name}_scales");
        let (bs, blocks) = self.u8_tensor(&bname)?;
        let [e, n, kb, 16] = bs[..] else {
            return Err(bad(
                &bname,
                format!("shape {bs:?}, expected [E, N, K / 32, 16] (16 bytes = 32 e2m1 per block)"),
            ));
        };
        if e == 0 || n == 0 || kb == 0 {
            return Err(bad(&bname, format!("shape {bs:?}: E, N and K / 32 must be positive")));
        }
        let (ss, scales) = self.u8_tensor(&sname)?;
        if ss != [e, n, kb] {
            return Err(bad(&sname, format!("shape {ss:?}, expected [{e}, {n}, {kb}] from `{bname}` {bs:?}")));
        }
        if let Some(at) = scales.iter().position(|&s| s == 0xFF) {
            return Err(bad(
                &sname,
                format!("scale [{}, {}, {}] is 0xFF, the UE8M0 NaN", at / (n * kb), at / kb % n, at % kb),
            ));
        }
        let overflow = || bad(&bname, format!("shape {bs:?}: K or E x N overflows usize"));
        let k = kb.checked_mul(MX_BLOCK).ok_or_else(overflow)?;
        let rows = e.checked_mul(n).ok_or_else(overflow)?;
        let mx = Mxfp4::from_parts(rows, k, blocks.to_vec(), scales.iter().map(|&s| Ue8m0(s)).collect())
            .map_err(|err| bad(&bname, err.to_string()))?;
        Ok(((e, n, k), mx))
    }

    /// gpt-oss's MXFP4 experts under `prefix` (see the module docs).
    ///
    /// # Errors
    /// [`crate::Error::Checkpoint`] naming the tensor: as [`Self::mxfp4_weight`]; `gate_up_proj` rows odd (no
    /// gate/up pairs); `down_proj` not `[E, H, I]` for `gate_up_proj`'s `[E, 2I, H]`; a bias of another shape
    /// than `[E, 2I]` / `[E, H]` or another dtype than F32, BF16, F16.
    pub fn pack_gpt_oss_mxfp4(&self, prefix: &str) -> Result<GptOssMxfp4Experts> {
        self.pack_gpt_oss_mxfp4_in_file(prefix).map_err(self.located(&format!("{prefix}.experts.gate_up_proj_blocks")))
    }

    fn pack_gpt_oss_mxfp4_in_file(&self, prefix: &str) -> Result<GptOssMxfp4Experts> {
        let n = |s: &str| format!("{prefix}.experts.{s}");
        let ((e, i2, h), gate_up) = self.mxfp4_weight(&n("gate_up_proj"))?;
        if i2 % 2 != 0 {
            return Err(bad(
                &n("gate_up_proj_blocks"),
                format!("{i2} output rows: gate and up rows are interleaved, so 2I must be even"),
            ));
        }
        let i = i2 / 2;
        let ((de, dn, dk), down) = self.mxfp4_weight(&n("down_proj"))?;
        if (de, dn, dk) != (e, h, i) {
            return Err(bad(
                &n("down_proj_blocks"),
                format!(
                    "holds [E, N, K] = [{de}, {dn}, {dk}], expected [{e}, {h}, {i}] for `{}` [{e}, {i2}, {h}]",
                    n("gate_up_proj_blocks")
                ),
            ));
        }
        let (bs13, b13) = self.tensor_f32(&n("gate_up_proj_bias"))?;
        if bs13 != [e, i2] {
            return Err(bad(&n("gate_up_proj_bias"), format!("shape {bs13:?}, expected [{e}, {i2}]")));
        }
        let (bs2, b2) = self.tensor_f32(&n("down_proj_bias"))?;
        if bs2 != [e, h] {
            return Err(bad(&n("down_proj_bias"), format!("shape {bs2:?}, expected [{e}, {h}]")));
        }
        let dims = GptOssMxfp4Experts::dims((e, h, i));
        Ok(GptOssMxfp4Experts { dims, gate_up, down, gate_up_bias: b13, down_bias: b2 })
    }

    /// gpt-oss's MXFP4 experts under `prefix`, dequantised into the bf16 layer's format
    /// ([`GptOssMxfp4Experts::dequantize`]).
    ///
    /// # Errors
    /// As [`Self::pack_gpt_oss_mxfp4`].
    pub fn pack_gpt_oss_dequantized<T: Element>(&self, prefix: &str) -> Result<PackedExperts<T>> {
        self.pack_gpt_oss_mxfp4(prefix)?
            .dequantize()
            .map_err(self.located(&format!("{prefix}.experts.gate_up_proj_blocks")))
    }
}
