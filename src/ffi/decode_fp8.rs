//! The Batched backend over FP8 experts (`cpp/moe_ops/decode_fp8.cu`, contract in `cpp/moe_ops/decode_fp8.h`): two
//! kernels that stream e4m3 weight rows into tensor-core MMAs. x is quantised in shared memory by each expand
//! block; h, per 128 columns for block-scaled weights, once by the expand kernel into scratch, per row for
//! per-channel ones in shared memory by each reduce block.

use super::bridge::ffi;
use super::elementwise::DecodeIo;
use super::status::{check, Launched};
use super::sys;
use super::{need_aligned, need_len, to_i32, Activation};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use float8::F8E4M3;

/// Columns per scale, and the multiple H and I must be.
const BLOCK: usize = 128;
/// The reduce kernel's block holds a warp per slot.
pub(crate) const MAX_TOP_K: usize = 32;
/// Shared memory a block may opt into on SM90 (227 KB).
const MAX_SMEM: usize = 227 * 1024;

/// A dynamic activation scale's rule: `max(amax, eps) / 448`, rounded up to a power of two with `ue8m0`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DynamicScale {
    pub eps: f32,
    pub ue8m0: bool,
}

/// How the weights and the activations are scaled (`DecodeScaling`, with what each form reads).
#[derive(Debug)]
pub(crate) enum DecodeScales<'a> {
    /// f32 scales per 128 x 128 weight block, `[E, 2I / 128, H / 128]` and `[E, H / 128, I / 128]`; the
    /// activations per token per 128 columns.
    Block128 { w13: CudaView<'a, f32>, w2: CudaView<'a, f32>, act: DynamicScale },
    /// f32 scales per output row, `[E, 2I]` and `[E, H]`; the activations as `act` says.
    Channel { w13: CudaView<'a, f32>, w2: CudaView<'a, f32>, act: ChannelActScale<'a> },
}

/// The activation scales that meet per-channel weights.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChannelActScale<'a> {
    /// Each row's own, at run time.
    Token(DynamicScale),
    /// One for x's rows and one for h's rows in use, at run time (reduced into two words the launch is given).
    Tensor(DynamicScale),
    /// The checkpoint's, f32 `[1]` each on the device: GEMM1's and GEMM2's.
    Static { x: &'a CudaSlice<f32>, h: &'a CudaSlice<f32> },
}

/// The experts (mirrors `DecodeFp8Args` without its activations): e4m3 `w13 [E, 2I, H]` and `w2 [E, H, I]`,
/// their scales and the activations' ([`DecodeScales`]), f32 biases `[E, 2I]` and `[E, H]`.
pub(crate) struct DecodeFp8Weights<'a> {
    pub act: Activation,
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub w13: CudaView<'a, F8E4M3>,
    pub w2: CudaView<'a, F8E4M3>,
    pub scales: DecodeScales<'a>,
    pub b13: Option<&'a CudaSlice<f32>>,
    pub b2: Option<&'a CudaSlice<f32>>,
}

/// Shared memory of the expand kernel: x staged in bf16 and in e4m3, its scales, the partial sums of 2 tiles x 4
/// K splits x (gate, up) x 16 rows (`expand_smem`).
pub(crate) fn expand_smem_bytes(hidden: usize) -> usize {
    3 * hidden + 4 * (hidden / BLOCK) + 4 * 2 * 4 * 2 * 16
}

/// Shared memory of the reduce kernel: k rows of h staged in e4m3 (and, per channel, in bf16 first), their
/// scales, the partial sums (`reduce_smem`).
pub(crate) fn reduce_smem_bytes(top_k: usize, inter: usize, per_channel: bool) -> usize {
    let splits = if top_k >= 16 { 1 } else { (16 / top_k).min(inter / BLOCK) };
    let staged = if per_channel { 3 } else { 1 };
    staged * top_k * inter + 4 * top_k * (inter / BLOCK) + 4 * splits * top_k * 16
}

/// Checks what the kernels assume of the shapes, naming the constraint.
pub(crate) fn check_shape(hidden: usize, inter: usize, top_k: usize, per_channel: bool) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidProblem(s));
    for (name, v) in [("H", hidden), ("I", inter)] {
        if v == 0 || v % BLOCK != 0 {
            return bad(format!("FP8 decode: {name} = {v} is not a positive multiple of {BLOCK} (whole scale blocks)"));
        }
    }
    if top_k == 0 || top_k > MAX_TOP_K {
        return bad(format!("FP8 decode: top_k = {top_k} is outside 1..={MAX_TOP_K} (a warp per slot in one block)"));
    }
    let smem = expand_smem_bytes(hidden);
    if smem > MAX_SMEM {
        return bad(format!(
            "FP8 decode: H = {hidden}: the staged and quantised x row needs {smem} bytes of shared memory, more \
             than {MAX_SMEM}"
        ));
    }
    let smem = reduce_smem_bytes(top_k, inter, per_channel);
    if smem > MAX_SMEM {
        return bad(format!(
            "FP8 decode: top_k x I = {top_k} x {inter}: the block's quantised rows of h need {smem} bytes of shared \
             memory, more than {MAX_SMEM}"
        ));
    }
    // The grid's rows are its x extent (up to 2^31 - 1, the i32 check at launch); its y extents, I / 32 and H / 16,
    // are far inside 65535 wherever the shared memory above fits.
    Ok(())
}

/// The scratch the kernels write besides h.
#[derive(Debug)]
pub(crate) struct DecodeFp8Scratch<'a> {
    /// Per-tensor dynamic activation scales (per channel): two words (a memset and a reduction kernel run first;
    /// the expand kernel reduces h's amax into the second).
    pub amax: Option<&'a mut CudaSlice<u32>>,
    /// Block scales: h quantised once, e4m3 `[rows, I]` and f32 scales `[rows, I / 128]`.
    pub h_q: Option<(&'a mut CudaSlice<F8E4M3>, &'a mut CudaSlice<f32>)>,
    /// Block scales: one u32 counter per row per 128 columns of h, zeroed when allocated and left at multiples of
    /// 4 by every launch (`decode_fp8.h`).
    pub arrivals: Option<&'a mut CudaSlice<u32>>,
}

/// Queues the two FP8 decode kernels: the whole layer of `w` for `tokens` tokens. The activations are bf16 (`T`
/// another element type is an error); `scratch` as [`DecodeFp8Scratch`] says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_decode_layer_fp8<T: Element>(
    stream: &CudaStream,
    w: &DecodeFp8Weights<'_>,
    tokens: usize,
    top_k: usize,
    x: &impl DevicePtr<T>,
    ids: &impl DevicePtr<i32>,
    weights: &impl DevicePtr<f32>,
    h: &mut CudaSlice<T>,
    y: &mut impl DevicePtrMut<T>,
    scratch: DecodeFp8Scratch<'_>,
    status: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    if T::DTYPE != DType::BF16 {
        return Err(Error::InvalidProblem(format!("FP8 decode: activations are bf16, not {}", T::DTYPE)));
    }
    let (hid, inter, e) = (w.hidden, w.inter, w.experts);
    let rows = tokens * top_k;
    let per_channel = matches!(w.scales, DecodeScales::Channel { .. });
    check_shape(hid, inter, top_k, per_channel)?;
    if w.act == Activation::Silu {
        return Err(Error::InvalidProblem("FP8 decode: the activation must be gated (w13 holds gate and up)".into()));
    }
    need_len("w13", w.w13.len(), e * 2 * inter * hid, "experts x 2I x H")?;
    need_len("w2", w.w2.len(), e * hid * inter, "experts x H x I")?;
    let (scaling, s13, s2, dynamic, statics) = match &w.scales {
        DecodeScales::Block128 { w13, w2, act } => {
            need_len("w13 scales", w13.len(), e * (2 * inter / BLOCK) * (hid / BLOCK), "experts x 2I/128 x H/128")?;
            need_len("w2 scales", w2.len(), e * (hid / BLOCK) * (inter / BLOCK), "experts x H/128 x I/128")?;
            (sys::DecodeScaling::Block128, w13, w2, Some(*act), None)
        }
        DecodeScales::Channel { w13, w2, act } => {
            need_len("w13 scales", w13.len(), e * 2 * inter, "experts x 2I (one per output channel)")?;
            need_len("w2 scales", w2.len(), e * hid, "experts x H (one per output channel)")?;
            match *act {
                ChannelActScale::Token(d) => (sys::DecodeScaling::ChannelToken, w13, w2, Some(d), None),
                ChannelActScale::Tensor(d) => (sys::DecodeScaling::ChannelTensor, w13, w2, Some(d), None),
                ChannelActScale::Static { x, h } => {
                    need_len("static x scale", x.len(), 1, "one f32")?;
                    need_len("static h scale", h.len(), 1, "one f32")?;
                    (sys::DecodeScaling::ChannelStatic, w13, w2, None, Some((x, h)))
                }
            }
        }
    };
    if let Some(d) = dynamic.filter(|d| !(d.eps.is_finite() && d.eps / 448.0 >= f32::MIN_POSITIVE)) {
        return Err(Error::InvalidProblem(format!("FP8 decode: eps = {:e}: eps / 448 must be a normal f32", d.eps)));
    }
    // Static scales: the kernels read no eps.
    let d = dynamic.unwrap_or(DynamicScale { eps: 1.0, ue8m0: false });
    let DecodeFp8Scratch { amax, h_q, arrivals } = scratch;
    let amax = match (scaling, amax) {
        (sys::DecodeScaling::ChannelTensor, Some(words)) => {
            need_len("amax words", words.len(), 2, "two u32 (x's and h's per-tensor amax)")?;
            Some(words)
        }
        (sys::DecodeScaling::ChannelTensor, None) => {
            return Err(Error::InvalidProblem(
                "FP8 decode: per-tensor dynamic activation scales need two amax words of scratch".into(),
            ))
        }
        _ => None,
    };
    if let Some(b) = w.b13 {
        need_len("b13", b.len(), e * 2 * inter, "experts x 2I")?;
    }
    if let Some(b) = w.b2 {
        need_len("b2", b.len(), e * hid, "experts x H")?;
    }
    let quantised_h = match (per_channel, h_q, arrivals) {
        (true, ..) => None,
        (false, Some((q, s)), Some(a)) => {
            need_len("quantised h", q.len(), rows * inter, "(token, slot) rows x I e4m3")?;
            need_len("quantised h scales", s.len(), rows * (inter / BLOCK), "(token, slot) rows x I/128")?;
            need_len("arrival counters", a.len(), rows * (inter / BLOCK), "(token, slot) rows x I/128")?;
            Some((q, s, a))
        }
        (false, ..) => {
            return Err(Error::InvalidProblem(
                "FP8 decode: block-scaled weights need scratch for h quantised once and its arrival counters".into(),
            ))
        }
    };
    to_i32("(token, slot) rows", rows)?; // the expand grid's x extent
    let io = DecodeIo::new(stream, (tokens, top_k, hid, inter), x, ids, weights, h, y, status)?;
    let (tokens, top_k, experts) = (to_i32("tokens", tokens)?, to_i32("top_k", top_k)?, to_i32("experts", e)?);
    let (w13_ptr, _w13) = w.w13.device_ptr(stream);
    let (s13_ptr, _s13) = s13.device_ptr(stream);
    let (w2_ptr, _w2) = w.w2.device_ptr(stream);
    let (s2_ptr, _s2) = s2.device_ptr(stream);
    let (x_scale, _xs) = statics.map(|(x, _)| x.device_ptr(stream)).unzip();
    let (h_scale, _hs) = statics.map(|(_, h)| h.device_ptr(stream)).unzip();
    let (amax_ptr, _amax) = amax.map(|a| a.device_ptr_mut(stream)).unzip();
    let (hq_ptrs, _hq) = quantised_h
        .map(|(q, s, a)| {
            let (q, gq) = q.device_ptr_mut(stream);
            let (s, gs) = s.device_ptr_mut(stream);
            let (a, ga) = a.device_ptr_mut(stream);
            ((q, s, a), (gq, gs, ga))
        })
        .unzip();
    let (h_q, h_scales, arrivals) = hq_ptrs.unwrap_or((0, 0, 0));
    let (b13_ptr, _b13) = w.b13.map(|b| b.device_ptr(stream)).unzip();
    let (b2_ptr, _b2) = w.b2.map(|b| b.device_ptr(stream)).unzip();
    for (name, p) in [("w13", w13_ptr), ("w2", w2_ptr)] {
        need_aligned(name, p)?;
    }
    let args = sys::DecodeFp8Args {
        act: w.act,
        scaling,
        tokens,
        top_k,
        experts,
        hidden: hid as i32,
        inter: inter as i32,
        eps: d.eps,
        ue8m0: d.ue8m0 as i32,
        x: io.x,
        ids: io.ids,
        weights: io.weights,
        w13: w13_ptr,
        w13_scales: s13_ptr,
        w2: w2_ptr,
        w2_scales: s2_ptr,
        b13: b13_ptr.unwrap_or(0),
        b2: b2_ptr.unwrap_or(0),
        h: io.h,
        h_q,
        h_scales,
        arrivals,
        y: io.y,
        x_scale: x_scale.unwrap_or(0),
        h_scale: h_scale.unwrap_or(0),
        amax: amax_ptr.unwrap_or(0),
        status: io.status,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: x holds tokens*H, ids/weights tokens*k, h rows*I, y tokens*H bf16; block scales: h_q rows*I e4m3,
    // h_scales and arrivals rows*I/128 words; the weights E*2I*H and E*H*I e4m3 bytes with their
    // E*(2I/128)*(H/128) and E*(H/128)*(I/128) f32 block scales or E*2I and E*H channel scales, biases E*2I and
    // E*H, one static scale each, two amax words (all checked above). H and I are multiples of 128 and the bases
    // 16-byte aligned, so every row's 16-byte loads are; the shared memory fits (checked). Expert ids are device
    // data the kernels range-check. The stream's context is bound to this thread; guards outlive the call.
    check(unsafe { ffi::decode_layer_fp8(&args) }, &Launched::op("decode_layer_fp8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::invalid_problem as msg;

    #[test]
    fn shapes_name_their_constraint() {
        for pc in [false, true] {
            assert!(check_shape(7168, 2048, 8, pc).is_ok());
            assert!(check_shape(4096, 14336, 2, pc).is_ok());
            assert!(msg(check_shape(2880, 2048, 8, pc)).contains("H = 2880"));
            assert!(msg(check_shape(7168, 192, 8, pc)).contains("I = 192"));
            assert!(msg(check_shape(7168, 2048, 0, pc)).contains("top_k = 0"));
            assert!(msg(check_shape(7168, 2048, 33, pc)).contains("top_k = 33"));
            assert!(msg(check_shape(131072, 2048, 8, pc)).contains("H = 131072"));
        }
        // Per channel h is staged in bf16 too: three bytes a column where block scales stage one.
        let m = msg(check_shape(4096, 16384, 8, true));
        assert!(m.contains("8 x 16384") && m.contains("shared"), "{m}");
        assert!(check_shape(4096, 16384, 8, false).is_ok());
        assert!(msg(check_shape(4096, 16384, 16, false)).contains("16 x 16384"));
        // Whatever the shared memory admits keeps the grid's y extents (I / 32, H / 16) under 65535.
        let h_max = (1..).map(|n| n * BLOCK).take_while(|&h| expand_smem_bytes(h) <= MAX_SMEM).last().unwrap();
        let i_max = (1..).map(|n| n * BLOCK).take_while(|&i| reduce_smem_bytes(1, i, false) <= MAX_SMEM).last();
        let i_max = i_max.unwrap();
        assert!(h_max / 16 <= 65535 && i_max / 32 <= 65535, "H {h_max}, I {i_max}");
    }

    #[test]
    fn reduce_smem_matches_the_kernel_formula() {
        // DeepSeek-V3: 8 rows of 2048 in e4m3, 8 x 16 scales, 2 splits x 8 x 16 partials; per channel in bf16 too.
        assert_eq!(reduce_smem_bytes(8, 2048, false), 8 * 2048 + 4 * 8 * 16 + 4 * 2 * 8 * 16);
        assert_eq!(reduce_smem_bytes(8, 2048, true), 3 * 8 * 2048 + 4 * 8 * 16 + 4 * 2 * 8 * 16);
        // Mixtral: k 2 -> 8 splits.
        assert_eq!(reduce_smem_bytes(2, 14336, false), 2 * 14336 + 4 * 2 * 112 + 4 * 8 * 2 * 16);
        // I = 128 has one K block: one split however small k is.
        assert_eq!(reduce_smem_bytes(1, 128, true), 3 * 128 + 4 + 4 * 16);
        assert_eq!(expand_smem_bytes(7168), 3 * 7168 + 4 * 56 + 1024);
    }
}
