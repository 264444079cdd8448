//! FP8 block quantization on the host: the formats of FP8 checkpoints and kernels, as types, with exact
//! references for the device kernels to come.
//!
//! * Elements: `float8::F8E4M3` (E4M3FN: max 448, no infinities) and `F8E5M2`, re-exported.
//! * Scales, one per `BlockShape` block of the weight (DeepSeek-V3: 128 × 128), in a [`ScaleFormat`]:
//!   - `F32`: DeepSeek's `weight_scale_inv`, the **dequantisation multiplier**: `w ≈ q · s`;
//!   - `Ue8m0`: an unsigned exponent byte `2^(b − 127)` (OCP MX E8M0; Blackwell block-scaled MMA), so scales
//!     are powers of two.
//!
//! A scale grid and its format travel together ([`Scales`]), so f32 scales cannot be read as packed UE8M0
//! (or the reverse) by accident: raw bytes are only accepted with a format and an exact length.

use crate::error::{Error, Result};

pub use float8::{F8E4M3, F8E5M2};

/// The largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

/// How a block's scale is stored. More formats will come (e.g. UE4M3 for FP4): match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleFormat {
    /// f32 dequantisation multiplier (DeepSeek-V3's `weight_scale_inv`).
    F32,
    /// Power-of-two exponent byte, `2^(b − 127)` (UE8M0).
    Ue8m0,
}

impl ScaleFormat {
    pub const fn bytes(self) -> usize {
        match self {
            ScaleFormat::F32 => 4,
            ScaleFormat::Ue8m0 => 1,
        }
    }
}

/// An unsigned 8-bit exponent scale: value `2^(bits − 127)`; `0xFF` is NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ue8m0(pub u8);

impl Ue8m0 {
    pub const ONE: Ue8m0 = Ue8m0(127);

    pub fn to_f32(self) -> f32 {
        if self.0 == 0xFF {
            return f32::NAN;
        }
        (2f32).powi(self.0 as i32 - 127)
    }

    /// The smallest power of two `>= x` (rounding up keeps `|w| / scale <= 448` when `x = amax / 448`).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for `x` not positive and finite, or outside `2^-127 ..= 2^127`.
    pub fn from_f32_ceil(x: f32) -> Result<Ue8m0> {
        if !(x.is_finite() && x > 0.0) {
            return Err(Error::InvalidProblem(format!("UE8M0 scale of {x}: must be positive and finite")));
        }
        let e = x.log2().ceil() as i32;
        // log2 rounding can land one below for values just above a power of two.
        let e = if (2f32).powi(e) < x { e + 1 } else { e };
        if !(-127..=127).contains(&e) {
            return Err(Error::InvalidProblem(format!("UE8M0 scale of {x}: 2^{e} is outside 2^-127 ..= 2^127")));
        }
        Ok(Ue8m0((e + 127) as u8))
    }
}

/// Elements of the weight covered by one scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockShape {
    pub rows: usize,
    pub cols: usize,
}

impl BlockShape {
    /// DeepSeek-V3's FP8 weight blocks.
    pub const DEEPSEEK: BlockShape = BlockShape { rows: 128, cols: 128 };

    /// The scale grid of a `[rows, cols]` weight: `[ceil(rows / br), ceil(cols / bc)]`.
    pub fn grid(self, rows: usize, cols: usize) -> (usize, usize) {
        (rows.div_ceil(self.rows), cols.div_ceil(self.cols))
    }
}

/// A scale grid in its format: one variant per [`ScaleFormat`], growing with it.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    F32(Vec<f32>),
    Ue8m0(Vec<Ue8m0>),
}

impl Scales {
    pub fn format(&self) -> ScaleFormat {
        match self {
            Scales::F32(_) => ScaleFormat::F32,
            Scales::Ue8m0(_) => ScaleFormat::Ue8m0,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Scales::F32(v) => v.len(),
            Scales::Ue8m0(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Scales::F32(v) => v[i],
            Scales::Ue8m0(v) => v[i].to_f32(),
        }
    }

    /// Scales from little-endian bytes in `format`, exactly `count` of them.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the format when the length is not `count × bytes per scale` — which is
    /// what f32 scales read as UE8M0 (4× too many bytes) or the reverse look like.
    pub fn from_bytes(format: ScaleFormat, count: usize, bytes: &[u8]) -> Result<Scales> {
        if bytes.len() != count * format.bytes() {
            return Err(Error::InvalidProblem(format!(
                "{} bytes of scales for {count} {format:?} scales: expected {} ({} bytes each)",
                bytes.len(),
                count * format.bytes(),
                format.bytes()
            )));
        }
        Ok(match format {
            ScaleFormat::F32 => {
                Scales::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            ScaleFormat::Ue8m0 => Scales::Ue8m0(bytes.iter().map(|&b| Ue8m0(b)).collect()),
        })
    }
}

/// A block-quantized E4M3 matrix `[rows, cols]` with one scale per block.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockFp8 {
    pub rows: usize,
    pub cols: usize,
    pub block: BlockShape,
    pub q: Vec<F8E4M3>,
    pub scales: Scales,
}

impl BlockFp8 {
    /// Wraps quantized elements and their scale grid, checking both shapes.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the element or scale count that does not fit `[rows, cols]` and the block.
    pub fn from_parts(rows: usize, cols: usize, block: BlockShape, q: Vec<F8E4M3>, scales: Scales) -> Result<Self> {
        if block.rows == 0 || block.cols == 0 {
            return Err(Error::InvalidProblem(format!("block shape {block:?}: must be positive")));
        }
        if q.len() != rows * cols {
            return Err(Error::InvalidProblem(format!("{} fp8 elements for a [{rows}, {cols}] weight", q.len())));
        }
        let (gr, gc) = block.grid(rows, cols);
        if scales.len() != gr * gc {
            return Err(Error::InvalidProblem(format!(
                "{} scales for a [{rows}, {cols}] weight in {}x{} blocks: expected a [{gr}, {gc}] grid",
                scales.len(),
                block.rows,
                block.cols
            )));
        }
        Ok(BlockFp8 { rows, cols, block, q, scales })
    }

    /// Quantizes `w [rows, cols]`: per block, `scale = amax / 448` (`F32`) or the next power of two (`Ue8m0`),
    /// `q = e4m3(w / scale)` rounded to nearest even, saturating. All-zero blocks get scale 1.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a non-finite element (named by position) or a bad shape.
    pub fn quantize(w: &[f32], rows: usize, cols: usize, block: BlockShape, format: ScaleFormat) -> Result<Self> {
        if w.len() != rows * cols {
            return Err(Error::InvalidProblem(format!("{} elements for a [{rows}, {cols}] weight", w.len())));
        }
        if let Some(i) = w.iter().position(|x| !x.is_finite()) {
            return Err(Error::InvalidProblem(format!(
                "element [{}, {}] = {} is not finite",
                i / cols,
                i % cols,
                w[i]
            )));
        }
        let (gr, gc) = block.grid(rows, cols);
        let mut s32 = vec![1f32; gr * gc];
        let mut s8 = vec![Ue8m0::ONE; gr * gc];
        for br in 0..gr {
            for bc in 0..gc {
                let mut amax = 0f32;
                for r in br * block.rows..((br + 1) * block.rows).min(rows) {
                    for c in bc * block.cols..((bc + 1) * block.cols).min(cols) {
                        amax = amax.max(w[r * cols + c].abs());
                    }
                }
                if amax > 0.0 {
                    s32[br * gc + bc] = amax / E4M3_MAX;
                    s8[br * gc + bc] = Ue8m0::from_f32_ceil(amax / E4M3_MAX)?;
                }
            }
        }
        let scales = match format {
            ScaleFormat::F32 => Scales::F32(s32),
            ScaleFormat::Ue8m0 => Scales::Ue8m0(s8),
        };
        let q = (0..rows * cols)
            .map(|i| {
                let s = scales.get((i / cols / block.rows) * gc + (i % cols) / block.cols);
                F8E4M3::from_f32(w[i] / s)
            })
            .collect();
        BlockFp8::from_parts(rows, cols, block, q, scales)
    }

    /// The scale of element `(r, c)`.
    pub fn scale_of(&self, r: usize, c: usize) -> f32 {
        let gc = self.cols.div_ceil(self.block.cols);
        self.scales.get((r / self.block.rows) * gc + c / self.block.cols)
    }

    /// `w ≈ q · scale`, element by element.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.rows * self.cols).map(|i| self.q[i].to_f32() * self.scale_of(i / self.cols, i % self.cols)).collect()
    }

    /// Stacks `[self; below]` along rows (gate then up into `w13`), which keeps every block whole only if
    /// `self.rows` is a multiple of the block rows.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: same columns, block and scale format, and
    /// `rows % block.rows == 0` (a block would otherwise straddle gate and up rows with one scale).
    pub fn stack_rows(&self, below: &BlockFp8) -> Result<BlockFp8> {
        if self.cols != below.cols || self.block != below.block || self.scales.format() != below.scales.format() {
            return Err(Error::InvalidProblem(format!(
                "stacking [{}, {}] {:?} {:?} on [{}, {}] {:?} {:?}: columns, block and scale format must agree",
                self.rows,
                self.cols,
                self.block,
                self.scales.format(),
                below.rows,
                below.cols,
                below.block,
                below.scales.format()
            )));
        }
        if self.rows % self.block.rows != 0 {
            return Err(Error::InvalidProblem(format!(
                "rows = {} is not a multiple of the block rows {}: a scale block would straddle the two matrices",
                self.rows, self.block.rows
            )));
        }
        let q = [self.q.clone(), below.q.clone()].concat();
        let scales = match (&self.scales, &below.scales) {
            (Scales::F32(a), Scales::F32(b)) => Scales::F32([a.clone(), b.clone()].concat()),
            (Scales::Ue8m0(a), Scales::Ue8m0(b)) => Scales::Ue8m0([a.clone(), b.clone()].concat()),
            _ => unreachable!("formats checked above"),
        };
        BlockFp8::from_parts(self.rows + below.rows, self.cols, self.block, q, scales)
    }
}
