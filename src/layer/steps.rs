//! How a forward of `T` tokens is cut into passes, decided on the host from the sizing alone (no device): the
//! backend of each pass (`Auto`'s choice among the planned backends), the tokens each backend's room takes, and
//! the check that a forced backend runs full passes.

use crate::error::{Error, Result};
use crate::kernels::fused::FusedTile;

use super::pick::{self, auto_pick};
use super::sizing::{aligned_rows, LayerSizing, BATCHED_MAX_ROWS};
use crate::backend::Backend;

/// The tokens of one pass and the backend that runs them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    pub backend: Backend,
    pub lo: usize,
    pub hi: usize,
}

impl LayerSizing {
    /// The backend a pass of `tokens` tokens runs when the layer's backend is `backend`: `backend` itself, or
    /// for `Auto` its choice among the backends this plan made room for ([`Self::backends`]), never another
    /// (see [`MoeLayer::backend_for`](super::MoeLayer::backend_for) for the policy).
    pub fn backend_for(&self, backend: Backend, tokens: usize) -> Backend {
        match backend {
            Backend::Auto => {
                auto_pick(&self.shape, self.gemm, tokens, self.expert_parallel, self.tuned.as_ref(), self.backends)
            }
            b => b,
        }
    }

    /// The most tokens one pass of `backend` runs in this plan (0 without room for it): the backend's sizing
    /// pass for the GEMM backends, what the scratch rows hold for Batched and Fused. A Fused pass whose 128-row
    /// tile's padding does not fit may run fewer, down to half. [`MoeLayer::passes`](super::MoeLayer::passes)
    /// counts a batch's passes; `moe-gemm plan` prints these numbers.
    pub fn tokens_per_pass(&self, backend: Backend) -> usize {
        if !self.backends.contains(backend) {
            return 0;
        }
        self.fitting_tokens(backend, self.max_tokens)
    }

    /// The tokens per pass a plan that names `backend` in [`MoeLayerOptions::backends`](super::MoeLayerOptions::backends)
    /// gives it: `max_tokens`, less for Masked (`masked_max_m` rows per expert) and Batched (4096 (token, slot)
    /// rows).
    pub fn full_pass_tokens(&self, backend: Backend) -> usize {
        let t = self.max_tokens;
        match backend {
            Backend::Masked => t.min(self.max_m),
            Backend::Batched => t.min((BATCHED_MAX_ROWS / self.shape.slots()).max(1)),
            _ => t,
        }
    }

    /// Whether forcing `backend` on this plan runs full passes ([`Self::full_pass_tokens`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the backend, its tokens per pass in this plan and `max_tokens`, when the
    /// plan has less room (a plan sized for `Auto` gives each backend only the batches Auto sends it: forced
    /// on a larger batch it would run many small passes).
    pub fn check_full_passes(&self, backend: Backend) -> Result<()> {
        if backend == Backend::Auto {
            return Ok(());
        }
        let (room, full) = (self.tokens_per_pass(backend), self.full_pass_tokens(backend));
        if room >= full {
            return Ok(());
        }
        let (t, s) = (self.max_tokens, if room == 1 { "" } else { "s" });
        Err(Error::InvalidProblem(format!(
            "backend {backend} has room for {room} token{s} per pass in this plan (max_tokens {t}; a full pass is \
             {full}): a batch of {t} tokens would run {} passes; plan it with MoeLayerOptions::backends(...) \
             including {backend}, or accept the passes with MoeLayer::set_backend_with_passes",
            t.div_ceil(room.max(1))
        )))
    }

    /// How many passes a forward of `tokens` tokens runs when the layer's backend is `backend`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a backend without room in this plan.
    pub fn passes(&self, backend: Backend, tokens: usize) -> Result<usize> {
        self.steps(backend, tokens).try_fold(0, |n, s| s.map(|_| n + 1))
    }

    /// The passes of a forward of `tokens` tokens, in order (host only, allocation-free).
    pub(crate) fn steps(&self, backend: Backend, tokens: usize) -> impl Iterator<Item = Result<Step>> + '_ {
        let max = self.max_tokens;
        let mut lo = 0usize;
        let mut chunk_end = 0usize;
        let mut chunk_backend = Backend::Auto;
        std::iter::from_fn(move || {
            if lo >= tokens {
                return None;
            }
            if lo >= chunk_end {
                chunk_end = (lo + max).min(tokens);
                chunk_backend = self.backend_for(backend, chunk_end - lo);
            }
            let b = chunk_backend;
            if !self.backends.contains(b) {
                lo = tokens;
                return Some(Err(Error::InvalidProblem(format!(
                    "backend {b} has no scratch room in this plan (its backends: {{{}}})",
                    self.backends
                ))));
            }
            let n = match b {
                Backend::Fused => self.fused_pass(chunk_end - lo).1,
                _ => self.fitting_tokens(b, chunk_end - lo),
            };
            if n == 0 {
                lo = tokens;
                return Some(Err(Error::InvalidProblem(format!(
                    "scratch capacity: backend {b} cannot run one token in {} layout rows",
                    self.rows
                ))));
            }
            let step = Step { backend: b, lo, hi: lo + n };
            lo += n;
            Some(Ok(step))
        })
    }

    /// The Fused tile and tokens of a pass of at most `want` tokens: the chosen (or fixed) tile if its layout
    /// fits the scratch rows, else the 64-row tile.
    pub(crate) fn fused_pass(&self, want: usize) -> (FusedTile, usize) {
        let s = &self.shape;
        let want = want.min(self.max_tokens);
        let n = self.fitting_tokens(Backend::Fused, want);
        let tile = pick::fused_tile_for(self.fused_tile, self.tuned.as_ref(), self.format, n, s);
        if tile != FusedTile::M64N128K64 && aligned_rows(n * s.slots(), s.groups(), tile.block_m()) > self.rows {
            // The 128-row tile's padding does not fit: the largest pass that does, or the 64-row tile.
            let fits = |t: usize| aligned_rows(t * s.slots(), s.groups(), tile.block_m()) <= self.rows;
            let m = (1..=n).rev().find(|&t| fits(t)).unwrap_or(0);
            if m * 2 >= n && m > 0 {
                return (tile, m);
            }
            return (FusedTile::M64N128K64, n);
        }
        (tile, n)
    }
}
