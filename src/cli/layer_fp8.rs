//! The quantised side of `bench --layer --dtype fp8|mxfp4`: which experts a timed layer runs over, the floor's
//! terms, the models and backends the FP8 and MXFP4 layers take, and random block-FP8 and MXFP4 weights.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::layer::{AutoSource, Fp8ChannelExpertWeights, GateUp, LayerShape, LayerWeights};
use moe_gemm::quant::{
    scale_blocks, ActivationScales, Fp8BlockWeights, Fp8ChannelWeights, Mxfp4, Ue8m0, F8E4M3, MX_BLOCK, SCALE_BLOCK,
};
use moe_gemm::random::SplitMix64;
use moe_gemm::*;

use super::args::BenchArgs;
use super::layer_inputs::parse_backend;

/// The expert weights a timed layer runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LayerDtype {
    /// Dense bf16 experts (`ExpertWeights<bf16>`).
    Bf16,
    /// Block-FP8 experts (`Fp8ExpertWeights`), bf16 activations.
    Fp8,
    /// MXFP4 experts (`Mxfp4ExpertWeights`: e2m1, UE8M0 per 32), bf16 activations quantised to MXFP8.
    Mxfp4,
    /// Per-channel FP8 experts (`Fp8ChannelExpertWeights`: e4m3, an f32 scale per output row), activations per
    /// token at run time.
    Fp8Channel,
}

impl LayerDtype {
    pub(super) fn name(self) -> &'static str {
        match self {
            LayerDtype::Bf16 => "bf16",
            LayerDtype::Fp8 => "fp8",
            LayerDtype::Mxfp4 => "mxfp4",
            LayerDtype::Fp8Channel => "fp8-channel",
        }
    }
}

/// The floor's two terms of a SwiGLU layer `[H, I]` with `active` experts holding rows and `rows` routed
/// (token, slot) rows: (weight bytes of the active experts, useful FLOPs). bf16: 2 bytes per element of w13
/// `[2I, H]` and w2 `[H, I]`; fp8: 1 byte per e4m3 element plus an f32 scale per 128 x 128 block of each
/// (`LayerShape::fp8_expert_bytes`, what the layer reads); mxfp4: half a byte per e2m1 element of the padded
/// extents plus their UE8M0 atoms (`LayerShape::mxfp4_expert_bytes`, what the layer reads). FLOPs
/// `2 · rows · 3 · H · I` for all.
pub(super) fn floor_terms(dtype: LayerDtype, active: usize, rows: usize, hidden: usize, inter: usize) -> (f64, f64) {
    let n = active as f64;
    let shape = LayerShape { experts: 1, global_experts: 1, top_k: 1, shared_groups: 0, hidden, inter, gated: true };
    let bytes = match dtype {
        LayerDtype::Bf16 => n * 3.0 * (hidden * inter) as f64 * 2.0,
        LayerDtype::Fp8 => n * shape.fp8_expert_bytes() as f64,
        LayerDtype::Mxfp4 => n * shape.mxfp4_expert_bytes() as f64,
        // One byte per e4m3 element, one f32 per output row of w13 [2I, H] and w2 [H, I].
        LayerDtype::Fp8Channel => n * (3 * hidden * inter + 4 * (2 * inter + hidden)) as f64,
    };
    (bytes, 2.0 * 3.0 * (rows * hidden * inter) as f64)
}

/// Why a model has no FP8 layer, or `None` where it has one: the FP8 layer requires H and I multiples of 128
/// (whole 128 x 128 weight-scale blocks of w13's gate and up halves and of w2).
pub(super) fn fp8_skip_reason(hidden: usize, inter: usize) -> Option<String> {
    let bad: Vec<String> = [("H", hidden), ("I", inter)]
        .into_iter()
        .filter(|&(_, v)| v == 0 || v % SCALE_BLOCK != 0)
        .map(|(n, v)| format!("{n} = {v} = {} x {SCALE_BLOCK}", v as f64 / SCALE_BLOCK as f64))
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "{}: the FP8 layer requires H and I multiples of {SCALE_BLOCK} (whole 128 x 128 weight-scale blocks)",
            bad.join(", ")
        )
    })
}

/// The backends of `--backends` the `dtype` layer runs (and Auto), in order.
pub(super) fn quant_backends(dtype: LayerDtype, backends: &[Backend]) -> Vec<Backend> {
    let set = match dtype {
        LayerDtype::Fp8 => Backends::FP8,
        LayerDtype::Mxfp4 => Backends::MX,
        LayerDtype::Fp8Channel => Backends::FP8_CHANNEL,
        LayerDtype::Bf16 => Backends::ALL,
    };
    backends.iter().copied().filter(|&b| b == Backend::Auto || set.contains(b)).collect()
}

/// Checks `--layer --dtype fp8|mxfp4`'s arguments before any device is touched.
///
/// # Errors
/// [`Error::InvalidProblem`] for an unknown backend, or a `--backends` list with no backend the layer runs.
pub fn validate_quant(args: &BenchArgs, dtype: LayerDtype) -> Result<()> {
    let backends: Vec<Backend> = args.backends.iter().map(|b| parse_backend(b)).collect::<Result<_>>()?;
    if quant_backends(dtype, &backends).is_empty() {
        let runs = match dtype {
            LayerDtype::Mxfp4 => "the MXFP4 layer runs grouped, contiguous, masked and auto",
            LayerDtype::Fp8Channel => {
                "the per-channel FP8 layer runs batched, grouped, contiguous, masked, fused and auto"
            }
            _ => "the FP8 layer runs batched, grouped, contiguous, masked, fused and auto",
        };
        return Err(Error::InvalidProblem(format!(
            "--layer --dtype {} --backends {}: {runs}; include at least one",
            dtype.name(),
            args.backends.join(",")
        )));
    }
    Ok(())
}

/// Why a model has no `dtype` layer, or `None` where it has one.
pub(super) fn quant_skip_reason(dtype: LayerDtype, hidden: usize, inter: usize) -> Option<String> {
    match dtype {
        LayerDtype::Mxfp4 => Mxfp4ExpertWeights::check_shape(hidden, inter).err().map(|e| e.to_string()),
        LayerDtype::Fp8 => fp8_skip_reason(hidden, inter),
        LayerDtype::Fp8Channel => Fp8ChannelExpertWeights::check_shape(hidden, inter).err().map(|e| e.to_string()),
        LayerDtype::Bf16 => None,
    }
}

/// MXFP4 experts `[local_e]` of a SwiGLU layer `[H, I]`: random e2m1 codes with UE8M0 scales 2^-9 ..= 2^-6
/// (weights below 0.094 in magnitude, the bf16 bench's scale), quantised on the host and uploaded.
pub(super) fn mx_weights(stream: &Arc<CudaStream>, experts: usize, h: usize, i: usize) -> Result<Mxfp4ExpertWeights> {
    let random = |rows: usize, k: usize, seed: u64| -> Result<Mxfp4> {
        let mut rng = SplitMix64(seed);
        let data: Vec<u8> = (0..rows * k / 2).map(|_| (rng.next_u64() >> 56) as u8).collect();
        let scales = (0..rows * k / MX_BLOCK).map(|_| Ue8m0(118 + (rng.next_u64() % 4) as u8)).collect();
        Mxfp4::from_parts(rows, k, data, scales)
    };
    let (w13, w2) = (random(experts * 2 * i, h, 27)?, random(experts * h, i, 28)?);
    let dims = (experts, h, i);
    Mxfp4ExpertWeights::upload(stream, dims, GateUp::Concatenated, Activation::SiluGated, &w13, &w2, (None, None))
}

/// Random positive f32 weight scales in [2^-12, 2^-11): with random e4m3 codes (|q| ≤ 448) the dequantised
/// weights stay below 0.22 in magnitude, so the activations stay finite through both GEMMs.
pub(super) fn random_scales(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..len).map(|_| (1.5 + 0.5 * rng.unit()) / 4096.0).collect()
}

/// Block-FP8 experts `[local_e]` of a SwiGLU layer `[H, I]` filled on the device (random e4m3 bytes tiled
/// from one host block, random positive scales).
pub(super) fn fp8_weights(stream: &Arc<CudaStream>, experts: usize, h: usize, i: usize) -> Result<Fp8ExpertWeights> {
    let mut q13 = stream.alloc_zeros::<F8E4M3>(experts * 2 * i * h)?;
    let mut q2 = stream.alloc_zeros::<F8E4M3>(experts * h * i)?;
    fill_e4m3(stream, &mut q13, 23)?;
    fill_e4m3(stream, &mut q2, 24)?;
    let s13 = stream.clone_htod(&random_scales(experts * scale_blocks(2 * i) * scale_blocks(h), 25))?;
    let s2 = stream.clone_htod(&random_scales(experts * scale_blocks(h) * scale_blocks(i), 26))?;
    let w13 = Fp8BlockWeights::new(q13, s13, experts, 2 * i, h)?;
    let w2 = Fp8BlockWeights::new(q2, s2, experts, h, i)?;
    Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, w13, w2, None, None)
}

/// Per-channel FP8 experts `[local_e]` of a SwiGLU layer `[H, I]` filled on the device (random e4m3 bytes,
/// random positive row scales as [`random_scales`]), activations per token at run time.
pub(super) fn channel_weights(
    stream: &Arc<CudaStream>,
    experts: usize,
    h: usize,
    i: usize,
) -> Result<Fp8ChannelExpertWeights> {
    let mut q13 = stream.alloc_zeros::<F8E4M3>(experts * 2 * i * h)?;
    let mut q2 = stream.alloc_zeros::<F8E4M3>(experts * h * i)?;
    fill_e4m3(stream, &mut q13, 33)?;
    fill_e4m3(stream, &mut q2, 34)?;
    let s13 = stream.clone_htod(&random_scales(experts * 2 * i, 35))?;
    let s2 = stream.clone_htod(&random_scales(experts * h, 36))?;
    let w13 = Fp8ChannelWeights::new(q13, s13, experts, 2 * i, h)?;
    let w2 = Fp8ChannelWeights::new(q2, s2, experts, h, i)?;
    Fp8ChannelExpertWeights::from_device(w13, w2, Activation::SiluGated, ActivationScales::DynamicToken)
}

/// The quantised layer timed beside the bf16 one.
pub(super) enum QuantLayer {
    Fp8(MoeLayer<bf16, Fp8ExpertWeights>),
    Mx(MoeLayer<bf16, Mxfp4ExpertWeights>),
    Channel(MoeLayer<bf16, Fp8ChannelExpertWeights>),
}

impl QuantLayer {
    pub(super) fn set_backend(&mut self, b: Backend) -> Result<()> {
        match self {
            QuantLayer::Fp8(l) => l.set_backend(b),
            QuantLayer::Mx(l) => l.set_backend(b),
            QuantLayer::Channel(l) => l.set_backend(b),
        }
    }
    pub(super) fn backend_for(&self, tokens: usize) -> Backend {
        match self {
            QuantLayer::Fp8(l) => l.backend_for(tokens),
            QuantLayer::Mx(l) => l.backend_for(tokens),
            QuantLayer::Channel(l) => l.backend_for(tokens),
        }
    }
    pub(super) fn passes(&self, tokens: usize) -> Result<usize> {
        match self {
            QuantLayer::Fp8(l) => l.passes(tokens),
            QuantLayer::Mx(l) => l.passes(tokens),
            QuantLayer::Channel(l) => l.passes(tokens),
        }
    }
    pub(super) fn auto_source(&self) -> AutoSource {
        match self {
            QuantLayer::Fp8(l) => l.auto_source(),
            QuantLayer::Mx(l) => l.auto_source(),
            QuantLayer::Channel(l) => l.auto_source(),
        }
    }
    pub(super) fn scratch(&self, stream: &Arc<CudaStream>) -> Result<MoeScratch<bf16>> {
        match self {
            QuantLayer::Fp8(l) => MoeScratch::for_layers(stream, [l]),
            QuantLayer::Mx(l) => MoeScratch::for_layers(stream, [l]),
            QuantLayer::Channel(l) => MoeScratch::for_layers(stream, [l]),
        }
    }
}

/// A layer over `w`, with the expert map under expert parallelism.
pub(super) fn plan<W: LayerWeights<bf16>>(
    stream: &Arc<CudaStream>,
    w: Arc<W>,
    opts: MoeLayerOptions,
    map: Option<&[i32]>,
) -> Result<MoeLayer<bf16, W>> {
    match map {
        Some(m) => MoeLayer::with_expert_map(stream, w, opts, m),
        None => MoeLayer::new(stream, w, opts),
    }
}

/// Fills `buf` with random e4m3 bytes, never a NaN code (0x7F, 0xFF): one random block of up to 16 MiB, tiled.
pub(super) fn fill_e4m3(stream: &Arc<CudaStream>, buf: &mut CudaSlice<F8E4M3>, seed: u64) -> Result<()> {
    let mut rng = SplitMix64(seed);
    let block: Vec<F8E4M3> = (0..buf.len().min(16 << 20))
        .map(|_| {
            let b = (rng.next_u64() >> 56) as u8;
            F8E4M3::from_bits(if b & 0x7F == 0x7F { b ^ 1 } else { b })
        })
        .collect();
    moe_gemm::random::fill_tiled(stream, buf, &block)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::MODELS;

    #[test]
    fn floor_terms_count_bf16_and_fp8_weight_bytes() {
        // DeepSeek-V3: H 7168, I 2048; 2 active experts, 10 rows.
        let (h, i) = (7168usize, 2048usize);
        let (b16, f16) = floor_terms(LayerDtype::Bf16, 2, 10, h, i);
        assert_eq!(b16, 2.0 * 3.0 * (h * i) as f64 * 2.0);
        assert_eq!(f16, 2.0 * 3.0 * 10.0 * (h * i) as f64);
        // e4m3: 1 byte per element of w13 [4096, 7168] and w2 [7168, 2048], plus f32 scales of their
        // 32 x 56 and 56 x 16 blocks.
        let (b8, f8) = floor_terms(LayerDtype::Fp8, 2, 10, h, i);
        assert_eq!(b8, 2.0 * (3 * h * i + 4 * (32 * 56 + 56 * 16)) as f64);
        assert_eq!(b8, 2.0 * 44_050_944.0);
        assert_eq!(f8, f16, "the FLOPs do not depend on the weights' dtype");
        assert_eq!(floor_terms(LayerDtype::Fp8, 0, 0, h, i), (0.0, 0.0));
        // Per channel: 1 byte per element, one f32 per output row of w13 (2I rows) and w2 (H rows).
        let (bc, fc) = floor_terms(LayerDtype::Fp8Channel, 2, 10, h, i);
        assert_eq!(bc, 2.0 * (3 * h * i + 4 * (2 * i + h)) as f64);
        assert_eq!(fc, f16);
    }

    #[test]
    fn models_without_whole_scale_blocks_are_skipped_with_the_reason() {
        for m in MODELS {
            let why = fp8_skip_reason(m.hidden, m.inter);
            if m.name == "gpt-oss-120b" {
                let why = why.expect("gpt-oss: H = I = 2880 = 22.5 x 128");
                assert!(why.contains("H = 2880 = 22.5 x 128") && why.contains("I = 2880"), "{why}");
                assert!(why.contains("requires H and I multiples of 128"), "{why}");
            } else {
                assert_eq!(why, None, "{}", m.name);
            }
        }
        // A tensor-parallel slice can break it: qwen3-30b-a3b's I = 768 / 4 = 192.
        let why = fp8_skip_reason(2048, 192).unwrap();
        assert!(why.contains("I = 192 = 1.5 x 128") && !why.contains("H ="), "{why}");
    }

    #[test]
    fn the_fp8_layer_takes_the_layout_backends_of_the_list() {
        let all: Vec<Backend> = ["eager", "batched", "grouped", "contiguous", "masked", "fused", "auto"]
            .iter()
            .map(|b| parse_backend(b).unwrap())
            .collect();
        assert_eq!(
            quant_backends(LayerDtype::Fp8, &all),
            vec![
                Backend::Batched,
                Backend::Grouped,
                Backend::Contiguous,
                Backend::Masked,
                Backend::Fused,
                Backend::Auto
            ]
        );
        assert!(quant_backends(LayerDtype::Fp8, &[Backend::Eager]).is_empty());
        let mx = [Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Auto];
        assert_eq!(quant_backends(LayerDtype::Mxfp4, &all), mx);
        let channel =
            [Backend::Batched, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused, Backend::Auto];
        assert_eq!(quant_backends(LayerDtype::Fp8Channel, &all), channel);
        assert_eq!(quant_skip_reason(LayerDtype::Fp8Channel, 2880, 2880), None, "gpt-oss: multiples of 16");
        assert!(quant_skip_reason(LayerDtype::Fp8Channel, 2880, 2888).unwrap().contains("I = 2888"));
        assert_eq!(quant_skip_reason(LayerDtype::Mxfp4, 2880, 2880), None);
        assert!(quant_skip_reason(LayerDtype::Mxfp4, 2880, 2848).unwrap().contains("2I = 5696"));
    }

    #[test]
    fn random_scales_are_positive_and_bounded() {
        let s = random_scales(10_000, 3);
        assert!(s.iter().all(|&x| (1.0 / 4096.0..2.0 / 4096.0).contains(&x)), "{:?}", &s[..4]);
        // With the largest e4m3 magnitude, a dequantised weight stays below 0.22.
        assert!(448.0 * s.iter().cloned().fold(0.0, f32::max) < 0.22);
    }
}
