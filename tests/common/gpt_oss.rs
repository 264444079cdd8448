//! A gpt-oss MXFP4 expert checkpoint built by tests (HF names, `openai/gpt-oss` storage), and an independent
//! dequantisation of its bytes. Shared by `tests/mxfp4.rs` and the GPU test `tests/gpu/mxfp4.rs`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use half::bf16;
use moe_gemm::random::SplitMix64;
use safetensors::tensor::{Dtype, TensorView};

/// (name, dtype, shape, bytes).
pub type RawTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// gpt-oss's FP4 values by nibble (`gpt_oss/torch/weights.py` `FP4_VALUES`), written out here on purpose.
pub const FP4_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

pub fn name(prefix: &str, t: &str) -> String {
    format!("{prefix}.experts.{t}")
}

/// Random experts under `prefix`: `E` experts, hidden `h`, intermediate `i` (both multiples of 32); scale bytes
/// in `scales.0 ..= scales.1`; bf16 biases of magnitude below `bias`.
pub fn tensors(prefix: &str, e: usize, h: usize, i: usize, seed: u64, scales: (u8, u8), bias: f32) -> Vec<RawTensor> {
    let mut rng = SplitMix64(seed);
    let mut bytes = |n: usize| (0..n).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
    let gb = bytes(e * 2 * i * h / 2);
    let db = bytes(e * h * i / 2);
    let mut rng = SplitMix64(seed + 1);
    let span = (scales.1 - scales.0) as u64 + 1;
    let mut sc = |n: usize| (0..n).map(|_| scales.0 + (rng.next_u64() % span) as u8).collect::<Vec<u8>>();
    let gs = sc(e * 2 * i * h / 32);
    let ds = sc(e * h * i / 32);
    let mut rng = SplitMix64(seed + 2);
    let mut b16 =
        |n: usize| (0..n).flat_map(|_| bf16::from_f32(rng.unit() * bias).to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let (b13, b2) = (b16(e * 2 * i), b16(e * h));
    vec![
        (name(prefix, "gate_up_proj_blocks"), Dtype::U8, vec![e, 2 * i, h / 32, 16], gb),
        (name(prefix, "gate_up_proj_scales"), Dtype::U8, vec![e, 2 * i, h / 32], gs),
        (name(prefix, "gate_up_proj_bias"), Dtype::BF16, vec![e, 2 * i], b13),
        (name(prefix, "down_proj_blocks"), Dtype::U8, vec![e, h, i / 32, 16], db),
        (name(prefix, "down_proj_scales"), Dtype::U8, vec![e, h, i / 32], ds),
        (name(prefix, "down_proj_bias"), Dtype::BF16, vec![e, h], b2),
    ]
}

pub fn write(path: &Path, tensors: &[RawTensor]) {
    let views: HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

pub fn get<'a>(tensors: &'a [RawTensor], n: &str) -> &'a RawTensor {
    tensors.iter().find(|t| t.0 == n).unwrap_or_else(|| panic!("no tensor {n}"))
}

/// Element `(e, row, col)` of an MXFP4 weight `[E, N, K]` from its blocks `[E, N, K/32, 16]` and scales
/// `[E, N, K/32]`, by gpt-oss's rule: byte `col % 32 / 2` of block `col / 32`, low nibble for an even `col`.
pub fn element(blocks: &[u8], scales: &[u8], n: usize, k: usize, e: usize, row: usize, col: usize) -> f32 {
    let blk = (e * n + row) * (k / 32) + col / 32;
    let byte = blocks[blk * 16 + (col % 32) / 2];
    let nibble = if col % 2 == 0 { byte & 0xF } else { byte >> 4 };
    FP4_VALUES[nibble as usize] * (scales[blk] as f64 - 127.0).exp2() as f32
}

/// The bf16 form `pack_gpt_oss` reads, built from the MXFP4 tensors element by element: `gate_up_proj [E, H, 2I]`
/// and `down_proj [E, I, H]` (gpt-oss's transposed storage), the biases as they are.
pub fn bf16_form(prefix: &str, t: &[RawTensor]) -> Vec<RawTensor> {
    let (gb, gs, db, ds) = (
        get(t, &name(prefix, "gate_up_proj_blocks")),
        get(t, &name(prefix, "gate_up_proj_scales")),
        get(t, &name(prefix, "down_proj_blocks")),
        get(t, &name(prefix, "down_proj_scales")),
    );
    let (e, i2, h) = (gb.2[0], gb.2[1], gb.2[2] * 32);
    let i = i2 / 2;
    let to_bytes = |v: Vec<f32>| v.into_iter().flat_map(|x| bf16::from_f32(x).to_bits().to_le_bytes()).collect();
    let mut w13 = Vec::new();
    for x in 0..e {
        for c in 0..h {
            for o in 0..i2 {
                w13.push(element(&gb.3, &gs.3, i2, h, x, o, c));
            }
        }
    }
    let mut w2 = Vec::new();
    for x in 0..e {
        for c in 0..i {
            for o in 0..h {
                w2.push(element(&db.3, &ds.3, h, i, x, o, c));
            }
        }
    }
    vec![
        (name(prefix, "gate_up_proj"), Dtype::BF16, vec![e, h, i2], to_bytes(w13)),
        (name(prefix, "down_proj"), Dtype::BF16, vec![e, i, h], to_bytes(w2)),
        get(t, &name(prefix, "gate_up_proj_bias")).clone(),
        get(t, &name(prefix, "down_proj_bias")).clone(),
    ]
}
