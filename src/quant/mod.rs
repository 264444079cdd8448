//! FP8 block quantization on the host: the formats of FP8 checkpoints and kernels, as types, with exact
//! references for the device kernels to come.
//!
//! * Elements: `float8::F8E4M3` (E4M3FN: max 448, no infinities) and `F8E5M2`, re-exported.
//! * Scales, one per `BlockShape` block of the weight (DeepSeek-V3: 128 × 128), in a [`ScaleFormat`]:
//!   - `F32`: DeepSeek's `weight_scale_inv`, the **dequantisation multiplier**: `w ≈ q · s`;
//!   - `Ue8m0`: an unsigned exponent byte `2^(b − 127)` (OCP MX E8M0; Blackwell block-scaled MMA), so scales
//!     are powers of two.
//!
//! Device-resident operands of the blockwise FP8 GEMM, elements and scales in one value each, are
//! [`Fp8Rows`] (activations, 1 × 128 blocks) and [`Fp8BlockWeights`] (experts, 128 × 128 blocks).
//!
//! A scale grid and its format travel together ([`Scales`]), so f32 scales cannot be read as packed UE8M0
//! (or the reverse) by accident: raw bytes are only accepted with a format and an exact length.
//!
//! Activations are quantised per token per 128 columns ([`GroupQuant`], [`per_token_group_quant`]) on the device
//! ([`device`]: [`Fp8Rows`], [`quantize_rows`], [`quantize_gather`], [`requantize_rows`]); weights per 128 × 128
//! block on the host ([`BlockFp8::quantize`]) or, from bf16/f16 weights already on the GPU, on the device
//! ([`quantize_weights`], [`Fp8BlockWeights::quantize_device`]: the host quantiser's bits, see [`device`]).
//!
//! Microscaling formats for Blackwell's block-scaled GEMMs ([`mx`]): [`Mxfp8`], [`Mxfp4`] (gpt-oss's checkpoints)
//! and [`Nvfp4`], with the e2m1 and UE4M3 codecs and the SM100 128 × 4 scale-factor layout ([`sf_offset`]).
//!
//! Shapes are checked when a [`BlockFp8`] is made (its fields are private): no input of these functions panics;
//! a zero block dimension, a shape whose element count overflows or an element outside the weight is an
//! [`Error::InvalidProblem`] naming the constraint.

use crate::error::{Error, Result};

/// The accessors of a grouped-rows type over its `buf` ([`mx_device::GroupedRows`]): its extents, the codes
/// (`$q`, with their docs), the scale atoms and the groups' bases.
macro_rules! grouped_rows_accessors {
    ($q:ty $(, #[$q_doc:meta])*) => {
        pub fn max_rows(&self) -> usize {
            self.buf.max_rows
        }
        pub fn k(&self) -> usize {
            self.buf.k
        }
        pub fn groups(&self) -> usize {
            self.buf.groups
        }
        $(#[$q_doc])*
        pub fn q(&self) -> &CudaSlice<$q> {
            &self.buf.q
        }
        /// The scale atoms, all groups: group `g`'s at `sf_bases[g]`.
        pub fn sf(&self) -> &CudaSlice<u8> {
            &self.buf.sf
        }
        /// `[groups + 1]`: each group's byte base, the last the bytes in use.
        pub fn sf_bases(&self) -> &CudaSlice<i64> {
            &self.buf.sf_bases
        }
    };
}

pub mod device;
mod fp4_device;
pub mod group;
pub mod mx;
mod mx_device;
pub use fp4_device::{
    quantize_mxfp4_grouped, quantize_nvfp4_grouped, Mxfp4Rows, NvTensorScale, Nvfp4Rows, Nvfp4Weights,
};
pub use mx_device::{quantize_mxfp8_grouped, Mxfp4Weights, Mxfp8Rows, Mxfp8Weights};

pub use device::{quantize_gather, quantize_rows, quantize_weights, requantize_rows, Fp8Rows, RowsInUse};
mod operands;
mod packed_ue8m0;
mod sf_atoms;
pub use float8::{F8E4M3, F8E5M2};
pub use group::{
    dequantize_groups, per_token_group_quant, quantize_element, GroupQuant, ScaleRounding, ACT_GROUP, DEEPSEEK_EPS,
    VLLM_EPS,
};
pub use mx::{
    from_sf_atoms, from_sf_atoms_grouped, nvfp4_tensor_scale, pack_e2m1, sf_atom_bytes, sf_group_bases, sf_offset,
    to_sf_atoms, to_sf_atoms_grouped, unpack_e2m1, E2m1, Mxfp4, Mxfp8, Nvfp4, Ue4m3, E2M1_MAX, FP4_LUT, MX_BLOCK,
    NV_BLOCK,
};
pub use operands::{scale_blocks, sfa_offset, sfb_offset, Fp8BlockWeights, SCALE_BLOCK};
pub use packed_ue8m0::PackedUe8m0;
mod rowwise;
pub use rowwise::{per_row_block, to_per_row, Fp8ChannelWeights, Fp8TokenRows, TokenScale};
mod schemes;
pub use schemes::{ActivationScales, WeightScales};

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
    /// DeepSeek-V3's activation groups: one scale per row per 128 columns (per token, per 128 of K).
    pub const PER_TOKEN_128: BlockShape = BlockShape { rows: 1, cols: 128 };

    /// The scale grid of a `[rows, cols]` weight: `[ceil(rows / br), ceil(cols / bc)]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the block dims when either is 0.
    pub fn grid(self, rows: usize, cols: usize) -> Result<(usize, usize)> {
        if self.rows == 0 || self.cols == 0 {
            return Err(Error::InvalidProblem(format!(
                "block shape {} x {} (rows x cols): both block dims must be positive",
                self.rows, self.cols
            )));
        }
        Ok((rows.div_ceil(self.rows), cols.div_ceil(self.cols)))
    }
}

/// `rows · cols`, or the error naming a shape whose element count does not fit in `usize`.
fn elements(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .ok_or_else(|| Error::InvalidProblem(format!("a [{rows}, {cols}] weight: rows x cols overflows usize")))
}

/// Hands each of `experts` to `each` in order, after checking it has the first one's shape (`shape` reads it,
/// `show` writes it for the error): what every upload of stacked host experts does. Returns the first expert.
/// `what` names the format (`"FP8"`, `"MXFP4"`), `one` what all must share (`"one shape"`).
///
/// # Errors
/// [`Error::InvalidProblem`] for no experts or an expert of another shape (the expert named); those of `each`.
pub(crate) fn for_each_expert<'e, E, S: PartialEq>(
    what: &str,
    one: &str,
    experts: &'e [E],
    shape: impl Fn(&E) -> (S, String),
    mut each: impl FnMut(usize, &E) -> Result<()>,
) -> Result<&'e E> {
    let first = experts.first().ok_or_else(|| Error::InvalidProblem(format!("{what} weights of 0 experts")))?;
    let (want, shown) = shape(first);
    for (g, e) in experts.iter().enumerate() {
        let (got, is) = shape(e);
        if got != want {
            return Err(Error::InvalidProblem(format!(
                "{what} expert {g} is {is}, expert 0 {shown}: all experts must have {one}"
            )));
        }
        each(g, e)?;
    }
    Ok(first)
}

/// `(rows, cols)` and `[rows, cols]`: the shape of an expert for [`for_each_expert`].
pub(crate) fn rows_cols(rows: usize, cols: usize) -> ((usize, usize), String) {
    ((rows, cols), format!("[{rows}, {cols}]"))
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
    /// Scale `i` as an f32, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<f32> {
        match self {
            Scales::F32(v) => v.get(i).copied(),
            Scales::Ue8m0(v) => v.get(i).map(|s| s.to_f32()),
        }
    }

    /// Scales from little-endian bytes in `format`, exactly `count` of them.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the format when the length is not `count × bytes per scale` — which is
    /// what f32 scales read as UE8M0 (4× too many bytes) or the reverse look like.
    /// The scales at the indices `keep` accepts, in order, in the same format.
    pub(crate) fn select(&self, keep: impl Fn(usize) -> bool) -> Scales {
        match self {
            Scales::F32(v) => Scales::F32(v.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, x)| *x).collect()),
            Scales::Ue8m0(v) => {
                Scales::Ue8m0(v.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, x)| *x).collect())
            }
        }
    }

    pub fn from_bytes(format: ScaleFormat, count: usize, bytes: &[u8]) -> Result<Scales> {
        let want = count.checked_mul(format.bytes());
        if want != Some(bytes.len()) {
            return Err(Error::InvalidProblem(format!(
                "{} bytes of scales for {count} {format:?} scales: expected {} ({} bytes each)",
                bytes.len(),
                want.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string()),
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

/// A block-quantized E4M3 matrix `[rows, cols]` with one scale per block. Made only by [`BlockFp8::from_parts`],
/// [`BlockFp8::quantize`], [`BlockFp8::stack_rows`] and the block-aligned slices, which check the shapes; read
/// through its accessors.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockFp8 {
    rows: usize,
    cols: usize,
    block: BlockShape,
    q: Vec<F8E4M3>,
    scales: Scales,
}

impl BlockFp8 {
    /// Wraps quantized elements and their scale grid, checking both shapes.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: positive block dims, `rows · cols` elements (and no
    /// overflow), one scale per block.
    pub fn from_parts(rows: usize, cols: usize, block: BlockShape, q: Vec<F8E4M3>, scales: Scales) -> Result<Self> {
        let (gr, gc) = block.grid(rows, cols)?;
        if q.len() != elements(rows, cols)? {
            return Err(Error::InvalidProblem(format!("{} fp8 elements for a [{rows}, {cols}] weight", q.len())));
        }
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

    /// Quantizes `w [rows, cols]`: per block, `scale = amax / 448` (`F32`; at least the smallest positive
    /// f32, for blocks of subnormals) or the next power of two (`Ue8m0`), `q = e4m3(w / scale)` rounded to
    /// nearest even, saturating. All-zero blocks get scale 1.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: positive block dims, `rows · cols` elements, finite
    /// elements (the first other one named by position), and for `Ue8m0` a scale within `2^-127 ..= 2^127` (the
    /// block named).
    pub fn quantize(w: &[f32], rows: usize, cols: usize, block: BlockShape, format: ScaleFormat) -> Result<Self> {
        let (gr, gc) = block.grid(rows, cols)?;
        if w.len() != elements(rows, cols)? {
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
        // The scale each block divides by, as an f32, and the grid in the requested format.
        let mut value = vec![1f32; gr * gc];
        let mut s8 = vec![Ue8m0::ONE; gr * gc];
        for br in 0..gr {
            for bc in 0..gc {
                let mut amax = 0f32;
                for r in br * block.rows..((br + 1) * block.rows).min(rows) {
                    for c in bc * block.cols..((bc + 1) * block.cols).min(cols) {
                        amax = amax.max(w[r * cols + c].abs());
                    }
                }
                if amax == 0.0 {
                    continue;
                }
                // amax / 448 underflows to 0 for blocks of small subnormals: never divide by 0.
                let s = (amax / E4M3_MAX).max(f32::from_bits(1));
                value[br * gc + bc] = match format {
                    ScaleFormat::F32 => s,
                    ScaleFormat::Ue8m0 => {
                        let u = Ue8m0::from_f32_ceil(s).map_err(|e| match e {
                            Error::InvalidProblem(m) => Error::InvalidProblem(format!("block [{br}, {bc}]: {m}")),
                            e => e,
                        })?;
                        s8[br * gc + bc] = u;
                        u.to_f32()
                    }
                };
            }
        }
        let q = w
            .iter()
            .enumerate()
            .map(|(i, x)| F8E4M3::from_f32(x / value[Self::block_index(block, gc, i / cols, i % cols)]))
            .collect();
        let scales = match format {
            ScaleFormat::F32 => Scales::F32(value),
            ScaleFormat::Ue8m0 => Scales::Ue8m0(s8),
        };
        BlockFp8::from_parts(rows, cols, block, q, scales)
    }

    /// Index into the scale grid (`gc` blocks per row of blocks) of element `(r, c)`.
    fn block_index(block: BlockShape, gc: usize, r: usize, c: usize) -> usize {
        (r / block.rows) * gc + c / block.cols
    }

    /// The scale of element `(r, c)` (of an element inside the weight, which `from_parts` made sure has one).
    fn scale_at(&self, r: usize, c: usize) -> f32 {
        let gc = self.cols.div_ceil(self.block.cols);
        self.scales.get(Self::block_index(self.block, gc, r, c)).expect("the scale grid fits the weight")
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn block(&self) -> BlockShape {
        self.block
    }
    /// The quantized elements, `[rows, cols]` row-major.
    pub fn q(&self) -> &[F8E4M3] {
        &self.q
    }
    /// The scale grid, `[ceil(rows / block.rows), ceil(cols / block.cols)]` row-major.
    pub fn scales(&self) -> &Scales {
        &self.scales
    }
    /// The quantized elements and the scale grid, by value.
    pub fn into_parts(self) -> (Vec<F8E4M3>, Scales) {
        (self.q, self.scales)
    }

    /// The scale of element `(r, c)`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] when `(r, c)` is outside the `[rows, cols]` weight.
    pub fn scale_of(&self, r: usize, c: usize) -> Result<f32> {
        if r >= self.rows || c >= self.cols {
            return Err(Error::InvalidProblem(format!(
                "element ({r}, {c}) is outside the [{}, {}] weight",
                self.rows, self.cols
            )));
        }
        Ok(self.scale_at(r, c))
    }

    /// `w ≈ q · scale`, element by element.
    pub fn dequantize(&self) -> Vec<f32> {
        self.q.iter().enumerate().map(|(i, q)| q.to_f32() * self.scale_at(i / self.cols, i % self.cols)).collect()
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

    /// Rows `r0 .. r1` with their scale rows: `r0` and `r1` on block boundaries (or `r1` the last row), so
    /// every block of the slice keeps its own scale.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: an empty or out-of-range slice, or a bound inside a block.
    pub fn slice_rows(&self, r0: usize, r1: usize) -> Result<BlockFp8> {
        self.check_slice("rows", r0, r1, self.rows, self.block.rows)?;
        let (_, gc) = self.block.grid(self.rows, self.cols)?;
        let (b0, b1) = (r0 / self.block.rows, r1.div_ceil(self.block.rows));
        let q = self.q[r0 * self.cols..r1 * self.cols].to_vec();
        BlockFp8::from_parts(r1 - r0, self.cols, self.block, q, self.scales.select(|i| (b0 * gc..b1 * gc).contains(&i)))
    }

    /// Columns `c0 .. c1` of every row with their scale columns, bounds on block boundaries (or `c1` the last
    /// column).
    ///
    /// # Errors
    /// As [`Self::slice_rows`], for columns.
    pub fn slice_cols(&self, c0: usize, c1: usize) -> Result<BlockFp8> {
        self.check_slice("columns", c0, c1, self.cols, self.block.cols)?;
        let (_, gc) = self.block.grid(self.rows, self.cols)?;
        let (b0, b1) = (c0 / self.block.cols, c1.div_ceil(self.block.cols));
        let q: Vec<F8E4M3> = self.q.chunks(self.cols).flat_map(|row| row[c0..c1].iter().copied()).collect();
        BlockFp8::from_parts(self.rows, c1 - c0, self.block, q, self.scales.select(|i| (b0..b1).contains(&(i % gc))))
    }

    fn check_slice(&self, what: &str, lo: usize, hi: usize, len: usize, block: usize) -> Result<()> {
        if lo >= hi || hi > len || lo % block != 0 || (hi % block != 0 && hi != len) {
            return Err(Error::InvalidProblem(format!(
                "slice {what} {lo}..{hi} of a [{}, {}] block-FP8 weight: bounds must be within 0..={len}, non-empty \
                 and on the {block}-wide block boundaries (a block keeps one scale)",
                self.rows, self.cols
            )));
        }
        Ok(())
    }
}
