//! What a layer runs on its device's architecture, decided once when it is planned: the grouped GEMM of its
//! layout backends ([`LayerGemm`]) and which backends have SASS for the device. A pure function of
//! [`DeviceInfo`], so planning for a described B200 is tested on the CPU: no SM100 GPU is available to this
//! project, and nothing of the SM100 layer path has run on hardware.

use crate::device::KernelFamily;
use crate::device::{Arch, DeviceInfo};
use crate::error::Result;

use super::weights::WeightFormat;
use crate::backend::{Backend, Backends};

/// The grouped GEMM a layer's layout backends (Grouped, Contiguous, Masked, and Eager over dense weights)
/// multiply with, chosen from the weights' format and the device's arch.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerGemm {
    /// The SM90 bf16/f16 grouped GEMM ([`crate::kernels::grouped::GroupedGemm`]).
    Sm90Dense,
    /// The SM100 bf16 grouped GEMM ([`crate::kernels::grouped_sm100::GroupedGemmSm100`]): the SM90 one's operands and group rows on
    /// tcgen05 tensor cores (no f16 kernel is built). Compiled and SASS-checked only.
    Sm100Dense,
    /// The SM90 FP8 blockwise grouped GEMM ([`crate::kernels::grouped_fp8::GroupedGemmFp8`]).
    Sm90Fp8Blockwise,
    /// The SM100 FP8 blockwise grouped GEMM ([`crate::kernels::grouped_fp8_sm100::GroupedGemmFp8Sm100`]): same operands, group offsets and
    /// activation quantisation as SM90. Compiled and SASS-checked only.
    Sm100Fp8Blockwise,
    /// The SM100 block-scaled grouped GEMM, MXFP8 activations × MXFP4 weights
    /// ([`crate::kernels::grouped_mx::GroupedGemmMx`], CUTLASS's MXF8F6F4 kernel). Compiled and SASS-checked only.
    Sm100Mxf8f4,
    /// The portable block-scaled grouped GEMM over the same operands
    /// ([`crate::kernels::grouped_mx_portable::GroupedGemmMxPortable`]): what MXFP4 layers run on SM90.
    PortableMxf8f4,
    /// The SM90 FP8 rowwise-scaled grouped GEMM ([`crate::kernels::grouped_fp8_rowwise::GroupedGemmFp8Rowwise`]):
    /// per-token activation scales times per-channel weight scales. SM90 only: on SM100 the layer refuses these
    /// weights (the device check names the family).
    Sm90Fp8Rowwise,
}

impl LayerGemm {
    /// The GEMM a layer over `format` weights runs on `arch`.
    pub const fn for_arch(format: WeightFormat, arch: Arch) -> LayerGemm {
        match (format, arch) {
            (WeightFormat::Fp8Block, Arch::Sm100) => LayerGemm::Sm100Fp8Blockwise,
            (WeightFormat::Fp8Block, Arch::Sm90) => LayerGemm::Sm90Fp8Blockwise,
            (WeightFormat::Dense, Arch::Sm100) => LayerGemm::Sm100Dense,
            (WeightFormat::Dense, Arch::Sm90) => LayerGemm::Sm90Dense,
            (WeightFormat::Mxfp4, Arch::Sm100) => LayerGemm::Sm100Mxf8f4,
            (WeightFormat::Mxfp4, Arch::Sm90) => LayerGemm::PortableMxf8f4,
            (WeightFormat::Fp8Channel, _) => LayerGemm::Sm90Fp8Rowwise,
        }
    }

    /// The weight format the GEMM multiplies.
    pub const fn format(self) -> WeightFormat {
        match self {
            LayerGemm::Sm90Dense | LayerGemm::Sm100Dense => WeightFormat::Dense,
            LayerGemm::Sm90Fp8Blockwise | LayerGemm::Sm100Fp8Blockwise => WeightFormat::Fp8Block,
            LayerGemm::Sm100Mxf8f4 | LayerGemm::PortableMxf8f4 => WeightFormat::Mxfp4,
            LayerGemm::Sm90Fp8Rowwise => WeightFormat::Fp8Channel,
        }
    }

    /// The arch a layer runs this GEMM on (the portable one is built for both; layers take it on SM90).
    pub const fn arch(self) -> Arch {
        match self {
            LayerGemm::Sm90Dense
            | LayerGemm::Sm90Fp8Blockwise
            | LayerGemm::PortableMxf8f4
            | LayerGemm::Sm90Fp8Rowwise => Arch::Sm90,
            LayerGemm::Sm100Dense | LayerGemm::Sm100Fp8Blockwise | LayerGemm::Sm100Mxf8f4 => Arch::Sm100,
        }
    }

    /// The kernel family the GEMM was compiled in.
    pub const fn family(self) -> KernelFamily {
        match self {
            LayerGemm::Sm90Dense => KernelFamily::GroupedGemmSm90,
            LayerGemm::Sm100Dense => KernelFamily::GroupedGemmSm100,
            LayerGemm::Sm90Fp8Blockwise | LayerGemm::Sm90Fp8Rowwise => KernelFamily::GroupedGemmSm90Fp8,
            LayerGemm::Sm100Fp8Blockwise | LayerGemm::Sm100Mxf8f4 => KernelFamily::GroupedGemmSm100,
            LayerGemm::PortableMxf8f4 => KernelFamily::GroupedGemmMxPortable,
        }
    }

    /// The FP8 blockwise GEMM (over block-FP8 weights) rather than the dense one.
    pub const fn is_fp8(self) -> bool {
        matches!(self.format(), WeightFormat::Fp8Block)
    }

    /// The rowwise GEMM over per-channel FP8 weights.
    pub const fn is_fp8_channel(self) -> bool {
        matches!(self.format(), WeightFormat::Fp8Channel)
    }

    /// A block-scaled (MX) GEMM over MXFP4 weights.
    pub const fn is_mx(self) -> bool {
        matches!(self.format(), WeightFormat::Mxfp4)
    }

    pub const fn name(self) -> &'static str {
        match self {
            LayerGemm::Sm90Dense => "grouped_gemm_sm90",
            LayerGemm::Sm100Dense => "grouped_gemm_sm100",
            LayerGemm::Sm90Fp8Blockwise => "grouped_gemm_sm90_fp8_blockwise",
            LayerGemm::Sm100Fp8Blockwise => "grouped_gemm_sm100_fp8_blockwise",
            LayerGemm::Sm100Mxf8f4 => "grouped_gemm_sm100_mx (mxfp8 x mxfp4)",
            LayerGemm::PortableMxf8f4 => "grouped_gemm_mx_portable (mxfp8 x mxfp4)",
            LayerGemm::Sm90Fp8Rowwise => "grouped_gemm_sm90_fp8_rowwise",
        }
    }

    /// Whether `Auto`'s cost models ([`super::auto_backend`], [`super::auto_backend_fp8`]) were fitted on this
    /// GEMM's arch. They were measured on an H200; on SM100 nothing has been measured, so `Auto` runs Grouped,
    /// the backend whose GEMM is the SM100 plan, until a B200 fits its own crossover. MXFP4 layers run only
    /// the layout backends, of which `Auto` takes Grouped; per-channel FP8 layers take the FP8 model (the same
    /// decode kernels, a rowwise GEMM of about the blockwise one's cost).
    pub(crate) const fn auto_cost_model_fits(self) -> bool {
        matches!(self.arch(), Arch::Sm90) && !self.is_mx()
    }

    /// The backends `Auto` plans room for (without a tuned table).
    pub(crate) const fn auto_backends(self, expert_parallel: bool) -> Backends {
        if expert_parallel || !self.auto_cost_model_fits() {
            Backends::of(Backend::Grouped)
        } else if self.is_fp8() || self.is_fp8_channel() {
            Backends::FP8_AUTO
        } else {
            Backends::AUTO
        }
    }

    /// The backends whose kernels have SASS for this GEMM's arch, among those the weights' format runs.
    pub(crate) fn runnable(self) -> Backends {
        let (format_set, arch) = (self.format().backends(), self.arch());
        format_set.iter().filter(|&b| families(b, self).iter().all(|f| f.runs_on(arch))).collect()
    }
}

display_by_name!(LayerGemm);

/// The kernel families `backend` launches when its GEMMs are `gemm`. The Fused backend's gather/scatter GEMMs
/// (bf16 and FP8) are SM90 wgmma kernels; layouts, activations, quantisation and the decode kernels are plain
/// CUDA built for both arches.
fn families(backend: Backend, gemm: LayerGemm) -> Vec<KernelFamily> {
    use KernelFamily as F;
    let quant = (gemm.format() != WeightFormat::Dense).then_some(F::Quant);
    let mut out = match backend {
        Backend::Batched => vec![F::Decode],
        Backend::Fused => vec![F::Layouts, F::Activation, F::FusedMoeSm90],
        Backend::Eager | Backend::Grouped | Backend::Contiguous | Backend::Masked => {
            vec![F::Layouts, F::Activation, gemm.family()]
        }
        Backend::Auto => vec![],
    };
    out.extend(quant.filter(|_| backend != Backend::Batched));
    out
}

/// `Ok` when every kernel `backend` launches (with `gemm` for its GEMMs) has SASS for `device`; otherwise
/// [`crate::Error::UnsupportedArch`] naming the backend, the target its kernels were built for and the device.
/// `Auto` is checked through the concrete backends it may pick.
pub(crate) fn check_backend(device: &DeviceInfo, backend: Backend, gemm: LayerGemm) -> Result<()> {
    for f in families(backend, gemm) {
        device.require(backend.layer_op(), f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_on_sm100_runs_everything_but_fused_and_sm90_runs_all_fp8_backends() {
        let sm100 = LayerGemm::for_arch(WeightFormat::Fp8Block, Arch::Sm100);
        assert_eq!(sm100, LayerGemm::Sm100Fp8Blockwise);
        assert_eq!(sm100.family(), KernelFamily::GroupedGemmSm100);
        assert_eq!(sm100.runnable().to_string(), "batched,grouped,contiguous,masked");
        assert_eq!(sm100.auto_backends(false), Backends::of(Backend::Grouped));
        let sm90 = LayerGemm::for_arch(WeightFormat::Fp8Block, Arch::Sm90);
        assert_eq!(sm90, LayerGemm::Sm90Fp8Blockwise);
        assert_eq!(sm90.runnable(), Backends::FP8);
        assert_eq!(sm90.auto_backends(false), Backends::FP8_AUTO);
        assert_eq!(sm90.auto_backends(true), Backends::of(Backend::Grouped));
        assert_eq!(LayerGemm::for_arch(WeightFormat::Dense, Arch::Sm90).runnable(), Backends::ALL);
    }

    #[test]
    fn dense_on_sm100_runs_the_sm100_gemm_and_every_backend_but_fused() {
        let sm100 = LayerGemm::for_arch(WeightFormat::Dense, Arch::Sm100);
        assert_eq!(sm100, LayerGemm::Sm100Dense);
        assert_eq!(
            (sm100.family(), sm100.arch(), sm100.is_fp8()),
            (KernelFamily::GroupedGemmSm100, Arch::Sm100, false)
        );
        assert_eq!(sm100.runnable().to_string(), "eager,batched,grouped,contiguous,masked");
        assert_eq!(sm100.auto_backends(false), Backends::of(Backend::Grouped));
        let sm90 = LayerGemm::for_arch(WeightFormat::Dense, Arch::Sm90);
        assert_eq!((sm90.family(), sm90.arch()), (KernelFamily::GroupedGemmSm90, Arch::Sm90));
        assert_eq!(sm90.auto_backends(false), Backends::AUTO);
    }

    #[test]
    fn mxfp4_runs_the_layout_backends_on_the_arch_gemm() {
        for (arch, gemm, family) in [
            (Arch::Sm100, LayerGemm::Sm100Mxf8f4, KernelFamily::GroupedGemmSm100),
            (Arch::Sm90, LayerGemm::PortableMxf8f4, KernelFamily::GroupedGemmMxPortable),
        ] {
            let g = LayerGemm::for_arch(WeightFormat::Mxfp4, arch);
            assert_eq!((g, g.family(), g.arch(), g.format()), (gemm, family, arch, WeightFormat::Mxfp4));
            assert!(g.is_mx() && !g.is_fp8());
            assert_eq!(g.runnable().to_string(), "grouped,contiguous,masked");
            assert_eq!(g.auto_backends(false), Backends::of(Backend::Grouped));
            assert!(families(Backend::Grouped, g).contains(&KernelFamily::Quant));
        }
    }
}
