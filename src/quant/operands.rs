//! Block-scaled FP8 operands on the device, each one value that holds its e4m3 elements and their f32 scales
//! (dequantisation multipliers: `x ≈ q · s`), so that elements and scales cannot drift apart or be paired with
//! another operand's grid:
//!
//! * [`Fp8Rows`]: activations `[rows, K]` with one scale per row per 128 of K, **K-major** `[rows, ceil(K/128)]`
//!   (DeepSeek-V3's per-token-group quantisation, the scales of a row contiguous). The rows of one group are a
//!   contiguous block, so a group's scales start at `row_start · ceil(K/128)`: [`sfa_offset`].
//! * [`Fp8BlockWeights`]: `G` expert weights `[N, K]` (nn.Linear `[out, in]`) with one scale per 128 × 128
//!   block, `[G, ceil(N/128), ceil(K/128)]` (DeepSeek-V3's `weight_scale_inv` per expert, stacked): expert `g`'s
//!   grid starts at [`sfb_offset`].
//!
//! Constructors check element and scale counts against the shapes; the elements are `F8E4M3` (E4M3FN) in
//! cudarc slices. Made on the host from [`BlockFp8`] (the host quantiser and exact reference), on the device from
//! 16-bit weights ([`Fp8BlockWeights::quantize_device`], [`super::quantize_weights`]: the same bits) or from
//! device buffers filled elsewhere.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use super::{for_each_expert, rows_cols, BlockFp8, BlockShape, Fp8Rows, Scales, F8E4M3};
use crate::error::{Error, Result};

/// Elements per scale block along K (both operands) and along N (weights).
pub const SCALE_BLOCK: usize = 128;

/// Scale-grid extent of `len` elements in 128-element blocks: `ceil(len / 128)`.
pub const fn scale_blocks(len: usize) -> usize {
    len.div_ceil(SCALE_BLOCK)
}

/// Index of the first activation scale of a group starting at row `row_start` (K-major `[rows, ceil(K/128)]`).
pub const fn sfa_offset(row_start: usize, k: usize) -> usize {
    row_start * scale_blocks(k)
}

/// Index of the first weight scale of expert `g` in `[G, ceil(N/128), ceil(K/128)]`.
pub const fn sfb_offset(g: usize, n: usize, k: usize) -> usize {
    g * scale_blocks(n) * scale_blocks(k)
}

pub(super) fn product(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::InvalidProblem(format!("{what} {dims:?}: the element count overflows usize")))
}

/// Element and scale counts of `rows` activation rows of `k`: `(rows·k, rows·ceil(k/128))`.
fn rows_lengths(rows: usize, k: usize) -> Result<(usize, usize)> {
    if k == 0 {
        return Err(Error::InvalidProblem("FP8 rows of K = 0: K must be positive".into()));
    }
    Ok((
        product("FP8 rows [rows, K] =", &[rows, k])?,
        product("scales [rows, ceil(K/128)] =", &[rows, scale_blocks(k)])?,
    ))
}

/// Element and scale counts of `experts` weights `[n, k]`: `(G·n·k, G·ceil(n/128)·ceil(k/128))`.
fn weight_lengths(experts: usize, n: usize, k: usize) -> Result<(usize, usize)> {
    if experts == 0 || n == 0 || k == 0 {
        return Err(Error::InvalidProblem(format!(
            "FP8 weights [G, N, K] = [{experts}, {n}, {k}]: every extent must be positive"
        )));
    }
    Ok((
        product("FP8 weights [G, N, K] =", &[experts, n, k])?,
        product("scales [G, ceil(N/128), ceil(K/128)] =", &[experts, scale_blocks(n), scale_blocks(k)])?,
    ))
}

pub(super) fn check_len(what: &str, got: usize, want: usize, shape: String) -> Result<()> {
    if got != want {
        return Err(Error::InvalidProblem(format!("{got} {what} for {shape}: expected {want}")));
    }
    Ok(())
}

/// Host block-FP8 experts of one shape stacked in order: their e4m3 elements and the f32 scales `scales` takes
/// of each (`scales(expert, its name for errors, into)`), in room for `(elements, scales)`.
///
/// # Errors
/// As [`for_each_expert`]; those of `scales`.
pub(super) fn stack_fp8(
    experts: &[BlockFp8],
    (nq, ns): (usize, usize),
    scales: impl Fn(&BlockFp8, &str, &mut Vec<f32>) -> Result<()>,
) -> Result<(Vec<F8E4M3>, Vec<f32>)> {
    let (mut q, mut s) = (Vec::with_capacity(nq), Vec::with_capacity(ns));
    for_each_expert(
        "FP8",
        "one shape",
        experts,
        |e| rows_cols(e.rows(), e.cols()),
        |g, e| {
            scales(e, &format!("FP8 expert {g}"), &mut s)?;
            q.extend_from_slice(e.q());
            Ok(())
        },
    )?;
    Ok((q, s))
}

/// The f32 scales of a host block-quantized matrix in `block`, or the error naming what differs.
pub(super) fn f32_scales<'a>(m: &'a BlockFp8, block: BlockShape, what: &str) -> Result<&'a [f32]> {
    if m.block() != block {
        return Err(Error::InvalidProblem(format!(
            "{what}: blocks of {} x {}, expected {} x {}",
            m.block().rows,
            m.block().cols,
            block.rows,
            block.cols
        )));
    }
    match m.scales() {
        Scales::F32(s) => Ok(s),
        other => Err(Error::InvalidProblem(format!(
            "{what}: {:?} scales, the blockwise FP8 GEMM takes F32 dequantisation multipliers",
            other.format()
        ))),
    }
}

/// Constructors and views of [`Fp8Rows`] for the blockwise GEMM (the type itself lives in [`super::device`],
/// beside its quantisers).
impl Fp8Rows {
    /// Wraps device buffers of `rows` rows of `k` (as [`Fp8Rows::from_parts`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the count that differs.
    pub fn new(q: CudaSlice<F8E4M3>, scales: CudaSlice<f32>, rows: usize, k: usize) -> Result<Self> {
        Fp8Rows::from_parts(q, scales, rows, k)
    }

    /// Zeroed rows (as [`Fp8Rows::alloc`]).
    ///
    /// # Errors
    /// As [`Fp8Rows::alloc`].
    pub fn zeros(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<Self> {
        let _ = rows_lengths(rows, k)?;
        Fp8Rows::alloc(stream, rows, k)
    }

    /// Uploads host rows quantized in 1 × 128 blocks ([`BlockShape::PER_TOKEN_128`]) with F32 scales, whose
    /// scale grid `[rows, ceil(K/128)]` is then already K-major.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for another block shape or scale format; driver errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, x: &BlockFp8) -> Result<Self> {
        let scales = f32_scales(x, BlockShape::PER_TOKEN_128, "FP8 activation rows")?;
        Fp8Rows::from_parts(stream.clone_htod(x.q())?, stream.clone_htod(scales)?, x.rows(), x.cols())
    }

    /// Scales per row: `ceil(K/128)`.
    pub fn scale_cols(&self) -> usize {
        self.groups()
    }

    /// The e4m3 elements as a view.
    pub fn q(&self) -> CudaView<'_, F8E4M3> {
        self.data().as_view()
    }

    /// The e4m3 elements, writable in place (their length cannot change).
    pub fn q_mut(&mut self) -> CudaViewMut<'_, F8E4M3> {
        self.data_mut().as_view_mut()
    }
}

/// Block-quantized expert weights on the device: e4m3 `[G, N, K]` (nn.Linear `[out, in]` per expert) and f32
/// scales `[G, ceil(N/128), ceil(K/128)]` (one per 128 × 128 block; DeepSeek's `weight_scale_inv`), one value.
#[derive(Debug)]
pub struct Fp8BlockWeights {
    q: CudaSlice<F8E4M3>,
    scales: CudaSlice<f32>,
    experts: usize,
    n: usize,
    k: usize,
}

impl Fp8BlockWeights {
    /// Wraps device buffers of `experts` weights `[n, k]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the count that differs: `G·N·K` elements, `G·ceil(N/128)·ceil(K/128)`
    /// scales; every extent positive; no overflow.
    pub fn new(q: CudaSlice<F8E4M3>, scales: CudaSlice<f32>, experts: usize, n: usize, k: usize) -> Result<Self> {
        let (nq, ns) = weight_lengths(experts, n, k)?;
        check_len("e4m3 elements", q.len(), nq, format!("FP8 weights [G, N, K] = [{experts}, {n}, {k}]"))?;
        let (gn, gk) = (scale_blocks(n), scale_blocks(k));
        check_len(
            "scales",
            scales.len(),
            ns,
            format!("the 128x128 scale grid [G, ceil(N/128), ceil(K/128)] = [{experts}, {gn}, {gk}]"),
        )?;
        Ok(Fp8BlockWeights { q, scales, experts, n, k })
    }

    /// Zeroed weights of `experts` experts `[n, k]` and their scale grid on `stream`'s device (outside the
    /// launch path), e.g. for [`super::quantize_weights`] to fill.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming an extent that is 0 or a count that overflows; allocation errors.
    pub fn zeros(stream: &Arc<CudaStream>, experts: usize, n: usize, k: usize) -> Result<Self> {
        let (nq, ns) = weight_lengths(experts, n, k)?;
        Self::new(stream.alloc_zeros(nq)?, stream.alloc_zeros(ns)?, experts, n, k)
    }

    /// Uploads host experts, each `[N, K]` quantized in 128 × 128 blocks ([`BlockShape::DEEPSEEK`]) with F32
    /// scales, stacked in order.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts, experts of different shapes, another block shape or scale
    /// format (the expert named); driver errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, experts: &[BlockFp8]) -> Result<Self> {
        let first = experts.first().ok_or_else(|| Error::InvalidProblem("FP8 weights of 0 experts".into()))?;
        let (n, k) = (first.rows(), first.cols());
        let lengths = weight_lengths(experts.len(), n, k)?;
        let (q, s) = stack_fp8(experts, lengths, |e, what, s| {
            s.extend_from_slice(f32_scales(e, BlockShape::DEEPSEEK, what)?);
            Ok(())
        })?;
        Self::new(stream.clone_htod(&q)?, stream.clone_htod(&s)?, experts.len(), n, k)
    }

    getters!(experts: usize, n: usize, k: usize);
    /// One expert's scale grid: `(ceil(N/128), ceil(K/128))`.
    pub fn scale_grid(&self) -> (usize, usize) {
        (scale_blocks(self.n), scale_blocks(self.k))
    }
    /// The e4m3 elements, `[G, N, K]`.
    pub fn q(&self) -> CudaView<'_, F8E4M3> {
        self.q.as_view()
    }
    /// The scales, `[G, ceil(N/128), ceil(K/128)]`.
    pub fn scales(&self) -> CudaView<'_, f32> {
        self.scales.as_view()
    }
    /// The elements and the scales, by value.
    pub fn into_parts(self) -> (CudaSlice<F8E4M3>, CudaSlice<f32>) {
        (self.q, self.scales)
    }
    /// Both buffers, writable in place (their lengths, and so the shape, cannot change): for the device
    /// quantiser.
    pub(super) fn parts_mut(&mut self) -> (&mut CudaSlice<F8E4M3>, &mut CudaSlice<f32>) {
        (&mut self.q, &mut self.scales)
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.q.context().ordinal()
    }
    /// Device bytes: one per e4m3 element, four per scale.
    pub fn bytes(&self) -> usize {
        self.q.num_bytes() + self.scales.num_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_and_offsets_of_deepseek_shapes() {
        // DeepSeek-V3 experts: w13 [2I, H] = [4096, 7168], w2 [H, I] = [7168, 2048].
        assert_eq!((scale_blocks(4096), scale_blocks(7168)), (32, 56));
        assert_eq!((scale_blocks(7168), scale_blocks(2048)), (56, 16));
        assert_eq!(sfb_offset(3, 4096, 7168), 3 * 32 * 56);
        assert_eq!(sfb_offset(0, 4096, 7168), 0);
        // Group starting at row 4135 of activations with K 7168: 56 scales per row before it.
        assert_eq!(sfa_offset(4135, 7168), 4135 * 56);
        // A partial last block of K counts as a block (ceil), as the kernel's scale layout does.
        assert_eq!(scale_blocks(912), 8);
        assert_eq!(sfa_offset(2, 912), 16);
        assert_eq!(scale_blocks(1), 1);
        assert_eq!(scale_blocks(0), 0);
    }

    #[test]
    fn lengths_of_rows_and_weights() {
        assert_eq!(rows_lengths(5, 7168).unwrap(), (5 * 7168, 5 * 56));
        assert_eq!(rows_lengths(0, 256).unwrap(), (0, 0));
        assert!(rows_lengths(3, 0).unwrap_err().to_string().contains("K must be positive"));
        assert_eq!(weight_lengths(2, 4096, 7168).unwrap(), (2 * 4096 * 7168, 2 * 32 * 56));
        assert_eq!(weight_lengths(1, 200, 136).unwrap(), (200 * 136, 2 * 2));
        let e = weight_lengths(0, 128, 128).unwrap_err().to_string();
        assert!(e.contains("[0, 128, 128]") && e.contains("positive"), "{e}");
        let e = weight_lengths(usize::MAX / 2, 1 << 20, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("overflows"), "{e}");
    }

    #[test]
    fn host_operands_must_be_f32_in_their_block_shape() {
        let w = vec![0.5f32; 128 * 256];
        let per_token =
            BlockFp8::quantize(&w, 128, 256, BlockShape::PER_TOKEN_128, super::super::ScaleFormat::F32).unwrap();
        assert_eq!(f32_scales(&per_token, BlockShape::PER_TOKEN_128, "x").unwrap().len(), 128 * 2);
        let e = f32_scales(&per_token, BlockShape::DEEPSEEK, "FP8 expert 1").unwrap_err().to_string();
        assert!(e.contains("FP8 expert 1") && e.contains("1 x 128") && e.contains("128 x 128"), "{e}");
        let mx = BlockFp8::quantize(&w, 128, 256, BlockShape::DEEPSEEK, super::super::ScaleFormat::Ue8m0).unwrap();
        let e = f32_scales(&mx, BlockShape::DEEPSEEK, "FP8 expert 0").unwrap_err().to_string();
        assert!(e.contains("Ue8m0") && e.contains("F32"), "{e}");
    }
}
