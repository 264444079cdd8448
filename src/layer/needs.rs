//! [`ScratchNeeds`]: every buffer a scratch holds, counted in elements, with its byte [`Footprint`]; and the bytes
//! a plan holds ([`PlanBytes`]). The counts come from [`LayerSizing`](super::LayerSizing).

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{scale_blocks, Mxfp8Rows};

/// Bytes a layer's plan holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanBytes {
    pub device: usize,
    pub host: usize,
}

/// Everything a scratch holds, in elements (bytes for the workspace). The scratch of several layers is the
/// field-wise maximum of theirs ([`ScratchNeeds::max`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchNeeds {
    pub dtype: DType,
    /// Tokens per pass.
    pub tokens: usize,
    /// (token, slot) rows per pass: `tokens · (top_k + shared groups)`.
    pub slots: usize,
    pub hidden: usize,
    pub w13_cols: usize,
    pub inter: usize,
    /// Rows of the permuted copy of x (`a [rows, hidden]`); 0 when no enabled backend gathers.
    pub a_rows: usize,
    /// FP8 weights: rows of x quantised at its layout positions (e4m3 `[rows, hidden]` and f32 scales
    /// `[rows, ceil(hidden / 128)]`); 0 for dense weights.
    pub a_fp8_rows: usize,
    /// FP8 weights: rows of the activation requantised for GEMM2 (e4m3 `[rows, inter]` and f32 scales
    /// `[rows, ceil(inter / 128)]`); 0 for dense weights.
    pub h_fp8_rows: usize,
    /// Per-channel FP8 weights: rows of x quantised per token at its layout positions (e4m3 `[rows, hidden]`
    /// and one f32 scale per row); 0 for other weights.
    pub a_token_rows: usize,
    /// Per-channel FP8 weights: rows of the activation requantised per row for GEMM2 (e4m3 `[rows, inter]` and
    /// one f32 scale per row); 0 for other weights.
    pub h_token_rows: usize,
    /// Rows of GEMM1's output (`d1 [rows, w13_cols]`).
    pub d1_rows: usize,
    /// Rows of the activation (`h [rows, inter]`).
    pub h_rows: usize,
    /// Rows of GEMM2's output (`d2 [rows, hidden]`).
    pub d2_rows: usize,
    /// Columns of each `d2` row: `H`, or the MX GEMM's `H` padded to 128 (MXFP4 weights).
    pub d2_cols: usize,
    /// Rows of MXFP8 `x` (GEMM1's A over MXFP4 weights), `K` = `H` padded to 128, scale atoms per group.
    pub a_mx_rows: usize,
    /// Rows of MXFP8 `h` (GEMM2's A over MXFP4 weights), `K` = `I` padded to 128.
    pub h_mx_rows: usize,
    /// Layout: experts (GEMM groups) counted and offset.
    pub groups: usize,
    /// Layout: positions (`sorted_ids`, `m_indices`).
    pub layout_rows: usize,
    /// Layout: tiles (`expert_ids`).
    pub layout_tiles: usize,
    /// Layout: flat rows (`positions`).
    pub layout_positions: usize,
    /// Layout: the multi-CTA build's per-chunk counters.
    pub layout_scratch_ints: usize,
    /// One grouped-GEMM workspace, shared by every GEMM of a forward (they run one after another).
    pub workspace_bytes: usize,
    /// Routing extended by the shared groups (`ids`, `weights` `[slots]`); 0 without shared experts.
    pub routing_slots: usize,
    /// Per-tensor activation amax words (x's and h's) of the Batched backend over per-channel FP8 weights; 0
    /// otherwise.
    pub amax_words: usize,
    /// Block-FP8 weights on Batched: one u32 arrival counter per (token, slot) row per 128 columns of h, by which
    /// the last of the expand blocks writing a group quantises it (zeroed once, when allocated); 0 otherwise.
    pub arrival_words: usize,
    /// The eager backend's one-group offsets.
    pub eager: bool,
}

macro_rules! each_count {
    ($m:ident) => {
        $m!(
            tokens,
            slots,
            hidden,
            w13_cols,
            inter,
            a_rows,
            a_fp8_rows,
            h_fp8_rows,
            a_token_rows,
            h_token_rows,
            d1_rows,
            h_rows,
            d2_rows,
            d2_cols,
            a_mx_rows,
            h_mx_rows,
            groups,
            layout_rows,
            layout_tiles,
            layout_positions,
            layout_scratch_ints,
            workspace_bytes,
            routing_slots,
            amax_words,
            arrival_words
        )
    };
}

impl ScratchNeeds {
    /// The field-wise maximum: a scratch that serves both.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the element types differ.
    pub fn max(self, other: ScratchNeeds) -> Result<ScratchNeeds> {
        if self.dtype != other.dtype {
            return Err(Error::InvalidProblem(format!(
                "one scratch serves one element type: {} and {}",
                self.dtype, other.dtype
            )));
        }
        let mut out = self;
        macro_rules! take_max {
            ($($f:ident),*) => { $( out.$f = self.$f.max(other.$f); )* };
        }
        each_count!(take_max);
        out.eager = self.eager || other.eager;
        Ok(out)
    }

    /// Checks that this (a scratch's) covers `need` (a layer's), naming the first buffer that is too small.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the buffer, its size and the layer's need.
    pub fn check_covers(&self, need: &ScratchNeeds) -> Result<()> {
        if self.dtype != need.dtype {
            return Err(Error::InvalidProblem(format!(
                "the scratch holds {} elements, the layer computes in {}",
                self.dtype, need.dtype
            )));
        }
        macro_rules! cmp {
            ($($f:ident),*) => { $(
                if self.$f < need.$f {
                    return Err(Error::InvalidProblem(format!(
                        "scratch capacity: {} = {} is smaller than the layer needs ({}); size the scratch with MoeScratch::for_layers over every layer that uses it",
                        stringify!($f), self.$f, need.$f
                    )));
                }
            )* };
        }
        each_count!(cmp);
        if need.eager && !self.eager {
            return Err(Error::InvalidProblem("scratch capacity: no room for the eager backend's offsets".into()));
        }
        Ok(())
    }

    /// The bytes of every buffer the scratch allocates, by name.
    pub fn footprint(&self) -> Footprint {
        let e = self.dtype.size_bytes();
        let i = std::mem::size_of::<i32>();
        let layout = self.groups > 0;
        let parts = vec![
            ("a (permuted x)", self.a_rows * self.hidden * e),
            ("a fp8 (e4m3 x + scales)", self.a_fp8_rows * fp8_row_bytes(self.hidden)),
            ("h fp8 (e4m3 h + scales)", self.h_fp8_rows * fp8_row_bytes(self.inter)),
            ("a fp8 per token (e4m3 x + scale)", token_rows_bytes(self.a_token_rows, self.hidden)),
            ("h fp8 per row (e4m3 h + scale)", token_rows_bytes(self.h_token_rows, self.inter)),
            ("d1 (GEMM1 out)", self.d1_rows * self.w13_cols * e),
            ("h (activation)", self.h_rows * self.inter * e),
            ("a mxfp8 (e4m3 x + ue8m0 atoms)", mx_rows_bytes(self.a_mx_rows, self.hidden, self.groups)),
            ("h mxfp8 (e4m3 h + ue8m0 atoms)", mx_rows_bytes(self.h_mx_rows, self.inter, self.groups)),
            ("d2 (GEMM2 out)", self.d2_rows * self.d2_cols * e),
            (
                "layout",
                if layout {
                    (self.groups
                        + self.groups
                        + 1
                        + 2 * self.layout_rows
                        + 2 * self.layout_tiles
                        + self.layout_positions
                        + 1
                        + self.layout_scratch_ints)
                        * i
                } else {
                    0
                },
            ),
            ("GEMM workspace", self.workspace_bytes),
            ("shared-expert routing", self.routing_slots * (i + std::mem::size_of::<f32>())),
            ("eager offsets", if self.eager { 2 * i } else { 0 }),
            ("per-tensor amax words", self.amax_words * std::mem::size_of::<u32>()),
            ("FP8 decode arrival counters", self.arrival_words * std::mem::size_of::<u32>()),
            ("status word", std::mem::size_of::<u32>()),
        ];
        Footprint { parts }
    }
}

/// Bytes of one quantised row of `k` columns: `k` e4m3 bytes and `ceil(k / 128)` f32 scales.
/// Device bytes of MXFP8 rows over `groups` groups of `k` padded to the MX GEMMs' 128 (0 for no rows).
pub(crate) fn mx_rows_bytes(rows: usize, k: usize, groups: usize) -> usize {
    if rows == 0 {
        return 0;
    }
    Mxfp8Rows::bytes_for(rows, super::mx::mx_padded(k), groups.max(1)).unwrap_or(usize::MAX)
}

pub(crate) const fn fp8_row_bytes(k: usize) -> usize {
    k + 4 * scale_blocks(k)
}

/// Bytes per buffer of a scratch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub parts: Vec<(&'static str, usize)>,
}

impl Footprint {
    pub fn total(&self) -> usize {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, bytes) in self.parts.iter().filter(|(_, b)| *b > 0) {
            writeln!(f, "  {name:<24} {:>14} B  {:>12}", bytes, mib(*bytes))?;
        }
        write!(f, "  {:<24} {:>14} B  {:>12}", "total", self.total(), mib(self.total()))
    }
}

/// Device bytes of [`crate::quant::Fp8TokenRows::zeros`]`(rows, k)`: e4m3 rows, one f32 scale per row and the amax
/// word of a dynamic per-tensor scale (none where the scratch holds no such rows).
fn token_rows_bytes(rows: usize, k: usize) -> usize {
    if rows == 0 || k == 0 {
        0
    } else {
        rows * (k + 4) + 4
    }
}
