//! The SM100 block-scale-factor layout (CUTLASS's `Sm1xxBlockScaledConfig`): scale grids in atoms of 128 rows ×
//! 4 K-blocks, per matrix and per group of stacked rows, with the exact inverses. Used by the MX and NV formats of
//! [`super::mx`] and checked on the H200 against the device quantisers' layouts.

use crate::error::{Error, Result};

fn invalid(msg: String) -> Error {
    Error::InvalidProblem(msg)
}

/// Rows of one scale-factor atom.
pub const SF_ATOM_ROWS: usize = 128;
/// Scale columns (K-blocks) of one atom.
pub const SF_ATOM_COLS: usize = 4;
/// Bytes of one atom (128 rows × 4 one-byte scales).
pub const SF_ATOM_BYTES: usize = SF_ATOM_ROWS * SF_ATOM_COLS;

/// Bytes of the atom layout of an `[m_total, k_blocks]` scale grid: rows padded to 128, K-blocks to 4.
pub fn sf_atom_bytes(m_total: usize, k_blocks: usize) -> usize {
    m_total.div_ceil(SF_ATOM_ROWS) * SF_ATOM_ROWS * k_blocks.div_ceil(SF_ATOM_COLS) * SF_ATOM_COLS
}

/// The byte offset of row `m`'s scale for K-block `k_block` in CUTLASS's `Sm1xxBlockScaledConfig` layout of an
/// `[m_total, k_blocks]` grid (`k_blocks = K / vec`): atoms of 128 rows × 4 K-blocks (512 B), K-fastest, and
/// within an atom `16 · (m % 32) + 4 · ((m / 32) % 4) + k_block % 4` (the atom
/// `((32,4),(Vec,4)):((16,4),(0,1))`; torch's `SWIZZLE_32_4_4`).
///
/// # Errors
/// [`Error::InvalidProblem`] for `m >= m_total` or `k_block >= k_blocks`.
pub fn sf_offset(m: usize, k_block: usize, m_total: usize, k_blocks: usize) -> Result<usize> {
    if m >= m_total || k_block >= k_blocks {
        return Err(invalid(format!("scale ({m}, {k_block}) is outside the [{m_total}, {k_blocks}] scale grid")));
    }
    let atoms_k = k_blocks.div_ceil(SF_ATOM_COLS);
    let atom = (m / SF_ATOM_ROWS) * atoms_k + k_block / SF_ATOM_COLS;
    Ok(atom * SF_ATOM_BYTES + 16 * (m % 32) + 4 * ((m / 32) % 4) + k_block % 4)
}

fn check_grid(what: &str, len: usize, m: usize, k_blocks: usize) -> Result<()> {
    if m.checked_mul(k_blocks) != Some(len) {
        return Err(invalid(format!("{what}: {len} scales for an [{m}, {k_blocks}] scale grid")));
    }
    Ok(())
}

/// A plain row-major `[m, k_blocks]` scale grid in the atom layout ([`sf_offset`]), [`sf_atom_bytes`] long; the
/// padding is 0.
///
/// # Errors
/// [`Error::InvalidProblem`] when `grid` does not hold `m · k_blocks` scales.
pub fn to_sf_atoms(grid: &[u8], m: usize, k_blocks: usize) -> Result<Vec<u8>> {
    check_grid("to_sf_atoms", grid.len(), m, k_blocks)?;
    let mut out = vec![0u8; sf_atom_bytes(m, k_blocks)];
    for r in 0..m {
        for c in 0..k_blocks {
            out[sf_offset(r, c, m, k_blocks)?] = grid[r * k_blocks + c];
        }
    }
    Ok(out)
}

/// The plain `[m, k_blocks]` grid of an atom-layout buffer: the inverse of [`to_sf_atoms`].
///
/// # Errors
/// [`Error::InvalidProblem`] when `atoms` is not [`sf_atom_bytes`]`(m, k_blocks)` long.
pub fn from_sf_atoms(atoms: &[u8], m: usize, k_blocks: usize) -> Result<Vec<u8>> {
    let want = sf_atom_bytes(m, k_blocks);
    if atoms.len() != want {
        return Err(invalid(format!(
            "from_sf_atoms: {} bytes for an [{m}, {k_blocks}] grid, expected {want}",
            atoms.len()
        )));
    }
    let mut out = Vec::with_capacity(m * k_blocks);
    for r in 0..m {
        for c in 0..k_blocks {
            out.push(atoms[sf_offset(r, c, m, k_blocks)?]);
        }
    }
    Ok(out)
}

/// The byte offset of each group's atom layout in one buffer, and the buffer's length: group `g` (`rows[g]`
/// rows) starts at `Σ_{j<g} sf_atom_bytes(rows[j], k_blocks)`, a multiple of 512 (so 128-byte aligned, as TMA
/// needs: vLLM's `sf_offsets`). An empty group takes no bytes.
pub fn sf_group_bases(rows: &[usize], k_blocks: usize) -> (Vec<usize>, usize) {
    let mut at = 0;
    let bases = rows
        .iter()
        .map(|&m| {
            let b = at;
            at += sf_atom_bytes(m, k_blocks);
            b
        })
        .collect();
    (bases, at)
}

/// A plain `[Σ rows, k_blocks]` grid (groups stacked by rows) to per-group atom layouts at [`sf_group_bases`].
///
/// # Errors
/// [`Error::InvalidProblem`] when `grid` does not hold `Σ rows · k_blocks` scales.
pub fn to_sf_atoms_grouped(grid: &[u8], rows: &[usize], k_blocks: usize) -> Result<Vec<u8>> {
    let total: usize = rows.iter().sum();
    check_grid("to_sf_atoms_grouped", grid.len(), total, k_blocks)?;
    let (bases, len) = sf_group_bases(rows, k_blocks);
    let mut out = vec![0u8; len];
    let mut row0 = 0;
    for (&m, &base) in rows.iter().zip(&bases) {
        let g = to_sf_atoms(&grid[row0 * k_blocks..(row0 + m) * k_blocks], m, k_blocks)?;
        out[base..base + g.len()].copy_from_slice(&g);
        row0 += m;
    }
    Ok(out)
}

/// The inverse of [`to_sf_atoms_grouped`].
///
/// # Errors
/// [`Error::InvalidProblem`] when `atoms` is not the length [`sf_group_bases`] gives.
pub fn from_sf_atoms_grouped(atoms: &[u8], rows: &[usize], k_blocks: usize) -> Result<Vec<u8>> {
    let (bases, len) = sf_group_bases(rows, k_blocks);
    if atoms.len() != len {
        return Err(invalid(format!(
            "from_sf_atoms_grouped: {} bytes for groups of {rows:?} rows x {k_blocks} K-blocks, expected {len}",
            atoms.len()
        )));
    }
    let mut out = Vec::new();
    for (&m, &base) in rows.iter().zip(&bases) {
        out.extend(from_sf_atoms(&atoms[base..base + sf_atom_bytes(m, k_blocks)], m, k_blocks)?);
    }
    Ok(out)
}
