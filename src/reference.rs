//! CPU references the GPU tests compare against, written for clarity and independence from the kernels'
//! indexing rather than speed.

use std::thread;

use crate::dtype::Element;

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
