//! FP8 on the device: activations in [`Fp8Rows`] (e4m3 rows and their K-major f32 scales, together) and the
//! quantisation kernels that fill them, by the rules of [`super::group`] (bit for bit its host reference
//! [`super::per_token_group_quant`]); expert weights in [`Fp8BlockWeights`] (below).
//!
//! | function | rows written |
//! |---|---|
//! | [`quantize_rows`] | row `r` of `x` at row `r` |
//! | [`quantize_gather`] | row `t` of `x` at each of its layout positions `positions[t·k + j]` (the gather and the quantisation in one pass; dropped slots, −1, write nothing) |
//! | [`requantize_rows`] | row `p` of `h` at row `p`, for the rows in use: an expert in `0..experts` and `p < *total` (the activation output between the two GEMMs) |
//!
//! Rows not written (padding, dropped slots, rows not in use) keep what they held: zero them once after
//! allocation ([`Fp8Rows::alloc`] does) if a consumer reads them. The scale of row `r`, group `g` is
//! `scales[r · ceil(K / 128) + g]`: the K-major SFA layout of the SM90 CUTLASS blockwise grouped GEMM, where a
//! group of rows starting at `row_start` has its scales at `row_start · ceil(K / 128)`.
//!
//! Graph-safe: the launches allocate, copy and synchronise nothing. NaN and ±∞ inputs become e4m3 NaN and set
//! [`crate::status::bits::NONFINITE_INPUT`] in the status word.
//!
//! Expert weights are quantised per 128 × 128 block by [`quantize_weights`] (into an [`Fp8BlockWeights`]) and
//! [`Fp8BlockWeights::quantize_device`] (which allocates it): the device side of [`super::BlockFp8::quantize`],
//! for converting bf16 or f16 checkpoints to DeepSeek-style block FP8 on the GPU. The rules, bit for bit the host
//! quantiser's for the inputs the host accepts (`cpp/moe_ops/quant.h` states them for the kernel):
//!
//! * per block (the edge blocks of `N % 128` rows or `K % 128` columns cover what they have),
//!   `amax = max |w|` over its finite elements; an all-zero block gets scale 1;
//! * [`ScaleFormat::F32`]: `scale = max(amax / 448, 2^-149)` (IEEE division; the smallest positive f32 for
//!   blocks of subnormals); [`ScaleFormat::Ue8m0`]: the next power of two up, held as its f32 value (UE8M0
//!   scales are f32 in [`Fp8BlockWeights`], as [`crate::layer::Fp8ExpertWeights::upload`] widens them), and at
//!   least `2^-127`, the smallest UE8M0: where `amax / 448 <= 2^-128` the host refuses the block (no UE8M0
//!   ceiling in range) and the device takes `2^-127`, which saturates nothing (`|w| / scale <= 224`);
//! * `q = e4m3(w / scale)`, IEEE division, round to nearest even, saturating to ±448 (blocks of subnormals,
//!   whose scale is coarse, do saturate);
//! * NaN and ±∞ elements, which the host refuses, become the e4m3 NaN with their sign (`0x7F` / `0xFF`) and set
//!   [`crate::status::bits::NONFINITE_INPUT`]; the rest of their block is quantised by the scale of its finite
//!   elements, every other block as usual. Such weights are not meaningful: check the status after a
//!   conversion ([`DeviceStatus::check`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};

use super::group::{GroupQuant, ScaleRounding, ACT_GROUP};
use super::{Fp8BlockWeights, ScaleFormat, F8E4M3};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi::quant as ffi;
use crate::layouts::{ExpertLayout, LayoutDims};
use crate::status::DeviceStatus;
use crate::view::MatrixView;

/// E4M3 rows `[rows, k]` (row stride `k`) with one f32 scale per row per 128 columns, K-major
/// `[rows][ceil(k / 128)]`: `x[r, c] ≈ data[r·k + c] · scales[r·ceil(k/128) + c/128]`.
#[derive(Debug)]
pub struct Fp8Rows {
    data: CudaSlice<F8E4M3>,
    scales: CudaSlice<f32>,
    rows: usize,
    k: usize,
}

fn sizes(rows: usize, k: usize) -> Result<(usize, usize)> {
    let groups = k.div_ceil(ACT_GROUP);
    match (k, rows.checked_mul(k), rows.checked_mul(groups)) {
        (1.., Some(d), Some(s)) => Ok((d, s)),
        _ => Err(Error::InvalidProblem(format!("fp8 rows [{rows}, {k}]: k must be positive and rows x k fit usize"))),
    }
}

impl Fp8Rows {
    /// Zeroed rows on `stream`'s device (outside the launch path).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k = 0` or an overflowing size; allocation errors.
    pub fn alloc(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<Fp8Rows> {
        let (d, s) = sizes(rows, k)?;
        // A zero-length allocation is refused by some drivers: keep one element.
        Ok(Fp8Rows { data: stream.alloc_zeros(d.max(1))?, scales: stream.alloc_zeros(s.max(1))?, rows, k })
    }

    /// Wraps existing buffers (e.g. views of one arena would be the next step); at least `rows · k` bytes and
    /// `rows · ceil(k / 128)` scales.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k = 0`; [`Error::Buffer`] for buffers shorter than that.
    pub fn from_parts(data: CudaSlice<F8E4M3>, scales: CudaSlice<f32>, rows: usize, k: usize) -> Result<Fp8Rows> {
        let (d, s) = sizes(rows, k)?;
        for (name, len, need) in [("fp8 data", data.len(), d), ("fp8 scales", scales.len(), s)] {
            if len < need {
                return Err(Error::Buffer { name, detail: format!("holds {len}, [{rows}, {k}] rows need {need}") });
            }
        }
        Ok(Fp8Rows { data, scales, rows, k })
    }

    /// Views the same buffers as `[rows, k]` rows (no allocation, no device work): a buffer sized for the
    /// widest of several shapes serves each in turn (a scratch shared by layers of different widths). What the
    /// buffers held is not moved: re-quantise after a reshape.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k = 0` or an overflowing size; [`Error::Buffer`] when the buffers hold
    /// fewer than `rows · k` elements or `rows · ceil(k / 128)` scales. The rows are unchanged on error.
    pub fn reshape(&mut self, rows: usize, k: usize) -> Result<()> {
        let (d, s) = sizes(rows, k)?;
        for (name, len, need) in [("fp8 data", self.data.len(), d), ("fp8 scales", self.scales.len(), s)] {
            if len < need {
                return Err(Error::Buffer { name, detail: format!("holds {len}, [{rows}, {k}] rows need {need}") });
            }
        }
        self.rows = rows;
        self.k = k;
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn k(&self) -> usize {
        self.k
    }
    /// Scales per row, `ceil(k / 128)`: the row stride of [`Fp8Rows::scales`].
    pub fn groups(&self) -> usize {
        self.k.div_ceil(ACT_GROUP)
    }
    /// e4m3 `[rows, k]`.
    pub fn data(&self) -> &CudaSlice<F8E4M3> {
        &self.data
    }
    /// f32 `[rows, ceil(k / 128)]`, K-major.
    pub fn scales(&self) -> &CudaSlice<f32> {
        &self.scales
    }
    /// The data and the scales, borrowed mutably at once.
    pub fn parts_mut(&mut self) -> (&mut CudaSlice<F8E4M3>, &mut CudaSlice<f32>) {
        (&mut self.data, &mut self.scales)
    }
    pub fn data_mut(&mut self) -> &mut CudaSlice<F8E4M3> {
        &mut self.data
    }
    pub fn scales_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.scales
    }
    /// The buffers, by value.
    pub fn into_parts(self) -> (CudaSlice<F8E4M3>, CudaSlice<f32>) {
        (self.data, self.scales)
    }

    /// Copies both to the host: (`[rows · k]` elements, `[rows · ceil(k / 128)]` scales). Synchronises `stream`:
    /// for tests and checks, not the launch path.
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<(Vec<F8E4M3>, Vec<f32>)> {
        let (d, s) = sizes(self.rows, self.k)?;
        let mut data = stream.clone_dtoh(&self.data)?;
        let mut scales = stream.clone_dtoh(&self.scales)?;
        data.truncate(d);
        scales.truncate(s);
        Ok((data, scales))
    }

    fn dst(&mut self) -> ffi::QuantDst<'_> {
        ffi::QuantDst { data: &mut self.data, scales: &mut self.scales, rows: self.rows, amax: None }
    }
}

fn desc(k: usize, opts: &GroupQuant) -> ffi::QuantDesc<'static> {
    let ue8m0 = opts.rounding() == ScaleRounding::Ue8m0Ceil;
    ffi::QuantDesc { k, eps: opts.eps(), ue8m0, per_row: false, static_scale: None }
}

fn same_k<T>(x: &MatrixView<'_, T>, out: &Fp8Rows) -> Result<()> {
    if x.cols() != out.k {
        return Err(Error::Buffer {
            name: x.name(),
            detail: format!("has {} columns, the fp8 rows {}", x.cols(), out.k),
        });
    }
    Ok(())
}

fn fits_rows(out: &Fp8Rows, need: usize, what: &str) -> Result<()> {
    if out.rows < need {
        return Err(Error::Buffer {
            name: "fp8 rows",
            detail: format!("has {} rows, needs {need} ({what})", out.rows),
        });
    }
    Ok(())
}

/// Quantises every row of `x [rows, K]` into rows `0..rows` of `out` (which has at least `rows` rows of `K`).
///
/// # Errors
/// [`Error::Buffer`] for another `K` or too few rows; launch errors. Non-finite inputs are reported through
/// `status`.
pub fn quantize_rows<T: Element>(
    stream: &Arc<CudaStream>,
    x: &MatrixView<'_, T>,
    out: &mut Fp8Rows,
    opts: &GroupQuant,
    status: &mut DeviceStatus,
) -> Result<()> {
    quantize_same_rows(stream, x, "rows of x", None, out, opts, status)
}

/// Quantises the rows of `x` (those `mask` keeps) into the same rows of `out`; `what` names `x`'s rows in errors.
fn quantize_same_rows<T: Element>(
    stream: &Arc<CudaStream>,
    x: &MatrixView<'_, T>,
    what: &str,
    mask: Option<&ffi::RowMask<'_>>,
    out: &mut Fp8Rows,
    opts: &GroupQuant,
    status: &mut DeviceStatus,
) -> Result<()> {
    same_k(x, out)?;
    fits_rows(out, x.rows(), what)?;
    let view = x.as_view();
    let src = ffi::QuantSrc { x: &view, rows: x.rows(), stride: x.stride() };
    ffi::launch_quantize_rows(stream, &desc(x.cols(), opts), &src, mask, out.dst(), status.word_mut())
}

/// Which rows of a position-indexed matrix are in use: those whose expert in `row_experts` is in `0..experts`
/// and, with `total`, those before the device count `*total` (the activation kernel's rule).
#[derive(Debug)]
pub struct RowsInUse<'a> {
    pub(super) row_experts: CudaView<'a, i32>,
    pub(super) experts: usize,
    pub(super) total: Option<&'a CudaSlice<i32>>,
}

impl<'a> RowsInUse<'a> {
    pub fn new(row_experts: CudaView<'a, i32>, experts: usize, total: Option<&'a CudaSlice<i32>>) -> Self {
        RowsInUse { row_experts, experts, total }
    }

    /// The rows a layout fills: its `m_indices` (−1 on padding), its local experts and its `total`.
    pub fn of_layout(layout: &'a ExpertLayout) -> Self {
        RowsInUse::new(layout.m_indices().as_view(), layout.dims().local_experts(), Some(layout.total()))
    }
}

/// Quantises the rows in use of `h [rows, K]` (the activation output, indexed by position) into the same rows
/// of `out`; other rows of `out` are left as they were.
///
/// # Errors
/// [`Error::Buffer`] for another `K`, too few rows in `out` or in `rows.row_experts`; launch errors.
pub fn requantize_rows<T: Element>(
    stream: &Arc<CudaStream>,
    h: &MatrixView<'_, T>,
    rows: &RowsInUse<'_>,
    out: &mut Fp8Rows,
    opts: &GroupQuant,
    status: &mut DeviceStatus,
) -> Result<()> {
    let mask = ffi::RowMask { row_experts: &rows.row_experts, experts: rows.experts, total: rows.total };
    quantize_same_rows(stream, h, "rows of h", Some(&mask), out, opts, status)
}

/// Quantises each token row of `x [tokens, K]` into `out` at each of its `top_k` positions in `layout` (built for
/// these tokens): the permuted copy of `x` for the expert GEMMs, produced directly in e4m3. `out` has at least
/// the layout's capacity in rows; dropped slots and padding rows are left as they were.
///
/// # Errors
/// [`Error::InvalidProblem`] if `tokens > max_tokens`; [`Error::Buffer`] for another `K` or fewer rows than the
/// capacity; launch errors. Non-finite inputs and positions past `out` are reported through `status`.
pub fn quantize_gather<T: Element>(
    stream: &Arc<CudaStream>,
    layout: &ExpertLayout,
    x: &MatrixView<'_, T>,
    out: &mut Fp8Rows,
    opts: &GroupQuant,
    status: &mut DeviceStatus,
) -> Result<()> {
    let dims = check_tokens(layout, x)?;
    same_k(x, out)?;
    fits_rows(out, dims.capacity(), "the layout's capacity")?;
    let view = x.as_view();
    let src = ffi::QuantSrc { x: &view, rows: x.rows(), stride: x.stride() };
    let d = desc(x.cols(), opts);
    ffi::launch_quantize_gather(stream, &d, &src, dims.top_k(), layout.positions(), out.dst(), status.word_mut())
}

/// `layout`'s extents, after checking that `x` holds no more tokens than it was built for.
pub(super) fn check_tokens<'l, T>(layout: &'l ExpertLayout, x: &MatrixView<'_, T>) -> Result<&'l LayoutDims> {
    let dims = layout.dims();
    if x.rows() > dims.max_tokens() {
        return Err(Error::InvalidProblem(format!(
            "tokens = {} exceeds the layout's max_tokens = {}",
            x.rows(),
            dims.max_tokens()
        )));
    }
    Ok(dims)
}

/// The kernel's description of `experts` weights `[n, k]` with scales in `format`.
fn weight_desc(experts: usize, n: usize, k: usize, format: ScaleFormat) -> ffi::WeightQuantDesc {
    let ue8m0 = match format {
        ScaleFormat::F32 => false,
        ScaleFormat::Ue8m0 => true,
    };
    ffi::WeightQuantDesc { experts, n, k, ue8m0 }
}

/// Every check of a weight quantisation before anything is allocated or queued: extents the kernel takes
/// (positive, `n` and `k` within int32, the element count within int64, no overflow), and `w` holding exactly
/// `experts · n · k` elements (a flat view of another shape is a mistake to name, not to read past or short).
fn check_weights(w_len: usize, d: &ffi::WeightQuantDesc) -> Result<()> {
    let (elements, _) = ffi::weight_quant_lengths(d)?;
    if w_len != elements {
        return Err(Error::Buffer {
            name: "w",
            detail: format!(
                "holds {w_len} elements, weights [experts, n, k] = [{}, {}, {}] have experts x n x k = {elements}",
                d.experts, d.n, d.k
            ),
        });
    }
    Ok(())
}

/// Quantises device weights `w [experts, n, k]` (nn.Linear `[out, in]` per expert, row-major, any alignment)
/// into `out`'s e4m3 elements and 128 × 128 scales, by the rules of the module docs (bit for bit
/// [`super::BlockFp8::quantize`] of each expert, for finite inputs); `experts`, `n` and `k` are `out`'s. Queues
/// one kernel: no allocation, copy or synchronisation (graph-safe).
///
/// # Errors
/// [`Error::InvalidProblem`] for extents the kernel cannot take (`n` or `k` past int32, `experts · n · k` past
/// int64); [`Error::Buffer`] when `w` does not hold exactly `experts · n · k` elements; launch errors. Nothing
/// is queued on error. NaN and ±∞ elements are reported through `status`
/// ([`crate::status::bits::NONFINITE_INPUT`]).
pub fn quantize_weights<T: Element>(
    stream: &Arc<CudaStream>,
    w: &CudaView<'_, T>,
    format: ScaleFormat,
    out: &mut Fp8BlockWeights,
    status: &mut DeviceStatus,
) -> Result<()> {
    let d = weight_desc(out.experts(), out.n(), out.k(), format);
    check_weights(w.len(), &d)?;
    let (q, scales) = out.parts_mut();
    ffi::launch_quantize_weights(stream, &d, w, q, scales, status.word_mut())
}

impl Fp8BlockWeights {
    /// Quantises device weights `w [experts, n, k]` (16-bit, nn.Linear `[out, in]` per expert) into new
    /// block-FP8 weights with scales in `format` (held as f32), for the FP8 GEMM and layer
    /// ([`crate::layer::Fp8ExpertWeights::from_device`]; with UE8M0 scales also quantise the activations with
    /// [`GroupQuant::DEEPSEEK_UE8M0`], `with_activation_quant`). Allocates the result (zeroed, on `stream`), then
    /// queues [`quantize_weights`]: a conversion step, not a launch for a captured graph. Does not synchronise:
    /// the weights are ready in stream order.
    ///
    /// # Errors
    /// Before any allocation: [`Error::InvalidProblem`] naming an extent that is 0 or that the kernel cannot
    /// take; [`Error::Buffer`] when `w` does not hold exactly `experts · n · k` elements. Then allocation and
    /// launch errors. NaN and ±∞ elements are reported through `status`.
    #[allow(clippy::too_many_arguments)]
    pub fn quantize_device<T: Element>(
        stream: &Arc<CudaStream>,
        w: &CudaView<'_, T>,
        experts: usize,
        n: usize,
        k: usize,
        format: ScaleFormat,
        status: &mut DeviceStatus,
    ) -> Result<Fp8BlockWeights> {
        check_weights(w.len(), &weight_desc(experts, n, k, format))?;
        let mut out = Fp8BlockWeights::zeros(stream, experts, n, k)?;
        quantize_weights(stream, w, format, &mut out, status)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::invalid_problem as invalid;

    fn check(w_len: usize, experts: usize, n: usize, k: usize) -> Result<()> {
        check_weights(w_len, &weight_desc(experts, n, k, ScaleFormat::F32))
    }

    #[test]
    fn weight_formats_map_to_the_kernel_flag() {
        assert!(!weight_desc(1, 1, 1, ScaleFormat::F32).ue8m0);
        assert!(weight_desc(1, 1, 1, ScaleFormat::Ue8m0).ue8m0);
    }

    #[test]
    fn weights_of_the_shape_are_accepted_edge_blocks_included() {
        check(2 * 200 * 328, 2, 200, 328).unwrap();
        check(1, 1, 1, 1).unwrap();
        check(256 * 4096 * 7168, 256, 4096, 7168).unwrap();
    }

    #[test]
    fn zero_extents_are_named() {
        for (e, n, k) in [(0, 200, 328), (2, 0, 328), (2, 200, 0)] {
            let m = invalid(check(0, e, n, k));
            assert!(m.contains(&format!("[experts, n, k] = [{e}, {n}, {k}]")) && m.contains("positive"), "{m}");
        }
    }

    #[test]
    fn extents_past_the_kernels_integer_ranges_are_named() {
        let m = invalid(check(0, 1, 1 << 31, 128));
        assert!(m.contains("n (rows per expert)") && m.contains("int32"), "{m}");
        let m = invalid(check(0, 1, 128, 1 << 31));
        assert!(m.contains("k (columns)") && m.contains("int32"), "{m}");
        let m = invalid(check(0, 1 << 33, 1 << 15, 1 << 15));
        assert!(m.contains("int64"), "{m}");
        let m = invalid(check(0, usize::MAX / 4, 1 << 20, 1 << 20));
        assert!(m.contains("overflows usize"), "{m}");
    }

    #[test]
    fn a_flat_view_of_another_size_is_named() {
        for len in [2 * 200 * 328 - 1, 2 * 200 * 328 + 1, 200 * 328, 0] {
            match check(len, 2, 200, 328) {
                Err(Error::Buffer { name: "w", detail }) => {
                    assert!(detail.contains(&format!("holds {len} elements")), "{detail}");
                    assert!(
                        detail.contains("[2, 200, 328]") && detail.contains(&(2 * 200 * 328).to_string()),
                        "{detail}"
                    );
                }
                other => panic!("w of {len}: expected a buffer error, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_shape_is_checked_before_the_length() {
        // A zero extent is named as such even when the length also differs.
        let m = invalid(check(5, 0, 128, 128));
        assert!(m.contains("positive"), "{m}");
    }
}
