//! The dense (bf16 / f16) grouped GEMM of the device's architecture: one plan, [`DenseGemm`], whose constructor
//! picks SM90's kernel ([`GroupedGemm`]) or SM100's ([`GroupedGemmSm100`]) for the device it is planned on. Both
//! take the same operands, group rows and workspace, so a caller (the layer, a server) launches either alike and
//! names an arch only to force a tile configuration ([`DenseConfig`]).
//!
//! SM100's kernel is compiled and SASS-checked, never run on hardware ([`crate::kernels::grouped_sm100`]).

#[allow(unsafe_code)] // floor 0: the launcher over the bridge
pub(super) mod launch;
pub mod sm100;
pub mod sm90;

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use crate::device::{Arch, DeviceInfo, KernelFamily};
use crate::dtype::Element;
use crate::error::Result;
use crate::kernels::plan::{self, Workspace};
use crate::kernels::TileConfig;
use sm100::{GroupedGemmSm100, GroupedGemmSm100Options, Sm100TileConfig};
use sm90::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};

/// A compiled tile configuration of the dense grouped GEMM, of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseConfig {
    Sm90(TileConfig),
    Sm100(Sm100TileConfig),
}

impl DenseConfig {
    /// The default configuration on `arch` for `groups` groups of an `[n, k]` weight over about `expected_rows`
    /// rows in all on `sm_count` SMs: [`TileConfig::heuristic`] or [`Sm100TileConfig::heuristic`].
    pub fn heuristic(arch: Arch, groups: usize, n: usize, expected_rows: usize, sm_count: usize) -> DenseConfig {
        match arch {
            Arch::Sm90 => DenseConfig::Sm90(TileConfig::heuristic(groups, n, expected_rows, sm_count)),
            Arch::Sm100 => DenseConfig::Sm100(Sm100TileConfig::heuristic(groups, n, expected_rows, sm_count)),
        }
    }

    /// The arch whose kernel this configuration is.
    pub const fn arch(self) -> Arch {
        match self {
            DenseConfig::Sm90(_) => Arch::Sm90,
            DenseConfig::Sm100(_) => Arch::Sm100,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DenseConfig::Sm90(c) => c.name(),
            DenseConfig::Sm100(c) => c.name(),
        }
    }
}

/// The plan of one arch's kernel.
#[derive(Debug)]
enum Planned<T: Element> {
    Sm90(GroupedGemm<T>),
    Sm100(GroupedGemmSm100<T>),
}

/// A dense grouped GEMM planned for one shape, element type and device, on the device's arch.
#[derive(Debug)]
pub struct DenseGemm<T: Element> {
    plan: Planned<T>,
}

impl<T: Element> DenseGemm<T> {
    /// Plans `shape` on the device of `stream`, with `config` (or the arch's heuristic for about
    /// `expected_rows` rows, default `max_rows`).
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GroupedGemmShape,
        config: Option<DenseConfig>,
        expected_rows: Option<usize>,
    ) -> Result<Self> {
        Self::for_device(DeviceInfo::query(stream.context())?, shape, config, expected_rows)
    }

    /// Plans for an already queried device (no driver call): SM90's kernel on a compute capability 9.0 device,
    /// SM100's on 10.0.
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`](crate::error::Error::UnsupportedArch) naming the device on any other (the SM90 family's text: what it was built
    /// for); [`Error::InvalidProblem`](crate::error::Error::InvalidProblem) for a `config` of the other arch, naming both; the arch plan's errors
    /// ([`Error::KernelNotBuilt`](crate::error::Error::KernelNotBuilt) for a configuration not compiled for `T`).
    pub fn for_device(
        device: DeviceInfo,
        shape: GroupedGemmShape,
        config: Option<DenseConfig>,
        expected_rows: Option<usize>,
    ) -> Result<Self> {
        let forced = config.map(|c| (c.name(), c.arch()));
        let arch =
            plan::pick_arch(&device, "grouped_gemm", KernelFamily::GroupedGemmSm90, "dense grouped GEMM", forced)?;
        let plan = match arch {
            Arch::Sm90 => {
                let config = config.and_then(|c| if let DenseConfig::Sm90(t) = c { Some(t) } else { None });
                Planned::Sm90(GroupedGemm::for_device(device, shape, GroupedGemmOptions { config, expected_rows })?)
            }
            Arch::Sm100 => {
                let config = config.and_then(|c| if let DenseConfig::Sm100(t) = c { Some(t) } else { None });
                let options = GroupedGemmSm100Options { config, expected_rows };
                Planned::Sm100(GroupedGemmSm100::for_device(device, shape, options)?)
            }
        };
        Ok(DenseGemm { plan })
    }

    arch_plan_accessors!(GroupedGemmShape);

    pub fn config(&self) -> DenseConfig {
        match &self.plan {
            Planned::Sm90(p) => DenseConfig::Sm90(p.config()),
            Planned::Sm100(p) => DenseConfig::Sm100(p.config()),
        }
    }

    grouped_launch! {
        /// Queues `D = grouped(A, B)` over the groups `rows` describes on `stream`: [`GroupedGemm::launch`]'s
        /// operands and errors, on either arch.
        ///
        /// # Errors
        /// As [`GroupedGemm::launch`].
        fn launch(&self, stream, a: &impl DevicePtr<T>, b: &impl DevicePtr<T>, rows,
            d: T, workspace: &mut Workspace, status) {
            match &self.plan {
                Planned::Sm90(p) => p.launch(stream, a, b, rows, d, workspace, status),
                Planned::Sm100(p) => p.launch(stream, a, b, rows, d, workspace, status),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use half::bf16;

    fn shape() -> GroupedGemmShape {
        GroupedGemmShape::new(8, 4096, 7168, 512).unwrap()
    }

    #[test]
    fn picks_the_arch_of_the_device_and_its_heuristic() {
        for (cc, name, arch) in [((9, 0), "NVIDIA H200", Arch::Sm90), ((10, 0), "NVIDIA B200", Arch::Sm100)] {
            let dev = DeviceInfo::described(name, cc, 132);
            let p = DenseGemm::<bf16>::for_device(dev, shape(), None, Some(16)).unwrap();
            assert_eq!(p.config(), DenseConfig::heuristic(arch, 8, 4096, 16, 132), "{name}");
            assert_eq!(p.config().arch(), arch);
            assert!(p.workspace_bytes() > 0);
            assert_eq!(p.flops(2), 2.0 * 2.0 * 4096.0 * 7168.0);
        }
    }

    #[test]
    fn refuses_another_archs_configuration_and_an_unknown_device_by_name() {
        let h200 = DeviceInfo::described("NVIDIA H200", (9, 0), 132);
        let sm100 = DenseConfig::Sm100(Sm100TileConfig::Mma1Sm128x256x64);
        let e = DenseGemm::<bf16>::for_device(h200, shape(), Some(sm100), None).unwrap_err().to_string();
        assert!(e.contains(sm100.name()) && e.contains("H200") && e.contains("SM90"), "{e}");
        let a100 = DeviceInfo::described("NVIDIA A100", (8, 0), 108);
        let e = DenseGemm::<bf16>::for_device(a100, shape(), None, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedArch { .. }) && e.to_string().contains("A100"), "{e}");
    }
}
