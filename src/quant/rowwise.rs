//! FP8 operands with one scale per row: activations quantised per token and expert weights with one scale per
//! output channel, for the rowwise-scaled grouped GEMM ([`crate::kernels::grouped_fp8_rowwise`]). A per-tensor
//! scale is its special case: the same value in every row.
//!
//! On the host both are a [`BlockFp8`] whose block spans a whole row (`BlockShape { rows: 1, cols: K }`: per
//! token, per channel) or the whole matrix (`{ rows: N, cols: K }`: per tensor), with F32 scales; the device
//! types below take either and hold one f32 per row, so a per-tensor checkpoint and a per-channel one run the
//! same kernel.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};

use super::device::RowsInUse;
use super::group::{GroupQuant, ScaleRounding};
use super::operands::{check_len, product, stack_fp8};
use super::{BlockFp8, BlockShape, Scales, F8E4M3};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi::quant as ffi;
use crate::layouts::ExpertLayout;
use crate::status::DeviceStatus;
use crate::view::MatrixView;

/// The one f32 scale per row of a host matrix whose scale block spans whole rows (`1 x K`) or all of it
/// (`N x K`, repeated for every row); `what` names the matrix in errors.
fn row_scales(m: &BlockFp8, what: &str) -> Result<Vec<f32>> {
    let (rows, cols, b) = (m.rows(), m.cols(), m.block());
    let per_tensor = b.rows >= rows && b.cols >= cols;
    let per_row = b.rows == 1 && b.cols >= cols;
    if !(per_row || per_tensor) {
        return Err(Error::InvalidProblem(format!(
            "{what}: blocks of {} x {} over [{rows}, {cols}]: rowwise FP8 takes one scale per row (1 x {cols}) or \
             one per tensor ({rows} x {cols})",
            b.rows, b.cols
        )));
    }
    let Scales::F32(s) = m.scales() else {
        return Err(Error::InvalidProblem(format!("{what}: {:?} scales, rowwise FP8 takes F32", m.scales().format())));
    };
    let s: Vec<f32> = if per_row { s.clone() } else { vec![s[0]; rows] };
    if let Some(i) = s.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(Error::InvalidProblem(format!(
            "{what}: scale of row {i} = {}: scales must be finite and non-negative",
            s[i]
        )));
    }
    Ok(s)
}

/// How the device quantises activations per token ([`Fp8TokenRows::quantize`] and its kin).
#[derive(Clone, Copy, Debug)]
pub enum TokenScale<'a> {
    /// Each row's own scale, `max(amax, eps) / 448` by these options (dynamic per-token scaling).
    Dynamic(GroupQuant),
    /// One scale for every row (a checkpoint's static `input_scale`, f32 `[1]` on the device, uploaded once), as
    /// is: device data, so one that is not finite and positive is replaced by 1 and reported
    /// ([`crate::status::bits::BAD_STATIC_SCALE`]).
    Static(&'a CudaSlice<f32>),
    /// One scale for every row, computed at run time: `max(amax, eps) / 448` by these options, the amax over every
    /// row the call quantises (dynamic per-tensor scaling, vLLM's `scaled_fp8_quant` without a scale). A first
    /// kernel reduces the amax into the rows' own device word ([`Fp8TokenRows::zeros`] allocates it).
    DynamicTensor(GroupQuant),
}

/// Activations quantised per token on the device: e4m3 `[rows, K]` and f32 scales `[rows]`, one value; and the
/// device word a dynamic per-tensor scale is reduced in ([`TokenScale::DynamicTensor`]; 4 bytes, from
/// [`Self::zeros`]).
#[derive(Debug)]
pub struct Fp8TokenRows {
    q: CudaSlice<F8E4M3>,
    scales: CudaSlice<f32>,
    amax: Option<CudaSlice<u32>>,
    rows: usize,
    k: usize,
}

impl Fp8TokenRows {
    /// Wraps device buffers of `rows` rows of `k`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the count that differs (`rows · K` elements, `rows` scales) or `K = 0`.
    pub fn new(q: CudaSlice<F8E4M3>, scales: CudaSlice<f32>, rows: usize, k: usize) -> Result<Self> {
        if k == 0 {
            return Err(Error::InvalidProblem("FP8 token rows of K = 0: K must be positive".into()));
        }
        check_len("e4m3 elements", q.len(), product("FP8 rows [rows, K] =", &[rows, k])?, format!("[{rows}, {k}]"))?;
        check_len("scales", scales.len(), rows, format!("{rows} rows (one scale per token)"))?;
        Ok(Fp8TokenRows { q, scales, amax: None, rows, k })
    }

    /// Zeroed rows, with the word of a dynamic per-tensor scale.
    ///
    /// # Errors
    /// As [`Self::new`]; driver errors of the allocation.
    pub fn zeros(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<Self> {
        let n = product("FP8 rows [rows, K] =", &[rows, k])?;
        let rows = Self::new(stream.alloc_zeros(n)?, stream.alloc_zeros(rows)?, rows, k)?;
        Ok(Fp8TokenRows { amax: Some(stream.alloc_zeros(1)?), ..rows })
    }

    /// Device bytes: the e4m3 rows, their scales and the amax word.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len() + 4 * self.amax.as_ref().map_or(0, |w| w.len())
    }

    /// Uploads host rows quantised per token (`1 x K` blocks) or per tensor, with F32 scales.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for another block shape or scale format, or a non-finite or negative scale (the
    /// row named); driver errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, x: &BlockFp8) -> Result<Self> {
        let s = row_scales(x, "FP8 token rows")?;
        Self::new(stream.clone_htod(x.q())?, stream.clone_htod(&s)?, x.rows(), x.cols())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn q(&self) -> CudaView<'_, F8E4M3> {
        self.q.as_view()
    }
    pub fn scales(&self) -> CudaView<'_, f32> {
        self.scales.as_view()
    }

    /// Quantises every row of `x [rows, K]` on the device into rows `0..rows`, one scale per row (per token):
    /// with [`TokenScale::Dynamic`], `scale = max(amax, eps) / 448` over the row's finite elements (rounded up to
    /// a power of two under UE8M0 rounding); with [`TokenScale::Static`], the given scale; then
    /// `q = e4m3(x / scale)` saturating, a non-finite element the e4m3 NaN of its sign and reported through
    /// `status`: the rules of the 128-column quantiser ([`super::quantize_rows`]) with one group of all `K`
    /// columns, bit for bit those of the host's [`GroupQuant::scale`] and [`super::quantize_element`] per row.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `x` has another `K` or more rows than these, or a static scale holds no value;
    /// [`Error::InvalidProblem`] for an `eps` the kernel cannot take; launch errors.
    pub fn quantize<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        x: &MatrixView<'_, T>,
        scale: &TokenScale<'_>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        self.quantize_same_rows(stream, x, None, scale, status)
    }

    /// As [`Self::quantize`], each token row of `x [tokens, K]` written at each of its `top_k` positions in
    /// `layout` (built for these tokens): the permuted A operand of the rowwise GEMM, produced directly in e4m3.
    /// These rows number at least the layout's capacity; dropped slots and padding rows are left as they were.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `tokens > max_tokens`; [`Error::Buffer`] for another `K` or fewer rows than
    /// the capacity; launch errors. Non-finite inputs and positions past these rows are reported through
    /// `status`.
    pub fn quantize_gather<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: &ExpertLayout,
        x: &MatrixView<'_, T>,
        scale: &TokenScale<'_>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let dims = super::device::check_tokens(layout, x)?;
        if x.cols() != self.k || self.rows < dims.capacity() {
            return Err(Error::Buffer {
                name: "FP8 token rows",
                detail: format!(
                    "[{}, {}] for {} [{}, {}] gathered into a layout of capacity {}: K must match and the capacity fit",
                    self.rows,
                    self.k,
                    x.name(),
                    x.rows(),
                    x.cols(),
                    dims.capacity()
                ),
            });
        }
        let view = x.as_view();
        let src = ffi::QuantSrc { x: &view, rows: x.rows(), stride: x.stride() };
        let desc = self.desc(scale);
        let dst = self.dst(scale)?;
        ffi::launch_quantize_gather(stream, &desc, &src, dims.top_k(), layout.positions(), dst, status.word_mut())
    }

    /// As [`Self::quantize`] for the rows in use of `h [rows, K]` (the activation output, indexed by position),
    /// each into the same row of these; other rows are left as they were (the activation kernel's rule: an expert
    /// in range and a position before the layout's total).
    ///
    /// # Errors
    /// [`Error::Buffer`] for another `K`, more rows in `h` than here, or too few in `rows.row_experts`; launch
    /// errors.
    pub fn requantize<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        h: &MatrixView<'_, T>,
        rows: &RowsInUse<'_>,
        scale: &TokenScale<'_>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let mask = ffi::RowMask { row_experts: &rows.row_experts, experts: rows.experts, total: rows.total };
        self.quantize_same_rows(stream, h, Some(&mask), scale, status)
    }

    /// Quantises the rows of `x` (those `mask` keeps) into the same rows of these.
    fn quantize_same_rows<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        x: &MatrixView<'_, T>,
        mask: Option<&ffi::RowMask<'_>>,
        scale: &TokenScale<'_>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        self.check_fits(x)?;
        let view = x.as_view();
        let src = ffi::QuantSrc { x: &view, rows: x.rows(), stride: x.stride() };
        let desc = self.desc(scale);
        let dst = self.dst(scale)?;
        ffi::launch_quantize_rows(stream, &desc, &src, mask, dst, status.word_mut())
    }

    /// That `x` has these rows' `K` and no more rows than they.
    fn check_fits<T>(&self, x: &MatrixView<'_, T>) -> Result<()> {
        if x.cols() != self.k || x.rows() > self.rows {
            return Err(Error::Buffer {
                name: x.name(),
                detail: format!(
                    "is [{}, {}]; the FP8 token rows are [{}, {}]: K must match and the rows fit",
                    x.rows(),
                    x.cols(),
                    self.rows,
                    self.k
                ),
            });
        }
        Ok(())
    }

    /// The destination of a quantisation under `scale`: these rows, and the amax word for a per-tensor scale.
    fn dst(&mut self, scale: &TokenScale<'_>) -> Result<ffi::QuantDst<'_>> {
        let amax = match scale {
            TokenScale::DynamicTensor(_) => Some(self.amax.as_mut().ok_or_else(|| Error::Buffer {
                name: "FP8 token rows",
                detail: "hold no amax word for a dynamic per-tensor scale (Fp8TokenRows::zeros allocates one)".into(),
            })?),
            _ => None,
        };
        Ok(ffi::QuantDst { data: &mut self.q, scales: &mut self.scales, rows: self.rows, amax })
    }

    fn desc<'s>(&self, scale: &TokenScale<'s>) -> ffi::QuantDesc<'s> {
        let (opts, static_scale) = match *scale {
            TokenScale::Dynamic(opts) => (opts, None),
            // The eps and rounding are not read: the kernel takes the scale as given.
            TokenScale::Static(s) => (GroupQuant::DEEPSEEK, Some(s)),
            TokenScale::DynamicTensor(opts) => (opts, None),
        };
        ffi::QuantDesc {
            k: self.k,
            eps: opts.eps(),
            ue8m0: opts.rounding() == ScaleRounding::Ue8m0Ceil,
            per_row: true,
            static_scale,
        }
    }
}

/// Expert weights with one f32 scale per output channel on the device: e4m3 `[G, N, K]` (nn.Linear
/// `[out, in]` per expert) and f32 `[G, N]`, one value. A per-tensor checkpoint (one scale per expert, e.g.
/// `weight_scale` of shape `[]`) holds its scale in each of its channels.
#[derive(Debug)]
pub struct Fp8ChannelWeights {
    q: CudaSlice<F8E4M3>,
    scales: CudaSlice<f32>,
    experts: usize,
    n: usize,
    k: usize,
}

impl Fp8ChannelWeights {
    /// Wraps device buffers of `experts` weights `[n, k]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the count that differs (`G·N·K` elements, `G·N` scales) or a zero extent.
    pub fn new(q: CudaSlice<F8E4M3>, scales: CudaSlice<f32>, experts: usize, n: usize, k: usize) -> Result<Self> {
        if experts == 0 || n == 0 || k == 0 {
            return Err(Error::InvalidProblem(format!(
                "FP8 channel weights [G, N, K] = [{experts}, {n}, {k}]: every extent must be positive"
            )));
        }
        let nq = product("FP8 weights [G, N, K] =", &[experts, n, k])?;
        check_len("e4m3 elements", q.len(), nq, format!("FP8 weights [G, N, K] = [{experts}, {n}, {k}]"))?;
        check_len("scales", scales.len(), experts * n, format!("[G, N] = [{experts}, {n}] (one per channel)"))?;
        Ok(Fp8ChannelWeights { q, scales, experts, n, k })
    }

    /// Uploads host experts, each `[N, K]` quantised per output channel (`1 x K` blocks) or per tensor, with
    /// F32 scales, stacked in order.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts, experts of different shapes, another block shape or scale
    /// format, a non-finite or negative scale (the expert and row named); driver errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, experts: &[BlockFp8]) -> Result<Self> {
        let first = experts.first().ok_or_else(|| Error::InvalidProblem("FP8 weights of 0 experts".into()))?;
        let (n, k) = (first.rows(), first.cols());
        let lengths = (product("FP8 weights [G, N, K] =", &[experts.len(), n, k])?, experts.len() * n);
        let (q, s) = stack_fp8(experts, lengths, |e, what, s| {
            s.extend(row_scales(e, what)?);
            Ok(())
        })?;
        Self::new(stream.clone_htod(&q)?, stream.clone_htod(&s)?, experts.len(), n, k)
    }

    getters!(experts: usize, n: usize, k: usize);
    pub fn q(&self) -> CudaView<'_, F8E4M3> {
        self.q.as_view()
    }
    pub fn scales(&self) -> CudaView<'_, f32> {
        self.scales.as_view()
    }
    /// Device bytes held: e4m3 data and f32 scales.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len()
    }
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.q.context().ordinal()
    }
}

/// `m` with one scale per row (`1 x K` blocks, F32): a per-row matrix as it is, a per-tensor one with its scale in
/// every row. The values and what they dequantise to are unchanged.
///
/// # Errors
/// [`Error::InvalidProblem`] as the rowwise GEMM's operands: blocks that are neither whole rows nor the whole
/// matrix, scales other than F32, a non-finite or negative scale; `what` names the matrix.
pub fn to_per_row(m: &BlockFp8, what: &str) -> Result<BlockFp8> {
    let s = row_scales(m, what)?;
    BlockFp8::from_parts(m.rows(), m.cols(), per_row_block(m.cols()), m.q().to_vec(), Scales::F32(s))
}

/// The scale block of a per-token (per-channel) quantisation of `[rows, k]`: one row, all of K.
pub fn per_row_block(k: usize) -> BlockShape {
    BlockShape { rows: 1, cols: k }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ScaleFormat;

    fn m(rows: usize, cols: usize, block: BlockShape) -> BlockFp8 {
        let w: Vec<f32> =
            (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * (1.0 + (i / cols) as f32)).collect();
        BlockFp8::quantize(&w, rows, cols, block, ScaleFormat::F32).unwrap()
    }

    #[test]
    fn row_scales_take_per_row_and_per_tensor_blocks_only() {
        let per_row = m(3, 32, per_row_block(32));
        let s = row_scales(&per_row, "x").unwrap();
        assert_eq!(s.len(), 3);
        assert!(s[0] < s[1] && s[1] < s[2], "rows of growing magnitude get growing scales: {s:?}");
        let per_tensor = m(3, 32, BlockShape { rows: 3, cols: 32 });
        let s = row_scales(&per_tensor, "x").unwrap();
        assert!(s.iter().all(|&v| v == s[0]) && s.len() == 3);
        let e = row_scales(&m(4, 256, BlockShape::DEEPSEEK), "FP8 expert 2").unwrap_err().to_string();
        assert!(e.contains("FP8 expert 2") && e.contains("128 x 128") && e.contains("one scale per row"), "{e}");
        let e = row_scales(&m(4, 256, BlockShape::PER_TOKEN_128), "x").unwrap_err().to_string();
        assert!(e.contains("1 x 128"), "{e}");
        let ue = BlockFp8::quantize(&[1.0; 64], 2, 32, per_row_block(32), ScaleFormat::Ue8m0).unwrap();
        assert!(row_scales(&ue, "x").unwrap_err().to_string().contains("takes F32"));
    }
}
