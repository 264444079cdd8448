//! FP8 block quantization references and FP8 checkpoints on the CPU.

mod common;

use std::collections::HashMap;

use common::*;
use moe_gemm::checkpoint::{Checkpoint, ExpertNaming, Fp8Config};
use moe_gemm::quant::*;
use safetensors::tensor::{Dtype, TensorView};

#[test]
fn e4m3_conversion_is_e4m3fn_with_saturation_and_even_rounding() {
    assert_eq!(F8E4M3::from_f32(448.0).to_f32(), 448.0);
    assert_eq!(F8E4M3::from_f32(1e6).to_f32(), 448.0, "saturates to the largest finite value");
    assert_eq!(F8E4M3::from_f32(-1e6).to_f32(), -448.0);
    // 1.0625 is halfway between 1.0 and 1.125: ties go to the even mantissa (1.0).
    assert_eq!(F8E4M3::from_f32(1.0625).to_f32(), 1.0);
    assert_eq!(F8E4M3::from_f32(1.1875).to_f32(), 1.25);
    assert!(F8E4M3::from_f32(f32::NAN).to_f32().is_nan());
}

#[test]
fn ue8m0_scales_are_powers_of_two_rounded_up() {
    assert_eq!(Ue8m0::ONE.to_f32(), 1.0);
    assert_eq!(Ue8m0::from_f32_ceil(1.0).unwrap(), Ue8m0(127));
    assert_eq!(Ue8m0::from_f32_ceil(3.0).unwrap().to_f32(), 4.0);
    assert_eq!(Ue8m0::from_f32_ceil(0.3).unwrap().to_f32(), 0.5);
    assert_eq!(Ue8m0::from_f32_ceil(2f32.powi(-20)).unwrap().to_f32(), 2f32.powi(-20));
    assert!(Ue8m0(0xFF).to_f32().is_nan());
    for bad in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        assert!(Ue8m0::from_f32_ceil(bad).is_err(), "{bad}");
    }
}

fn random_weight(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    // Blocks of very different magnitudes, as real weights have.
    (0..rows * cols).map(|i| rng.unit() * if (i / cols) % 200 < 100 { 0.02 } else { 3.0 }).collect()
}

#[test]
fn block_quantization_round_trips_within_e4m3_precision() {
    let (rows, cols) = (300, 260); // partial blocks on both edges
    let w = random_weight(rows, cols, 1);
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let q = BlockFp8::quantize(&w, rows, cols, BlockShape::DEEPSEEK, format).unwrap();
        assert_eq!(q.scales().len(), 3 * 3);
        let dq = q.dequantize();
        for i in 0..w.len() {
            let s = q.scale_of(i / cols, i % cols).unwrap();
            // e4m3: 3 mantissa bits -> half-ulp 2^-4 relative; subnormal step 2^-9 of the scale.
            let tol = w[i].abs() / 16.0 + s * 2f32.powi(-9);
            assert!((dq[i] - w[i]).abs() <= tol, "{format:?} element {i}: {} vs {}", dq[i], w[i]);
        }
        // The largest element of a block uses the top of the e4m3 range (F32) or at least half of it (UE8M0).
        let top = q.q().iter().map(|x| x.to_f32().abs()).fold(0f32, f32::max);
        assert!(top >= if format == ScaleFormat::F32 { 440.0 } else { 224.0 }, "{format:?}: {top}");
    }
}

#[test]
fn zero_blocks_and_bad_inputs() {
    let q = BlockFp8::quantize(&vec![0.0; 128 * 128], 128, 128, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap();
    assert_eq!(*q.scales(), Scales::F32(vec![1.0]));
    assert!(q.dequantize().iter().all(|&x| x == 0.0));
    let mut w = vec![1.0f32; 4 * 4];
    w[6] = f32::INFINITY;
    let err = BlockFp8::quantize(&w, 4, 4, BlockShape { rows: 2, cols: 2 }, ScaleFormat::F32).unwrap_err();
    assert!(err.to_string().contains("[1, 2]"), "{err}");
}

fn invalid<T: std::fmt::Debug>(r: moe_gemm::Result<T>) -> String {
    match r {
        Err(moe_gemm::Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

/// Shapes no block grid fits are errors naming the constraint, never a division by zero or an index out of
/// bounds.
#[test]
fn zero_block_dims_overflowing_shapes_and_outside_elements_are_errors() {
    let w = vec![1.0f32; 16];
    for block in [BlockShape { rows: 0, cols: 2 }, BlockShape { rows: 2, cols: 0 }] {
        let (br, bc) = (block.rows, block.cols);
        for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
            let m = invalid(BlockFp8::quantize(&w, 4, 4, block, format));
            assert!(m.contains(&format!("block shape {br} x {bc}")) && m.contains("positive"), "{m}");
        }
        let q = vec![F8E4M3::from_f32(1.0); 16];
        assert!(invalid(BlockFp8::from_parts(4, 4, block, q, Scales::F32(vec![1.0; 4]))).contains("positive"));
        assert!(invalid(block.grid(4, 4)).contains(&format!("{br} x {bc}")));
    }
    // rows x cols past usize: refused before anything is indexed.
    let m = invalid(BlockFp8::quantize(&w, usize::MAX, 2, BlockShape::DEEPSEEK, ScaleFormat::F32));
    assert!(m.contains("overflows"), "{m}");
    let m = invalid(BlockFp8::from_parts(1 << 33, 1 << 33, BlockShape::DEEPSEEK, vec![], Scales::F32(vec![])));
    assert!(m.contains("overflows"), "{m}");
    let m = invalid(Scales::from_bytes(ScaleFormat::F32, usize::MAX, &[0; 8]));
    assert!(m.contains("more than usize::MAX"), "{m}");
    // An element outside the weight has no scale; past the grid, no scale either.
    let q = BlockFp8::quantize(&w, 4, 4, BlockShape { rows: 2, cols: 2 }, ScaleFormat::F32).unwrap();
    assert_eq!(q.scale_of(3, 3).unwrap(), 1.0 / E4M3_MAX);
    assert!(invalid(q.scale_of(4, 0)).contains("(4, 0) is outside the [4, 4] weight"));
    assert!(invalid(q.scale_of(0, 4)).contains("outside"));
    assert_eq!((q.scales().get(3), q.scales().get(4)), (Some(1.0 / E4M3_MAX), None));
    // Empty weights have empty grids.
    let empty = BlockFp8::quantize(&[], 0, 7, BlockShape::DEEPSEEK, ScaleFormat::Ue8m0).unwrap();
    assert!(empty.scales().is_empty() && empty.dequantize().is_empty());
}

/// A block of tiny subnormals: amax / 448 underflows to 0 in f32, which must not become the divisor (the
/// elements would turn into e4m3 NaN or saturate); UE8M0 cannot represent such a scale and says which block.
#[test]
fn subnormal_blocks_never_divide_by_zero() {
    let tiny = f32::from_bits(3); // 4.2e-45: tiny / 448 == 0 in f32
    assert_eq!(tiny / E4M3_MAX, 0.0);
    let w = [tiny, -tiny, 0.0, 1.0];
    let q = BlockFp8::quantize(&w, 2, 2, BlockShape { rows: 1, cols: 2 }, ScaleFormat::F32).unwrap();
    let dq = q.dequantize();
    assert!(dq.iter().all(|x| x.is_finite()), "{dq:?}");
    assert_eq!(dq[..2], [tiny, -tiny], "{dq:?}");
    assert!((dq[3] - 1.0).abs() <= 1.0 / 16.0, "{dq:?}");
    let m = invalid(BlockFp8::quantize(&w, 2, 2, BlockShape { rows: 1, cols: 2 }, ScaleFormat::Ue8m0));
    assert!(m.contains("block [0, 0]") && m.contains("outside 2^-127"), "{m}");
}

#[test]
fn scales_read_in_the_wrong_format_are_refused_not_misread() {
    let f32_scales: Vec<u8> = [0.5f32, 0.25, 2.0, 1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let err = Scales::from_bytes(ScaleFormat::Ue8m0, 4, &f32_scales).unwrap_err();
    assert!(err.to_string().contains("16 bytes of scales for 4 Ue8m0 scales"), "{err}");
    assert_eq!(Scales::from_bytes(ScaleFormat::F32, 4, &f32_scales).unwrap(), Scales::F32(vec![0.5, 0.25, 2.0, 1.0]));
    assert!(Scales::from_bytes(ScaleFormat::F32, 16, &[127u8; 16]).is_err());
    // And the grid must fit the weight.
    let err = BlockFp8::from_parts(
        256,
        300,
        BlockShape::DEEPSEEK,
        vec![F8E4M3::from_f32(0.0); 256 * 300],
        Scales::F32(vec![1.0; 4]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("expected a [2, 3] grid"), "{err}");
}

#[test]
fn stacking_gate_on_up_needs_whole_blocks() {
    let g = BlockFp8::quantize(&random_weight(256, 128, 2), 256, 128, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap();
    let u = BlockFp8::quantize(&random_weight(256, 128, 3), 256, 128, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap();
    let w13 = g.stack_rows(&u).unwrap();
    assert_eq!((w13.rows(), w13.scales().len()), (512, 4));
    assert_eq!(w13.scale_of(300, 0).unwrap(), u.scale_of(44, 0).unwrap());
    let odd =
        BlockFp8::quantize(&random_weight(100, 128, 4), 100, 128, BlockShape::DEEPSEEK, ScaleFormat::F32).unwrap();
    assert!(odd.stack_rows(&odd).unwrap_err().to_string().contains("straddle"));
    let ue =
        BlockFp8::quantize(&random_weight(256, 128, 5), 256, 128, BlockShape::DEEPSEEK, ScaleFormat::Ue8m0).unwrap();
    assert!(g.stack_rows(&ue).unwrap_err().to_string().contains("scale format"));
}

/// A DeepSeek-style FP8 checkpoint (F8_E4M3 weights + f32 weight_scale_inv) written with safetensors directly.
#[test]
fn deepseek_fp8_checkpoint_packs_and_dequantizes() {
    let (e, i, h) = (2usize, 256usize, 384usize);
    let prefix = "model.layers.3.mlp";
    let mut store: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut originals: HashMap<String, BlockFp8> = HashMap::new();
    for x in 0..e {
        for (name, rows, cols) in ExpertNaming::GateUpDown
            .names(prefix, x)
            .into_iter()
            .zip([(i, h), (i, h), (h, i)])
            .map(|(n, (r, c))| (n, r, c))
        {
            let q = BlockFp8::quantize(
                &random_weight(rows, cols, store.len() as u64),
                rows,
                cols,
                BlockShape::DEEPSEEK,
                ScaleFormat::F32,
            )
            .unwrap();
            let Scales::F32(s) = q.scales() else { unreachable!() };
            let (gr, gc) = BlockShape::DEEPSEEK.grid(rows, cols).unwrap();
            store.push((name.clone(), Dtype::F8_E4M3, vec![rows, cols], q.q().iter().map(|v| v.to_bits()).collect()));
            store.push((
                format!("{name}_scale_inv"),
                Dtype::F32,
                vec![gr, gc],
                s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
            originals.insert(name, q);
        }
    }
    let path = std::env::temp_dir().join(format!("moe-gemm-fp8-{}.safetensors", std::process::id()));
    let views: HashMap<String, TensorView<'_>> =
        store.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let config = Fp8Config::DEEPSEEK_V3;
    let experts = ckpt.pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config).unwrap();
    assert_eq!((experts.experts(), experts.inter(), experts.hidden()), (e, i, h));
    for x in 0..e {
        let [g, u, d] = ExpertNaming::GateUpDown.names(prefix, x);
        let (w13, w2) = experts.expert(x).unwrap();
        assert_eq!(w13, originals[&g].stack_rows(&originals[&u]).unwrap());
        assert_eq!(w2, originals[&d]);
    }
    // A missing scale names the tensor.
    let without: HashMap<String, TensorView<'_>> = store
        .iter()
        .filter(|(n, ..)| !n.ends_with("experts.1.down_proj.weight_scale_inv"))
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(without, None, &path).unwrap();
    let err =
        Checkpoint::open(&path).unwrap().pack_fp8_experts(prefix, e, ExpertNaming::GateUpDown, &config).unwrap_err();
    assert!(
        err.to_string().contains("experts.1.down_proj.weight_scale_inv") && err.to_string().contains("missing"),
        "{err}"
    );
    let _ = std::fs::remove_file(path);
}
