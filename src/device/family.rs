//! Kernel families and the GPU targets each was compiled for.
//!
//! The build script compiles every CUDA unit for the targets it declares (the gencode table, `build/toolchain.rs`'s
//! `kernel_units`) and writes each family's targets into this crate. A plan asks its family whether the device
//! is one it has SASS for ([`crate::DeviceInfo::require`]), so that the requirement follows what was built and
//! no module names an architecture itself.

use super::Arch;

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernel_families.rs"));
}

/// A family of kernels: one or more CUDA units compiled with one list of targets.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// The SM90 bf16/f16 grouped GEMM ([`crate::kernels::grouped::GroupedGemm`]): wgmma, `sm_90a` only.
    GroupedGemmSm90,
    /// The SM90 FP8 blockwise grouped GEMM ([`crate::kernels::grouped_fp8::GroupedGemmFp8`]): wgmma, `sm_90a` only.
    GroupedGemmSm90Fp8,
    /// The fused gather/scatter MoE GEMMs ([`crate::kernels::fused::FusedGemm`]): wgmma, `sm_90a` only.
    FusedMoeSm90,
    /// The SM100 grouped GEMMs (bf16 [`crate::kernels::grouped_sm100::GroupedGemmSm100`], FP8 blockwise [`crate::kernels::grouped_fp8_sm100::GroupedGemmFp8Sm100`],
    /// block-scaled [`crate::kernels::grouped_mx::GroupedGemmMx`]): tcgen05 UMMA, `sm_100a` only.
    GroupedGemmSm100,
    /// The portable block-scaled grouped GEMM ([`crate::kernels::grouped_mx_portable::GroupedGemmMxPortable`]):
    /// the SM100 block-scaled GEMMs' operands on bf16 tensor cores (`wmma`), plain CUDA.
    GroupedGemmMxPortable,
    /// Routers ([`crate::Router`]): plain CUDA.
    Routing,
    /// Expert layouts, gather, combine ([`crate::layouts::ExpertLayout`]): plain CUDA.
    Layouts,
    /// Activations and the fused backend's sum over slots: plain CUDA.
    Activation,
    /// The batched decode layer: plain CUDA.
    Decode,
    /// FP8 activation quantisation ([`crate::quant`]): plain CUDA.
    Quant,
    /// Runtime facts and the benchmarks' spin and read-sweep kernels: plain CUDA.
    Runtime,
}

impl KernelFamily {
    pub const ALL: [KernelFamily; 11] = [
        KernelFamily::GroupedGemmSm90,
        KernelFamily::GroupedGemmSm90Fp8,
        KernelFamily::FusedMoeSm90,
        KernelFamily::GroupedGemmSm100,
        KernelFamily::GroupedGemmMxPortable,
        KernelFamily::Routing,
        KernelFamily::Layouts,
        KernelFamily::Activation,
        KernelFamily::Decode,
        KernelFamily::Quant,
        KernelFamily::Runtime,
    ];

    /// The family's name in the build's gencode table, e.g. `grouped_gemm_sm90`.
    pub const fn name(self) -> &'static str {
        match self {
            KernelFamily::GroupedGemmSm90 => "grouped_gemm_sm90",
            KernelFamily::GroupedGemmSm90Fp8 => "grouped_gemm_sm90_fp8",
            KernelFamily::FusedMoeSm90 => "fused_moe_sm90",
            KernelFamily::GroupedGemmSm100 => "grouped_gemm_sm100",
            KernelFamily::GroupedGemmMxPortable => "grouped_gemm_mx_portable",
            KernelFamily::Routing => "routing",
            KernelFamily::Layouts => "layouts",
            KernelFamily::Activation => "activation",
            KernelFamily::Decode => "decode",
            KernelFamily::Quant => "quant",
            KernelFamily::Runtime => "runtime",
        }
    }

    fn entry(self) -> Option<&'static (&'static str, &'static [&'static str], &'static [&'static str], &'static str)> {
        generated::FAMILY_TARGETS.iter().find(|(name, ..)| *name == self.name())
    }

    /// Whether the build compiled this family at all (every family of [`Self::ALL`] is in the default build).
    pub fn is_built(self) -> bool {
        self.entry().is_some()
    }

    /// The SASS targets compiled into the library for this family, e.g. `["sm_90a"]`, `["sm_90", "sm_100"]`.
    pub fn sass_targets(self) -> &'static [&'static str] {
        self.entry().map_or(&[], |e| e.1)
    }

    /// The PTX targets embedded for the driver to JIT-compile on GPUs without SASS here, e.g. `["compute_90"]`.
    pub fn ptx_targets(self) -> &'static [&'static str] {
        self.entry().map_or(&[], |e| e.2)
    }

    /// The SASS targets in words, as [`crate::Error::UnsupportedArch`] names them: `sm_90 or sm_100`.
    pub fn required(self) -> &'static str {
        self.entry().map_or("(not built)", |e| e.3)
    }

    /// The architectures whose SASS this family has.
    pub fn archs(self) -> impl Iterator<Item = Arch> {
        Arch::ALL.into_iter().filter(move |a| self.runs_on(*a))
    }

    /// Whether this family has SASS for `arch`. moe-gemm runs a kernel only where it has its SASS: the PTX is
    /// for GPUs moe-gemm does not know, and nothing is tested there.
    pub fn runs_on(self, arch: Arch) -> bool {
        self.sass_targets().iter().any(|t| *t == arch.target() || *t == arch.plain_target())
    }
}

display_by_name!(KernelFamily);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_in_the_build_table_and_back() {
        for f in KernelFamily::ALL {
            assert!(f.is_built(), "{f} is the family of no unit (build/toolchain.rs's kernel_units)");
            assert!(!f.sass_targets().is_empty(), "{f} has no SASS");
        }
        for (name, ..) in generated::FAMILY_TARGETS {
            assert!(KernelFamily::ALL.iter().any(|f| f.name() == *name), "build family {name} has no KernelFamily");
        }
    }

    #[test]
    fn gemm_families_run_on_their_arch_only_and_the_plain_ones_on_both() {
        let on = |f: KernelFamily| f.archs().collect::<Vec<_>>();
        let sm90 = [KernelFamily::GroupedGemmSm90, KernelFamily::GroupedGemmSm90Fp8, KernelFamily::FusedMoeSm90];
        for f in sm90 {
            assert_eq!(on(f), [Arch::Sm90], "{f}");
            assert_eq!(f.required(), "sm_90a");
        }
        assert_eq!(on(KernelFamily::GroupedGemmSm100), [Arch::Sm100]);
        // Every other family is plain: the portable MX GEMM and the CUDA ops.
        let plain = KernelFamily::ALL.into_iter().filter(|f| !sm90.contains(f) && *f != KernelFamily::GroupedGemmSm100);
        assert_eq!(plain.clone().count(), 7);
        for f in plain {
            assert_eq!(on(f), [Arch::Sm90, Arch::Sm100], "{f}");
            assert_eq!(f.required(), "sm_90 or sm_100");
            assert_eq!(f.ptx_targets(), ["compute_90"], "{f}");
        }
    }
}
