//! Expert weights from checkpoints: per-expert tensors named as real checkpoints name them, memory-mapped from
//! `.safetensors` files, packed into [`PackedExperts`] (stack over experts, concatenate gate and up), and
//! unpacked back bit for bit so a save round-trips.
//!
//! | [`ExpertNaming`] | per-expert tensors under `{prefix}.experts.{e}.` | families |
//! |---|---|---|
//! | `Mixtral` | `w1.weight` (gate) `[I, H]`, `w3.weight` (up) `[I, H]`, `w2.weight` (down) `[H, I]` | Mixtral (`prefix` = `model.layers.L.block_sparse_moe`) |
//! | `GateUpDown` | `gate_proj.weight`, `up_proj.weight`, `down_proj.weight` | Qwen3-MoE, DeepSeek-V3 (`prefix` = `model.layers.L.mlp`) |
//!
//! Shared experts ([`SharedNaming`], [`Checkpoint::pack_shared_expert`]) are one dense SwiGLU MLP per layer:
//!
//! | [`SharedNaming`] | tensors under `{prefix}.` | families |
//! |---|---|---|
//! | `SharedExperts` | `shared_experts.{gate,up}_proj.weight` `[I_s, H]`, `shared_experts.down_proj.weight` `[H, I_s]` | DeepSeek-V3, Kimi-K2 (`I_s = moe_intermediate_size · n_shared_experts`) |
//! | `GatedSharedExpert` | `shared_expert.{gate,up,down}_proj.weight`, `shared_expert_gate.weight` `[1, H]` | Qwen2-MoE (`I_s = shared_expert_intermediate_size`) |
//!
//! The packers read weights stored as F32, BF16 or F16 into the element type asked for, rounding to nearest even
//! where it is narrower ([`Checkpoint::tensor_as`]); integer and FP8 tensors have their own readers.
//!
//! gpt-oss stores its experts packed already (`{prefix}.experts.gate_up_proj [E, H, 2I]` interleaved,
//! `gate_up_proj_bias [E, 2I]`, `down_proj [E, I, H]`, `down_proj_bias [E, H]`): [`Checkpoint::pack_gpt_oss`].
//! (The released gpt-oss checkpoints hold MXFP4 blocks: [`Checkpoint::pack_gpt_oss_mxfp4`] reads them, and
//! [`Checkpoint::pack_gpt_oss_dequantized`] gives this bf16 form from them.)

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo, TensorView};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::experts::{ExpertFormat, PackedExperts, SharedExpert};

mod fp8;
mod fp8_scaled;
mod fp8_scheme;
mod fp8_shared;
mod mxfp4;
pub use fp8::{ActivationScheme, Fp8Config};
pub use fp8_scheme::{ActivationScales, Fp8Scheme, SchemeSource, WeightScales};
// The packed experts a checkpoint yields live in `crate::experts`; their names stay reachable here.
pub use crate::experts::{Fp8ChannelExperts, GptOssMxfp4Experts, PackedFp8Experts, SharedFp8Expert, StaticInputScales};

/// A named tensor: (name, shape, elements).
pub type NamedTensor<T> = (String, Vec<usize>, Vec<T>);

/// How per-expert tensors are named. New checkpoint families arrive as new variants: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertNaming {
    /// `w1` (gate), `w3` (up), `w2` (down).
    Mixtral,
    /// `gate_proj`, `up_proj`, `down_proj`.
    GateUpDown,
}

impl ExpertNaming {
    /// (gate, up, down) tensor names of expert `e` under `prefix`.
    pub fn names(self, prefix: &str, e: usize) -> [String; 3] {
        let (g, u, d) = match self {
            ExpertNaming::Mixtral => ("w1", "w3", "w2"),
            ExpertNaming::GateUpDown => ("gate_proj", "up_proj", "down_proj"),
        };
        [g, u, d].map(|n| format!("{prefix}.experts.{e}.{n}.weight"))
    }
}

/// How a checkpoint names a layer's shared expert. New families arrive as new variants: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedNaming {
    /// DeepSeek-V3, Kimi-K2: `{prefix}.shared_experts.{gate,up,down}_proj.weight`, added with weight 1.
    SharedExperts,
    /// Qwen2-MoE: `{prefix}.shared_expert.{gate,up,down}_proj.weight`, weighted per token by
    /// `sigmoid(x · {prefix}.shared_expert_gate.weight)` (`[1, H]`).
    GatedSharedExpert,
}

impl SharedNaming {
    /// (gate, up, down) tensor names under `prefix`.
    pub fn names(self, prefix: &str) -> [String; 3] {
        let module = match self {
            SharedNaming::SharedExperts => "shared_experts",
            SharedNaming::GatedSharedExpert => "shared_expert",
        };
        ["gate_proj", "up_proj", "down_proj"].map(|n| format!("{prefix}.{module}.{n}.weight"))
    }

    /// The per-token gate's tensor name under `prefix`, for the families that have one.
    pub fn gate_name(self, prefix: &str) -> Option<String> {
        match self {
            SharedNaming::SharedExperts => None,
            SharedNaming::GatedSharedExpert => Some(format!("{prefix}.shared_expert_gate.weight")),
        }
    }
}

fn bad(tensor: &str, problem: String) -> Error {
    Error::Checkpoint { file: None, tensor: tensor.to_string(), problem }
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
    }
}

fn to_bytes<T: Element>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

fn from_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(2).map(|c| T::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect()
}

/// The floats of an F32, BF16 or F16 tensor as f32 (exact), `None` for another dtype.
fn widen(dtype: Dtype, b: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => from_bytes::<half::bf16>(b).into_iter().map(f32::from).collect(),
        Dtype::F16 => from_bytes::<half::f16>(b).into_iter().map(f32::from).collect(),
        _ => return None,
    })
}

/// The bytes of a checkpoint: a read-only map of its file, or a buffer the caller read.
#[derive(Debug)]
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A `.safetensors` file, memory-mapped ([`Checkpoint::open`]) or in memory ([`Checkpoint::from_bytes`]).
///
/// Its header is validated once, when it is opened: every tensor's `data_offsets` inside the file, contiguous and
/// in order (no overlaps, no gaps), each tensor's byte count equal to its shape times its dtype's size without
/// overflow, the file exactly as long as the header says. Each reader then checks the dtype and shape it needs
/// before it allocates anything, so no allocation is sized by a header field the file's length does not back.
/// Every error names the file and the tensor ([`Error::Checkpoint`], [`Error::CheckpointFile`]).
#[derive(Debug)]
pub struct Checkpoint {
    bytes: Bytes,
    file: PathBuf,
    header: usize,
    meta: Metadata,
}

impl Checkpoint {
    /// Maps `path` and validates its header. The map is kept (tensors are copied out of it only when read), so
    /// the file must not be truncated while the checkpoint is open: reading a page past the new end raises
    /// SIGBUS, which no safe Rust can catch (the caveat of every memory-mapped file). A file that is already
    /// truncated when it is opened is an error.
    ///
    /// # Errors
    /// [`Error::CheckpointFile`] naming the file: it cannot be opened or mapped, or is not a valid safetensors
    /// file (see the type's docs for what is validated).
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let fail = |e: String| Error::CheckpointFile { file: path.to_path_buf(), problem: e };
        let file = File::open(path).map_err(|e| fail(e.to_string()))?;
        let map = crate::ffi::runtime::map_file(&file).map_err(|e| fail(format!("cannot map it: {e}")))?;
        Checkpoint::parse(path.to_path_buf(), Bytes::Mapped(map))
    }

    /// A checkpoint from its bytes (a file read into memory, or received), validated as [`Checkpoint::open`]
    /// validates a file; `file` names it in errors.
    ///
    /// # Errors
    /// [`Error::CheckpointFile`] naming `file` when `bytes` are not a valid safetensors file.
    pub fn from_bytes(file: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Checkpoint> {
        Checkpoint::parse(file.into(), Bytes::Owned(bytes))
    }

    fn parse(file: PathBuf, bytes: Bytes) -> Result<Checkpoint> {
        match safetensors::SafeTensors::read_metadata(&bytes) {
            Ok((header, meta)) => Ok(Checkpoint { bytes, file, header, meta }),
            Err(e) => Err(Error::CheckpointFile {
                file,
                problem: format!("not a valid safetensors file ({} bytes): {}", bytes.len(), describe(&e)),
            }),
        }
    }

    /// The file this checkpoint was read from (or the name [`Checkpoint::from_bytes`] was given).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// `e` with this checkpoint's file named; an error of another kind becomes a checkpoint error of `tensor`.
    fn located(&self, tensor: &str) -> impl Fn(Error) -> Error + '_ {
        let tensor = tensor.to_string();
        move |e| match e {
            Error::Checkpoint { file: None, tensor, problem } => {
                Error::Checkpoint { file: Some(self.file.clone()), tensor, problem }
            }
            e @ (Error::Checkpoint { .. } | Error::CheckpointFile { .. }) => e,
            e => Error::Checkpoint {
                file: Some(self.file.clone()),
                tensor: tensor.clone(),
                problem: match e {
                    Error::InvalidProblem(m) => m,
                    e => e.to_string(),
                },
            },
        }
    }

    /// Tensor `name`'s header entry and bytes.
    fn entry(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.meta.info(name).ok_or_else(|| bad(name, "missing from the checkpoint".into()))?;
        let (s, e) = info.data_offsets;
        // Validated when the file was opened; checked again so that no header can make a read go out of bounds.
        let base = 8 + self.header;
        let bytes =
            base.checked_add(s).zip(base.checked_add(e)).and_then(|(s, e)| self.bytes.get(s..e)).ok_or_else(|| {
                bad(
                    name,
                    format!(
                        "data_offsets [{s}, {e}] do not lie in the {} data bytes",
                        self.bytes.len().saturating_sub(base)
                    ),
                )
            })?;
        Ok((info, bytes))
    }

    /// Names of every tensor in the file.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.meta.tensors().into_keys().collect();
        v.sort();
        v
    }

    /// The shape and elements of tensor `name`, which must hold `T`'s dtype (bit for bit; converting:
    /// [`Checkpoint::tensor_as`]).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor and the file: missing, or another dtype.
    pub fn tensor<T: Element>(&self, name: &str) -> Result<(Vec<usize>, Vec<T>)> {
        self.tensor_in_file(name).map_err(self.located(name))
    }

    fn tensor_in_file<T: Element>(&self, name: &str) -> Result<(Vec<usize>, Vec<T>)> {
        let (info, bytes) = self.entry(name)?;
        if info.dtype != st_dtype(T::DTYPE) {
            return Err(bad(name, format!("dtype {:?}, expected {}", info.dtype, T::DTYPE)));
        }
        Ok((info.shape.clone(), from_bytes(bytes)))
    }

    /// The shape and elements of tensor `name` as f32, from an F32, BF16 or F16 tensor: exactly (bf16 and f16
    /// widen to f32 without rounding). For small f32 tensors such as biases and DeepSeek's
    /// `mlp.gate.e_score_correction_bias` (F32, or BF16 in some exports).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor and the file: missing, or of another dtype (named).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.tensor_f32_in_file(name).map_err(self.located(name))
    }

    fn tensor_f32_in_file(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (info, bytes) = self.entry(name)?;
        let v = widen(info.dtype, bytes)
            .ok_or_else(|| bad(name, format!("dtype {:?}: read as f32 from F32, BF16 or F16 only", info.dtype)))?;
        Ok((info.shape.clone(), v))
    }

    /// The shape and elements of tensor `name` converted to `T`, from an F32, BF16 or F16 tensor: bit for bit
    /// when it holds `T`'s dtype, otherwise through f32 (exact) rounded to nearest, ties to even (`T::from_f32`).
    /// A narrowing conversion (F32 to bf16 or f16, F16 to bf16, BF16 to f16) therefore rounds: choosing `T` is
    /// the caller's declaration that it wants the weights in `T`. Nothing else changes silently: a finite value
    /// that `T` cannot hold (beyond f16's range) is an error, and so are integer and FP8 tensors (read those with
    /// their own readers, [`Checkpoint::fp8_block_weight`], [`Checkpoint::mxfp4_weight`]).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor and the file: missing; a dtype other than F32, BF16 or F16 (named,
    /// with what is accepted); a finite element that overflows `T` (its index named).
    pub fn tensor_as<T: Element>(&self, name: &str) -> Result<(Vec<usize>, Vec<T>)> {
        self.tensor_as_in_file(name).map_err(self.located(name))
    }

    fn tensor_as_in_file<T: Element>(&self, name: &str) -> Result<(Vec<usize>, Vec<T>)> {
        let (info, bytes) = self.entry(name)?;
        let dtype = info.dtype;
        if dtype == st_dtype(T::DTYPE) {
            return Ok((info.shape.clone(), from_bytes(bytes)));
        }
        let wide = widen(dtype, bytes).ok_or_else(|| {
            // FP8 weights come with block scales: a plain conversion would lose them.
            let fp8 = match dtype {
                Dtype::F8_E4M3 | Dtype::F8_E5M2 => " (block-FP8 weights: Checkpoint::fp8_block_weight)",
                _ => "",
            };
            let accepted = format!("{} weights are read from F32, BF16 or F16 tensors only{fp8}", T::DTYPE);
            bad(name, format!("dtype {dtype:?}: {accepted}"))
        })?;
        let v: Vec<T> = wide.iter().map(|&x| T::from_f32(x)).collect();
        if let Some(at) = wide.iter().zip(&v).position(|(w, n)| w.is_finite() && !n.to_f32().is_finite()) {
            return Err(bad(
                name,
                format!("element {at} = {:e} ({dtype:?}) is beyond the range of {}", wide[at], T::DTYPE),
            ));
        }
        Ok((info.shape.clone(), v))
    }

    /// Packs per-expert gate/up/down tensors of experts `0..experts` under `prefix` (SwiGLU, `[gate | up]`).
    /// Tensors stored as F32, BF16 or F16 are converted to `T` as [`Checkpoint::tensor_as`] does (rounded to
    /// nearest even where `T` is narrower).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the first tensor that is missing, of a dtype `tensor_as` refuses, or whose
    /// shape disagrees with expert 0.
    pub fn pack_experts<T: Element>(
        &self,
        prefix: &str,
        experts: usize,
        naming: ExpertNaming,
    ) -> Result<PackedExperts<T>> {
        pack_experts(|name| self.tensor_as_in_file::<T>(name), prefix, experts, naming).map_err(self.located(prefix))
    }

    /// Reads the shared expert of the MoE block under `prefix` (`model.layers.L.mlp`), named as `naming` does.
    /// Tensors stored as F32, BF16 or F16 are converted to `T` as [`Checkpoint::tensor_as`] does (rounded to
    /// nearest even where `T` is narrower).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the first tensor that is missing, of a dtype `tensor_as` refuses, or of a
    /// shape that disagrees with the gate's `[I_s, H]`.
    pub fn pack_shared_expert<T: Element>(&self, prefix: &str, naming: SharedNaming) -> Result<SharedExpert<T>> {
        pack_shared_expert(|name| self.tensor_as_in_file::<T>(name), prefix, naming).map_err(self.located(prefix))
    }

    /// Packs gpt-oss's already packed expert tensors under `prefix` (bf16 form). The weights stored as F32, BF16
    /// or F16 are converted to `T` as [`Checkpoint::tensor_as`] does (rounded to nearest even where `T` is
    /// narrower); the biases are read as f32 exactly ([`Checkpoint::tensor_f32`]).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: missing, of a dtype `tensor_as` refuses, or of a shape that does
    /// not fit `gate_up_proj`'s `[E, H, 2I]` (E, H, I positive).
    pub fn pack_gpt_oss<T: Element>(&self, prefix: &str) -> Result<PackedExperts<T>> {
        self.pack_gpt_oss_in_file(prefix).map_err(self.located(&format!("{prefix}.experts.gate_up_proj")))
    }

    fn pack_gpt_oss_in_file<T: Element>(&self, prefix: &str) -> Result<PackedExperts<T>> {
        let n = |s: &str| format!("{prefix}.experts.{s}");
        let (s13, w13) = self.tensor_as_in_file::<T>(&n("gate_up_proj"))?;
        let (s2, w2) = self.tensor_as_in_file::<T>(&n("down_proj"))?;
        let [e, h, i2] = s13[..] else {
            return Err(bad(&n("gate_up_proj"), format!("shape {s13:?}, expected [E, H, 2I]")));
        };
        if e == 0 || h == 0 || i2 == 0 {
            return Err(bad(&n("gate_up_proj"), format!("shape {s13:?}: E, H and 2I must be positive")));
        }
        if i2 % 2 != 0 || s2 != [e, i2 / 2, h] {
            return Err(bad(
                &n("down_proj"),
                format!("shape {s2:?}, expected [{e}, {}, {h}] from gate_up_proj {s13:?}", i2 / 2),
            ));
        }
        let b13 = self.tensor_f32(&n("gate_up_proj_bias"))?;
        let b2 = self.tensor_f32(&n("down_proj_bias"))?;
        if b13.0 != [e, i2] {
            return Err(bad(&n("gate_up_proj_bias"), format!("shape {:?}, expected [{e}, {i2}]", b13.0)));
        }
        if b2.0 != [e, h] {
            return Err(bad(&n("down_proj_bias"), format!("shape {:?}, expected [{e}, {h}]", b2.0)));
        }
        PackedExperts::new(e, h, i2 / 2, ExpertFormat::GPT_OSS, w13, w2, Some(b13.1), Some(b2.1))
            .map_err(|err| bad(&n("gate_up_proj"), err.to_string()))
    }
}

/// A 2-D weight's `(rows, cols)`, both positive: an empty weight is no weight, and a zero dimension would let the
/// other one be anything (a `[0, 2^60]` tensor holds no bytes).
fn matrix_shape(name: &str, shape: &[usize], what: &str) -> Result<(usize, usize)> {
    match shape[..] {
        [rows, cols] if rows > 0 && cols > 0 => Ok((rows, cols)),
        [_, _] => Err(bad(name, format!("shape {shape:?}: an empty weight, {what} must both be positive"))),
        _ => Err(bad(name, format!("shape {shape:?}, expected {what}"))),
    }
}

/// safetensors' header errors in words: which constraint the header breaks.
fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => "shorter than the 8-byte header length".into(),
        E::HeaderTooLarge => "the header length field exceeds safetensors' 100 MB limit".into(),
        E::InvalidHeaderLength => "the header length field points past the end of the file (truncated?)".into(),
        E::MetadataIncompleteBuffer => {
            "the file's length is not the header's plus the tensors' data_offsets end (truncated, or bytes appended)"
                .into()
        }
        E::InvalidOffset(t) => {
            format!("tensor `{t}`: data_offsets do not start where the previous tensor ends (overlap, gap or reversed)")
        }
        E::TensorInvalidInfo => "a tensor's data_offsets span is not its shape times its dtype's size".into(),
        E::ValidationOverflow => "a tensor's shape times its dtype's size overflows usize".into(),
        E::MisalignedSlice => "a tensor's shape does not fill whole bytes of its dtype".into(),
        e => e.to_string(),
    }
}

/// Packs per-expert tensors found by `get` (name → shape, elements) into `[E, 2I, H]` (gate then up) and
/// `[E, H, I]`.
///
/// # Errors
/// [`Error::Checkpoint`] naming the first tensor that is missing (`get`'s error), whose shape disagrees with
/// expert 0's or the gate's, or whose element count is not the product of its shape; `experts = 0`.
pub fn pack_experts<T: Element>(
    get: impl Fn(&str) -> Result<(Vec<usize>, Vec<T>)>,
    prefix: &str,
    experts: usize,
    naming: ExpertNaming,
) -> Result<PackedExperts<T>> {
    let mut w13 = Vec::new();
    let mut w2 = Vec::new();
    let mut dims: Option<(usize, usize)> = None; // (I, H)
    for e in 0..experts {
        let [gn, un, dn] = naming.names(prefix, e);
        let (gs, g) = get(&gn)?;
        let (i, h) = matrix_shape(&gn, &gs, "[I, H]")?;
        let (us, u) = get(&un)?;
        let (ds, d) = get(&dn)?;
        if let Some(first) = dims {
            if first != (i, h) {
                return Err(bad(&gn, format!("shape {gs:?}, expert 0 has [{}, {}]", first.0, first.1)));
            }
        }
        dims = Some((i, h));
        if us != [i, h] {
            return Err(bad(&un, format!("shape {us:?}, expected [{i}, {h}] like the gate")));
        }
        if ds != [h, i] {
            return Err(bad(&dn, format!("shape {ds:?}, expected [{h}, {i}]")));
        }
        for (name, shape, v) in [(&gn, &gs, &g), (&un, &us, &u), (&dn, &ds, &d)] {
            if i.checked_mul(h) != Some(v.len()) {
                return Err(bad(name, format!("{} elements for shape {shape:?}", v.len())));
            }
        }
        w13.extend_from_slice(&g);
        w13.extend_from_slice(&u);
        w2.extend_from_slice(&d);
    }
    let (i, h) = dims.ok_or_else(|| bad(prefix, "experts = 0".into()))?;
    PackedExperts::new(experts, h, i, ExpertFormat::SWIGLU, w13, w2, None, None).map_err(|e| bad(prefix, e.to_string()))
}

/// A shared expert from the tensors `get` finds (name → shape, elements), named as `naming` does.
///
/// # Errors
/// [`Error::Checkpoint`] naming the first tensor that is missing (`get`'s error), whose shape disagrees with the
/// gate's `[I_s, H]` (up `[I_s, H]`, down `[H, I_s]`, Qwen2-MoE's `shared_expert_gate` `[1, H]`), or whose element
/// count is not the product of its shape.
pub fn pack_shared_expert<T: Element>(
    get: impl Fn(&str) -> Result<(Vec<usize>, Vec<T>)>,
    prefix: &str,
    naming: SharedNaming,
) -> Result<SharedExpert<T>> {
    let [gn, un, dn] = naming.names(prefix);
    let (gs, g) = get(&gn)?;
    let [i, h] = gs[..] else {
        return Err(bad(&gn, format!("shape {gs:?}, expected [I_s, H]")));
    };
    if i == 0 || h == 0 {
        return Err(bad(&gn, format!("shape {gs:?}: I_s and H must be positive")));
    }
    let (us, u) = get(&un)?;
    if us != [i, h] {
        return Err(bad(&un, format!("shape {us:?}, expected [{i}, {h}] like the gate")));
    }
    let (ds, d) = get(&dn)?;
    if ds != [h, i] {
        return Err(bad(&dn, format!("shape {ds:?}, expected [{h}, {i}]")));
    }
    let gate = match naming.gate_name(prefix) {
        Some(name) => {
            let (s, v) = get(&name)?;
            if s != [1, h] {
                return Err(bad(&name, format!("shape {s:?}, expected [1, {h}] (nn.Linear(H, 1))")));
            }
            Some((name, s, v))
        }
        None => None,
    };
    let gate_ref = gate.as_ref().map(|(n, s, v)| (n, s, v));
    for (name, shape, v) in [(&gn, &gs, &g), (&un, &us, &u), (&dn, &ds, &d)].into_iter().chain(gate_ref) {
        if shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b)) != Some(v.len()) {
            return Err(bad(name, format!("{} elements for shape {shape:?}", v.len())));
        }
    }
    SharedExpert::new(h, i, g, u, d, gate.map(|(_, _, v)| v)).map_err(|e| bad(&gn, e.to_string()))
}

/// The tensors of a shared expert named as `naming` does: the inverse of [`pack_shared_expert`].
///
/// # Errors
/// [`Error::InvalidProblem`] if the expert has a per-token gate and `naming` none, or the other way round, or
/// its tensors do not fit `H` and `I_s` (its fields are public).
pub fn unpack_shared_expert<T: Element>(
    s: &SharedExpert<T>,
    prefix: &str,
    naming: SharedNaming,
) -> Result<Vec<NamedTensor<T>>> {
    let checked = SharedExpert::new(
        s.hidden,
        s.inter,
        s.gate_proj.clone(),
        s.up_proj.clone(),
        s.down_proj.clone(),
        s.expert_gate.clone(),
    )?;
    let (h, i) = (s.hidden, s.inter);
    let [gn, un, dn] = naming.names(prefix);
    let mut out = vec![
        (gn, vec![i, h], checked.gate_proj),
        (un, vec![i, h], checked.up_proj),
        (dn, vec![h, i], checked.down_proj),
    ];
    match (naming.gate_name(prefix), checked.expert_gate) {
        (Some(name), Some(g)) => out.push((name, vec![1, h], g)),
        (None, None) => {}
        (name, gate) => {
            return Err(Error::InvalidProblem(format!(
                "{naming:?} names {} gate tensor, the shared expert has {}",
                if name.is_some() { "a" } else { "no" },
                if gate.is_some() { "one" } else { "none" }
            )))
        }
    }
    Ok(out)
}

/// The per-expert tensors of packed SwiGLU experts (`[gate | up]`, `[out, in]`), named as `naming` does:
/// the inverse of [`pack_experts`].
///
/// # Errors
/// [`Error::InvalidProblem`] for experts of another format (interleaved, transposed, biased or not gated), or
/// whose tensors do not hold `E · 2I · H` and `E · H · I` elements (their fields are public).
pub fn unpack_experts<T: Element>(
    p: &PackedExperts<T>,
    prefix: &str,
    naming: ExpertNaming,
) -> Result<Vec<NamedTensor<T>>> {
    if p.format != ExpertFormat::SWIGLU || p.b13.is_some() || p.b2.is_some() {
        return Err(Error::InvalidProblem(format!(
            "unpack_experts writes per-expert gate/up/down tensors of concatenated [out, in] SwiGLU experts without biases; got {:?}",
            p.format
        )));
    }
    let (h, i) = (p.hidden, p.inter);
    let per_expert = i.checked_mul(h).and_then(|n| n.checked_mul(p.experts));
    let fits = |len: usize, mult: usize| per_expert.and_then(|n| n.checked_mul(mult)) == Some(len);
    if h == 0 || i == 0 || !fits(p.w13.len(), 2) || !fits(p.w2.len(), 1) {
        return Err(Error::InvalidProblem(format!(
            "w13 has {} and w2 {} elements: E = {}, H = {h}, I = {i} (H, I positive) need E x 2I x H and E x H x I",
            p.w13.len(),
            p.w2.len(),
            p.experts
        )));
    }
    let mut out = Vec::with_capacity(3 * p.experts);
    for e in 0..p.experts {
        let [gn, un, dn] = naming.names(prefix, e);
        let base = e * 2 * i * h;
        out.push((gn, vec![i, h], p.w13[base..base + i * h].to_vec()));
        out.push((un, vec![i, h], p.w13[base + i * h..base + 2 * i * h].to_vec()));
        out.push((dn, vec![h, i], p.w2[e * h * i..(e + 1) * h * i].to_vec()));
    }
    Ok(out)
}

/// Writes 16-bit tensors to a `.safetensors` file.
pub fn save<T: Element>(path: &Path, tensors: &[NamedTensor<T>]) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| to_bytes(v)).collect();
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            TensorView::new(st_dtype(T::DTYPE), s.clone(), b).map(|v| (n.clone(), v)).map_err(|e| bad(n, e.to_string()))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| Error::CheckpointFile { file: path.to_path_buf(), problem: e.to_string() })
}
