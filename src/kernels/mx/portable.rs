//! The portable block-scaled grouped GEMM: the function of the SM100 block-scaled GEMMs
//! ([`GroupedGemmMx`](super::sm100::GroupedGemmMx)) over exactly their operand buffers, on any GPU this
//! family has SASS for (`sm_90a`, `sm_100a`), so that
//!
//! * MXFP4 checkpoints (gpt-oss) run on Hopper with their 4-bit weights kept 4-bit in memory, and
//! * the SM100 operand formats (the device quantisers' scale atoms and per-group atom bases, e2m1 packing, UE4M3
//!   scales with tensor scales) are exercised end to end on the H200 against a host reference: a device-side
//!   oracle for the SM100 kernels, which no GPU here can run.
//!
//! For every row `r` of group `g`: `D[r, n] = α_g Σ_k (qa[r, k] · sa[r, k/V]) · (qb[g][n, k] · sb[g][n, k/V])`, the
//! same pairs ([`MxConfig::for_formats`]: MXFP8 × MXFP8, MXFP8 × MXFP4, MXFP4 × MXFP4, NVFP4 × NVFP4; FP8 × NVFP4
//! refused with the same error), the same operands ([`MxRows`], [`MxWeights`]), the same group rows (offsets,
//! padded or masked, not per-row) and the same shape rules (N and K positive multiples of 128), so a problem one
//! plan accepts the other accepts too.
//!
//! How (`cpp/mx/grouped_mx_portable.cu`): each CTA dequantises 64 × 64 tiles of A and B into bf16 in shared memory —
//! exactly: an e4m3 or e2m1 code times a power of two or a UE4M3 scale has at most 8 significant bits — and
//! multiplies them with `wmma` bf16 16x16x16 MMAs into f32 accumulators, then applies α and rounds to bf16. The
//! result differs from an exact sum only by f32 accumulation and the bf16 rounding of D (the one place the SM100
//! kernels round too). Exactness of the dequantisation needs the products within bf16's range, as the
//! quantisers' scales of finite data give them; a block at UE8M0's extremes (scale 2^-127 with sub-2^-3 codes
//! below bf16's smallest subnormal 2^-133, or codes at the top of a scale near 2^127) would round or overflow.
//!
//! **Not tuned**: one 64 × 64 tile per CTA, register-prefetched K steps of 64, no pipelining beyond that. It
//! needs no workspace and allocates nothing; its launch is graph-safe like the SM100 one.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtrMut};
use half::bf16;

use super::launch;
use super::sm100::{check_plan, operands, MxConfig, MxFormat, MxRows, MxShape, MxWeights, MX_K_MULTIPLE};
use crate::device::DeviceInfo;
use crate::device::KernelFamily;
use crate::error::Result;
use crate::layouts::GroupRows;
use crate::status::DeviceStatus;

const OP: &str = "grouped_gemm_mx_portable";

/// A portable block-scaled grouped GEMM planned for one pair of formats, one shape and one device.
#[derive(Debug)]
pub struct GroupedGemmMxPortable {
    shape: MxShape,
    /// The pair's 1-SM configuration: it names the pair across the bridge (the portable kernel reads nothing
    /// else of it).
    config: MxConfig,
    device: DeviceInfo,
}

impl GroupedGemmMxPortable {
    mx_planners! {
        /// Plans for an already queried device.
        ///
        /// # Errors
        /// As [`GroupedGemmMx::for_device`](super::sm100::GroupedGemmMx::for_device), with the same texts:
        /// [`Error::KernelNotBuilt`](crate::Error::KernelNotBuilt) for a pair of formats the SM100 kernels do not
        /// compute (FP8 x NVFP4 among them); [`Error::InvalidProblem`](crate::Error::InvalidProblem) for `n` or `k`
        /// not positive multiples of 128 and the extents of [`crate::kernels::grouped_fp8::GroupedGemmFp8Shape::new`];
        /// [`Error::UnsupportedArch`](crate::Error::UnsupportedArch) naming the device on one this family has no SASS
        /// for ([`KernelFamily::GroupedGemmMxPortable`]: SM90 and SM100).
        fn for_device(device, activations, weights, groups, n, k, max_rows) {
            let shape = MxShape { groups, n, k, max_rows };
            let config = check_plan(activations, weights, shape)?;
            device.require(OP, KernelFamily::GroupedGemmMxPortable)?;
            Ok(GroupedGemmMxPortable { shape, config, device })
        }
    }

    /// (activations, weights).
    pub fn formats(&self) -> (MxFormat, MxFormat) {
        self.config.formats()
    }
    pub fn n(&self) -> usize {
        self.shape.n
    }
    pub fn k(&self) -> usize {
        self.shape.k
    }
    pub fn max_rows(&self) -> usize {
        self.shape.max_rows
    }
    pub fn groups(&self) -> usize {
        self.shape.groups
    }

    /// Queues `D = alpha_g · A · Bᵀ` with both operands' block scales over the groups `rows` describes: the
    /// launch of [`GroupedGemmMx::launch`](super::sm100::GroupedGemmMx::launch) without a workspace. Rows
    /// past a group's count are neither read (A) nor written (D); invalid group arrays are clamped and reported
    /// in `status` (as the other grouped GEMMs: [`DeviceStatus::check`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`](crate::Error::InvalidProblem) when `a` or `b` is not of the plan's formats or
    /// shape, or `rows` is per-row; [`Error::Buffer`](crate::Error::Buffer) for short or misaligned buffers;
    /// launch errors.
    pub fn launch<'r>(
        &self,
        stream: &Arc<CudaStream>,
        a: MxRows<'_>,
        b: MxWeights<'_>,
        rows: impl Into<GroupRows<'r>>,
        d: &mut impl DevicePtrMut<bf16>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let ops = operands(self.config.formats(), self.shape, a, b)?;
        let plan = self.shape.plan(self.config, MX_K_MULTIPLE, &self.device, 0);
        let rows = rows.into();
        launch::launch_portable(stream, &plan, ops, rows.to_ffi(), d, status.word_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::super::sm100::tests::device;
    use super::*;
    use crate::error::Error;
    use crate::kernels::mx::sm100::GroupedGemmMx;

    #[test]
    fn plans_the_four_pairs_on_hopper_and_blackwell() {
        for c in MxConfig::ALL.into_iter().filter(|c| c.sms_per_mma() == 1) {
            let (a, w) = c.formats();
            for dev in [device((9, 0), "NVIDIA H200"), device((10, 0), "NVIDIA B200")] {
                let plan = GroupedGemmMxPortable::for_device(dev, a, w, 128, 5760, 2944, 4096).unwrap();
                assert_eq!(plan.formats(), (a, w));
                assert_eq!((plan.groups(), plan.n(), plan.k(), plan.max_rows()), (128, 5760, 2944, 4096));
            }
        }
    }

    #[test]
    fn refuses_what_the_sm100_plans_refuse_with_their_texts() {
        let (h200, b200) = (device((9, 0), "NVIDIA H200"), device((10, 0), "NVIDIA B200"));
        let portable = |a, w, n, k| GroupedGemmMxPortable::for_device(h200.clone(), a, w, 8, n, k, 64).unwrap_err();
        let sm100 = |a, w, n, k| GroupedGemmMx::for_device(b200.clone(), a, w, 8, n, k, 64).unwrap_err();
        use MxFormat::{Mxfp4, Mxfp8, Nvfp4};
        // N = 64 (half an N tile), K = 96 (not whole 128s; gpt-oss's 2880 under MXFP4 weights), FP8 x NVFP4.
        for (a, w, n, k) in [(Mxfp8, Mxfp8, 64, 256), (Nvfp4, Nvfp4, 256, 96), (Mxfp8, Mxfp4, 5760, 2880)] {
            let e = portable(a, w, n, k);
            assert!(matches!(e, Error::InvalidProblem(_)), "{e:?}");
            assert_eq!(e.to_string(), sm100(a, w, n, k).to_string());
        }
        let e = portable(Mxfp8, Nvfp4, 256, 256);
        assert!(matches!(e, Error::KernelNotBuilt { .. }) && e.to_string().contains("CUTLASS 4.2 builder"), "{e}");
        assert_eq!(e.to_string(), sm100(Mxfp8, Nvfp4, 256, 256).to_string());
        // A device the family has no SASS for: named, with what the family was built for.
        let a100 = device((8, 0), "NVIDIA A100");
        let e = GroupedGemmMxPortable::for_device(a100, Mxfp8, Mxfp4, 8, 256, 256, 64).unwrap_err().to_string();
        assert!(e.contains("A100") && e.contains("sm_90 or sm_100") && e.contains(OP), "{e}");
    }
}
