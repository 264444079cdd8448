//! gpt-oss MXFP4 checkpoints on the CPU: known nibbles and scales → known values in the bf16 layer's layout, the
//! dequantised experts equal to what `pack_gpt_oss` reads from the bf16 form, and every shape error naming its
//! tensor.

#[path = "common/gpt_oss.rs"]
mod gpt_oss;

use std::path::PathBuf;

use gpt_oss::{name, RawTensor};
use half::bf16;
use moe_gemm::checkpoint::Checkpoint;
use moe_gemm::quant::{Mxfp4, Ue8m0};
use moe_gemm::reference::moe_forward;
use moe_gemm::*;
use safetensors::tensor::Dtype;

const PREFIX: &str = "model.layers.7.mlp";

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moe-gemm-mxfp4-{}-{tag}.safetensors", std::process::id()))
}

fn open(tag: &str, tensors: &[RawTensor]) -> Checkpoint {
    let path = tmp(tag);
    gpt_oss::write(&path, tensors);
    let c = Checkpoint::open(&path).unwrap();
    let _ = std::fs::remove_file(&path); // the map stays valid
    c
}

fn set(tensors: &mut [RawTensor], t: &str, f: impl FnOnce(&mut RawTensor)) {
    f(tensors.iter_mut().find(|x| x.0 == name(PREFIX, t)).unwrap());
}

#[test]
fn known_nibbles_and_scales_land_where_the_bf16_layer_reads_them() {
    // E = 1, H = 32, I = 32: gate_up [1, 64, 1, 16], down [1, 32, 1, 16]; all zero nibbles, scales 127.
    let (h, i) = (32usize, 32usize);
    let mut t = gpt_oss::tensors(PREFIX, 1, h, i, 1, (127, 127), 0.0);
    set(&mut t, "gate_up_proj_blocks", |x| x.3.iter_mut().for_each(|b| *b = 0));
    set(&mut t, "down_proj_blocks", |x| x.3.iter_mut().for_each(|b| *b = 0));
    // Gate row 0 (output 0), byte 0 = 0x7A, scale 2^1: element 0 = LUT[0xA] · 2 = −2, element 1 = LUT[7] · 2 = 12.
    // Up row 1 (output 1), byte 15 = 0x9F, scale 2^-7: element 30 = −6 · 2^-7, element 31 = −0.5 · 2^-7.
    set(&mut t, "gate_up_proj_blocks", |x| {
        x.3[0] = 0x7A;
        x.3[16 + 15] = 0x9F;
    });
    set(&mut t, "gate_up_proj_scales", |x| {
        x.3[0] = 128;
        x.3[1] = 120;
    });
    // Down row 5 (output h = 5), byte 0 = 0x25, scale 2^-1: element 0 = 3 · 0.5, element 1 = 1 · 0.5.
    set(&mut t, "down_proj_blocks", |x| x.3[5 * 16] = 0x25);
    set(&mut t, "down_proj_scales", |x| x.3[5] = 126);
    let c = open("tiny", &t);
    let mx = c.pack_gpt_oss_mxfp4(PREFIX).unwrap();
    assert_eq!((mx.experts(), mx.hidden(), mx.inter()), (1, h, i));
    assert_eq!((mx.gate_up().rows(), mx.gate_up().k(), mx.down().rows(), mx.down().k()), (64, 32, 32, 32));
    assert_eq!(mx.gate_up().data()[0], 0x7A);
    assert_eq!(mx.gate_up().scales()[..2], [Ue8m0(128), Ue8m0(120)]);
    let d = mx.gate_up().dequantize();
    assert_eq!(d[..2], [-2.0, 12.0]);
    assert_eq!(d[32 + 30..32 + 32], [-6.0 / 128.0, -0.5 / 128.0]);
    let p = c.pack_gpt_oss_dequantized::<bf16>(PREFIX).unwrap();
    assert_eq!(p.format, ExpertFormat::GPT_OSS);
    let w13 = |hh: usize, o: usize| p.w13[hh * 2 * i + o].to_f32(); // [E, H, 2I]
    let w2 = |ii: usize, o: usize| p.w2[ii * h + o].to_f32(); // [E, I, H]
    assert_eq!((w13(0, 0), w13(1, 0), w13(30, 1), w13(31, 1)), (-2.0, 12.0, -6.0 / 128.0, -0.5 / 128.0));
    assert_eq!((w2(0, 5), w2(1, 5)), (1.5, 0.5));
    let nonzero13 = p.w13.iter().filter(|x| x.to_f32() != 0.0).count();
    let nonzero2 = p.w2.iter().filter(|x| x.to_f32() != 0.0).count();
    assert_eq!((nonzero13, nonzero2), (4, 2));
    // Through the reference layer: one token x = e_1 (hidden unit 1), expert 0 with weight 1. Gate 0 = 12
    // (clamped to 7), up 0 = 0, every other gate/up 0: h_0 = (0 + 1) · 7 · sigmoid(1.702 · 7), h_j = 0 otherwise;
    // so y_5 = 1.5 · h_0 = 10.5 (in bf16; h_1 = 0 meets down's 0.5) and every other output 0. Reading the rows
    // as [gate | up] would give gate 0 = row 0, up 0 = row 32, and reading the storage untransposed would move
    // y off output 5: either way the asserted values change.
    let mut x = vec![bf16::ZERO; h];
    x[1] = bf16::ONE;
    let y = moe_forward(&p, &x, &[0], &[1.0], 1);
    let want: Vec<f32> = (0..h).map(|o| if o == 5 { 10.5 } else { 0.0 }).collect();
    assert_eq!(y.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), want);
}

#[test]
fn dequantised_experts_equal_the_bf16_checkpoint_of_the_same_weights() {
    let (e, h, i) = (4usize, 64usize, 96usize);
    let t = gpt_oss::tensors(PREFIX, e, h, i, 7, (118, 124), 0.5);
    let mx_ckpt = open("random", &t);
    let mx = mx_ckpt.pack_gpt_oss_mxfp4(PREFIX).unwrap();
    let gb = gpt_oss::get(&t, &name(PREFIX, "gate_up_proj_blocks"));
    let gs = gpt_oss::get(&t, &name(PREFIX, "gate_up_proj_scales"));
    let want = Mxfp4::from_parts(e * 2 * i, h, gb.3.clone(), gs.3.iter().map(|&s| Ue8m0(s)).collect()).unwrap();
    assert_eq!(*mx.gate_up(), want, "the blocks are the MXFP4 data bytes, unchanged");
    let got = mx_ckpt.pack_gpt_oss_dequantized::<bf16>(PREFIX).unwrap();
    let bf = open("bf16-form", &gpt_oss::bf16_form(PREFIX, &t)).pack_gpt_oss::<bf16>(PREFIX).unwrap();
    assert_eq!(got.format, bf.format);
    assert_eq!((got.experts, got.hidden, got.inter), (bf.experts, bf.hidden, bf.inter));
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.w13), bits(&bf.w13), "w13 [E, H, 2I]");
    assert_eq!(bits(&got.w2), bits(&bf.w2), "w2 [E, I, H]");
    assert_eq!((&got.b13, &got.b2), (&bf.b13, &bf.b2));
    // The dequantisation is exact: bf16 holds every e2m1 value times a power of two.
    let f32s = mx.gate_up().dequantize();
    for x in 0..e {
        for o in 0..2 * i {
            for c in 0..h {
                let v = f32s[(x * 2 * i + o) * h + c];
                assert_eq!(v, gpt_oss::element(&gb.3, &gs.3, 2 * i, h, x, o, c));
                assert_eq!(bf16::from_f32(v).to_f32(), v);
            }
        }
    }
    // And the f32 dequantisation is what the layer computes with: moe_forward agrees on both packings.
    let tokens = 5;
    let x = moe_gemm::random::random_vec::<bf16>(tokens * h, 3, 1.0);
    let ids: Vec<i32> = (0..tokens * 2).map(|j| (j % e) as i32).collect();
    let w = vec![0.5f32; tokens * 2];
    assert_eq!(bits(&moe_forward(&got, &x, &ids, &w, 2)), bits(&moe_forward(&bf, &x, &ids, &w, 2)));
}

fn tensor_of(err: Error) -> String {
    match err {
        Error::Checkpoint { tensor, problem, .. } => {
            assert!(!problem.is_empty());
            tensor
        }
        e => panic!("not a checkpoint error: {e}"),
    }
}

#[test]
fn every_shape_error_names_its_tensor() {
    let (e, h, i) = (2usize, 64usize, 32usize);
    let base = gpt_oss::tensors(PREFIX, e, h, i, 11, (120, 124), 0.5);
    type Mutation = Box<dyn Fn(&mut Vec<RawTensor>)>;
    let cases: Vec<(&str, &str, Mutation)> = vec![
        (
            "blocks of 8 bytes",
            "gate_up_proj_blocks",
            Box::new(move |t| set(t, "gate_up_proj_blocks", |x| x.2 = vec![e, 2 * i, 2 * h / 32, 8])),
        ),
        (
            "3-D blocks",
            "down_proj_blocks",
            Box::new(move |t| set(t, "down_proj_blocks", |x| x.2 = vec![e, h, i / 32 * 16])),
        ),
        (
            "scales of another grid",
            "gate_up_proj_scales",
            Box::new(move |t| set(t, "gate_up_proj_scales", |x| x.2 = vec![e, h / 32, 2 * i])),
        ),
        (
            "bf16 scales",
            "down_proj_scales",
            Box::new(move |t| {
                set(t, "down_proj_scales", |x| {
                    x.1 = Dtype::BF16;
                    x.3 = vec![0; e * h * (i / 32) * 2];
                })
            }),
        ),
        ("a NaN scale", "down_proj_scales", Box::new(move |t| set(t, "down_proj_scales", |x| x.3[h + 3] = 0xFF))),
        (
            "missing down blocks",
            "down_proj_blocks",
            Box::new(move |t| t.retain(|x| x.0 != name(PREFIX, "down_proj_blocks"))),
        ),
        (
            "down K other than I",
            "down_proj_blocks",
            Box::new(move |t| {
                set(t, "down_proj_blocks", |x| {
                    x.2 = vec![e, h / 2, 2 * i / 32, 16];
                });
                set(t, "down_proj_scales", |x| x.2 = vec![e, h / 2, 2 * i / 32]);
            }),
        ),
        (
            "odd 2I",
            "gate_up_proj_blocks",
            Box::new(move |t| {
                set(t, "gate_up_proj_blocks", |x| {
                    x.2 = vec![e, 2 * i - 1, h / 32, 16];
                    x.3.truncate(e * (2 * i - 1) * h / 2);
                });
                set(t, "gate_up_proj_scales", |x| {
                    x.2 = vec![e, 2 * i - 1, h / 32];
                    x.3.truncate(e * (2 * i - 1) * h / 32);
                });
            }),
        ),
        (
            "gate_up bias of width I",
            "gate_up_proj_bias",
            Box::new(move |t| set(t, "gate_up_proj_bias", |x| x.2 = vec![2 * e, i])),
        ),
        (
            "u8 down bias",
            "down_proj_bias",
            Box::new(move |t| {
                set(t, "down_proj_bias", |x| {
                    x.1 = Dtype::U8;
                    x.2 = vec![e, 2 * h];
                })
            }),
        ),
        ("missing down bias", "down_proj_bias", Box::new(move |t| t.retain(|x| x.0 != name(PREFIX, "down_proj_bias")))),
    ];
    assert!(open("base", &base).pack_gpt_oss_mxfp4(PREFIX).is_ok());
    for (k, (case, tensor, mutate)) in cases.iter().enumerate() {
        let mut t = base.clone();
        mutate(&mut t);
        let c = open(&format!("err{k}"), &t);
        let err = c.pack_gpt_oss_mxfp4(PREFIX).unwrap_err();
        let msg = err.to_string();
        assert_eq!(tensor_of(err), name(PREFIX, tensor), "{case}: {msg}");
        assert!(c.pack_gpt_oss_dequantized::<bf16>(PREFIX).is_err(), "{case}");
    }
    // The NaN scale is named by position: index h + 3 of `[E, H, I/32]` = [2, 64, 1] is expert 1, row 3, block 0.
    let mut t = base.clone();
    set(&mut t, "down_proj_scales", |x| x.3[h + 3] = 0xFF);
    let msg = open("nan", &t).pack_gpt_oss_mxfp4(PREFIX).unwrap_err().to_string();
    assert!(msg.contains("[1, 3, 0]") && msg.contains("0xFF"), "{msg}");
}

/// gpt-oss for SM100: both weights' K padded to a multiple of 128 (H = 2880 -> 2944, I = 96 -> 128) with the
/// dequantised experts unchanged; the MX plan takes the padded K and still refuses the unpadded one by name.
#[test]
fn gpt_oss_k_2880_is_padded_to_2944_for_sm100_exactly() {
    let (e, h, i) = (1usize, 2880usize, 96usize);
    let mx = open("pad", &gpt_oss::tensors(PREFIX, e, h, i, 3, (118, 131), 0.25)).pack_gpt_oss_mxfp4(PREFIX).unwrap();
    let sm100 = mx.clone().padded_for_sm100().unwrap();
    let (gu, dn) = (sm100.gate_up(), sm100.down());
    assert_eq!((gu.rows(), gu.k(), gu.k_padded()), (2 * i, h, 2944));
    assert_eq!((dn.rows(), dn.k(), dn.k_padded()), (h, i, 128));
    assert_eq!(gu.dequantize(), mx.gate_up().dequantize());
    assert_eq!(dn.dequantize(), mx.down().dequantize());
    assert_eq!(sm100.dequantize::<bf16>().unwrap(), mx.dequantize::<bf16>().unwrap());
    assert_eq!((sm100.gate_up_bias(), sm100.down_bias()), (mx.gate_up_bias(), mx.down_bias()));
    let b200 = DeviceInfo::described("NVIDIA B200", (10, 0), 148);
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxFormat};
    let plan = |k: usize| GroupedGemmMx::for_device(b200.clone(), MxFormat::Mxfp8, MxFormat::Mxfp4, 128, 5760, k, 64);
    assert!(plan(gu.k_padded()).unwrap().workspace_bytes() > 0);
    let m = plan(gu.k()).unwrap_err().to_string();
    assert!(m.contains("K = 2880 is not a positive multiple of 128") && m.contains("4-bit operand"), "{m}");
}
