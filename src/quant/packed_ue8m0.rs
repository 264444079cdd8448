//! DeepGEMM's SM100 scale-factor form: UE8M0 scales packed four per `int32` along K, stored MN-major with the MN
//! extent padded to 4 (16 bytes, TMA's alignment), what `deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor`
//! makes from f32 power-of-two scales `[groups, mn, k_sf]`:
//!
//! - byte `j` (little-endian) of word `(g, m, q)` is the scale of `(g, m, k = 4q + j)`;
//! - the word sits at `g · k_words · mn_padded + q · mn_padded + m` (`k_words = ⌈k_sf / 4⌉`,
//!   `mn_padded = ⌈mn / 4⌉ · 4`);
//! - padding (rows past `mn`, scales past `k_sf`) is zero bytes.
//!
//! DeepGEMM takes a float's exponent byte (`bits >> 23`), which silently truncates a scale that is not a power
//! of two; here such a scale is refused ([`Ue8m0::from_f32_exact`]), and every conversion round-trips exactly.
//! A serving stack meets this form in DeepGEMM-prepared checkpoints and in kernels written against DeepGEMM; the
//! crate's own SM100 kernels take CUTLASS's 128 × 4 atoms ([`super::to_sf_atoms`]).

use super::Ue8m0;
use crate::error::{Error, Result};

fn invalid(msg: String) -> Error {
    Error::InvalidProblem(msg)
}

/// UE8M0 scales of `groups` `[mn, k_sf]` grids in DeepGEMM's packed MN-major form (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedUe8m0 {
    groups: usize,
    mn: usize,
    k_sf: usize,
    words: Vec<u32>,
}

impl PackedUe8m0 {
    /// Words per group's K (`⌈k_sf / 4⌉`) and its padded MN extent (`⌈mn / 4⌉ · 4`).
    pub const fn padded_dims(mn: usize, k_sf: usize) -> (usize, usize) {
        (k_sf.div_ceil(4), mn.div_ceil(4) * 4)
    }

    /// Index of the word holding scale `(g, m, k)` and the byte within it.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `(g, m, k)` is outside `[groups, mn, k_sf]`.
    pub fn locate(&self, g: usize, m: usize, k: usize) -> Result<(usize, usize)> {
        if g >= self.groups || m >= self.mn || k >= self.k_sf {
            return Err(invalid(format!(
                "packed UE8M0 scale ({g}, {m}, {k}) is outside [{}, {}, {}]",
                self.groups, self.mn, self.k_sf
            )));
        }
        let (kw, mp) = Self::padded_dims(self.mn, self.k_sf);
        Ok((g * kw * mp + (k / 4) * mp + m, k % 4))
    }

    /// Packs UE8M0 scales `[groups, mn, k_sf]` (row-major, K fastest).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `scales` is not `groups · mn · k_sf` long.
    pub fn from_ue8m0(scales: &[Ue8m0], groups: usize, mn: usize, k_sf: usize) -> Result<PackedUe8m0> {
        let want = groups.checked_mul(mn).and_then(|x| x.checked_mul(k_sf));
        if want != Some(scales.len()) {
            return Err(invalid(format!(
                "{} UE8M0 scales for a [{groups}, {mn}, {k_sf}] grid: expected groups x mn x k_sf",
                scales.len()
            )));
        }
        let (kw, mp) = Self::padded_dims(mn, k_sf);
        let mut packed = PackedUe8m0 { groups, mn, k_sf, words: vec![0; groups * kw * mp] };
        for g in 0..groups {
            for m in 0..mn {
                for k in 0..k_sf {
                    let (w, b) = packed.locate(g, m, k)?;
                    packed.words[w] |= (scales[(g * mn + m) * k_sf + k].0 as u32) << (8 * b);
                }
            }
        }
        Ok(packed)
    }

    /// Packs f32 scales `[groups, mn, k_sf]`, each of which must be an exact power of two in UE8M0's range (as a
    /// DeepSeek-V3 checkpoint quantised with UE8M0 scales holds them).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the first scale that is not such a power of two (never rounded), or a
    /// length that is not `groups · mn · k_sf`.
    pub fn from_f32(scales: &[f32], groups: usize, mn: usize, k_sf: usize) -> Result<PackedUe8m0> {
        let bytes = scales
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                Ue8m0::from_f32_exact(s).map_err(|e| invalid(format!("scale {i} of [{groups}, {mn}, {k_sf}]: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::from_ue8m0(&bytes, groups, mn, k_sf)
    }

    /// Takes DeepGEMM's words as they are in memory (`groups · ⌈k_sf / 4⌉ · ⌈mn / 4⌉ · 4` of them).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for another length, or a padding byte that is not zero (a tensor of another
    /// shape read as this one).
    pub fn from_words(words: Vec<u32>, groups: usize, mn: usize, k_sf: usize) -> Result<PackedUe8m0> {
        let (kw, mp) = Self::padded_dims(mn, k_sf);
        if Some(words.len()) != groups.checked_mul(kw).and_then(|x| x.checked_mul(mp)) {
            return Err(invalid(format!(
                "{} packed UE8M0 words for a [{groups}, {mn}, {k_sf}] grid: expected groups x ceil(k_sf / 4) x \
                 (mn padded to 4) = {groups} x {kw} x {mp}",
                words.len()
            )));
        }
        for (i, &w) in words.iter().enumerate() {
            let (q, m) = ((i / mp) % kw, i % mp);
            let used = if m >= mn { 0 } else { (k_sf - 4 * q).min(4) };
            let pad_mask = if used == 4 { 0 } else { u32::MAX << (8 * used) };
            if w & pad_mask != 0 {
                return Err(invalid(format!(
                    "packed UE8M0 word {i} (m {m}, k {}..{}) has nonzero padding {w:#010x}: not a [{groups}, {mn}, \
                     {k_sf}] grid",
                    4 * q,
                    4 * q + 4
                )));
            }
        }
        Ok(PackedUe8m0 { groups, mn, k_sf, words })
    }

    /// The scales back as `[groups, mn, k_sf]` UE8M0 bytes (padding dropped).
    pub fn to_ue8m0(&self) -> Vec<Ue8m0> {
        let mut out = Vec::with_capacity(self.groups * self.mn * self.k_sf);
        for g in 0..self.groups {
            for m in 0..self.mn {
                for k in 0..self.k_sf {
                    let (w, b) = self.locate(g, m, k).expect("in range by construction");
                    out.push(Ue8m0((self.words[w] >> (8 * b)) as u8));
                }
            }
        }
        out
    }

    /// The scales back as exact f32 powers of two, `[groups, mn, k_sf]`.
    pub fn to_f32(&self) -> Vec<f32> {
        self.to_ue8m0().into_iter().map(Ue8m0::to_f32_exact).collect()
    }

    /// The words in memory order, as DeepGEMM's kernels read them.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Bytes of the packed form (padding included).
    pub fn bytes(&self) -> usize {
        self.words.len() * 4
    }

    pub fn dims(&self) -> (usize, usize, usize) {
        (self.groups, self.mn, self.k_sf)
    }
}
