//! Per-channel and per-tensor FP8 experts with interleaved gate/up rows (gpt-oss's order) on the CPU: reordered
//! into `[gate; up]` exactly (every row's e4m3 bytes and scale bits those of the concatenated experts), so the
//! layer's reference over them is bit-equal; read as concatenated instead, the output moves (a missing reorder
//! is seen); scale blocks of several rows (block FP8) stay refused by name.

mod common;

use common::{interleave_w13, Rng};
use half::bf16;
use moe_gemm::experts::{Activation, Fp8ChannelExperts, GateUp, StaticInputScales};
use moe_gemm::quant::{per_row_block, ActivationScales, BlockFp8, BlockShape, ScaleFormat, Scales};
use moe_gemm::reference::moe_forward_fp8_channel;

/// `[rows, cols]` random weights, every row of its own magnitude (so per-row scales differ), quantised per row or
/// per tensor.
fn matrix(rows: usize, cols: usize, block: BlockShape, seed: u64) -> BlockFp8 {
    let mut rng = Rng(seed);
    let w: Vec<f32> = (0..rows * cols).map(|n| rng.unit() * (1 + (n / cols) % 7) as f32 * 0.02).collect();
    BlockFp8::quantize(&w, rows, cols, block, ScaleFormat::F32).unwrap()
}

/// Per expert, a fused concatenated `w13 [2I, H]` and `w2 [H, I]`, per row or per tensor.
fn fused(e: usize, h: usize, i: usize, per_row: bool) -> Vec<(BlockFp8, BlockFp8)> {
    let block = |r, c| if per_row { per_row_block(c) } else { BlockShape { rows: r, cols: c } };
    (0..e as u64).map(|x| (matrix(2 * i, h, block(2 * i, h), 10 * x), matrix(h, i, block(h, i), 10 * x + 1))).collect()
}

/// The scales of `m`'s rows as bits: its own per row, or the tensor's repeated.
fn row_scale_bits(m: &BlockFp8) -> Vec<u32> {
    let Scales::F32(s) = m.scales() else { panic!("F32 scales") };
    (0..m.rows()).map(|r| s[if m.block().rows == 1 { r } else { 0 }].to_bits()).collect()
}

fn bytes(m: &BlockFp8) -> Vec<u8> {
    m.q().iter().map(|q| q.to_bits()).collect()
}

fn schemes(e: usize) -> [(ActivationScales, Option<StaticInputScales>); 2] {
    let statics = StaticInputScales::new((0..e).map(|x| 0.004 + 0.001 * x as f32).collect(), vec![0.01; e]);
    [(ActivationScales::DynamicToken, None), (ActivationScales::StaticTensor, Some(statics.unwrap()))]
}

#[test]
fn interleaved_w13_reorders_exactly_into_gate_then_up() {
    let (e, h, i) = (3, 32, 16);
    for per_row in [true, false] {
        let concat = fused(e, h, i, per_row);
        let inter: Vec<(BlockFp8, BlockFp8)> =
            concat.iter().map(|(w13, w2)| (interleave_w13(w13), w2.clone())).collect();
        assert_ne!(bytes(&inter[0].0), bytes(&concat[0].0), "the fixture must actually move rows");
        for (acts, statics) in schemes(e) {
            let want = Fp8ChannelExperts::from_gate_up(concat.clone(), GateUp::Concatenated, acts, statics.clone());
            let got = Fp8ChannelExperts::from_gate_up(inter.clone(), GateUp::Interleaved, acts, statics).unwrap();
            for (x, (w13, w2)) in concat.iter().enumerate() {
                let what = format!("per_row {per_row}, {acts:?}, expert {x}");
                assert_eq!(bytes(&got.w13()[x]), bytes(w13), "{what}: w13 rows");
                assert_eq!(row_scale_bits(&got.w13()[x]), row_scale_bits(w13), "{what}: w13 scales");
                assert_eq!(bytes(&got.w2()[x]), bytes(w2), "{what}: w2 untouched");
                assert_eq!(row_scale_bits(&got.w2()[x]), row_scale_bits(w2), "{what}: w2 scales");
            }
            assert_eq!(got, want.unwrap(), "per_row {per_row}, {acts:?}");
        }
        if per_row {
            // Concatenated fused experts equal the same matrices given as gate, up, down.
            let split = concat
                .iter()
                .map(|(w13, w2)| (w13.slice_rows(0, i).unwrap(), w13.slice_rows(i, 2 * i).unwrap(), w2.clone()));
            let sep = Fp8ChannelExperts::new(split.collect(), ActivationScales::DynamicToken, None).unwrap();
            let via = Fp8ChannelExperts::from_gate_up(inter, GateUp::Interleaved, ActivationScales::DynamicToken, None);
            assert_eq!(via.unwrap(), sep);
        }
    }
}

#[test]
fn the_reference_over_interleaved_experts_is_bit_equal_and_a_missing_reorder_is_seen() {
    let (e, h, i, k, t) = (4, 64, 32, 2, 7);
    let mut rng = Rng(3);
    let x: Vec<bf16> = (0..t * h).map(|_| bf16::from_f32(rng.unit())).collect();
    let ids: Vec<i32> = (0..t * k).map(|n| ((n * 3 + n / k) % e) as i32).collect();
    let wts: Vec<f32> = (0..t * k).map(|n| 0.25 + 0.5 * (n % 2) as f32).collect();
    let bits = |y: Vec<bf16>| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for per_row in [true, false] {
        let concat = fused(e, h, i, per_row);
        let inter: Vec<(BlockFp8, BlockFp8)> =
            concat.iter().map(|(w13, w2)| (interleave_w13(w13), w2.clone())).collect();
        for (acts, statics) in schemes(e) {
            let make = |w: &[(BlockFp8, BlockFp8)], order| {
                Fp8ChannelExperts::from_gate_up(w.to_vec(), order, acts, statics.clone()).unwrap()
            };
            let (want_p, got_p) = (make(&concat, GateUp::Concatenated), make(&inter, GateUp::Interleaved));
            let unordered = make(&inter, GateUp::Concatenated);
            for act in [Activation::SiluGated, Activation::GptOssSwiglu] {
                let run = |p: &Fp8ChannelExperts| bits(moe_forward_fp8_channel(p, act, &x, &ids, &wts, k));
                let want = run(&want_p);
                let what = format!("per_row {per_row}, {acts:?}, {act:?}");
                assert_eq!(run(&got_p), want, "{what}: interleaved vs concatenated");
                assert_ne!(run(&unordered), want, "{what}: interleaved rows read as concatenated went unseen");
            }
        }
    }
}

#[test]
fn interleaved_gate_up_refusals_name_their_constraint() {
    let (h, i) = (256, 128);
    let dyn_token = ActivationScales::DynamicToken;
    let err = |w13: BlockFp8, w2: BlockFp8, order| {
        Fp8ChannelExperts::from_gate_up(vec![(w13, w2)], order, dyn_token, None).unwrap_err().to_string()
    };
    // DeepSeek's 128 x 128 blocks: interleaved rows would share one 128-row block's scale.
    let block = |r, c, s| matrix(r, c, BlockShape::DEEPSEEK, s);
    let m = err(block(2 * i, h, 1), block(h, i, 2), GateUp::Interleaved);
    assert!(m.contains("expert 0") && m.contains("Interleaved") && m.contains("128-row"), "{m}");
    assert!(m.contains("one scale per row or per tensor"), "{m}");
    // Concatenated, block scales are still not per-channel experts (block FP8 has its own type).
    let m = err(block(2 * i, h, 1), block(h, i, 2), GateUp::Concatenated);
    assert!(m.contains("expert 0 w13") && m.contains("128 x 128") && m.contains("one scale per row"), "{m}");
    let row = |r, c, s| matrix(r, c, per_row_block(c), s);
    let m = err(row(2 * i + 1, h, 3), row(h, i, 4), GateUp::Interleaved);
    assert!(m.contains("expert 0") && m.contains("257 rows") && m.contains("even"), "{m}");
    // Down's shape is still checked against gate's and up's.
    let m = err(row(2 * i, h, 5), row(h, i + 16, 6), GateUp::Interleaved);
    assert!(m.contains("expert 0: down") && m.contains("[256, 144]"), "{m}");
}
