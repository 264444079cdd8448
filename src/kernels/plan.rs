//! What every GEMM plan of this module shares, written once: the caller-owned workspace, the accessors of a
//! validated shape (`groups`, `n`, `k`, `max_rows`) and those of a plan (its shape, configuration, device,
//! workspace size and FLOP count). The families differ in what they plan and launch, not in these.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::Result;

/// Caller-owned device workspace of a plan: the per-group argument arrays and CUTLASS's scratch. One workspace
/// at least as large as a plan's [`workspace_bytes`](crate::kernels::grouped::GroupedGemm::workspace_bytes)
/// serves any plan, of any family.
#[derive(Debug)]
pub struct Workspace {
    buf: CudaSlice<u8>,
}

impl Workspace {
    /// A zeroed workspace of `bytes` (one buffer any plan needing at most `bytes` can launch with).
    pub(crate) fn zeroed(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        Ok(Workspace { buf: stream.alloc_zeros::<u8>(bytes)? })
    }

    /// The buffer, for the launchers of the plans that share this workspace type.
    pub(crate) fn buf_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The getters of a shape struct with private `groups`, `n`, `k` and `max_rows` fields.
macro_rules! shape_accessors {
    () => {
        /// Groups (experts) of B.
        pub fn groups(&self) -> usize {
            self.groups
        }
        /// Rows of each expert's weight (columns of D).
        pub fn n(&self) -> usize {
            self.n
        }
        /// The reduction extent.
        pub fn k(&self) -> usize {
            self.k
        }
        /// Rows of A (and D) a launch may read (and write).
        pub fn max_rows(&self) -> usize {
            self.max_rows
        }
        /// (groups, N, K, max_rows).
        pub(crate) fn dims(&self) -> (usize, usize, usize, usize) {
            (self.groups, self.n, self.k, self.max_rows)
        }
    };
}

/// The accessors of a plan struct with `shape: $shape`, `config: $config`, `device: DeviceInfo` and
/// `workspace_bytes: u64` fields.
macro_rules! plan_accessors {
    ($shape:ty, $config:ty) => {
        /// The shape the plan was made for.
        pub fn shape(&self) -> &$shape {
            &self.shape
        }
        /// The compiled configuration a launch runs.
        pub fn config(&self) -> $config {
            self.config
        }
        /// The device the plan was made for (a launch on another device is refused).
        pub fn device(&self) -> &$crate::device::DeviceInfo {
            &self.device
        }
        /// Bytes of device workspace a launch needs.
        pub fn workspace_bytes(&self) -> usize {
            self.workspace_bytes as usize
        }
        workspace_and_flops!();
    };
}

/// `alloc_workspace` and `flops` of a plan with `workspace_bytes()` and `shape()` (per-arch or over the arches).
macro_rules! workspace_and_flops {
    () => {
        /// Allocates a zeroed workspace of [`Self::workspace_bytes`] on `stream` (outside the launch path). Any
        /// [`Workspace`](crate::kernels::plan::Workspace) at least this large serves, including one shared with
        /// other plans.
        ///
        /// # Errors
        /// Driver errors of the allocation.
        pub fn alloc_workspace(
            &self,
            stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        ) -> $crate::error::Result<$crate::kernels::plan::Workspace> {
            $crate::kernels::plan::Workspace::zeroed(stream, self.workspace_bytes())
        }
        /// Useful floating-point operations for `rows` rows in total: `2 · rows · N · K`.
        pub fn flops(&self, rows: usize) -> f64 {
            2.0 * rows as f64 * self.shape().n() as f64 * self.shape().k() as f64
        }
    };
}

/// The accessors of a plan over the arch plans of one family, held as `plan: Planned` with variants `Sm90` and
/// `Sm100` (each arch plan has them too): shape, device, workspace and FLOP count, whichever arch was planned.
macro_rules! arch_plan_accessors {
    ($shape:ty) => {
        /// The shape the plan was made for.
        pub fn shape(&self) -> &$shape {
            match &self.plan {
                Planned::Sm90(p) => p.shape(),
                Planned::Sm100(p) => p.shape(),
            }
        }
        /// The device the plan was made for.
        pub fn device(&self) -> &$crate::device::DeviceInfo {
            match &self.plan {
                Planned::Sm90(p) => p.device(),
                Planned::Sm100(p) => p.device(),
            }
        }
        /// Bytes of device workspace a launch needs.
        pub fn workspace_bytes(&self) -> usize {
            match &self.plan {
                Planned::Sm90(p) => p.workspace_bytes(),
                Planned::Sm100(p) => p.workspace_bytes(),
            }
        }
        workspace_and_flops!();
    };
}

/// A configuration enum's `from_name` (the inverse of its `name()` over `ALL`); with `fp8`, for a family of one
/// element type, also whether it was compiled and what its compiled kernel is, asked of the family's `launch`.
macro_rules! config_queries {
    () => {
        pub fn from_name(name: &str) -> Option<Self> {
            Self::ALL.into_iter().find(|c| c.name() == name)
        }
    };
    (fp8 $(#[$facts_doc:meta])*) => {
        config_queries!();

        /// Whether this configuration was compiled into the linked library.
        pub fn is_built(self) -> bool {
            launch::built(self.into())
        }

        $(#[$facts_doc])*
        ///
        /// # Errors
        /// [`Error::KernelNotBuilt`](crate::error::Error::KernelNotBuilt) when it was not compiled.
        pub fn facts(self) -> Result<Fp8KernelFacts> {
            let (f, schedule) = launch::facts(self.into())?;
            Ok(Fp8KernelFacts::from_ffi(&f, schedule))
        }
    };
}

/// The validated shape type `$name` of an SM90 FP8 grouped GEMM: `groups` experts of `[n, k]` over at most
/// `max_rows` rows of A, N a positive multiple of `$align` (`$why` says why), the rest as
/// [`check_fp8_extents`](crate::kernels::fp8_blockwise::sm90::check_fp8_extents) checks it.
macro_rules! fp8_shape {
    ($(#[$doc:meta])* $name:ident, n in $align:expr => $why:literal, $(#[$errors:meta])*) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            groups: usize,
            n: usize,
            k: usize,
            max_rows: usize,
        }

        impl $name {
            /// `groups` experts of weight `[n, k]`, over at most `max_rows` rows of A in total.
            ///
            /// # Errors
            $(#[$errors])*
            pub fn new(groups: usize, n: usize, k: usize, max_rows: usize) -> $crate::error::Result<Self> {
                if n == 0 || n % $align != 0 {
                    return Err($crate::error::Error::InvalidProblem(format!(
                        "N = {n} is not a positive multiple of {}: {}",
                        $align, $why
                    )));
                }
                $crate::kernels::fp8_blockwise::sm90::check_fp8_extents(groups, n, k, max_rows)?;
                Ok($name { groups, n, k, max_rows })
            }

            shape_accessors!();
        }
    };
}

/// [`ArchConfig`] for a configuration enum with inherent `name()` and `is_built`: `per_dtype` for a family
/// compiled and sized per element type (`is_built(dtype)`, `$workspace(dtype, ..)`), `one_dtype` for one
/// (`is_built()`, `$workspace(..)`).
macro_rules! arch_config {
    ($cfg:ident, $op:expr, $family:ident, $dtypes:ident $workspace:path) => {
        impl $crate::kernels::plan::ArchConfig for $cfg {
            const OP: &'static str = $op;
            const FAMILY: $crate::device::KernelFamily = $crate::device::KernelFamily::$family;
            fn name(self) -> &'static str {
                $cfg::name(self)
            }
            fn built(self, dtype: Option<$crate::dtype::DType>) -> bool {
                arch_config!(@built $dtypes self, dtype)
            }
            fn workspace(
                self,
                dtype: Option<$crate::dtype::DType>,
                groups: usize,
                sm_count: i32,
            ) -> $crate::error::Result<u64> {
                arch_config!(@workspace $dtypes $workspace, self, dtype, groups, sm_count)
            }
        }
    };
    (@built per_dtype $c:ident, $d:ident) => {
        $d.is_some_and(|d| $c.is_built(d))
    };
    (@built one_dtype $c:ident, $d:ident) => {{
        let _ = $d;
        $c.is_built()
    }};
    (@workspace per_dtype $w:path, $c:ident, $d:ident, $groups:ident, $sms:ident) => {
        $w($d.expect("the dense family plans per element type"), $c.into(), $groups, $sms)
    };
    (@workspace one_dtype $w:path, $c:ident, $d:ident, $groups:ident, $sms:ident) => {{
        let _ = $d;
        $w($c.into(), $groups, $sms)
    }};
}

/// A plan's `launch`: `D = op(A, B)` over the groups `rows` describes, queued on `stream` with the plan's
/// `workspace` and reported into `status`. Every grouped family takes these operands in this order and differs
/// only in A's, B's, D's element and the workspace's types and in the body, so the signature is written once.
macro_rules! grouped_launch {
    (
        $(#[$attr:meta])*
        fn launch(&$self:ident, $stream:ident, $a:ident: $at:ty, $b:ident: $bt:ty, $rows:ident, $d:ident: $dt:ty,
            $ws:ident: $wt:ty, $status:ident) $body:block
    ) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        pub fn launch<'r>(
            &$self,
            $stream: &std::sync::Arc<cudarc::driver::CudaStream>,
            $a: $at,
            $b: $bt,
            $rows: impl Into<$crate::layouts::GroupRows<'r>>,
            $d: &mut impl cudarc::driver::DevicePtrMut<$dt>,
            $ws: $wt,
            $status: &mut $crate::status::DeviceStatus,
        ) -> $crate::error::Result<()> $body
    };
}

/// The arch a family plan runs on `device`, or the family's refusal naming the device: `family`'s text where the
/// device has no arch this crate builds for.
pub(crate) fn device_arch(
    device: &crate::device::DeviceInfo,
    op: &'static str,
    family: crate::device::KernelFamily,
) -> Result<crate::device::Arch> {
    match device.arch {
        Some(a) => Ok(a),
        None => device.require(op, family).and(Err(crate::error::Error::InvalidProblem(format!(
            "{op}: {} is of no architecture this crate builds for",
            device.name
        )))),
    }
}

/// Refuses a forced configuration (`name`, of `config_arch`) of another arch than the device's, naming both.
pub(crate) fn check_config_arch(
    what: &str,
    name: &str,
    config_arch: crate::device::Arch,
    device: &crate::device::DeviceInfo,
    arch: crate::device::Arch,
) -> Result<()> {
    if config_arch == arch {
        return Ok(());
    }
    Err(crate::error::Error::InvalidProblem(format!(
        "{what}: configuration {name} is {config_arch}'s, the device ({}) is {arch}",
        device.name
    )))
}

/// A compiled configuration of one arch's kernel of a family: what planning it needs to know, written once for
/// every per-arch plan ([`planned_workspace`]).
pub(crate) trait ArchConfig: Copy {
    /// The operation's name in errors.
    const OP: &'static str;
    /// The family whose SASS the device must have.
    const FAMILY: crate::device::KernelFamily;
    fn name(self) -> &'static str;
    /// Whether it was compiled (for `dtype`, where the family has several).
    fn built(self, dtype: Option<crate::dtype::DType>) -> bool;
    /// Bytes of workspace a launch over `groups` groups needs on a device of `sm_count` SMs (asks C++).
    fn workspace(self, dtype: Option<crate::dtype::DType>, groups: usize, sm_count: i32) -> Result<u64>;
}

/// What planning `config` on `device` checks, for every per-arch plan: the device has the family's SASS
/// ([`Error::UnsupportedArch`](crate::error::Error::UnsupportedArch)), the configuration was compiled
/// ([`Error::KernelNotBuilt`](crate::error::Error::KernelNotBuilt)); then the workspace `groups` groups need.
pub(crate) fn planned_workspace<C: ArchConfig>(
    device: &crate::device::DeviceInfo,
    config: C,
    dtype: Option<crate::dtype::DType>,
    groups: usize,
) -> Result<u64> {
    device.require(C::OP, C::FAMILY)?;
    built_workspace(config, dtype, groups, device.sm_count)
}

/// [`planned_workspace`] but for the device: a plan that changes its configuration keeps its device.
pub(crate) fn built_workspace<C: ArchConfig>(
    config: C,
    dtype: Option<crate::dtype::DType>,
    groups: usize,
    sm_count: i32,
) -> Result<u64> {
    if !config.built(dtype) {
        return Err(crate::error::Error::KernelNotBuilt { op: C::OP, dtype, config: Some(config.name().into()) });
    }
    config.workspace(dtype, groups, sm_count)
}

/// The launch descriptor of a plan of `config` over `groups` experts of `[n, k]` and `max_rows` rows on `device`.
pub(crate) fn launch_plan<K>(
    config: K,
    (groups, n, k, max_rows): (usize, usize, usize, usize),
    device: &crate::device::DeviceInfo,
    workspace_bytes: u64,
) -> crate::ffi::gemm::GemmPlan<K> {
    let (device, sm_count) = (device.ordinal as i32, device.sm_count);
    crate::ffi::gemm::GemmPlan { config, groups, n, k, max_rows, device, sm_count, workspace_bytes }
}

/// Refuses FP8 operands of another shape than the plan's: `a` (its rows and K, named `a_name`) needs the plan's
/// K and at least `max_rows` rows, `b` (`[G, N, K]`, named `b_name`) exactly the plan's.
pub(crate) fn check_operand_shapes(
    (a_name, a_rows, a_k): (&str, usize, usize),
    (b_name, b): (&str, (usize, usize, usize)),
    (groups, n, k, max_rows): (usize, usize, usize, usize),
) -> Result<()> {
    if a_k != k || a_rows < max_rows {
        return Err(crate::error::Error::InvalidProblem(format!(
            "{a_name} [{a_rows}, {a_k}] for a plan of K = {k} over max_rows = {max_rows}: need K equal and at least \
             max_rows rows"
        )));
    }
    if b != (groups, n, k) {
        return Err(crate::error::Error::InvalidProblem(format!(
            "{b_name} [G, N, K] = [{}, {}, {}] for a plan of [{groups}, {n}, {k}]",
            b.0, b.1, b.2
        )));
    }
    Ok(())
}

/// The arch of `device` for a family plan, and a forced configuration (`config`: its name and arch) checked
/// against it: [`device_arch`] then [`check_config_arch`].
pub(crate) fn pick_arch(
    device: &crate::device::DeviceInfo,
    op: &'static str,
    family: crate::device::KernelFamily,
    what: &str,
    config: Option<(&str, crate::device::Arch)>,
) -> Result<crate::device::Arch> {
    let arch = device_arch(device, op, family)?;
    if let Some((name, config_arch)) = config {
        check_config_arch(what, name, config_arch, device, arch)?;
    }
    Ok(arch)
}
