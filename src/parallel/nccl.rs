//! The expert-parallel step over NCCL ([`ExpertParallel`]): dispatch, the local experts, combine, on one
//! rank's stream, without a host read of any count (graph-capturable as NCCL ≥ 2.9 captures).
//!
//! Per step, for `T` tokens with `topk_ids [T, k]` (global ids) and `topk_weights [T, k]`:
//!
//! 1. a masked layout over the `world` ranks (`ExpertLayout`, the expert map sending each expert to its owner)
//!    places each (token, slot) row at `dest · cap + i`, stable in (token, slot) order per destination; the row
//!    gather copies `x[t]` there and `ep_gather_ids` writes its global expert id (padding: the sentinel `E`);
//! 2. NCCL: block `d` of the send buffers (`cap` rows and ids) goes to rank `d`; block `s` of the receive
//!    buffers comes from rank `s` (one send and one receive per peer, in one group);
//! 3. the local `MoeLayer` (with the expert map of this rank's experts, the sentinel mapped to no expert) runs
//!    the `world · cap` received rows as tokens of top-1 routing with weight 1: padding rows are dropped by its
//!    layout and come out as zeros;
//! 4. NCCL: the result blocks go back the way they came;
//! 5. the layout's combine: `y[t] = Σ_j w[t, j] · back[position(t, j)]` in f32, rounded once.
//!
//! `cap = max_tokens · min(k, the most experts a rank holds)` rows per (source, destination) pair is the
//! worst case (`parallel`'s module docs), so no row is ever dropped and the transfers have fixed sizes. What it
//! computes is [`crate::reference::ep_forward_reference`]. Replicated experts (`Placement::from_map` with several slots
//! for one expert) are refused: the device dispatch sends every row of an expert to one rank.
//!
//! Tested on one H200 with a communicator of one rank (the send and receive are to itself), also replayed in a
//! CUDA graph; two ranks have not run: no two-GPU machine was lent.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{group_end, group_start, Comm, NcclType};

use super::Placement;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ffi;
use crate::layer::{ExpertWeights, MoeLayer, MoeLayerOptions, MoeScratch};
use crate::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
use crate::status::DeviceStatus;
use crate::view::{MatrixView, MatrixViewMut};

fn nccl(op: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error {
    move |e| Error::Nccl { op, status: format!("{e:?}") }
}

/// One rank's expert-parallel MoE layer: its communicator, its experts' layer and every buffer of the step,
/// sized at construction (the step allocates nothing).
pub struct ExpertParallel<T: Element + NcclType> {
    comm: Comm,
    rank: usize,
    world: usize,
    experts: usize,
    top_k: usize,
    hidden: usize,
    max_tokens: usize,
    cap: usize,
    dest: CudaSlice<i32>,
    layout: ExpertLayout,
    layer: MoeLayer<T>,
    scratch: MoeScratch<T>,
    send_x: CudaSlice<T>,
    recv_x: CudaSlice<T>,
    recv_y: CudaSlice<T>,
    back: CudaSlice<T>,
    send_ids: CudaSlice<i32>,
    recv_ids: CudaSlice<i32>,
    ones: CudaSlice<f32>,
    status: DeviceStatus,
    /// Tokens of the last dispatch (what the combine sums back).
    tokens: usize,
}

impl<T: Element + NcclType> std::fmt::Debug for ExpertParallel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertParallel")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("experts", &self.experts)
            .field("top_k", &self.top_k)
            .field("hidden", &self.hidden)
            .field("block_rows", &self.cap)
            .finish_non_exhaustive()
    }
}

impl<T: Element + NcclType> ExpertParallel<T> {
    /// The layer of rank `comm.rank()` of `placement` over `weights` (this rank's experts, in local-id order:
    /// [`Placement::local_weights`]), for at most `max_tokens` tokens per rank and step with top-`top_k`
    /// routing.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the numbers: a placement for another world size, replicated experts,
    /// weights holding another number of experts than the rank's, a shared expert in the weights (run it on the
    /// token's home rank); as [`MoeLayer::with_expert_map`]; driver errors.
    pub fn new(
        comm: Comm,
        placement: &Placement,
        weights: Arc<ExpertWeights<T>>,
        max_tokens: usize,
        top_k: usize,
    ) -> Result<Self> {
        Self::with_block_rows(comm, placement, weights, max_tokens, top_k, None)
    }

    /// As [`Self::new`] with `block_rows` rows per (source, destination) block instead of the worst case
    /// `max_tokens · min(k, experts per rank)`: DeepEP's `num_max_dispatch_tokens_per_rank`. The worst case pads
    /// every transfer to it (DeepSeek-V3 over 8 ranks at 4096 tokens: 3.5 GiB per step and rank where uniform
    /// routing moves 448 MiB; `moe-gemm plan --ep 8` prints both); a smaller block moves less, and a batch whose
    /// rows for one rank exceed it has them dropped **and reported**: the dispatch layout sets the status bit
    /// `CAPACITY_OVERFLOW` that [`Self::check`] reads, never silently. Not run on a GPU.
    ///
    /// # Errors
    /// As [`Self::new`]; `block_rows` 0 or above the worst case.
    pub fn with_block_rows(
        comm: Comm,
        placement: &Placement,
        weights: Arc<ExpertWeights<T>>,
        max_tokens: usize,
        top_k: usize,
        block_rows: Option<usize>,
    ) -> Result<Self> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let bad = |s: String| Err(Error::InvalidProblem(s));
        if placement.world() != world {
            return bad(format!("placement for {} ranks, communicator of {world}", placement.world()));
        }
        let experts = placement.experts();
        if let Some(e) = (0..experts).find(|&e| placement.replicas(e).len() != 1) {
            return bad(format!(
                "expert {e} has {} replicas: the device dispatch sends every row of an expert to one rank",
                placement.replicas(e).len()
            ));
        }
        if weights.experts() != placement.local_experts(rank) || weights.shared_groups() != 0 {
            return bad(format!(
                "rank {rank}: weights hold {} experts and {} shared groups, the placement gives it {} experts and \
                 the step no shared expert",
                weights.experts(),
                weights.shared_groups(),
                placement.local_experts(rank)
            ));
        }
        if top_k == 0 || max_tokens == 0 || top_k > experts {
            return bad(format!("max_tokens = {max_tokens}, top_k = {top_k} of {experts} experts"));
        }
        let stream = comm.stream();
        let hidden = weights.hidden();
        let worst = max_tokens * top_k.min(placement.max_local_experts());
        let cap = block_rows.unwrap_or(worst);
        if cap == 0 || cap > worst {
            return bad(format!(
                "block_rows = {cap}: between 1 and the worst case max_tokens x min(k, experts per rank) = {worst}"
            ));
        }
        let rows = world * cap;
        let owner: Vec<i32> = (0..experts).map(|e| placement.replicas(e)[0].rank as i32).collect();
        let dest = stream.clone_htod(&owner)?;
        let dims = LayoutDims::new(LayoutSpec::Masked { max_m: cap }, max_tokens, top_k, experts, world)?;
        let layout = ExpertLayout::new(&stream, dims)?;
        // Global ids 0..E, and the padding sentinel E, which no rank holds.
        let mut map = placement.expert_map(rank);
        map.push(-1);
        let layer = MoeLayer::with_expert_map(&stream, weights, MoeLayerOptions::new(rows, 1), &map)?;
        let scratch = MoeScratch::for_layers(&stream, [&layer])?;
        Ok(ExpertParallel {
            rank,
            world,
            experts,
            top_k,
            hidden,
            max_tokens,
            cap,
            dest,
            layout,
            layer,
            scratch,
            send_x: stream.alloc_zeros(rows * hidden)?,
            recv_x: stream.alloc_zeros(rows * hidden)?,
            recv_y: stream.alloc_zeros(rows * hidden)?,
            back: stream.alloc_zeros(rows * hidden)?,
            send_ids: stream.alloc_zeros(rows)?,
            recv_ids: stream.alloc_zeros(rows)?,
            ones: stream.clone_htod(&vec![1f32; rows])?,
            status: DeviceStatus::new(&stream)?,
            tokens: 0,
            comm,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world(&self) -> usize {
        self.world
    }
    /// Rows per (source, destination) block of the exchange buffers.
    pub fn block_rows(&self) -> usize {
        self.cap
    }
    /// The communicator the step exchanges over (for the caller's own collectives on the same ranks).
    pub fn comm(&self) -> &Comm {
        &self.comm
    }
    /// Gives the communicator back (a step for another shape can then be built on it).
    pub fn into_comm(self) -> Comm {
        self.comm
    }
    /// The stream every call of the step is queued on (the communicator's).
    pub fn stream(&self) -> Arc<CudaStream> {
        self.comm.stream()
    }
    /// Device bytes of the step's own buffers (the local layer's scratch included, its weights not).
    pub fn bytes(&self) -> usize {
        let rows = self.world * self.cap;
        4 * rows * self.hidden * std::mem::size_of::<T>()
            + 3 * rows * 4
            + self.dest.len() * 4
            + self.layout.bytes()
            + self.scratch.bytes()
    }

    /// One step for this rank's `x [T, H]`, `topk_ids [T, k]` (global ids), `topk_weights [T, k]` into
    /// `y [T, H]`: [`Self::dispatch`], [`Self::experts`], [`Self::combine`]. Every rank of the communicator must
    /// call it (with its own tokens, `T` may be 0 on some).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] / [`Error::Buffer`] naming the input that does not fit (before anything is
    /// queued); NCCL and launch errors. Invalid ids are reported by the device status ([`Self::check`]).
    pub fn forward(
        &mut self,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        y: &mut MatrixViewMut<'_, T>,
    ) -> Result<()> {
        self.check_inputs(x, topk_ids, topk_weights, y)?;
        self.dispatch(x, topk_ids)?;
        self.experts()?;
        self.combine(topk_weights, y)
    }

    fn check_inputs(
        &self,
        x: &MatrixView<'_, T>,
        topk_ids: &MatrixView<'_, i32>,
        topk_weights: &MatrixView<'_, f32>,
        y: &MatrixViewMut<'_, T>,
    ) -> Result<()> {
        let t = x.rows();
        let (h, k) = (self.hidden, self.top_k);
        let shape_ok = x.cols() == h
            && (topk_ids.rows(), topk_ids.cols()) == (t, k)
            && (topk_weights.rows(), topk_weights.cols()) == (t, k)
            && (y.rows(), y.cols()) == (t, h);
        if !shape_ok || t > self.max_tokens {
            return Err(Error::InvalidProblem(format!(
                "expert-parallel step: x [{t}, {}], topk_ids [{}, {}], topk_weights [{}, {}], y [{}, {}]: the layer \
                 takes [T, {h}], [T, {k}], [T, {k}], [T, {h}] with T <= {}",
                x.cols(),
                topk_ids.rows(),
                topk_ids.cols(),
                topk_weights.rows(),
                topk_weights.cols(),
                y.rows(),
                y.cols(),
                self.max_tokens
            )));
        }
        for (name, packed) in [
            ("x", x.stride() == h || t <= 1),
            ("topk_ids", topk_ids.stride() == k || t <= 1),
            ("topk_weights", topk_weights.stride() == k || t <= 1),
            ("y", y.stride() == h || t <= 1),
        ] {
            if !packed {
                return Err(Error::Buffer { name, detail: "strided rows: the step reads packed rows".into() });
            }
        }
        Ok(())
    }

    /// Phase 1 of the step: the rows and their ids laid out by destination rank and exchanged (steps 1-2 of
    /// the module docs). The phases run in order on [`Self::stream`]; [`Self::forward`] runs all three.
    ///
    /// # Errors
    /// As [`Self::forward`] (`x` and `topk_ids` checked alone).
    pub fn dispatch(&mut self, x: &MatrixView<'_, T>, topk_ids: &MatrixView<'_, i32>) -> Result<()> {
        let (t, h, k) = (x.rows(), self.hidden, self.top_k);
        if x.cols() != h || (topk_ids.rows(), topk_ids.cols()) != (t, k) || t > self.max_tokens {
            return Err(Error::InvalidProblem(format!(
                "expert-parallel dispatch: x [{t}, {}], topk_ids [{}, {}]: the step takes [T, {h}], [T, {k}] with \
                 T <= {}",
                x.cols(),
                topk_ids.rows(),
                topk_ids.cols(),
                self.max_tokens
            )));
        }
        if (x.stride() != h || topk_ids.stride() != k) && t > 1 {
            return Err(Error::Buffer { name: "x", detail: "strided rows: the step reads packed rows".into() });
        }
        let stream = self.comm.stream();
        let (rows, block) = (self.world * self.cap, self.cap);
        let sentinel = self.experts as i32;
        self.tokens = t;
        let dest = self.dest.as_view();
        self.layout.build(&stream, t, &topk_ids.as_view(), Some(&dest), &mut self.status)?;
        self.layout.gather(&stream, t, h, &x.as_view(), &mut self.send_x, &mut self.status)?;
        ffi::ep::launch_gather_ids(
            &stream,
            rows,
            t * k,
            self.layout.sorted_ids(),
            &topk_ids.as_view(),
            sentinel,
            &mut self.send_ids,
        )?;
        exchange(&self.comm, self.world, block * h, &self.send_x, &mut self.recv_x)?;
        exchange(&self.comm, self.world, block, &self.send_ids, &mut self.recv_ids)
    }

    /// Phase 2: the local experts over every received row (step 3).
    ///
    /// # Errors
    /// Launch errors of the local layer.
    pub fn experts(&mut self) -> Result<()> {
        let stream = self.comm.stream();
        let (rows, h) = (self.world * self.cap, self.hidden);
        let xv = MatrixView::new("received rows", self.recv_x.as_view(), rows, h)?;
        let iv = MatrixView::new("received ids", self.recv_ids.as_view(), rows, 1)?;
        let wv = MatrixView::new("ones", self.ones.as_view(), rows, 1)?;
        let mut yv = MatrixViewMut::new("results", self.recv_y.as_view_mut(), rows, h)?;
        self.layer.forward(&stream, &mut self.scratch, &xv, &iv, &wv, &mut yv)
    }

    /// Phase 3: the results sent back and summed over k in slot order (steps 4-5), for the tokens of the last
    /// [`Self::dispatch`].
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `topk_weights` or `y` is not for those tokens; NCCL and launch errors.
    pub fn combine(&mut self, topk_weights: &MatrixView<'_, f32>, y: &mut MatrixViewMut<'_, T>) -> Result<()> {
        let (t, h, k) = (self.tokens, self.hidden, self.top_k);
        if (topk_weights.rows(), topk_weights.cols()) != (t, k) || (y.rows(), y.cols()) != (t, h) {
            return Err(Error::InvalidProblem(format!(
                "expert-parallel combine: topk_weights [{}, {}], y [{}, {}] after a dispatch of {t} tokens: the \
                 step takes [{t}, {k}], [{t}, {h}]",
                topk_weights.rows(),
                topk_weights.cols(),
                y.rows(),
                y.cols()
            )));
        }
        if (topk_weights.stride() != k || y.stride() != h) && t > 1 {
            return Err(Error::Buffer { name: "y", detail: "strided rows: the step reads packed rows".into() });
        }
        let stream = self.comm.stream();
        exchange(&self.comm, self.world, self.cap * h, &self.recv_y, &mut self.back)?;
        self.layout.combine(&stream, t, h, &self.back, &topk_weights.as_view(), &mut y.as_view_mut())
    }

    /// Reads the step's device status words (synchronises): the dispatch layout's and the local layer's.
    ///
    /// # Errors
    /// [`Error::DeviceCheck`] naming what the kernels found (an expert id out of range, capacity).
    pub fn check(&mut self) -> Result<()> {
        let stream = self.comm.stream();
        self.status.check(&stream)?;
        self.scratch.check(&stream)
    }
}

/// Block `d` of `send` (`block` elements) to rank `d`, block `s` of `recv` from rank `s`, for every rank, in
/// one NCCL group. `Comm::send`/`recv` rather than `Comm::group` (whose `Drop` unwraps `group_end`): their
/// access guards end before `group_end` enqueues the transfers, which is sound here because the buffers are
/// the step's own and only ever used on the communicator's stream (no other stream waits on their events).
fn exchange<T: NcclType>(
    comm: &Comm,
    world: usize,
    block: usize,
    send: &CudaSlice<T>,
    recv: &mut CudaSlice<T>,
) -> Result<()> {
    group_start().map_err(nccl("group_start"))?;
    let mut result = Ok(());
    for peer in 0..world {
        let r = comm.send(&send.slice(peer * block..(peer + 1) * block), peer as i32).map_err(nccl("send")).and_then(
            |_| {
                comm.recv(&mut recv.slice_mut(peer * block..(peer + 1) * block), peer as i32)
                    .map(|_| ())
                    .map_err(nccl("recv"))
            },
        );
        if r.is_err() {
            result = r;
            break;
        }
    }
    group_end().map_err(nccl("group_end"))?;
    result
}
