//! Fused MoE GEMMs on SM90: vLLM's `fused_moe` design on Hopper tensor cores, with no permuted copy of `x`.
//!
//! Both GEMMs run over an aligned [`ExpertLayout`] built with `block_m` equal to the tile's `BLOCK_M`, whose
//! every `BLOCK_M` tile of positions belongs to one expert (`expert_ids`) and whose `sorted_ids[p]` is the
//! flat row `r = t·k + j` of position `p` (the sentinel `T·k` on padding):
//!
//! - [`FusedGemm::gemm1_gather`]: `d1[p] = x[sorted_ids[p] / k] · W13[e]ᵀ`: A rows are gathered in the GEMM's
//!   loads (16-byte `cp.async` into the swizzled stages; TMA cannot gather rows); padding rows are zeros.
//! - [`FusedGemm::gemm2_scatter`]: `pairs[r] = w[r] · (round(h[p] · W2[e]ᵀ) + b2[e])`: the router weight and
//!   bias are applied in the epilogue, which writes each row straight to its flat row; the combine is a sum over
//!   k ([`sum_slots`]).
//!
//! A [`FusedGemm`] plan is made once per device: it reads the SM count and opts every compiled kernel into its
//! shared memory, so that a launch does no host work beyond checking its buffers.
//!
//! A persistent CTA walks `BLOCK_M x BLOCK_N` tiles: one producer warpgroup (A rows by 16-byte `cp.async`, B by
//! TMA, one mbarrier per stage counting both), one consumer warpgroup per 64 rows (CUTLASS's SM90 GMMA collective),
//! the epilogue straight from the accumulators while the producer runs into the next tile. Tiles past the batch
//! (read from the layout's device `total`) are skipped, so a captured CUDA graph replays for any routing.

#[allow(unsafe_code)] // floor 0: the launcher over the bridge
mod launch;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::device::DeviceInfo;
use crate::device::KernelFamily;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::experts::{Activation, GateUp};
use crate::ffi;
use crate::layouts::{ExpertLayout, LayoutSpec};
use crate::quant::{Fp8BlockWeights, Fp8ChannelWeights, Fp8Rows, Fp8TokenRows};
use half::bf16;
use launch::FusedFp8Scales;

/// A compiled tile of the fused GEMMs (`cpp/fused/launch.h`'s `FusedTile`).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedTile {
    /// Decode: 16 positions per layout block, `mma.sync` with the expert's weight rows on the MMA's M side and
    /// the positions on N ("swap AB", `cpp/fused/fused_decode.cu`); each warp streams 32 weight rows through its own
    /// `cp.async` ring, K split over up to 4 warps when the batch has few blocks. bf16/f16 only.
    Decode16,
    /// As [`Self::Decode16`] with 32 positions per block, the CTA's four warps sharing one copy of the block's
    /// positions per K step (mbarrier-synchronised, 5 stages); K is not split.
    Decode32,
    /// Skew-robust decode: a layout of 16-position blocks whose CTA takes up to eight adjacent blocks of one
    /// expert (by the layout's offsets), so that an expert's weights are streamed once per 128 of its rows while
    /// an expert with at most 16 rows costs the MMAs of 16 positions; Decode32's shared ring, and `wgmma` for
    /// runs of 3-8 blocks (64 or 128 positions). K is not split.
    DecodeMerged,
    /// 64 x 128 x 64, one consumer warpgroup: decode and small groups (half the padding of 128 rows).
    M64N128K64,
    /// 128 x 256 x 64, two consumer warpgroups: prefill.
    M128N256K64,
}

impl FusedTile {
    pub const ALL: [FusedTile; 5] = [
        FusedTile::Decode16,
        FusedTile::Decode32,
        FusedTile::DecodeMerged,
        FusedTile::M64N128K64,
        FusedTile::M128N256K64,
    ];

    /// The tile whose [`Self::name`] is `name`; the decode tiles also by their earlier names
    /// (`fused-swapab-16`, `-32`, `-merged`: the swap-AB MMA they use), which tables tuned before carry.
    pub fn by_name(name: &str) -> Option<FusedTile> {
        let name = match name {
            "fused-swapab-16" => "fused-decode-16",
            "fused-swapab-32" => "fused-decode-32",
            "fused-swapab-merged" => "fused-decode-merged",
            n => n,
        };
        FusedTile::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Rows of a tile: the `block_m` its aligned layout must have.
    pub const fn block_m(self) -> usize {
        match self {
            FusedTile::Decode16 => 16,
            FusedTile::Decode32 => 32,
            FusedTile::DecodeMerged => 16,
            FusedTile::M64N128K64 => 64,
            FusedTile::M128N256K64 => 128,
        }
    }

    /// CTA tile (M, N, K): positions, weight rows, K per step (for the decode tiles: per warp).
    pub const fn tile(self) -> (usize, usize, usize) {
        match self {
            FusedTile::Decode16 => (16, 32, 64),
            FusedTile::Decode32 => (32, 32, 64),
            FusedTile::DecodeMerged => (64, 32, 64),
            FusedTile::M64N128K64 => (64, 128, 64),
            FusedTile::M128N256K64 => (128, 256, 64),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            FusedTile::Decode16 => "fused-decode-16",
            FusedTile::Decode32 => "fused-decode-32",
            FusedTile::DecodeMerged => "fused-decode-merged",
            FusedTile::M64N128K64 => "fused-64x128x64",
            FusedTile::M128N256K64 => "fused-128x256x64",
        }
    }

    /// Whether an FP8 kernel of this tile's `BLOCK_M` exists (the decode tiles are bf16/f16 only).
    pub const fn has_fp8(self) -> bool {
        self.fp8_tile().is_some()
    }

    /// The tile for `rows` routed rows over `experts` experts, by the rows the average expert that receives any gets
    /// (r): [`Self::Decode16`] where r is at most 1, or below 8 on layers of fewer than 64 experts (its K split fills
    /// the SMs where the blocks are few); [`Self::DecodeMerged`] up to 16 (skew-robust: a hot expert's weights are
    /// streamed once per 128 of its rows); then as [`Self::for_rows_fp8`]. Measured on the H200 with each tile
    /// forced under uniform and zipf routing (`benches/results/h200-2026-12-02-swapab-merged/tiles.txt`): Decode16 is
    /// 1-7% ahead at T = 4-16 on most models, but behind under zipf by 3-6% at r = 4 and 13-27% at r = 8 (Qwen3-235B
    /// T = 128 zipf 1294 vs 1137 µs); from r = 2 the merged tile is within 1% of the best uniform tile on Qwen3-235B,
    /// gpt-oss and DeepSeek-V3 (2-3% behind Decode16 on Qwen3-30B at T = 32-64) and leads most zipf points (gpt-oss
    /// T = 64 zipf 786 vs 814, Qwen3-235B T = 64 zipf 934 vs 987); on Mixtral it trails Decode16 by 1-6% up to r = 4,
    /// and at r = 8 by 1.4% uniform while leading under zipf (T = 32 zipf 695 vs 820); at r = 32 the 64-row tile wins
    /// (Mixtral T = 128 751 vs 796).
    pub fn for_rows(rows: usize, experts: usize) -> FusedTile {
        let active = experts.min(rows).max(1);
        match rows / active {
            0..=1 => FusedTile::Decode16,
            2..=7 if experts < 64 => FusedTile::Decode16,
            2..=16 => FusedTile::DecodeMerged,
            _ => FusedTile::for_rows_fp8(rows, experts),
        }
    }

    /// The wgmma tile for `rows` routed rows over `experts` experts (the FP8 fused GEMMs have only these): 128 x
    /// 256 once the average expert that receives rows gets 64 or more of them, 64 x 128 below. Measured on the
    /// H200 (persistent kernel, 2026-11-29): at 32 rows per expert the 64-row tile wins everywhere (Qwen3-30B
    /// T=512 373 vs 428 µs, Mixtral T=128 729 vs 793, gpt-oss T=1024 1663 vs 1788); at 64 the 128 x 256 tile
    /// ties or wins (Mixtral T=256 808 vs 1034, gpt-oss T=2048 1884 vs 2196), its A tile costing half the L2
    /// traffic per FLOP of full 64-row tiles.
    pub fn for_rows_fp8(rows: usize, experts: usize) -> FusedTile {
        let active = experts.min(rows).max(1);
        if rows / active >= 64 {
            FusedTile::M128N256K64
        } else {
            FusedTile::M64N128K64
        }
    }
}

impl FusedTile {
    /// The FP8 kernel with this tile's `BLOCK_M` (so one aligned layout serves both): 64 x 64 x 128 for the
    /// 64-row tile, 128 x 128 x 128 for the 128-row one (TileK one scale block; see `cpp/fused/launch.h`);
    /// `None` for the decode tiles.
    pub const fn fp8_tile(self) -> Option<(usize, usize, usize)> {
        match self {
            FusedTile::M64N128K64 => Some((64, 64, 128)),
            FusedTile::M128N256K64 => Some((128, 128, 128)),
            FusedTile::Decode16 | FusedTile::Decode32 | FusedTile::DecodeMerged => None,
        }
    }
    fn fp8(self) -> Result<launch::FusedFp8Tile> {
        match self {
            FusedTile::M64N128K64 => Ok(launch::FusedFp8Tile::M64N64K128),
            FusedTile::M128N256K64 => Ok(launch::FusedFp8Tile::M128N128K128),
            FusedTile::Decode16 | FusedTile::Decode32 | FusedTile::DecodeMerged => Err(Error::InvalidProblem(format!(
                "{}: the decode tiles are bf16/f16 only; the FP8 fused GEMMs have the 64- and 128-row tiles",
                self.name()
            ))),
        }
    }
}

variants_into!(FusedTile => launch::FusedTile {
    Decode16 => SwapAb16, Decode32 => SwapAb32, DecodeMerged => SwapAbMerged, M64N128K64, M128N256K64
});

fn check_layout(b: &FusedBatch<'_>) -> Result<()> {
    let (tile, tokens, dims) = (b.tile, b.tokens, b.layout.dims());
    if dims.spec() != (LayoutSpec::Aligned { block_m: tile.block_m() }) {
        return Err(Error::InvalidProblem(format!(
            "{}: needs an aligned layout with block_m = {} (one expert per tile), got {:?}",
            tile.name(),
            tile.block_m(),
            dims.spec()
        )));
    }
    if tokens > dims.max_tokens() {
        return Err(Error::InvalidProblem(format!(
            "tokens = {tokens} exceeds the layout's max_tokens = {}",
            dims.max_tokens()
        )));
    }
    Ok(())
}

fn check_nk(n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 || n % 8 != 0 || k % 8 != 0 {
        return Err(Error::InvalidProblem(format!(
            "fused GEMM: n = {n} and k = {k} must be positive multiples of 8 (16-byte rows of 16-bit elements)"
        )));
    }
    Ok(())
}

/// One batch as every fused GEMM of a layer pass sees it: the stream, the tile, the aligned layout built for it
/// (`block_m` = the tile's `BLOCK_M`) and its token count.
#[derive(Clone, Copy, Debug)]
pub struct FusedBatch<'a> {
    stream: &'a Arc<CudaStream>,
    tile: FusedTile,
    layout: &'a ExpertLayout,
    tokens: usize,
    /// GEMM2 starts per layout block as GEMM1 writes it ([`FusedGemm::gated_pair`] only).
    handoff: bool,
    /// The topk_ids the layout was built from ([`Self::routed_by`]).
    topk: Option<&'a CudaView<'a, i32>>,
}

impl<'a> FusedBatch<'a> {
    /// The batch of `tokens` tokens whose aligned `layout` was last built on `stream`, run on `tile`: checked
    /// against one another by each GEMM it is given to.
    pub fn new(stream: &'a Arc<CudaStream>, tile: FusedTile, layout: &'a ExpertLayout, tokens: usize) -> Self {
        FusedBatch { stream, tile, layout, tokens, handoff: false, topk: None }
    }

    /// The topk_ids `[tokens, top_k]` the layout was built from, without an expert map: a hint that lets a
    /// Decode16 GEMM1 of at most 32 rows start its experts' weights towards L2 while the layout build still runs
    /// (`cpp/fused/fused_decode_guess.cuh`). No result depends on it: the GEMMs read the built layout, and ids that
    /// are out of range or stale cost bandwidth only.
    #[must_use]
    pub fn routed_by(self, topk_ids: &'a CudaView<'a, i32>) -> Self {
        FusedBatch { topk: Some(topk_ids), ..self }
    }
}

/// The fused GEMMs planned for one device: its SM count (the persistent grid) read once, and every compiled
/// kernel (both tiles, both element types) opted into its dynamic shared memory there.
#[derive(Clone, Debug)]
pub struct FusedGemm {
    device: DeviceInfo,
}

impl FusedGemm {
    /// Plans the fused GEMMs on the device of `stream`.
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the device is SM90; driver and CUDA errors.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let device = DeviceInfo::query(stream.context())?;
        device.require("fused_moe_gemm", KernelFamily::FusedMoeSm90)?;
        for tile in FusedTile::ALL {
            for dtype in [DType::BF16, DType::F16] {
                launch::prepare(stream, dtype, tile.into())?;
            }
            if tile.has_fp8() {
                launch::prepare_fp8(stream, tile.fp8()?)?;
            }
        }
        Ok(FusedGemm { device })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// GEMM1 with the gather fused into its loads: `d1[p, :n] = x[sorted_ids[p] / k] · w[e]ᵀ` for the batch
    /// `b`; `w` is `[local experts, n, kdim]`, `x` `[tokens, kdim]`, `d1` `[capacity, n]` in position order.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if the stream is on another device than the plan, the layout is not aligned to
    /// the tile, `n`/`kdim` are not multiples of 8; [`Error::Buffer`] for short or misaligned buffers; launch
    /// errors.
    pub fn gemm1_gather<T: Element>(
        &self,
        b: FusedBatch<'_>,
        x: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        (n, kdim): (usize, usize),
        d1: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check(&b, n, kdim)?;
        let launch = self.launch_params(&b, n, kdim, None);
        launch::launch_fused_gemm(b.stream, b.tile.into(), &launch, x, w, d1)
    }

    /// [`Self::gemm1_gather`] over `w13` (`n = 2I` rows per expert, `gate_up` their order) with the gated
    /// activation in the epilogue: `h[p, :I] = act(round(x[r / k] · gate) + b13, round(x[r / k] · up) + b13)` at
    /// the positions whose flat row `r = sorted_ids[p]` is in the batch, the function of the activation kernel
    /// bit for bit; no `d1` is written. The SwapAb tiles only (their warps hold a gate row and its up row in two
    /// MMA tiles); gated activations only.
    ///
    /// # Errors
    /// As [`Self::gemm1_gather`]; a warpgroup-MMA tile or the plain SiLU; `h` shorter than `capacity × I`.
    pub fn gemm1_gather_gated<T: Element>(
        &self,
        b: FusedBatch<'_>,
        (x, w13, b13): (&impl DevicePtr<T>, &impl DevicePtr<T>, Option<&CudaSlice<f32>>),
        (n, kdim): (usize, usize),
        (act, gate_up): (Activation, GateUp),
        h: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check(&b, n, kdim)?;
        if b.tile.has_fp8() || !act.gated() {
            return Err(Error::InvalidProblem(format!(
                "{}: the gated epilogue runs on the decode tiles with a gated activation (got {act:?})",
                b.tile.name()
            )));
        }
        let mut launch = self.launch_params(&b, n, kdim, None);
        launch.gated = Some(launch::FusedGated { act: act.into(), gate_up: gate_up.into(), bias: b13 });
        launch::launch_fused_gemm(b.stream, b.tile.into(), &launch, x, w13, h)
    }

    /// [`Self::gemm1_gather_gated`] then [`Self::gemm2_scatter`] over one layout, with nothing between (the
    /// layer's pass, the layout built just before): where GEMM2 is launched early (at most two waves), its CTAs
    /// of a layout block start once GEMM1 has written that block's h, counted in the layout's `block_ready`,
    /// instead of when all of GEMM1 has ended (the merged tile; `cpp/fused/fused_decode.cu` says where it pays).
    ///
    /// # Errors
    /// As the two GEMMs.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_pair<T: Element, H: DevicePtr<T> + DevicePtrMut<T>>(
        &self,
        b: FusedBatch<'_>,
        gemm1: (&impl DevicePtr<T>, &impl DevicePtr<T>, Option<&CudaSlice<f32>>),
        (hidden, inter): (usize, usize),
        act: (Activation, GateUp),
        h: &mut H,
        (w2, weights, b2): (&impl DevicePtr<T>, &CudaView<'_, f32>, Option<&CudaSlice<f32>>),
        pairs: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let b = FusedBatch { handoff: true, ..b };
        self.gemm1_gather_gated(b, gemm1, (2 * inter, hidden), act, h)?;
        self.gemm2_scatter(b, &*h, w2, (hidden, inter), (weights, b2), pairs)
    }

    /// GEMM2 with the router weight, the bias and the scatter fused into its epilogue:
    /// `pairs[r, :n] = weights[r] · (round(h[p] · w[e]ᵀ) + bias[e])` with `r = sorted_ids[p]`; `h` is
    /// `[capacity, kdim]` in position order, `pairs` `[tokens·k, n]` by flat row (rows of remote experts are not
    /// written). Sum the k rows of each token with [`sum_slots`].
    ///
    /// # Errors
    /// As [`Self::gemm1_gather`], and for `weights`/`bias` shorter than `tokens·k` / `experts·n`.
    pub fn gemm2_scatter<T: Element>(
        &self,
        b: FusedBatch<'_>,
        h: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        (n, kdim): (usize, usize),
        (weights, bias): (&CudaView<'_, f32>, Option<&CudaSlice<f32>>),
        pairs: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check(&b, n, kdim)?;
        let scatter = Some(launch::FusedScatter { weights, bias });
        let launch = self.launch_params(&b, n, kdim, scatter);
        launch::launch_fused_gemm(b.stream, b.tile.into(), &launch, h, w, pairs)
    }

    /// [`Self::gemm1_gather`] over block-FP8 operands: `x` quantised per token in 1 x 128 groups
    /// (`[tokens, kdim]`, [`crate::quant::quantize_rows`]), `w` e4m3 `[experts, n, kdim]` with 128 x 128 scales,
    /// bf16 `d1` `[capacity, n]`. The kernel is [`FusedTile::fp8_tile`]'s: `n` must be whole N tiles of it.
    ///
    /// # Errors
    /// As [`Self::gemm1_gather`]; `x` or `w` of another K, `w` of another N.
    pub fn gemm1_gather_fp8(
        &self,
        b: FusedBatch<'_>,
        x: &Fp8Rows,
        w: &Fp8BlockWeights,
        d1: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        self.check_batch(&b)?;
        check_fp8_operands((x.rows(), x.k()), (w.experts(), w.n(), w.k()), b.tokens, "x")?;
        let launch = self.launch_params(&b, w.n(), w.k(), None);
        let (xq, xs, wq, ws) = (x.q(), x.scales().as_view(), w.q(), w.scales());
        let ops = launch::FusedFp8Operands { a: &xq, sa: &xs, b: &wq, sb: &ws };
        launch::launch_fused_gemm_fp8(b.stream, (b.tile.fp8()?, FusedFp8Scales::Block128), &launch, ops, d1)
    }

    /// [`Self::gemm1_gather`] over per-channel FP8 operands: `x` quantised per token (`[tokens, kdim]`, one scale
    /// each, [`Fp8TokenRows::quantize`]), `w` e4m3 `[experts, n, kdim]` with one scale per output channel, bf16 `d1`
    /// `[capacity, n]`: `d1 = (x_q · wᵀ) · s_x[token] · s_w[channel]`.
    ///
    /// # Errors
    /// As [`Self::gemm1_gather_fp8`].
    pub fn gemm1_gather_fp8_channel(
        &self,
        b: FusedBatch<'_>,
        x: &Fp8TokenRows,
        w: &Fp8ChannelWeights,
        d1: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        self.check_batch(&b)?;
        check_fp8_operands((x.rows(), x.k()), (w.experts(), w.n(), w.k()), b.tokens, "x")?;
        let launch = self.launch_params(&b, w.n(), w.k(), None);
        let (xq, xs, wq, ws) = (x.q(), x.scales(), w.q(), w.scales());
        let ops = launch::FusedFp8Operands { a: &xq, sa: &xs, b: &wq, sb: &ws };
        launch::launch_fused_gemm_fp8(b.stream, (b.tile.fp8()?, FusedFp8Scales::Channel), &launch, ops, d1)
    }

    /// [`Self::gemm2_scatter`] over block-FP8 operands: `h` requantised per 1 x 128 in position order
    /// (`[capacity, kdim]`), `w` e4m3 `[experts, n, kdim]` with 128 x 128 scales, bf16 `pairs`.
    ///
    /// # Errors
    /// As [`Self::gemm2_scatter`]; `h` or `w` of another K, `h` of fewer rows than the layout's capacity.
    pub fn gemm2_scatter_fp8(
        &self,
        b: FusedBatch<'_>,
        h: &Fp8Rows,
        w: &Fp8BlockWeights,
        (weights, bias): (&CudaView<'_, f32>, Option<&CudaSlice<f32>>),
        pairs: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        self.check_batch(&b)?;
        check_fp8_operands((h.rows(), h.k()), (w.experts(), w.n(), w.k()), b.layout.dims().capacity(), "h")?;
        let scatter = Some(launch::FusedScatter { weights, bias });
        let launch = self.launch_params(&b, w.n(), w.k(), scatter);
        let (hq, hs, wq, ws) = (h.q(), h.scales().as_view(), w.q(), w.scales());
        let ops = launch::FusedFp8Operands { a: &hq, sa: &hs, b: &wq, sb: &ws };
        launch::launch_fused_gemm_fp8(b.stream, (b.tile.fp8()?, FusedFp8Scales::Block128), &launch, ops, pairs)
    }

    /// [`Self::gemm2_scatter`] over per-channel FP8 operands: `h` requantised per row in position order
    /// (`[capacity, kdim]`, one scale each), `w` e4m3 `[experts, n, kdim]` with one scale per output channel, bf16
    /// `pairs`.
    ///
    /// # Errors
    /// As [`Self::gemm2_scatter_fp8`].
    pub fn gemm2_scatter_fp8_channel(
        &self,
        b: FusedBatch<'_>,
        h: &Fp8TokenRows,
        w: &Fp8ChannelWeights,
        weights: &CudaView<'_, f32>,
        pairs: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        self.check_batch(&b)?;
        check_fp8_operands((h.rows(), h.k()), (w.experts(), w.n(), w.k()), b.layout.dims().capacity(), "h")?;
        let scatter = Some(launch::FusedScatter { weights, bias: None });
        let launch = self.launch_params(&b, w.n(), w.k(), scatter);
        let (hq, hs, wq, ws) = (h.q(), h.scales(), w.q(), w.scales());
        let ops = launch::FusedFp8Operands { a: &hq, sa: &hs, b: &wq, sb: &ws };
        launch::launch_fused_gemm_fp8(b.stream, (b.tile.fp8()?, FusedFp8Scales::Channel), &launch, ops, pairs)
    }

    fn check(&self, b: &FusedBatch<'_>, n: usize, kdim: usize) -> Result<()> {
        self.check_batch(b)?;
        check_nk(n, kdim)
    }

    fn check_batch(&self, b: &FusedBatch<'_>) -> Result<()> {
        self.check_device(b.stream)?;
        check_layout(b)
    }

    fn check_device(&self, stream: &CudaStream) -> Result<()> {
        let ordinal = stream.context().ordinal();
        if ordinal != self.device.ordinal {
            return Err(Error::InvalidProblem(format!(
                "fused GEMM planned for device {} ({}) launched on a stream of device {ordinal}",
                self.device.ordinal, self.device.name
            )));
        }
        Ok(())
    }

    fn launch_params<'a>(
        &self,
        b: &FusedBatch<'a>,
        n: usize,
        kdim: usize,
        scatter: Option<launch::FusedScatter<'a>>,
    ) -> launch::FusedLaunch<'a> {
        let (layout, dims) = (b.layout, b.layout.dims());
        launch::FusedLaunch {
            scatter,
            gated: None,
            top_k: dims.top_k(),
            experts: dims.local_experts(),
            n,
            k: kdim,
            rows: b.tokens * dims.top_k(),
            capacity: dims.capacity(),
            sm_count: self.device.sm_count,
            sorted_ids: layout.sorted_ids(),
            expert_ids: layout.expert_ids(),
            offsets: layout.offsets(),
            total: layout.total(),
            ready: b.handoff.then(|| layout.block_ready()),
            topk_ids: b.topk,
        }
    }
}

/// An FP8 operand's `[rows, K]` (`rows` used) against its weights' `[experts, N, K]`.
fn check_fp8_operands(a: (usize, usize), w: (usize, usize, usize), rows: usize, name: &str) -> Result<()> {
    if a.1 != w.2 || a.0 < rows {
        return Err(Error::InvalidProblem(format!(
            "FP8 fused GEMM: {name} is [{}, {}], the weights [{}, {}, {}]: need K equal and at least {rows} rows",
            a.0, a.1, w.0, w.1, w.2
        )));
    }
    Ok(())
}

/// `y[t] = Σ_j pairs[t·k + j]` over the slots `layout` placed: the fused backend's combine.
///
/// # Errors
/// [`Error::Buffer`] for short or misaligned buffers; `hidden` not a multiple of 8; launch errors.
pub fn sum_slots<T: Element>(
    stream: &Arc<CudaStream>,
    layout: &ExpertLayout,
    tokens: usize,
    hidden: usize,
    pairs: &impl DevicePtr<T>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    ffi::elementwise::launch_sum_slots(stream, tokens, layout.dims().top_k(), hidden, pairs, layout.positions(), y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_agree_with_the_compiled_kernels() {
        for t in FusedTile::ALL {
            assert_eq!(launch::block_m(t.into()), t.block_m(), "{}", t.name());
        }
    }
}
