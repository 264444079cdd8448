//! MXFP8 activations on the device for the SM100 block-scaled grouped GEMMs: e4m3 rows and their UE8M0 scales
//! in CUTLASS's 128 x 4 atom layout, one layout per group at a base the device computes from the group rows
//! (`cpp/mx/mx_quant.h`), so the step needs no host copy of the counts. The same bytes as [`super::mx::Mxfp8`]
//! per group laid out by [`super::mx::to_sf_atoms_grouped`] (tested bit for bit on the H200, where the kernel
//! runs too).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::{for_each_expert, rows_cols, F8E4M3};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi;
use crate::layouts::GroupRows;
use crate::status::DeviceStatus;
use crate::view::MatrixView;

/// A grouped A in MXFP8 on the device: e4m3 `[max_rows, K]`, the scale atoms of up to `groups` groups (the worst
/// case: every group padded to 128 rows) and each group's byte base `[groups + 1]` (the last: the bytes in use).
#[derive(Debug)]
pub struct Mxfp8Rows {
    buf: GroupedRows<F8E4M3>,
}

impl Mxfp8Rows {
    /// Zeroed buffers for `groups` groups over `max_rows` rows of `k`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k` not a positive multiple of 32, no groups, sizes that overflow; driver
    /// errors of the allocations.
    pub fn alloc(stream: &Arc<CudaStream>, max_rows: usize, k: usize, groups: usize) -> Result<Mxfp8Rows> {
        Ok(Mxfp8Rows { buf: GroupedRows::alloc("MXFP8", stream, max_rows, k, groups, ffi::mx_quant::MX_VEC, 1)? })
    }

    /// Device bytes [`Self::alloc`] takes for these extents (`None` where they overflow): the elements, the
    /// worst-case scale atoms and the bases.
    pub fn bytes_for(max_rows: usize, k: usize, groups: usize) -> Option<usize> {
        let sf = ffi::mx_quant::sf_capacity(max_rows, k / ffi::mx_quant::MX_VEC, groups)?;
        max_rows.checked_mul(k)?.checked_add(sf)?.checked_add(8 * (groups + 1))
    }

    /// Re-targets the buffers at `max_rows` rows of `k` over `groups` groups (no allocation), as a scratch
    /// shared by layers of different sizes needs.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming what does not fit: the elements, the worst-case scale atoms or the bases;
    /// `k` not a positive multiple of 32 or no groups.
    pub fn reshape(&mut self, max_rows: usize, k: usize, groups: usize) -> Result<()> {
        if k == 0 || k % ffi::mx_quant::MX_VEC != 0 || groups == 0 {
            return Err(Error::InvalidProblem(format!(
                "MXFP8 rows: K = {k} must be a positive multiple of 32 and groups = {groups} positive"
            )));
        }
        let sf = ffi::mx_quant::sf_capacity(max_rows, k / ffi::mx_quant::MX_VEC, groups);
        let fits = [
            ("elements", max_rows.checked_mul(k), self.buf.q.len()),
            ("scale atoms", sf, self.buf.sf.len()),
            ("group bases", Some(groups + 1), self.buf.sf_bases.len()),
        ];
        for (what, need, have) in fits {
            if need.is_none_or(|n| n > have) {
                return Err(Error::InvalidProblem(format!(
                    "scratch capacity: MXFP8 rows [{max_rows}, {k}] over {groups} groups need {} {what}, the buffer holds                      {have}",
                    need.map_or("more than usize".into(), |n| n.to_string())
                )));
            }
        }
        (self.buf.max_rows, self.buf.k, self.buf.groups) = (max_rows, k, groups);
        Ok(())
    }

    grouped_rows_accessors!(F8E4M3);
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }
}

/// Grouped rows `[max_rows, k]` of a block-scaled format on the device: the codes (`per_byte` to a stored
/// element), the scale atoms of up to `groups` groups (the worst case: every group padded to 128 rows) and each
/// group's byte base `[groups + 1]` (the last: the bytes in use).
#[derive(Debug)]
pub(super) struct GroupedRows<Q> {
    pub(super) q: CudaSlice<Q>,
    pub(super) sf: CudaSlice<u8>,
    pub(super) sf_bases: CudaSlice<i64>,
    pub(super) max_rows: usize,
    pub(super) k: usize,
    pub(super) groups: usize,
}

impl<Q: DeviceRepr + ValidAsZeroBits> GroupedRows<Q> {
    /// Zeroed buffers of `what` (`"MXFP8"`), one scale per `vec` of K, `per_byte` codes to a stored element.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc(
        what: &str,
        stream: &Arc<CudaStream>,
        max_rows: usize,
        k: usize,
        groups: usize,
        vec: usize,
        per_byte: usize,
    ) -> Result<Self> {
        if k == 0 || k % vec != 0 || groups == 0 {
            return Err(Error::InvalidProblem(format!(
                "{what} rows: K = {k} must be a positive multiple of {vec} (one scale per {vec}) and groups = \
                 {groups} positive"
            )));
        }
        let overflow = || Error::InvalidProblem(format!("{what} rows [{max_rows}, {k}] x {groups} groups overflow"));
        let sf_bytes = ffi::mx_quant::sf_capacity(max_rows, k / vec, groups).ok_or_else(overflow)?;
        let n = max_rows.checked_mul(k / per_byte).ok_or_else(overflow)?;
        let (q, sf, sf_bases) =
            (stream.alloc_zeros(n)?, stream.alloc_zeros(sf_bytes)?, stream.alloc_zeros(groups + 1)?);
        Ok(GroupedRows { q, sf, sf_bases, max_rows, k, groups })
    }

    /// Device bytes held (the codes are bytes).
    pub(super) fn bytes(&self) -> usize {
        self.q.len() + self.sf.len() + 8 * self.sf_bases.len()
    }

    /// That `x` fits these rows, as `what`: all their rows, at most `k` columns (the rest is the zero pad).
    pub(super) fn check_x<T>(&self, what: &str, x: &MatrixView<'_, T>) -> Result<()> {
        check_grouped_x(what, x, self.max_rows, self.k)
    }
}

/// That `x` fits grouped rows `[max_rows, k]` of `what` (`"MXFP8"`): all their rows, at most `k` columns (the
/// rest is the zero pad).
fn check_grouped_x<T>(what: &str, x: &MatrixView<'_, T>, max_rows: usize, k: usize) -> Result<()> {
    if x.rows() != max_rows || x.cols() > k {
        return Err(Error::InvalidProblem(format!(
            "{what} quantisation: x [{}, {}] for rows of [{max_rows}, {k}] (x's columns at most K: the rest is the \
             zero pad)",
            x.rows(),
            x.cols(),
        )));
    }
    Ok(())
}

/// Quantises the rows of `x [max_rows, K_x]` that `rows` places in a group into `out` (MXFP8, per group in the
/// SM100 scale layout), and writes each group's base. Rows in no group are left as they were. `K_x` may be
/// less than `out.k()` (a multiple of 32): the columns past it are the zero pad of a K padded for the SM100
/// GEMMs (gpt-oss's 2880 as 2944), written as an all-zero block is (codes 0, scale 2^0) — the host's
/// quantisation of the zero-padded rows, bit for bit.
///
/// # Errors
/// [`Error::InvalidProblem`] when `x` does not have `out.max_rows()` rows, has more columns than `out.k()` or
/// a number not a multiple of 32, or `rows` is per-row groups or of
/// another group count; [`Error::Buffer`] for short group arrays; launch errors. On the device: non-finite
/// elements (`NONFINITE_INPUT`), bad offsets or counts (as the grouped GEMMs), and a layout past the scale
/// buffer (`CAPACITY_OVERFLOW`, which the worst-case sizing of [`Mxfp8Rows::alloc`] never reaches).
pub fn quantize_mxfp8_grouped<'r, T: Element>(
    stream: &Arc<CudaStream>,
    x: &MatrixView<'_, T>,
    rows: impl Into<GroupRows<'r>>,
    out: &mut Mxfp8Rows,
    status: &mut DeviceStatus,
) -> Result<()> {
    let out = &mut out.buf;
    out.check_x("MXFP8", x)?;
    let rows = rows.into();
    let view = x.as_view();
    let dst = ffi::mx_quant::MxDst { out: &mut out.q, sf: &mut out.sf, sf_bases: &mut out.sf_bases };
    ffi::mx_quant::launch_quantize_mxfp8(
        stream,
        &view,
        (x.stride(), x.cols()),
        out.max_rows,
        out.k,
        out.groups,
        rows.to_ffi(),
        dst,
        status.word_mut(),
    )
}

/// MXFP8 expert weights on the device for the SM100 block-scaled GEMMs: e4m3 `[G, N, K]` (nn.Linear `[out, in]`
/// per expert) and each expert's UE8M0 scales `[N, K / 32]` in CUTLASS's 128 x 4 atoms, expert `g`'s at
/// `g · 512 · ceil(N / 128) · ceil(K / 128)`, one value.
#[derive(Debug)]
pub struct Mxfp8Weights {
    q: CudaSlice<F8E4M3>,
    sf: CudaSlice<u8>,
    experts: usize,
    n: usize,
    k: usize,
}

impl Mxfp8Weights {
    /// Uploads host experts ([`super::mx::Mxfp8`], each `[N, K]`), laying their scales out in atoms.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts or experts of different shapes (the expert named); driver
    /// errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, experts: &[super::mx::Mxfp8]) -> Result<Mxfp8Weights> {
        let shape = |e: &super::mx::Mxfp8| rows_cols(e.rows(), e.k());
        let (mut q, mut sf) = (Vec::new(), Vec::new());
        let first = for_each_expert("MXFP8", "one shape", experts, shape, |_, e| {
            q.extend_from_slice(e.data());
            let atoms = e.sf_atoms();
            debug_assert_eq!(atoms.len(), ffi::mx_quant::expert_sf_bytes(e.rows(), e.k(), ffi::mx_quant::MX_VEC));
            sf.extend(atoms);
            Ok(())
        })?;
        let (n, k) = (first.rows(), first.k());
        Ok(Mxfp8Weights { q: stream.clone_htod(&q)?, sf: stream.clone_htod(&sf)?, experts: experts.len(), n, k })
    }

    getters!(experts: usize, n: usize, k: usize);
    pub fn q(&self) -> &CudaSlice<F8E4M3> {
        &self.q
    }
    pub fn sf(&self) -> &CudaSlice<u8> {
        &self.sf
    }
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.q.len() + self.sf.len()
    }
}

/// MXFP4 expert weights on the device (gpt-oss's format) for the SM100 MXFP8 x MXFP4 grouped GEMM: e2m1 `[G, N,
/// K]` packed two per byte (low nibble first: `[G, N, K / 2]` bytes) and each expert's UE8M0 scales `[N, K / 32]`
/// in CUTLASS's 128 x 4 atoms, as [`Mxfp8Weights`]. `K` is the stored width ([`super::mx::Mxfp4::k_padded`]):
/// the K the GEMM runs, with [`Self::logical_k`] the model's (gpt-oss: 2944 and 2880).
#[derive(Debug)]
pub struct Mxfp4Weights {
    q: CudaSlice<u8>,
    sf: CudaSlice<u8>,
    experts: usize,
    n: usize,
    k: usize,
    logical_k: usize,
}

impl Mxfp4Weights {
    /// Uploads host experts ([`super::mx::Mxfp4`], each `[N, K]` stored `[N, K padded]`), laying their scales
    /// out in atoms.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for no experts or experts of different shapes or padding (the expert named);
    /// driver errors of the copies.
    pub fn from_host(stream: &Arc<CudaStream>, experts: &[super::mx::Mxfp4]) -> Result<Mxfp4Weights> {
        let shape = |e: &super::mx::Mxfp4| {
            let (n, k, logical_k) = (e.rows(), e.k_padded(), e.k());
            ((n, k, logical_k), format!("[{n}, {logical_k}] stored [{n}, {k}]"))
        };
        let (mut q, mut sf) = (Vec::new(), Vec::new());
        let first = for_each_expert("MXFP4", "one shape and padding", experts, shape, |_, e| {
            q.extend_from_slice(e.data());
            sf.extend(e.sf_atoms());
            Ok(())
        })?;
        let (n, k, logical_k) = (first.rows(), first.k_padded(), first.k());
        let (q, sf) = (stream.clone_htod(&q)?, stream.clone_htod(&sf)?);
        Ok(Mxfp4Weights { q, sf, experts: experts.len(), n, k, logical_k })
    }

    getters!(
        experts: usize,
        n: usize,
        /// The stored (GEMM) K.
        k: usize,
    );
    /// The model's K: columns past it are the zero pad.
    pub fn logical_k(&self) -> usize {
        self.logical_k
    }
    /// The packed e2m1 bytes, `[G, N, K / 2]`.
    pub fn q(&self) -> &CudaSlice<u8> {
        &self.q
    }
    pub fn sf(&self) -> &CudaSlice<u8> {
        &self.sf
    }
    pub fn bytes(&self) -> usize {
        self.q.len() + self.sf.len()
    }
}
