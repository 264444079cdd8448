//! Untrusted inputs for every parser of the crate, shared by the bounded property test (`tests/fuzz_parsers.rs`)
//! and the `cargo fuzz` targets (`fuzz/fuzz_targets/`): a byte string drives a generator that writes a valid
//! small checkpoint (safetensors, or a `config.json`, or a tuned-table file) and then breaks it in the ways a
//! downloaded file can be broken; the checks call every reader on the result and assert that each error is a
//! typed [`Error`] naming the file and the tensor. A panic anywhere is the failure (the property test catches it
//! per case, libFuzzer reports it as a crash).
#![allow(dead_code)]

use std::path::Path;

use half::bf16;
use moe_gemm::checkpoint::{
    Checkpoint, ExpertNaming, Fp8Config, Fp8Scheme, PackedFp8Experts, SchemeSource, SharedNaming,
};
use moe_gemm::error::Error;
use moe_gemm::layer::{ExpertFormat, PackedExperts};
use moe_gemm::quant::{BlockShape, ScaleFormat, WeightScales};
use moe_gemm::tuning::ConfigName;
use moe_gemm::tuning::TunedBackends;
use serde_json::{json, Map, Value};

pub const PREFIX: &str = "model.layers.0.mlp";

/// Reads choices from the input bytes; zeros once they run out, so every input decodes to some case.
pub struct Draw<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Draw<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Draw { bytes, at: 0 }
    }
    pub fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }
    /// Uniform enough in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.u16() as usize % n
    }
    pub fn pick<T: Clone>(&mut self, of: &[T]) -> T {
        of[self.below(of.len())].clone()
    }
    pub fn flip(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    /// What is left of the input.
    pub fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.at..).unwrap_or(&[])
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Safetensors checkpoints
// ---------------------------------------------------------------------------------------------------------------

/// One tensor as the header will describe it: the dtype and shape as JSON (so they can be made wrong in kind),
/// its bytes.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: Value,
    pub shape: Value,
    pub data: Vec<u8>,
}

/// Which readers a case is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// 16-bit per-expert weights (both namings), shared experts, gpt-oss's bf16 form, block-FP8 weights.
    Safetensors,
    /// gpt-oss MXFP4 blocks, scales and biases.
    Mxfp4,
}

const DTYPES: [&str; 22] = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64", "F8", "bf16", "XYZ",
];

/// Bits per element of a dtype name safetensors knows.
fn bits(dtype: &Value) -> Option<usize> {
    Some(match dtype.as_str()? {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "F64" | "I64" | "U64" => 64,
        _ => return None,
    })
}

/// The byte count a dtype and shape need, when it is small enough to write.
fn byte_count(dtype: &Value, shape: &Value) -> Option<usize> {
    let n = shape.as_array()?.iter().try_fold(1usize, |a, d| a.checked_mul(usize::try_from(d.as_u64()?).ok()?))?;
    let b = n.checked_mul(bits(dtype)?)?;
    (b % 8 == 0 && b / 8 <= 1 << 20).then_some(b / 8)
}

fn tensor(name: String, dtype: &str, shape: &[usize], data: Vec<u8>) -> Tensor {
    Tensor { name, dtype: json!(dtype), shape: json!(shape), data }
}

fn fill(d: &mut Draw, n: usize) -> Vec<u8> {
    let seed = d.u64() | 1;
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` 16-bit values, finite and small (bf16 or f16 bits).
fn halfs(d: &mut Draw, n: usize, dtype: &str) -> Vec<u8> {
    let raw = fill(d, n);
    raw.iter()
        .flat_map(|&b| {
            let x = (b as f32 - 128.0) / 64.0;
            match dtype {
                "F16" => half::f16::from_f32(x).to_bits().to_le_bytes(),
                _ => bf16::from_f32(x).to_bits().to_le_bytes(),
            }
        })
        .collect()
}

/// Scales of a block grid: powers of two (valid under UE8M0 as well), in `dtype`.
fn scales(d: &mut Draw, n: usize, dtype: &str) -> Vec<u8> {
    let raw = fill(d, n);
    raw.iter()
        .flat_map(|&b| {
            let s = ((b % 16) as f32 - 8.0).exp2();
            match dtype {
                "BF16" => bf16::from_f32(s).to_bits().to_le_bytes().to_vec(),
                "F16" => half::f16::from_f32(s).to_bits().to_le_bytes().to_vec(),
                _ => s.to_le_bytes().to_vec(),
            }
        })
        .collect()
}

/// Valid tensors of the family's layouts, small, under [`PREFIX`].
pub fn valid_tensors(d: &mut Draw, family: Family) -> Vec<Tensor> {
    let mut out = Vec::new();
    let p = PREFIX;
    match family {
        Family::Safetensors => {
            let kinds = d.byte() | 1;
            let e = 1 + d.below(3);
            if kinds & 1 != 0 {
                // 16-bit experts, one of the two namings.
                let naming = if d.flip() { ExpertNaming::Mixtral } else { ExpertNaming::GateUpDown };
                let (i, h) = (1 + d.below(8), 1 + d.below(8));
                let dt = d.pick(&["BF16", "BF16", "F16"]);
                for x in 0..e {
                    let [g, u, dn] = naming.names(p, x);
                    out.push(tensor(g, dt, &[i, h], halfs(d, i * h, dt)));
                    out.push(tensor(u, dt, &[i, h], halfs(d, i * h, dt)));
                    out.push(tensor(dn, dt, &[h, i], halfs(d, h * i, dt)));
                }
            }
            if kinds & 2 != 0 {
                // A 16-bit shared expert, with Qwen2-MoE's gate or without.
                let naming = if d.flip() { SharedNaming::SharedExperts } else { SharedNaming::GatedSharedExpert };
                let (i, h) = (1 + d.below(8), 1 + d.below(8));
                let [g, u, dn] = naming.names(p);
                out.push(tensor(g, "BF16", &[i, h], halfs(d, i * h, "BF16")));
                out.push(tensor(u, "BF16", &[i, h], halfs(d, i * h, "BF16")));
                out.push(tensor(dn, "BF16", &[h, i], halfs(d, h * i, "BF16")));
                if let Some(gate) = naming.gate_name(p) {
                    out.push(tensor(gate, "BF16", &[1, h], halfs(d, h, "BF16")));
                }
            }
            if kinds & 4 != 0 {
                // gpt-oss's bf16 form.
                let (i, h) = (1 + d.below(4), 1 + d.below(4));
                let bdt = d.pick(&["BF16", "F32", "F16"]);
                let bias = |d: &mut Draw, n: usize| if bdt == "F32" { scales(d, n, "F32") } else { halfs(d, n, bdt) };
                out.push(tensor(
                    format!("{p}.experts.gate_up_proj"),
                    "BF16",
                    &[e, h, 2 * i],
                    halfs(d, e * h * 2 * i, "BF16"),
                ));
                out.push(tensor(format!("{p}.experts.down_proj"), "BF16", &[e, i, h], halfs(d, e * i * h, "BF16")));
                out.push(tensor(format!("{p}.experts.gate_up_proj_bias"), bdt, &[e, 2 * i], bias(d, e * 2 * i)));
                out.push(tensor(format!("{p}.experts.down_proj_bias"), bdt, &[e, h], bias(d, e * h)));
            }
            if kinds & 8 != 0 {
                // Block-FP8 experts (gate_proj / up_proj / down_proj) and a block-FP8 shared expert, with
                // `weight_scale_inv` grids for the block the case's config names (see `fp8_config`).
                let block = fp8_block(d.byte());
                let (i, h) = (d.pick(&[16, 32, 128, 144]), d.pick(&[16, 48, 128]));
                let sdt = d.pick(&["F32", "F32", "BF16", "F16"]);
                let mut weight = |d: &mut Draw, name: String, rows: usize, cols: usize| {
                    let (gr, gc) = (rows.div_ceil(block.rows), cols.div_ceil(block.cols));
                    out.push(tensor(name.clone(), "F8_E4M3", &[rows, cols], fill(d, rows * cols)));
                    out.push(tensor(format!("{name}_scale_inv"), sdt, &[gr, gc], scales(d, gr * gc, sdt)));
                };
                for x in 0..e.min(2) {
                    let [g, u, dn] = ExpertNaming::GateUpDown.names(p, x);
                    weight(d, g, i, h);
                    weight(d, u, i, h);
                    weight(d, dn, h, i);
                }
                let [g, u, dn] = SharedNaming::SharedExperts.names(p);
                weight(d, g, i, h);
                weight(d, u, i, h);
                weight(d, dn, h, i);
            }
            if kinds & 16 != 0 {
                // Per-tensor or per-channel FP8 experts (Mixtral naming: `weight_scale` `[]`, `[1]`, `[N]` or
                // `[N, 1]`) with static `input_scale`s, as vLLM's and llm-compressor's FP8 releases store them.
                let (i, h) = (1 + d.below(8), 1 + d.below(8));
                let sdt = d.pick(&["F32", "F32", "BF16", "F16"]);
                let channel = d.flip();
                let mut weight = |d: &mut Draw, name: String, rows: usize, cols: usize| {
                    out.push(tensor(name.clone(), "F8_E4M3", &[rows, cols], fill(d, rows * cols)));
                    let shape: Vec<usize> = match (channel, d.flip()) {
                        (true, true) => vec![rows, 1],
                        (true, false) => vec![rows],
                        (false, true) => vec![1],
                        (false, false) => vec![],
                    };
                    let n = shape.iter().product::<usize>();
                    out.push(tensor(format!("{name}_scale"), sdt, &shape, scales(d, n, sdt)));
                    let input = format!("{}.input_scale", name.strip_suffix(".weight").unwrap_or(&name));
                    out.push(tensor(input, "F32", &[], scales(d, 1, "F32")));
                };
                for x in 0..e {
                    let [g, u, dn] = ExpertNaming::Mixtral.names(p, x);
                    weight(d, g, i, h);
                    weight(d, u, i, h);
                    weight(d, dn, h, i);
                }
            }
        }
        Family::Mxfp4 => {
            let (e, h, i) = (1 + d.below(2), 32 * (1 + d.below(2)), 32 * (1 + d.below(2)));
            let bdt = d.pick(&["BF16", "F32", "F16"]);
            let bias = |d: &mut Draw, n: usize| if bdt == "F32" { scales(d, n, "F32") } else { halfs(d, n, bdt) };
            let ue8m0 = |d: &mut Draw, n: usize| fill(d, n).into_iter().map(|b| 120 + b % 12).collect::<Vec<u8>>();
            let n = |s: &str| format!("{p}.experts.{s}");
            out.push(tensor(n("gate_up_proj_blocks"), "U8", &[e, 2 * i, h / 32, 16], fill(d, e * 2 * i * h / 2)));
            out.push(tensor(n("gate_up_proj_scales"), "U8", &[e, 2 * i, h / 32], ue8m0(d, e * 2 * i * h / 32)));
            out.push(tensor(n("gate_up_proj_bias"), bdt, &[e, 2 * i], bias(d, e * 2 * i)));
            out.push(tensor(n("down_proj_blocks"), "U8", &[e, h, i / 32, 16], fill(d, e * h * i / 2)));
            out.push(tensor(n("down_proj_scales"), "U8", &[e, h, i / 32], ue8m0(d, e * h * i / 32)));
            out.push(tensor(n("down_proj_bias"), bdt, &[e, h], bias(d, e * h)));
        }
    }
    out
}

/// The block-FP8 block a case uses, from one byte: DeepSeek's 128 x 128 or a small one.
pub fn fp8_block(b: u8) -> BlockShape {
    [BlockShape::DEEPSEEK, BlockShape { rows: 16, cols: 16 }, BlockShape { rows: 32, cols: 16 }][b as usize % 3]
}

/// The configs the FP8 readers are called with: the case's block, with f32 and UE8M0 scales, and DeepSeek's.
pub fn fp8_configs(block: BlockShape) -> Vec<Fp8Config> {
    let mut v = vec![Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1];
    for f in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        v.push(Fp8Config::new(block, moe_gemm::checkpoint::ActivationScheme::Dynamic, f).unwrap());
    }
    v
}

/// Changes the tensors the way a malformed file differs from a valid one while its header stays consistent
/// (data resized to the new dtype and shape where that is small), or not (`resize` off: the byte count no longer
/// matches the shape).
fn mutate_tensors(d: &mut Draw, t: &mut Vec<Tensor>) {
    if t.is_empty() {
        return;
    }
    let k = d.below(t.len());
    let resize = |x: &mut Tensor| {
        if let Some(n) = byte_count(&x.dtype, &x.shape) {
            x.data.resize(n, 0x3C);
        }
    };
    match d.below(12) {
        0 => {
            // Another dtype, known or not (F8 where BF16 is expected, I64 scales, F4, ...).
            t[k].dtype = json!(d.pick(&DTYPES));
            if d.byte() < 200 {
                resize(&mut t[k]);
            }
        }
        1 | 2 => {
            // Another shape: a dim off by one, swapped, added, dropped, zero, huge, or one whose product
            // overflows.
            let mut s: Vec<u64> =
                t[k].shape.as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
            let at = if s.is_empty() { 0 } else { d.below(s.len()) };
            match d.below(9) {
                0 if !s.is_empty() => s[at] = s[at].saturating_add(1),
                1 if !s.is_empty() => s[at] = s[at].saturating_sub(1),
                2 => s.reverse(),
                3 => s.push(1 + d.below(3) as u64),
                4 => {
                    s.pop();
                }
                5 if !s.is_empty() => s[at] = 0,
                6 if !s.is_empty() => {
                    // A zero dim beside a huge one: no bytes, but a size no reader may allocate.
                    s[at] = 0;
                    let other = (at + 1) % s.len().max(1);
                    if other != at {
                        s[other] = d.pick(&[1 << 40, 1 << 62, u64::MAX, usize::MAX as u64 / 2 + 1]);
                    }
                }
                7 => s = vec![1 << 32, 1 << 32, 16],
                _ if !s.is_empty() => s[at] = d.pick(&[1 << 20, 1 << 40, u64::MAX]),
                _ => {}
            }
            t[k].shape = json!(s);
            if d.byte() < 200 {
                resize(&mut t[k]);
            }
        }
        3 => {
            t.remove(k);
        }
        4 => {
            // Renamed onto another tensor's name (one goes missing, the other is replaced).
            let other = d.below(t.len());
            t[k].name = t[other].name.clone();
        }
        5 | 6 => {
            // Bytes that are no valid value: NaN, infinite and negative scales, 0xFF UE8M0 scales, random.
            let pat: &[u8] = d.pick(&[
                &[0xFF][..],
                &[0x00, 0x00, 0xC0, 0x7F][..],
                &[0x00, 0x00, 0x80, 0xFF][..],
                &[0x00, 0x00, 0x80, 0xBF][..],
                &[0xC0, 0x7F][..],
                &[0x01, 0x00, 0x40, 0x40][..],
            ]);
            let all = d.flip();
            let len = t[k].data.len();
            if len > 0 {
                let from = if all { 0 } else { d.below(len) };
                let to = if all { len } else { (from + pat.len()).min(len) };
                for (j, b) in t[k].data[from..to].iter_mut().enumerate() {
                    *b = pat[j % pat.len()];
                }
            }
        }
        7 => {
            // A scale grid of the wrong shape for its weight, data kept consistent.
            if let Some(x) = t.iter_mut().find(|x| x.name.ends_with("_scale_inv") || x.name.ends_with("_scales")) {
                let mut s: Vec<u64> =
                    x.shape.as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
                if let Some(v) = s.last_mut() {
                    *v = v.saturating_add(1);
                }
                x.shape = json!(s);
                resize(x);
            }
        }
        8 => {
            // Shape and dtype as JSON of the wrong kind.
            t[k].shape = d.pick(&[json!("[2, 2]"), json!([-1, 2]), json!([1.5, 2]), json!(null), json!([[1]])]);
        }
        9 => t[k].dtype = d.pick(&[json!(null), json!(8), json!(["BF16"]), json!("")]),
        _ => {
            // A tensor the readers do not expect, or a duplicate of one they do.
            let mut x = t[k].clone();
            x.name = d.pick(&[format!("{PREFIX}.experts.9.w1.weight"), String::new()]);
            t.push(x);
        }
    }
}

/// The header (tensors in order, contiguous `data_offsets`; of two tensors of one name the first) and the data.
fn layout(t: &[Tensor]) -> (Map<String, Value>, Vec<u8>, Vec<usize>) {
    let mut header = Map::new();
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for x in t {
        if header.contains_key(&x.name) {
            continue;
        }
        let s = data.len();
        data.extend_from_slice(&x.data);
        header.insert(x.name.clone(), json!({"dtype": x.dtype, "shape": x.shape, "data_offsets": [s, data.len()]}));
        ends.push(data.len());
    }
    (header, data, ends)
}

/// Breaks the header's offsets: past the end, reversed, overlapping, shifted, huge, of the wrong kind.
fn mutate_header(d: &mut Draw, header: &mut Map<String, Value>, data_len: usize) {
    let keys: Vec<String> = header.keys().cloned().collect();
    match d.below(6) {
        0..=3 if !keys.is_empty() => {
            let key = d.pick(&keys);
            let Some(entry) = header.get_mut(&key).and_then(Value::as_object_mut) else { return };
            let (s, e) = match entry.get("data_offsets").and_then(Value::as_array).map(|a| &a[..]) {
                Some([s, e]) => (s.as_u64().unwrap_or(0), e.as_u64().unwrap_or(0)),
                _ => (0, 0),
            };
            let len = data_len as u64;
            let new = match d.below(9) {
                0 => json!([s, len + 1 + d.below(64) as u64]),
                1 => json!([e, s]),
                2 => json!([s.saturating_sub(1 + d.below(4) as u64), e]),
                3 => json!([s.saturating_add(1), e.saturating_add(1)]),
                4 => json!([0, e]),
                5 => json!([s, u64::MAX]),
                6 => json!([u64::MAX - 1, u64::MAX]),
                7 => json!([s]),
                _ => json!(["0", e]),
            };
            entry.insert("data_offsets".into(), new);
        }
        4 => {
            header.insert(
                "__metadata__".into(),
                d.pick(&[json!({"format": "pt"}), json!({"format": 1}), json!("pt"), json!([1, 2])]),
            );
        }
        _ => {}
    }
}

/// The file's bytes, broken at the byte level: the header length field, truncation at every kind of boundary,
/// appended or flipped bytes.
fn serialize(d: &mut Draw, header: &Map<String, Value>, data: &[u8], tensor_ends: &[usize]) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap();
    let broken = d.byte() < 80;
    if broken && d.byte() < 64 {
        // Header text that is not JSON, or not UTF-8.
        match d.below(3) {
            0 => h.truncate(d.below(h.len().max(1))),
            1 => h.push(0xFF),
            _ => h = d.rest().iter().take(64).copied().collect(),
        }
    }
    while h.len() % 8 != 0 && d.flip() {
        h.push(b' ');
    }
    let mut file = Vec::with_capacity(8 + h.len() + data.len());
    file.extend_from_slice(&(h.len() as u64).to_le_bytes());
    file.extend_from_slice(&h);
    file.extend_from_slice(data);
    let hl = h.len() as u64;
    let flen = file.len() as u64;
    for _ in 0..if broken { 1 + d.below(2) } else { 0 } {
        match d.below(8) {
            0 if file.len() >= 8 => {
                let n = d.pick(&[flen, flen - 7, hl + 1, hl.saturating_sub(1), 0, u64::MAX, 100_000_001, 1 << 40]);
                file[..8].copy_from_slice(&n.to_le_bytes());
            }
            1..=3 => {
                // Truncated: inside the length field, at or inside the header, at a tensor's end or inside one,
                // one byte short.
                let header_end = 8 + h.len();
                let mut cuts =
                    vec![0, 1 + d.below(7), 8, header_end.saturating_sub(1), header_end, file.len().saturating_sub(1)];
                cuts.extend(tensor_ends.iter().map(|e| header_end + e));
                cuts.extend(tensor_ends.iter().map(|e| (header_end + e).saturating_sub(1 + d.below(3))));
                cuts.push(d.below(file.len().max(1)));
                let at = d.pick(&cuts).min(file.len());
                file.truncate(at);
            }
            0 | 4 => file.extend(std::iter::repeat_n(0u8, 1 + d.below(16))),
            _ => {
                if !file.is_empty() {
                    let at = d.below(file.len());
                    file[at] ^= 1 << (d.byte() % 8);
                }
            }
        }
    }
    file
}

/// A safetensors file for `family` from the input: a valid one, then 0 to 3 mutations of its tensors (most keep
/// the header consistent, so that the readers see them), and in about a third of the cases a broken header and
/// in another third broken bytes.
pub fn checkpoint_bytes(input: &[u8], family: Family) -> (Vec<u8>, BlockShape) {
    let mut d = Draw::new(input);
    let mut t = valid_tensors(&mut d, family);
    let block_byte = d.byte();
    for _ in 0..d.below(4) {
        mutate_tensors(&mut d, &mut t);
    }
    let (mut header, data, ends) = layout(&t);
    if d.byte() < 64 {
        mutate_header(&mut d, &mut header, data.len());
    }
    (serialize(&mut d, &header, &data, &ends), fp8_block(block_byte))
}

/// Asserts that `err`, from opening `file`, is a typed file error naming it.
pub fn assert_file_error(err: &Error, file: &Path) {
    match err {
        Error::CheckpointFile { file: f, problem } => {
            assert_eq!(f, file, "{err}");
            assert!(!problem.is_empty(), "{err}");
        }
        e => panic!("opening {} failed with an error that is not Error::CheckpointFile: {e:?}", file.display()),
    }
    assert!(err.to_string().contains(&file.display().to_string()), "{err}");
}

/// What a case reached: whether the file opened, how many reads succeeded and failed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reached {
    pub opened: usize,
    /// config.json only: compressed-tensors schemes that parsed.
    pub compressed_tensors: usize,
    /// Checkpoints only: per-tensor / per-channel FP8 experts that packed.
    pub channel_packs: usize,
    pub ok: usize,
    pub err: usize,
}

thread_local! {
    static REACHED: std::cell::Cell<Reached> = const { std::cell::Cell::new(Reached { opened: 0, compressed_tensors: 0, channel_packs: 0, ok: 0, err: 0 }) };
}

/// What the cases of this thread have reached so far.
pub fn reached() -> Reached {
    REACHED.with(|r| r.get())
}

fn count(f: impl FnOnce(&mut Reached)) {
    REACHED.with(|r| {
        let mut v = r.get();
        f(&mut v);
        r.set(v);
    });
}

/// Asserts that `result` of reading `what` from checkpoint `c` is Ok or an [`Error::Checkpoint`] naming `c`'s
/// file and a tensor whose name starts with `tensor_prefix`, both in its message.
pub fn assert_tensor_result<T>(c: &Checkpoint, what: &str, tensor_prefix: &str, result: &moe_gemm::Result<T>) {
    count(|r| if result.is_ok() { r.ok += 1 } else { r.err += 1 });
    let Err(err) = result else { return };
    let msg = err.to_string();
    match err {
        Error::Checkpoint { file: Some(f), tensor, problem } => {
            assert_eq!(f, c.file(), "{what}: {msg}");
            assert!(tensor.starts_with(tensor_prefix), "{what}: the error names `{tensor}`: {msg}");
            assert!(!problem.is_empty(), "{what}: {msg}");
            assert!(msg.contains(tensor.as_str()) && msg.contains(&f.display().to_string()), "{what}: {msg}");
        }
        e => panic!("{what}: not an Error::Checkpoint naming the file: {e:?}"),
    }
}

/// The per-tensor and per-channel schemes the readers take.
fn channel_schemes() -> Vec<Fp8Scheme> {
    [
        r#"{"quant_method": "fp8", "activation_scheme": "static"}"#,
        r#"{"quant_method": "fp8", "activation_scheme": "dynamic"}"#,
        r#"{"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}"#,
    ]
    .iter()
    .map(|qc| Fp8Scheme::from_config_json(&format!(r#"{{"quantization_config": {qc}}}"#)).unwrap().unwrap())
    .collect()
}

/// Calls every reader a checkpoint of `family` has on `bytes` (named `file`): each one must return Ok or a typed
/// error naming the file and the tensor. Values that are read are used (dequantised, packed, padded) too.
pub fn check_checkpoint(file: &Path, bytes: Vec<u8>, family: Family, block: BlockShape) {
    let c = match Checkpoint::from_bytes(file, bytes) {
        Ok(c) => c,
        Err(e) => return assert_file_error(&e, file),
    };
    count(|r| r.opened += 1);
    let names = c.names();
    let p = PREFIX;
    match family {
        Family::Safetensors => {
            for name in &names {
                assert_tensor_result(&c, "tensor::<bf16>", name, &c.tensor::<bf16>(name));
                assert_tensor_result(&c, "tensor::<f16>", name, &c.tensor::<half::f16>(name));
                if name.ends_with("_scale_inv") || name.ends_with("_scale") {
                    continue;
                }
                for scales in [WeightScales::Tensor, WeightScales::Channel] {
                    let r = c.fp8_scaled_weight(name, scales);
                    if let Ok(w) = &r {
                        assert_eq!(w.dequantize().len(), w.rows() * w.cols());
                    }
                    assert_tensor_result(&c, "fp8_scaled_weight", name, &r);
                }
                assert_tensor_result(&c, "fp8_input_scale", name.trim_end_matches("weight"), &c.fp8_input_scale(name));
                for cfg in fp8_configs(block) {
                    let r = c.fp8_block_weight(name, &cfg);
                    if let Ok(w) = &r {
                        assert_eq!(w.dequantize().len(), w.rows() * w.cols());
                    }
                    assert_tensor_result(&c, "fp8_block_weight", name, &r);
                }
            }
            for experts in 1..=3 {
                for naming in [ExpertNaming::Mixtral, ExpertNaming::GateUpDown] {
                    let r = c.pack_experts::<bf16>(p, experts, naming);
                    assert_tensor_result(&c, "pack_experts", p, &r);
                    if let Ok(packed) = r {
                        moe_gemm::checkpoint::unpack_experts(&packed, p, naming).unwrap();
                    }
                    assert_tensor_result(
                        &c,
                        "pack_experts::<f16>",
                        p,
                        &c.pack_experts::<half::f16>(p, experts, naming),
                    );
                }
                for cfg in fp8_configs(block) {
                    let r = c.pack_fp8_experts(p, experts, ExpertNaming::GateUpDown, &cfg);
                    assert_tensor_result(&c, "pack_fp8_experts", p, &r);
                    if let Ok(packed) = &r {
                        for e in 0..packed.experts() {
                            packed.expert(e).unwrap();
                        }
                        let shared = c.pack_fp8_shared_expert(p, SharedNaming::SharedExperts, &cfg);
                        assert_tensor_result(&c, "pack_fp8_shared_expert", p, &shared);
                        if let Ok(s) = shared {
                            let _ = packed.with_shared_groups(&s);
                        }
                    }
                }
            }
            for experts in 1..=3 {
                for scheme in channel_schemes() {
                    let r = c.pack_fp8_channel_experts(p, experts, ExpertNaming::Mixtral, &scheme);
                    assert_tensor_result(&c, "pack_fp8_channel_experts", p, &r);
                    if let Ok(packed) = &r {
                        count(|c| c.channel_packs += 1);
                        assert_eq!(packed.w13().len(), experts);
                        let _ = packed.static_scales().map(|s| s.layer_scales());
                    }
                }
            }
            // A server may take the expert count from an untrusted config.json: a huge one must not reserve memory.
            for scheme in channel_schemes() {
                let r = c.pack_fp8_channel_experts(p, usize::MAX, ExpertNaming::Mixtral, &scheme);
                assert_tensor_result(&c, "pack_fp8_channel_experts(huge E)", p, &r);
            }
            assert_tensor_result(
                &c,
                "pack_experts(huge E)",
                p,
                &c.pack_experts::<bf16>(p, usize::MAX, ExpertNaming::Mixtral),
            );
            assert_tensor_result(
                &c,
                "pack_fp8_experts(huge E)",
                p,
                &c.pack_fp8_experts(p, usize::MAX, ExpertNaming::GateUpDown, &Fp8Config::DEEPSEEK_V3),
            );
            for naming in [SharedNaming::SharedExperts, SharedNaming::GatedSharedExpert] {
                let r = c.pack_shared_expert::<bf16>(p, naming);
                assert_tensor_result(&c, "pack_shared_expert", p, &r);
                if let Ok(s) = r {
                    moe_gemm::checkpoint::unpack_shared_expert(&s, p, naming).unwrap();
                }
                for cfg in fp8_configs(block) {
                    assert_tensor_result(&c, "pack_fp8_shared_expert", p, &c.pack_fp8_shared_expert(p, naming, &cfg));
                }
            }
            assert_tensor_result(&c, "pack_gpt_oss", p, &c.pack_gpt_oss::<bf16>(p));
        }
        Family::Mxfp4 => {
            for name in &names {
                if let Some(stem) = name.strip_suffix("_blocks") {
                    assert_tensor_result(&c, "mxfp4_weight", stem, &c.mxfp4_weight(stem));
                }
            }
            let r = c.pack_gpt_oss_mxfp4(p);
            assert_tensor_result(&c, "pack_gpt_oss_mxfp4", p, &r);
            if let Ok(mx) = r {
                let bf: PackedExperts<bf16> = mx.dequantize().unwrap();
                assert_eq!(bf.format, ExpertFormat::GPT_OSS);
                mx.padded_for_sm100().unwrap();
            }
            assert_tensor_result(&c, "pack_gpt_oss_dequantized", p, &c.pack_gpt_oss_dequantized::<bf16>(p));
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// config.json and tuned tables
// ---------------------------------------------------------------------------------------------------------------

/// A `config.json` text from the input: a `quantization_config` whose fields take valid, mistyped, out-of-range
/// or unknown values, or are absent; sometimes the text is then cut or flipped, or is the input itself.
pub fn config_json(input: &[u8]) -> String {
    let mut d = Draw::new(input);
    if d.byte() < 16 {
        return String::from_utf8_lossy(d.rest()).into_owned();
    }
    let mut q = Map::new();
    // Each field absent, its valid value (the first), or any of its values.
    let mut field = |d: &mut Draw, key: &str, values: &[Value]| match d.byte() {
        0..20 => {}
        20..170 => {
            q.insert(key.into(), values[0].clone());
        }
        _ => {
            q.insert(key.into(), d.pick(values));
        }
    };
    let method = if d.byte() < 128 { json!("fp8") } else { json!("compressed-tensors") };
    field(&mut d, "quant_method", &[method, json!("fp8"), json!("FP8"), json!("mxfp4"), json!(8), json!(null)]);
    field(&mut d, "fmt", &[json!("e4m3"), json!("e5m2"), json!(1), json!(null), json!({})]);
    field(&mut d, "activation_scheme", &[json!("dynamic"), json!("static"), json!(["dynamic"]), json!(null)]);
    field(
        &mut d,
        "weight_block_size",
        &[
            json!([128, 128]),
            json!([128, 128]),
            json!([64, 32]),
            json!([1, 1]),
            json!([128]),
            json!([128, 128, 128]),
            json!([]),
            json!([0, 128]),
            json!([128, 0]),
            json!([-128, 128]),
            json!([128.0, 128]),
            json!([1e30, 128]),
            json!([u64::MAX, 1]),
            json!([u64::MAX, u64::MAX]),
            json!([1u64 << 40, 1u64 << 40]),
            json!(["128", "128"]),
            json!([null, 128]),
            json!(128),
            json!("128x128"),
            json!(null),
            json!({"rows": 128}),
        ],
    );
    field(&mut d, "scale_fmt", &[json!("ue8m0"), json!("UE8M0"), json!("e8m0"), json!(0), json!(null)]);
    field(&mut d, "modules_to_not_convert", &[json!(["lm_head"]), json!(null), json!(7)]);
    // compressed-tensors: groups of FP8 arguments from a scheme llm-compressor writes, each field kept, made odd
    // or dropped.
    let args = |d: &mut Draw, template: Value| {
        let odd: [(&str, &[Value]); 7] = [
            ("num_bits", &[json!(4), json!(-8), json!("8"), json!(u64::MAX)]),
            ("type", &[json!("int"), json!(null), json!(1)]),
            (
                "strategy",
                &[json!("tensor"), json!("channel"), json!("token"), json!("group"), json!("block"), json!(3)],
            ),
            ("dynamic", &[json!(true), json!(false), json!("local")]),
            ("symmetric", &[json!(false), json!(null)]),
            ("group_size", &[json!(0), json!(-1), json!(u64::MAX), json!(1.5), json!(64)]),
            ("block_structure", &[json!([0, 1]), json!([128]), json!(null), json!([u64::MAX, 2])]),
        ];
        let mut a = template.as_object().cloned().unwrap_or_default();
        for (key, values) in odd {
            match d.byte() {
                0..6 => {
                    a.remove(key);
                }
                6..12 => {
                    a.insert(key.into(), d.pick(values));
                }
                _ => {}
            }
        }
        Value::Object(a)
    };
    let weights = [
        json!({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false}),
        json!({"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}),
        json!({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}),
    ];
    let activations = [
        json!({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}),
        json!({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false}),
        json!({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": true}),
    ];
    let groups = match d.below(10) {
        0 => json!(null),
        1 => json!({}),
        2 => json!([1, 2]),
        n => {
            let (w, a) = (d.below(3), d.below(3));
            let mut g = Map::new();
            for i in 0..(n - 2).min(3) {
                let (w, a) = (args(&mut d, weights[w].clone()), args(&mut d, activations[a].clone()));
                g.insert(format!("group_{i}"), json!({"targets": ["Linear"], "weights": w, "input_activations": a}));
            }
            Value::Object(g)
        }
    };
    field(&mut d, "config_groups", &[groups, json!("none")]);
    field(&mut d, "format", &[json!("float-quantized"), json!("pack-quantized"), json!(null), json!(0)]);
    let mut root = Map::new();
    root.insert("hidden_size".into(), json!(7168));
    if d.byte() < 240 {
        let qc = match d.below(12) {
            0 => d.pick(&[json!("fp8"), json!([1]), json!(null), json!(true), json!(1.5)]),
            _ => Value::Object(q),
        };
        root.insert("quantization_config".into(), qc);
    }
    let mut text = serde_json::to_string(&Value::Object(root)).unwrap();
    match d.below(16) {
        0 => text.truncate(d.below(text.len().max(1))),
        1 => {
            // Deep nesting: serde_json's recursion limit must answer, not the stack.
            text = format!("{}{}", "[".repeat(1 + d.below(4096)), "]".repeat(d.below(8)));
        }
        2 => {
            let mut b = text.into_bytes();
            if !b.is_empty() {
                let at = d.below(b.len());
                b[at] = d.byte();
            }
            text = String::from_utf8_lossy(&b).into_owned();
        }
        _ => {}
    }
    text
}

/// Parses a `config.json` text: Ok, or an [`Error::InvalidProblem`] that names config.json; a config that parses
/// is usable: it quantises small experts (or says why not) without panicking.
pub fn check_config_json(text: &str) {
    match Fp8Scheme::from_config_json(text) {
        Ok(Some(s)) if s.source() == SchemeSource::CompressedTensors => count(|c| c.compressed_tensors += 1),
        Ok(_) => {}
        Err(Error::InvalidProblem(m)) => assert!(m.contains("config.json"), "{m}"),
        Err(other) => panic!("Fp8Scheme::from_config_json: not Error::InvalidProblem: {other:?}"),
    }
    let r = Fp8Config::from_config_json(text);
    count(|c| if r.is_ok() { c.ok += 1 } else { c.err += 1 });
    match r {
        Ok(None) => {}
        Ok(Some(cfg)) => {
            count(|c| c.opened += 1);
            let b = cfg.block();
            assert!(b.rows > 0 && b.cols > 0, "{cfg:?}");
            let _ = cfg.activation_quant();
            let (e, h, i) = (2usize, 32usize, 16usize);
            let w13: Vec<bf16> = (0..e * 2 * i * h).map(|x| bf16::from_f32((x % 7) as f32 - 3.0)).collect();
            let w2: Vec<bf16> = (0..e * h * i).map(|x| bf16::from_f32((x % 5) as f32 - 2.0)).collect();
            let p = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13, w2, None, None).unwrap();
            match PackedFp8Experts::quantize(&p, &cfg) {
                Ok(q) => {
                    q.expert(e - 1).unwrap();
                }
                Err(Error::InvalidProblem(m)) => assert!(!m.is_empty()),
                Err(other) => panic!("quantize under {cfg:?}: {other:?}"),
            }
        }
        Err(Error::InvalidProblem(m)) => assert!(m.contains("config.json"), "{m}"),
        Err(other) => panic!("from_config_json: not Error::InvalidProblem: {other:?}"),
    }
}

/// A tuned-table file name and text from the input: valid ones (as `moe-gemm tune` writes them), then broken.
pub fn tuned_table(input: &[u8]) -> (String, String) {
    let mut d = Draw::new(input);
    let name = match d.below(10) {
        0 => String::from_utf8_lossy(&d.rest()[..d.rest().len().min(48)]).into_owned(),
        1 => "E=8,N=14336,device_name=NVIDIA_H100,block_shape=[128, 128".into(),
        2 => format!("E={},N=x,device_name=H.json", u64::MAX),
        3 => "E=8,N=1,device_name=H,block_shape=[1,2,3].json".into(),
        4 => "E=8,N=1,device_name=H,block_shape=[,].json".into(),
        5 => "E=99999999999999999999,N=1,device_name=H.json".into(),
        6 => ",block_shape=[1, 2].json".into(),
        _ => format!("E={},N={},device_name=NVIDIA_H200,dtype=fp8_w8a8.json", 1 + d.below(512), 1 + d.u16() as usize),
    };
    let mut obj = Map::new();
    for _ in 0..d.below(40) {
        let key = match d.below(6) {
            0 => d.pick(&["0", "-1", "x", "1e3", "18446744073709551616", " 4"]).to_string(),
            _ => (1 + d.below(8192)).to_string(),
        };
        let backend =
            d.pick(&[json!("Grouped"), json!("batched"), json!("Fused"), json!("Auto"), json!("x"), json!(1)]);
        let mut entry = Map::new();
        if d.byte() < 240 {
            entry.insert("backend".into(), backend);
        }
        if d.byte() < 64 {
            entry.insert("fused_tile".into(), d.pick(&[json!("nope"), json!(3), json!(null)]));
        }
        obj.insert(key, Value::Object(entry));
    }
    let mut text = serde_json::to_string(&Value::Object(obj)).unwrap();
    if d.byte() < 32 {
        text.truncate(d.below(text.len().max(1)));
    }
    (name, text)
}

/// Parses a tuned table's name and text: Ok or an [`Error::InvalidProblem`]; a table that parses answers picks.
pub fn check_tuned_table(name: &str, text: &str) {
    match ConfigName::parse(name) {
        Ok(n) => {
            // The name round-trips through its Display.
            assert_eq!(ConfigName::parse(&n.to_string()).unwrap(), n);
            match TunedBackends::from_json(&n, text) {
                Ok(t) => {
                    assert!(!t.buckets().is_empty());
                    for tokens in [0, 1, 7, 4096, usize::MAX] {
                        let _ = (t.pick(tokens), t.fused_tile(tokens));
                    }
                }
                Err(Error::InvalidProblem(m)) => assert!(!m.is_empty()),
                Err(other) => panic!("TunedBackends::from_json: {other:?}"),
            }
        }
        Err(Error::InvalidProblem(m)) => assert!(m.contains("config file name"), "{m}"),
        Err(other) => panic!("ConfigName::parse: {other:?}"),
    }
}
