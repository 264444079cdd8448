//! Microscaling (MX) and NVFP4 block formats on the host: element codecs, quantisers, exact dequantisers, and
//! the SM100 block-scale-factor layout (CUTLASS `Sm1xxBlockScaledConfig`).
//!
//! | format | element | scale | block along K |
//! |---|---|---|---|
//! | [`Mxfp8`] | e4m3 ([`F8E4M3`], max 448) | [`Ue8m0`] (`2^(b − 127)`) | 32 ([`MX_BLOCK`]) |
//! | [`Mxfp4`] | e2m1 ([`E2m1`], max 6) | [`Ue8m0`] | 32 |
//! | [`Nvfp4`] | e2m1 | [`Ue4m3`] (unsigned e4m3, max 448) × one f32 per tensor | 16 ([`NV_BLOCK`]) |
//!
//! A matrix is `[rows, k]` row-major (K-major, as MXF4/NVF4 MMAs need both operands), with one scale per row per
//! block of K; `k` must be a multiple of the block (checked: there is no partial block). FP4 data is packed two
//! elements per byte, the **even element in the low nibble** (gpt-oss's checkpoints and CUTLASS's
//! `float_e2m1_t` arrays store it so).
//!
//! **Scale rounding is upward.** A block with largest magnitude `amax` gets the smallest representable scale
//! `s >= amax / max_elem` (UE8M0: the next power of two, [`Ue8m0::from_f32_ceil`]; UE4M3: the next e4m3 value,
//! [`Ue4m3::from_f32_ceil`]), so `|x / s| <= max_elem` for every element and nothing saturates; rounding to nearest
//! (or the OCP MX spec's `floor(log2 amax) − emax`) would push the block's largest elements past the element
//! maximum, where they clip by up to a factor of 2 for UE8M0. Elements are then rounded to nearest even. All-zero
//! blocks get scale 1. Every dequantiser is exact: `q · s` (· the tensor scale for NVFP4) computed in f32 has no
//! rounding, since the factors have at most 4 significant bits together and f32 covers the exponents.
//!
//! **Loud failures** ([`Error::InvalidProblem`], naming the constraint): `k` not a multiple of the block, data or
//! scale lengths that do not match the shape, non-finite input, a UE8M0 scale byte `0xFF` (NaN) or a UE4M3 byte
//! with the sign bit or NaN, and [`Ue8m0::from_f32_exact`] given a value that is not a power of two.
//!
//! The scale grids go to SM100 block-scaled GEMMs in the 128 × 4 atom layout: [`sf_offset`], [`to_sf_atoms`],
//! [`from_sf_atoms`], and their grouped forms ([`sf_group_bases`], [`to_sf_atoms_grouped`],
//! [`from_sf_atoms_grouped`]).

use half::bf16;

use super::{Ue8m0, E4M3_MAX, F8E4M3};
use crate::error::{Error, Result};

// The 128 × 4 atom layout lives in its own file; re-exported here, where the formats that use it are.
pub use super::sf_atoms::{
    from_sf_atoms, from_sf_atoms_grouped, sf_atom_bytes, sf_group_bases, sf_offset, to_sf_atoms, to_sf_atoms_grouped,
    SF_ATOM_BYTES, SF_ATOM_COLS, SF_ATOM_ROWS,
};

/// Elements per scale of the MX formats (OCP MX; CUTLASS `mx_float{8,4}_t`).
pub const MX_BLOCK: usize = 32;
/// Elements per scale of NVFP4 (CUTLASS `nv_float4_t`).
pub const NV_BLOCK: usize = 16;
/// The largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// The e2m1 values by code (bit 3 sign, bits 2..1 exponent, bit 0 mantissa), gpt-oss's `FP4_VALUES`.
pub const FP4_LUT: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

fn invalid(msg: String) -> Error {
    Error::InvalidProblem(msg)
}

// ---- Element and scale codecs ----

/// An FP4 E2M1 element: the low 4 bits of the byte it is made from; no infinity, no NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct E2m1(u8);

impl E2m1 {
    /// The code `bits & 0xF` (the high nibble is ignored, so a packed byte's low element is `from_bits(b)` and its
    /// high one `from_bits(b >> 4)`).
    pub const fn from_bits(bits: u8) -> E2m1 {
        E2m1(bits & 0xF)
    }
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    pub fn to_f32(self) -> f32 {
        FP4_LUT[self.0 as usize]
    }

    /// Rounds to the nearest e2m1 value, ties to the even code (the even mantissa), saturating to ±6; the sign is
    /// kept (so tiny negatives become −0). NaN, which e2m1 cannot hold, becomes +6 (PTX `cvt.rn.satfinite`'s
    /// rule); the quantisers of this module reject non-finite input before it gets here.
    pub fn from_f32(x: f32) -> E2m1 {
        if x.is_nan() {
            return E2m1(7);
        }
        let sign = if x.is_sign_negative() { 8 } else { 0 };
        let a = x.abs();
        // The magnitudes by code 0..=7, and the midpoints between neighbours.
        let mut code = 7u8;
        for c in 0..7u8 {
            let (lo, hi) = (FP4_LUT[c as usize], FP4_LUT[c as usize + 1]);
            let mid = 0.5 * (lo + hi);
            if a < mid || (a == mid && c % 2 == 0) {
                code = c;
                break;
            }
        }
        E2m1(sign | code)
    }
}

/// Packs e2m1 codes two per byte, element `2j` in the low nibble of byte `j`.
///
/// # Errors
/// [`Error::InvalidProblem`] for an odd number of elements.
pub fn pack_e2m1(codes: &[E2m1]) -> Result<Vec<u8>> {
    if codes.len() % 2 != 0 {
        return Err(invalid(format!(
            "{} e2m1 elements: two are packed per byte, so the count must be even",
            codes.len()
        )));
    }
    Ok(codes.chunks_exact(2).map(|p| p[0].0 | (p[1].0 << 4)).collect())
}

/// The e2m1 codes of packed bytes: byte `j`'s low nibble is element `2j`, its high nibble element `2j + 1`.
pub fn unpack_e2m1(bytes: &[u8]) -> Vec<E2m1> {
    bytes.iter().flat_map(|&b| [E2m1::from_bits(b), E2m1::from_bits(b >> 4)]).collect()
}

/// `2^e` for `e` in `-149 ..= 127`, exactly (subnormals included).
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

impl Ue8m0 {
    /// The scale `x`, which must be a power of two within `2^-127 ..= 2^127`: scales read from a checkpoint or
    /// another format are never rounded into UE8M0.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming `x` when it is not such a power of two.
    pub fn from_f32_exact(x: f32) -> Result<Ue8m0> {
        match Ue8m0::from_f32_ceil(x) {
            Ok(u) if u.to_f32_exact() == x => Ok(u),
            _ => Err(invalid(format!(
                "UE8M0 scale of {x:e}: not a power of two within 2^-127 ..= 2^127, which UE8M0 requires"
            ))),
        }
    }

    /// `2^(bits − 127)` computed from the bits (exact, `2^-127` included); NaN for `0xFF`.
    pub fn to_f32_exact(self) -> f32 {
        if self.0 == 0xFF {
            f32::NAN
        } else {
            pow2(self.0 as i32 - 127)
        }
    }
}

/// An unsigned E4M3 scale (NVFP4's block scale, CUTLASS `float_ue4m3_t`): the byte of a non-negative E4M3FN
/// value, 4 exponent bits (bias 7) and 3 mantissa bits; `0x00` = 0, `0x01` = `2^-9` (smallest subnormal),
/// `0x08` = `2^-6` (smallest normal), `0x38` = 1, `0x7E` = 448 (largest). `0x7F` (NaN) and bytes with bit 7 set
/// (a sign) are not scales: [`Ue4m3::from_bits`] refuses them, so a value of this type always has a finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ue4m3(u8);

impl Ue4m3 {
    pub const ONE: Ue4m3 = Ue4m3(0x38);
    pub const MAX: Ue4m3 = Ue4m3(0x7E);
    /// The largest UE4M3 value.
    pub const MAX_F32: f32 = 448.0;

    /// # Errors
    /// [`Error::InvalidProblem`] for `0x7F` (NaN) or a byte with bit 7 set.
    pub fn from_bits(bits: u8) -> Result<Ue4m3> {
        if bits >= 0x7F {
            return Err(invalid(format!(
                "UE4M3 scale byte {bits:#04x}: {} (valid bytes are 0x00 ..= 0x7E)",
                if bits == 0x7F { "NaN" } else { "bit 7 (a sign) is set" }
            )));
        }
        Ok(Ue4m3(bits))
    }
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    /// The value, exactly.
    pub fn to_f32(self) -> f32 {
        let (e, m) = ((self.0 >> 3) as i32, (self.0 & 7) as f32);
        if e == 0 {
            m * pow2(-9)
        } else {
            (1.0 + m / 8.0) * pow2(e - 7)
        }
    }

    /// The smallest UE4M3 value `>= x` (so `|w| / s <= 6` when `x = amax / 6`); values above 448 (by f32
    /// rounding of an `x` that is 448 in exact arithmetic) give 448.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `x` negative or not finite.
    pub fn from_f32_ceil(x: f32) -> Result<Ue4m3> {
        if !(x.is_finite() && x >= 0.0) {
            return Err(invalid(format!("UE4M3 scale of {x}: must be finite and non-negative")));
        }
        // Values are increasing in the byte: the first byte whose value reaches x.
        Ok((0..=0x7E).map(Ue4m3).find(|s| s.to_f32() >= x).unwrap_or(Ue4m3::MAX))
    }

    /// The nearest UE4M3 value to `x`, ties to the even mantissa, saturating at 448.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `x` negative or not finite.
    pub fn from_f32_nearest(x: f32) -> Result<Ue4m3> {
        if !(x.is_finite() && x >= 0.0) {
            return Err(invalid(format!("UE4M3 scale of {x}: must be finite and non-negative")));
        }
        let up = Ue4m3::from_f32_ceil(x)?;
        if up.0 == 0 || up.to_f32() == x || up == Ue4m3::MAX && x > 448.0 {
            return Ok(up);
        }
        let down = Ue4m3(up.0 - 1);
        let (dd, du) = (x - down.to_f32(), up.to_f32() - x);
        Ok(if dd < du || (dd == du && down.0 % 2 == 0) { down } else { up })
    }
}

// ---- Shapes ----

/// Checks a `[rows, k]` matrix with `block`-wide scale blocks: `k` a positive multiple of `block`, `len`
/// elements. Returns `(elements, scales)`.
fn check_shape(what: &str, rows: usize, k: usize, block: usize) -> Result<(usize, usize)> {
    if k == 0 || k % block != 0 {
        return Err(invalid(format!(
            "{what} [{rows}, {k}]: K = {k} must be a positive multiple of the {block}-element block"
        )));
    }
    let n = rows.checked_mul(k).ok_or_else(|| invalid(format!("{what} [{rows}, {k}]: rows x K overflows usize")))?;
    Ok((n, n / block))
}

fn check_len(what: &str, rows: usize, k: usize, part: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(invalid(format!("{what} [{rows}, {k}]: {got} {part}, expected {want}")));
    }
    Ok(())
}

fn check_finite(what: &str, w: &[f32], k: usize) -> Result<()> {
    match w.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(invalid(format!("{what}: element [{}, {}] = {} is not finite", i / k, i % k, w[i]))),
        None => Ok(()),
    }
}

fn check_ue8m0(what: &str, scales: &[Ue8m0], blocks_per_row: usize) -> Result<()> {
    match scales.iter().position(|s| s.0 == 0xFF) {
        Some(i) => Err(invalid(format!(
            "{what}: scale [{}, {}] is 0xFF, the UE8M0 NaN",
            i / blocks_per_row,
            i % blocks_per_row
        ))),
        None => Ok(()),
    }
}

/// A scale grid of `rows` rows of `blocks` scale bytes in SM100's 128 × 4 atom layout ([`to_sf_atoms`]); the
/// grid's shape was checked when its type was made.
fn sf_atoms_of(grid: impl Iterator<Item = u8>, rows: usize, blocks: usize) -> Vec<u8> {
    let grid: Vec<u8> = grid.collect();
    to_sf_atoms(&grid, rows, blocks).expect("the grid fits the shape, checked when made")
}

fn amax(block: &[f32]) -> f32 {
    block.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// The UE8M0 scale of a block: the next power of two `>= amax / max_elem` (1 for an all-zero block).
fn ue8m0_for(what: &str, amax: f32, max_elem: f32, row: usize, blk: usize) -> Result<Ue8m0> {
    if amax == 0.0 {
        return Ok(Ue8m0::ONE);
    }
    // amax / max_elem may underflow to 0 for blocks of tiny subnormals: the smallest UE8M0 then.
    let s = (amax / max_elem).max(pow2(-127));
    Ue8m0::from_f32_ceil(s).map_err(|e| invalid(format!("{what}: block [{row}, {blk}]: {e}")))
}

// ---- MXFP8 ----

/// An MXFP8 matrix `[rows, k]`: e4m3 elements, one [`Ue8m0`] per row per 32 of K (`[rows, k / 32]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp8 {
    rows: usize,
    k: usize,
    data: Vec<F8E4M3>,
    scales: Vec<Ue8m0>,
}

impl Mxfp8 {
    /// # Errors
    /// [`Error::InvalidProblem`]: `k` not a positive multiple of 32, lengths other than `rows · k` and
    /// `rows · k / 32`, a NaN scale byte.
    pub fn from_parts(rows: usize, k: usize, data: Vec<F8E4M3>, scales: Vec<Ue8m0>) -> Result<Mxfp8> {
        let (n, s) = check_shape("MXFP8", rows, k, MX_BLOCK)?;
        check_len("MXFP8", rows, k, "elements", data.len(), n)?;
        check_len("MXFP8", rows, k, "scales", scales.len(), s)?;
        check_ue8m0("MXFP8", &scales, k / MX_BLOCK)?;
        Ok(Mxfp8 { rows, k, data, scales })
    }

    /// Quantises `w [rows, k]`: per block `s = ceil_pow2(amax / 448)`, `q = e4m3(w / s)` (nearest even).
    ///
    /// # Errors
    /// As [`Self::from_parts`]; a non-finite element (named); a block whose scale leaves UE8M0's range.
    pub fn quantize(w: &[f32], rows: usize, k: usize) -> Result<Mxfp8> {
        let (n, _) = check_shape("MXFP8", rows, k, MX_BLOCK)?;
        check_len("MXFP8 input", rows, k, "elements", w.len(), n)?;
        check_finite("MXFP8 input", w, k)?;
        let bpr = k / MX_BLOCK;
        let mut data = Vec::with_capacity(n);
        let mut scales = Vec::with_capacity(n / MX_BLOCK);
        for (b, block) in w.chunks_exact(MX_BLOCK).enumerate() {
            let s = ue8m0_for("MXFP8", amax(block), E4M3_MAX, b / bpr, b % bpr)?;
            let v = s.to_f32_exact();
            data.extend(block.iter().map(|x| F8E4M3::from_f32(x / v)));
            scales.push(s);
        }
        Mxfp8::from_parts(rows, k, data, scales)
    }

    /// [`Self::quantize`] of bf16 input.
    ///
    /// # Errors
    /// As [`Self::quantize`].
    pub fn quantize_bf16(w: &[bf16], rows: usize, k: usize) -> Result<Mxfp8> {
        Mxfp8::quantize(&w.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), rows, k)
    }

    /// `q · s` per element, exact.
    pub fn dequantize(&self) -> Vec<f32> {
        self.data
            .chunks_exact(MX_BLOCK)
            .zip(&self.scales)
            .flat_map(|(b, s)| {
                let v = s.to_f32_exact();
                b.iter().map(move |q| q.to_f32() * v)
            })
            .collect()
    }

    getters!(rows: usize, k: usize);
    /// e4m3 `[rows, k]`.
    pub fn data(&self) -> &[F8E4M3] {
        &self.data
    }
    /// `[rows, k / 32]`.
    pub fn scales(&self) -> &[Ue8m0] {
        &self.scales
    }
    /// The scale grid in SM100's 128 × 4 atom layout ([`to_sf_atoms`]) over all `rows` (one group; for
    /// experts stacked by rows, [`to_sf_atoms_grouped`] of [`Self::scales`] gives each its own atoms).
    pub fn sf_atoms(&self) -> Vec<u8> {
        sf_atoms_of(self.scales.iter().map(|s| s.0), self.rows, self.k / MX_BLOCK)
    }
    pub fn into_parts(self) -> (Vec<F8E4M3>, Vec<Ue8m0>) {
        (self.data, self.scales)
    }
}

// ---- FP4 ----

fn quantize_e2m1_blocks(w: &[f32], block: usize, scale_of: impl Fn(usize, &[f32]) -> Result<f32>) -> Result<Vec<u8>> {
    let mut codes = Vec::with_capacity(w.len());
    for (b, blk) in w.chunks_exact(block).enumerate() {
        let s = scale_of(b, blk)?;
        codes.extend(blk.iter().map(|x| E2m1::from_f32(if s == 0.0 { 0.0 } else { x / s })));
    }
    pack_e2m1(&codes)
}

fn dequantize_e2m1_blocks(data: &[u8], block: usize, scale: impl Fn(usize) -> f32) -> Vec<f32> {
    unpack_e2m1(data)
        .chunks_exact(block)
        .enumerate()
        .flat_map(|(b, c)| {
            let s = scale(b);
            c.iter().map(move |q| q.to_f32() * s).collect::<Vec<_>>()
        })
        .collect()
}

/// An MXFP4 matrix `[rows, k]`: e2m1 elements packed two per byte (`[rows, k / 2]`, even element in the low
/// nibble), one [`Ue8m0`] per row per 32 of K (`[rows, k / 32]`). gpt-oss's `*_blocks` / `*_scales` tensors are
/// exactly these bytes.
///
/// Stored rows may be wider than the logical K ([`Self::pad_k`]): `k_padded` columns, the pad's nibbles all
/// zero (e2m1 +0) and its scales [`Ue8m0::ONE`] (the neutral exponent, 2^0). A zero code times any scale is 0,
/// so the padded matrix is the logical one with zero columns appended, exactly: the SM100 block-scaled GEMMs
/// take K in whole 128s, and gpt-oss's K = 2880 runs there as 2944.
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp4 {
    rows: usize,
    k: usize,
    k_padded: usize,
    data: Vec<u8>,
    scales: Vec<Ue8m0>,
}

impl Mxfp4 {
    /// # Errors
    /// [`Error::InvalidProblem`]: `k` not a positive multiple of 32, lengths other than `rows · k / 2` bytes and
    /// `rows · k / 32` scales, a NaN scale byte.
    pub fn from_parts(rows: usize, k: usize, data: Vec<u8>, scales: Vec<Ue8m0>) -> Result<Mxfp4> {
        let (n, s) = check_shape("MXFP4", rows, k, MX_BLOCK)?;
        check_len("MXFP4", rows, k, "data bytes", data.len(), n / 2)?;
        check_len("MXFP4", rows, k, "scales", scales.len(), s)?;
        check_ue8m0("MXFP4", &scales, k / MX_BLOCK)?;
        Ok(Mxfp4 { rows, k, k_padded: k, data, scales })
    }

    /// The same matrix in rows of `k_padded` columns (a multiple of 32, at least K): each row's pad holds zero
    /// nibbles and [`Ue8m0::ONE`] scales (see the type's docs). Padding a padded matrix re-pads from its
    /// logical K.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `k_padded` below K or not a multiple of 32.
    pub fn pad_k(self, k_padded: usize) -> Result<Mxfp4> {
        let (rows, k) = (self.rows, self.k);
        if k_padded < k || k_padded % MX_BLOCK != 0 {
            return Err(invalid(format!(
                "MXFP4 [{rows}, {k}] padded to K = {k_padded}: the padded K must be at least K and a multiple of \
                 the {MX_BLOCK}-element block"
            )));
        }
        let (row_bytes, row_scales) = (self.k_padded / 2, self.k_padded / MX_BLOCK);
        let (pad_bytes, pad_scales) = ((k_padded - k) / 2, (k_padded - k) / MX_BLOCK);
        let mut data = Vec::with_capacity(rows * k_padded / 2);
        let mut scales = Vec::with_capacity(rows * k_padded / MX_BLOCK);
        for r in 0..rows {
            data.extend_from_slice(&self.data[r * row_bytes..r * row_bytes + k / 2]);
            data.extend(std::iter::repeat_n(0u8, pad_bytes));
            scales.extend_from_slice(&self.scales[r * row_scales..r * row_scales + k / MX_BLOCK]);
            scales.extend(std::iter::repeat_n(Ue8m0::ONE, pad_scales));
        }
        Ok(Mxfp4 { rows, k, k_padded, data, scales })
    }

    /// [`Self::quantize`], stored in rows of `k_padded` columns ([`Self::pad_k`]).
    ///
    /// # Errors
    /// As [`Self::quantize`] and [`Self::pad_k`].
    pub fn quantize_padded(w: &[f32], rows: usize, k: usize, k_padded: usize) -> Result<Mxfp4> {
        Mxfp4::quantize(w, rows, k)?.pad_k(k_padded)
    }

    /// Quantises `w [rows, k]`: per block `s = ceil_pow2(amax / 6)`, `q = e2m1(w / s)` (nearest even).
    ///
    /// # Errors
    /// As [`Self::from_parts`]; a non-finite element (named); a block whose scale leaves UE8M0's range.
    pub fn quantize(w: &[f32], rows: usize, k: usize) -> Result<Mxfp4> {
        let (n, _) = check_shape("MXFP4", rows, k, MX_BLOCK)?;
        check_len("MXFP4 input", rows, k, "elements", w.len(), n)?;
        check_finite("MXFP4 input", w, k)?;
        let bpr = k / MX_BLOCK;
        let mut scales = Vec::with_capacity(n / MX_BLOCK);
        for (b, blk) in w.chunks_exact(MX_BLOCK).enumerate() {
            scales.push(ue8m0_for("MXFP4", amax(blk), E2M1_MAX, b / bpr, b % bpr)?);
        }
        let data = quantize_e2m1_blocks(w, MX_BLOCK, |b, _| Ok(scales[b].to_f32_exact()))?;
        Mxfp4::from_parts(rows, k, data, scales)
    }

    /// [`Self::quantize`] of bf16 input.
    ///
    /// # Errors
    /// As [`Self::quantize`].
    pub fn quantize_bf16(w: &[bf16], rows: usize, k: usize) -> Result<Mxfp4> {
        Mxfp4::quantize(&w.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), rows, k)
    }

    /// `FP4_LUT[nibble] · 2^(s − 127)` per element, exact (gpt-oss's dequantisation): `[rows, k]`, the
    /// logical columns only.
    pub fn dequantize(&self) -> Vec<f32> {
        let full = self.dequantize_padded();
        full.chunks_exact(self.k_padded).flat_map(|row| &row[..self.k]).copied().collect()
    }

    /// As [`Self::dequantize`], every stored column: `[rows, k_padded]` (the pad dequantises to 0).
    pub fn dequantize_padded(&self) -> Vec<f32> {
        dequantize_e2m1_blocks(&self.data, MX_BLOCK, |b| self.scales[b].to_f32_exact())
    }

    getters!(
        rows: usize,
        /// The logical K.
        k: usize,
        /// Columns stored per row (K, or more after [`Self::pad_k`]): the K a GEMM over these bytes runs.
        k_padded: usize,
    );
    /// Packed e2m1 `[rows, k_padded / 2]` bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    /// `[rows, k_padded / 32]`.
    pub fn scales(&self) -> &[Ue8m0] {
        &self.scales
    }
    /// The scale grid in SM100's 128 × 4 atom layout, as [`Mxfp8::sf_atoms`], over the stored columns.
    pub fn sf_atoms(&self) -> Vec<u8> {
        sf_atoms_of(self.scales.iter().map(|s| s.0), self.rows, self.k_padded / MX_BLOCK)
    }
    /// The stored bytes and scales (`[rows, k_padded / 2]`, `[rows, k_padded / 32]`).
    pub fn into_parts(self) -> (Vec<u8>, Vec<Ue8m0>) {
        (self.data, self.scales)
    }
}

/// NVFP4's tensor scale for a tensor whose largest magnitude is `amax`: `max(amax / (6 · 448), 2^-149)` (1 for
/// 0), the smallest that keeps every block scale within UE4M3's 448. [`Nvfp4::quantize`] and the device quantiser
/// (`quant::quantize_nvfp4_grouped`, tensor scale derived) use it.
pub fn nvfp4_tensor_scale(amax: f32) -> f32 {
    if amax == 0.0 {
        1.0
    } else {
        (amax / (E2M1_MAX * Ue4m3::MAX_F32)).max(pow2(-149))
    }
}

/// An NVFP4 matrix `[rows, k]`: e2m1 elements packed two per byte (as [`Mxfp4`]), one [`Ue4m3`] per row per 16
/// of K (`[rows, k / 16]`), and one f32 per tensor: `w ≈ q · s_block · tensor_scale`. (CUTLASS's example 75
/// takes the tensor scale as the epilogue's `alpha`, the product of A's and B's.)
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4 {
    rows: usize,
    k: usize,
    data: Vec<u8>,
    scales: Vec<Ue4m3>,
    tensor_scale: f32,
}

impl Nvfp4 {
    /// # Errors
    /// [`Error::InvalidProblem`]: `k` not a positive multiple of 16, lengths other than `rows · k / 2` bytes and
    /// `rows · k / 16` scales, a tensor scale that is not finite and positive.
    pub fn from_parts(rows: usize, k: usize, data: Vec<u8>, scales: Vec<Ue4m3>, tensor_scale: f32) -> Result<Nvfp4> {
        let (n, s) = check_shape("NVFP4", rows, k, NV_BLOCK)?;
        check_len("NVFP4", rows, k, "data bytes", data.len(), n / 2)?;
        check_len("NVFP4", rows, k, "scales", scales.len(), s)?;
        if !(tensor_scale.is_finite() && tensor_scale > 0.0) {
            return Err(invalid(format!(
                "NVFP4 [{rows}, {k}]: tensor scale {tensor_scale} must be finite and positive"
            )));
        }
        Ok(Nvfp4 { rows, k, data, scales, tensor_scale })
    }

    /// Quantises `w [rows, k]` with its own tensor scale, [`nvfp4_tensor_scale`]`(amax(w))` (so every block
    /// scale fits UE4M3), as [`Self::quantize_with_tensor_scale`] does with a given one (except that a block
    /// scale an f32 rounding puts past 448 takes 448).
    ///
    /// # Errors
    /// As [`Self::from_parts`]; a non-finite element (named).
    pub fn quantize(w: &[f32], rows: usize, k: usize) -> Result<Nvfp4> {
        Nvfp4::quantize_impl(w, rows, k, None)
    }

    /// Quantises `w [rows, k]` with the tensor scale `t` (a calibrated activation scale, say): per block `s =
    /// ue4m3_ceil(amax / 6 / t)` (1 for an all-zero block), `q = e2m1(w / (s · t))` (nearest even; a block whose
    /// `s · t` underflows to 0 quantises to zeros).
    ///
    /// # Errors
    /// As [`Self::from_parts`]; a non-finite element (named); a block that would need a scale above 448 (`t`
    /// too small for the data: its largest elements would clip).
    pub fn quantize_with_tensor_scale(w: &[f32], rows: usize, k: usize, t: f32) -> Result<Nvfp4> {
        if !(t.is_finite() && t > 0.0) {
            return Err(invalid(format!("NVFP4 [{rows}, {k}]: tensor scale {t} must be finite and positive")));
        }
        Nvfp4::quantize_impl(w, rows, k, Some(t))
    }

    fn quantize_impl(w: &[f32], rows: usize, k: usize, given: Option<f32>) -> Result<Nvfp4> {
        let (n, _) = check_shape("NVFP4", rows, k, NV_BLOCK)?;
        check_len("NVFP4 input", rows, k, "elements", w.len(), n)?;
        check_finite("NVFP4 input", w, k)?;
        let tensor_scale = given.unwrap_or_else(|| nvfp4_tensor_scale(amax(w)));
        let bpr = k / NV_BLOCK;
        let mut scales = Vec::with_capacity(n / NV_BLOCK);
        for (b, blk) in w.chunks_exact(NV_BLOCK).enumerate() {
            let a = amax(blk);
            let y = a / E2M1_MAX / tensor_scale;
            if given.is_some() && y > Ue4m3::MAX_F32 {
                return Err(invalid(format!(
                    "NVFP4 block [{}, {}]: amax {a} needs a UE4M3 scale of {y} under the tensor scale {tensor_scale}, \
                     above 448 (the tensor scale is too small for the data)",
                    b / bpr,
                    b % bpr
                )));
            }
            scales.push(if a == 0.0 { Ue4m3::ONE } else { Ue4m3::from_f32_ceil(y.min(Ue4m3::MAX_F32))? });
        }
        let data = quantize_e2m1_blocks(w, NV_BLOCK, |b, _| Ok(scales[b].to_f32() * tensor_scale))?;
        Nvfp4::from_parts(rows, k, data, scales, tensor_scale)
    }

    /// [`Self::quantize`] of bf16 input.
    ///
    /// # Errors
    /// As [`Self::quantize`].
    pub fn quantize_bf16(w: &[bf16], rows: usize, k: usize) -> Result<Nvfp4> {
        Nvfp4::quantize(&w.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), rows, k)
    }

    /// `q · s_block · tensor_scale` per element (`q · s_block` is exact; the product with an arbitrary f32 tensor
    /// scale is the one rounding, as on the device).
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_e2m1_blocks(&self.data, NV_BLOCK, |b| self.scales[b].to_f32())
            .into_iter()
            .map(|v| v * self.tensor_scale)
            .collect()
    }

    getters!(rows: usize, k: usize);
    /// Packed e2m1 `[rows, k / 2]` bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    /// `[rows, k / 16]`.
    pub fn scales(&self) -> &[Ue4m3] {
        &self.scales
    }
    /// The scale grid in SM100's 128 × 4 atom layout, as [`Mxfp8::sf_atoms`].
    pub fn sf_atoms(&self) -> Vec<u8> {
        sf_atoms_of(self.scales.iter().map(|s| s.0), self.rows, self.k / NV_BLOCK)
    }
    pub fn tensor_scale(&self) -> f32 {
        self.tensor_scale
    }
}
