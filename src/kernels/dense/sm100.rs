//! SM100 (Blackwell, `sm_100a`) persistent grouped GEMM with device-side groups: the SM90 [`GroupedGemm`]'s
//! problem on tcgen05 tensor cores (CUTLASS 4.2 `KernelPtrArrayTmaWarpSpecialized1SmSm100`, accumulators in
//! tensor memory).
//!
//! **Status: compiled, its SASS checked (`tests/sass.rs`: `UTCHMMA`), its host side tested; never run on a
//! Blackwell GPU.** Treat results on hardware as unverified until the GPU tests have run there.
//!
//! Operands, group descriptions and rules are those of [`GroupedGemm`] (see [`crate::kernels::grouped`]): A
//! `[max_rows, K]` row-major, B `[G, N, K]`, D `[max_rows, N]`, the groups a [`GroupRows`] on the device, clamped
//! and reported into the [`DeviceStatus`] by our prepare kernel. A launch queues the prepare kernel and CUTLASS's,
//! and does no allocation, copy or synchronisation.
//!
//! A plan of its own rather than a branch of [`GroupedGemm`]: its tile configurations are UMMA tiles
//! ([`Sm100TileConfig`]), not SM90's cooperative/ping-pong schedules, and a caller (the layer, the benchmark)
//! reaches this unverified kernel only by asking for it.
//!
//! [`GroupedGemm`]: crate::kernels::grouped::GroupedGemm
//!
//! [`GroupRows`]: crate::layouts::GroupRows
//! [`DeviceStatus`]: crate::status::DeviceStatus

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use super::launch;
use super::sm90::GroupedGemmShape;
use crate::device::DeviceInfo;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::kernels::plan::{self, Workspace};

const OP: &str = "grouped_gemm_sm100";

/// A compiled tile configuration of the SM100 grouped GEMM: one SM per MMA (1SM UMMA), cluster 1x1x1. The C++
/// enum in `cpp/dense/launch.h` is the source of truth; the bridge checks the discriminants.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sm100TileConfig {
    /// MMA tile 128x256x64: prefill, one read of an A tile per 256 columns of N.
    Mma1Sm128x256x64,
    /// MMA tile 128x128x64: few active experts, twice the CTAs streaming weights for the same N.
    Mma1Sm128x128x64,
}

impl Sm100TileConfig {
    pub const ALL: [Sm100TileConfig; 2] = [Sm100TileConfig::Mma1Sm128x256x64, Sm100TileConfig::Mma1Sm128x128x64];

    /// MMA tile (M, N, K).
    pub const fn tile(self) -> (u32, u32, u32) {
        match self {
            Sm100TileConfig::Mma1Sm128x256x64 => (128, 256, 64),
            Sm100TileConfig::Mma1Sm128x128x64 => (128, 128, 64),
        }
    }

    /// Thread-block cluster (M, N): 1x1.
    pub const fn cluster(self) -> (u32, u32) {
        (1, 1)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Sm100TileConfig::Mma1Sm128x256x64 => "sm100-1sm-128x256x64",
            Sm100TileConfig::Mma1Sm128x128x64 => "sm100-1sm-128x128x64",
        }
    }

    config_queries!();

    /// Whether this configuration was compiled for `dtype` into the linked library (bf16 only so far).
    pub fn is_built(self, dtype: DType) -> bool {
        launch::built_sm100(dtype, self.into())
    }

    /// What the compiled kernel of this configuration is, read from its CUTLASS types (host only).
    ///
    /// # Errors
    /// [`Error::KernelNotBuilt`] when it was not compiled for `dtype`.
    pub fn facts(self, dtype: DType) -> Result<Sm100KernelFacts> {
        let f = launch::facts_sm100(dtype, self.into())?;
        let u = |v: i32| v.max(0) as u32;
        Ok(Sm100KernelFacts {
            tile: (u(f.tile_m), u(f.tile_n), u(f.tile_k)),
            cluster: (u(f.cluster_m), u(f.cluster_n)),
            sms_per_mma: u(f.atom_m),
            stages: u(f.stages),
            umma_array_mainloop: f.umma_array_mainloop,
            ptr_array_epilogue: f.ptr_array_epilogue,
        })
    }

    /// The default for `groups` groups of an `[n, k]` weight over about `expected_rows` rows in all, on a device
    /// of `sm_count` SMs. **Not measured** (no Blackwell GPU has run it): the SM90 family's rule carried over.
    /// 128x128 tiles when the experts that can be active hold 256-wide N tiles for at most half the SMs (more
    /// CTAs to stream the weights), 128x256 otherwise.
    pub fn heuristic(groups: usize, n: usize, expected_rows: usize, sm_count: usize) -> Sm100TileConfig {
        let active = groups.min(expected_rows.max(1));
        if 2 * active * n.div_ceil(256) <= sm_count {
            Sm100TileConfig::Mma1Sm128x128x64
        } else {
            Sm100TileConfig::Mma1Sm128x256x64
        }
    }
}

variants_into!(Sm100TileConfig => launch::Sm100TileConfig { Mma1Sm128x256x64, Mma1Sm128x128x64 });

display_by_name!(Sm100TileConfig);

/// Compile-time facts of a built [`Sm100TileConfig`], read from the CUTLASS types of the compiled kernel.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sm100KernelFacts {
    /// MMA tile (M, N, K).
    pub tile: (u32, u32, u32),
    /// Cluster (M, N).
    pub cluster: (u32, u32),
    /// SMs per MMA: 1 for the 1SM schedules.
    pub sms_per_mma: u32,
    /// Shared-memory pipeline stages the builder chose.
    pub stages: u32,
    /// The builder picked CUTLASS's ptr-array UMMA mainloop (`MainloopSm100ArrayTmaUmmaWarpSpecialized`).
    pub umma_array_mainloop: bool,
    /// The epilogue is the ptr-array one (per-group TMA descriptors).
    pub ptr_array_epilogue: bool,
}

/// Options of a [`GroupedGemmSm100`] plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupedGemmSm100Options {
    /// Force a tile configuration; `None` picks [`Sm100TileConfig::heuristic`].
    pub config: Option<Sm100TileConfig>,
    /// Expected rows in all groups together (T·k), a speed hint only. Default `max_rows`.
    pub expected_rows: Option<usize>,
}

/// An SM100 grouped GEMM planned for one shape, element type and device.
#[derive(Debug)]
pub struct GroupedGemmSm100<T: Element> {
    shape: GroupedGemmShape,
    config: Sm100TileConfig,
    device: DeviceInfo,
    workspace_bytes: u64,
    _t: PhantomData<T>,
}

impl<T: Element> GroupedGemmSm100<T> {
    /// Plans on the device of `stream`.
    ///
    /// # Errors
    /// As [`Self::for_device`]; driver errors of the device query.
    pub fn new(stream: &Arc<CudaStream>, shape: GroupedGemmShape, options: GroupedGemmSm100Options) -> Result<Self> {
        let device = DeviceInfo::query(stream.context())?;
        Self::for_device(device, shape, options)
    }

    /// Plans for an already queried device (no driver call).
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the family was built for the device (SM100, compute capability 10.0:
    /// `sm_100a` SASS runs there only); [`Error::KernelNotBuilt`] when the configuration was not compiled for `T`
    /// (f16 is not, yet).
    pub fn for_device(device: DeviceInfo, shape: GroupedGemmShape, options: GroupedGemmSm100Options) -> Result<Self> {
        let expected = options.expected_rows.unwrap_or(shape.max_rows());
        let config = options.config.unwrap_or_else(|| {
            Sm100TileConfig::heuristic(shape.groups(), shape.n(), expected, device.sm_count.max(1) as usize)
        });
        let workspace_bytes = plan::planned_workspace(&device, config, Some(T::DTYPE), shape.groups())?;
        Ok(GroupedGemmSm100 { shape, config, device, workspace_bytes, _t: PhantomData })
    }

    // The workspace holds our per-group arrays and CUTLASS's per-SM TMA descriptors.
    plan_accessors!(GroupedGemmShape, Sm100TileConfig);

    grouped_launch! {
        /// Queues `D = grouped(A, B)` over the groups `rows` describes on `stream`, as [`GroupedGemm::launch`].
        ///
        /// # Errors
        /// As [`GroupedGemm::launch`]: [`Error::Buffer`], [`Error::WorkspaceTooSmall`], CUTLASS or CUDA launch
        /// errors; invalid group *values* are clamped on the device and reported into `status`.
        ///
        /// [`GroupedGemm::launch`]: crate::kernels::grouped::GroupedGemm::launch
        fn launch(&self, stream, a: &impl DevicePtr<T>, b: &impl DevicePtr<T>, rows,
            d: T, workspace: &mut Workspace, status) {
            let kernel = launch::GroupedKernel::Sm100(self.config.into());
            let plan = plan::launch_plan(kernel, self.shape.dims(), &self.device, self.workspace_bytes);
            let rows = rows.into();
            launch::launch(stream, &plan, a, b, rows.to_ffi(), d, workspace.buf_mut(), status.word_mut())
        }
    }
}

arch_config!(Sm100TileConfig, OP, GroupedGemmSm100, per_dtype launch::workspace_bytes_sm100);

/// Bytes of workspace a plan of `config` over `groups` groups needs on a device of `sm_count` SMs (host only).
///
/// # Errors
/// [`Error::KernelNotBuilt`] when `config` was not compiled for `dtype` (f16 is not).
pub(crate) fn workspace_bytes(dtype: DType, config: Sm100TileConfig, groups: usize, sm_count: usize) -> Result<usize> {
    if !config.is_built(dtype) {
        return Err(Error::KernelNotBuilt { op: OP, dtype: Some(dtype), config: Some(config.name().into()) });
    }
    Ok(launch::workspace_bytes_sm100(dtype, config.into(), groups, sm_count.min(i32::MAX as usize) as i32)? as usize)
}
