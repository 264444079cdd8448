//! The SM90 fused MoE GEMMs (`cpp/fused/fused_moe_sm90.cuh`, the decode tiles of `cpp/fused/fused_decode.cu`, the
//! FP8 ones of `cpp/fused/launch.h`): their bridge, the per-plan shared-memory opt-in and the launch of
//! one gather or scatter GEMM over an aligned layout. C++ has one entry point per element type and one for the
//! decode (SwapAb) tiles; the tile and the element type pick it here.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ffi::bridge::trivial_extern_types;
use crate::ffi::gemm::{E4m3Buffer, ScaleBuffer, ScaledOperands};
use crate::ffi::status::{check, Launched, NOT_BUILT};
use crate::ffi::{dtype, need_aligned, need_f32_aligned, need_len, need_row_len, to_i32, to_i64};

crate::ffi::family_sys!("fused");

pub(crate) use sys::{FusedFp8Scales, FusedFp8Tile, FusedTile};

trivial_extern_types! { FusedTile FusedFp8Tile FusedGemmArgs FusedGemmFp8Args }

#[cxx::bridge(namespace = "moe_gemm")]
mod ffi {
    unsafe extern "C++" {
        include!("moe-gemm/cpp/fused/launch.h");

        type Status = crate::ffi::sys::Status;
        type DType = crate::ffi::sys::DType;
        type FusedTile = crate::kernels::fused::launch::sys::FusedTile;
        type FusedFp8Tile = crate::kernels::fused::launch::sys::FusedFp8Tile;
        type FusedGemmArgs = crate::kernels::fused::launch::sys::FusedGemmArgs;
        type FusedGemmFp8Args = crate::kernels::fused::launch::sys::FusedGemmFp8Args;

        /// # Safety
        /// Buffers of the sizes `FusedGemmArgs` documents for its mode, live on `stream`; `args.dtype` bf16 and
        /// `args.tile` a warpgroup-MMA tile (not SwapAb).
        unsafe fn fused_moe_gemm_bf16(args: &FusedGemmArgs) -> Status;
        /// # Safety
        /// As `fused_moe_gemm_bf16`, `args.dtype` f16.
        unsafe fn fused_moe_gemm_f16(args: &FusedGemmArgs) -> Status;
        /// # Safety
        /// As `fused_moe_gemm_bf16` for a SwapAb tile, either element type; `offsets`, `ready` and `topk` as
        /// `fused_decode_gemm` (`cpp/fused/launch.h`) reads them, or 0.
        unsafe fn fused_decode_gemm(args: &FusedGemmArgs, offsets: u64, ready: u64, topk: u64) -> Status;
        /// Opts the kernel of `tile` (a warpgroup-MMA tile) into its dynamic shared memory on the current device.
        fn fused_moe_prepare_bf16(tile: FusedTile) -> Status;
        fn fused_moe_prepare_f16(tile: FusedTile) -> Status;
        /// As `fused_moe_prepare_bf16` for a SwapAb tile of `dtype`.
        fn fused_decode_prepare(dtype: DType, tile: FusedTile) -> Status;
        /// # Safety
        /// Buffers of the sizes `FusedGemmFp8Args` documents for its mode, live on `stream`.
        unsafe fn fused_moe_gemm_fp8(args: &FusedGemmFp8Args) -> Status;
        /// Opts the FP8 fused kernel of `tile` into its dynamic shared memory on the current device.
        fn fused_moe_prepare_fp8(tile: FusedFp8Tile) -> Status;
    }
}

/// The decode tiles (`cpp/fused/fused_decode.cu`); the others are the warpgroup-MMA tiles of
/// `cpp/fused/fused_moe_sm90.cuh`.
fn is_swap_ab(tile: FusedTile) -> bool {
    matches!(tile, FusedTile::SwapAb16 | FusedTile::SwapAb32 | FusedTile::SwapAbMerged)
}

/// Rows of a compiled tile (`BM` of `cpp/fused/fused_moe_sm90.cuh`'s and `cpp/fused/fused_decode.cu`'s tiles): the kernel gives
/// each `BM` positions one entry of `expert_ids`.
pub(crate) fn block_m(tile: FusedTile) -> usize {
    match tile {
        FusedTile::SwapAb16 => 16,
        FusedTile::SwapAb32 => 32,
        FusedTile::SwapAbMerged => 16,
        FusedTile::M64N128K64 => 64,
        FusedTile::M128N256K64 => 128,
    }
}

/// Opts the kernel of (`dtype`, `tile`) into its dynamic shared memory on `stream`'s device: once per plan,
/// before its first launch (launches set no attribute).
pub(crate) fn prepare(stream: &CudaStream, d: DType, tile: FusedTile) -> Result<()> {
    crate::ffi::bind(stream)?;
    let s = match d {
        _ if is_swap_ab(tile) => ffi::fused_decode_prepare(dtype(d), tile),
        DType::BF16 => ffi::fused_moe_prepare_bf16(tile),
        DType::F16 => ffi::fused_moe_prepare_f16(tile),
    };
    check(s, &Launched { config: Some(&tile), ..Launched::typed("fused_moe_prepare", d) })
}

/// One fused MoE GEMM over an aligned layout (mirrors `FusedGemmArgs` and `FusedGemmFp8Args`, less the tile).
pub(crate) struct FusedLaunch<'a> {
    /// `None`: gather (A = x by token, D by position); `Some`: scatter (A by position, D by flat row, weighted).
    pub scatter: Option<FusedScatter<'a>>,
    /// Gather with the gated activation in the epilogue (the SwapAb tiles): D = h `[capacity, n / 2]`.
    pub gated: Option<FusedGated<'a>>,
    pub top_k: usize,
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    pub rows: usize,
    pub capacity: usize,
    /// SMs of the stream's device (the persistent grid), from the caller's plan.
    pub sm_count: i32,
    pub sorted_ids: &'a CudaSlice<i32>,
    pub expert_ids: &'a CudaSlice<i32>,
    /// The layout's per-expert first positions `[experts + 1]` (read by the merged SwapAb tile).
    pub offsets: &'a CudaSlice<i32>,
    pub total: &'a CudaSlice<i32>,
    /// The layout's hand-off counters (`fused_decode_gemm`'s `ready`): given to a gated GEMM1 and to the scatter
    /// GEMM2 that follows it on the same layout, with nothing between, built just before (the layer's pass).
    pub ready: Option<&'a CudaSlice<i32>>,
    /// The batch's topk_ids (`fused_decode_gemm`'s `topk`): a prefetch hint of the SwapAb16 GEMM1.
    pub topk_ids: Option<&'a CudaView<'a, i32>>,
}

/// The gated epilogue's activation, gate/up row order and `b13` bias `[experts, n]`.
pub(crate) struct FusedGated<'a> {
    pub act: crate::ffi::elementwise::Activation,
    pub gate_up: crate::ffi::elementwise::GateUp,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// The scatter epilogue's router weights `[rows]` and bias `[experts, n]`.
pub(crate) struct FusedScatter<'a> {
    pub weights: &'a CudaView<'a, f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Rows of a compiled FP8 tile (`cpp/fused/launch.h`), and its N tile (N must be whole tiles).
pub(crate) fn fp8_tile_mn(tile: FusedFp8Tile) -> (usize, usize) {
    match tile {
        FusedFp8Tile::M64N64K128 => (64, 64),
        FusedFp8Tile::M128N128K128 => (128, 128),
    }
}

/// Opts the FP8 fused kernel of `tile` into its dynamic shared memory on `stream`'s device (once per plan).
pub(crate) fn prepare_fp8(stream: &CudaStream, tile: FusedFp8Tile) -> Result<()> {
    crate::ffi::bind(stream)?;
    check(ffi::fused_moe_prepare_fp8(tile), &Launched { config: Some(&tile), ..Launched::op("fused_moe_prepare_fp8") })
}

/// The checks both fused launches make: layout arrays, mode buffers and their lengths; the rows of A and D.
fn check_launch(p: &FusedLaunch<'_>, bm: usize, a_len: usize, b_len: usize, d_len: usize) -> Result<(usize, usize)> {
    if p.top_k == 0 || p.rows % p.top_k != 0 || p.capacity % bm != 0 {
        return Err(Error::InvalidProblem(format!(
            "fused GEMM: rows = {} must be a multiple of top_k = {} and the layout's capacity {} a multiple of the tile's BLOCK_M = {bm}",
            p.rows, p.top_k, p.capacity
        )));
    }
    if p.sm_count <= 0 {
        return Err(Error::InvalidProblem(format!("fused GEMM: sm_count = {} must be positive", p.sm_count)));
    }
    need_len("sorted_ids", p.sorted_ids.len(), p.capacity, "the layout's capacity")?;
    need_len("expert_ids", p.expert_ids.len(), p.capacity / bm, "capacity / BLOCK_M")?;
    need_len("offsets", p.offsets.len(), p.experts + 1, "experts + 1")?;
    need_len("total", p.total.len(), 1, "one count")?;
    if let Some(r) = p.ready {
        need_len("block_ready", r.len(), p.capacity / bm, "capacity / BLOCK_M")?;
    }
    if let Some(t) = p.topk_ids {
        need_len("topk_ids", t.len(), p.rows, "tokens x top_k")?;
    }
    need_len("B", b_len, p.experts * p.n * p.k, "experts x n x k")?;
    let (a_rows, d_rows) = match p.scatter {
        None => (p.rows / p.top_k, p.capacity),
        Some(_) => (p.capacity, p.rows),
    };
    need_len("A", a_len, a_rows * p.k, "its rows x k")?;
    match &p.gated {
        None => need_len("D", d_len, d_rows * p.n, "its rows x n")?,
        Some(g) => {
            if p.scatter.is_some() || p.n % 2 != 0 || g.act == crate::ffi::elementwise::Activation::Silu {
                return Err(Error::InvalidProblem(format!(
                    "fused GEMM: the gated epilogue is a gather over w13 with n = 2I = {} even and a gated \
                     activation (got {:?})",
                    p.n, g.act
                )));
            }
            need_len("h", d_len, d_rows * (p.n / 2), "capacity x I")?;
            if let Some(bias) = g.bias {
                need_len("b13 bias", bias.len(), p.experts * p.n, "experts x 2I")?;
            }
        }
    }
    if let Some(s) = &p.scatter {
        need_len("topk_weights", s.weights.len(), p.rows, "tokens x top_k")?;
        if let Some(bias) = s.bias {
            need_len("b2 bias", bias.len(), p.experts * p.n, "experts x n")?;
        }
    }
    Ok((a_rows, d_rows))
}

/// Queues one fused MoE GEMM (gather or scatter) on `stream`. The kernel of (`T`, `tile`) must have been
/// [`prepare`]d on the stream's device.
pub(crate) fn launch_fused_gemm<T: Element>(
    stream: &CudaStream,
    tile: FusedTile,
    p: &FusedLaunch<'_>,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    d: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let bm = block_m(tile);
    need_row_len::<T>("fused GEMM n", p.n)?;
    need_row_len::<T>("fused GEMM k", p.k)?;
    check_launch(p, bm, a.len(), b.len(), d.len())?;
    let (top_k, experts, rows) = (to_i32("top_k", p.top_k)?, to_i32("experts", p.experts)?, to_i32("rows", p.rows)?);
    let capacity = to_i64("capacity", p.capacity)?;
    crate::ffi::bind(stream)?;
    let (a_ptr, _a) = a.device_ptr(stream);
    let (b_ptr, _b) = b.device_ptr(stream);
    let (d_ptr, _d) = d.device_ptr_mut(stream);
    for (name, ptr) in [("A", a_ptr), ("B", b_ptr), ("D", d_ptr)] {
        need_aligned(name, ptr)?;
    }
    let (s_ptr, _s) = p.sorted_ids.device_ptr(stream);
    let (e_ptr, _e) = p.expert_ids.device_ptr(stream);
    let (o_ptr, _o) = p.offsets.device_ptr(stream);
    let (t_ptr, _t) = p.total.device_ptr(stream);
    let (r_ptr, _r) = p.ready.map(|r| r.device_ptr(stream)).unzip();
    let (k_ptr, _k) = p.topk_ids.map(|t| t.device_ptr(stream)).unzip();
    let (w_ptr, _w) = p.scatter.as_ref().map(|s| s.weights.device_ptr(stream)).unzip();
    let bias = p.scatter.as_ref().and_then(|s| s.bias).or(p.gated.as_ref().and_then(|g| g.bias));
    let (bias_ptr, _bias) = bias.map(|b| b.device_ptr(stream)).unzip();
    let mode = match (&p.scatter, &p.gated) {
        (Some(_), _) => sys::FusedMode::Scatter,
        (None, Some(_)) => sys::FusedMode::GatherGated,
        (None, None) => sys::FusedMode::Gather,
    };
    let (act, gate_up) =
        p.gated.as_ref().map_or((sys::Activation::SiluGated, sys::GateUp::Concatenated), |g| (g.act, g.gate_up));
    let args = sys::FusedGemmArgs {
        dtype: dtype(T::DTYPE),
        tile,
        mode,
        top_k,
        experts,
        n: p.n as i32,
        k: p.k as i32,
        rows,
        sm_count: p.sm_count,
        capacity,
        a: a_ptr,
        b: b_ptr,
        d: d_ptr,
        sorted_ids: s_ptr,
        expert_ids: e_ptr,
        total: t_ptr,
        weights: w_ptr.unwrap_or(0),
        bias: bias_ptr.unwrap_or(0),
        act,
        gate_up,
        stream: stream.cu_stream() as u64,
    };
    // Beside the args: read by the SwapAb tiles only, which alone have the hand-off and the gated epilogue.
    let (ready, topk_ids) = (r_ptr.unwrap_or(0), k_ptr.unwrap_or(0));
    // SAFETY: A, B, D, sorted_ids, expert_ids (one per BLOCK_M positions of the tile), offsets (experts + 1; the
    // merged tile clamps what contradicts expert_ids to one block), block_ready (capacity / BLOCK_M, checked;
    // GEMM2 falls back to waiting for all of GEMM1 after 20 ms without its counts), topk_ids (rows, checked; its
    // ids are clamped to `experts` and feed L2 prefetches only), weights and bias hold what
    // the mode needs (checked above), with 16-byte aligned bases and n, k multiples of the element type's 16-byte
    // alignment (checked). The kernel reads positions below min(*total, capacity) only, skips tiles whose expert
    // id is negative or not below `experts`, zero-fills A rows whose flat row is outside [0, rows) and writes D
    // rows below capacity (gather) or flat rows in [0, rows) (scatter). The stream's context is bound to this
    // thread; guards outlive the call.
    let status = unsafe {
        match T::DTYPE {
            _ if is_swap_ab(tile) => ffi::fused_decode_gemm(&args, o_ptr, ready, topk_ids),
            _ if ready != 0 || args.mode == sys::FusedMode::GatherGated => NOT_BUILT,
            DType::BF16 => ffi::fused_moe_gemm_bf16(&args),
            DType::F16 => ffi::fused_moe_gemm_f16(&args),
        }
    };
    check(status, &Launched { config: Some(&tile), ..Launched::typed("fused_moe_gemm", T::DTYPE) })
}

/// The FP8 operands of a fused launch: e4m3 A and B with their f32 block scales (`cpp/fused/launch.h`).
pub(crate) type FusedFp8Operands<'a, A, SA, B, SB> = ScaledOperands<'a, A, SA, B, SB>;

/// Queues one FP8 fused MoE GEMM on `stream` (bf16 D) with `scales`' grids (per 128 x 128 block, or per row and
/// per channel). The kernels of `tile` must have been [`prepare_fp8`]d.
pub(crate) fn launch_fused_gemm_fp8<A: E4m3Buffer, SA: ScaleBuffer, B: E4m3Buffer, SB: ScaleBuffer>(
    stream: &CudaStream,
    (tile, scales): (FusedFp8Tile, FusedFp8Scales),
    p: &FusedLaunch<'_>,
    ops: FusedFp8Operands<'_, A, SA, B, SB>,
    d: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    let (bm, bn) = fp8_tile_mn(tile);
    if p.n == 0 || p.n % bn != 0 || p.k == 0 || p.k % 16 != 0 {
        return Err(Error::InvalidProblem(format!(
            "FP8 fused GEMM: n = {} must be a positive multiple of the tile's N = {bn} and k = {} of 16 (16-byte \
             e4m3 rows)",
            p.n, p.k
        )));
    }
    let (a_rows, _) = check_launch(p, bm, ops.a.len(), ops.b.len(), d.len())?;
    let (kb, nb) = (p.k.div_ceil(128), p.n.div_ceil(128));
    if scales == FusedFp8Scales::Channel {
        need_len("sa", ops.sa.len(), a_rows, "A's rows (one scale each)")?;
        need_len("sb", ops.sb.len(), p.experts * p.n, "experts x n (one scale per output channel)")?;
    } else {
        need_len("sa", ops.sa.len(), a_rows * kb, "A's rows x ceil(k/128)")?;
        need_len("sb", ops.sb.len(), p.experts * nb * kb, "experts x ceil(n/128) x ceil(k/128)")?;
    }
    let (top_k, experts, rows) = (to_i32("top_k", p.top_k)?, to_i32("experts", p.experts)?, to_i32("rows", p.rows)?);
    let capacity = to_i64("capacity", p.capacity)?;
    let (n, k) = (to_i32("n", p.n)?, to_i32("k", p.k)?);
    crate::ffi::bind(stream)?;
    let (a_ptr, _a) = ops.a.device_ptr(stream);
    let (sfa_ptr, _sfa) = ops.sa.device_ptr(stream);
    let (b_ptr, _b) = ops.b.device_ptr(stream);
    let (sfb_ptr, _sfb) = ops.sb.device_ptr(stream);
    let (d_ptr, _d) = d.device_ptr_mut(stream);
    for (name, ptr) in [("A", a_ptr), ("B", b_ptr), ("D", d_ptr)] {
        need_aligned(name, ptr)?;
    }
    need_f32_aligned("sa", sfa_ptr)?;
    need_f32_aligned("sb", sfb_ptr)?;
    let (s_ptr, _s) = p.sorted_ids.device_ptr(stream);
    let (e_ptr, _e) = p.expert_ids.device_ptr(stream);
    let (t_ptr, _t) = p.total.device_ptr(stream);
    let (w_ptr, _w) = p.scatter.as_ref().map(|s| s.weights.device_ptr(stream)).unzip();
    let (bias_ptr, _bias) = p.scatter.as_ref().and_then(|s| s.bias).map(|b| b.device_ptr(stream)).unzip();
    let args = sys::FusedGemmFp8Args {
        tile,
        scales,
        mode: if p.scatter.is_some() { sys::FusedMode::Scatter } else { sys::FusedMode::Gather },
        top_k,
        experts,
        n,
        k,
        rows,
        sm_count: p.sm_count,
        capacity,
        a: a_ptr,
        sfa: sfa_ptr,
        b: b_ptr,
        sfb: sfb_ptr,
        d: d_ptr,
        sorted_ids: s_ptr,
        expert_ids: e_ptr,
        total: t_ptr,
        weights: w_ptr.unwrap_or(0),
        bias: bias_ptr.unwrap_or(0),
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: as for `launch_fused_gemm`, with 1-byte e4m3 A and B (k a multiple of 16: 16-byte rows, checked),
    // n whole N tiles (checked), and the scale grids checked above: sfa one f32 per A row per 128 of k, sfb one
    // per expert per 128 x 128 block (or sfa one per A row, sfb one per expert per channel); the kernel reads sfa
    // only for placed rows (A rows below a_rows) and sfb for live tiles (expert ids below `experts`) and
    // channels below n.
    let status = unsafe { ffi::fused_moe_gemm_fp8(&args) };
    check(status, &Launched { config: Some(&tile), ..Launched::op("fused_moe_gemm_fp8") })
}
