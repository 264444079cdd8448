//! The CPU references the GPU tests compare against, all in this one module, written for clarity and
//! independence from the kernels' indexing rather than speed: the GEMMs' rows and FP8 operands (here), the
//! expert layouts ([`layouts`]), the routers ([`routing`]) and the MoE layer in every dtype ([`moe_forward`],
//! [`moe_forward_fp8`], [`moe_forward_fp8_channel`], [`moe_forward_mx`], with their bounds) and the
//! expert-parallel step ([`ep_forward_reference`]). It stands on the
//! top floor: a reference may use any part of the crate's vocabulary, and nothing in the library uses it.

use std::thread;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::quant::{BlockFp8, BlockShape, Scales};

mod layer;
pub mod layouts;
mod parallel;
pub mod routing;
pub use layer::*;
pub use parallel::ep_forward_reference;

/// `D[r] = A[r] · B[group(r)]ᵀ` in f32 (products of the inputs' exact values, f32 sums) for the rows in
/// `rows`, where `group(r)` is found by scanning the per-group sizes. Returns `rows.len() × n` values.
///
/// A is `[*, k]`, B `[G, n, k]`; `sizes[g]` rows belong to group `g`, in order. Rows past the groups' total
/// have no group: asking for one panics. Work is spread over the machine's cores.
pub fn grouped_gemm_rows<T: Element>(
    a: &[T],
    b: &[T],
    sizes: &[usize],
    n: usize,
    k: usize,
    rows: &[usize],
) -> Vec<f32> {
    // Row -> group by walking the sizes: deliberately not the prefix-sum indexing the device code uses.
    let group_of = |r: usize| -> usize {
        let mut seen = 0;
        for (g, &s) in sizes.iter().enumerate() {
            if r < seen + s {
                return g;
            }
            seen += s;
        }
        unreachable!("row {r} checked against the total {seen}");
    };
    let total: usize = sizes.iter().sum();
    if let Some(&r) = rows.iter().find(|&&r| r >= total) {
        panic!("row {r} is past the last group (total {total})");
    }
    let mut out = vec![0f32; rows.len() * n];
    let threads = thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(64);
    let chunk = rows.len().div_ceil(threads).max(1);
    thread::scope(|s| {
        for (rows, out) in rows.chunks(chunk).zip(out.chunks_mut(chunk * n)) {
            s.spawn(move || {
                let mut arow = vec![0f32; k];
                for (i, &r) in rows.iter().enumerate() {
                    let g = group_of(r);
                    for (x, v) in arow.iter_mut().zip(&a[r * k..(r + 1) * k]) {
                        *x = v.to_f32();
                    }
                    for j in 0..n {
                        let w = &b[(g * n + j) * k..(g * n + j + 1) * k];
                        let mut acc = 0f32;
                        for (x, y) in arow.iter().zip(w) {
                            acc += x * y.to_f32();
                        }
                        out[i * n + j] = acc;
                    }
                }
            });
        }
    });
    out
}

/// `N` of the first expert of `b` and `K` of `a`; `what` names the reference in the error for no experts.
fn expert_extents(what: &str, a: &BlockFp8, b: &[BlockFp8]) -> Result<(usize, usize)> {
    match b.first() {
        Some(e) => Ok((e.rows(), a.cols())),
        None => Err(Error::InvalidProblem(format!("{what}: no experts"))),
    }
}

/// The FP8 blockwise grouped GEMM in f64: for each `(row, group)` of `rows`, the `n` outputs
/// `D[row, j] = Σ_k (qa[row, k] · sa[row, k / 128]) · (qb[group][j, k] · sb[group][j / 128, k / 128])`,
/// over the dequantised operands formed exactly in f64 (an e4m3 value times an f32 scale has at most 28
/// significant bits). Returns `rows.len() × n` values.
///
/// `a` holds activations `[*, K]` quantized per row per 128 of K (`BlockShape::PER_TOKEN_128`), `b` one expert
/// `[n, K]` per group quantized in `BlockShape::DEEPSEEK` blocks, all with F32 scales. The scale of an element
/// is looked up from its block coordinates, not from the device's offset formulas.
///
/// # Errors
/// [`Error::InvalidProblem`] when the block shapes, scale formats or K differ, experts differ in shape, or a
/// row or group is out of range.
pub fn blockwise_fp8_rows(a: &BlockFp8, b: &[BlockFp8], rows: &[(usize, usize)]) -> Result<Vec<f64>> {
    let bad = |m: String| Err(Error::InvalidProblem(format!("blockwise FP8 reference: {m}")));
    let (n, k) = expert_extents("blockwise FP8 reference", a, b)?;
    if a.block() != BlockShape::PER_TOKEN_128 {
        return bad(format!("activations in {:?} blocks, expected 1 x 128", a.block()));
    }
    for (g, e) in b.iter().enumerate() {
        if e.block() != BlockShape::DEEPSEEK || (e.rows(), e.cols()) != (n, k) {
            return bad(format!(
                "expert {g} is [{}, {}] in {:?} blocks, expected [{n}, {k}] in 128 x 128",
                e.rows(),
                e.cols(),
                e.block()
            ));
        }
    }
    scaled_fp8_rows(a, b, rows)
}

/// [`blockwise_fp8_rows`] for any scale blocks: A and every expert dequantised with the scale of the block each
/// element lies in (per token and per channel: `1 x K` blocks; per tensor: one block), then the f64 products.
/// The rowwise GEMM's reference.
///
/// # Errors
/// [`Error::InvalidProblem`] for no experts, experts of another shape than `[N, K]`, non-F32 scales, a row or
/// group out of range.
pub fn scaled_fp8_rows(a: &BlockFp8, b: &[BlockFp8], rows: &[(usize, usize)]) -> Result<Vec<f64>> {
    let bad = |m: String| Err(Error::InvalidProblem(format!("scaled FP8 reference: {m}")));
    let (n, k) = expert_extents("scaled FP8 reference", a, b)?;
    if let Some(g) = b.iter().position(|e| (e.rows(), e.cols()) != (n, k)) {
        return bad(format!("expert {g} is [{}, {}], expected [{n}, {k}]", b[g].rows(), b[g].cols()));
    }
    if let Some(&(r, g)) = rows.iter().find(|&&(r, g)| r >= a.rows() || g >= b.len()) {
        return bad(format!("row {r} of group {g}: A has {} rows and there are {} experts", a.rows(), b.len()));
    }
    // x[i, j] = q · s in f64, with the scale found from the block coordinates.
    let dequant = |m: &BlockFp8| -> Result<Vec<f64>> {
        let (br, bc) = (m.block().rows, m.block().cols);
        let gc = m.cols().div_ceil(bc);
        let scales = match m.scales() {
            Scales::F32(s) => s,
            other => return bad(format!("{:?} scales, expected F32", other.format())),
        };
        Ok(m.q()
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let (r, c) = (i / m.cols(), i % m.cols());
                q.to_f32() as f64 * scales[(r / br) * gc + c / bc] as f64
            })
            .collect())
    };
    let x = dequant(a)?;
    let mut out = vec![0f64; rows.len() * n];
    let threads = thread::available_parallelism().map(|t| t.get()).unwrap_or(1).min(64);
    for (g, expert) in b.iter().enumerate() {
        let mine: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].1 == g).collect();
        if mine.is_empty() {
            continue;
        }
        let w = dequant(expert)?;
        let (x, w) = (&x, &w);
        let chunk = mine.len().div_ceil(threads).max(1);
        let results: Vec<Vec<(usize, Vec<f64>)>> = thread::scope(|s| {
            let handles: Vec<_> = mine
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|&i| {
                                let xr = &x[rows[i].0 * k..(rows[i].0 + 1) * k];
                                let d = (0..n)
                                    .map(|j| xr.iter().zip(&w[j * k..(j + 1) * k]).map(|(p, q)| p * q).sum::<f64>())
                                    .collect();
                                (i, d)
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("reference thread")).collect()
        });
        for (i, d) in results.into_iter().flatten() {
            out[i * n..(i + 1) * n].copy_from_slice(&d);
        }
    }
    Ok(out)
}

/// Tolerance for comparing a 16-bit GPU result with an f32 reference: `|got − ref| ≤ atol + rtol·|ref|`,
/// with `rtol` two half-ulps of the output type (its rounding plus fp32 accumulation order) and `atol` a
/// small fraction of the largest reference magnitude (cancellation near zero).
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub atol: f32,
    pub rtol: f32,
}

impl Tolerance {
    pub fn for_output<T: Element>(max_abs_ref: f32) -> Tolerance {
        let h = T::DTYPE.half_ulp();
        Tolerance { atol: h * 0.5 * max_abs_ref.max(1e-6), rtol: 2.0 * h }
    }

    pub fn accepts(&self, got: f32, reference: f32) -> bool {
        // NaN never passes: the comparison is false.
        (got - reference).abs() <= self.atol + self.rtol * reference.abs()
    }
}

/// The first element of `got` outside tolerance of `reference`, as (index, got, ref).
pub fn first_mismatch(got: &[f32], reference: &[f32], tol: Tolerance) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), reference.len());
    got.iter().zip(reference).enumerate().find(|(_, (g, r))| !tol.accepts(**g, **r)).map(|(i, (g, r))| (i, *g, *r))
}
