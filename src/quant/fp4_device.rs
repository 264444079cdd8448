//! FP4 activations and NVFP4 weights on the device for the SM100 4-bit block-scaled grouped GEMMs: e2m1 rows
//! packed two per byte (the even element in the low nibble) and their scales in CUTLASS's 128 x 4 atom layout,
//! one layout per group at a base the device computes from the group rows (`cpp/mx/mx_quant.h`), as
//! [`super::Mxfp8Rows`] does for MXFP8.
//!
//! * [`Mxfp4Rows`]: UE8M0 per 32 of K, bit for bit [`super::mx::Mxfp4::quantize`] of each group's rows;
//! * [`Nvfp4Rows`]: UE4M3 per 16 of K times one f32 tensor scale, bit for bit
//!   [`super::mx::Nvfp4::quantize`] of all grouped rows together ([`NvTensorScale::FromAmax`]: the tensor scale
//!   derived on the device by [`super::mx::nvfp4_tensor_scale`]) or
//!   [`super::mx::Nvfp4::quantize_with_tensor_scale`] ([`NvTensorScale::Given`]).
//!
//! Both kernels are portable (they run on SM90 too); `tests/gpu/mx_quant.rs` compares them with the host bit for
//! bit.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::mx_device::GroupedRows;
use super::{for_each_expert, rows_cols};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi;
use crate::ffi::mx_quant::Fp4Format;
use crate::layouts::GroupRows;
use crate::status::DeviceStatus;
use crate::view::MatrixView;

/// A grouped FP4 A's buffers: packed e2m1 `[max_rows, K / 2]`, the scale atoms and the groups' bases.
impl GroupedRows<u8> {
    /// Quantises the grouped rows of `x` into these buffers as `format`; `tensor` is NVFP4's tensor scale word
    /// (`t`: the given scale, 0 to derive it).
    #[allow(clippy::too_many_arguments)]
    fn quantize<T: Element>(
        &mut self,
        stream: &Arc<CudaStream>,
        format: Fp4Format,
        x: &MatrixView<'_, T>,
        rows: GroupRows<'_>,
        t: f32,
        tensor: Option<&mut CudaSlice<f32>>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        let view = x.as_view();
        let dst = ffi::mx_quant::Fp4Dst { out: &mut self.q, sf: &mut self.sf, sf_bases: &mut self.sf_bases, tensor };
        let shape = (self.max_rows, self.k, self.groups);
        ffi::mx_quant::launch_quantize_fp4(
            stream,
            format,
            &view,
            (x.stride(), x.cols()),
            shape,
            rows.to_ffi(),
            t,
            dst,
            status.word_mut(),
        )
    }
}

/// A grouped A in MXFP4 on the device: e2m1 `[max_rows, K]` packed two per byte, UE8M0 per 32 of K, per group
/// in the SM100 scale layout.
#[derive(Debug)]
pub struct Mxfp4Rows {
    buf: GroupedRows<u8>,
}

impl Mxfp4Rows {
    /// Zeroed buffers for `groups` groups over `max_rows` rows of `k`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k` not a positive multiple of 32, no groups, sizes that overflow; driver
    /// errors of the allocations.
    pub fn alloc(stream: &Arc<CudaStream>, max_rows: usize, k: usize, groups: usize) -> Result<Mxfp4Rows> {
        Ok(Mxfp4Rows { buf: GroupedRows::alloc("MXFP4", stream, max_rows, k, groups, ffi::mx_quant::MX_VEC, 2)? })
    }
    grouped_rows_accessors!(u8,
        /// Packed e2m1 `[max_rows, K / 2]` bytes, the even element in the low nibble.
    );
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }
}

/// A grouped A in NVFP4 on the device: e2m1 `[max_rows, K]` packed two per byte, UE4M3 per 16 of K, per group
/// in the SM100 scale layout, and the f32 tensor scale the quantiser used (on the device: the NVFP4 GEMM
/// multiplies it into each group's alpha).
#[derive(Debug)]
pub struct Nvfp4Rows {
    buf: GroupedRows<u8>,
    /// `[tensor scale, amax scratch]`.
    tensor: CudaSlice<f32>,
}

impl Nvfp4Rows {
    /// Zeroed buffers for `groups` groups over `max_rows` rows of `k`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k` not a positive multiple of 16, no groups, sizes that overflow; driver
    /// errors of the allocations.
    pub fn alloc(stream: &Arc<CudaStream>, max_rows: usize, k: usize, groups: usize) -> Result<Nvfp4Rows> {
        let buf = GroupedRows::alloc("NVFP4", stream, max_rows, k, groups, ffi::mx_quant::NV_VEC, 2)?;
        Ok(Nvfp4Rows { buf, tensor: stream.alloc_zeros(2)? })
    }
    grouped_rows_accessors!(u8,
        /// Packed e2m1 `[max_rows, K / 2]` bytes, the even element in the low nibble.
    );
    /// `[2]`: element 0 is the tensor scale of the last quantisation (element 1 the kernels' scratch).
    pub fn tensor_scale(&self) -> &CudaSlice<f32> {
        &self.tensor
    }
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.buf.bytes() + 4 * self.tensor.len()
    }
}

/// Where the NVFP4 activations' tensor scale comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NvTensorScale {
    /// The caller's (a calibrated activation scale): finite and positive. A block that would need a UE4M3 scale
    /// above 448 under it saturates and sets [`crate::status::bits::SCALE_OVERFLOW`].
    Given(f32),
    /// Derived on the device from the largest finite magnitude of all grouped rows, by
    /// [`super::mx::nvfp4_tensor_scale`] (the host quantiser's rule).
    FromAmax,
}

/// Quantises the rows of `x [max_rows, K_x]` that `rows` places in a group into `out` (MXFP4, per group in the
/// SM100 scale layout), and writes each group's base. Rows in no group are left as they were. `K_x <= out.k()`
/// as for [`super::quantize_mxfp8_grouped`]: the columns past x's are the zero pad (codes 0, scale 2^0), as
/// [`super::mx::Mxfp4::quantize_padded`] writes them.
///
/// # Errors
/// As [`super::quantize_mxfp8_grouped`]: [`Error::InvalidProblem`] when `x` does not have `out.max_rows()`
/// rows, has more columns than `out.k()` or a number not a multiple of 32, or `rows` is per-row groups or of
/// another group count; [`Error::Buffer`] for short group arrays; launch
/// errors. On the device: non-finite elements (`NONFINITE_INPUT`; NaN becomes +6, ±inf ±6), bad offsets or
/// counts, a layout past the scale buffer (`CAPACITY_OVERFLOW`).
pub fn quantize_mxfp4_grouped<'r, T: Element>(
    stream: &Arc<CudaStream>,
    x: &MatrixView<'_, T>,
    rows: impl Into<GroupRows<'r>>,
    out: &mut Mxfp4Rows,
    status: &mut DeviceStatus,
) -> Result<()> {
    out.buf.check_x("MXFP4", x)?;
    out.buf.quantize(stream, Fp4Format::Mxfp4, x, rows.into(), 0.0, None, status)
}

/// Quantises the rows of `x [max_rows, K_x]` that `rows` places in a group into `out` (NVFP4, per group in the
/// SM100 scale layout, one tensor scale for all of them: `scale`), and writes each group's base and the tensor
/// scale. Rows in no group are left as they were. `K_x <= out.k()`, a multiple of 16: the pad's blocks are
/// all-zero blocks (codes 0, UE4M3 1.0) and take no part in a derived tensor scale.
///
/// # Errors
/// As [`quantize_mxfp4_grouped`]; [`Error::InvalidProblem`] for a given tensor scale that is not finite and
/// positive. On the device also `SCALE_OVERFLOW` (a given tensor scale too small for a block).
pub fn quantize_nvfp4_grouped<'r, T: Element>(
    stream: &Arc<CudaStream>,
    x: &MatrixView<'_, T>,
    rows: impl Into<GroupRows<'r>>,
    scale: NvTensorScale,
    out: &mut Nvfp4Rows,
    status: &mut DeviceStatus,
) -> Result<()> {
    out.buf.check_x("NVFP4", x)?;
    let t = match scale {
        NvTensorScale::Given(t) if t.is_finite() && t > 0.0 => t,
        NvTensorScale::Given(t) => {
            return Err(Error::InvalidProblem(format!("NVFP4 tensor scale {t}: must be finite and positive")))
        }
        NvTensorScale::FromAmax => 0.0,
    };
    out.buf.quantize(stream, Fp4Format::Nvfp4, x, rows.into(), t, Some(&mut out.tensor), status)
}

/// NVFP4 expert weights on the device for the SM100 NVFP4 grouped GEMM: e2m1 `[G, N, K]` packed two per byte
/// (`[G, N, K / 2]` bytes), each expert's UE4M3 scales `[N, K / 16]` in CUTLASS's 128 x 4 atoms (expert `g`'s at
/// `g · 512 · ceil(N / 128) · ceil(K / 64)`), and each expert's f32 tensor scale `[G]`.
#[derive(Debug)]
pub struct Nvfp4Weights {
    q: CudaSlice<u8>,
    sf: CudaSlice<u8>,
    tensor_scales: CudaSlice<f32>,
    experts: usize,
    n: usize,
    k: usize,
}

impl Nvfp4Weights {
    /// Uploads host experts ([`super::mx::Nvfp4`], each `[N, K]` with its own tensor scale), laying their scales
    /// out in atoms.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts or experts of different shapes (the expert named); driver
    /// errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, experts: &[super::mx::Nvfp4]) -> Result<Nvfp4Weights> {
        let (mut q, mut sf, mut ts) = (Vec::new(), Vec::new(), Vec::new());
        let first = for_each_expert(
            "NVFP4",
            "one shape",
            experts,
            |e| rows_cols(e.rows(), e.k()),
            |_, e| {
                q.extend_from_slice(e.data());
                sf.extend(e.sf_atoms());
                ts.push(e.tensor_scale());
                Ok(())
            },
        )?;
        let (n, k) = (first.rows(), first.k());
        Ok(Nvfp4Weights {
            q: stream.clone_htod(&q)?,
            sf: stream.clone_htod(&sf)?,
            tensor_scales: stream.clone_htod(&ts)?,
            experts: experts.len(),
            n,
            k,
        })
    }

    getters!(experts: usize, n: usize, k: usize);
    /// The packed e2m1 bytes, `[G, N, K / 2]`.
    pub fn q(&self) -> &CudaSlice<u8> {
        &self.q
    }
    pub fn sf(&self) -> &CudaSlice<u8> {
        &self.sf
    }
    /// `[G]`.
    pub fn tensor_scales(&self) -> &CudaSlice<f32> {
        &self.tensor_scales
    }
    pub fn bytes(&self) -> usize {
        self.q.len() + self.sf.len() + 4 * self.tensor_scales.len()
    }
}
