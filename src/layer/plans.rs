//! The GEMM plans a layer holds: one per tile configuration the heuristic can pick, per backend that needs a
//! grouped GEMM, dense (bf16/f16) or block-FP8.

use half::bf16;

use crate::device::DeviceInfo;
use crate::dtype::Element;
use crate::error::Result;
use crate::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};
use crate::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};

use super::sizing::{self, GemmSpec, LayerSizing};
use super::{Backend, MoeLayer, WeightFormat};

/// The plans of one GEMM of one layout: one per tile configuration the heuristic picks for some batch size
/// up to the layer's maximum, so each forward runs the configuration measured best for its own T·k.
#[derive(Debug)]
pub(super) struct GemmPlans<T: Element> {
    pub(super) plans: Vec<GroupedGemm<T>>,
    pub(super) groups: usize,
    pub(super) n: usize,
    pub(super) sm_count: usize,
}

/// Host bytes of a layer plan with `plans` GEMM configurations (the same for every element type).
pub(crate) fn plan_host_bytes(sizing: &LayerSizing, plans: usize) -> usize {
    type L = MoeLayer<bf16>;
    let plan = match sizing.format {
        WeightFormat::Fp8Block => std::mem::size_of::<GroupedGemmFp8>(),
        _ => std::mem::size_of::<GroupedGemm<bf16>>(),
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
        let plans = spec
            .configs(sm_count)
            .into_iter()
            .map(|(config, r)| {
                let opts = GroupedGemmOptions { config: Some(config), expected_rows: Some(r) };
                GroupedGemm::for_device(device.clone(), shape, opts)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(GemmPlans { plans, groups: spec.groups, n: spec.n, sm_count })
    }

    /// The plan for a batch of `rows` routed rows.
    pub(super) fn for_rows(&self, rows: usize) -> &GroupedGemm<T> {
        let config = crate::kernels::TileConfig::heuristic(self.groups, self.n, rows, self.sm_count);
        self.plans.iter().find(|p| p.config() == config).unwrap_or(&self.plans[0])
    }
}

/// The FP8 blockwise GEMM's plans of one GEMM of one layout, one per configuration some batch size picks.
#[derive(Debug)]
pub(super) struct Fp8Plans {
    pub(super) plans: Vec<GroupedGemmFp8>,
    pub(super) groups: usize,
}

impl Fp8Plans {
    pub(super) fn new(device: &DeviceInfo, spec: &GemmSpec) -> Result<Self> {
        let shape = GroupedGemmFp8Shape::new(spec.groups, spec.n, spec.k, spec.max_rows)?;
        let plans = spec
            .fp8_configs()
            .into_iter()
            .map(|(config, r)| {
                let opts = GroupedGemmFp8Options { config: Some(config), expected_rows: Some(r) };
                GroupedGemmFp8::for_device(device.clone(), shape, opts)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Fp8Plans { plans, groups: spec.groups })
    }

    /// The plan for a batch of `rows` routed rows.
    pub(super) fn for_rows(&self, rows: usize) -> &GroupedGemmFp8 {
        let config = Fp8TileConfig::heuristic(self.groups, rows);
        self.plans.iter().find(|p| p.config() == config).unwrap_or(&self.plans[0])
    }
}

/// GEMM1 (w13) and GEMM2 (w2) plans of one backend, for the weights' format.
#[derive(Debug)]
pub(super) enum PairPlans<T: Element> {
    Dense(GemmPlans<T>, GemmPlans<T>),
    Fp8(Fp8Plans, Fp8Plans),
}

impl<T: Element> PairPlans<T> {
    pub(super) fn len(&self) -> usize {
        match self {
            PairPlans::Dense(a, b) => a.plans.len() + b.plans.len(),
            PairPlans::Fp8(a, b) => a.plans.len() + b.plans.len(),
        }
    }
}

#[derive(Debug)]
pub(super) struct GemmPair<T: Element> {
    pub(super) backend: Backend,
    pub(super) plans: PairPlans<T>,
}
