//! SM100 block-scaled grouped GEMMs with device-side groups: MXFP8 activations (e4m3 with a UE8M0 scale per 32 of
//! K) times MXFP8 or MXFP4 (gpt-oss's e2m1) weights with the same scales, tcgen05 `kind::mxf8f6f4`, bf16 out.
//!
//! For every row `r` of group `g`: `D[r, n] = Σ_k (qa[r, k] · 2^sfa[r, k/32]) · (qb[g][n, k] · 2^sfb[g][n, k/32])`.
//!
//! * A: [`Mxfp8Rows`] — e4m3 `[max_rows, K]` and each group's scales in CUTLASS's 128 x 4 atoms at the base
//!   [`crate::quant::quantize_mxfp8_grouped`] computed on the device: the launch reads the bases from there, so
//!   the step stays graph-safe and needs no host copy of the counts;
//! * B: [`Mxfp8Weights`] (e4m3 `[G, N, K]`) or [`Mxfp4Weights`] (e2m1 packed `[G, N, K / 2]`), each expert's
//!   scale atoms ([`MxWeights`]);
//! * D: bf16 `[max_rows, N]`; groups: offsets, padded or masked (not per-row).
//!
//! **Never run on hardware**: no SM100 GPU is available to this project. The kernel is compiled for `sm_100a` and
//! its machine code checked (`tests/sass.rs`: the block-scaled `UTCQMMA` with its scale operand in tensor memory,
//! `UTCCP` copying scales there); the activation layout it reads is built by a kernel that runs, and is tested,
//! on the H200; plans on any other arch are refused with [`Error::UnsupportedArch`].

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtrMut};
use half::bf16;

use super::grouped_fp8::check_fp8_extents;
use crate::device::DeviceInfo;
use crate::error::{Error, Result};
use crate::ffi;
use crate::kernels::grouped::{GroupRows, Workspace};
use crate::kernels::KernelFamily;
use crate::quant::{Mxfp4Weights, Mxfp8Rows, Mxfp8Weights};
use crate::status::DeviceStatus;

const OP: &str = "grouped_gemm_sm100_mxfp8";

/// A compiled configuration (`cpp/launch_sm100_mx.h`).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MxConfig {
    /// MXFP8 x MXFP8, one SM per MMA, 128 x 128 x 128.
    Mxf8Mma1Sm128x128x128,
    /// MXFP8 x MXFP4, one SM per MMA, 128 x 128 x 128.
    Mxf8f4Mma1Sm128x128x128,
}

impl MxConfig {
    pub const ALL: [MxConfig; 2] = [MxConfig::Mxf8Mma1Sm128x128x128, MxConfig::Mxf8f4Mma1Sm128x128x128];
    pub const fn name(self) -> &'static str {
        match self {
            MxConfig::Mxf8Mma1Sm128x128x128 => "mxf8-1sm-128x128x128",
            MxConfig::Mxf8f4Mma1Sm128x128x128 => "mxf8f4-1sm-128x128x128",
        }
    }
    /// The weights it takes.
    pub const fn weights(self) -> MxWeightFormat {
        match self {
            MxConfig::Mxf8Mma1Sm128x128x128 => MxWeightFormat::Mxfp8,
            MxConfig::Mxf8f4Mma1Sm128x128x128 => MxWeightFormat::Mxfp4,
        }
    }
    pub fn is_built(self) -> bool {
        ffi::grouped_mx::built(self.into())
    }
}

impl From<MxConfig> for ffi::grouped_mx::Sm100MxConfig {
    fn from(c: MxConfig) -> Self {
        match c {
            MxConfig::Mxf8Mma1Sm128x128x128 => ffi::grouped_mx::Sm100MxConfig::Mxf8Mma1Sm128x128x128,
            MxConfig::Mxf8f4Mma1Sm128x128x128 => ffi::grouped_mx::Sm100MxConfig::Mxf8f4Mma1Sm128x128x128,
        }
    }
}

/// The weights' element format of an MX grouped GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MxWeightFormat {
    /// e4m3, UE8M0 per 32.
    Mxfp8,
    /// e2m1 packed two per byte, UE8M0 per 32 (gpt-oss).
    Mxfp4,
}

/// The expert weights of a launch.
#[derive(Clone, Copy, Debug)]
pub enum MxWeights<'a> {
    Mxfp8(&'a Mxfp8Weights),
    Mxfp4(&'a Mxfp4Weights),
}

impl MxWeights<'_> {
    fn format(&self) -> MxWeightFormat {
        match self {
            MxWeights::Mxfp8(_) => MxWeightFormat::Mxfp8,
            MxWeights::Mxfp4(_) => MxWeightFormat::Mxfp4,
        }
    }
    fn shape(&self) -> (usize, usize, usize) {
        match self {
            MxWeights::Mxfp8(w) => (w.experts(), w.n(), w.k()),
            MxWeights::Mxfp4(w) => (w.experts(), w.n(), w.k()),
        }
    }
}

/// An MXFP8 grouped GEMM planned for one shape and SM100 device.
#[derive(Debug)]
pub struct GroupedGemmMxfp8 {
    groups: usize,
    n: usize,
    k: usize,
    max_rows: usize,
    config: MxConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
}

impl GroupedGemmMxfp8 {
    /// Plans for `groups` experts of `[n, k]` over at most `max_rows` rows, on the device of `stream`.
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(
        stream: &Arc<CudaStream>,
        weights: MxWeightFormat,
        groups: usize,
        n: usize,
        k: usize,
        max_rows: usize,
    ) -> Result<Self> {
        Self::for_device(DeviceInfo::query(stream.context())?, weights, groups, n, k, max_rows)
    }

    /// Plans for an already queried device.
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] naming the device and the arch the kernel needs (SM100) on any other device;
    /// [`Error::InvalidProblem`] for `n` or `k` not positive multiples of 128 (whole MMA tiles of N and whole
    /// scale atoms of K; for MXFP4 weights also CUTLASS's 128-element rows of a 4-bit operand under
    /// `kind::mxf8f6f4`: gpt-oss's K = 2880 is refused here) and the extents of
    /// [`crate::GroupedGemmFp8Shape::new`].
    pub fn for_device(
        device: DeviceInfo,
        weights: MxWeightFormat,
        groups: usize,
        n: usize,
        k: usize,
        max_rows: usize,
    ) -> Result<Self> {
        for (name, v) in [("N", n), ("K", k)] {
            if v == 0 || v % 128 != 0 {
                let fp4 = if weights == MxWeightFormat::Mxfp4 && name == "K" {
                    "; a 4-bit operand under kind::mxf8f6f4 needs 128-element rows"
                } else {
                    ""
                };
                return Err(Error::InvalidProblem(format!(
                    "MX grouped GEMM: {name} = {v} is not a positive multiple of 128 (whole 128-wide MMA tiles of \
                     N, whole 4 x 32 scale atoms of K{fp4})"
                )));
            }
        }
        check_fp8_extents(groups, n, k, max_rows)?;
        device.require(OP, KernelFamily::GroupedGemmSm100)?;
        let config = match weights {
            MxWeightFormat::Mxfp8 => MxConfig::Mxf8Mma1Sm128x128x128,
            MxWeightFormat::Mxfp4 => MxConfig::Mxf8f4Mma1Sm128x128x128,
        };
        if !config.is_built() {
            return Err(Error::KernelNotBuilt { op: OP, dtype: None, config: Some(config.name().into()) });
        }
        let workspace_bytes = ffi::grouped_mx::workspace_bytes(config.into(), groups, device.sm_count)?;
        Ok(GroupedGemmMxfp8 { groups, n, k, max_rows, config, device, workspace_bytes })
    }

    pub fn config(&self) -> MxConfig {
        self.config
    }
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes as usize
    }

    /// Queues `D = A · Bᵀ` with both operands' block scales over the groups `rows` describes.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `a` or `b` is not of the plan's shape; [`Error::Buffer`] for short or
    /// misaligned buffers; [`Error::WorkspaceTooSmall`]; launch errors.
    #[allow(clippy::too_many_arguments)]
    pub fn launch<'r>(
        &self,
        stream: &Arc<CudaStream>,
        a: &Mxfp8Rows,
        b: MxWeights<'_>,
        rows: impl Into<GroupRows<'r>>,
        d: &mut impl DevicePtrMut<bf16>,
        workspace: &mut Workspace,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let (be, bn, bk) = b.shape();
        if b.format() != self.config.weights() {
            return Err(Error::InvalidProblem(format!(
                "MX grouped GEMM planned for {:?} weights, launched with {:?}",
                self.config.weights(),
                b.format()
            )));
        }
        if (a.max_rows(), a.k(), a.groups()) != (self.max_rows, self.k, self.groups)
            || (be, bn, bk) != (self.groups, self.n, self.k)
        {
            return Err(Error::InvalidProblem(format!(
                "MX operands: A [{}, {}] over {} groups, B [{be}, {bn}, {bk}], for a plan of {} groups of [{}, {}] \
                 over {} rows",
                a.max_rows(),
                a.k(),
                a.groups(),
                self.groups,
                self.n,
                self.k,
                self.max_rows
            )));
        }
        let plan = ffi::grouped_mx::MxPlan {
            config: self.config.into(),
            groups: self.groups,
            n: self.n,
            k: self.k,
            max_rows: self.max_rows,
            device: self.device.ordinal as i32,
            sm_count: self.device.sm_count,
            workspace_bytes: self.workspace_bytes,
        };
        let (bq, sfb) = match b {
            MxWeights::Mxfp8(w) => (ffi::grouped_mx::MxB::E4m3(w.q()), w.sf()),
            MxWeights::Mxfp4(w) => (ffi::grouped_mx::MxB::E2m1(w.q()), w.sf()),
        };
        let ops = ffi::grouped_mx::MxOperands { a: a.q(), sfa: a.sf(), sfa_bases: a.sf_bases(), b: bq, sfb };
        let rows = rows.into();
        ffi::grouped_mx::launch(stream, &plan, ops, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Arch;

    fn device(cc: (i32, i32), name: &str) -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: name.into(),
            compute_capability: cc,
            sm_count: 148,
            l2_bytes: 126 << 20,
            max_smem_per_block_optin: 227 << 10,
            arch: Arch::from_compute_capability(cc.0, cc.1),
        }
    }

    #[test]
    fn plans_on_sm100_and_refuses_hopper_naming_both() {
        let b200 = device((10, 0), "NVIDIA B200");
        for (w, c) in [
            (MxWeightFormat::Mxfp8, MxConfig::Mxf8Mma1Sm128x128x128),
            (MxWeightFormat::Mxfp4, MxConfig::Mxf8f4Mma1Sm128x128x128),
        ] {
            let plan = GroupedGemmMxfp8::for_device(b200.clone(), w, 256, 4096, 7168, 4096).unwrap();
            assert_eq!((plan.config(), c.weights()), (c, w));
            assert!(plan.workspace_bytes() > 0);
        }
        match GroupedGemmMxfp8::for_device(device((9, 0), "NVIDIA H200"), MxWeightFormat::Mxfp8, 256, 4096, 7168, 4096)
        {
            Err(e @ Error::UnsupportedArch { .. }) => {
                let m = e.to_string();
                assert!(m.contains("H200") && m.contains("grouped_gemm_sm100_mxfp8"), "{m}");
            }
            other => panic!("expected UnsupportedArch, got {other:?}"),
        }
        // gpt-oss's K = 2880 under MXFP4: refused, naming the 4-bit operand's rule.
        let e = GroupedGemmMxfp8::for_device(b200, MxWeightFormat::Mxfp4, 128, 5760, 2880, 64).unwrap_err().to_string();
        assert!(e.contains("K = 2880 is not a positive multiple of 128") && e.contains("4-bit operand"), "{e}");
    }
}
