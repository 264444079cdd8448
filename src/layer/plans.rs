//! The GEMM plans a layer holds: one per tile configuration the heuristic can pick, per backend that needs a
//! grouped GEMM, dense (bf16/f16: [`DenseGemm`]), block-FP8 ([`BlockwiseFp8Gemm`]), per-channel FP8 (SM90's rowwise
//! GEMM) or MXFP4 ([`MxGemm`]), each but the rowwise one picking the device's kernel itself.

use half::bf16;

use crate::device::{Arch, DeviceInfo};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::block_scaled::MxGemm;
use crate::kernels::blockwise::{BlockwiseConfig, BlockwiseFp8Gemm};
use crate::kernels::dense::{DenseConfig, DenseGemm};
use crate::kernels::grouped::GroupedGemmShape;
use crate::kernels::grouped_fp8::Fp8TileConfig;
use crate::kernels::grouped_fp8_rowwise::{
    Fp8Accumulation, Fp8RowwiseConfig, GroupedGemmFp8Rowwise, GroupedGemmFp8RowwiseOptions,
};
use crate::kernels::grouped_mx::MxFormat;

use super::arch::LayerGemm;
use super::sizing::{self, GemmSpec, LayerSizing, PlanBytes};
use super::{Backend, MoeLayer, WeightFormat};

/// The plans of one GEMM of one layout: one per tile configuration the heuristic (of the layer's arch) picks
/// for some batch size up to the layer's maximum, so each forward runs the configuration measured best for its
/// own T·k (on SM100: the rule carried over from SM90, unmeasured).
#[derive(Debug)]
pub(super) struct GemmPlans<T: Element> {
    pub(super) plans: Vec<DenseGemm<T>>,
    pub(super) groups: usize,
    pub(super) n: usize,
    pub(super) sm_count: usize,
    pub(super) arch: Arch,
}

impl LayerSizing {
    /// Bytes a [`MoeLayer`] planned with this sizing holds: its expert map on the device (with expert
    /// parallelism), its fields and GEMM plans on the host; the same count as [`MoeLayer::plan_bytes`].
    pub fn plan_bytes(&self, expert_parallel: bool) -> PlanBytes {
        let device = if expert_parallel { self.shape.layout_experts() * std::mem::size_of::<i32>() } else { 0 };
        let plans: usize = self.gemms.iter().map(|g| g.plan_count(self.sm_count)).sum();
        PlanBytes { device, host: plan_host_bytes(self, plans) }
    }
}

/// Host bytes of a layer plan with `plans` GEMM configurations (the same for every element type).
pub(crate) fn plan_host_bytes(sizing: &LayerSizing, plans: usize) -> usize {
    type L = MoeLayer<bf16>;
    let plan = match sizing.format {
        WeightFormat::Fp8Block => std::mem::size_of::<BlockwiseFp8Gemm>(),
        WeightFormat::Mxfp4 => std::mem::size_of::<MxGemm>(),
        WeightFormat::Fp8Channel => std::mem::size_of::<GroupedGemmFp8Rowwise>(),
        _ => std::mem::size_of::<DenseGemm<bf16>>(),
    };
    std::mem::size_of::<L>()
        + sizing.gemms.len() / 2 * std::mem::size_of::<GemmPair<bf16>>()
        + plans * plan
        + sizing.passes.len() * std::mem::size_of::<sizing::Pass>()
        + sizing.gemms.len() * std::mem::size_of::<GemmSpec>()
}

impl<T: Element> GemmPlans<T> {
    pub(super) fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        let sm_count = device.sm_count.max(1) as usize;
        let shape = GroupedGemmShape::new(spec.groups, spec.n, spec.k, spec.max_rows)?;
        let configs: Vec<(DenseConfig, usize)> = match spec.gemm {
            LayerGemm::Sm90Dense => {
                spec.configs(sm_count).into_iter().map(|(c, r)| (DenseConfig::Sm90(c), r)).collect()
            }
            LayerGemm::Sm100Dense => {
                spec.sm100_configs(sm_count).into_iter().map(|(c, r)| (DenseConfig::Sm100(c), r)).collect()
            }
            other => return Err(wrong_spec("dense", other, "not a dense GEMM")),
        };
        let plans =
            plan_each(configs, |(config, r)| DenseGemm::for_device(device.clone(), shape, Some(config), Some(r)))?;
        Ok(GemmPlans { plans, groups: spec.groups, n: spec.n, sm_count, arch: spec.gemm.arch() })
    }

    /// The plan for a batch of `rows` routed rows.
    pub(super) fn for_rows(&self, rows: usize) -> &DenseGemm<T> {
        let config = DenseConfig::heuristic(self.arch, self.groups, self.n, rows, self.sm_count);
        plan_for(&self.plans, config, |p| p.config())
    }
}

/// The plans of one FP8 GEMM of one layout, whose configuration its heuristic picks from the groups and rows.
#[derive(Debug)]
pub(super) struct FamilyPlans<P> {
    pub(super) plans: Vec<P>,
    pub(super) groups: usize,
}

/// The FP8 blockwise GEMM's plans of one GEMM of one layout: on SM90 one per configuration some batch size
/// picks, on SM100 its one compiled configuration.
pub(super) type Fp8Plans = FamilyPlans<BlockwiseFp8Gemm>;

/// The FP8 rowwise GEMM's plans of one GEMM of one layout (SM90): one per configuration some batch size picks.
pub(super) type RowwisePlans = FamilyPlans<GroupedGemmFp8Rowwise>;

impl Fp8Plans {
    pub(super) fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        let shape = spec.fp8_shape()?;
        // SM100: its one default configuration; SM90: one per configuration some batch size picks.
        let configs: Vec<(Option<BlockwiseConfig>, Option<usize>)> = match spec.gemm {
            LayerGemm::Sm100Fp8Blockwise => vec![(None, None)],
            LayerGemm::Sm90Fp8Blockwise => {
                spec.fp8_configs().into_iter().map(|(c, r)| (Some(BlockwiseConfig::Sm90(c)), Some(r))).collect()
            }
            other => return Err(wrong_spec("FP8", other, "not an FP8 GEMM")),
        };
        let plans = plan_each(configs, |(config, r)| BlockwiseFp8Gemm::for_device(device.clone(), shape, config, r))?;
        Ok(FamilyPlans { plans, groups: spec.groups })
    }

    /// The plan for a batch of `rows` routed rows (SM100: its one plan).
    pub(super) fn for_rows(&self, rows: usize) -> &BlockwiseFp8Gemm {
        let config = BlockwiseConfig::Sm90(Fp8TileConfig::heuristic(self.groups, rows));
        plan_for(&self.plans, config, |p| p.config())
    }
}

impl RowwisePlans {
    pub(super) fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        if spec.gemm != LayerGemm::Sm90Fp8Rowwise {
            return Err(wrong_spec("FP8 rowwise", spec.gemm, "not the rowwise GEMM"));
        }
        let shape = spec.rowwise_shape()?;
        let plans = plan_each(spec.rowwise_configs(), |(config, r)| {
            let opts =
                GroupedGemmFp8RowwiseOptions { config: Some(config), expected_rows: Some(r), ..Default::default() };
            GroupedGemmFp8Rowwise::for_device(device.clone(), shape, opts)
        })?;
        Ok(FamilyPlans { plans, groups: spec.groups })
    }

    /// The plan for a batch of `rows` routed rows.
    pub(super) fn for_rows(&self, rows: usize) -> &GroupedGemmFp8Rowwise {
        let config = Fp8RowwiseConfig::heuristic(Fp8Accumulation::Fast, self.groups, rows);
        plan_for(&self.plans, config, |p| p.config())
    }
}

/// A plan per configuration (with the rows it was picked for), or the first planning error.
fn plan_each<C, P>(configs: Vec<C>, plan: impl FnMut(C) -> Result<P>) -> Result<Vec<P>> {
    configs.into_iter().map(plan).collect()
}

/// The refusal of `family` GEMM plans made from a spec of another GEMM (`gemm`), saying why (`not`).
fn wrong_spec(family: &str, gemm: LayerGemm, not: &str) -> Error {
    Error::InvalidProblem(format!("{family} GEMM plans of a {gemm} GEMM spec: {not}"))
}

/// The plan of `plans` made for `config` (`config_of` reads a plan's), else the first: what every GEMM's plans
/// run for a batch.
fn plan_for<P, C: PartialEq>(plans: &[P], config: C, config_of: impl Fn(&P) -> C) -> &P {
    plans.iter().find(|p| config_of(p) == config).unwrap_or(&plans[0])
}

/// The MXFP8 x MXFP4 plan of one GEMM spec: [`MxGemm`] picks SM100's kernel or the portable one for the device.
pub(super) fn mx_plan(device: &DeviceInfo, spec: &GemmSpec) -> Result<MxGemm> {
    if !matches!(spec.gemm, LayerGemm::Sm100Mxf8f4 | LayerGemm::PortableMxf8f4) {
        return Err(wrong_spec("MX", spec.gemm, "not an MX GEMM"));
    }
    let (a, b) = (MxFormat::Mxfp8, MxFormat::Mxfp4);
    MxGemm::for_device(device.clone(), a, b, spec.groups, spec.n, spec.k, spec.max_rows)
}

/// GEMM1 (w13) and GEMM2 (w2) plans of one backend, for the weights' format.
#[derive(Debug)]
pub(super) enum PairPlans<T: Element> {
    Dense(GemmPlans<T>, GemmPlans<T>),
    Fp8(Fp8Plans, Fp8Plans),
    Mx(MxGemm, MxGemm),
    Fp8Rowwise(RowwisePlans, RowwisePlans),
}

impl<T: Element> PairPlans<T> {
    pub(super) fn len(&self) -> usize {
        match self {
            PairPlans::Dense(a, b) => a.plans.len() + b.plans.len(),
            PairPlans::Fp8(a, b) => a.plans.len() + b.plans.len(),
            PairPlans::Mx(..) => 2,
            PairPlans::Fp8Rowwise(a, b) => a.plans.len() + b.plans.len(),
        }
    }
}

#[derive(Debug)]
pub(super) struct GemmPair<T: Element> {
    pub(super) backend: Backend,
    pub(super) plans: PairPlans<T>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Arch;
    use crate::dtype::DType;
    use crate::layer::{Backend, Backends, LayerShape, WeightFormat};

    fn device(name: &str, major: i32, sm_count: i32) -> DeviceInfo {
        DeviceInfo::described(name, (major, 0), sm_count)
    }

    /// What the checks read of a plan of either kind.
    trait Planned: std::fmt::Debug {
        fn on_sm100(&self) -> bool;
        fn extents(&self) -> (usize, usize, usize);
        fn workspace(&self) -> usize;
    }

    // Both plans over the arches have the same accessors.
    macro_rules! planned {
        ($(impl<$($g:ident: $bound:path),*> for $t:ty;)*) => {$(
            impl<$($g: $bound),*> Planned for $t {
                fn on_sm100(&self) -> bool {
                    self.config().arch() == Arch::Sm100
                }
                fn extents(&self) -> (usize, usize, usize) {
                    (self.shape().n(), self.shape().k(), self.shape().max_rows())
                }
                fn workspace(&self) -> usize {
                    self.workspace_bytes()
                }
            }
        )*};
    }
    planned! {
        impl<> for BlockwiseFp8Gemm;
        impl<T: Element> for DenseGemm<T>;
    }

    /// The sizing of a layer of shape `s` and `fmt` weights for `t` tokens on `dev`, the Grouped backend run
    /// over the `layout` backends.
    fn grouped_sizing(
        dev: &DeviceInfo,
        s: LayerShape,
        dtype: DType,
        fmt: WeightFormat,
        t: usize,
        layout: Backends,
    ) -> Result<LayerSizing> {
        LayerSizing::for_device(dev, s, dtype, fmt, t, Backend::Grouped, Some(layout), None, None, false, None)
    }

    /// `spec`'s plans: as many as the sizing counted, each of the device's arch with the spec's extents, and one
    /// of the arch for every batch size. Returns the largest workspace they ask.
    fn check_family<'a, P: Planned + 'a>(
        dev: &DeviceInfo,
        spec: &GemmSpec,
        sm100: bool,
        plans: &[P],
        for_rows: impl Fn(usize) -> &'a P,
    ) -> usize {
        assert_eq!(plans.len(), spec.plan_count(dev.sm_count as usize), "{}: {spec:?}", dev.name);
        for p in plans {
            assert_eq!(p.on_sm100(), sm100, "{}: {p:?}", dev.name);
            assert_eq!(p.extents(), (spec.n, spec.k, spec.max_rows), "{}: {p:?}", dev.name);
        }
        for rows in [1usize, 63, 65, spec.rows] {
            assert_eq!(for_rows(rows).on_sm100(), sm100, "{}: {rows} rows", dev.name);
        }
        plans.iter().map(Planned::workspace).max().unwrap_or(0)
    }

    /// The plans a layer makes from its sizing (no driver call): SM100 plans on a B200, SM90 plans on an H200,
    /// as many as the sizing counted, and the sizing's workspace exactly the largest plan's.
    #[test]
    fn fp8_plans_follow_the_device_arch_and_the_sizing_counts_them_exactly() {
        let s = LayerShape {
            experts: 64,
            global_experts: 64,
            top_k: 8,
            shared_groups: 0,
            hidden: 1024,
            inter: 512,
            gated: true,
        };
        let layout = Backends::of(Backend::Grouped).with(Backend::Contiguous).with(Backend::Masked);
        for (dev, sm100) in [(device("NVIDIA B200", 10, 148), true), (device("NVIDIA H200", 9, 132), false)] {
            for t in [1usize, 64, 4096] {
                let sizing = grouped_sizing(&dev, s, DType::BF16, WeightFormat::Fp8Block, t, layout).unwrap();
                let mut workspace = 0;
                for spec in &sizing.gemms {
                    let plans = Fp8Plans::new(&dev, spec).unwrap();
                    workspace = workspace.max(check_family(&dev, spec, sm100, &plans.plans, |r| plans.for_rows(r)));
                }
                // On SM90 a batch of at most 2 rows per group (T = 1 here) plans only the swap-AB kernel: no
                // workspace.
                assert_eq!(workspace > 0, sm100 || t > 1, "{} T = {t}", dev.name);
                assert_eq!(sizing.needs.workspace_bytes, workspace, "{} T = {t}: sized vs planned workspace", dev.name);
            }
        }
    }

    /// Dense bf16 layers plan the SM100 GEMM on a B200 and the SM90 one on an H200, every batch size finds a
    /// plan of the arch, and the sizing's workspace is exactly the largest plan's; f16 on SM100 is refused by
    /// name (no f16 kernel is built).
    #[test]
    fn dense_plans_follow_the_device_arch_and_f16_is_refused_on_sm100() {
        let s = LayerShape {
            experts: 128,
            global_experts: 128,
            top_k: 8,
            shared_groups: 0,
            hidden: 2048,
            inter: 768,
            gated: true,
        };
        let layout =
            Backends::of(Backend::Grouped).with(Backend::Contiguous).with(Backend::Masked).with(Backend::Eager);
        let size =
            |dev: &DeviceInfo, dtype: DType, t: usize| grouped_sizing(dev, s, dtype, WeightFormat::Dense, t, layout);
        for (dev, sm100) in [(device("NVIDIA B200", 10, 148), true), (device("NVIDIA H200", 9, 132), false)] {
            for t in [1usize, 16, 4096] {
                let sizing = size(&dev, DType::BF16, t).unwrap();
                assert_eq!(sizing.gemm.arch() == Arch::Sm100, sm100);
                let mut workspace = 0;
                for spec in &sizing.gemms {
                    let plans = GemmPlans::<bf16>::new(&dev, spec).unwrap();
                    workspace = workspace.max(check_family(&dev, spec, sm100, &plans.plans, |r| plans.for_rows(r)));
                }
                assert_eq!(sizing.needs.workspace_bytes, workspace, "{} T = {t}: sized vs planned workspace", dev.name);
            }
        }
        let err = size(&device("NVIDIA B200", 10, 148), DType::F16, 64).unwrap_err().to_string();
        assert!(err.contains("grouped_gemm_sm100") && err.contains("f16"), "{err}");
    }
}
