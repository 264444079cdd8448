//! The FP8 layer's CPU reference: [`moe_forward_fp8`] (with a shared expert: [`moe_forward_fp8_with_shared`]) over
//! the same quantised operands the device reads, and the bounds the GPU tests hold the layer to.

use half::bf16;

use super::{activate, per_token};
use crate::experts::{Activation, GateUp, PackedFp8Experts, SharedFp8Expert};
use crate::quant::{per_token_group_quant, GroupQuant, SCALE_BLOCK};
use crate::reference::Tolerance;

/// The host inputs of [`moe_forward_fp8`]: the block-FP8 experts as uploaded
/// ([`Fp8ExpertWeights::upload`](crate::layer::Fp8ExpertWeights::upload)), the activation (gate and up concatenated, as
/// FP8 experts are), how activations are quantised, optional biases f32 `[E, 2I]` and `[E, H]`.
#[derive(Clone, Copy, Debug)]
pub struct Fp8HostLayer<'a> {
    pub experts: &'a PackedFp8Experts,
    pub activation: Activation,
    pub quant: GroupQuant,
    pub b13: Option<&'a [f32]>,
    pub b2: Option<&'a [f32]>,
}

impl<'a> Fp8HostLayer<'a> {
    /// `experts` without biases, activations quantised as the upload does
    /// ([`PackedFp8Experts::activation_quant`]: the checkpoint family's eps, UE8M0-rounded scales for UE8M0
    /// checkpoints).
    pub fn new(experts: &'a PackedFp8Experts, activation: Activation) -> Self {
        Fp8HostLayer { experts, activation, quant: experts.activation_quant(), b13: None, b2: None }
    }
}

/// The FP8 layer on the host, step for step as the device runs it (see `fp8.rs`): each token's row of `x`
/// quantised per 128 columns by [`per_token_group_quant`] (the device kernel's rules, bit for bit); GEMM1 over
/// the exact products of the e4m3 values and their f32 scales, summed in f64 and rounded to bf16 through f32 (as
/// the device's f32 accumulators are); the activation in f32 with `b13`, rounded to bf16; `h` requantised by
/// the same rules; GEMM2 likewise; the combine adds `b2`, weights by the router and sums the k contributions in
/// f32, rounding once. The only difference from the device is the GEMMs' accumulation (f64 here; the tensor
/// cores' partial sums of 128 promoted into f32 there): see [`Fp8LayerBound`].
///
/// # Panics
/// If the inputs' lengths do not fit the experts (`x [T, H]`, `ids`, `weights` `[T, k]`), an id is out of range,
/// or the experts are not in 128 x 128 blocks.
pub fn moe_forward_fp8(l: &Fp8HostLayer<'_>, x: &[bf16], ids: &[i32], weights: &[f32], k: usize) -> Vec<bf16> {
    fp8_forward(l, None, x, ids, weights, k, None)
}

/// [`moe_forward_fp8`] with a block-FP8 shared expert: `y = Σ_j w[t,j] · expert_j(x) + s_t · shared(x)` with
/// `s_t = shared_weights[t]` (Qwen2-MoE's gate) or 1 (DeepSeek-V3, Kimi-K2), what
/// [`Fp8ExpertWeights::upload_with_shared`](crate::layer::Fp8ExpertWeights::upload_with_shared) computes.
///
/// The shared MLP is computed from its own full-width matrices (`[I_s, H]`, `[H, I_s]`), not from the `I`-wide
/// groups the device splits it into, so a comparison checks the split; step for step as a routed expert: GEMM1
/// over the token's quantised `x` (the same quantisation), rounded to bf16; the layer's activation (no bias),
/// rounded; `h` (`I_s` wide) quantised per 128 columns by the same rules (with `I` a multiple of 128 these are
/// the groups' own 128-column groups); GEMM2 rounded to bf16 once per `I`-wide slice of its reduction (each of
/// the device's groups rounds its partial sum), each slice weighted by `s_t` and added in f32 after the routed
/// contributions.
///
/// # Panics
/// As [`moe_forward_fp8`]; if the shared expert's hidden size differs from the routed experts', the routed `I`
/// does not split `I_s` into whole groups ([`SharedFp8Expert::groups`]), or `shared_weights` is shorter than
/// the tokens.
pub fn moe_forward_fp8_with_shared(
    l: &Fp8HostLayer<'_>,
    shared: &SharedFp8Expert,
    x: &[bf16],
    ids: &[i32],
    weights: &[f32],
    k: usize,
    shared_weights: Option<&[f32]>,
) -> Vec<bf16> {
    let h = l.experts.hidden();
    assert_eq!(shared.hidden(), h, "the shared expert's hidden size differs from the routed experts'");
    if let Err(e) = shared.groups(l.experts.inter()) {
        panic!("{e}");
    }
    if let Some(s) = shared_weights {
        assert!(s.len() >= x.len() / h, "shared_weights holds {} of {} tokens", s.len(), x.len() / h);
    }
    fp8_forward(l, Some((shared, shared_weights)), x, ids, weights, k, None)
}

/// How the device's FP8 layer is compared with [`moe_forward_fp8`] ([`Fp8LayerBound::for_output`],
/// [`fp8_layer_mismatch`]): every element within `all`, and every token's output row within `bulk` except at most
/// [`Fp8LayerBound::outlier_rows`] of them.
///
/// Derivation. The two compute the same quantised operands bit for bit and differ in the GEMMs' accumulation
/// only: the device's tensor cores sum each 128-wide block of K keeping about 14 bits (DeepSeek-V3's measurement)
/// and promote each partial sum into f32 with its two scales, the reference sums in f64. That moves a GEMM output
/// by far less than its bf16 rounding, so outputs agree to the bf16 rounding of `d1`, `d2` and `y` and the f32
/// summation order: `bulk` is `2^-7 · max + 2^-7 · |ref|` (two half bf16 steps of the largest output and of each).
/// But a GEMM1 output next to a bf16 rounding boundary rounds the other way (one bf16 step of that `d1`), and the
/// `h` it feeds then lands on the other side of an e4m3 rounding boundary in the requantisation about one time in
/// twenty (one e4m3 step of that element, 2^-4 to 2^-3 relative) or, when it is the largest of its 128-group,
/// changes the group's scale and with it up to 128 elements: that (token, slot)'s GEMM2 row, and so the token's
/// output row, moves by a few e4m3 steps of some of its `I` terms (more with UE8M0 scales, whose e4m3 steps are up
/// to twice as coarse). Such cascades stay within `all` = `3 · 2^-6 · max` and touch few rows: at most
/// `2 + rows / 8` token rows may leave `bulk`.
///
/// The in-crate test `tolerance_covers_device_accumulation_and_catches_swapped_scales` checks this on the GPU
/// tests' shapes (T from 1 to 129, k 1 to 8, f32 and UE8M0 scales) by running the reference with the device's
/// accumulation modelled (each block's partial sum off by up to 2^-13, promoted in f32): the largest error stays
/// within two thirds of `all` (measured at most 0.026 · max, UE8M0, T = 8, k = 1) and at most one row per case
/// leaves `bulk`; at four times that accumulation error the bound still holds (0.029 · max, two rows); two
/// experts' w13 scale grids swapped break it (the largest error 0.094 · max or more, a quarter of the rows or
/// more outside `bulk`).
#[derive(Clone, Copy, Debug)]
pub struct Fp8LayerBound {
    /// Every element within this.
    pub all: Tolerance,
    /// Every row within this, except at most [`Self::outlier_rows`].
    pub bulk: Tolerance,
}

impl Fp8LayerBound {
    /// The bound for outputs whose largest reference magnitude is `max_abs_ref`.
    pub fn for_output(max_abs_ref: f32) -> Fp8LayerBound {
        let m = max_abs_ref.max(1e-6);
        Fp8LayerBound {
            all: Tolerance { atol: 3.0 * m / 64.0, rtol: 0.0 },
            bulk: Tolerance { atol: m / 128.0, rtol: 1.0 / 128.0 },
        }
    }

    /// How many of `rows` token rows may hold elements outside `bulk`: `2 + rows / 8`.
    pub fn outlier_rows(rows: usize) -> usize {
        2 + rows / 8
    }

    /// The rows of `got` (`[rows, row_len]`) with an element outside `bulk` of `want`.
    pub fn rows_outside_bulk(&self, got: &[f32], want: &[f32], row_len: usize) -> usize {
        assert_eq!(got.len(), want.len());
        got.chunks(row_len.max(1))
            .zip(want.chunks(row_len.max(1)))
            .filter(|(g, w)| g.iter().zip(*w).any(|(g, w)| !self.bulk.accepts(*g, *w)))
            .count()
    }

    /// What `got` (`[rows, row_len]`) violates against `want`, or `None`: the first element outside `all`, or
    /// the count of rows outside `bulk` when that is more than [`Self::outlier_rows`].
    pub fn violation(&self, got: &[f32], want: &[f32], row_len: usize) -> Option<String> {
        assert_eq!(got.len(), want.len());
        if let Some((i, g, w)) = crate::reference::first_mismatch(got, want, self.all) {
            return Some(format!("element {i}: got {g}, reference {w}: outside {:?}", self.all));
        }
        let rows = got.len() / row_len.max(1);
        let out = self.rows_outside_bulk(got, want, row_len);
        let allowed = Self::outlier_rows(rows);
        (out > allowed).then(|| format!("{out} of {rows} rows outside {:?} (at most {allowed} may be)", self.bulk))
    }
}

/// The device's FP8 layer output `got` (`[T, hidden]`) against [`moe_forward_fp8`]'s `want` under
/// [`Fp8LayerBound`]: `None` when it holds, else what is violated.
pub fn fp8_layer_mismatch(got: &[bf16], want: &[bf16], hidden: usize) -> Option<String> {
    let (g, w) = (f32s(got), f32s(want));
    Fp8LayerBound::for_output(max_abs(&w)).violation(&g, &w, hidden)
}

/// Which dense weights the FP8 layer is compared with ([`fp8_vs_dense_tolerance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseWeights {
    /// The FP8 weights dequantised (`q · scale`) and rounded to bf16: only the activations' quantisation differs.
    Dequantised,
    /// The bf16 weights the FP8 ones were quantised from ([`PackedFp8Experts::quantize`]): the weights'
    /// quantisation differs too.
    Original,
}

/// The tolerance of a comparison of the FP8 layer with the dense bf16 layer on `weights`, for outputs whose
/// largest reference magnitude is `max_abs_ref`: `|got − ref| ≤ 2^-3 · max` on the dequantised weights,
/// `3 · 2^-4 · max` on the original bf16 weights.
///
/// Derivation. On the dequantised weights only the activations differ: the FP8 layer rounds `x` and `h` to e4m3
/// (3 mantissa bits: up to 2^-4 relative per element, about 2^-4 / sqrt(3) rms, more for elements far below
/// their group's amax, which fall into e4m3's subnormals), the dense layer keeps them in bf16 (2^-9). With random
/// signs a GEMM output moves by about 2^-5.8 of the root sum of squares of its terms per quantisation; GEMM2
/// sees the rounding of `h` and, through the activation (slope at most about 1.1 for SwiGLU), GEMM1's: a few
/// 2^-6 of a typical output. On the original weights every weight is rounded to e4m3 as well, which adds about as
/// much again (more with UE8M0 scales: a power-of-two scale up to twice the block's amax / 448 costs up to one
/// more bit). The in-crate test measures at most 0.06 · max (dequantised) and 0.094 · max (original, UE8M0;
/// 0.077 with f32 scales) on the GPU tests' shapes; the bounds allow twice that.
pub fn fp8_vs_dense_tolerance(max_abs_ref: f32, weights: DenseWeights) -> Tolerance {
    let m = max_abs_ref.max(1e-6);
    let atol = match weights {
        DenseWeights::Dequantised => m / 8.0,
        DenseWeights::Original => 3.0 * m / 16.0,
    };
    Tolerance { atol, rtol: 0.0 }
}

/// The FP8 layer's output `got` against the dense layer's `want` on `weights` under [`fp8_vs_dense_tolerance`]:
/// `None` when it holds, else the first element outside.
pub fn fp8_vs_dense_mismatch(got: &[bf16], want: &[bf16], weights: DenseWeights) -> Option<String> {
    let (g, w) = (f32s(got), f32s(want));
    let tol = fp8_vs_dense_tolerance(max_abs(&w), weights);
    crate::reference::first_mismatch(&g, &w, tol)
        .map(|(i, a, b)| format!("element {i}: got {a}, dense reference ({weights:?} weights) {b} ({tol:?})"))
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// One expert's block-FP8 matrix `[n, k]` as e4m3 values (exact in f32) and its 128 x 128 scales `[n/128, k/128]`.
struct HostFp8 {
    q: Vec<f32>,
    s: Vec<f32>,
    n: usize,
    k: usize,
}

impl HostFp8 {
    fn of(m: &crate::quant::BlockFp8) -> HostFp8 {
        assert_eq!(m.block(), crate::quant::BlockShape::DEEPSEEK, "FP8 experts in 128 x 128 blocks");
        let s = (0..m.scales().len()).map(|i| m.scales().get(i).unwrap_or(f32::NAN)).collect();
        HostFp8 { q: m.q().iter().map(|v| v.to_f32()).collect(), s, n: m.rows(), k: m.cols() }
    }

    /// `Σ_kb (Σ_{c in kb} aq[c] · q[o, c]) · sa[kb] · s[o / 128, kb]` for every output `o`, rounded to f32. With
    /// `noise = Some((seed, rel))` each block's partial sum is perturbed by a factor in `1 ± rel` and the
    /// promotion runs in f32 (a model of the device's accumulation); otherwise the sum is in f64.
    fn gemm(&self, aq: &[f32], sa: &[f32], noise: Option<(u64, f64)>) -> Vec<f32> {
        self.gemm_blocks(aq, sa, 0..self.k.div_ceil(SCALE_BLOCK), noise)
    }

    /// [`Self::gemm`] over the K blocks `blocks` only (`aq`, `sa` still the whole row): one part of a reduction
    /// that the device splits into groups.
    fn gemm_blocks(
        &self,
        aq: &[f32],
        sa: &[f32],
        blocks: std::ops::Range<usize>,
        noise: Option<(u64, f64)>,
    ) -> Vec<f32> {
        let kb = self.k.div_ceil(SCALE_BLOCK);
        (0..self.n)
            .map(|o| {
                let w = &self.q[o * self.k..(o + 1) * self.k];
                let (mut exact, mut dev) = (0f64, 0f32);
                for (b, &sab) in sa.iter().enumerate().take(blocks.end.min(kb)).skip(blocks.start) {
                    let (lo, hi) = (b * SCALE_BLOCK, ((b + 1) * SCALE_BLOCK).min(self.k));
                    let partial: f64 = (lo..hi).map(|c| aq[c] as f64 * w[c] as f64).sum();
                    let sw = self.s[(o / SCALE_BLOCK) * kb + b];
                    match noise {
                        None => exact += partial * (sab as f64 * sw as f64),
                        Some((seed, rel)) => {
                            let u = unit(seed ^ ((o as u64) << 20) ^ b as u64);
                            let p = (partial * (1.0 + rel * u)) as f32;
                            dev = p.mul_add(sab * sw, dev);
                        }
                    }
                }
                if noise.is_some() {
                    dev
                } else {
                    exact as f32
                }
            })
            .collect()
    }
}

/// A deterministic value in [-1, 1) from `seed` (SplitMix64's finaliser).
fn unit(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// A shared expert's three matrices on the host.
struct HostShared {
    gate: HostFp8,
    up: HostFp8,
    down: HostFp8,
}

type Fp8SharedPart<'a> = Option<(&'a SharedFp8Expert, Option<&'a [f32]>)>;

fn fp8_forward(
    l: &Fp8HostLayer<'_>,
    shared: Fp8SharedPart<'_>,
    x: &[bf16],
    ids: &[i32],
    weights: &[f32],
    k: usize,
    noise: Option<(u64, f64)>,
) -> Vec<bf16> {
    let p = l.experts;
    assert!(l.activation.gated(), "FP8 experts hold gate and up: a gated activation");
    let (e, h, i) = (p.experts(), p.hidden(), p.inter());
    let r13 = 2 * i;
    let tokens = x.len() / h;
    assert_eq!(x.len(), tokens * h, "x holds whole rows of H = {h}");
    assert!(ids.len() == tokens * k && weights.len() == tokens * k, "ids and weights are [T, k]");
    assert!(ids.iter().all(|&id| id >= 0 && (id as usize) < e), "ids within 0..{e}");
    let mut used = vec![false; e];
    ids.iter().for_each(|&id| used[id as usize] = true);
    let experts: Vec<Option<(HostFp8, HostFp8)>> = (0..e)
        .map(|x| {
            used[x].then(|| {
                let (w13, w2) = p.expert(x).expect("expert in range");
                (HostFp8::of(&w13), HostFp8::of(&w2))
            })
        })
        .collect();
    let host_shared = shared.map(|(s, _)| HostShared {
        gate: HostFp8::of(s.gate()),
        up: HostFp8::of(s.up()),
        down: HostFp8::of(s.down()),
    });
    let (host_shared, shared_weights) = (host_shared.as_ref(), shared.and_then(|(_, w)| w));
    let quant = l.quant;
    let round = |v: f32| bf16::from_f32(v).to_f32();
    per_token(x, h, |t, xr| {
        let (xq, xs) = per_token_group_quant(xr, 1, h, &quant).expect("x row quantises");
        let xq: Vec<f32> = xq.iter().map(|v| v.to_f32()).collect();
        let mut acc = vec![0f32; h];
        for j in 0..k {
            let slot = (t * k + j) as u64;
            let ex = ids[t * k + j] as usize;
            let (w13, w2) = experts[ex].as_ref().expect("dequantised for every used expert");
            let seed = |g: u64| noise.map(|(s, r)| (s ^ slot.wrapping_mul(0x1000_0001) ^ g << 40, r));
            let d1: Vec<f32> = w13.gemm(&xq, &xs, seed(1)).into_iter().map(round).collect();
            let b13 = |o: usize| l.b13.map_or(0.0, |b| b[ex * r13 + o]);
            let act: Vec<f32> =
                (0..i).map(|n| round(activate(l.activation, GateUp::Concatenated, i, &d1, &b13, n))).collect();
            let (hq, hs) = per_token_group_quant(&act, 1, i, &quant).expect("h row quantises");
            let hq: Vec<f32> = hq.iter().map(|v| v.to_f32()).collect();
            let d2 = w2.gemm(&hq, &hs, seed(2));
            for (o, a) in acc.iter_mut().enumerate() {
                let b2 = l.b2.map_or(0.0, |b| b[ex * h + o]);
                *a += weights[t * k + j] * (round(d2[o]) + b2);
            }
        }
        if let Some(sh) = host_shared {
            // The accumulation model's seeds, apart from the routed slots' (1 and 2).
            let seed = |g: u64| noise.map(|(s, r)| (s ^ (t as u64).wrapping_mul(0x2000_0003) ^ g << 40, r));
            let g: Vec<f32> = sh.gate.gemm(&xq, &xs, seed(3)).into_iter().map(round).collect();
            let u = sh.up.gemm(&xq, &xs, seed(4)).into_iter().map(round);
            let is = g.len();
            let d1: Vec<f32> = g.iter().copied().chain(u).collect();
            let act: Vec<f32> =
                (0..is).map(|n| round(activate(l.activation, GateUp::Concatenated, is, &d1, &|_| 0.0, n))).collect();
            let (hq, hs) = per_token_group_quant(&act, 1, is, &quant).expect("h row quantises");
            let hq: Vec<f32> = hq.iter().map(|v| v.to_f32()).collect();
            let st = shared_weights.map_or(1.0, |w| w[t]);
            // One partial GEMM2 per device group, each rounded on its own.
            let per = i / SCALE_BLOCK;
            for (gi, b0) in (0..is / SCALE_BLOCK).step_by(per).enumerate() {
                let d2 = sh.down.gemm_blocks(&hq, &hs, b0..b0 + per, seed(5 + gi as u64));
                for (a, d) in acc.iter_mut().zip(d2) {
                    *a += st * round(d);
                }
            }
        }
        acc
    })
}

#[cfg(all(test, feature = "cli"))]
mod tests {
    use super::*;
    use crate::checkpoint::Fp8Config;
    use crate::experts::ExpertFormat;
    use crate::experts::PackedExperts;
    use crate::quant::{BlockFp8, BlockShape};
    use crate::random::{random_vec, topk_ids, SplitMix64};
    use crate::reference::moe_forward;

    struct Case {
        dense: PackedExperts<bf16>,
        fp8: PackedFp8Experts,
        x: Vec<bf16>,
        ids: Vec<i32>,
        w: Vec<f32>,
        k: usize,
    }

    fn case(e: usize, h: usize, i: usize, t: usize, k: usize, config: &Fp8Config, seed: u64) -> Case {
        let dense = PackedExperts::new(
            e,
            h,
            i,
            ExpertFormat::SWIGLU,
            blocky(random_vec(e * 2 * i * h, seed, 0.15), 2 * i, h, seed + 5),
            blocky(random_vec(e * h * i, seed + 1, 0.15), h, i, seed + 6),
            None,
            None,
        )
        .unwrap();
        let fp8 = PackedFp8Experts::quantize(&dense, config).unwrap();
        let mut rng = SplitMix64(seed + 2);
        let mut w: Vec<f32> = (0..t * k).map(|_| rng.unit().abs() + 0.1).collect();
        for r in w.chunks_mut(k) {
            let s: f32 = r.iter().sum();
            r.iter_mut().for_each(|v| *v /= s);
        }
        Case { dense, fp8, x: random_vec(t * h, seed + 3, 1.0), ids: topk_ids(t, k, e, seed + 4), w, k }
    }

    /// `w` (experts of `[n, k]`) with every 128 x 128 block scaled by its own factor in 1/4 .. 4, so the block
    /// scales differ from block to block and expert to expert.
    fn blocky(mut w: Vec<bf16>, n: usize, k: usize, seed: u64) -> Vec<bf16> {
        let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
        let mut rng = SplitMix64(seed);
        let f: Vec<f32> = (0..w.len() / (n * k) * gn * gk).map(|_| 4f32.powf(rng.unit())).collect();
        for (idx, v) in w.iter_mut().enumerate() {
            let (e, r, c) = (idx / (n * k), idx / k % n, idx % k);
            *v = bf16::from_f32(v.to_f32() * f[(e * gn + r / 128) * gk + c / 128]);
        }
        w
    }

    /// (rows outside `bulk`, rows, largest error / max |ref|) of `[rows, h]` outputs.
    fn stats(got: &[bf16], want: &[bf16], h: usize) -> (usize, usize, f32) {
        let (g, w) = (f32s(got), f32s(want));
        let max = max_abs(&w);
        let out = Fp8LayerBound::for_output(max).rows_outside_bulk(&g, &w, h);
        let worst = g.iter().zip(&w).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
        (out, g.len() / h, worst / max)
    }

    /// The dense experts the FP8 ones stand for: dequantised, rounded to bf16.
    fn dequantised(p: &PackedFp8Experts) -> PackedExperts<bf16> {
        let (mut w13, mut w2) = (Vec::new(), Vec::new());
        for e in 0..p.experts() {
            let (a, b) = p.expert(e).unwrap();
            w13.extend(a.dequantize().into_iter().map(bf16::from_f32));
            w2.extend(b.dequantize().into_iter().map(bf16::from_f32));
        }
        PackedExperts::new(p.experts(), p.hidden(), p.inter(), ExpertFormat::SWIGLU, w13, w2, None, None).unwrap()
    }

    /// `p` with the w13 scale grids of experts `a` and `b` swapped (elements in place).
    fn swap_w13_scales(p: &PackedFp8Experts, a: usize, b: usize) -> PackedFp8Experts {
        let mut per: Vec<(BlockFp8, BlockFp8)> = (0..p.experts()).map(|e| p.expert(e).unwrap()).collect();
        let (qa, sa) = per[a].0.clone().into_parts();
        let (qb, sb) = per[b].0.clone().into_parts();
        let (n, k) = (per[a].0.rows(), per[a].0.cols());
        per[a].0 = BlockFp8::from_parts(n, k, BlockShape::DEEPSEEK, qa, sb).unwrap();
        per[b].0 = BlockFp8::from_parts(n, k, BlockShape::DEEPSEEK, qb, sa).unwrap();
        PackedFp8Experts::from_experts(per).unwrap()
    }

    /// [`Fp8LayerBound`] holds with margin between the reference and the reference with the device's
    /// accumulation modelled (every 128-block partial sum off by up to 2^-13, promoted in f32), for f32 and UE8M0
    /// scales, several seeds and the GPU tests' shapes; it still holds at four times that error; two experts'
    /// w13 scale grids swapped break it. The dense bf16 layer is within [`fp8_vs_dense_tolerance`] with margin
    /// (on the dequantised and on the original weights), and outside the FP8 bound (the comparisons tell them
    /// apart).
    #[test]
    fn tolerance_covers_device_accumulation_and_catches_swapped_scales() {
        let shapes = [
            (8usize, 512usize, 256usize, 64usize, 2usize),
            (64, 256, 128, 48, 8),
            (8, 256, 128, 129, 1),
            (8, 512, 256, 37, 1),
            (8, 512, 256, 8, 1),
            (8, 512, 256, 1, 2),
        ];
        for config in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1] {
            for (n, &(e, h, i, t, k)) in shapes.iter().enumerate() {
                let name = format!("{:?} E {e} H {h} I {i} T {t} k {k}", config.scale_format());
                let c = case(e, h, i, t, k, &config, 10 + n as u64);
                let layer = Fp8HostLayer::new(&c.fp8, Activation::SiluGated);
                let want = moe_forward_fp8(&layer, &c.x, &c.ids, &c.w, c.k);
                let allowed = Fp8LayerBound::outlier_rows(t);
                for (rel, margin) in [(2f64.powi(-13), 1.5), (2f64.powi(-11), 1.0)] {
                    for seed in 0..4 {
                        let got = fp8_forward(&layer, None, &c.x, &c.ids, &c.w, c.k, Some((seed, rel)));
                        let (rows_out, rows, worst) = stats(&got, &want, h);
                        eprintln!(
                            "{name}: accumulation error {rel:e}, seed {seed}: {rows_out} of {rows} rows outside bulk \
                             ({allowed} allowed), worst {worst:.4} x max"
                        );
                        assert!(worst as f64 * margin <= 3.0 / 64.0, "{name}: {rel:e} seed {seed}: worst {worst}");
                        assert!(
                            rows_out as f64 * margin <= allowed as f64,
                            "{name}: {rel:e} seed {seed}: {rows_out} rows"
                        );
                        assert!(fp8_layer_mismatch(&got, &want, h).is_none());
                    }
                }
                let swapped = swap_w13_scales(&c.fp8, c.ids[0] as usize, c.ids[1 % c.ids.len()] as usize);
                if c.ids[0] != c.ids[1 % c.ids.len()] {
                    let bad =
                        moe_forward_fp8(&Fp8HostLayer::new(&swapped, Activation::SiluGated), &c.x, &c.ids, &c.w, c.k);
                    let (rows_out, rows, worst) = stats(&bad, &want, h);
                    eprintln!(
                        "{name}: swapped w13 scales: {rows_out} of {rows} rows outside bulk, worst {worst:.4} x max"
                    );
                    assert!(
                        fp8_layer_mismatch(&bad, &want, h).is_some() && worst >= 2.0 * 3.0 / 64.0,
                        "{name}: {worst}"
                    );
                }
                let dense = moe_forward(&dequantised(&c.fp8), &c.x, &c.ids, &c.w, c.k);
                let (_, _, vs_dense) = stats(&want, &dense, h);
                let original = moe_forward(&c.dense, &c.x, &c.ids, &c.w, c.k);
                let (_, _, vs_bf16) = stats(&want, &original, h);
                eprintln!("{name}: FP8 vs dense: worst {vs_dense:.4} x max; vs the original bf16 weights {vs_bf16:.4}");
                assert!(vs_dense * 1.5 <= 1.0 / 8.0, "{name}: the dense layer is {vs_dense} x max away");
                assert!(vs_bf16 * 1.5 <= 3.0 / 16.0, "{name}: the original bf16 layer is {vs_bf16} x max away");
                assert!(fp8_vs_dense_mismatch(&want, &dense, DenseWeights::Dequantised).is_none());
                assert!(fp8_vs_dense_mismatch(&want, &original, DenseWeights::Original).is_none());
                if t >= 16 {
                    assert!(
                        fp8_layer_mismatch(&dense, &want, h).is_some(),
                        "{name}: the FP8 bound must tell bf16 activations apart"
                    );
                }
            }
        }
    }
}
