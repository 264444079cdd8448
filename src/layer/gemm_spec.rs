//! [`GemmSpec`]: one grouped GEMM plan family of a layer, as sized on the host (no device needed): the plans
//! it makes and the workspace they need, for the GEMM the layer's arch runs ([`LayerGemm`]).

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::grouped;
use crate::kernels::grouped_fp8::{self, Fp8TileConfig, GroupedGemmFp8Shape};
use crate::kernels::grouped_fp8_rowwise::{self, Fp8Accumulation, Fp8RowwiseConfig, GroupedGemmFp8RowwiseShape};
use crate::kernels::grouped_fp8_sm100::{self, Fp8Sm100Config};
use crate::kernels::grouped_mx::{self, MxConfig, MxFormat};
use crate::kernels::grouped_sm100::{self, Sm100TileConfig};
use crate::kernels::TileConfig;

use super::arch::LayerGemm;
use crate::backend::Backend;

/// One grouped GEMM plan family of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmSpec {
    pub backend: Backend,
    /// GEMM1 (w13) or GEMM2 (w2).
    pub second: bool,
    pub groups: usize,
    pub n: usize,
    pub k: usize,
    /// Rows of its pass's layout (what the pass's `a`, `d1` and `d2` hold).
    pub max_rows: usize,
    /// Most rows a launch will see: the configurations of every batch size up to this are planned.
    pub rows: usize,
    /// Which grouped GEMM the plans are of.
    pub gemm: LayerGemm,
}

impl GemmSpec {
    /// The tile configurations the heuristic picks for batches of 1, 2, 4, …, `rows` rows, once each, with
    /// the batch size that first picked it.
    pub(crate) fn configs(&self, sm_count: usize) -> Vec<(TileConfig, usize)> {
        self.batch_sizes(|r| TileConfig::heuristic(self.groups, self.n, r, sm_count))
    }

    /// As [`Self::configs`] for the SM100 bf16 GEMM ([`Sm100TileConfig::heuristic`]).
    pub(crate) fn sm100_configs(&self, sm_count: usize) -> Vec<(Sm100TileConfig, usize)> {
        self.batch_sizes(|r| Sm100TileConfig::heuristic(self.groups, self.n, r, sm_count))
    }

    /// As [`Self::configs`] for the SM90 FP8 blockwise GEMM ([`Fp8TileConfig::heuristic`]).
    pub(crate) fn fp8_configs(&self) -> Vec<(Fp8TileConfig, usize)> {
        self.batch_sizes(|r| Fp8TileConfig::heuristic(self.groups, r))
    }

    /// As [`Self::configs`] for the SM90 FP8 rowwise GEMM ([`Fp8RowwiseConfig::heuristic`], fast accumulation as
    /// vLLM's `cutlass_moe_mm` runs).
    pub(crate) fn rowwise_configs(&self) -> Vec<(Fp8RowwiseConfig, usize)> {
        self.batch_sizes(|r| Fp8RowwiseConfig::heuristic(Fp8Accumulation::Fast, self.groups, r))
    }

    /// The rowwise GEMM's shape, validated against its kernels' rules.
    pub(crate) fn rowwise_shape(&self) -> Result<GroupedGemmFp8RowwiseShape> {
        GroupedGemmFp8RowwiseShape::new(self.groups, self.n, self.k, self.max_rows)
    }

    /// The SM100 FP8 blockwise GEMM's configuration: its one compiled tile serves every batch.
    pub(crate) const fn sm100_fp8_config(&self) -> Fp8Sm100Config {
        Fp8Sm100Config::Blockwise1Sm128x128x128
    }

    /// The SM100 MX GEMM's configuration for this family's shape (MXFP8 x MXFP4 has its 1-SM kernel only).
    pub(crate) fn mx_config(&self) -> Result<MxConfig> {
        MxConfig::default_for(MxFormat::Mxfp8, MxFormat::Mxfp4, self.groups, self.n, self.max_rows)
    }

    /// The FP8 GEMM's shape, validated against the blockwise kernels' rules (the same on SM90 and SM100).
    pub(crate) fn fp8_shape(&self) -> Result<GroupedGemmFp8Shape> {
        GroupedGemmFp8Shape::new(self.groups, self.n, self.k, self.max_rows)
    }

    /// Plans of this family: one per configuration some batch size picks.
    pub(crate) fn plan_count(&self, sm_count: usize) -> usize {
        match self.gemm {
            LayerGemm::Sm90Dense => self.configs(sm_count).len(),
            LayerGemm::Sm100Dense => self.sm100_configs(sm_count).len(),
            LayerGemm::Sm90Fp8Blockwise => self.fp8_configs().len(),
            LayerGemm::Sm90Fp8Rowwise => self.rowwise_configs().len(),
            LayerGemm::Sm100Fp8Blockwise | LayerGemm::Sm100Mxf8f4 | LayerGemm::PortableMxf8f4 => 1,
        }
    }

    /// The largest workspace of this family's plans on a device of `sm_count` SMs, as each plan will ask it.
    ///
    /// # Errors
    /// The FP8 shape rules ([`GroupedGemmFp8Shape::new`]); a workspace query that fails.
    pub(crate) fn workspace_bytes(&self, dtype: DType, sm_count: usize) -> Result<usize> {
        let mut bytes = 0;
        match self.gemm {
            LayerGemm::Sm90Dense => {
                for (config, _) in self.configs(sm_count) {
                    bytes = bytes.max(grouped::workspace_bytes(dtype, config, self.groups, sm_count)?);
                }
            }
            LayerGemm::Sm100Dense => {
                for (config, _) in self.sm100_configs(sm_count) {
                    bytes = bytes.max(grouped_sm100::workspace_bytes(dtype, config, self.groups, sm_count)?);
                }
            }
            LayerGemm::Sm90Fp8Blockwise => {
                self.fp8_shape()?;
                for (config, _) in self.fp8_configs() {
                    bytes = bytes.max(grouped_fp8::workspace_bytes(config, self.groups, sm_count)?);
                }
            }
            LayerGemm::Sm90Fp8Rowwise => {
                self.rowwise_shape()?;
                for (config, _) in self.rowwise_configs() {
                    bytes = bytes.max(grouped_fp8_rowwise::workspace_bytes(config, self.groups, sm_count)?);
                }
            }
            LayerGemm::Sm100Fp8Blockwise => {
                self.fp8_shape()?;
                bytes = grouped_fp8_sm100::workspace_bytes(self.sm100_fp8_config(), self.groups, sm_count)?;
            }
            LayerGemm::Sm100Mxf8f4 => bytes = grouped_mx::workspace_bytes(self.mx_config()?, self.groups, sm_count)?,
            // The portable kernel reads the groups itself: no workspace.
            LayerGemm::PortableMxf8f4 => {}
        }
        Ok(bytes)
    }

    /// The distinct choices of `pick` for batches of 1, 2, 4, …, `rows` rows, with the batch that first made it.
    fn batch_sizes<C: PartialEq>(&self, pick: impl Fn(usize) -> C) -> Vec<(C, usize)> {
        let mut out: Vec<(C, usize)> = Vec::new();
        let rows = self.rows.max(1);
        for r in (0..).map(|s| 1usize << s).take_while(|&r| r < rows).chain([rows]) {
            let c = pick(r);
            if !out.iter().any(|(p, _)| *p == c) {
                out.push((c, r));
            }
        }
        out
    }
}
