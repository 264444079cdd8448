//! MXFP8, MXFP4 and NVFP4 activations in the SM100 block-scale layout (`cpp/mx/mx_quant.cu`, contract in
//! `cpp/mx/mx_quant.h`): 16-bit rows of a grouped A to e4m3 (or e2m1 two per byte) plus one scale byte per row per
//! 32 (16 for NVFP4) of K, each group's bytes in CUTLASS's 128 x 4 atoms at a base the device computes from the
//! group rows.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use float8::F8E4M3;

use super::bridge::ffi;
use super::gemm::{group_rows, GroupGuards, GroupedRows};
use super::status::{check, Launched};
use super::sys;
use super::{dtype, need_aligned, need_len, to_i32, to_i64};
use crate::dtype::Element;
use crate::error::{Error, Result};

pub(crate) use sys::Fp4Format;

/// Elements per UE8M0 scale (MX), per UE4M3 scale (NVFP4), and bytes of one 128 x 4 scale atom.
pub(crate) const MX_VEC: usize = 32;
pub(crate) const NV_VEC: usize = 16;
pub(crate) const SF_ATOM_BYTES: usize = 512;

/// Bytes of one expert's scale atoms, one scale per `vec` of K: `512 · ceil(n / 128) · ceil(k / (4 vec))`.
pub(crate) fn expert_sf_bytes(n: usize, k: usize, vec: usize) -> usize {
    512 * n.div_ceil(128) * k.div_ceil(4 * vec)
}

/// Bytes of scale atoms `groups` groups over at most `max_rows` rows of `k_blocks` scales each need at most:
/// every group pads its rows to 128, so `512 · ceil(k_blocks / 4) · (ceil(max_rows / 128) + groups)`.
pub(crate) fn sf_capacity(max_rows: usize, k_blocks: usize, groups: usize) -> Option<usize> {
    let k_atoms = k_blocks.div_ceil(4);
    max_rows.div_ceil(128).checked_add(groups)?.checked_mul(k_atoms)?.checked_mul(SF_ATOM_BYTES)
}

/// The destination of one launch.
pub(crate) struct MxDst<'a> {
    pub out: &'a mut CudaSlice<F8E4M3>,
    pub sf: &'a mut CudaSlice<u8>,
    pub sf_bases: &'a mut CudaSlice<i64>,
}

/// The columns `x_cols` of x that a quantiser into rows of `k` reads: a positive multiple of `vec` and at most
/// `k` (the rest is the zero pad of a padded K), within the row stride.
fn check_x_cols(name: &str, x_cols: usize, x_stride: usize, k: usize, vec: usize) -> Result<()> {
    if x_cols == 0 || x_cols > k || x_cols % vec != 0 || x_stride < x_cols {
        return Err(Error::InvalidProblem(format!(
            "{name} quantisation: x's {x_cols} columns must be a positive multiple of {vec}, at most K = {k} (the \
             columns past them are the zero pad of a padded K) and within the row stride {x_stride}"
        )));
    }
    Ok(())
}

/// K a positive multiple of `vec` (`per` says what one scale covers), `groups` positive, and x's columns.
fn check_k(name: &str, (k, vec, per): (usize, usize, &str), groups: usize, x: (usize, usize)) -> Result<()> {
    if k == 0 || k % vec != 0 || groups == 0 {
        return Err(Error::InvalidProblem(format!(
            "{name} quantisation: K = {k} must be a positive multiple of {vec} ({per}), groups = {groups} positive"
        )));
    }
    check_x_cols(name, x.1, x.0, k, vec)
}

/// A launch's arguments as both quantisers fill them, with the guards that keep its buffers bound to the stream
/// until the C++ call has returned.
struct Bound<'s> {
    args: sys::MxQuantArgs,
    _guards: ([SyncOnDrop<'s>; 5], GroupGuards<'s>),
}

/// What both quantisers check, convert and bind alike once K and x's columns passed: the group rows, the lengths
/// of x, out (`out_len` elements) and sf_bases, then the device addresses (see `check_aligned`).
#[allow(clippy::too_many_arguments)]
fn bind_mx<'s, T: Element, O>(
    stream: &'s CudaStream,
    x: &'s impl DevicePtr<T>,
    (x_stride, x_cols): (usize, usize),
    (max_rows, k, groups): (usize, usize, usize),
    rows: GroupedRows<'s>,
    (out, out_len, out_what): (&'s mut CudaSlice<O>, usize, &str),
    (sf, sf_bases): (&'s mut CudaSlice<u8>, &'s mut CudaSlice<i64>),
    status: &'s mut impl DevicePtrMut<u32>,
) -> Result<Bound<'s>> {
    let group = group_rows(rows, groups, max_rows)?;
    if max_rows > 0 {
        need_len("x", x.len(), (max_rows - 1) * x_stride + x_cols, "(max_rows - 1) x stride + x's columns")?;
    }
    need_len("out", out.len(), out_len, out_what)?;
    need_len("sf_bases", sf_bases.len(), groups + 1, "groups + 1")?;
    let sf_bytes = sf.len() as u64;
    let (groups_i, max_m, k_i) = (to_i32("groups", groups)?, to_i32("max_m", group.max_m)?, to_i32("K", k)?);
    let (max_rows_i, stride, k_in) = (to_i64("max_rows", max_rows)?, to_i64("row stride", x_stride)?, x_cols as i32);
    let mode = group.mode;
    super::bind(stream)?;
    let (x_ptr, gx) = x.device_ptr(stream);
    let ((o_ptr, c_ptr), group_guards) = group.device_ptrs(stream);
    let (out_ptr, gout) = out.device_ptr_mut(stream);
    let (sf_ptr, gsf) = sf.device_ptr_mut(stream);
    let (b_ptr, gb) = sf_bases.device_ptr_mut(stream);
    let (s_ptr, gs) = status.device_ptr_mut(stream);
    let args = sys::MxQuantArgs {
        dtype: dtype(T::DTYPE),
        mode,
        groups: groups_i,
        max_m,
        k: k_i,
        k_in,
        max_rows: max_rows_i,
        x_stride: stride,
        x: x_ptr,
        offsets: o_ptr,
        counts: c_ptr,
        out: out_ptr,
        sf: sf_ptr,
        sf_bytes,
        sf_bases: b_ptr,
        status: s_ptr,
        stream: stream.cu_stream() as u64,
    };
    Ok(Bound { args, _guards: ([gx, gout, gsf, gb, gs], group_guards) })
}

/// out 16-byte, x 2-byte aligned.
fn check_aligned(args: &sys::MxQuantArgs) -> Result<()> {
    need_aligned("out", args.out)?;
    if args.x % 2 != 0 {
        let detail = format!("device address {:#x} is not 2-byte aligned", args.x);
        return Err(Error::Buffer { name: "x", detail });
    }
    Ok(())
}

/// Queues the bases kernel and the quantiser on `stream`: `x` `[max_rows, x_cols]` (row stride `x_stride`)
/// grouped as `rows` says, `groups` groups, into rows of `k >= x_cols` (the columns past x's are zero).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_quantize_mxfp8<T: Element>(
    stream: &CudaStream,
    x: &impl DevicePtr<T>,
    (x_stride, x_cols): (usize, usize),
    max_rows: usize,
    k: usize,
    groups: usize,
    rows: GroupedRows<'_>,
    dst: MxDst<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    check_k("MXFP8", (k, MX_VEC, "one UE8M0 scale per 32"), groups, (x_stride, x_cols))?;
    let out = (dst.out, max_rows * k, "max_rows x K");
    let bound =
        bind_mx(stream, x, (x_stride, x_cols), (max_rows, k, groups), rows, out, (dst.sf, dst.sf_bases), status)?;
    check_aligned(&bound.args)?;
    // SAFETY: x holds max_rows rows of `stride` (the last x_cols long; the kernel reads no column past x_cols <= K
    // of any row), out max_rows x K e4m3 (16-byte aligned, K a
    // multiple of 32: every 32-element block store is aligned), sf_bases G + 1 int64, offsets G + 1 / counts G
    // where the mode reads them (checked); the kernel clamps group rows into [0, max_rows] and never writes a
    // scale byte at or past sf.len(). The stream's context is bound; the guards outlive the call.
    let st = unsafe { ffi::quantize_mxfp8_grouped(&bound.args) };
    check(st, &Launched { ..Launched::typed("quantize_mxfp8_grouped", T::DTYPE) })
}

/// The destination of one FP4 launch: packed e2m1 `[max_rows, k / 2]`, the scale atoms, the group bases, and
/// (NVFP4) the f32 pair `[tensor scale, amax scratch]`.
pub(crate) struct Fp4Dst<'a> {
    pub out: &'a mut CudaSlice<u8>,
    pub sf: &'a mut CudaSlice<u8>,
    pub sf_bases: &'a mut CudaSlice<i64>,
    pub tensor: Option<&'a mut CudaSlice<f32>>,
}

/// Queues the bases kernel, (NVFP4 with `tensor_scale` 0) the amax kernel, and the FP4 quantiser on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_quantize_fp4<T: Element>(
    stream: &CudaStream,
    format: Fp4Format,
    x: &impl DevicePtr<T>,
    (x_stride, x_cols): (usize, usize),
    (max_rows, k, groups): (usize, usize, usize),
    rows: GroupedRows<'_>,
    tensor_scale: f32,
    dst: Fp4Dst<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let (name, vec) = if format == Fp4Format::Nvfp4 { ("NVFP4", NV_VEC) } else { ("MXFP4", MX_VEC) };
    check_k(name, (k, vec, &format!("one scale per {vec}")), groups, (x_stride, x_cols))?;
    if !(tensor_scale.is_finite() && tensor_scale >= 0.0) {
        return Err(Error::InvalidProblem(format!(
            "{name} quantisation: tensor scale {tensor_scale} must be finite and positive (0: derived on the device)"
        )));
    }
    let out = (dst.out, max_rows * k / 2, "max_rows x K / 2 bytes");
    let bound =
        bind_mx(stream, x, (x_stride, x_cols), (max_rows, k, groups), rows, out, (dst.sf, dst.sf_bases), status)?;
    let (t_ptr, _t) = match dst.tensor {
        Some(t) => {
            need_len("tensor", t.len(), 2, "2 (tensor scale, amax)")?;
            let (p, g) = t.device_ptr_mut(stream);
            (p, Some(g))
        }
        None if format == Fp4Format::Nvfp4 => {
            return Err(Error::InvalidProblem("NVFP4 quantisation without its tensor-scale buffer".into()))
        }
        None => (0, None),
    };
    check_aligned(&bound.args)?;
    let a = &bound.args;
    let args = sys::Fp4QuantArgs {
        format,
        dtype: a.dtype,
        mode: a.mode,
        groups: a.groups,
        max_m: a.max_m,
        k: a.k,
        k_in: a.k_in,
        max_rows: a.max_rows,
        x_stride: a.x_stride,
        x: a.x,
        offsets: a.offsets,
        counts: a.counts,
        out: a.out,
        sf: a.sf,
        sf_bytes: a.sf_bytes,
        sf_bases: a.sf_bases,
        tensor_scale,
        tensor: t_ptr,
        status: a.status,
        stream: a.stream,
    };
    // SAFETY: x holds max_rows rows of `stride` (the last x_cols long; no column past x_cols <= K is read), out
    // max_rows x K / 2 bytes (16-byte aligned,
    // K a multiple of the block: every block's 16- or 8-byte store is aligned), sf_bases G + 1 int64, tensor two
    // f32 where NVFP4 reads them, offsets G + 1 / counts G where the mode reads them (checked); the kernels clamp
    // group rows into [0, max_rows] and never write a scale byte at or past sf.len(). The stream's context is
    // bound; the guards outlive the call.
    let st = unsafe { ffi::quantize_fp4_grouped(&args) };
    check(st, &Launched { ..Launched::typed("quantize_fp4_grouped", T::DTYPE) })
}
