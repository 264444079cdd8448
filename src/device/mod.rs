//! Per-device facts the kernels need, read once and cached in plans (never in function-local statics).

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::CudaContext;

use crate::error::{Error, Result};

mod family;
pub use family::KernelFamily;

/// GPU architectures moe-gemm has kernels for.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Hopper (H100, H200): compute capability 9.0, kernels built for `sm_90a`.
    Sm90,
    /// Blackwell datacenter (B200): compute capability 10.0, kernels built for `sm_100a`.
    Sm100,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm90, Arch::Sm100];

    /// The architecture whose arch-specific (`a`) kernels run on a device of this compute capability.
    /// `sm_90a` code runs on 9.0 only and `sm_100a` on 10.0 only: arch-specific SASS is not forward compatible.
    pub fn from_compute_capability(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90),
            (10, 0) => Some(Arch::Sm100),
            _ => None,
        }
    }

    /// The SASS target of this architecture's arch-specific kernels: `sm_90a`, `sm_100a`.
    pub const fn target(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90a",
            Arch::Sm100 => "sm_100a",
        }
    }

    /// The SASS target of this architecture's plain kernels (no arch-specific instruction): `sm_90`, `sm_100`.
    pub const fn plain_target(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90",
            Arch::Sm100 => "sm_100",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::Sm90 => "SM90 (Hopper, sm_90a)",
            Arch::Sm100 => "SM100 (Blackwell, sm_100a)",
        })
    }
}

/// Whether the CUDA driver library can be loaded. cudarc panics on first use when it cannot, so every entry
/// point that may run on a machine without a GPU asks this first.
pub fn driver_present() -> bool {
    crate::ffi::runtime::driver_present()
}

/// The CUDA version the installed driver supports, e.g. 13000 for 13.0.
pub fn driver_version() -> Result<i32> {
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded (no NVIDIA driver on this machine)".into()));
    }
    crate::ffi::runtime::driver_version()
}

/// Opens device `ordinal`, turning "no driver" into an error instead of cudarc's panic.
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded (no NVIDIA driver on this machine)".into()));
    }
    Ok(CudaContext::new(ordinal)?)
}

/// Queues a kernel that keeps `stream` busy for `micros` microseconds. Benchmarks queue their timed work
/// behind it, so that CUDA events measure the device's execution of back-to-back launches (as a CUDA graph
/// replays them) rather than the host's launch rate.
pub fn spin(stream: &std::sync::Arc<cudarc::driver::CudaStream>, micros: u64) -> Result<()> {
    crate::ffi::runtime::spin(stream, micros * 1000)
}

/// Facts about one device, read once.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: i32,
    pub l2_bytes: i32,
    pub max_smem_per_block_optin: i32,
    pub arch: Option<Arch>,
}

impl DeviceInfo {
    pub fn query(ctx: &CudaContext) -> Result<DeviceInfo> {
        let (major, minor) = ctx.compute_capability()?;
        Ok(DeviceInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name()?,
            compute_capability: (major, minor),
            sm_count: ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            max_smem_per_block_optin: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            arch: Arch::from_compute_capability(major, minor),
        })
    }

    /// A device described, not queried: what plans read of one (name, compute capability, SM count), for
    /// planning on a machine without it (`moe-gemm plan --compute-capability`, the CPU tests' B200). Ordinal 0;
    /// the L2 and shared-memory sizes, which no plan reads, are 0.
    pub fn described(name: impl Into<String>, (major, minor): (i32, i32), sm_count: i32) -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: name.into(),
            compute_capability: (major, minor),
            sm_count,
            l2_bytes: 0,
            max_smem_per_block_optin: 0,
            arch: Arch::from_compute_capability(major, minor),
        }
    }

    /// `Ok` when `family` was built for this device's architecture (it has SASS for it); otherwise the error
    /// that names both: what the family was built for and what the device is.
    pub fn require(&self, op: &'static str, family: KernelFamily) -> Result<()> {
        if self.arch.is_some_and(|a| family.runs_on(a)) {
            return Ok(());
        }
        Err(Error::UnsupportedArch {
            op,
            required: family.required(),
            ordinal: self.ordinal,
            name: self.name.clone(),
            major: self.compute_capability.0,
            minor: self.compute_capability.1,
        })
    }
}
