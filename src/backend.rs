//! [`Backend`]: how a layer lays out and multiplies its routed rows, and [`Backends`], a set of them (the
//! backends a plan makes room for in the scratch).

use std::fmt;

/// Most (token, slot) rows the batched backend takes in one pass: one GEMM group per row is a decode strategy.
pub const BATCHED_MAX_ROWS: usize = 4096;

/// How the layer lays out and multiplies the routed rows.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    Eager,
    Batched,
    Grouped,
    Contiguous,
    Masked,
    Fused,
    /// Picks per call: see [`MoeLayer::backend_for`](crate::MoeLayer::backend_for).
    Auto,
}

impl Backend {
    pub const CONCRETE: [Backend; 6] =
        [Backend::Eager, Backend::Batched, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];

    pub const fn name(self) -> &'static str {
        match self {
            Backend::Eager => "eager",
            Backend::Batched => "batched",
            Backend::Grouped => "grouped",
            Backend::Contiguous => "contiguous",
            Backend::Masked => "masked",
            Backend::Fused => "fused",
            Backend::Auto => "auto",
        }
    }

    /// The operation an [`crate::Error::UnsupportedArch`] names when this backend's kernels were not built for
    /// the device.
    pub(crate) const fn layer_op(self) -> &'static str {
        match self {
            Backend::Eager => "the MoE layer's eager backend",
            Backend::Batched => "the MoE layer's batched backend",
            Backend::Grouped => "the MoE layer's grouped backend",
            Backend::Contiguous => "the MoE layer's contiguous backend",
            Backend::Masked => "the MoE layer's masked backend",
            Backend::Fused => "the MoE layer's fused backend (SM90 wgmma gather/scatter GEMMs, no SM100 form)",
            Backend::Auto => "the MoE layer's auto backend",
        }
    }

    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::CONCRETE.into_iter().chain([Backend::Auto]).find(|b| b.name() == name)
    }

    const fn bit(self) -> u8 {
        match self {
            Backend::Eager => 1,
            Backend::Batched => 2,
            Backend::Grouped => 4,
            Backend::Contiguous => 8,
            Backend::Masked => 16,
            Backend::Fused => 32,
            Backend::Auto => 0,
        }
    }
}

display_by_name!(Backend);

/// A set of concrete backends.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Backends(u8);

impl Backends {
    pub const NONE: Backends = Backends(0);
    /// Every concrete backend.
    pub const ALL: Backends = Backends(63);
    /// What `Auto` picks among: Batched, Fused, Grouped.
    pub const AUTO: Backends = Backends(2 | 4 | 32);
    /// What a layer over FP8 expert weights runs: the layout backends Grouped, Contiguous and Masked (the FP8
    /// blockwise grouped GEMM), Fused (the FP8 fused gather/scatter GEMMs) and Batched (the FP8 decode kernels).
    /// Eager has no FP8 form.
    pub const FP8: Backends = Backends(2 | 4 | 8 | 16 | 32);
    /// What a layer over MXFP4 expert weights runs: the layout backends (the block-scaled grouped GEMM over a
    /// layout's groups). No decode kernel reads MXFP4 yet; the Fused GEMMs are bf16/FP8 wgmma kernels.
    pub const MX: Backends = Backends(4 | 8 | 16);
    /// What a layer over per-channel FP8 expert weights runs: Batched and Fused (the FP8 decode kernels and fused
    /// GEMMs, where H and I are multiples of 128) and the layout backends (the FP8 rowwise grouped GEMM).
    pub const FP8_CHANNEL: Backends = Backends(2 | 4 | 8 | 16 | 32);
    /// What `Auto` picks among over FP8 weights (block or per channel): Batched, Grouped.
    pub const FP8_AUTO: Backends = Backends(2 | 4);

    /// The backends `backend` can run: itself, or [`Backends::AUTO`] for `Auto`.
    pub const fn of(backend: Backend) -> Backends {
        match backend {
            Backend::Auto => Backends::AUTO,
            b => Backends(b.bit()),
        }
    }

    pub const fn with(self, backend: Backend) -> Backends {
        Backends(self.0 | Backends::of(backend).0)
    }

    pub const fn union(self, other: Backends) -> Backends {
        Backends(self.0 | other.0)
    }

    pub const fn without(self, backend: Backend) -> Backends {
        Backends(self.0 & !backend.bit())
    }
    pub const fn contains(self, backend: Backend) -> bool {
        let b = Backends::of(backend).0;
        b != 0 && self.0 & b == b
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Backend> {
        Backend::CONCRETE.into_iter().filter(move |&b| self.contains(b))
    }
}

impl FromIterator<Backend> for Backends {
    fn from_iter<I: IntoIterator<Item = Backend>>(iter: I) -> Self {
        iter.into_iter().fold(Backends::NONE, Backends::with)
    }
}

impl fmt::Debug for Backends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl fmt::Display for Backends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Backend::name).collect();
        f.pad(&names.join(","))
    }
}

/// How a layer's expert weights are stored, and so which GEMMs multiply them. More may come (FP4, MXFP8):
/// match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// In the layer's element type (bf16 or f16): [`ExpertWeights`](crate::layer::ExpertWeights), the bf16/f16 grouped and fused GEMMs.
    Dense,
    /// e4m3 with one f32 scale per 128 × 128 block (DeepSeek-V3's recipe), the activations quantised per token
    /// per 128 columns on the device before each GEMM: [`Fp8ExpertWeights`](crate::layer::Fp8ExpertWeights), the FP8
    /// blockwise grouped GEMM of the device's arch (SM90 or SM100), or the FP8 decode kernels. Runs the Batched,
    /// Grouped, Contiguous, Masked and (SM90 only) Fused backends (`Auto`: Batched or Grouped; Grouped on SM100).
    Fp8Block,
    /// e2m1 with one UE8M0 scale per 32 (gpt-oss's MXFP4), the activations quantised to MXFP8 on the device
    /// before each GEMM: [`Mxfp4ExpertWeights`](crate::layer::Mxfp4ExpertWeights), the block-scaled grouped GEMM of the
    /// device's arch (SM100 CUTLASS, or the portable kernel). Runs Grouped, Contiguous and Masked (`Auto`:
    /// Grouped).
    Mxfp4,
    /// e4m3 with one f32 scale per output channel (a per-tensor scale repeated over its rows), the activations
    /// quantised per token (at run time, or by the checkpoint's static `input_scale`): [`Fp8ChannelExpertWeights`](crate::layer::Fp8ChannelExpertWeights),
    /// the SM90 FP8 rowwise grouped GEMM, the FP8 decode kernels or the FP8 fused GEMMs. Runs Batched and Fused
    /// (H and I multiples of 128), Grouped, Contiguous and Masked (`Auto`: Batched or Grouped).
    Fp8Channel,
}

impl WeightFormat {
    pub const fn name(self) -> &'static str {
        match self {
            WeightFormat::Dense => "dense",
            WeightFormat::Fp8Block => "fp8 block 128x128",
            WeightFormat::Mxfp4 => "mxfp4 (e2m1, ue8m0 per 32)",
            WeightFormat::Fp8Channel => "fp8 per channel (per-token activations)",
        }
    }

    /// The backends a layer over weights of this format runs (on an arch that has their kernels).
    pub const fn backends(self) -> Backends {
        match self {
            WeightFormat::Dense => Backends::ALL,
            WeightFormat::Fp8Block => Backends::FP8,
            WeightFormat::Mxfp4 => Backends::MX,
            WeightFormat::Fp8Channel => Backends::FP8_CHANNEL,
        }
    }
}

display_by_name!(WeightFormat);
