//! Expert parallelism (issue 13): the experts of a layer spread over `world` devices, each token's rows sent to
//! the ranks that own its experts and the results sent back. This module is the host side: where experts live
//! ([`Placement`]), what a batch's dispatch moves ([`DispatchPlan`], the CPU reference the device dispatch will
//! be tested against), the full step on the host ([`crate::reference::ep_forward_reference`]) and its memory and traffic
//! ([`EpSizing`], `moe-gemm plan --ep N`); and the device step over NCCL ([`ExpertParallel`], the `nccl`
//! feature: `nccl.rs` says how it runs). The step has run with one rank only (no two-GPU machine was lent).
//!
//! # Semantics (DeepEP's low-latency mode, one row per (token, slot))
//!
//! * **Dispatch.** Source rank `s` holds `T_s` tokens with `topk_ids [T_s, k]` (global expert ids, distinct within
//!   a token) and `weights [T_s, k]`. Each (token, slot) `(t, j)` becomes one row `x[t]` sent, with the local id
//!   of its expert there, to the rank that holds expert `ids[t, j]` (the replica [`Placement::route`] picks). The
//!   send buffer holds the rows grouped by destination rank, in (token, slot) order within each destination
//!   (stable); rank `d` receives the rows of source 0, then of source 1, …, each block in its send order.
//! * **Local layer.** Rank `d` runs its experts on the received rows: each row is a token with top-1 routing to
//!   its local expert with weight 1 (`MoeLayer::with_expert_map` over [`Placement::expert_map`] with the global
//!   id, or a plain `MoeLayer` over the local weights with the local id), giving `round(d2 + b2)` per row.
//! * **Combine.** The rows go back by the reverse all-to-all into the same positions of the source's buffer they
//!   were sent from; the source computes `y[t] = round(Σ_j w[t, j] · back[t, j])` in f32 over `j = 0..k` in
//!   order. The router weights never leave their rank.
//!
//! Against the one-GPU layer ([`crate::reference::moe_forward`]): bit-equal without `b2`; with `b2`,
//! each slot's `d2 + b2` is rounded once more (a half-step of the element type per slot before weighting).
//! The shared expert is not part of this step (run it on the token's home rank); not built here.
//!
//! The worst case a rank `r` holding `n_r` experts receives is `world · T · min(k, n_r)` rows (`T` tokens per
//! rank at most, `k` distinct experts per token, at most `n_r` of them on `r`): the device buffers are sized
//! for it, so the step needs no host read of the counts and stays graph-capturable.
//!
//! # Placement
//!
//! [`Placement::contiguous`] gives rank `r` experts `r·E/world .. (r+1)·E/world` (`E` divisible by `world`, else
//! an error naming both). [`Placement::from_map`] takes an explicit map (EPLB-style): for each global expert the
//! list of its replicas `(rank, local id)`. A rank holds at most one replica of an expert, every rank holds at
//! least one expert, and each rank's local ids are exactly `0..n_r`. A token's replica is picked
//! deterministically from the source rank and the token's index alone (so the device can pick it without
//! communication): replica `(source + token) mod replicas` of the list.
//!
//! # The NCCL step ([`ExpertParallel`])
//!
//! cudarc 0.19's `nccl` feature (default-on here; libnccl is loaded at run time with the default
//! `cuda-dynamic-loading`, so building needs no NCCL; `cuda-dynamic-linking` links it). One communicator per device: `Comm::from_devices(streams)` in one process, or
//! `Comm::from_rank(stream, rank, world, id)` per process with an `Id::new()` shared out of band. Per step, on
//! the communicator's stream, with no host read of a count: a masked layout over the ranks places each
//! (token, slot) row at `dest · cap + i` (stable in (token, slot) order: [`DispatchPlan`]'s order), the row
//! gather and a small id kernel fill the send blocks (padding carries an id no rank holds), one NCCL group
//! exchanges the fixed-size blocks (rows, then ids), the local `MoeLayer` runs every received row as a top-1
//! token (padding dropped by its layout), a second group sends the results back, and the layout's combine sums
//! over k. The per-peer block is the worst case above, so the transfers have fixed sizes and the step can be
//! captured in a CUDA graph (NCCL ≥ 2.9 captures; a one-rank step replays in a graph on the H200). The cost of that: the local
//! layer's row count is `world · cap`, so its gather and combine-side kernels scan the padding too.
//!
//! Not built yet: replicated experts on the device (the step refuses them), the shared expert under EP, the
//! per-token deduplicated dispatch of DeepEP's normal mode (one row per (token, destination rank) instead of
//! per slot: less traffic when a token's experts share a rank), FP8 rows on the wire, two-batch overlap. Not
//! run: anything with two ranks (`moe-gemm bench --layer --ep W --nccl` times the step's phases over W GPUs of one
//! host, one thread per rank; it has run with W = 1).

#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
pub use crate::ffi::ep::RankComm;
#[cfg(feature = "nccl")]
pub use nccl::ExpertParallel;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::experts::PackedExperts;
use crate::layer::{Backend, LayerShape, LayerSizing, WeightFormat};

fn bad<T>(s: String) -> Result<T> {
    Err(Error::InvalidProblem(s))
}

/// Where one replica of a global expert lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertSlot {
    pub rank: usize,
    /// The expert's index among `rank`'s local experts.
    pub local: usize,
}

/// Which rank holds which experts, validated at construction (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    world: usize,
    /// Per global expert, its replicas (at least one).
    replicas: Vec<Vec<ExpertSlot>>,
    /// Per rank, local id → global expert.
    globals: Vec<Vec<usize>>,
}

impl Placement {
    /// `E / world` consecutive experts per rank.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `experts` or `world` is 0, or `experts % world != 0` (naming both).
    pub fn contiguous(experts: usize, world: usize) -> Result<Self> {
        if experts == 0 || world == 0 {
            return bad(format!("E = {experts} experts over world = {world} ranks: both must be positive"));
        }
        if experts % world != 0 {
            return bad(format!(
                "E = {experts} experts do not split evenly over world = {world} ranks ({experts} % {world} = {}): \
                 use an explicit placement map",
                experts % world
            ));
        }
        let per = experts / world;
        let map: Vec<Vec<ExpertSlot>> =
            (0..experts).map(|e| vec![ExpertSlot { rank: e / per, local: e % per }]).collect();
        Self::from_map(world, &map)
    }

    /// An explicit placement: `map[e]` lists the replicas of global expert `e` (EPLB-style; one entry without
    /// replication), the first being its primary.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the numbers: `world` or `map.len()` 0, an expert with no replica, a rank
    /// `>= world`, two replicas of one expert on one rank, two experts with one local id on a rank, a rank whose
    /// local ids are not `0..n` (a gap), a rank with no experts.
    pub fn from_map(world: usize, map: &[Vec<ExpertSlot>]) -> Result<Self> {
        let experts = map.len();
        if experts == 0 || world == 0 {
            return bad(format!(
                "a placement map of {experts} experts over world = {world} ranks: both must be positive"
            ));
        }
        let mut globals: Vec<Vec<Option<usize>>> = vec![Vec::new(); world];
        for (e, reps) in map.iter().enumerate() {
            if reps.is_empty() {
                return bad(format!(
                    "expert {e} of {experts} has no rank: the map must place every expert 0..{experts}"
                ));
            }
            for (i, s) in reps.iter().enumerate() {
                if s.rank >= world {
                    return bad(format!("expert {e}: rank {} out of range for world = {world}", s.rank));
                }
                if reps[..i].iter().any(|p| p.rank == s.rank) {
                    return bad(format!(
                        "expert {e} has two replicas on rank {}: a rank holds at most one copy of an expert",
                        s.rank
                    ));
                }
                let g = &mut globals[s.rank];
                if g.len() <= s.local {
                    g.resize(s.local + 1, None);
                }
                if let Some(other) = g[s.local] {
                    return bad(format!(
                        "rank {}: local id {} given to both expert {other} and expert {e}",
                        s.rank, s.local
                    ));
                }
                g[s.local] = Some(e);
            }
        }
        let mut out = Vec::with_capacity(world);
        for (r, g) in globals.into_iter().enumerate() {
            if g.is_empty() {
                return bad(format!("rank {r} of world = {world} holds no experts: every rank needs at least one"));
            }
            if let Some(gap) = g.iter().position(Option::is_none) {
                return bad(format!(
                    "rank {r}: local id {gap} is unused but ids go up to {}: local ids must be 0..{} with no gap",
                    g.len() - 1,
                    g.len()
                ));
            }
            out.push(g.into_iter().map(Option::unwrap).collect());
        }
        Ok(Placement { world, replicas: map.to_vec(), globals: out })
    }

    /// Global experts `E`.
    pub fn experts(&self) -> usize {
        self.replicas.len()
    }
    pub fn world(&self) -> usize {
        self.world
    }
    /// Experts `rank` holds (its local layer's `E`).
    ///
    /// # Panics
    /// If `rank >= world`.
    pub fn local_experts(&self, rank: usize) -> usize {
        self.globals[rank].len()
    }
    /// The most experts any rank holds.
    pub fn max_local_experts(&self) -> usize {
        self.globals.iter().map(Vec::len).max().unwrap_or(0)
    }
    /// `rank`'s local id → global expert.
    pub fn global_ids(&self, rank: usize) -> &[usize] {
        &self.globals[rank]
    }
    /// The replicas of global expert `expert`.
    pub fn replicas(&self, expert: usize) -> &[ExpertSlot] {
        &self.replicas[expert]
    }
    /// Global expert → local id on `rank` or −1: what [`MoeLayer::with_expert_map`](crate::MoeLayer::with_expert_map)
    /// takes for `rank`'s slice.
    pub fn expert_map(&self, rank: usize) -> Vec<i32> {
        let mut map = vec![-1i32; self.experts()];
        for (l, &e) in self.globals[rank].iter().enumerate() {
            map[e] = l as i32;
        }
        map
    }
    /// The replica of `expert` that token `token` of rank `source` is sent to: `(source + token) mod replicas`.
    pub fn route(&self, source: usize, token: usize, expert: usize) -> ExpertSlot {
        let reps = &self.replicas[expert];
        reps[(source + token) % reps.len()]
    }
    /// Experts of `rank` as host tensors: the rows of `experts` (all `E` global experts) in local id order.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `experts` does not hold this placement's `E` experts.
    pub fn local_weights<T: Element>(&self, experts: &PackedExperts<T>, rank: usize) -> Result<PackedExperts<T>> {
        if experts.experts != self.experts() {
            return bad(format!("the weights hold {} experts, the placement {}", experts.experts, self.experts()));
        }
        let (h, i, r13) = (experts.hidden, experts.inter, experts.w13_rows());
        let ids = &self.globals[rank];
        let take =
            |v: &[T], n: usize| -> Vec<T> { ids.iter().flat_map(|&e| v[e * n..(e + 1) * n].iter().copied()).collect() };
        let take_f = |v: &[f32], n: usize| -> Vec<f32> {
            ids.iter().flat_map(|&e| v[e * n..(e + 1) * n].iter().copied()).collect()
        };
        PackedExperts::new(
            ids.len(),
            h,
            i,
            experts.format,
            take(&experts.w13, r13 * h),
            take(&experts.w2, h * i),
            experts.b13.as_deref().map(|b| take_f(b, r13)),
            experts.b2.as_deref().map(|b| take_f(b, h)),
        )
    }
}

/// One received row on a destination rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvRow {
    pub source: usize,
    /// Token index on the source rank.
    pub token: usize,
    /// Slot `j` of the token's top-k.
    pub slot: usize,
    /// The global expert.
    pub expert: usize,
    /// Its local id on this rank.
    pub local: usize,
}

/// What one source rank sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendPlan {
    /// Tokens on this rank.
    pub tokens: usize,
    /// Send buffer position → flat slot `t·k + j` (rows grouped by destination, (token, slot) order within).
    pub send_order: Vec<usize>,
    /// The destination rank and local expert id of each send position.
    pub dest: Vec<ExpertSlot>,
    /// `world + 1` offsets: destination `d`'s rows are `send_offsets[d]..send_offsets[d + 1]`.
    pub send_offsets: Vec<usize>,
    /// Flat slot `t·k + j` → send position: where combine finds that slot's result after the reverse exchange.
    pub slot_to_send: Vec<usize>,
}

/// What one destination rank receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvLayout {
    /// `world + 1` offsets: source `s`'s rows are `offsets[s]..offsets[s + 1]`.
    pub offsets: Vec<usize>,
    pub rows: Vec<RecvRow>,
}

/// The dispatch of one batch over a [`Placement`]: the CPU reference of the device dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchPlan {
    world: usize,
    top_k: usize,
    /// `counts[s · world + d]`: rows source `s` sends to destination `d`.
    counts: Vec<usize>,
    sends: Vec<SendPlan>,
    recvs: Vec<RecvLayout>,
}

impl DispatchPlan {
    /// Plans the dispatch of `topk_ids[s]` (`[T_s, k]`, global ids) of each source rank `s`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the numbers: `ids.len() != world`, `k == 0`, a rank's ids not a multiple
    /// of `k`, an id outside `0..E`, an expert twice in one token (the receive bound assumes distinct experts).
    pub fn new(placement: &Placement, topk_ids: &[&[i32]], k: usize) -> Result<Self> {
        let world = placement.world();
        let e = placement.experts();
        if topk_ids.len() != world {
            return bad(format!("topk_ids of {} ranks given for world = {world}", topk_ids.len()));
        }
        if k == 0 || k > e {
            return bad(format!("top_k = {k}: must be in 1..={e} (the experts)"));
        }
        let mut counts = vec![0usize; world * world];
        let mut sends = Vec::with_capacity(world);
        for (s, ids) in topk_ids.iter().enumerate() {
            if ids.len() % k != 0 {
                return bad(format!("rank {s}: {} topk ids are not a multiple of top_k = {k}", ids.len()));
            }
            let tokens = ids.len() / k;
            let mut dest = Vec::with_capacity(ids.len());
            for (t, row) in ids.chunks(k).enumerate() {
                for (j, &id) in row.iter().enumerate() {
                    if id < 0 || id as usize >= e {
                        return bad(format!("rank {s}, token {t}, slot {j}: expert id {id} outside 0..{e}"));
                    }
                    if row[..j].contains(&id) {
                        return bad(format!("rank {s}, token {t}: expert {id} twice in one token's top-{k}"));
                    }
                    let slot = placement.route(s, t, id as usize);
                    counts[s * world + slot.rank] += 1;
                    dest.push(slot);
                }
            }
            let mut send_offsets = vec![0usize; world + 1];
            for d in 0..world {
                send_offsets[d + 1] = send_offsets[d] + counts[s * world + d];
            }
            let mut next = send_offsets.clone();
            let mut send_order = vec![0usize; ids.len()];
            let mut slot_to_send = vec![0usize; ids.len()];
            let mut send_dest = vec![ExpertSlot { rank: 0, local: 0 }; ids.len()];
            for (flat, d) in dest.iter().enumerate() {
                let p = next[d.rank];
                next[d.rank] += 1;
                send_order[p] = flat;
                slot_to_send[flat] = p;
                send_dest[p] = *d;
            }
            sends.push(SendPlan { tokens, send_order, dest: send_dest, send_offsets, slot_to_send });
        }
        let recvs = (0..world)
            .map(|d| {
                let mut offsets = vec![0usize; world + 1];
                let mut rows = Vec::new();
                for (s, sp) in sends.iter().enumerate() {
                    for p in sp.send_offsets[d]..sp.send_offsets[d + 1] {
                        let flat = sp.send_order[p];
                        let (token, slot) = (flat / k, flat % k);
                        let expert = topk_ids[s][flat] as usize;
                        rows.push(RecvRow { source: s, token, slot, expert, local: sp.dest[p].local });
                    }
                    offsets[s + 1] = rows.len();
                }
                RecvLayout { offsets, rows }
            })
            .collect();
        Ok(DispatchPlan { world, top_k: k, counts, sends, recvs })
    }

    pub fn world(&self) -> usize {
        self.world
    }
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Rows `source` sends to `dest`.
    pub fn count(&self, source: usize, dest: usize) -> usize {
        self.counts[source * self.world + dest]
    }
    /// `[world, world]` row counts, source-major: what the device all-to-all of int32 counts exchanges.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }
    pub fn send(&self, source: usize) -> &SendPlan {
        &self.sends[source]
    }
    pub fn recv(&self, dest: usize) -> &RecvLayout {
        &self.recvs[dest]
    }
}

/// Memory and traffic of one EP layer step per rank, for at most `max_tokens` tokens per rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpSizing {
    pub world: usize,
    pub max_tokens: usize,
    pub top_k: usize,
    pub hidden: usize,
    /// Activation element type (the rows on the wire).
    pub dtype: DType,
    /// Worst-case rows each rank receives: `world · max_tokens · min(k, n_r)`.
    pub recv_rows: Vec<usize>,
    /// Each rank's local layer, sized for its worst-case receive rows as top-1 tokens.
    pub local: Vec<LayerSizing>,
}

impl EpSizing {
    /// Sizes the step of a layer of `shape` (`shape.experts` = `shape.global_experts` = the placement's `E`; the
    /// shared groups are ignored: see the module docs) stored as `format`.
    ///
    /// The local layer of rank `r` is sized as `recv_rows[r]` tokens with `top_k = 1` (each received row is one
    /// (token, slot) routed to one local expert), over `n_r` local experts of `E` global ones, with an expert map:
    /// its layout holds exactly the received rows. Sizing it as `recv_rows / k` tokens of top-k would be wrong:
    /// one token's rows on a rank number at most `min(k, n_r)`, not `k`, and its x and y are the receive buffers
    /// (`recv_rows` rows of `H`), not `recv_rows / k`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] if `shape.experts` differs from the placement's or the local layers' sizing
    /// fails (naming the constraint).
    pub fn new(
        shape: LayerShape,
        dtype: DType,
        format: WeightFormat,
        placement: &Placement,
        max_tokens: usize,
        sm_count: usize,
    ) -> Result<Self> {
        if shape.experts != placement.experts() || shape.global_experts != placement.experts() {
            return bad(format!(
                "the layer has E = {} (router {}), the placement {} experts",
                shape.experts,
                shape.global_experts,
                placement.experts()
            ));
        }
        if max_tokens == 0 || shape.top_k == 0 || shape.top_k > shape.experts {
            return bad(format!(
                "max_tokens = {max_tokens} per rank and top_k = {} of E = {}: must be positive, top_k <= E",
                shape.top_k, shape.experts
            ));
        }
        let world = placement.world();
        let recv_rows: Vec<usize> =
            (0..world).map(|r| world * max_tokens * shape.top_k.min(placement.local_experts(r))).collect();
        let local = (0..world)
            .map(|r| {
                let local_shape = LayerShape {
                    experts: placement.local_experts(r),
                    global_experts: shape.experts,
                    top_k: 1,
                    shared_groups: 0,
                    ..shape
                };
                LayerSizing::for_format(
                    local_shape,
                    dtype,
                    format,
                    recv_rows[r],
                    Backend::Auto,
                    None,
                    None,
                    None,
                    true,
                    sm_count,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EpSizing { world, max_tokens, top_k: shape.top_k, hidden: shape.hidden, dtype, recv_rows, local })
    }

    /// Bytes of one row on the wire.
    pub fn row_bytes(&self) -> usize {
        self.hidden * self.dtype.size_bytes()
    }
    /// Rows one rank sends at most (`max_tokens · k`, every slot once), and gets back in combine.
    pub fn send_rows(&self) -> usize {
        self.max_tokens * self.top_k
    }
    /// Bytes one rank sends in dispatch at most: its rows, an int32 local expert id per row, `world` int32
    /// counts. The router weights stay on the rank (combine applies them there).
    pub fn dispatch_bytes(&self) -> usize {
        self.send_rows() * (self.row_bytes() + 4) + self.world * 4
    }
    /// Bytes one rank sends back in combine at most: its received rows' results.
    pub fn combine_bytes(&self) -> usize {
        self.send_rows() * self.row_bytes()
    }
    /// Device bytes of rank `r`'s receive buffers: rows in, int32 ids, rows out (the local layer's `x` and `y`).
    pub fn recv_buffer_bytes(&self, rank: usize) -> usize {
        self.recv_rows[rank] * (2 * self.row_bytes() + 4)
    }
    /// Rows per (source, destination) block of [`ExpertParallel`]'s fixed-size exchange: the largest worst case
    /// of a rank, `max_tokens · min(k, the most experts a rank holds)`, one size for every pair.
    pub fn block_rows(&self) -> usize {
        self.recv_rows.iter().max().copied().unwrap_or(0) / self.world.max(1)
    }
    /// Bytes one rank sends per step in [`ExpertParallel`]'s exchange, padding included: (dispatch, combine) =
    /// `world · block_rows` rows with their int32 ids, and the same rows back. What
    /// [`Self::dispatch_bytes`] and [`Self::combine_bytes`] count is the routed rows alone (count-sized
    /// transfers, which would need the counts on the host).
    pub fn exchange_bytes(&self) -> (usize, usize) {
        let rows = self.world * self.block_rows();
        (rows * (self.row_bytes() + 4), rows * self.row_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_maps() {
        let p = Placement::contiguous(8, 4).unwrap();
        assert_eq!(p.expert_map(1), vec![-1, -1, 0, 1, -1, -1, -1, -1]);
        assert_eq!(p.global_ids(3), &[6, 7]);
    }
}
