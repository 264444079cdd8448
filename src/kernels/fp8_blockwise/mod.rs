//! The FP8 blockwise grouped GEMM (e4m3 with 1x128 activation and 128x128 weight scales) of the device's
//! architecture: one plan, [`BlockwiseFp8Gemm`], whose constructor picks SM90's kernel ([`GroupedGemmFp8`]) or
//! SM100's ([`GroupedGemmFp8Sm100`]) for the device it is planned on. Both read the same operands ([`Fp8Rows`],
//! [`Fp8BlockWeights`]), group rows and workspace; a caller names an arch only to force a configuration
//! ([`BlockwiseConfig`]).
//!
//! SM100's kernel is compiled and SASS-checked, never run on hardware ([`crate::kernels::grouped_fp8_sm100`]).

#[allow(unsafe_code)] // floor 0: the launcher over the bridge
mod launch;
pub mod sm100;
pub mod sm90;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;

use crate::device::{Arch, DeviceInfo, KernelFamily};
use crate::error::Result;
use crate::kernels::plan::{self, Workspace};
use crate::quant::{Fp8BlockWeights, Fp8Rows};
use sm100::{Fp8Sm100Config, GroupedGemmFp8Sm100};
use sm90::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};

/// A compiled configuration of the FP8 blockwise grouped GEMM, of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockwiseConfig {
    Sm90(Fp8TileConfig),
    Sm100(Fp8Sm100Config),
}

impl BlockwiseConfig {
    /// The default on `arch` for `shape` and about `expected_rows` rows in all: [`Fp8TileConfig::heuristic`] on
    /// SM90, [`Fp8Sm100Config::default_for`] (which reads the shape's rows per group) on SM100.
    pub fn heuristic(arch: Arch, shape: &GroupedGemmFp8Shape, expected_rows: usize) -> BlockwiseConfig {
        match arch {
            Arch::Sm90 => BlockwiseConfig::Sm90(Fp8TileConfig::heuristic(shape.groups(), expected_rows)),
            Arch::Sm100 => BlockwiseConfig::Sm100(Fp8Sm100Config::default_for(shape)),
        }
    }

    /// The arch whose kernel this configuration is.
    pub const fn arch(self) -> Arch {
        match self {
            BlockwiseConfig::Sm90(_) => Arch::Sm90,
            BlockwiseConfig::Sm100(_) => Arch::Sm100,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BlockwiseConfig::Sm90(c) => c.name(),
            BlockwiseConfig::Sm100(c) => c.name(),
        }
    }
}

#[derive(Debug)]
enum Planned {
    Sm90(GroupedGemmFp8),
    Sm100(GroupedGemmFp8Sm100),
}

/// An FP8 blockwise grouped GEMM planned for one shape and device, on the device's arch.
#[derive(Debug)]
pub struct BlockwiseFp8Gemm {
    plan: Planned,
}

impl BlockwiseFp8Gemm {
    /// Plans `shape` on the device of `stream` with `config` (or the arch's default for about `expected_rows`
    /// rows, default `max_rows`).
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GroupedGemmFp8Shape,
        config: Option<BlockwiseConfig>,
        expected_rows: Option<usize>,
    ) -> Result<Self> {
        Self::for_device(DeviceInfo::query(stream.context())?, shape, config, expected_rows)
    }

    /// Plans for an already queried device (no driver call): SM90's kernel on compute capability 9.0, SM100's on
    /// 10.0.
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`](crate::error::Error::UnsupportedArch) naming the device on any other; [`Error::InvalidProblem`](crate::error::Error::InvalidProblem) for a `config` of
    /// the other arch, naming both; the arch plan's errors ([`Error::KernelNotBuilt`](crate::error::Error::KernelNotBuilt)).
    pub fn for_device(
        device: DeviceInfo,
        shape: GroupedGemmFp8Shape,
        config: Option<BlockwiseConfig>,
        expected_rows: Option<usize>,
    ) -> Result<Self> {
        let (op, what) = ("grouped_gemm_fp8", "FP8 blockwise grouped GEMM");
        let forced = config.map(|c| (c.name(), c.arch()));
        let arch = plan::pick_arch(&device, op, KernelFamily::GroupedGemmSm90Fp8, what, forced)?;
        let plan = match arch {
            Arch::Sm90 => {
                let config = config.and_then(|c| if let BlockwiseConfig::Sm90(t) = c { Some(t) } else { None });
                let options = GroupedGemmFp8Options { config, expected_rows };
                Planned::Sm90(GroupedGemmFp8::for_device(device, shape, options)?)
            }
            Arch::Sm100 => {
                let plan = GroupedGemmFp8Sm100::for_device(device, shape)?;
                Planned::Sm100(match config {
                    Some(BlockwiseConfig::Sm100(c)) => plan.with_config(c)?,
                    _ => plan,
                })
            }
        };
        Ok(BlockwiseFp8Gemm { plan })
    }

    arch_plan_accessors!(GroupedGemmFp8Shape);

    pub fn config(&self) -> BlockwiseConfig {
        match &self.plan {
            Planned::Sm90(p) => BlockwiseConfig::Sm90(p.config()),
            Planned::Sm100(p) => BlockwiseConfig::Sm100(p.config()),
        }
    }

    grouped_launch! {
        /// Queues `D = blockwise(A, B)` over the groups `rows` describes on `stream`: [`GroupedGemmFp8::launch`]'s
        /// operands and errors, on either arch.
        ///
        /// # Errors
        /// As [`GroupedGemmFp8::launch`].
        fn launch(&self, stream, a: &Fp8Rows, b: &Fp8BlockWeights, rows, d: bf16, workspace: &mut Workspace, status) {
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

    fn shape() -> GroupedGemmFp8Shape {
        GroupedGemmFp8Shape::new(8, 4096, 7168, 4096).unwrap()
    }

    #[test]
    fn picks_the_arch_of_the_device_and_its_default() {
        for (cc, name, arch) in [((9, 0), "NVIDIA H200", Arch::Sm90), ((10, 0), "NVIDIA B200", Arch::Sm100)] {
            let dev = DeviceInfo::described(name, cc, 132);
            let p = BlockwiseFp8Gemm::for_device(dev, shape(), None, Some(16)).unwrap();
            assert_eq!(p.config(), BlockwiseConfig::heuristic(arch, &shape(), 16), "{name}");
            assert_eq!(p.config().arch(), arch);
            // 2 rows per group: SM90's swap-AB decode kernel, which needs no workspace.
            assert_eq!(p.workspace_bytes() > 0, arch == Arch::Sm100, "{name}");
        }
        // A forced configuration of the device's arch is taken.
        let b200 = DeviceInfo::described("NVIDIA B200", (10, 0), 148);
        let one = BlockwiseConfig::Sm100(Fp8Sm100Config::Blockwise1Sm128x128x128);
        assert_eq!(BlockwiseFp8Gemm::for_device(b200, shape(), Some(one), None).unwrap().config(), one);
    }

    #[test]
    fn refuses_another_archs_configuration_and_an_unknown_device_by_name() {
        let b200 = DeviceInfo::described("NVIDIA B200", (10, 0), 148);
        let sm90 = BlockwiseConfig::Sm90(Fp8TileConfig::Pingpong64x128x128);
        let e = BlockwiseFp8Gemm::for_device(b200, shape(), Some(sm90), None).unwrap_err().to_string();
        assert!(e.contains(sm90.name()) && e.contains("B200") && e.contains("SM100"), "{e}");
        let l40 = DeviceInfo::described("NVIDIA L40S", (8, 9), 142);
        let e = BlockwiseFp8Gemm::for_device(l40, shape(), None, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedArch { .. }) && e.to_string().contains("L40S"), "{e}");
    }
}
