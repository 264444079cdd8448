//! [`ExpertLayout`]: the device buffers of one layout, sized once for a maximum token count.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use super::GroupRows;
use crate::device::DeviceInfo;
use crate::device::KernelFamily;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi::layouts as ffi;
use crate::status::DeviceStatus;

/// Which layout to build.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutSpec {
    /// Experts back to back, no padding.
    Grouped,
    /// Each expert padded to a multiple of `block_m` (vLLM align; DeepGEMM contiguous with 128).
    Aligned { block_m: usize },
    /// Fixed capacity `max_m` rows per expert.
    Masked { max_m: usize },
}

/// Most local experts a layout handles (the build kernel keeps per-expert counters in shared memory).
pub const MAX_LAYOUT_EXPERTS: usize = 1024;

/// The validated dimensions of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutDims {
    pub(crate) spec: LayoutSpec,
    pub(crate) max_tokens: usize,
    pub(crate) top_k: usize,
    pub(crate) experts: usize,
    pub(crate) local_experts: usize,
}

impl LayoutDims {
    /// `experts` is the range of `topk_ids`; `local_experts` the range of the `expert_map` (equal to `experts`
    /// without expert parallelism).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: positive sizes, `local_experts <= experts <= 2^31`,
    /// `local_experts <= 1024`, `block_m >= 1`, `max_m >= 1`, and capacities that fit int32 positions.
    pub fn new(
        spec: LayoutSpec,
        max_tokens: usize,
        top_k: usize,
        experts: usize,
        local_experts: usize,
    ) -> Result<Self> {
        let bad = |s: String| Err(Error::InvalidProblem(s));
        if max_tokens == 0 || top_k == 0 || experts == 0 || local_experts == 0 {
            return bad(format!(
                "max_tokens = {max_tokens}, top_k = {top_k}, experts = {experts}, local_experts = {local_experts}: all must be positive"
            ));
        }
        if local_experts > experts || local_experts > MAX_LAYOUT_EXPERTS {
            return bad(format!(
                "local_experts = {local_experts}: must be <= experts ({experts}) and <= {MAX_LAYOUT_EXPERTS}"
            ));
        }
        if top_k > experts {
            return bad(format!("top_k = {top_k} exceeds experts = {experts}"));
        }
        match spec {
            LayoutSpec::Aligned { block_m: 0 } => return bad("block_m = 0: must be >= 1".into()),
            LayoutSpec::Masked { max_m: 0 } => return bad("max_m = 0: must be >= 1".into()),
            _ => {}
        }
        let dims = LayoutDims { spec, max_tokens, top_k, experts, local_experts };
        let rows = max_tokens.checked_mul(top_k);
        let cap = rows.and_then(|r| match spec {
            LayoutSpec::Grouped => Some(r),
            LayoutSpec::Aligned { block_m } => {
                r.checked_add(local_experts.min(r).checked_mul(block_m - 1)?)?.checked_next_multiple_of(block_m)
            }
            LayoutSpec::Masked { max_m } => local_experts.checked_mul(max_m),
        });
        if cap.is_none_or(|c| c > i32::MAX as usize) {
            return bad(format!("the layout's capacity overflows int32 positions ({dims:?})"));
        }
        Ok(dims)
    }

    /// Rows of the layout buffer: every position the layout can use.
    /// Grouped: `T·k`; aligned: `T·k + min(E, T·k)·(block_m − 1)` rounded up to `block_m` (at most `T·k`
    /// experts receive rows, each padded by at most `block_m − 1`); masked: `E·max_m`.
    pub fn capacity(&self) -> usize {
        let rows = self.max_tokens * self.top_k;
        match self.spec {
            LayoutSpec::Grouped => rows,
            LayoutSpec::Aligned { block_m } => {
                (rows + self.local_experts.min(rows) * (block_m - 1)).next_multiple_of(block_m)
            }
            LayoutSpec::Masked { max_m } => self.local_experts * max_m,
        }
    }

    /// The tile height of the layout (1 for grouped and masked).
    pub fn block_m(&self) -> usize {
        match self.spec {
            LayoutSpec::Aligned { block_m } => block_m,
            _ => 1,
        }
    }

    pub fn spec(&self) -> LayoutSpec {
        self.spec
    }
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    pub fn experts(&self) -> usize {
        self.experts
    }
    pub fn local_experts(&self) -> usize {
        self.local_experts
    }
}

/// The device buffers of one expert layout, rebuilt on the device for every batch.
#[derive(Debug)]
pub struct ExpertLayout {
    dims: LayoutDims,
    counts: CudaSlice<i32>,
    offsets: CudaSlice<i32>,
    sorted_ids: CudaSlice<i32>,
    expert_ids: CudaSlice<i32>,
    /// Per tile: the Fused decode GEMMs' GEMM1 -> GEMM2 hand-off counters, zeroed by every build.
    block_ready: CudaSlice<i32>,
    m_indices: CudaSlice<i32>,
    positions: CudaSlice<i32>,
    total: CudaSlice<i32>,
    /// Per-chunk counts of the multi-CTA build (large batches).
    scratch: CudaSlice<i32>,
}

/// int32 elements of scratch the layout build needs for `rows` flat rows over `local_experts` experts (at least 1).
pub(crate) fn build_scratch_ints(rows: usize, local_experts: usize) -> usize {
    ffi::layout_scratch_ints(rows, local_experts).max(1)
}

/// The buffer lengths an [`ExpertLayout`] was allocated with: any layout whose dims fit them can be built in it
/// (one layout buffer in a shared scratch serves every layer and backend in turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayoutRoom {
    pub groups: usize,
    pub rows: usize,
    pub tiles: usize,
    pub positions: usize,
    pub scratch_ints: usize,
}

impl LayoutRoom {
    pub(crate) fn of(dims: &LayoutDims) -> LayoutRoom {
        let cap = dims.capacity();
        LayoutRoom {
            groups: dims.local_experts,
            rows: cap,
            tiles: cap / dims.block_m(),
            positions: dims.max_tokens * dims.top_k,
            scratch_ints: build_scratch_ints(dims.max_tokens * dims.top_k, dims.local_experts),
        }
    }

    fn check_fits(&self, dims: &LayoutDims) -> Result<()> {
        let need = LayoutRoom::of(dims);
        for (name, have, want) in [
            ("experts", self.groups, need.groups),
            ("positions (capacity)", self.rows, need.rows),
            ("tiles", self.tiles, need.tiles),
            ("flat rows (tokens x k)", self.positions, need.positions),
            ("build scratch", self.scratch_ints, need.scratch_ints),
        ] {
            if have < want {
                return Err(Error::InvalidProblem(format!(
                    "layout capacity: {dims:?} needs {want} {name}, the layout buffers hold {have}"
                )));
            }
        }
        Ok(())
    }
}

impl ExpertLayout {
    /// Allocates buffers of `room` for layouts of `dims` (and later any dims that fit, see [`Self::reshape`]).
    pub(crate) fn with_room(stream: &Arc<CudaStream>, room: LayoutRoom, dims: LayoutDims) -> Result<Self> {
        room.check_fits(&dims)?;
        DeviceInfo::query(stream.context())?.require("expert layouts", KernelFamily::Layouts)?;
        Ok(ExpertLayout {
            dims,
            counts: stream.alloc_zeros(room.groups)?,
            offsets: stream.alloc_zeros(room.groups + 1)?,
            sorted_ids: stream.alloc_zeros(room.rows)?,
            expert_ids: stream.alloc_zeros(room.tiles.max(1))?,
            block_ready: stream.alloc_zeros(room.tiles.max(1))?,
            m_indices: stream.alloc_zeros(room.rows)?,
            positions: stream.alloc_zeros(room.positions)?,
            total: stream.alloc_zeros(1)?,
            scratch: stream.alloc_zeros(room.scratch_ints)?,
        })
    }

    /// Re-targets the buffers at layouts of `dims` (host only; the next [`Self::build`] fills them).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the buffer `dims` does not fit.
    pub(crate) fn reshape(&mut self, dims: LayoutDims) -> Result<()> {
        let room = LayoutRoom {
            groups: self.counts.len(),
            rows: self.sorted_ids.len().min(self.m_indices.len()),
            tiles: self.expert_ids.len().min(self.block_ready.len()),
            positions: self.positions.len(),
            scratch_ints: self.scratch.len(),
        };
        room.check_fits(&dims)?;
        self.dims = dims;
        Ok(())
    }

    /// Device bytes of the layout's buffers.
    pub(crate) fn bytes(&self) -> usize {
        [
            &self.counts,
            &self.offsets,
            &self.sorted_ids,
            &self.expert_ids,
            &self.block_ready,
            &self.m_indices,
            &self.positions,
            &self.total,
            &self.scratch,
        ]
        .iter()
        .map(|b| b.num_bytes())
        .sum()
    }

    /// Allocates the layout's buffers on `stream` (outside the launch path).
    ///
    /// # Errors
    /// [`Error::UnsupportedArch`] unless the layout kernels were built for the device (SM90, SM100); allocation
    /// errors.
    pub fn new(stream: &Arc<CudaStream>, dims: LayoutDims) -> Result<Self> {
        DeviceInfo::query(stream.context())?.require("expert layouts", KernelFamily::Layouts)?;
        let cap = dims.capacity();
        Ok(ExpertLayout {
            dims,
            counts: stream.alloc_zeros(dims.local_experts)?,
            offsets: stream.alloc_zeros(dims.local_experts + 1)?,
            sorted_ids: stream.alloc_zeros(cap)?,
            expert_ids: stream.alloc_zeros(cap / dims.block_m())?,
            block_ready: stream.alloc_zeros(cap / dims.block_m())?,
            m_indices: stream.alloc_zeros(cap)?,
            positions: stream.alloc_zeros(dims.max_tokens * dims.top_k)?,
            total: stream.alloc_zeros(1)?,
            scratch: stream
                .alloc_zeros(ffi::layout_scratch_ints(dims.max_tokens * dims.top_k, dims.local_experts).max(1))?,
        })
    }

    pub fn dims(&self) -> &LayoutDims {
        &self.dims
    }

    /// Builds the layout of `tokens` tokens' `topk_ids [tokens, k]` (one kernel, no host synchronisation).
    /// `expert_map [experts]` maps a global expert to its local id or −1 (on another device).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `tokens > max_tokens`; [`Error::Buffer`] for short inputs; launch errors.
    /// Invalid ids and capacity overflow are reported through `status`.
    pub fn build(
        &mut self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        topk_ids: &impl DevicePtr<i32>,
        expert_map: Option<&CudaView<'_, i32>>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        if expert_map.is_none() && self.dims.local_experts != self.dims.experts {
            return Err(Error::Buffer {
                name: "expert_map",
                detail: format!(
                    "required: the layout has {} local of {} experts",
                    self.dims.local_experts, self.dims.experts
                ),
            });
        }
        let out = ffi::LayoutOut {
            counts: &mut self.counts,
            offsets: &mut self.offsets,
            sorted_ids: &mut self.sorted_ids,
            expert_ids: &mut self.expert_ids,
            block_ready: &mut self.block_ready,
            m_indices: &mut self.m_indices,
            positions: &mut self.positions,
            total: &mut self.total,
            scratch: &mut self.scratch,
        };
        ffi::launch_build_layout(stream, &self.dims.to_ffi(), tokens, topk_ids, expert_map, out, status.word_mut())
    }

    /// Copies each token row of `x [tokens, hidden]` to the position of each of its k rows in
    /// `out [capacity, hidden]`. Padding rows of `out` are left as they were: no GEMM of this crate reads them.
    pub fn gather<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        hidden: usize,
        x: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
        status: &mut DeviceStatus,
    ) -> Result<()> {
        self.check_tokens(tokens)?;
        if out.len() < self.dims.capacity() * hidden {
            return Err(Error::Buffer {
                name: "out",
                detail: format!(
                    "holds {} elements, needs capacity x hidden = {}",
                    out.len(),
                    self.dims.capacity() * hidden
                ),
            });
        }
        ffi::launch_gather(stream, tokens, self.dims.top_k, hidden, x, &self.positions, out, status.word_mut())
    }

    /// `y[t] = Σ_j topk_weights[t, j] · d[position(t·k + j)]`, summed in f32 and rounded once; rows dropped by
    /// the layout (remote experts) contribute nothing.
    pub fn combine<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        tokens: usize,
        hidden: usize,
        d: &impl DevicePtr<T>,
        topk_weights: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_tokens(tokens)?;
        ffi::launch_combine(stream, tokens, self.dims.top_k, hidden, d, hidden, &self.positions, topk_weights, None, y)
    }

    fn check_tokens(&self, tokens: usize) -> Result<()> {
        if tokens > self.dims.max_tokens {
            return Err(Error::InvalidProblem(format!(
                "tokens = {tokens} exceeds the layout's max_tokens = {}",
                self.dims.max_tokens
            )));
        }
        Ok(())
    }

    /// The groups of this layout for the grouped GEMM (whose `max_rows` must be at least
    /// [`LayoutDims::capacity`]).
    pub fn group_rows(&self) -> GroupRows<'_> {
        match self.dims.spec {
            LayoutSpec::Grouped => GroupRows::Offsets(self.offsets.as_view()),
            LayoutSpec::Aligned { .. } => {
                GroupRows::Padded { offsets: self.offsets.as_view(), counts: self.counts.as_view() }
            }
            LayoutSpec::Masked { max_m } => GroupRows::Masked { masked_m: self.counts.as_view(), max_m },
        }
    }

    /// int32 `[local_experts]`: rows per expert (`masked_m` for the masked layout, clamped to `max_m`).
    pub fn counts(&self) -> &CudaSlice<i32> {
        &self.counts
    }
    /// int32 `[local_experts + 1]`: (padded) start of each expert; the last entry is the padded total.
    pub fn offsets(&self) -> &CudaSlice<i32> {
        &self.offsets
    }
    /// int32 `[capacity]`: the flat row at each position, `tokens·k` on padding (vLLM's `sorted_token_ids`).
    pub fn sorted_ids(&self) -> &CudaSlice<i32> {
        &self.sorted_ids
    }
    /// int32 `[capacity / block_m]`: the local expert of each tile, −1 past the last one (vLLM's `expert_ids`).
    pub fn expert_ids(&self) -> &CudaSlice<i32> {
        &self.expert_ids
    }
    /// int32 `[capacity / block_m]`, zeroed by every build: the Fused backend's per-tile count of the h columns
    /// GEMM1 has written, which its early GEMM2 waits on ([`crate::kernels::fused::FusedGemm::gated_pair`]).
    pub fn block_ready(&self) -> &CudaSlice<i32> {
        &self.block_ready
    }
    /// int32 `[capacity]`: the local expert of each position, −1 on padding (DeepGEMM's `m_indices`).
    pub fn m_indices(&self) -> &CudaSlice<i32> {
        &self.m_indices
    }
    /// int32 `[max_tokens·k]`: the position of each flat row, −1 if dropped.
    pub fn positions(&self) -> &CudaSlice<i32> {
        &self.positions
    }
    /// int32 `[1]`: positions in use, padding included (vLLM's `num_tokens_post_padded`).
    pub fn total(&self) -> &CudaSlice<i32> {
        &self.total
    }
}
