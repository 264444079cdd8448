//! The block-scaled (MX) grouped GEMM of the device: one plan, [`MxGemm`], whose constructor picks SM100's
//! CUTLASS kernel ([`GroupedGemmMx`]) on a Blackwell device and the portable one ([`GroupedGemmMxPortable`]:
//! exact dequantisation into bf16, `wmma`) on Hopper. Both take the same operands ([`MxRows`], [`MxWeights`]) and
//! group rows; only SM100's needs a workspace.
//!
//! SM100's kernel is compiled and SASS-checked, never run on hardware ([`crate::kernels::grouped_mx`]).

/// A block-scaled plan's constructors: `new`, which queries the device of `stream`, and `for_device` (its docs and
/// body given), both over one pair of formats and `groups` experts of `[n, k]` over at most `max_rows` rows. The
/// three plans of the family take the same seven arguments.
macro_rules! mx_planners {
    (
        $(#[$attr:meta])*
        fn for_device($device:ident, $a:ident, $w:ident, $groups:ident, $n:ident, $k:ident, $max_rows:ident)
            $body:block
    ) => {
        /// Plans `activations x weights` for `groups` experts of `[n, k]` over at most `max_rows` rows, on the
        /// device of `stream`.
        ///
        /// # Errors
        /// As [`Self::for_device`]; driver errors of the device query.
        pub fn new(
            stream: &std::sync::Arc<cudarc::driver::CudaStream>,
            activations: $crate::kernels::mx::MxFormat,
            weights: $crate::kernels::mx::MxFormat,
            groups: usize,
            n: usize,
            k: usize,
            max_rows: usize,
        ) -> $crate::error::Result<Self> {
            let device = $crate::device::DeviceInfo::query(stream.context())?;
            Self::for_device(device, activations, weights, groups, n, k, max_rows)
        }

        $(#[$attr])*
        pub fn for_device(
            $device: $crate::device::DeviceInfo,
            $a: $crate::kernels::mx::MxFormat,
            $w: $crate::kernels::mx::MxFormat,
            $groups: usize,
            $n: usize,
            $k: usize,
            $max_rows: usize,
        ) -> $crate::error::Result<Self> $body
    };
}

#[allow(unsafe_code)] // floor 0: the launcher over the bridge
mod launch;
pub mod portable;
pub mod sm100;

use half::bf16;

use crate::device::{Arch, KernelFamily};
use crate::error::Error;
use crate::kernels::plan::{self, Workspace};
use portable::GroupedGemmMxPortable;
use sm100::{GroupedGemmMx, MxConfig, MxFormat, MxRows, MxWeights};

#[derive(Debug)]
enum Planned {
    Sm100(GroupedGemmMx),
    Portable(GroupedGemmMxPortable),
}

/// A block-scaled grouped GEMM planned for one pair of formats, one shape and one device.
#[derive(Debug)]
pub struct MxGemm {
    plan: Planned,
}

impl MxGemm {
    mx_planners! {
        /// Plans for an already queried device: SM100's kernel on compute capability 10.0 (with its default
        /// configuration, [`MxConfig::default_for`]), the portable one on 9.0.
        ///
        /// # Errors
        /// The chosen plan's: [`Error::KernelNotBuilt`] for a pair of formats no kernel computes,
        /// [`Error::InvalidProblem`] for extents it cannot take, [`Error::UnsupportedArch`] naming the device on any
        /// other arch.
        fn for_device(device, activations, weights, groups, n, k, max_rows) {
            let (a, w) = (activations, weights);
            let plan = match plan::device_arch(&device, "grouped_gemm_mx", KernelFamily::GroupedGemmMxPortable)? {
                Arch::Sm100 => Planned::Sm100(GroupedGemmMx::for_device(device, a, w, groups, n, k, max_rows)?),
                Arch::Sm90 => {
                    Planned::Portable(GroupedGemmMxPortable::for_device(device, a, w, groups, n, k, max_rows)?)
                }
            };
            Ok(MxGemm { plan })
        }
    }

    /// Whether the plan runs the portable kernel (Hopper) rather than SM100's.
    pub fn is_portable(&self) -> bool {
        matches!(self.plan, Planned::Portable(_))
    }
    /// SM100's configuration (`None` for the portable kernel, which has one).
    pub fn config(&self) -> Option<MxConfig> {
        match &self.plan {
            Planned::Sm100(p) => Some(p.config()),
            Planned::Portable(_) => None,
        }
    }
    /// Rows of A (and D) the plan reads.
    pub fn max_rows(&self) -> usize {
        match &self.plan {
            Planned::Sm100(p) => p.max_rows(),
            Planned::Portable(p) => p.max_rows(),
        }
    }
    /// Bytes of device workspace a launch needs (0: the portable kernel takes none).
    pub fn workspace_bytes(&self) -> usize {
        match &self.plan {
            Planned::Sm100(p) => p.workspace_bytes(),
            Planned::Portable(_) => 0,
        }
    }

    grouped_launch! {
        /// Queues `D = alpha_g · A · Bᵀ` with both operands' block scales over the groups `rows` describes.
        ///
        /// # Errors
        /// [`Error::InvalidProblem`] (SM100) when no workspace is given; the chosen plan's launch errors.
        fn launch(&self, stream, a: MxRows<'_>, b: MxWeights<'_>, rows,
            d: bf16, workspace: Option<&mut Workspace>, status) {
            match &self.plan {
                Planned::Sm100(p) => {
                    let workspace = workspace.ok_or_else(|| {
                        Error::InvalidProblem("scratch capacity: the scratch holds no GEMM workspace".into())
                    })?;
                    p.launch(stream, a, b, rows, d, workspace, status)
                }
                Planned::Portable(p) => p.launch(stream, a, b, rows, d, status),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceInfo;

    #[test]
    fn picks_the_portable_kernel_on_hopper_and_sm100s_on_blackwell() {
        let (a, w) = (MxFormat::Mxfp8, MxFormat::Mxfp4);
        let h200 = DeviceInfo::described("NVIDIA H200", (9, 0), 132);
        let p = MxGemm::for_device(h200, a, w, 128, 5760, 2944, 4096).unwrap();
        assert!(p.is_portable() && p.config().is_none() && p.workspace_bytes() == 0);
        assert_eq!(p.max_rows(), 4096);
        let b200 = DeviceInfo::described("NVIDIA B200", (10, 0), 148);
        let p = MxGemm::for_device(b200, a, w, 128, 5760, 2944, 4096).unwrap();
        assert!(!p.is_portable() && p.config().is_some() && p.workspace_bytes() > 0);
        let a100 = DeviceInfo::described("NVIDIA A100", (8, 0), 108);
        let e = MxGemm::for_device(a100, a, w, 128, 5760, 2944, 4096).unwrap_err();
        assert!(matches!(e, Error::UnsupportedArch { .. }) && e.to_string().contains("A100"), "{e}");
    }
}
