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
use std::fmt::Display;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorView};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layer::{ExpertFormat, PackedExperts, SharedExpert};

mod fp8;
mod fp8_shared;
mod mxfp4;
pub use fp8::{ActivationScheme, Fp8Config, PackedFp8Experts};
pub use fp8_shared::SharedFp8Expert;
pub use mxfp4::GptOssMxfp4Experts;

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
    Error::Checkpoint { tensor: tensor.to_string(), problem }
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

/// A memory-mapped `.safetensors` file.
#[derive(Debug)]
pub struct Checkpoint {
    /// For error messages: a model's tensors are spread over many files.
    path: PathBuf,
    map: Mmap,
    header: usize,
    meta: Metadata,
}

impl Checkpoint {
    /// Maps `path` and reads its header. The file must not be truncated while the checkpoint is open (the
    /// caveat of every memory-mapped file).
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let file = File::open(path).map_err(|e| bad(&path.display().to_string(), e.to_string()))?;
        let map = crate::ffi::runtime::map_file(&file).map_err(|e| bad(&path.display().to_string(), e.to_string()))?;
        let (header, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| bad(&path.display().to_string(), format!("not a safetensors file: {e}")))?;
        Ok(Checkpoint { path: path.to_path_buf(), map, header, meta })
    }

    /// The file's path, as given to [`Checkpoint::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An error of tensor `name` that names this file too.
    fn error(&self, name: &str, problem: impl Display) -> Error {
        bad(name, format!("in {}: {problem}", self.path.display()))
    }

    /// Tensor `name`'s dtype, shape and bytes.
    fn raw(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let info = self.meta.info(name).ok_or_else(|| self.error(name, "missing from the checkpoint"))?;
        let base = 8 + self.header;
        Ok((info.dtype, &info.shape, &self.map[base + info.data_offsets.0..base + info.data_offsets.1]))
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
        let (dtype, shape, bytes) = self.raw(name)?;
        if dtype != st_dtype(T::DTYPE) {
            return Err(self.error(name, format!("dtype {dtype:?}, expected {}", T::DTYPE)));
        }
        Ok((shape.to_vec(), from_bytes(bytes)))
    }

    /// The shape and elements of tensor `name` as f32, from an F32, BF16 or F16 tensor: exactly (bf16 and f16
    /// widen to f32 without rounding). For small f32 tensors such as biases and DeepSeek's
    /// `mlp.gate.e_score_correction_bias` (F32, or BF16 in some exports).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor and the file: missing, or of another dtype (named).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let v = widen(dtype, bytes)
            .ok_or_else(|| self.error(name, format!("dtype {dtype:?}: read as f32 from F32, BF16 or F16 only")))?;
        Ok((shape.to_vec(), v))
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
        let (dtype, shape, bytes) = self.raw(name)?;
        if dtype == st_dtype(T::DTYPE) {
            return Ok((shape.to_vec(), from_bytes(bytes)));
        }
        let wide = widen(dtype, bytes).ok_or_else(|| {
            // FP8 weights come with block scales: a plain conversion would lose them.
            let fp8 = match dtype {
                Dtype::F8_E4M3 | Dtype::F8_E5M2 => " (block-FP8 weights: Checkpoint::fp8_block_weight)",
                _ => "",
            };
            let accepted = format!("{} weights are read from F32, BF16 or F16 tensors only{fp8}", T::DTYPE);
            self.error(name, format!("dtype {dtype:?}: {accepted}"))
        })?;
        let v: Vec<T> = wide.iter().map(|&x| T::from_f32(x)).collect();
        if let Some(at) = wide.iter().zip(&v).position(|(w, n)| w.is_finite() && !n.to_f32().is_finite()) {
            return Err(self.error(
                name,
                format!("element {at} = {:e} ({dtype:?}) is beyond the range of {}", wide[at], T::DTYPE),
            ));
        }
        Ok((shape.to_vec(), v))
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
        pack_experts(|name| self.tensor_as::<T>(name), prefix, experts, naming)
    }

    /// Reads the shared expert of the MoE block under `prefix` (`model.layers.L.mlp`), named as `naming` does.
    /// Tensors stored as F32, BF16 or F16 are converted to `T` as [`Checkpoint::tensor_as`] does (rounded to
    /// nearest even where `T` is narrower).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the first tensor that is missing, of a dtype `tensor_as` refuses, or of a
    /// shape that disagrees with the gate's `[I_s, H]`.
    pub fn pack_shared_expert<T: Element>(&self, prefix: &str, naming: SharedNaming) -> Result<SharedExpert<T>> {
        pack_shared_expert(|name| self.tensor_as::<T>(name), prefix, naming)
    }

    /// Packs gpt-oss's already packed expert tensors under `prefix` (bf16 form). The weights stored as F32, BF16
    /// or F16 are converted to `T` as [`Checkpoint::tensor_as`] does (rounded to nearest even where `T` is
    /// narrower); the biases are read as f32 exactly ([`Checkpoint::tensor_f32`]).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor: missing, of a dtype `tensor_as` refuses, or of a shape that does
    /// not fit `gate_up_proj`'s `[E, H, 2I]`.
    pub fn pack_gpt_oss<T: Element>(&self, prefix: &str) -> Result<PackedExperts<T>> {
        let n = |s: &str| format!("{prefix}.experts.{s}");
        let (s13, w13) = self.tensor_as::<T>(&n("gate_up_proj"))?;
        let (s2, w2) = self.tensor_as::<T>(&n("down_proj"))?;
        let [e, h, i2] = s13[..] else {
            return Err(bad(&n("gate_up_proj"), format!("shape {s13:?}, expected [E, H, 2I]")));
        };
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
        let (us, u) = get(&un)?;
        let (ds, d) = get(&dn)?;
        let (i, h) = match gs[..] {
            [i, h] => (i, h),
            _ => return Err(bad(&gn, format!("shape {gs:?}, expected [I, H]"))),
        };
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
    PackedExperts::new(experts, h, i, ExpertFormat::SWIGLU, w13, w2, None, None)
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
    safetensors::serialize_to_file(views, None, path).map_err(|e| bad(&path.display().to_string(), e.to_string()))
}
